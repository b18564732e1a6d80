"""Builds fastload._C from csrc/ (C11, pthreads, libjpeg-turbo).

FASTLOAD_SANITIZE=1 (or a list such as "address,undefined" or "thread")
builds with the sanitizers, debug info and warnings as errors; the tests then
run with the sanitizer runtime preloaded (see scripts/test.sh).
"""
import glob
import os

import numpy
from setuptools import Extension, setup


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
    libraries=["jpeg", "png", "webp", "webpdemux", "pthread", "dl"],
    define_macros=[("NPY_TARGET_VERSION", "NPY_1_24_API_VERSION")],
    extra_compile_args=["-std=c11", "-O3", "-Wall", "-Wextra", "-fvisibility=hidden"]
    + san_compile,
    extra_link_args=san_link,
)

setup(ext_modules=[extension])
