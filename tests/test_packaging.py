"""How fastload is installed: a binary wheel decodes with the image libraries
it carries (fastload.libs/), and a source build without their headers stops
with a message naming the packages to install."""

import os
import pathlib
import shutil
import subprocess
import sys
import sysconfig

import pytest

import fastload

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE_PARENT = pathlib.Path(fastload.__file__).resolve().parent.parent
BUNDLED_LIBS = PACKAGE_PARENT / "fastload.libs"

# In a child, so that no other package's image libraries (Pillow's,
# torchvision's) are mapped: every libjpeg, libpng and libwebp in the process
# must then be the ones fastload uses.
DECODE_AND_LIST_LIBRARIES = """
import sys
import numpy as np
import fastload
from proc_info import mapped_files

for path in sys.argv[1:]:
    image, label = fastload.ImageFiles([path])[0]
    assert image.shape == (24, 32, 3) and image.dtype == np.uint8, image.shape
assert "PIL.Image" not in sys.modules  # Pillow would map its own libraries
for path in sorted(mapped_files()):
    if path.rsplit("/", 1)[-1].startswith(("libjpeg", "libpng", "libwebp")):
        print(path)
"""


def from_repaired_wheel():
    return BUNDLED_LIBS.is_dir() and any(p.name.startswith("libjpeg") for p in BUNDLED_LIBS.iterdir())


@pytest.mark.skipif(not from_repaired_wheel() and os.environ.get("FASTLOAD_EXPECT_INSTALLED") != "wheel",
                    reason="fastload is not running from a repaired wheel (no fastload.libs/)")
def test_decodes_with_the_libraries_the_wheel_carries(tmp_path):
    Image = pytest.importorskip("PIL.Image")
    files = []
    for suffix in ("jpg", "png", "webp"):
        files.append(str(tmp_path / f"photo.{suffix}"))
        Image.new("RGB", (32, 24), (200, 40, 90)).save(files[-1])
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.abspath(__file__)))
    result = subprocess.run([sys.executable, "-c", DECODE_AND_LIST_LIBRARIES, *files],
                            env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    loaded = result.stdout.split()
    names = {pathlib.Path(path).name.split("-")[0].split(".")[0] for path in loaded}
    assert {"libjpeg", "libpng16", "libwebp"} <= names, loaded
    # The wheel's copies and nothing else: not the system's libjpeg.so.62.
    assert all(pathlib.Path(path).parent == BUNDLED_LIBS.resolve() for path in loaded), loaded


def test_installed_fastload_lies_outside_the_checkout():
    """What tests/conftest.py asserts for a whole run with
    FASTLOAD_EXPECT_INSTALLED set, here as a test of its own."""
    if not os.environ.get("FASTLOAD_EXPECT_INSTALLED"):
        pytest.skip("FASTLOAD_EXPECT_INSTALLED is not set: the checkout's build is fine")
    site = {pathlib.Path(sysconfig.get_paths()[key]).resolve() for key in ("purelib", "platlib")}
    assert PACKAGE_PARENT in site
    assert ROOT not in pathlib.Path(fastload.__file__).resolve().parents


@pytest.mark.skipif(not (ROOT / "setup.py").is_file() or not (ROOT / "fastload").is_dir(),
                    reason="needs the source tree")
def test_source_build_without_the_image_headers_names_the_packages(tmp_path):
    pytest.importorskip("setuptools", minversion="77")
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler")
    # The compiler searches only a folder with an empty stdio.h: jpeglib.h
    # is missing as it is on a machine without libjpeg-dev.
    include = tmp_path / "include"
    include.mkdir()
    (include / "stdio.h").write_text("")
    env = dict(os.environ, CFLAGS=f"-nostdinc -I{include}")
    result = subprocess.run(
        [sys.executable, "setup.py", "-q", "build_ext", "--build-temp", str(tmp_path / "temp"),
         "--build-lib", str(tmp_path / "lib")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode != 0
    assert "jpeglib.h, png.h, webp/decode.h" in result.stderr
    assert "apt-get install libjpeg-dev libpng-dev libwebp-dev" in result.stderr
    assert "dnf install libjpeg-turbo-devel libpng-devel libwebp-devel" in result.stderr
    assert "Traceback" not in result.stderr
    assert not list((tmp_path / "lib").rglob("*.so"))
