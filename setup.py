"""Builds fastload._C from csrc/ (C11, pthreads, libjpeg-turbo, libpng,
libwebp).

The build links the system's image libraries (libjpeg is libjpeg-turbo on
current Linux distributions) and stops with a message naming the packages to
install when a header is missing.  scripts/wheel.sh makes the binary wheel
that carries its own copies instead.

FASTLOAD_SANITIZE=1 (or a list such as "address,undefined" or "thread")
builds with the sanitizers, debug info and warnings as errors; the tests then
run with the sanitizer runtime preloaded (see scripts/test.sh).
"""
import concurrent.futures
import glob
import os
import tempfile

import numpy
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import CompileError, SetupError

# The image libraries, by the header the build needs and the package that
# has it: (header, library, Debian/Ubuntu, Fedora/RHEL, Alpine).
IMAGE_LIBRARIES = [
    ("jpeglib.h", "libjpeg-turbo", "libjpeg-dev", "libjpeg-turbo-devel", "libjpeg-turbo-dev"),
    ("png.h", "libpng", "libpng-dev", "libpng-devel", "libpng-dev"),
    ("webp/decode.h", "libwebp", "libwebp-dev", "libwebp-devel", "libwebp-dev"),
    ("lmdb.h", "liblmdb", "liblmdb-dev", "lmdb-devel", "lmdb-dev"),
]


def headers_missing_message(missing):
    names = ", ".join(header for header, *_ in missing)
    packages = [list(p) for p in zip(*(row[2:] for row in missing))]
    return (
        f"fastload needs the development files of {', '.join(r[1] for r in missing)} "
        f"({names}) to build, and the compiler cannot find them.  Install them and try "
        "again:\n\n"
        f"    Debian, Ubuntu:          sudo apt-get install {' '.join(packages[0])}\n"
        f"    Fedora, RHEL, CentOS:    sudo dnf install {' '.join(packages[1])}\n"
        f"    Alpine:                  apk add {' '.join(packages[2])}\n\n"
        "(a binary wheel, fastload_torch-*-manylinux_*.whl, needs none of this: it carries "
        "its own copies).")


def compile_side_by_side(compiler):
    """Makes ``compiler.compile`` run one compiler process per CPU: distutils
    compiles an extension's sources one after another (its --parallel runs
    extensions side by side, and there is one), and csrc/ has some 50 files.
    The steps are distutils' own (CCompiler.compile), only spread over
    threads; the first error is raised as it would be.  (Unix compilers
    only: MSVC's class replaces compile() itself.)"""
    if compiler.compiler_type != "unix":
        return

    def compile(sources, output_dir=None, macros=None, include_dirs=None, debug=False,
                extra_preargs=None, extra_postargs=None, depends=None):
        macros, objects, extra_postargs, pp_opts, build = compiler._setup_compile(
            output_dir, macros, include_dirs, sources, depends, extra_postargs)
        cc_args = compiler._get_cc_args(pp_opts, debug, extra_preargs)

        def one(obj):
            src, ext = build[obj]
            compiler._compile(obj, src, ext, cc_args, extra_postargs, pp_opts)

        # Objects not in `build` are up to date (distutils skips them too).
        with concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 1) as pool:
            for done in pool.map(one, [obj for obj in objects if obj in build]):
                pass
        return objects

    compiler.compile = compile


class build_ext_checking_libraries(build_ext):
    """build_ext that first compiles each image library's header alone, so a
    missing one gives a message naming the package rather than a compiler
    error deep in csrc/core/; then the sources, side by side."""

    def build_extensions(self):
        self.check_headers()
        compile_side_by_side(self.compiler)
        super().build_extensions()

    def check_headers(self):
        missing = []
        with tempfile.TemporaryDirectory() as scratch:
            for row in IMAGE_LIBRARIES:
                probe = os.path.join(scratch, row[0].replace("/", "_") + "_probe.c")
                with open(probe, "w") as f:
                    f.write(f"#include <stdio.h>\n#include <{row[0]}>\n"
                            "int main(void) { return 0; }\n")
                try:
                    self.compiler.compile([probe], output_dir=scratch,
                                          include_dirs=extension.include_dirs)
                except CompileError:
                    missing.append(row)
        if missing:
            raise SetupError(headers_missing_message(missing))


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
# Every .c under csrc/: the core (csrc/core/<domain>/) and the bindings
# (csrc/bind/); headers are included by their path from csrc/.
sources = sorted(glob.glob("csrc/**/*.c", recursive=True))

extension = Extension(
    "fastload._C",
    sources=sources,
    include_dirs=["csrc", numpy.get_include()],
    # FASTLOAD_JPEG_LIBRARY: libjpeg by another name (":libjpeg.so.62" where
    # another libjpeg comes first on the library path; scripts/gpu_check.sh).
    libraries=[os.environ.get("FASTLOAD_JPEG_LIBRARY", "jpeg"), "png", "webp", "webpdemux",
               "lmdb", "pthread", "dl"],
    define_macros=[("NPY_TARGET_VERSION", "NPY_1_24_API_VERSION")],
    extra_compile_args=["-std=c11", "-O3", "-Wall", "-Wextra", "-fvisibility=hidden"]
    + san_compile,
    extra_link_args=san_link,
)

setup(ext_modules=[extension], cmdclass={"build_ext": build_ext_checking_libraries})
