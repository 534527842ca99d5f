#!/usr/bin/env bash
# Sets up everything (C++ and the Python venv for the Pallas target), builds, runs all tests.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$REPO/scripts/setup.sh" --python
# Tests compile kernels into their own cache, so a stale user cache cannot hide a failure.
export DEUTERON_CACHE_DIR="$REPO/build/test-cache"
rm -rf "$DEUTERON_CACHE_DIR"
# The benchmark harness on one tiny shape, when the bench venv is there (setup_python.sh --bench).
bash "$REPO/bench/smoke.sh"
cd "$REPO/build"
ctest --output-on-failure -j "$(nproc)" --timeout 900
