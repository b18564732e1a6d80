# Sourced by the other scripts: installs the system packages that building
# fastload needs and that are missing on a Debian/Ubuntu machine (a compiler,
# Python's headers and venv, make, the image libraries), plus
# $FASTLOAD_EXTRA_PACKAGES.
need_apt=()
command -v gcc >/dev/null 2>&1 || need_apt+=(build-essential)
python3 - <<'PY' >/dev/null 2>&1 || need_apt+=(python3-dev)
import os, sysconfig
assert os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h"))
PY
python3 -c "import ensurepip, venv" >/dev/null 2>&1 || need_apt+=(python3-venv)
command -v make >/dev/null 2>&1 || need_apt+=(make)
# libjpeg-dev: jpeglib.h and libjpeg, which is libjpeg-turbo on Debian and Ubuntu;
# libpng-dev and libwebp-dev (libwebp and libwebpdemux): the PNG and WebP decoders.
# liblmdb-dev: the LMDB reader of LMDBDataset.
# libsquashfs-dev: SquashFS images read without mounting (optional to a source
# build: setup.py leaves it out when missing); squashfs-tools: mksquashfs, which
# the tests make their images with.
# FASTLOAD_EXTRA_PACKAGES: what a caller needs beyond the build (the tests: clang).
for pkg in libjpeg-dev libpng-dev libwebp-dev liblmdb-dev libsquashfs-dev squashfs-tools \
        ${FASTLOAD_EXTRA_PACKAGES:-}; do
    dpkg -s "$pkg" >/dev/null 2>&1 || need_apt+=("$pkg")
done
if [ ${#need_apt[@]} -gt 0 ]; then
    echo "fastload: installing system packages: ${need_apt[*]}"
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi
