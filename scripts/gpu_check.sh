#!/usr/bin/env bash
# The on-GPU check: builds fastload in place on a GPU machine that has
# PyTorch but no internet and no image-library headers, runs every test
# marked `gpu` and the GPU benchmarks (uploads, GPU decoding), and prints
# their tables.  About five minutes on 16 cores.
#
#   scripts/gpu_check.sh --pack     # here, with the internet: fills build/gpu-carry
#   scripts/gpu_check.sh            # there, in a copy of the tree with build/gpu-carry
#
# --pack downloads (apt-get download, pip download) the Debian packages of the
# image libraries' headers and runtimes and a setuptools wheel into
# $FASTLOAD_GPU_CARRY (default build/gpu-carry), to be carried to the GPU
# machine with the tree.  There the packages are unpacked into a private
# folder (dpkg -x: no root, nothing installed), the compiler and the loader
# are pointed at it, and libjpeg is linked by its full soname
# (:libjpeg.so.62, the headers' ABI) because such machines often have
# another libjpeg first on the library path.  Logs and the benchmarks'
# reports go to $OUT when it is set (else build/gpu-check).
set -euo pipefail
cd "$(dirname "$0")/.."
carry="${FASTLOAD_GPU_CARRY:-build/gpu-carry}"
python="${PYTHON:-python3}"

packages=(libjpeg62-turbo-dev libjpeg62-turbo libpng-dev libpng16-16 libwebp-dev libwebp7
          libwebpdemux2 libwebpmux3 liblmdb-dev liblmdb0
          zlib1g-dev)

if [ "${1:-}" = "--pack" ]; then
    mkdir -p "$carry"
    (cd "$carry" && apt-get download "${packages[@]}")
    "$python" -m pip download -q --no-deps -d "$carry" "setuptools>=77"
    ls "$carry"
    exit 0
fi

out="${OUT:-build/gpu-check}"
mkdir -p "$out"
root="$(mktemp -d /tmp/fastload-sysroot.XXXXXX)"
for deb in "$carry"/*.deb; do
    dpkg -x "$deb" "$root"
done
arch="$(gcc -dumpmachine)"
export C_INCLUDE_PATH="$root/usr/include:$root/usr/include/$arch${C_INCLUDE_PATH:+:$C_INCLUDE_PATH}"
export LIBRARY_PATH="$root/usr/lib/$arch${LIBRARY_PATH:+:$LIBRARY_PATH}"
export LD_LIBRARY_PATH="$root/usr/lib/$arch${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export FASTLOAD_JPEG_LIBRARY=":libjpeg.so.62"

if ! "$python" -c "import setuptools, sys; sys.exit(int(setuptools.__version__.split('.')[0]) < 77)"; then
    "$python" -m pip install -q --no-index --no-deps "$carry"/setuptools-*.whl
fi

echo "fastload: building in place"
started=$SECONDS
"$python" setup.py -q build_ext --inplace --build-temp build/gpu > "$out/build.log" 2>&1 \
    || { tail -n 40 "$out/build.log"; exit 1; }
echo "fastload: built in $((SECONDS - started)) s"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"

status=0
echo "fastload: the tests marked gpu"
# The files that hold them (the rest of the suite needs packages such a
# machine may lack, and runs in CI).
"$python" -m pytest tests/test_cuda_gpu.py tests/test_gpu_*.py -m gpu -q -p no:cacheprovider \
    --timeout=240 > "$out/gpu-tests.log" 2>&1 || status=$?
tail -n 15 "$out/gpu-tests.log"

echo "fastload: GPU benchmarks"
"$python" benchmarks/upload_bench.py --quick --workers 4 16 > "$out/upload_bench.md" \
    2> "$out/upload_bench.err" || status=$?
cat "$out/upload_bench.md"
"$python" benchmarks/gpu_decode_bench.py --workers 4 16 > "$out/gpu_decode_bench.md" \
    2> "$out/gpu_decode_bench.err" || status=$?
cat "$out/gpu_decode_bench.md"
exit "$status"
