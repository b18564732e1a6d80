"""The documentation cannot drift from the code: every script of examples/ runs
on the small data it generates, and every ```python block of README.md and
docs/guide/*.md runs, in order, in one namespace per page, in a temporary
folder where the files the blocks name (imagenet/train, x.npy, train.bin,
train.h5, ...) exist as small generated ones.

A block that cannot run here says so in the page, on the line before it:
``<!-- no-run: needs CUDA -->``.  Those blocks, and only those, are skipped
(and counted, so a page cannot skip everything).
"""

import os
import pathlib
import re
import sys

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs" / "guide").glob("*.md"))]
EXAMPLES = ROOT / "examples"
NO_RUN = re.compile(r"<!--\s*no-run:\s*(?P<reason>\S.*?)\s*-->")
SHM_PATH = re.compile(r"/dev/shm/[\w.-]+")
# What a page's blocks use -> the optional package they need (skipped without it).
NEEDS = {"import torch": "torch", "HDF5Dataset": "h5py", "ArrowDataset": "pyarrow",
         "ZarrDataset": "zarr", "import datasets": "datasets", "LMDBDataset": "lmdb"}

# Each script with the arguments that keep it to seconds on a CPU; every
# script of examples/ must be listed (test_every_example_is_run).
EXAMPLE_ARGS = {
    "arrays.py": ["--epochs", "2"],
    "imagenet_train.py": ["--epochs", "1", "--image-size", "64", "--workers", "2"],
    "resume.py": None,  # test_resume_example runs it three times
    "shards.py": ["--epochs", "1"],
    "tokens_nanogpt.py": ["--max-iters", "20", "--eval-iters", "2"],
}


def python_blocks(text):
    """(line number, code, no-run reason or None) of each ```python block.

    A fence may be indented (a block inside a list item); its indent is
    removed from the block's lines.  A no-run marker applies to the next
    block when only blank lines stand between them."""
    lines = text.split("\n")
    blocks, reason, i = [], None, 0
    while i < len(lines):
        stripped = lines[i].strip()
        marker = NO_RUN.fullmatch(stripped)
        if marker:
            reason = marker.group("reason")
        elif stripped.startswith("```"):
            indent = len(lines[i]) - len(lines[i].lstrip())
            language = stripped[3:].strip()
            end = i + 1
            while end < len(lines) and not lines[end].strip().startswith("```"):
                end += 1
            assert end < len(lines), f"line {i + 1}: a code block is never closed"
            if language == "python":
                code = "\n".join(line[indent:] for line in lines[i + 1:end])
                blocks.append((i + 2, code, reason))
            elif reason:
                raise AssertionError(f"line {i + 1}: a no-run marker before a {language!r} block")
            reason, i = None, end
        elif stripped:
            reason = None
        i += 1
    return blocks


