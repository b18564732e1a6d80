# Sourced by the other scripts: installs what is missing on a Debian/Ubuntu
# machine (system packages, a virtual environment in .venv, fastload and
# its test dependencies), then activates .venv.
set -euo pipefail

. scripts/system_packages.sh

if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
# shellcheck disable=SC1091
. .venv/bin/activate
export PIP_DISABLE_PIP_VERSION_CHECK=1
python -m pip install -q "setuptools>=77" wheel "numpy>=1.24"
# torch is pinned: an unpinned torch pulls several GB of CUDA packages.
python -m pip install -q --no-build-isolation -e ".[test]"
# The documentation site's builder (mkdocs.yml), pinned like the rest.
python -m pip install -q -r requirements-docs.txt
