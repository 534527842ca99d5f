#!/usr/bin/env bash
# The performance model's pictures and table for the docs (docs/TPU.md, "The model's choice by
# shape"), all predicted without a device:
#   docs/timelines/*.png    the first grid steps of the predicted pipeline: add, and flash
#                           attention under each strategy, on TPU v7x
#   stdout                  predicted TFLOP/s per strategy of flash attention (B=8, H=32,
#                           D=256, bf16, v7x) at S = 2048 ... 32768, and what tune --by-model picks
# Usage: scripts/model_pictures.sh [path/to/deuteron]   (default build/deuteron)
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="${1:-$REPO/build/deuteron}"
OUT="$REPO/docs/timelines"
mkdir -p "$OUT"
export DEUTERON_CACHE_DIR="$(mktemp -d)"  # tune --by-model writes here, not into the user's cache
trap 'rm -rf "$DEUTERON_CACHE_DIR"' EXIT

"$BIN" model add --target pallas --chip v7x --shape 4096,4096 --dtype bfloat16 --timeline "$OUT/add_v7x.png" --timeline-steps 4
for strategy in emit_pipeline unroll fori_loop; do
  "$BIN" model attention --target pallas --chip v7x --shape 8,32,4096,256 --dtype bfloat16 --strategy "$strategy" \
    --timeline "$OUT/attention_${strategy}_v7x.png"
done
"$BIN" model add --target cpu --shape 4096,4096 --timeline "$OUT/add_cpu.png" --timeline-steps 4

# field NAME JSON: a number, bool or string field (NAME may be dotted) of a one-line JSON object.
# python3 rather than jq: setup.sh installs no jq.
field() {
  python3 -c 'import json, sys
v = json.loads(sys.argv[2])
for k in sys.argv[1].split("."): v = v[k]
print(json.dumps(v) if isinstance(v, bool) else v)' "$1" "$2"
}
printf '\n| S | emit_pipeline TFLOP/s | unroll TFLOP/s | fori_loop TFLOP/s | tune --by-model picks |\n|---|---|---|---|---|\n'
for S in 2048 4096 8192 16384 32768; do
  row="| $S |"
  for strategy in emit_pipeline unroll fori_loop; do
    j=$("$BIN" model attention --target pallas --chip v7x --shape 8,32,$S,256 --dtype bfloat16 --strategy "$strategy" --json)
    if [ "$(field fits "$j")" = true ]; then
      row+=" $(printf '%.0f' "$(field tflops "$j")") ($(field bound "$j")) |"
    else
      row+=" does not fit |"
    fi
  done
  t=$("$BIN" tune attention --target pallas --chip v7x --shape 8,32,$S,256 --dtype bfloat16 --by-model --json)
  row+=" $(field 'best.inner_kv' "$t") ($(printf '%.0f' "$(field predicted_tflops "$t")") TFLOP/s) |"
  echo "$row"
done
