#!/usr/bin/env bash
# Installs what is missing, then runs fastload and torch's DataLoader side by
# side on data it generates and prints samples/s.  Extra arguments go to the
# demo (see python benchmarks/demo.py --help).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bootstrap.sh
python benchmarks/demo.py "$@"
