#!/usr/bin/env bash
# Every catalogue kernel on the pallas target, in each of its dtypes, at its small (ragged)
# shape, under TPU interpret mode: `deuteron run K --target pallas --shapes small --dtype D
# --json` must report "correct": true (checked against the kernel's double-precision reference).
# Usage: pallas_catalogue.sh path/to/deuteron
set -uo pipefail
BIN="$1"
export DEUTERON_CACHE_DIR="${DEUTERON_CACHE_DIR:-$(mktemp -d)}"
fail=0 count=0
while read -r kernel dtypes; do
  for dtype in ${dtypes//,/ }; do
    count=$((count + 1))
    out=$("$BIN" run "$kernel" --target pallas --shapes small --dtype "$dtype" --json 2>&1)
    if grep -q '"correct":true' <<<"$out"; then
      echo "ok   $kernel $dtype"
    else
      echo "FAIL $kernel $dtype: $(tail -5 <<<"$out")"
      fail=$((fail + 1))
    fi
  done
done < <("$BIN" list --json | python3 -c '
import json, sys
for e in json.load(sys.stdin):
    print(e["name"], ",".join(e["dtypes"]))')
echo "$((count - fail)) of $count kernel/dtype runs correct on the pallas target"
[ "$count" -ge 19 ] && [ "$fail" -eq 0 ]
