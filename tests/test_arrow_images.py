import numpy as np
import pytest

import fastload
from fastload import transforms as T

pa = pytest.importorskip("pyarrow")
import pyarrow.ipc  # noqa: E402
from PIL import Image  # noqa: E402

from fastload.formats.arrow_images import ArrowImages  # noqa: E402


def _images(tmp_path, n=6):
    rng = np.random.default_rng(0)
    paths, blobs = [], []
    for i in range(n):
        p = tmp_path / f"{i}.jpg"
        Image.fromarray(rng.integers(0, 255, (20 + i, 24, 3), np.uint8)).save(p, quality=90)
        paths.append(p)
        blobs.append(p.read_bytes())
    return paths, blobs


def _write(path, blobs, labels):
    table = pa.table({"image": pa.array(blobs, pa.binary()), "label": labels})
    with pa.ipc.new_file(str(path), table.schema) as w:
        w.write_table(table)


@pytest.mark.parametrize("workers", [0, 2])
def test_batches_match_image_files(tmp_path, workers):
    paths, blobs = _images(tmp_path)
    labels = list(range(len(blobs)))
    _write(tmp_path / "t.arrow", blobs, labels)
    tf = T.Compose([T.RandomResizedCrop(16), T.ToTensor()])
    ours = ArrowImages(tmp_path / "t.arrow", transform=tf)
    ref = fastload.ImageFiles(paths, labels, transform=tf)
    a = list(fastload.DataLoader(ours, batch_size=4, shuffle=True, num_workers=workers,
                                 generator=__import__("torch").Generator().manual_seed(3)))
    b = list(fastload.DataLoader(ref, batch_size=4, shuffle=True, num_workers=workers,
                                 generator=__import__("torch").Generator().manual_seed(3)))
    for (xa, ya), (xb, yb) in zip(a, b):
        assert (xa == xb).all() and (ya == yb).all()


def test_corrupt_image_names_row(tmp_path):
    _, blobs = _images(tmp_path, 3)
    blobs[1] = blobs[1][:40]
    _write(tmp_path / "t.arrow", blobs, [0, 1, 2])
    ds = ArrowImages(tmp_path / "t.arrow", transform=T.Compose([T.Resize((8, 8)), T.ToTensor()]))
    with pytest.raises(Exception, match="sample index 1"):
        ds[1]


def test_compressed_file_refused(tmp_path):
    _, blobs = _images(tmp_path, 2)
    table = pa.table({"image": pa.array(blobs, pa.binary()), "label": [0, 1]})
    options = pa.ipc.IpcWriteOptions(compression="zstd")
    with pa.ipc.new_file(str(tmp_path / "z.arrow"), table.schema, options=options) as w:
        w.write_table(table)
    with pytest.raises(ValueError, match="compressed"):
        ArrowImages(tmp_path / "z.arrow")
