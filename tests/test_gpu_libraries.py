"""nvJPEG and NVRTC, opened at run time for the GPU decode stage
(csrc/core/cuda/nvjpeg.c, nvrtc.c), driven through stand-ins built here
(tests/c/fake_libnvjpeg.c decodes with the system's libjpeg into the fake
driver's "device" memory, which is host memory; tests/c/fake_libnvrtc.c
"compiles" to a text the fake driver runs as host kernels).  Each case runs
in a fresh process: each library is opened once per process.  The last test
decodes through the real nvJPEG on a GPU (marked ``gpu``).
"""

import io
import os
import pathlib
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from fl_helpers import fastload_only

pytestmark = fastload_only

ROOT = pathlib.Path(__file__).resolve().parent.parent

PRELUDE = """
import ctypes, io, os, sys
import numpy as np
from PIL import Image
import fastload
from fastload import _C
from fastload import cuda as fcuda

FOLDERS = None

def jpeg(width, height, seed=0, subsampling=2, progressive=False, mode="RGB"):
    rng = np.random.default_rng(seed)
    # Smooth gradients plus noise: every block has content to code.
    y, x = np.mgrid[0:height, 0:width]
    rgb = np.stack([(x * 255 // max(width - 1, 1)), (y * 255 // max(height - 1, 1)),
                    ((x + y) * 3) % 256], -1) + rng.integers(0, 40, (height, width, 3))
    image = Image.fromarray(np.clip(rgb, 0, 255).astype(np.uint8)).convert(mode)
    out = io.BytesIO()
    image.save(out, "JPEG", quality=90, subsampling=subsampling, progressive=progressive)
    return out.getvalue()

def pillow(data):
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))

def counters(env, names):
    lib = ctypes.CDLL(os.environ[env])
    out = (ctypes.c_longlong * len(names))()
    getattr(lib, "fake_cuda_counters" if env == "FASTLOAD_LIBCUDA" else "fake_nvjpeg_counters")(
        out, len(names))
    return dict(zip(names, out))

CUDA_COUNTERS = ("device_bytes", "device_buffers", "pinned_buffers", "copies", "stream_waits",
                 "last_wait_stream", "event_records", "last_record_stream", "live_streams",
                 "live_events", "host_registered", "register_calls", "unregister_calls",
                 "bad_registrations", "last_register_flags", "event_queries",
                 "pending_queries", "event_syncs", "live_modules", "kernel_launches",
                 "memsets", "dtoh_copies")
NVJPEG_COUNTERS = ("live_handles", "live_states", "live_streams", "create_calls",
                   "last_backend", "initialize_calls", "decode_calls", "images_decoded",
                   "supported_calls")

def decode(jpegs, hardware=True, do_decode=True, allocator=False, rois=None):
    return _C.nvjpeg_decode_probe(FOLDERS, 0, jpegs, hardware, do_decode, allocator, rois)

def error_of(call):
    try:
        call()
    except RuntimeError as e:
        return str(e)
    raise AssertionError("no error")

def no_leaks():
    cuda = counters("FASTLOAD_LIBCUDA", CUDA_COUNTERS)
    nvjpeg = counters("FASTLOAD_LIBNVJPEG", NVJPEG_COUNTERS)
    assert cuda["device_buffers"] == 0, cuda
    assert (nvjpeg["live_handles"], nvjpeg["live_states"], nvjpeg["live_streams"]) == (0, 0, 0)

FILL = '''
extern "C" __global__ void fill_pattern(unsigned char *dst, int n, int seed)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = (unsigned char)(i * seed + 1);
}
'''

def fill_expected(n, seed):
    return bytes(((i * seed + 1) & 255) for i in range(n))

def nvrtc_options():
    lib = ctypes.CDLL(os.environ["FASTLOAD_LIBNVRTC"])
    lib.fake_nvrtc_last_options.restype = ctypes.c_longlong
    text = ctypes.create_string_buffer(1024)
    compiles = lib.fake_nvrtc_last_options(text, 1024)
    return compiles, text.value.decode().split()
"""


