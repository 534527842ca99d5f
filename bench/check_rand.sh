#!/usr/bin/env bash
# Checks that bench/deuteron_rand.py reproduces deuteron::Tensor::rand bit for bit (the benchmark
# relies on it to give PyTorch and JAX exactly Deuteron's inputs). Builds bench/rand_dump.cpp
# against build/libdeuteron.a. Usage: bash bench/check_rand.sh   (exit 0: all exact)
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="$REPO/.venv/bin/python"
TMP="$(mktemp -d)"; trap 'rm -rf "$TMP"' EXIT
g++ -std=c++20 -O2 -I"$REPO/include" "$REPO/bench/rand_dump.cpp" "$REPO/build/libdeuteron.a" \
    -lfmt -lxxhash -fopenmp -ldl -o "$TMP/rand_dump"
export REPO
status=0
for args in "1000003 1 -1 1 f32" "5000007 7 -4 4 f32" "77777 3 3.0 5.0 f32" "1000 12 0.5 1.5 f32" \
            "4100000 5 0 32000 i64" "9999 2 -3 17 i64"; do
  set -- $args
  "$TMP/rand_dump" "$1" "$2" "$3" "$4" "$5" "$TMP/c.bin"
  "$PY" - "$TMP/c.bin" "$@" <<'PYEOF' || status=1
import sys
import os
sys.path.insert(0, os.path.join(os.environ["REPO"], "bench"))
import numpy as np
import deuteron_rand as d
path, n, seed, lo, hi, dt = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5]), sys.argv[6]
a = d.rand([n], "float32" if dt == "f32" else "int64", seed, lo, hi)
b = np.fromfile(path, dtype=a.dtype)
same = a.shape == b.shape and np.array_equal(a.view(np.uint8), b.view(np.uint8))
print(f"rand n={n} seed={seed} [{lo}, {hi}) {dt}: {'exact' if same else 'MISMATCH'}")
sys.exit(0 if same else 1)
PYEOF
done
exit $status
