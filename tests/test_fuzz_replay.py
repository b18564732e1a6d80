"""Replays the fuzz corpus and every crash file ever found (fuzz/corpus,
fuzz/crashes) through the fuzz targets, built with the sanitizers: a fixed
bug stays fixed.  fuzz/Makefile runs the fuzzers themselves."""

import concurrent.futures
import os
import pathlib
import re
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
FUZZ = ROOT / "fuzz"
CC = shutil.which(os.environ.get("CC", "gcc")) or shutil.which("cc")
TARGETS = sorted(p.stem[len("fuzz_"):] for p in FUZZ.glob("fuzz_*.c"))


def _makefile_list(name):
    """A ``NAME := $(addprefix ../csrc/core/, ...)`` list of fuzz/Makefile
    (paths under csrc/core/, such as image/jpeg.c), as paths from the root:
    the Makefile and this test build the same."""
    text = (FUZZ / "Makefile").read_text()
    match = re.search(rf"^{name}\s*:=\s*\$\(addprefix \.\./csrc/core/,(.*?)\)$", text,
                      re.M | re.S)
    files = match.group(1).replace("\\\n", " ").split()
    return [f"csrc/core/{f}" for f in files]


# The fuzz targets exercise the parsing half of the core; LIBS: what it links.
CORE = _makefile_list("CORE")
LIBS = re.search(r"^LIBS\s*:=(.*)$", (FUZZ / "Makefile").read_text(), re.M).group(1).split()

pytestmark = [
    pytest.mark.skipif(CC is None, reason="needs a C compiler"),
    # Standalone binaries with their own sanitizers, run without the preloaded
    # ones: the sanitizer run of scripts/test.sh would build and run the very
    # same ones again.
    pytest.mark.skipif(bool(os.environ.get("FASTLOAD_SANITIZER_RUN")),
                       reason="the same binaries as in the plain run"),
]


FLAGS = ["-std=c11", "-g", "-O1", "-Icsrc", "-Wall", "-Wextra", "-Werror",
         "-fsanitize=address,undefined", "-fno-sanitize-recover=undefined"]


def _compile(sources, outdir):
    """Each source compiled to an object of its own, side by side (one
    compiler per CPU): the objects, and the failed compilers' stderr."""
    jobs = [(src, outdir / (src.replace("/", "_")[:-2] + ".o")) for src in sources]

    def one(job):
        src, obj = job
        return subprocess.run([CC, *FLAGS, "-c", src, "-o", str(obj)], cwd=ROOT,
                              capture_output=True, text=True)

    with concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        results = list(pool.map(one, jobs))
    return [obj for _, obj in jobs], "".join(r.stderr for r in results if r.returncode)


@pytest.fixture(scope="module")
def shared_objects(tmp_path_factory):
    """The core and the replay driver, which every target links: compiled
    once for all targets."""
    return _compile([*CORE, "fuzz/replay.c"], tmp_path_factory.mktemp("fuzz_objects"))


@pytest.mark.parametrize("target", TARGETS)
def test_replay_corpus_and_crashes(tmp_path, target, shared_objects):
    exe = tmp_path / f"replay_{target}"
    objects, errors = shared_objects
    assert not errors, errors
    (target_object,), errors = _compile([f"fuzz/fuzz_{target}.c"], tmp_path)
    assert not errors, errors
    build = subprocess.run(
        [CC, *FLAGS, str(target_object), *map(str, objects), *LIBS, "-o", str(exe)],
        cwd=ROOT, capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    inputs = [str(FUZZ / "corpus" / target)]
    if (FUZZ / "crashes").is_dir():
        inputs.append(str(FUZZ / "crashes"))
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    result = subprocess.run([str(exe), *inputs], capture_output=True, text=True, timeout=600,
                            env=env)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    replayed = int(result.stdout.split()[1])
    assert replayed >= len(os.listdir(FUZZ / "corpus" / target)) > 0