def run_case(body, libs, **env):
    """Runs `body` after PRELUDE in a fresh process with the stand-ins
    selected; `env` values of None remove a variable."""
    script = PRELUDE + textwrap.dedent(body) + "\nprint('ok')\n"
    environment = dict(os.environ, PYTHONPATH=str(ROOT), FASTLOAD_LIBCUDA=libs["cuda"],
                       FASTLOAD_LIBNVJPEG=libs["nvjpeg"], FASTLOAD_LIBNVRTC=libs["nvrtc"],
                       FASTLOAD_KERNEL_CACHE="off")
    for key, value in env.items():
        if value is None:
            environment.pop(key, None)
        else:
            environment[key] = value
    result = subprocess.run([sys.executable, "-c", script], env=environment,
                            capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines()[-1] == "ok", result.stdout
    return result.stdout.splitlines()[:-1]


# ---- nvJPEG ---------------------------------------------------------------


def test_no_library_is_an_answer_not_an_error(fake_gpu_libraries):
    run_case("""
        info = fcuda._nvjpeg_info()
        assert info["available"] is False and info["path"] is None, info
        assert info["error"].startswith(
            "nvJPEG is not available: cannot load FASTLOAD_LIBNVJPEG=no-such-nvjpeg.so"), info
        assert fcuda._nvrtc_info()["error"].startswith("NVRTC is not available: cannot load "
                                                       "FASTLOAD_LIBNVRTC=no-such-nvrtc.so")
        # Asked again, the same answer (opened once), and the probes say why.
        assert fcuda._nvjpeg_info() == info
        message = error_of(lambda: decode([jpeg(8, 8)]))
        assert message.startswith("nvJPEG is not available"), message
        message = error_of(lambda: _C.nvrtc_launch_probe(None, 0, FILL, "fill_pattern", 8, 1))
        assert message.startswith("NVRTC is not available"), message
    """, fake_gpu_libraries, FASTLOAD_LIBNVJPEG="no-such-nvjpeg.so",
             FASTLOAD_LIBNVRTC="no-such-nvrtc.so")


def test_info_names_the_library_and_its_version(fake_gpu_libraries):
    run_case(f"""
        info = fcuda._nvjpeg_info()
        assert info == {{"available": True, "path": {fake_gpu_libraries['nvjpeg']!r},
                        "version": (12, 3, 1), "error": None}}, info
        info = fcuda._nvrtc_info()
        assert info["available"] and info["version"] == (12, 4), info
        assert info["path"] == {fake_gpu_libraries['nvrtc']!r}
    """, fake_gpu_libraries)


def test_library_found_in_a_wheel_folder(fake_gpu_libraries, tmp_path):
    # The nvidia-nvjpeg-cu12 wheel's layout: nvidia/nvjpeg/lib/libnvjpeg.so.12.
    lib = tmp_path / "site" / "nvidia" / "nvjpeg" / "lib"
    lib.mkdir(parents=True)
    (lib / "libnvjpeg.so.12").write_bytes(pathlib.Path(fake_gpu_libraries["nvjpeg"]).read_bytes())
    run_case(f"""
        sys.path.insert(0, {str(tmp_path / "site")!r})
        assert {str(lib)!r} in fcuda._library_folders("nvjpeg")
        info = fcuda._nvjpeg_info()
        assert info["available"], info
        assert info["path"] == {str(lib / "libnvjpeg.so.12")!r}, info
    """, fake_gpu_libraries, FASTLOAD_LIBNVJPEG=None)


def test_batched_decode_matches_libjpeg(fake_gpu_libraries):
    run_case("""
        jpegs = [jpeg(64, 48, 1), jpeg(33, 17, 2, subsampling=0), jpeg(7, 90, 3),
                 jpeg(40, 40, 4, mode="L")]
        out = decode(jpegs)
        assert out["backend"] == "hardware" and out["supported"] == [True] * 4, out
        for data, image in zip(jpegs, out["images"]):
            reference = pillow(data)
            assert image.shape == reference.shape and image.dtype == np.uint8
            # Pillow may bundle another libjpeg-turbo than the system's.
            difference = np.abs(image.astype(int) - reference.astype(int))
            assert difference.max() <= 2, difference.max()
        c = counters("FASTLOAD_LIBNVJPEG", NVJPEG_COUNTERS)
        assert (c["decode_calls"], c["images_decoded"], c["last_backend"]) == (1, 4, 3), c
        # A second batch of another size initialises the batched state again.
        again = decode(jpegs[:2])
        assert all(np.array_equal(a, b) for a, b in zip(again["images"], out["images"][:2]))
        assert counters("FASTLOAD_LIBCUDA", CUDA_COUNTERS)["dtoh_copies"] == 6
        no_leaks()
    """, fake_gpu_libraries)


def test_device_memory_through_our_allocator(fake_gpu_libraries):
    run_case("""
        jpegs = [jpeg(24, 24, 1), jpeg(9, 31, 2)]
        plain = decode(jpegs)
        assert plain["allocator"] == (0, 0)
        pooled = decode(jpegs, allocator=True)
        # nvjpegCreateExV2 took the allocator: its scratch came from it, and
        # all of it went back when the decoder went.
        assert pooled["allocator"][0] >= 1 and pooled["allocator"][1] == 0, pooled["allocator"]
        assert all(np.array_equal(a, b) for a, b in zip(plain["images"], pooled["images"]))
        no_leaks()
    """, fake_gpu_libraries)
    # The allocator refusing is nvJPEG's allocator failure, named.
    run_case("""
        message = error_of(lambda: decode([jpeg(24, 24, 1)], allocator=True))
        assert message == ("nvjpegDecodeBatchedInitialize failed: "
                           "NVJPEG_STATUS_ALLOCATOR_FAILURE (5)"), message
        no_leaks()
    """, fake_gpu_libraries, FAKE_CUDA_MEMORY="2000")


def test_regions_of_interest(fake_gpu_libraries):
    run_case("""
        jpegs = [jpeg(64, 48, 1), jpeg(33, 17, 2, subsampling=0)]
        whole = decode(jpegs)["images"]
        out = decode(jpegs, rois=[(8, 4, 20, 30), (0, 0, 0, 0)])
        assert np.array_equal(out["images"][0], whole[0][4:34, 8:28])
        assert np.array_equal(out["images"][1], whole[1])
        message = error_of(lambda: decode(jpegs, rois=[(50, 0, 20, 10), (0, 0, 0, 0)]))
        assert message == "image 0: region outside the image", message
        c = counters("FASTLOAD_LIBNVJPEG", NVJPEG_COUNTERS + ("live_params",))
        assert c["live_params"] == 0, c  # the decoder's parameters went with it
        no_leaks()
    """, fake_gpu_libraries)
    run_case("""
        message = error_of(lambda: decode([jpeg(16, 16, 1)], rois=[(0, 0, 8, 8)]))
        assert message == ("nvjpegDecodeBatchedEx failed: "
                           "NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED (9)"), message
        no_leaks()
    """, fake_gpu_libraries, FAKE_NVJPEG_HARDWARE="0")


def test_without_jpeg_engines_the_default_backend_decodes(fake_gpu_libraries):
    run_case("""
        data = [jpeg(20, 30, 5, progressive=True)]
        out = decode(data)
        assert out["backend"] == "default" and out["supported"] == [True], out
        assert np.abs(out["images"][0].astype(int) - pillow(data[0])).max() <= 2
        c = counters("FASTLOAD_LIBNVJPEG", NVJPEG_COUNTERS)
        assert c["last_backend"] == 0 and c["supported_calls"] == 0, c
        no_leaks()
    """, fake_gpu_libraries, FAKE_NVJPEG_HARDWARE="0")


def test_progressive_refused_by_the_hardware_backend(fake_gpu_libraries):
    run_case("""
        jpegs = [jpeg(16, 16, 1), jpeg(16, 16, 2, progressive=True)]
        out = decode(jpegs, do_decode=False)
        assert out == {"backend": "hardware", "supported": [True, False], "images": None,
                       "allocator": (0, 0)}, out
        message = error_of(lambda: decode(jpegs))
        assert message == ("nvjpegDecodeBatched failed: NVJPEG_STATUS_JPEG_NOT_SUPPORTED (4)"), \\
            message
        # The default backend takes it.
        out = decode(jpegs, hardware=False)
        assert out["backend"] == "default" and out["supported"] == [True, True]
        assert np.abs(out["images"][1].astype(int) - pillow(jpegs[1])).max() <= 2
        no_leaks()
    """, fake_gpu_libraries)


def test_corrupt_bytes_name_the_status(fake_gpu_libraries):
    run_case("""
        good = jpeg(256, 256, 1)
        message = error_of(lambda: decode([good, b"not a jpeg at all"], do_decode=False))
        assert message == "image 1: nvjpegGetImageInfo failed: NVJPEG_STATUS_BAD_JPEG (3)", \
            message
        # Headers intact, entropy-coded data cut: found by the decode itself.
        message = error_of(lambda: decode([good, good[: len(good) // 2]]))
        assert message == "nvjpegDecodeBatched failed: NVJPEG_STATUS_BAD_JPEG (3)", message
        no_leaks()
    """, fake_gpu_libraries)


@pytest.mark.parametrize("failure, message", [
    ("create", "nvjpegCreateEx failed: NVJPEG_STATUS_ALLOCATOR_FAILURE (5)"),
    ("initialize", "nvjpegDecodeBatchedInitialize failed: NVJPEG_STATUS_ALLOCATOR_FAILURE (5)"),
    ("execute", "nvjpegDecodeBatched failed: NVJPEG_STATUS_EXECUTION_FAILED (6)"),
])
def test_injected_failures_raise(fake_gpu_libraries, failure, message):
    run_case(f"""
        for attempt in range(2):  # and the process goes on: nothing left half-made
            message = error_of(lambda: decode([jpeg(16, 16, 1)]))
            assert message == {message!r}, message
            no_leaks()
    """, fake_gpu_libraries, FAKE_NVJPEG_FAIL=failure)


def test_device_memory_exhausted_raises(fake_gpu_libraries):
    run_case("""
        message = error_of(lambda: decode([jpeg(64, 64, 1)]))
        assert message.startswith("cuMemAlloc for image 0 failed"), message
        no_leaks()
    """, fake_gpu_libraries, FAKE_CUDA_MEMORY="1000")


# ---- NVRTC and kernels ------------------------------------------------------


def test_kernel_compiled_for_the_device_and_launched(fake_gpu_libraries):
    run_case("""
        out = _C.nvrtc_launch_probe(None, 0, FILL, "fill_pattern", 1000, 7)
        assert out == fill_expected(1000, 7)
        compiles, options = nvrtc_options()
        assert compiles == 1
        assert options == ["--gpu-architecture=compute_86", "--fmad=false"], options
        # Compiled once per process and device: the second launch reuses it.
        assert _C.nvrtc_launch_probe(None, 0, FILL, "fill_pattern", 130, 3) == fill_expected(130, 3)
        assert nvrtc_options()[0] == 1
        c = counters("FASTLOAD_LIBCUDA", CUDA_COUNTERS)
        assert (c["live_modules"], c["kernel_launches"], c["device_buffers"]) == (1, 2, 0), c
    """, fake_gpu_libraries, FAKE_CUDA_CAPABILITY="8.6")


def test_compiled_ptx_is_cached_on_disk(fake_gpu_libraries, tmp_path):
    body = """
        assert _C.nvrtc_launch_probe(None, 0, FILL, "fill_pattern", 300, 5) == fill_expected(300, 5)
        print(nvrtc_options()[0])
    """
    cache = tmp_path / "kernels"
    env = dict(FASTLOAD_KERNEL_CACHE=str(cache), FAKE_CUDA_CAPABILITY="8.0")
    assert run_case(body, fake_gpu_libraries, **env) == ["1"]  # compiled, then stored
    files = sorted(p.name for p in cache.iterdir())
    assert len(files) == 1 and files[0].endswith("-compute_80-nvrtc12.4.ptx"), files
    assert (cache / files[0]).read_text().startswith("// fake PTX\n")
    assert run_case(body, fake_gpu_libraries, **env) == ["0"]  # loaded, not compiled
    # Another architecture or NVRTC is another file; a damaged file is compiled again.
    assert run_case(body, fake_gpu_libraries, FASTLOAD_KERNEL_CACHE=str(cache),
                    FAKE_CUDA_CAPABILITY="9.0") == ["1"]
    assert run_case(body, fake_gpu_libraries, FAKE_NVRTC_VERSION="13.0", **env) == ["1"]
    assert len(list(cache.iterdir())) == 3
    (cache / files[0]).write_text("garbage")
    assert run_case(body, fake_gpu_libraries, **env) == ["1"]
    assert (cache / files[0]).read_text().startswith("// fake PTX\n")
    assert not [p for p in cache.iterdir() if p.name.endswith(".tmp")]


def test_compile_error_carries_the_log(fake_gpu_libraries):
    run_case("""
        source = "// a kernel\\n#error not today\\n" + FILL
        message = error_of(lambda: _C.nvrtc_launch_probe(None, 0, source, "fill_pattern", 8, 1))
        assert message.startswith("nvrtcCompileProgram(fastload_probe.cu, "
                                  "--gpu-architecture=compute_90) failed: "
                                  "NVRTC_ERROR_COMPILATION\\n"), message
        assert "fastload_probe.cu(2): error: #error directive" in message, message
        # A failed compile is not cached: a good source still compiles.
        assert _C.nvrtc_launch_probe(None, 0, FILL, "fill_pattern", 8, 1) == fill_expected(8, 1)
    """, fake_gpu_libraries)


def test_missing_kernel_and_driver_errors_are_named(fake_gpu_libraries):
    run_case("""
        message = error_of(lambda: _C.nvrtc_launch_probe(None, 0, FILL, "no_such_kernel", 8, 1))
        assert message.startswith("cuModuleGetFunction(no_such_kernel) failed"), message
    """, fake_gpu_libraries)
    run_case("""
        message = error_of(lambda: _C.nvrtc_launch_probe(None, 0, FILL, "fill_pattern", 8, 1))
        assert message.startswith("cuModuleLoadData(fastload_probe.cu) on cuda:0 failed: "
                                  "CUDA error 222 (NVRTC 12.4)"), message
    """, fake_gpu_libraries, FAKE_CUDA_MODULE_ERROR="222")


# ---- The real libraries -------------------------------------------------------


def _why_no_real_nvjpeg():
    script = ("import fastload.cuda as c\n"
              "print(c.is_available() and c._nvjpeg_info()['available'])\n"
              "print(c._status()['error'] or c._nvjpeg_info()['error'])\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    for key in ("FASTLOAD_LIBCUDA", "FASTLOAD_LIBNVJPEG", "FASTLOAD_LIBNVRTC"):
        env.pop(key, None)
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                            text=True, timeout=120)
    lines = result.stdout.splitlines()
    if result.returncode != 0 or len(lines) < 2:
        return f"fastload cannot ask for nvJPEG: {result.stderr[-300:]}"
    return None if lines[0] == "True" else f"needs a CUDA GPU and nvJPEG ({lines[1]})"


@pytest.mark.gpu
def test_real_nvjpeg_decodes_like_pillow(tmp_path):
    why = _why_no_real_nvjpeg()
    if why:
        pytest.skip(why)
    Image = pytest.importorskip("PIL.Image")
    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:240, 0:320]
    rgb = np.stack([x * 255 // 319, y * 255 // 239, (x + y) % 256], -1)
    rgb = np.clip(rgb + rng.integers(0, 30, rgb.shape), 0, 255).astype(np.uint8)
    jpegs = []
    for subsampling in (0, 2):
        out = io.BytesIO()
        Image.fromarray(rgb).save(out, "JPEG", quality=92, subsampling=subsampling)
        jpegs.append(out.getvalue())
        (tmp_path / f"{subsampling}.jpg").write_bytes(out.getvalue())
    script = ("import fastload.cuda as c, numpy as np, pathlib, sys\n"
              "from fastload import _C\n"
              "folder = pathlib.Path(sys.argv[1])\n"
              "jpegs = [(folder / f'{s}.jpg').read_bytes() for s in (0, 2)]\n"
              "out = _C.nvjpeg_decode_probe(c._library_folders('nvjpeg'), 0, jpegs, True, True,\n"
              "                             False, None)\n"
              "print(out['backend'], c._nvjpeg_info())\n"
              "np.save(folder / 'decoded.npy', np.stack(out['images']))\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    for key in ("FASTLOAD_LIBCUDA", "FASTLOAD_LIBNVJPEG"):
        env.pop(key, None)
    result = subprocess.run([sys.executable, "-c", script, str(tmp_path)], env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    images = np.load(tmp_path / "decoded.npy")
    for data, image in zip(jpegs, images):
        reference = np.asarray(Image.open(io.BytesIO(data)).convert("RGB")).astype(np.float64)
        mse = np.mean((image.astype(np.float64) - reference) ** 2)
        psnr = 10 * np.log10(255.0 ** 2 / max(mse, 1e-12))
        assert psnr >= 40, (result.stdout, psnr)
