#!/usr/bin/env bash
# Every catalogue kernel on the triton target at its small (ragged) shape, under Triton's
# interpreter on the CPU: `deuteron run K --target triton --interpret --shapes small --json`
# must report "correct": true (checked against the kernel's double-precision reference), with
# the default config. (tests/test_triton.cpp runs each with small and large blocks, and bf16.)
# Usage: triton_catalogue.sh path/to/deuteron
set -uo pipefail
BIN="$1"
export DEUTERON_CACHE_DIR="${DEUTERON_CACHE_DIR:-$(mktemp -d)}"
fail=0 count=0
for kernel in $("$BIN" list --json | python3 -c 'import json, sys; print(" ".join(e["name"] for e in json.load(sys.stdin)))'); do
  count=$((count + 1))
  out=$("$BIN" run "$kernel" --target triton --interpret --shapes small --json 2>&1)
  if grep -q '"correct":true' <<<"$out"; then
    echo "ok   $kernel"
  else
    echo "FAIL $kernel: $(tail -5 <<<"$out")"
    fail=$((fail + 1))
  fi
done
echo "$((count - fail)) of $count kernels correct on the triton target (interpreter)"
[ "$count" -ge 19 ] && [ "$fail" -eq 0 ]
