"""The extension's vectorised loops (csrc/core/image/simd.h): built for AVX2 as
well as the baseline, and nowhere a fused multiply-add, whose single
rounding would make the pipeline's bytes depend on the CPU."""

import platform
import re
import shutil
import subprocess

import pytest

import fastload._C

pytestmark = pytest.mark.skipif(
    platform.machine() != "x86_64" or shutil.which("objdump") is None,
    reason="x86-64 with objdump only")


@pytest.fixture(scope="module")
def disassembly():
    return subprocess.run(["objdump", "-d", "--no-show-raw-insn", fastload._C.__file__],
                          capture_output=True, text=True, check=True).stdout


def test_no_fused_multiply_add(disassembly):
    fused = re.findall(r"\bv?f(?:n?m(?:add|sub)\w*)\b", disassembly)
    assert not fused, f"fused multiply-adds in _C: {sorted(set(fused))[:8]}"


def test_hot_loops_have_an_avx2_copy(disassembly):
    if "GCC" not in platform.python_compiler() and not re.search(r"\.avx2>:", disassembly):
        pytest.skip("built by a compiler without target_clones")
    for name in ("bilinear_affine", "filter_row", "store_row", "fl_resample", "blend"):
        assert re.search(rf"<{name}\.avx2>:", disassembly), name
        assert re.search(rf"<{name}\.default>:", disassembly), name
