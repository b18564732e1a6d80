"""Shared fixtures for the fastload test suite.

The datasets, comparison helpers and the torch-vs-fastload parity runner live in
``fl_helpers.py`` next to this file; this conftest makes that module importable
(``import fl_helpers``) independently of pytest's import mode and exposes the
commonly used pieces as fixtures.

Tests that exercise fastload-only features are marked ``@fastload_only``
(``fl_helpers.fastload_only``: skipped when ``fastload.__torch_shim__`` is
true, i.e. when the suite is validated against a shim that re-exports
torch.utils.data).
"""

import gc
import os
import sys
import time

import pytest

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)


@pytest.fixture(scope="session")
def torchvision():
    """torchvision, imported as benchmarks/torchvision_import.py does (it
    works with the CPU-only torch); the test is skipped without it."""
    benchmarks = os.path.join(os.path.dirname(_HERE), "benchmarks")
    if benchmarks not in sys.path:
        sys.path.insert(0, benchmarks)
    from torchvision_import import import_torchvision

    module = import_torchvision()
    if module is None:
        pytest.skip("torchvision cannot be imported")
    return module


@pytest.fixture(scope="session")
def map_dataset_dir(tmp_path_factory):
    """Directory for file-backed datasets (memmap)."""
    return tmp_path_factory.mktemp("fastload_datasets")


@pytest.fixture
def make_map_dataset(map_dataset_dir):
    """make_map_dataset(name, base=torch.utils.data.Dataset) -> dataset instance."""
    pytest.importorskip("torch")
    import fl_helpers as h

    def make(name, base=None):
        kwargs = {} if base is None else {"base": base}
        return h.make_map_dataset(name, map_dataset_dir, **kwargs)

    return make


@pytest.fixture
def thread_baseline():
    """Native thread count of this process after collecting garbage.

    Call ``thread_baseline()`` after warming up whatever lazy thread pools a
    test may trigger; compare against fl_helpers.native_thread_count().
    """
    import fl_helpers as h

    def take():
        gc.collect()
        time.sleep(0.05)  # give threads that are already exiting a moment to disappear
        return h.native_thread_count()

    return take


# gcc's AddressSanitizer runtime can deadlock a process that forks while other
# threads allocate (its allocator and stack-depot locks are not fork-safe), and
# torch's DataLoader forks a worker process per worker.  Those runs check
# torch, not fastload's C code, so the sanitizer run (scripts/test.sh sets
# FASTLOAD_SANITIZER_RUN) skips the tests that fork torch workers; the plain
# run executes them all.
if os.environ.get("FASTLOAD_SANITIZER_RUN"):
    @pytest.fixture(autouse=True)
    def _no_torch_worker_processes(monkeypatch):
        try:
            from torch.utils.data import DataLoader
        except ImportError:
            return
        get_iterator = DataLoader._get_iterator

        def in_process_only(loader):
            if loader.num_workers > 0:
                pytest.skip("forks torch worker processes (not under the sanitizer)")
            return get_iterator(loader)

        monkeypatch.setattr(DataLoader, "_get_iterator", in_process_only)


# FASTLOAD_EXPECT_INSTALLED=1 (scripts/test.sh sets "wheel"): the run tests an
# installed fastload, so importing one from a source tree is an error rather
# than a silent pass on the wrong build.
def pytest_configure(config):
    expected = os.environ.get("FASTLOAD_EXPECT_INSTALLED")
    if not expected:
        return
    import sysconfig

    import fastload

    package = os.path.dirname(os.path.realpath(fastload.__file__))
    site = {os.path.realpath(sysconfig.get_paths()[key]) for key in ("purelib", "platlib")}
    if os.path.dirname(package) not in site:
        raise pytest.UsageError(
            f"FASTLOAD_EXPECT_INSTALLED={expected}, but fastload was imported from {package}, "
            f"not from this interpreter's site-packages ({', '.join(sorted(site))})")
    if expected == "wheel" and not os.path.isdir(os.path.join(os.path.dirname(package),
                                                              "fastload.libs")):
        raise pytest.UsageError(
            f"FASTLOAD_EXPECT_INSTALLED=wheel, but the fastload in {package} was not installed "
            "from a repaired wheel (no fastload.libs/ beside it)")


@pytest.fixture(scope="session")
def fake_gpu_libraries(tmp_path_factory):
    """Stand-ins for the GPU decode stage's libraries, built once: {'cuda':
    tests/c/fake_libcuda.c, 'nvjpeg': tests/c/fake_libnvjpeg.c (decodes with
    the system's libjpeg), 'nvrtc': tests/c/fake_libnvrtc.c}, as paths for
    FASTLOAD_LIBCUDA, FASTLOAD_LIBNVJPEG and FASTLOAD_LIBNVRTC."""
    import shutil
    import subprocess

    cc = shutil.which(os.environ.get("CC", "gcc")) or shutil.which("cc")
    if cc is None:
        pytest.skip("needs a C compiler")
    out = tmp_path_factory.mktemp("fakegpu")
    sources = os.path.join(_HERE, "c")
    libs = {}
    for name, extra in (("cuda", []), ("nvjpeg", ["-ljpeg"]), ("nvrtc", [])):
        lib = os.path.join(str(out), f"libfake{name}.so")
        subprocess.run([cc, "-shared", "-fPIC", "-O1", "-Wall", "-Wextra", "-Werror", "-I",
                        os.path.join(os.path.dirname(_HERE), "csrc"), "-o", lib,
                        os.path.join(sources, f"fake_lib{name}.c"), *extra], check=True)
        libs[name] = lib
    return libs
