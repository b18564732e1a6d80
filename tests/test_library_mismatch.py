"""An image library whose ABI differs from the headers fastload was built
with (a build against libjpeg-turbo's 6.2-ABI jpeglib.h that the dynamic
loader pairs with a libjpeg.so.8): the library refuses every decoder with
its own error ("Wrong JPEG library version: library is 80, caller expects
62").  Importing fastload must refuse with that message and name the file
loaded, and a decoder that cannot be made later must raise the library's
message, never a MemoryError.  The same for libpng and libwebp.

No second library is needed: tests/c/library_abi_shim.c, preloaded into a
child interpreter, hands the real library another header version while
FL_TEST_JPEG_VERSION (FL_TEST_PNG_VERSION, FL_TEST_WEBP_ABI) is set, so the
library raises its own error."""

import os
import pathlib
import re
import subprocess
import sys
import textwrap

import pytest
from c_shims import compile_shim

from fastload import _C

ROOT = pathlib.Path(__file__).resolve().parent.parent
INFO = _C.build_info()
BUILT = INFO["jpeg_lib_version"]
FAKE = 80 if BUILT != 80 else 62


class Lib:
    def __init__(self, name, variable, value, shimmed, message, ext):
        self.name, self.variable, self.value = name, variable, value
        self.shimmed, self.message, self.ext = shimmed, message, ext

    def __repr__(self):
        return self.name


LIBS = [
    # libjpeg's JERR_BAD_LIB_VERSION, as jerror.h words it (the first letter
    # may be lowercased where fastload puts it after a colon).
    Lib("libjpeg", "FL_TEST_JPEG_VERSION", str(FAKE), "jpeg_CreateDecompress",
        f"[Ww]rong JPEG library version: library is {BUILT}, caller expects {FAKE}", "jpg"),
    # png.c's png_user_version_check.
    Lib("libpng", "FL_TEST_PNG_VERSION", "1.2.59", "png_create_read_struct",
        re.escape(f"Application built with libpng-1.2.59 but running with "
                  f"{INFO['libpng_version']}"), "png"),
    # libwebp has no words of its own for it.
    Lib("libwebp", "FL_TEST_WEBP_ABI", "0x0100", "WebPInitDecoderConfigInternal",
        "libwebp refuses the decoder ABI of the headers fastload was built with", "webp"),
]


@pytest.fixture(scope="module")
def shim(tmp_path_factory):
    return compile_shim("library_abi_shim", tmp_path_factory)


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    Image = pytest.importorskip("PIL.Image")
    root = tmp_path_factory.mktemp("mismatch")
    paths = {}
    for ext in ("jpg", "png", "webp"):
        paths[ext] = str(root / f"image.{ext}")
        Image.new("RGB", (40, 30), (200, 100, 50)).save(paths[ext])
    return paths


# argv: the shimmed function, the variable and its value, "import" (set
# from the start) or "decode" (set after import), the image.  Prints one line
# per attempt ("<ExceptionType>: <message>" or "ok"), then "calls N": how
# often the shim ran (0: it did not interpose).
SCRIPT = textwrap.dedent("""
    import ctypes, os, sys
    function, variable, value, mode, path = sys.argv[1:]
    calls = ctypes.c_int.in_dll(ctypes.CDLL(None), "fl_test_calls_" + function)

    def attempt(what):
        try:
            what()
        except Exception as e:
            print(f"{type(e).__name__}: {e}".replace("\\n", " | "))
        else:
            print("ok")

    if mode == "import":
        os.environ[variable] = value
    try:
        import fastload
    except ImportError as e:
        print(f"ImportError: {e}".replace("\\n", " | "))
        print(f"calls {calls.value}")
        sys.exit(0)
    print("imported")
    from fastload import transforms as T
    os.environ[variable] = value  # from here on, the library refuses
    ds = fastload.ImageFiles([path] * 4, transform=T.Compose([T.Resize((8, 8)), T.ToTensor()]))
    attempt(lambda: ds[0])
    for workers in (0, 2):
        attempt(lambda: next(iter(fastload.DataLoader(ds, batch_size=2, num_workers=workers))))
    print(f"calls {calls.value}")
""")


def run_child(shim, lib, mode, image):
    env = dict(os.environ)
    env["LD_PRELOAD"] = ":".join(filter(None, [env.get("LD_PRELOAD"), str(shim)]))
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "tests")])
    for other in LIBS:
        env.pop(other.variable, None)
    result = subprocess.run([sys.executable, "-c", SCRIPT, lib.shimmed, lib.variable, lib.value,
                             mode, image], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    calls = int(re.fullmatch(r"calls (\d+)", lines[-1]).group(1))
    if calls == 0:
        # A wheel's libraries live in fastload.libs under mangled names; if
        # the extension's calls into them cannot be interposed there,
        # nothing can be tested this way.
        pytest.skip(f"the LD_PRELOAD shim does not interpose {lib.shimmed} "
                    "in this build of fastload")
    return lines[:-1]


@pytest.mark.parametrize("lib", LIBS, ids=repr)
def test_import_refuses_a_library_of_another_abi(shim, images, lib):
    lines = run_child(shim, lib, "import", images[lib.ext])
    assert len(lines) == 1 and lines[0].startswith("ImportError: "), lines
    message = lines[0]
    assert re.search(lib.message, message), message
    # It names the file loaded, the headers built with, and what to do.
    assert re.search(rf"cannot use the {lib.name} it loaded \(/\S*{lib.name[3:]}", message), message
    if lib.name == "libjpeg" and INFO["libjpeg_path"]:
        assert f"({os.path.realpath(INFO['libjpeg_path'])})" in message, message
        assert f"JPEG_LIB_VERSION {BUILT}" in message, message
    assert "rebuild fastload against the headers" in message, message


@pytest.mark.parametrize("lib", LIBS, ids=repr)
def test_a_decoder_the_library_refuses_raises_its_message_not_memory_error(shim, images, lib):
    lines = run_child(shim, lib, "decode", images[lib.ext])
    assert lines[0] == "imported", lines
    attempts = lines[1:]
    assert len(attempts) == 3, lines
    for line in attempts:
        assert not line.startswith("MemoryError"), lines
        assert re.search(lib.message, line), lines
