#!/usr/bin/env bash
# Installs what is missing, then runs fastload and torch's DataLoader side by
# side on data it generates and prints samples/s.  Extra arguments go to the
# demo (see python benchmarks/demo.py --help).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bootstrap.sh
# torchvision runs the torch side of the image comparison.  A pip call of its
# own with --no-deps, so that it cannot replace the pinned torch; without it
# the demo uses a Pillow re-implementation and says so.
if ! python -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('torchvision') is None)"; then
    python -m pip install -q --no-deps "torchvision==0.28.0" \
        || echo "fastload: could not install torchvision; the demo's torch image row uses benchmarks/pil_pipeline.py"
fi
python benchmarks/demo.py "$@"
