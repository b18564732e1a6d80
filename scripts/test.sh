#!/usr/bin/env bash
# Installs what is missing, then runs the whole test suite twice: on the
# optimised build, and on an AddressSanitizer + UndefinedBehaviorSanitizer
# build with warnings as errors; then each fuzz target briefly
# (FUZZ_SECONDS, default 30).  Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
FASTLOAD_EXTRA_PACKAGES="clang"  # libFuzzer
. scripts/bootstrap.sh

export PYTHONDEVMODE=1
# A hang fails the run within 25 minutes, with every thread's stack printed
# (faulthandler_timeout in pyproject.toml), rather than stalling it.
limit="timeout --signal=ABRT --kill-after=60 1500"
$limit python -m pytest tests benchmarks -q -p no:cacheprovider --benchmark-disable "$@"

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
# FASTLOAD_SANITIZER_RUN skips tests that fork torch worker processes
# (tests/conftest.py says why).
FASTLOAD_SANITIZER_RUN=1 LD_PRELOAD="$asan_rt:$ubsan_rt" PYTHONMALLOC=malloc \
    ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 \
    UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    $limit python -m pytest tests -q -p no:cacheprovider --capture=sys -m "not slow" "$@" \
    || status=$?

echo "fastload: restoring the optimised build"
python setup.py -q build_ext --inplace --force --build-temp build/release
[ $status -eq 0 ] || exit $status

echo "fastload: fuzzing each target for ${FUZZ_SECONDS:-30} s (libFuzzer, ASan + UBSan)"
mkdir -p build
if ! make -s -C fuzz fuzz FUZZ_SECONDS="${FUZZ_SECONDS:-30}" > build/fuzz.log 2>&1; then
    tail -n 60 build/fuzz.log
    echo "fastload: the fuzzer failed or found a crash (the input is in fuzz/crashes)"
    exit 1
fi
grep -E "^(Done|stat::number_of_executed_units|stat::new_units_added)" build/fuzz.log