def make_docs_data(folder):
    """The small files the pages' blocks read, as the names they use."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for k in range(2):
        classes = folder / "imagenet" / "train" / f"class_{k}"
        classes.mkdir(parents=True)
        for i in range(8):
            image = rng.normal(100 + 50 * k, 40, (48, 64, 3)).clip(0, 255).astype(np.uint8)
            Image.fromarray(image).save(classes / f"{i:03d}.jpg", quality=90)

    rows = 512
    np.save(folder / "x.npy", rng.normal(size=(rows, 16)).astype(np.float32))
    np.save(folder / "y.npy", rng.integers(0, 10, rows))
    rng.integers(0, 50_000, 4096).astype(np.uint16).tofile(folder / "train.bin")

    images = rng.integers(0, 256, (rows, 3, 8, 8), dtype=np.uint8)
    labels = rng.integers(0, 10, rows)
    import h5py  # test extras, as Pillow and pyarrow

    with h5py.File(folder / "train.h5", "w") as f:
        f["images"] = images
        f["labels"] = labels

    import pyarrow as pa
    import pyarrow.parquet as pq

    pixels = pa.FixedSizeListArray.from_arrays(
        pa.array(rng.random(rows * 64, dtype=np.float32)), 64)
    table = pa.table({"pixels": pixels, "label": pa.array(labels)})
    with pa.OSFile(str(folder / "train.arrow"), "wb") as sink:
        with pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table, max_chunksize=rows)
    pq.write_table(table, folder / "train.parquet")

    try:
        import zarr
    except ImportError:  # zarr 3 needs Python 3.11; the pages that use it are skipped
        return
    group = zarr.open_group(str(folder / "train.zarr"), mode="w")
    group.create_array("images", data=images, chunks=(64, 3, 8, 8))
    group.create_array("labels", data=labels, chunks=(64,))


@pytest.fixture
def in_docs_data(tmp_path, monkeypatch):
    make_docs_data(tmp_path)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_no_run_marker_is_found_and_applies_to_the_next_block_only():
    text = ("```python\na = 1\n```\n\n<!-- no-run: needs CUDA -->\n\n```python\nb = 2\n```\n"
            "- item\n\n  ```python\n  c = 3\n  ```\n")
    blocks = python_blocks(text)
    assert [(code, reason) for _, code, reason in blocks] == [
        ("a = 1", None), ("b = 2", "needs CUDA"), ("c = 3", None)]


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_page_blocks_run(page, in_docs_data, request):
    text = page.read_text()
    blocks = python_blocks(text)
    runnable = [block for block in blocks if block[2] is None]
    if not blocks:
        pytest.skip(f"{page.name} has no Python block")
    assert runnable, f"{page.name}: every block is marked no-run"
    used = "\n".join(code for _, code, _ in runnable)
    for needs, module in NEEDS.items():
        if needs in used:
            pytest.importorskip(module)
    if "torchvision" in used:
        request.getfixturevalue("torchvision")  # imported as the suite imports it, or skipped
    # Caches the page puts under /dev/shm are removed afterwards.
    shm_before = {path for path in SHM_PATH.findall(text) if os.path.exists(path)}
    namespace = {"__name__": "__docs__"}
    try:
        for line, code, _ in runnable:
            name = f"{page.relative_to(ROOT)}:{line}"
            try:
                exec(compile(code, name, "exec"), namespace)
            except Exception as e:
                raise AssertionError(f"the block at {name} fails: {type(e).__name__}: {e}") from e
    finally:
        namespace.clear()
        import gc

        gc.collect()
        for path in set(SHM_PATH.findall(text)) - shm_before:
            if os.path.exists(path):
                os.unlink(path)


# The scripts spend their time training torch models, which the sanitizer run
# (scripts/test.sh sets FASTLOAD_SANITIZER_RUN) would only make slower: it runs
# the pages' blocks, and the plain run runs the scripts too.
skip_under_sanitizer = pytest.mark.skipif(
    bool(os.environ.get("FASTLOAD_SANITIZER_RUN")),
    reason="examples/ trains torch models: run by the plain run, not the sanitizer run")


def run_example(script, *args, cwd):
    """Runs examples/<script> as `python examples/<script> ARGS` would, in this
    process (torch is imported once for all of them; warnings are errors here
    too) with `cwd` as the working directory; returns what it printed."""
    import contextlib
    import io
    import runpy

    torch = pytest.importorskip("torch")
    threads = torch.get_num_threads()
    out = io.StringIO()
    argv, cwd_before = sys.argv, os.getcwd()
    sys.argv = [str(EXAMPLES / script), *args]
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out):
            runpy.run_path(str(EXAMPLES / script), run_name="__main__")
    except SystemExit as e:
        assert e.code in (None, 0), f"{script} {' '.join(args)} exited with {e.code}:\n{out.getvalue()}"
    finally:
        sys.argv = argv
        os.chdir(cwd_before)
        torch.set_num_threads(threads)
    return out.getvalue()


def test_every_example_is_run():
    assert sorted(p.name for p in EXAMPLES.glob("*.py")) == sorted(EXAMPLE_ARGS)


@pytest.mark.parametrize("script", sorted(name for name, args in EXAMPLE_ARGS.items()
                                          if args is not None))
@skip_under_sanitizer
def test_example_runs_on_generated_data(script, tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("PIL")
    out = run_example(script, *EXAMPLE_ARGS[script], cwd=tmp_path)
    assert out.strip(), f"{script} printed nothing"


@skip_under_sanitizer
def test_resume_example_ends_where_the_uninterrupted_run_ends(tmp_path):
    pytest.importorskip("torch")
    out = run_example("resume.py", "--checkpoint", "run.pt", "--stop-after", "7", cwd=tmp_path)
    assert "saved at epoch 0, step 7" in out
    resumed = run_example("resume.py", "--checkpoint", "run.pt", cwd=tmp_path)
    assert "resumed at epoch 0, step 7" in resumed
    straight = run_example("resume.py", "--checkpoint", "other.pt", cwd=tmp_path)
    checksum = re.compile(r"weights checksum (\S+)")
    assert checksum.search(resumed).group(1) == checksum.search(straight).group(1)


@skip_under_sanitizer
def test_example_takes_data_of_its_own(tmp_path):
    """--data is the user's way in: arrays.py reads a folder it did not make."""
    pytest.importorskip("torch")
    np.save(tmp_path / "x.npy", np.random.default_rng(0).normal(size=(300, 5)).astype(np.float32))
    np.save(tmp_path / "y.npy", np.arange(300) % 3)
    out = run_example("arrays.py", "--data", str(tmp_path), "--epochs", "1", cwd=tmp_path)
    assert "epoch 0" in out


def github_anchor(heading):
    """The anchor GitHub (and the site, mkdocs.yml's slugify) gives a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def test_readme_links_reach_files_and_headings():
    """README.md is not part of the site (mkdocs checks the pages' links), so
    its links are checked here: each relative one names a file of the
    repository, and its #anchor a heading there."""
    text = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    assert links
    for link in links:
        if re.match(r"[a-z]+:", link):
            continue
        path, _, anchor = link.partition("#")
        target = ROOT / path if path else ROOT / "README.md"
        assert target.exists(), f"README.md links to {link}: no such file"
        if anchor:
            headings = re.findall(r"^#+ (.+)$", target.read_text(), flags=re.M)
            assert anchor in {github_anchor(h) for h in headings}, \
                f"README.md links to {link}: no such heading"
