#!/usr/bin/env bash
# Every catalogue kernel on one target, in each of its dtypes, at its small (ragged) shape:
# `deuteron run K --target T --shapes small --dtype D --json [RUN ARGS]` must report
# "correct": true (checked against the kernel's double-precision reference), with the default
# config. CI runs it for pallas (TPU interpret mode) and triton (--interpret: Triton's
# interpreter); tests/test_pallas_loops.cpp and tests/test_triton.cpp add more configs.
# Usage: target_catalogue.sh path/to/deuteron TARGET [RUN ARGS...]
set -uo pipefail
BIN="$1"
TARGET="$2"
shift 2
export DEUTERON_CACHE_DIR="${DEUTERON_CACHE_DIR:-$(mktemp -d)}"
fail=0 count=0
while read -r kernel dtypes; do
  for dtype in ${dtypes//,/ }; do
    count=$((count + 1))
    out=$("$BIN" run "$kernel" --target "$TARGET" --shapes small --dtype "$dtype" --json "$@" 2>&1)
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
echo "$((count - fail)) of $count kernel/dtype runs correct on the $TARGET target"
[ "$count" -ge 19 ] && [ "$fail" -eq 0 ]
