"""The C core alone (engine and slot pool), stressed by tests/c/engine_stress.c:
built and run plainly, and under ThreadSanitizer where the compiler has it."""

import os
import pathlib
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
SOURCES = ["tests/c/engine_stress.c"] + [
    f"csrc/core/{name}.c" for name in ("engine/engine", "engine/forksafe", "observe/nvtx",
                                       "memory/slots", "observe/stats", "status")
]
CC = shutil.which(os.environ.get("CC", "gcc")) or shutil.which("cc")

pytestmark = [
    pytest.mark.skipif(CC is None, reason="needs a C compiler"),
    # A standalone binary, run without the preloaded sanitizers: the sanitizer
    # run of scripts/test.sh would build and run the very same one again.
    pytest.mark.skipif(bool(os.environ.get("FASTLOAD_SANITIZER_RUN")),
                       reason="the same binary as in the plain run"),
]


def build_and_run(tmp_path, flags):
    exe = tmp_path / "engine_stress"
    build = subprocess.run(
        [CC, "-std=c11", "-g", "-Wall", "-Wextra", "-Werror", *flags, "-Icsrc", *SOURCES,
         "-lpthread", "-ldl", "-o", str(exe)],
        cwd=ROOT, capture_output=True, text=True,
    )
    if build.returncode != 0:
        return build
    # The test run may have a sanitizer preloaded; the harness brings its own.
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    return subprocess.run([str(exe)], capture_output=True, text=True, timeout=300, env=env)


def test_core_stress(tmp_path):
    result = build_and_run(tmp_path, ["-O2"])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "engine stress: ok" in result.stdout


def test_core_stress_under_thread_sanitizer(tmp_path):
    probe = subprocess.run([CC, "-fsanitize=thread", "-x", "c", "-", "-o", str(tmp_path / "probe")],
                           input="int main(void){return 0;}", capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip("the compiler has no ThreadSanitizer")
    result = build_and_run(tmp_path, ["-O1", "-fsanitize=thread"])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ThreadSanitizer" not in result.stderr, result.stderr
    assert "engine stress: ok" in result.stdout
