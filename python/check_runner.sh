#!/usr/bin/env bash
# Checks the pallas runner (src/backends/pallas/runtime/) end to end on
# python/testdata/add_example.py under TPU interpret mode: float32 and bfloat16 (uint16
# convention) at a ragged shape, --time, and the exit status 2 on errors. Needs the venv
# (scripts/setup_python.sh). Exit 0 if all pass, else 1.
# Environment: PYTHON=... overrides the interpreter (default <repo>/.venv/bin/python).
set -uo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-$REPO/.venv/bin/python}"
# The runner imports deuteron_runner.py, which the library writes beside it; here: PYTHONPATH.
RUNNER="$REPO/src/backends/pallas/runtime/deuteron_pallas_runner.py"
export PYTHONPATH="$REPO/src/backends/python/runtime${PYTHONPATH:+:$PYTHONPATH}"
MOD="$REPO/python/testdata/add_example.py"
if ! [ -x "$PY" ] && ! command -v "$PY" >/dev/null 2>&1; then
  echo "check_runner: $PY not found; run scripts/setup_python.sh first" >&2
  exit 1
fi
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
pass=0
fail=0
ok() { echo "ok   - $1"; pass=$((pass + 1)); }
bad() { echo "FAIL - $1"; fail=$((fail + 1)); }

# Inputs: ragged 130x300 float32, and the same as bfloat16 stored as uint16 bits.
"$PY" - "$TMP" <<'EOF' || { echo "check_runner: cannot make inputs" >&2; exit 1; }
import sys, numpy as np, ml_dtypes
d = sys.argv[1]
rng = np.random.default_rng(0)
x = rng.standard_normal((130, 300), dtype=np.float32)
y = rng.standard_normal((130, 300), dtype=np.float32)
np.save(f"{d}/x.npy", x); np.save(f"{d}/y.npy", y)
np.save(f"{d}/xb.npy", x.astype(ml_dtypes.bfloat16).view(np.uint16))
np.save(f"{d}/yb.npy", y.astype(ml_dtypes.bfloat16).view(np.uint16))
EOF

# 1. float32
if "$PY" "$RUNNER" "$MOD" --inputs "$TMP/x.npy" "$TMP/y.npy" --outputs "$TMP/o.npy" \
     >"$TMP/out1.json" 2>"$TMP/err1.txt" \
   && "$PY" - "$TMP" <<'EOF'
import sys, json, numpy as np
d = sys.argv[1]
rep = json.loads(open(f"{d}/out1.json").read())
assert rep["ok"] and rep["outputs"][0]["dtype"] == "float32", rep
o = np.load(f"{d}/o.npy"); ref = np.load(f"{d}/x.npy") + np.load(f"{d}/y.npy")
assert o.shape == (130, 300) and o.dtype == np.float32, (o.shape, o.dtype)
assert np.array_equal(o, ref), np.abs(o - ref).max()
EOF
then ok "float32 add 130x300 (grid 17x3, partial blocks) matches numpy"
else bad "float32 add"; cat "$TMP/err1.txt" >&2; fi

# 2. bfloat16 via uint16 storage + --dtypes; output comes back as uint16 bits.
if "$PY" "$RUNNER" "$MOD" --inputs "$TMP/xb.npy" "$TMP/yb.npy" --outputs "$TMP/ob.npy" \
     --dtypes bfloat16,bfloat16 >"$TMP/out2.json" 2>"$TMP/err2.txt" \
   && "$PY" - "$TMP" <<'EOF'
import sys, json, numpy as np, ml_dtypes
d = sys.argv[1]
rep = json.loads(open(f"{d}/out2.json").read())
assert rep["outputs"][0]["dtype"] == "bfloat16" and rep["outputs"][0]["stored"] == "uint16", rep
ob = np.load(f"{d}/ob.npy"); assert ob.dtype == np.uint16, ob.dtype
o = ob.view(ml_dtypes.bfloat16).astype(np.float32)
xb = np.load(f"{d}/xb.npy").view(ml_dtypes.bfloat16).astype(np.float32)
yb = np.load(f"{d}/yb.npy").view(ml_dtypes.bfloat16).astype(np.float32)
ref = (xb + yb).astype(ml_dtypes.bfloat16).astype(np.float32)
assert np.array_equal(o, ref), np.abs(o - ref).max()
EOF
then ok "bfloat16 add (uint16 .npy convention) matches numpy"
else bad "bfloat16 add"; cat "$TMP/err2.txt" >&2; fi

# 3. --time reports a median in ms as JSON.
if "$PY" "$RUNNER" "$MOD" --inputs "$TMP/x.npy" "$TMP/y.npy" --outputs "$TMP/o3.npy" --time 3 \
     >"$TMP/out3.json" 2>"$TMP/err3.txt" \
   && "$PY" -c 'import json,sys; r=json.load(open(sys.argv[1])); assert r["runs"]==3 and r["median_ms"]>0, r' "$TMP/out3.json"
then ok "--time 3 reports median_ms ($("$PY" -c 'import json,sys; print("%.1f" % json.load(sys.stdin)["median_ms"])' <"$TMP/out3.json") ms)"
else bad "--time"; cat "$TMP/err3.txt" >&2; fi

# 4. Errors exit with status 2 and a one-line message: wrong number of outputs, missing module,
#    shape mismatch inside jax.
expect2() {  # $1 = description, rest = runner arguments
  local what="$1"; shift
  "$PY" "$RUNNER" "$@" >/dev/null 2>"$TMP/err4.txt"
  local rc=$?
  if [ "$rc" = 2 ] && grep -q '^deuteron_pallas_runner: error: ' "$TMP/err4.txt"; then
    ok "$what -> exit 2 ($(grep '^deuteron_pallas_runner: error: ' "$TMP/err4.txt" | cut -c1-100))"
  else
    bad "$what -> exit $rc"; tail -5 "$TMP/err4.txt" >&2
  fi
}
expect2 "two outputs named for one result" "$MOD" --inputs "$TMP/x.npy" "$TMP/y.npy" --outputs "$TMP/a.npy" "$TMP/b.npy"
expect2 "missing module file" "$TMP/nope.py" --inputs "$TMP/x.npy" --outputs "$TMP/a.npy"
expect2 "bad --scalars JSON" "$MOD" --inputs "$TMP/x.npy" "$TMP/y.npy" --outputs "$TMP/a.npy" --scalars '{eps'
expect2 "one input missing" "$MOD" --inputs "$TMP/x.npy" --outputs "$TMP/a.npy"

echo "check_runner: $pass passed, $fail failed"
[ "$fail" = 0 ]
