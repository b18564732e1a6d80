"""Builds fastload._C from csrc/ (C11, pthreads, libjpeg-turbo).

The build links the system's libjpeg (libjpeg-turbo on current Linux
distributions) and stops with a message naming the package to install when
jpeglib.h is missing.  scripts/wheel.sh makes the binary wheel that carries
its own copy instead.

FASTLOAD_SANITIZE=1 (or a list such as "address,undefined" or "thread")
builds with the sanitizers, debug info and warnings as errors; the tests then
run with the sanitizer runtime preloaded (see scripts/test.sh).
"""
import glob
import os
import tempfile

import numpy
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import CompileError, SetupError

JPEG_HEADER_MISSING = """\
fastload needs libjpeg's development files (jpeglib.h) to build, and the
compiler cannot find them.  Install them and try again:

    Debian, Ubuntu:          sudo apt-get install libjpeg-dev
    Fedora, RHEL, CentOS:    sudo dnf install libjpeg-turbo-devel
    Alpine:                  apk add libjpeg-turbo-dev
    conda:                   conda install libjpeg-turbo

(a binary wheel, fastload-*-manylinux_*.whl, needs none of this: it carries
its own libjpeg-turbo)."""


class build_ext_checking_libjpeg(build_ext):
    """build_ext that first compiles `#include <jpeglib.h>` alone, so a missing
    header gives a message naming the package rather than a compiler error
    deep in csrc/core/jpeg.c."""

    def build_extensions(self):
        self.check_jpeg_header()
        super().build_extensions()

    def check_jpeg_header(self):
        with tempfile.TemporaryDirectory() as scratch:
            probe = os.path.join(scratch, "jpeg_probe.c")
            with open(probe, "w") as f:
                f.write("#include <stdio.h>\n#include <jpeglib.h>\nint main(void) { return 0; }\n")
            try:
                self.compiler.compile([probe], output_dir=scratch,
                                      include_dirs=extension.include_dirs)
            except CompileError:
                raise SetupError(JPEG_HEADER_MISSING) from None


def sanitizer_flags():
    wanted = os.environ.get("FASTLOAD_SANITIZE", "").strip()
    if not wanted or wanted == "0":
        return [], []
    kinds = "address,undefined" if wanted == "1" else wanted
    flags = [
        f"-fsanitize={kinds}",
        "-fno-sanitize-recover=undefined",
        "-fno-omit-frame-pointer",
        "-g",
        "-O1",
        "-Werror",
    ]
    return flags, [f"-fsanitize={kinds}"]


san_compile, san_link = sanitizer_flags()
sources = sorted(glob.glob("csrc/core/*.c")) + sorted(glob.glob("csrc/*.c"))

extension = Extension(
    "fastload._C",
    sources=sources,
    include_dirs=["csrc", numpy.get_include()],
    libraries=["jpeg", "pthread", "dl"],
    define_macros=[("NPY_TARGET_VERSION", "NPY_1_24_API_VERSION")],
    extra_compile_args=["-std=c11", "-O3", "-Wall", "-Wextra", "-fvisibility=hidden"]
    + san_compile,
    extra_link_args=san_link,
)

setup(ext_modules=[extension], cmdclass={"build_ext": build_ext_checking_libjpeg})
