#!/usr/bin/env bash
# CI smoke test of the benchmark harness (bench/run_bench.py, and bench/model_validation.py on
# add at its small shape, with or without the venv): add and softmax at their small
# shapes, two runs per round, quiet and with one core busy, Deuteron on its default configs
# (--tune never), against PyTorch eager, torch.compile and jax.jit. Checks that the harness runs end to end, that every
# system's outputs agree and that the reports are written.
#
#   bash bench/smoke.sh            # from anywhere; DEUTERON=/path/to/deuteron overrides build/deuteron
#
# Skips the harness part (prints "bench smoke: SKIP ...", exit 0) when <repo>/.venv has no torch
# or jax; without matplotlib it runs with --no-plot. Exit 1 on any failure.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="$REPO/.venv/bin/python"
DEUTERON="${DEUTERON:-$REPO/build/deuteron}"

# The model's validation table (bench/model_validation.py, standard library only: no venv needed):
# add at its small shape, the default and one drawn config, one round.
[ -x "$DEUTERON" ] || { echo "bench smoke: FAIL: $DEUTERON is not built" >&2; exit 1; }
MV="$(mktemp -d "${TMPDIR:-/tmp}/deuteron-model-validation-smoke.XXXXXX")"
if ! timeout 300 python3 "$REPO/bench/model_validation.py" --kernels add --shapes small --tune never --rounds 1 \
     --others 1 --deuteron "$DEUTERON" --out "$MV" 2> "$MV/stderr.log" ||
   ! python3 - "$MV/model_validation.json" <<'PYEOF'
import json, math, sys
r = json.load(open(sys.argv[1]))
t = r["totals"]
ok = t["rows"] == 2 and all(math.isfinite(x["ratio"]) and x["ratio"] > 0 for x in r["rows"])
ok = ok and t["median_ratio"] > 0 and r["kernels"][0]["concordance"] is not None
sys.exit(0 if ok else 1)
PYEOF
then
  echo "bench smoke: FAIL: model_validation.py" >&2
  tail -20 "$MV/stderr.log" >&2
  cat "$MV/model_validation.md" >&2 2>/dev/null || true
  rm -rf "$MV"
  exit 1
fi
rm -rf "$MV"
echo "bench smoke: model validation ok"

# find_spec rather than import: fast, and a broken install then fails the smoke test.
if [ ! -x "$PY" ] || ! "$PY" -c 'import importlib.util as u, sys; sys.exit(any(u.find_spec(m) is None for m in ("torch", "jax")))' >/dev/null 2>&1; then
  echo "bench smoke: SKIP ($PY lacks torch or jax; run scripts/setup_python.sh --bench)"
  exit 0
fi
# Without matplotlib (the test venv: setup_python.sh --triton) the harness runs all the same,
# without its plot.
PLOT=(); PNG=bench_speedups.png
if ! "$PY" -c 'import importlib.util as u, sys; sys.exit(u.find_spec("matplotlib") is None)' >/dev/null 2>&1; then
  PLOT=(--no-plot); PNG=
fi
[ -x "$DEUTERON" ] || { echo "bench smoke: FAIL: $DEUTERON is not built" >&2; exit 1; }

OUT="$(mktemp -d "${TMPDIR:-/tmp}/deuteron-bench-smoke.XXXXXX")"
trap 'rm -rf "$OUT"' EXIT
start=$(date +%s)
if ! timeout 300 "$PY" "$REPO/bench/run_bench.py" --kernels add,softmax --shapes small --repeat 2 --tune never \
     "${PLOT[@]}" --deuteron "$DEUTERON" --json --out "$OUT" > "$OUT/stdout.json" 2> "$OUT/stderr.log"; then
  echo "bench smoke: FAIL: run_bench.py failed" >&2
  tail -30 "$OUT/stderr.log" >&2
  exit 1
fi
"$PY" - "$OUT" $PNG <<'PYEOF'
import json, statistics, sys
from pathlib import Path
out = Path(sys.argv[1])
r = json.loads((out / "stdout.json").read_text())
errors = []
for f in ["bench.md", "bench.csv", "bench.json"] + sys.argv[2:]:
    if not (out / f).is_file() or (out / f).stat().st_size == 0:
        errors.append(f"missing {f}")
for k in ("geomean_vs_eager", "geomean_vs_torch_compile", "geomean_vs_jax_jit", "busy_geomean_vs_eager",
          "busy_geomean_vs_best"):
    if not isinstance(r.get(k), float) or not r[k] > 0:
        errors.append(f"{k} = {r.get(k)!r}")
rows = {row["kernel"]: row for row in r["kernels"]}
if sorted(rows) != ["add", "softmax"]:
    errors.append(f"kernels {sorted(rows)}")
for name, row in rows.items():
    d = row["systems"]["deuteron"]
    if not d.get("correct") or not d.get("median_ms"):
        errors.append(f"{name}: deuteron correct={d.get('correct')} median_ms={d.get('median_ms')}")
    if not d.get("busy_median_ms") or not row["systems"]["deuteron"].get("roofline_fraction"):
        errors.append(f"{name}: deuteron busy_median_ms={d.get('busy_median_ms')} "
                      f"roofline_fraction={d.get('roofline_fraction')}")
    # A memory-bound row's roofline is the copy bandwidth probed beside its rounds.
    if not row.get("compute_bound"):
        probes, beside = row.get("copy_gbps_probes") or [], row.get("copy_gbps_beside") or 0
        if len(probes) != 2 or not beside > 0 or beside != max(probes):
            errors.append(f"{name}: copy probes {probes}, beside {beside}")
        elif d.get("median_ms"):
            want = row["bytes"] / (d["median_ms"] * 1e-3) / 1e9 / beside
            if abs(d["roofline_fraction"] - want) > 1e-6 * want:
                errors.append(f"{name}: roofline_fraction {d['roofline_fraction']} != {want} (bytes / time / beside)")
            if not (d.get("nt_roofline_fraction") or 0) > 0:
                errors.append(f"{name}: no share of the non-temporal copy ({row.get('copy_nt_gbps_after')})")
        # Rounds after the first pair their runs with copy passes (deuteron run --paired-copy).
        paired = d.get("paired_fractions") or []
        if len(paired) != 2 or not all(p > 0 for p in paired) or \
                d.get("paired_roofline_fraction") != statistics.median(paired):
            errors.append(f"{name}: paired fractions {paired}, median {d.get('paired_roofline_fraction')}")
    for s in ("torch_eager", "torch_compile", "jax_jit"):
        v = row["systems"].get(s) or {}
        if v.get("error") or not (v.get("check") or {}).get("ok") or not v.get("median_ms"):
            errors.append(f"{name}: {s}: {v}")
if errors:
    print("bench smoke: FAIL:\n  " + "\n  ".join(errors), file=sys.stderr)
    sys.exit(1)
PYEOF
echo "bench smoke: ok ($(( $(date +%s) - start )) s)"
