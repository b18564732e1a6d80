"""PNG and WebP decoded in C (csrc/core/image/png.c, webp.c): the pixels equal
Pillow's ``Image.open(f).convert("RGB")`` for every colour type, bit depth,
interlacing and WebP kind; a fastload transform plan on them equals the
same plan on Pillow's pixels; bad files are clear DecodeErrors (or skips);
and the workers decode them without the Python fallback."""

import io
import struct
import warnings
import zlib

import numpy as np
import pytest

pytest.importorskip("PIL")
from PIL import Image, PngImagePlugin, features  # noqa: E402

import fastload  # noqa: E402
import fastload.datasets.images  # noqa: E402
from fastload import _C  # noqa: E402
from fastload import transforms as T  # noqa: E402
from fl_helpers import fastload_only  # noqa: E402

pytestmark = fastload_only

W, H = 37, 23  # odd sizes: partial bytes at depths below 8, every Adam7 pass non-empty
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


# ------------------------------------------------------------- PNG writer

# Pillow writes no 16-bit RGB, no 2/4-bit gray and no interlaced PNG: those
# files are written here, chunk by chunk.

def chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}
ADAM7 = [(0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2),
         (0, 1, 1, 2)]


def pack_rows(samples, depth):
    """(h, w, channels) samples -> the filtered (filter type 0) scanlines."""
    h = samples.shape[0]
    flat = samples.reshape(h, -1)
    if depth == 16:
        rows = flat.astype(">u2").view(np.uint8).reshape(h, -1)
    elif depth == 8:
        rows = flat.astype(np.uint8)
    else:
        per_byte = 8 // depth
        n = flat.shape[1]
        padded = np.zeros((h, -(-n // per_byte) * per_byte), np.uint8)
        padded[:, :n] = flat
        groups = padded.reshape(h, -1, per_byte)
        shifts = np.arange(per_byte - 1, -1, -1, dtype=np.uint8) * depth
        rows = (groups << shifts).sum(axis=2).astype(np.uint8)
    return b"".join(b"\0" + row.tobytes() for row in rows)


def write_png(samples, depth, color_type, interlace=False, extra=b""):
    samples = np.asarray(samples)
    if samples.ndim == 2:
        samples = samples[:, :, None]
    h, w = samples.shape[:2]
    if interlace:
        raw = b"".join(pack_rows(samples[y0::dy, x0::dx], depth)
                       for x0, y0, dx, dy in ADAM7 if w > x0 and h > y0)
    else:
        raw = pack_rows(samples, depth)
    ihdr = struct.pack(">IIBBBBB", w, h, depth, color_type, 0, 0, int(interlace))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + extra + chunk(b"IDAT", zlib.compress(raw))
            + chunk(b"IEND", b""))


def noise(shape, top, seed):
    return np.random.default_rng(seed).integers(0, top + 1, shape, dtype=np.int64)


def pillow_png(image, **save):
    buf = io.BytesIO()
    image.save(buf, "PNG", **save)
    return buf.getvalue()


def palette_image(n_colors, seed):
    img = Image.fromarray(noise((H, W), n_colors - 1, seed).astype(np.uint8), "L").convert("P")
    img.putpalette(noise(3 * n_colors, 255, seed + 1).astype(np.uint8).tobytes())
    return img


def png_cases():
    rgb8 = noise((H, W, 3), 255, 1).astype(np.uint8)
    cases = {
        "rgb8": pillow_png(Image.fromarray(rgb8)),
        "rgba8": pillow_png(Image.fromarray(noise((H, W, 4), 255, 2).astype(np.uint8))),
        "gray8": pillow_png(Image.fromarray(noise((H, W), 255, 3).astype(np.uint8))),
        "gray_alpha8": pillow_png(Image.fromarray(noise((H, W, 2), 255, 4).astype(np.uint8),
                                                  "LA")),
        "gray1": pillow_png(Image.fromarray(noise((H, W), 1, 5).astype(bool))),
        "palette8": pillow_png(palette_image(200, 6)),
        "palette8_trns": pillow_png(palette_image(200, 7), transparency=3),
        "palette8_trns_table": pillow_png(palette_image(200, 8),
                                          transparency=bytes(range(0, 200, 2))),
        "palette4": pillow_png(palette_image(16, 9), bits=4),
        "palette2": pillow_png(palette_image(4, 10), bits=2),
        "palette1": pillow_png(palette_image(2, 11), bits=1),
        # 16-bit gray: Pillow's "I;16" clips to 255 in convert("RGB").
        "gray16": pillow_png(Image.fromarray(noise((H, W), 700, 12).astype(np.uint16))),
        "gray16_full": write_png(noise((H, W), 65535, 13), 16, 0),
        "gray2": write_png(noise((H, W), 3, 14), 2, 0),
        "gray4": write_png(noise((H, W), 15, 15), 4, 0),
        "rgb16": write_png(noise((H, W, 3), 65535, 16), 16, 2),
        "rgba16": write_png(noise((H, W, 4), 65535, 17), 16, 6),
        "gray_alpha16": write_png(noise((H, W, 2), 65535, 18), 16, 4),
        "gray8_trns": pillow_png(Image.fromarray(noise((H, W), 255, 19).astype(np.uint8)),
                                 transparency=17),
        "rgb8_trns": write_png(rgb8, 8, 2, extra=chunk(b"tRNS", bytes([0, 1, 0, 2, 0, 3]))),
        # A palette shorter than the indices used: Pillow shows black.
        "palette_short": write_png(noise((H, W), 255, 20), 8, 3,
                                   extra=chunk(b"PLTE", bytes(range(30)))),
        # Colour management is not applied by convert("RGB"): nor here.
        "rgb8_gamma_icc": pillow_png(
            Image.fromarray(rgb8),
            icc_profile=b"\0" * 128,
            pnginfo=_chunks((b"gAMA", struct.pack(">I", 100000)),
                            (b"cHRM", bytes(32)), (b"sBIT", b"\x05\x06\x05"))),
        "rgb8_text": pillow_png(Image.fromarray(rgb8), pnginfo=_chunks((b"tEXt", b"k\0v"),
                                                                        (b"zTXt", b"c\0\0x"))),
    }
    for name, (depth, color_type, top) in {
        "rgb8": (8, 2, 255), "rgba8": (8, 6, 255), "gray8": (8, 0, 255),
        "gray_alpha8": (8, 4, 255), "gray1": (1, 0, 1), "gray2": (2, 0, 3), "gray4": (4, 0, 15),
        "gray16": (16, 0, 65535), "rgb16": (16, 2, 65535), "rgba16": (16, 6, 65535),
        "gray_alpha16": (16, 4, 65535),
    }.items():
        shape = (H, W, CHANNELS[color_type])
        cases[f"interlaced_{name}"] = write_png(noise(shape, top, 30 + depth), depth, color_type,
                                                interlace=True)
    for depth in (1, 2, 4, 8):
        cases[f"interlaced_palette{depth}"] = write_png(
            noise((H, W), (1 << depth) - 1, 40 + depth), depth, 3, interlace=True,
            extra=chunk(b"PLTE", noise(3 << depth, 255, 50).astype(np.uint8).tobytes()))
    frames = [Image.fromarray(noise((H, W, 3), 255, 60 + i).astype(np.uint8)) for i in range(3)]
    cases["apng"] = pillow_png(frames[0], save_all=True, append_images=frames[1:])
    cases["apng_default_not_a_frame"] = pillow_png(frames[0], save_all=True,
                                                   append_images=frames[1:], default_image=True)
    return cases


def _chunks(*pairs):
    info = PngImagePlugin.PngInfo()
    for kind, data in pairs:
        info.add(kind, data)
    return info


def webp_cases():
    if not features.check("webp"):
        return {}
    yy, xx = np.mgrid[0:H, 0:W]
    smooth = np.stack([xx * 6, yy * 10, (xx + yy) * 4], -1).astype(np.uint8)
    rgba = np.concatenate([smooth, noise((H, W, 1), 255, 70).astype(np.uint8)], -1)
    rgba[:5, :5, 3] = 0  # fully transparent: the colour under it is kept, not composited

    def webp(image, **save):
        buf = io.BytesIO()
        image.save(buf, "WEBP", **save)
        return buf.getvalue()

    noisy = noise((H, W, 3), 255, 71).astype(np.uint8)
    frames = [Image.fromarray(noise((H, W, 3), 255, 72 + i).astype(np.uint8)) for i in range(3)]
    return {
        "lossy": webp(Image.fromarray(smooth), quality=80),
        "lossy_noise": webp(Image.fromarray(noisy), quality=95),
        "lossless": webp(Image.fromarray(noisy), lossless=True),
        "lossy_alpha": webp(Image.fromarray(rgba, "RGBA"), quality=80),
        "lossless_alpha": webp(Image.fromarray(rgba, "RGBA"), lossless=True, exact=True),
        "animated": webp(frames[0], save_all=True, append_images=frames[1:], duration=50),
        "animated_alpha": webp(Image.fromarray(rgba, "RGBA"), save_all=True,
                               append_images=[Image.fromarray(rgba[::-1].copy(), "RGBA")],
                               duration=50),
    }


PNG_CASES = png_cases()
WEBP_CASES = webp_cases()
ALL_CASES = {**{f"{k}.png": v for k, v in PNG_CASES.items()},
             **{f"{k}.webp": v for k, v in WEBP_CASES.items()}}


def pillow_rgb(data):
    # Pillow warns that a palette's tRNS table is better converted to RGBA;
    # convert("RGB") is what a torchvision loader does.
    with warnings.catch_warnings(), Image.open(io.BytesIO(data)) as img:
        warnings.simplefilter("ignore", UserWarning)
        return np.asarray(img.convert("RGB"))


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """Every case as a file of class folder "a"."""
    root = tmp_path_factory.mktemp("png_webp")
    (root / "a").mkdir()
    for name, data in ALL_CASES.items():
        (root / "a" / name).write_bytes(data)
    return root


def test_the_cases_are_what_they_claim():
    """The writer makes what Pillow reads as each kind (else the
    comparisons below would test less than they say)."""
    modes = {name: Image.open(io.BytesIO(data)).mode for name, data in PNG_CASES.items()}
    assert modes["gray16"] == modes["gray16_full"] == "I;16"
    assert modes["gray1"] == "1" and modes["palette2"] == "P" and modes["gray_alpha8"] == "LA"
    assert modes["rgb16"] == "RGB" and modes["rgba16"] == "RGBA"
    assert Image.open(io.BytesIO(PNG_CASES["interlaced_rgb8"])).info.get("interlace") == 1
    assert Image.open(io.BytesIO(PNG_CASES["apng"])).n_frames == 3
    assert "transparency" in Image.open(io.BytesIO(PNG_CASES["palette8_trns"])).info
    assert pillow_rgb(PNG_CASES["gray16_full"]).max() == 255  # clipped, not scaled
    if WEBP_CASES:
        assert Image.open(io.BytesIO(WEBP_CASES["lossy_alpha"])).mode == "RGBA"
        assert Image.open(io.BytesIO(WEBP_CASES["animated"])).n_frames == 3


@pytest.mark.parametrize("name", sorted(ALL_CASES))
def test_pixels_equal_pillow(folder, name, monkeypatch):
    """The C decode without a transform is Pillow's convert("RGB") exactly;
    the Pillow fallback is never called."""
    monkeypatch.setattr(fastload.datasets.images, "_fallback", lambda: _refuse)
    ds = fastload.ImageFiles([folder / "a" / name])
    image, _ = ds[0]
    expected = pillow_rgb(ALL_CASES[name])
    assert image.shape == expected.shape
    np.testing.assert_array_equal(image, expected)
    assert ds._raw.decode_only([0]) == 1


def _refuse(data):
    raise RuntimeError("the Pillow fallback was called")


def deterministic_plan():
    return T.Compose([T.Resize(19), T.CenterCrop((15, 17)), T.ToTensor(),
                      T.Normalize(MEAN, STD)])


def random_plan():
    return T.Compose([T.RandomResizedCrop(16), T.RandomHorizontalFlip(), T.ToTensor(),
                      T.Normalize(MEAN, STD)])


def load_all(ds, num_workers, seed=5):
    import torch

    loader = fastload.DataLoader(ds, batch_size=7, shuffle=True, num_workers=num_workers,
                                 generator=torch.Generator().manual_seed(seed), output="numpy")
    batches = list(loader)
    return (np.concatenate([b[0] for b in batches]), np.concatenate([b[1] for b in batches]))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_plan_equals_the_plan_on_pillow_pixels(folder, num_workers, monkeypatch):
    """ImageFolder through the loader, in C, equals transform_image (the
    same C plan) on Pillow's pixels, for every file."""
    pytest.importorskip("torch")
    monkeypatch.setattr(fastload.datasets.images, "_fallback", lambda: _refuse)
    tf = deterministic_plan()
    ds = fastload.ImageFolder(folder, transform=tf)
    loader = fastload.DataLoader(ds, batch_size=5, num_workers=num_workers, output="numpy")
    images = np.concatenate([x for x, _ in loader])
    assert len(images) == len(ALL_CASES)
    for i, (path, _) in enumerate(ds.samples):
        with open(path, "rb") as f:
            expected = _C.transform_image(tf.plan, pillow_rgb(f.read()), 0, 1 << 40)
        np.testing.assert_array_equal(images[i], expected, err_msg=path)


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.filterwarnings("ignore:Palette images with Transparency:UserWarning")
def test_random_crops_equal_those_on_pillow_decoded_files(folder, num_workers, monkeypatch):
    """Random crops and flips (keyed by seed, epoch and index): the C decoders
    give the batches Pillow's decode (the fallback, forced) gives."""
    pytest.importorskip("torch")
    ds = fastload.ImageFolder(folder, transform=random_plan())
    via_pillow = fastload.ImageFolder(folder, transform=random_plan())
    via_pillow._fallback_all = True
    via_pillow._make_sources()
    native = load_all(ds, num_workers)
    reference = load_all(via_pillow, num_workers)
    np.testing.assert_array_equal(native[1], reference[1])
    np.testing.assert_array_equal(native[0], reference[0])


def test_workers_decode_pngs_without_the_python_fallback(folder, monkeypatch):
    """With the fallback patched to raise, a folder of PNGs and WebPs still
    loads on two workers; a GIF in it reaches the patched fallback (so the
    patch is live), and so do PNGs when the fallback is forced."""
    pytest.importorskip("torch")
    monkeypatch.setattr(fastload.datasets.images, "_fallback", lambda: _refuse)
    ds = fastload.ImageFolder(folder, transform=random_plan())
    images, labels = load_all(ds, 2)
    assert images.shape == (len(ALL_CASES), 3, 16, 16) and np.isfinite(images).all()
    loader = fastload.DataLoader(ds, batch_size=8, num_workers=2, output="numpy")
    assert sum(len(x) for x, _ in loader) == len(ALL_CASES)
    stats = loader.stats()
    # Every file was decoded and transformed in C, and no worker ever waited
    # for the GIL (only the fallback takes it on this route).
    assert stats.stages["decode"]["calls"] == stats.stages["transform"]["calls"] == len(ALL_CASES)
    assert [w["gil_s"] for w in stats.workers] == [0.0, 0.0]

    forced = fastload.ImageFolder(folder, transform=random_plan())
    forced._fallback_all = True
    forced._make_sources()
    with pytest.raises(fastload.DecodeError, match="the Pillow fallback was called"):
        forced[0]

    gif = folder.parent / "x.gif"
    Image.new("RGB", (4, 4)).save(gif)
    with pytest.raises(fastload.DecodeError, match=r"x\.gif .*the Pillow fallback was called"):
        fastload.ImageFiles([gif], transform=random_plan())[0]


# ---------------------------------------------------------------- bad files

HUGE_PNG = (b"\x89PNG\r\n\x1a\n"
            + chunk(b"IHDR", struct.pack(">IIBBBBB", 200_000, 200_000, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"\0" * 100)) + chunk(b"IEND", b""))


def corrupt_crc(data):
    """The first IDAT intact, its CRC wrong."""
    at = data.index(b"IDAT") - 4
    end = at + 8 + struct.unpack(">I", data[at:at + 4])[0]
    return data[:end] + bytes(b ^ 0xFF for b in data[end:end + 4]) + data[end + 4:]


def corrupt_stream(data):
    """The IDAT's zlib stream garbled, with a CRC that matches."""
    at = data.index(b"IDAT") - 4
    length = struct.unpack(">I", data[at:at + 4])[0]
    body = bytes(b ^ 0x5A for b in data[at + 8:at + 8 + length])
    return data[:at] + chunk(b"IDAT", body) + data[at + 12 + length:]


def bad_files():
    png = PNG_CASES["rgb8"]
    files = {
        "truncated.png": (png[:len(png) // 2], "truncated PNG data"),
        "header_only.png": (png[:30], "truncated PNG data"),
        "crc.png": (corrupt_crc(png), "invalid PNG: IDAT: CRC error"),
        "zlib.png": (corrupt_stream(png), "invalid PNG"),
        "empty.png": (b"", "empty file"),
        "bad_ihdr.png": (png[:8] + chunk(b"IHDR", struct.pack(">IIBBBBB", 5, 5, 3, 2, 0, 0, 0))
                         + png[33:], "invalid PNG"),
        "huge.png": (HUGE_PNG, "200000 x 200000 pixels exceeds max_pixels"),
    }
    if WEBP_CASES:
        webp = WEBP_CASES["lossy_noise"]
        files["truncated.webp"] = (webp[:len(webp) // 2], "invalid WebP")
        files["garbled.webp"] = (webp[:30] + bytes(b ^ 0x33 for b in webp[30:]), "invalid WebP")
        files["header_only.webp"] = (webp[:16], "invalid WebP")
        lossless = WEBP_CASES["lossless"]
        files["truncated_lossless.webp"] = (lossless[:len(lossless) - 40], "invalid WebP")
        anim = WEBP_CASES["animated"]
        files["truncated_animated.webp"] = (anim[:len(anim) * 2 // 3], "invalid WebP")
    return files


BAD = bad_files()


@pytest.mark.parametrize("name", sorted(BAD))
@pytest.mark.parametrize("plan", [False, True])
def test_bad_files_are_decode_errors_naming_the_file(tmp_path, name, plan):
    data, message = BAD[name]
    path = tmp_path / name
    path.write_bytes(data)
    ds = fastload.ImageFiles([path], transform=deterministic_plan() if plan else None)
    with pytest.raises(fastload.DecodeError) as info:
        ds[0]
    text = str(info.value)
    assert name in text and "sample index 0" in text and message in text, text
    with pytest.raises(fastload.DecodeError, match=message):
        ds._raw.decode_only([0])


def test_max_pixels_is_respected(tmp_path):
    path = tmp_path / "x.png"
    path.write_bytes(PNG_CASES["rgb8"])
    wpath = tmp_path / "x.webp"
    wpath.write_bytes(WEBP_CASES.get("lossy", PNG_CASES["rgb8"]))
    for p in (path, wpath):
        ds = fastload.ImageFiles([p], transform=deterministic_plan(), max_pixels=W * H - 1)
        with pytest.raises(fastload.DecodeError, match=f"{W} x {H} pixels exceeds max_pixels"):
            ds[0]
        assert fastload.ImageFiles([p], transform=deterministic_plan(),
                                   max_pixels=W * H)[0][0].shape == (3, 15, 17)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_bad_files_are_skipped(tmp_path, num_workers):
    pytest.importorskip("torch")
    (tmp_path / "a").mkdir()
    good = ["0good.png", "9good.webp" if WEBP_CASES else "9good.png"]
    (tmp_path / "a" / good[0]).write_bytes(PNG_CASES["rgb8"])
    (tmp_path / "a" / good[1]).write_bytes(WEBP_CASES.get("lossless", PNG_CASES["gray8"]))
    for name, (data, _) in BAD.items():
        (tmp_path / "a" / name).write_bytes(data)
    ds = fastload.ImageFolder(tmp_path, transform=deterministic_plan(), on_error="skip")
    loader = fastload.DataLoader(ds, batch_size=len(ds), num_workers=num_workers,
                                 output="numpy")
    (images, labels), = list(loader)
    assert images.shape == (len(ds), 3, 15, 17)
    skipped = {str(path).rsplit("/", 1)[-1]: msg for _, path, msg in ds.skipped}
    assert set(skipped) == set(BAD)
    for name, (_, message) in BAD.items():
        assert message in skipped[name], (name, skipped[name])
