#!/usr/bin/env bash
# Installs what is missing, then runs the whole test suite twice: on the
# optimised build, and on an AddressSanitizer + UndefinedBehaviorSanitizer
# build with warnings as errors.  Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bootstrap.sh

export PYTHONDEVMODE=1
python -m pytest tests benchmarks -q -p no:cacheprovider --benchmark-disable "$@"

echo "fastload: sanitizer build (ASan + UBSan, -Werror)"
FASTLOAD_SANITIZE=address,undefined python setup.py -q build_ext --inplace --force \
    --build-temp build/sanitize
asan_rt="$(gcc -print-file-name=libasan.so)"
ubsan_rt="$(gcc -print-file-name=libubsan.so)"
status=0
# Python's allocator would hide heap errors from ASan; CPython and torch keep
# memory until exit, so leak reports are off (tests/test_workers.py bounds
# growth instead).  --capture=sys leaves file descriptor 2 alone, so a
# sanitizer report reaches the log even when it aborts the run.
LD_PRELOAD="$asan_rt:$ubsan_rt" PYTHONMALLOC=malloc \
    ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 \
    UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    python -m pytest tests -q -p no:cacheprovider --capture=sys -m "not slow" "$@" || status=$?

echo "fastload: restoring the optimised build"
python setup.py -q build_ext --inplace --force --build-temp build/release
exit $status
