"""gpu_decode_bench.py on a machine without a GPU: it says why and exits
cleanly (the numbers come from running it on a GPU, scripts/gpu_check.sh)."""

import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def test_without_a_gpu_it_says_why():
    env = dict(os.environ, FASTLOAD_LIBCUDA="no-such-libcuda.so")
    result = subprocess.run([sys.executable, os.path.join(HERE, "gpu_decode_bench.py"),
                             "--quick"], capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("gpu_decode_bench: skipped: "), result.stdout
