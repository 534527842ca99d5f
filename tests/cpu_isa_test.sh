#!/usr/bin/env bash
# The generated code built for an AVX2-only CPU on this one (DEUTERON_CPU_ISA=avx2: the plans
# use 256-bit vectors, the compiler gets -mno-avx512f): catalogue kernels are correct at ragged
# shapes and at size 1, and their shared objects use no AVX-512 register.
# Usage: cpu_isa_test.sh path/to/deuteron
set -uo pipefail
BIN="$1"
export DEUTERON_CACHE_DIR="$(mktemp -d)"
export DEUTERON_AUTOTUNE_EFFORT=none  # default configs: the autotuner has its own tests
trap 'rm -rf "$DEUTERON_CACHE_DIR"' EXIT
source "$(dirname "${BASH_SOURCE[0]}")/checks.sh"
has() { grep -q -- "$2" <<<"$1"; }
# The shared object next to the generated source `deuteron run --json` names.
so_of() { sed -n 's/.*"source":"\([^"]*\)\.cpp".*/\1.so/p' <<<"$1"; }
no_zmm() { [ -f "$1" ] && ! objdump -d --no-show-raw-insn "$1" | grep -q '%zmm'; }

export DEUTERON_CPU_ISA=avx2
for run in "softmax --shapes small" "softmax --shape 1,1" "layer_norm --shapes small" "layer_norm --shape 1,1" \
           "matmul --shapes small" "matmul --shape 1,1,1" "matmul --shapes small --dtype bfloat16" \
           "cumsum --shapes small" "cumsum --shape 3,1"; do
  out=$("$BIN" run $run --json --repeat 2 2>&1)
  check "$run is correct with AVX2 only" has "$out" '"correct":true'
  check "$run: its shared object has no zmm register" no_zmm "$(so_of "$out")"
done
roof=$("$BIN" roofline 2>&1)
check "the roofline is measured with 256-bit vectors" has "$roof" "256-bit SIMD"

# A 32 KiB L1D (a Skylake-SP Xeon's) halves the products' K chunk to 256: K = 777 runs in three
# full chunks and a ragged one, on both ISAs.
for isa in avx2 native; do
  out=$(DEUTERON_CPU_ISA=$isa DEUTERON_L1D_BYTES=32K "$BIN" run matmul --shape 37,777,131 --json --repeat 2 2>&1)
  check "matmul 37x777x131 is correct with a 32 KiB L1D ($isa)" has "$out" '"correct":true'
done

# The control: on this machine's own ISA, a CPU with AVX-512 gets zmm code (else nothing to compare).
unset DEUTERON_CPU_ISA
native=$("$BIN" run matmul --shapes small --json --repeat 2 2>&1)
check "matmul is correct on the native ISA" has "$native" '"correct":true'
rows=$("$BIN" run softmax --shapes small --json --repeat 2 2>&1)
check "softmax is correct on the native ISA" has "$rows" '"correct":true'
if grep -q avx512f /proc/cpuinfo; then
  check "the native build of matmul uses zmm registers" bash -c "objdump -d '$(so_of "$native")' | grep -q '%zmm'"
  # Row loops are vectorised by GCC, whose Intel tunings default to 256-bit vectors.
  check "the native build of softmax vectorises its row loops in zmm registers" \
    bash -c "objdump -d '$(so_of "$rows")' | grep -q '%zmm'"
fi

bad=$(DEUTERON_CPU_ISA=avx9 "$BIN" run add --shapes small 2>&1)
check "an unknown DEUTERON_CPU_ISA is an error naming the legal values" has "$bad" "DEUTERON_CPU_ISA='avx9' is not native or avx2"
checks_done
