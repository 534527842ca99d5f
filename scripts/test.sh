#!/usr/bin/env bash
# Sets up everything (C++ and the Python venv for the Pallas target), builds, runs all tests.
#
#   scripts/test.sh              into build/
#   scripts/test.sh --sanitize   into build/sanitize/, with AddressSanitizer and UBSan
#                                (-DDEUTERON_SANITIZE=ON): any report fails its test
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SANITIZE=0
for arg in "$@"; do
  case "$arg" in
    --sanitize) SANITIZE=1 ;;
    *) printf 'test.sh: unknown argument %s (use --sanitize)\n' "$arg" >&2; exit 1 ;;
  esac
done
bash "$REPO/scripts/setup.sh" --python
BUILD="$REPO/build"
if [ "$SANITIZE" -eq 1 ]; then
  BUILD="$REPO/build/sanitize"
  cmake -S "$REPO" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDEUTERON_SANITIZE=ON >/dev/null
  cmake --build "$BUILD" -j "$(nproc)"
  export ASAN_OPTIONS="abort_on_error=0:halt_on_error=1:detect_leaks=1"
  export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
fi
# Tests compile kernels into their own cache, so a stale user cache cannot hide a failure.
export DEUTERON_CACHE_DIR="$BUILD/test-cache"
rm -rf "$DEUTERON_CACHE_DIR"
# The benchmark harness on one tiny shape (bench/smoke.sh: the model validation always, the
# framework comparison when the venv has torch and jax).
[ "$SANITIZE" -eq 1 ] || bash "$REPO/bench/smoke.sh"
cd "$BUILD"
ctest --output-on-failure -j "$(nproc)" --timeout 900
