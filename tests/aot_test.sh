#!/usr/bin/env bash
# `deuteron aot`, end to end. Usage: aot_test.sh path/to/deuteron SOURCE_DIR CMAKE cpu|pallas|triton
#   cpu:    builds softmax, matmul, cross_entropy, layer_norm, rms_norm, rms_norm_bwd, cumsum,
#           attention, attention_causal and matmul_layernorm for
#           examples/aot/shapes.txt into a folder with a hostile name, builds examples/aot (the
#           consumer: references in plain double loops) against only what aot wrote, static and
#           shared, runs it on built and unbuilt shapes and bad calls; checks the library needs
#           nothing of Deuteron; which catalogue kernels get a general variant; and bad command lines.
#   pallas: the modules and dispatch table, run under JAX's TPU interpret mode against numpy, with
#           the general modules on shapes not built (size 1 included): softmax, layer_norm,
#           cumsum, matmul (emit_pipeline over K blocks) and cross_entropy (a gather); which
#           catalogue kernels get a general module.
#   triton: the same under Triton's interpreter (TRITON_INTERPRET=1): softmax, layer_norm, cumsum,
#           attention (pallas runs it too).
set -uo pipefail
BIN="$1"
SRC="$2"
CMAKE="$3"
MODE="$4"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
export DEUTERON_CACHE_DIR="$WORK/cache"
PY="${DEUTERON_VENV:-$SRC/.venv}/bin/python"
fail=0

ok() { echo "ok   $1"; }
bad() { echo "FAIL $1"; fail=1; }

# expect_error DESCRIPTION WANTED-TEXT COMMAND...: a non-zero exit and the text in its output,
# and no crash (signal exit codes are above 128).
expect_error() {
  local what="$1" want="$2"
  shift 2
  local out rc
  out=$("$@" 2>&1)
  rc=$?
  if [ "$rc" -ne 0 ] && [ "$rc" -lt 128 ] && grep -qF -- "$want" <<<"$out"; then
    ok "$what"
  else
    bad "$what: rc $rc, wanted '$want' in: $(tail -3 <<<"$out")"
  fi
}

if [ "$MODE" = cpu ]; then
  # The build goes into a folder with spaces and a '$' in its name; a second one, with quotes
  # too, must get the same files (CMake's own generators cannot build from such a folder).
  OUT="$WORK/out dir \$HOME"
  HOSTILE="$WORK/out 'dir' \"with\" quotes; \$(touch pwned)"
  # A tuned build of one shape reuses the cache when asked again.
  if "$BIN" aot softmax --shapes 64x257 --out "$WORK/tuned" --name tuned_once --effort quick --time-budget 3 \
       >"$WORK/tune1.log" 2>&1 &&
     "$BIN" aot softmax --shapes 64x257 --out "$WORK/tuned" --name tuned_once --effort quick --time-budget 3 \
       >"$WORK/tune2.log" 2>&1 &&
     grep -q "softmax \[64, 257\]: tuned config" "$WORK/tune1.log" &&
     grep -q "softmax \[64, 257\]: cache config" "$WORK/tune2.log"; then
    ok "aot tunes a shape, then takes its config from the cache"
  else
    bad "aot tuning and cache: $(tail -3 "$WORK/tune1.log") / $(tail -3 "$WORK/tune2.log")"
  fi

  KERNELS=softmax,matmul,cross_entropy,layer_norm,rms_norm,rms_norm_bwd,cumsum,attention,attention_causal,matmul_layernorm
  if "$BIN" aot $KERNELS --shapes "$SRC/examples/aot/shapes.txt" --out "$OUT" --effort none >"$WORK/aot.log" 2>&1; then
    ok "aot $KERNELS into a folder named $OUT"
  else
    bad "aot $KERNELS: $(tail -5 "$WORK/aot.log")"
  fi
  grep -q "softmax: 3 tuned variants, [1-3] general variants\? for other shapes" "$WORK/aot.log" &&
    grep -q "matmul: 3 tuned variants, [1-3] general variants\? for other shapes" "$WORK/aot.log" &&
    grep -q "cross_entropy: 1 tuned variant, 1 general variant for other shapes" "$WORK/aot.log" &&
    grep -q "layer_norm: 1 tuned variant, 1 general variant for other shapes" "$WORK/aot.log" &&
    grep -q "rms_norm: 1 tuned variant, 1 general variant for other shapes" "$WORK/aot.log" &&
    grep -q "rms_norm_bwd: 1 tuned variant, 1 general variant for other shapes" "$WORK/aot.log" &&
    grep -q "cumsum: 1 tuned variant, 1 general variant for other shapes" "$WORK/aot.log" &&
    grep -q "^attention: 1 tuned variant, 1 general variant for other shapes" "$WORK/aot.log" &&
    grep -q "attention_causal: 1 tuned variant, 1 general variant for other shapes" "$WORK/aot.log" &&
    grep -q "matmul_layernorm: 1 tuned variant, 1 general variant for other shapes" "$WORK/aot.log" \
    && ok "every kernel built has tuned and general variants" || bad "variants: $(cat "$WORK/aot.log")"
  # Every catalogue kernel at one small shape gets a general variant (emitting only; the
  # consumer runs the ones above).
  "$BIN" list --json >"$WORK/list.json" 2>/dev/null
  all=$(python3 -c 'import json, sys; print(",".join(e["name"] for e in json.load(open(sys.argv[1]))))' "$WORK/list.json")
  shapes=$(python3 -c 'import json, sys; print(";".join(e["name"] + ":" + "x".join(map(str, e["small_shape"])) for e in json.load(open(sys.argv[1]))))' "$WORK/list.json")
  if "$BIN" aot "$all" --shapes "$shapes" --out "$WORK/all" --effort none >"$WORK/all.log" 2>&1; then
    without=$(grep -o '^[a-z_0-9]*: [0-9]* tuned variants\?, no general variant' "$WORK/all.log" | cut -d: -f1 | sort | paste -sd, -)
    [ -z "$without" ] &&
      ok "every catalogue kernel gets a general variant" ||
      bad "kernels without a general variant: '$without' ($(grep 'no general' "$WORK/all.log" | head -5))"
  else
    bad "aot of every catalogue kernel: $(tail -5 "$WORK/all.log")"
  fi
  # Same inputs, same files.
  "$BIN" aot $KERNELS --shapes "$SRC/examples/aot/shapes.txt" --out "$HOSTILE" --effort none >/dev/null 2>&1
  if diff -r "$OUT" "$HOSTILE" >/dev/null && [ ! -e "$WORK/pwned" ] && [ ! -e pwned ]; then
    ok "a second build, into a folder with quotes, ';' and \$(...) in its name, writes byte-identical files"
  else
    bad "builds differ: $(diff -r "$OUT" "$HOSTILE" | head -5)"
  fi
  # The generated code includes only the standard library, OpenMP and the files aot wrote.
  includes=$(cat "$OUT"/src/*.cpp "$OUT"/src/*.h "$OUT"/include/*.h | grep -h '^#include' | sort -u)
  strays=$(grep -v -E '^#include (<[a-z_/.]+>|"(deuteron_cpu|deuteron_gemm|deuteron_kernels)\.h")( *//.*)?$' <<<"$includes")
  [ -z "$strays" ] && ok "sources include only std, OpenMP and what aot wrote" || bad "stray includes: $strays"

  for kind in static shared; do
    B="$WORK/build-$kind"
    shared=$([ $kind = shared ] && echo ON || echo OFF)
    if "$CMAKE" -S "$SRC/examples/aot" -B "$B" -DAOT_DIR="$OUT" -DDEUTERON_KERNELS_SHARED=$shared \
         -DCMAKE_BUILD_TYPE=Release >"$B.log" 2>&1 && "$CMAKE" --build "$B" -j2 >>"$B.log" 2>&1; then
      ok "examples/aot builds against the $kind library"
    else
      bad "examples/aot ($kind) does not build: $(tail -20 "$B.log")"
      continue
    fi
    if "$B/aot_consumer" >"$B.run" 2>&1; then ok "aot_consumer ($kind): $(tail -1 "$B.run")"; else bad "aot_consumer ($kind): $(grep FAIL "$B.run" | head -5; tail -2 "$B.run")"; fi
    if ldd "$B/aot_consumer" | grep -qi deuteron_kernels && [ $kind = static ]; then bad "static consumer loads a shared library"; fi
    ldd "$B/aot_consumer" | grep -i 'libdeuteron\b\|libdeuteron_[a-z]*\.so' | grep -v deuteron_kernels && bad "consumer loads a Deuteron library"
  done
  # What the library needs from outside: OpenMP, libm, libc, the C++ runtime; nothing of Deuteron.
  lib="$WORK/build-static/deuteron_kernels/libdeuteron_kernels.a"
  if [ -f "$lib" ]; then
    defined=$(nm --defined-only -P "$lib" 2>/dev/null | grep -v ':$' | awk 'NF>=2 {print $1}' | sort -u)
    needed=$(nm -u -P "$lib" 2>/dev/null | grep -v ':$' | awk '{print $1}' | sort -u | comm -23 - <(echo "$defined"))
    strays=$(grep -v -E '^(GOMP_|omp_|_ZNSt|_ZSt|_ZNKSt|_Znwm|_Znam|_ZdlPv|_ZdaPv|__cxa_thread_atexit|__cxa_|__gxx_|_Unwind_|__tls_get_addr|_GLOBAL_OFFSET_TABLE_|__stack_chk_fail|__dso_handle|_ZTV|_ZTI|_ZTS|__gcc_personality|__cxa)' <<<"$needed" |
             grep -v -E '^(exp|expf|log|logf|pow|powf|sqrt|sqrtf|tanh|tanhf|erf|erff|aligned_alloc|free|malloc|memcpy|memmove|memset|strlen|snprintf|vsnprintf|abort|strcmp|memcmp|sched_getcpu|sched_getaffinity|sched_setaffinity|sched_yield|clock_gettime|gettid|syscall)(@.*)?$')
    if [ -z "$strays" ] && ! grep -qi deuteron <<<"$needed"; then
      ok "libdeuteron_kernels.a needs only OpenMP, libm, libc and the C++ runtime ($(wc -l <<<"$needed") symbols)"
    else
      bad "libdeuteron_kernels.a needs: $strays $(grep -i deuteron <<<"$needed")"
    fi
  fi

  # A row shorter than any looped reduction block still generalises (its block is legal at the probes).
  "$BIN" aot softmax --shapes 8x16 --out "$WORK/short" --name short_rows --effort none >"$WORK/short.log" 2>&1
  grep -q "softmax: 1 tuned variant, 1 general variant for other shapes" "$WORK/short.log" &&
    ok "softmax built at 8x16 gets a general variant" || bad "softmax at 8x16: $(tail -3 "$WORK/short.log")"
  # --no-general: the built shape runs, another fails with _NO_VARIANT saying why and what to run.
  if "$BIN" aot softmax --shapes 8x16 --out "$WORK/exact" --name exact_only --effort none --no-general \
       >"$WORK/exact.log" 2>&1 && grep -q "softmax: 1 tuned variant, no general variant (built with --no-general" "$WORK/exact.log"; then
    cat >"$WORK/exact.cpp" <<'EOF'
#include <cmath>
#include <cstdio>
#include <cstring>
#include "exact_only.h"
int main() {
  float x[9 * 16], out[9 * 16];
  for (int i = 0; i < 9 * 16; ++i) x[i] = float(i % 16);
  if (exact_only_softmax(x, out, 8, 16) != EXACT_ONLY_OK) return std::printf("8x16: %s\n", exact_only_last_error()), 1;
  double sum = 0;  // a row of 0..15: its softmax sums to 1 and rises with x
  for (int j = 0; j < 16; ++j) sum += out[j];
  if (std::fabs(sum - 1) > 1e-5 || !(out[15] > out[14])) return std::printf("8x16: row sums to %g\n", sum), 1;
  int rc = exact_only_softmax(x, out, 9, 16);
  const char* why = exact_only_last_error();
  if (rc != EXACT_ONLY_NO_VARIANT || !std::strstr(why, "no variant for 9x16") || !std::strstr(why, "--no-general") ||
      !std::strstr(why, "build this shape with deuteron aot"))
    return std::printf("9x16: rc %d, '%s'\n", rc, why), 1;
  std::printf("%s\n", why);
  return 0;
}
EOF
    if g++ -std=c++20 -O1 -fopenmp -I"$WORK/exact/include" -I"$WORK/exact/src" "$WORK/exact.cpp" "$WORK"/exact/src/*.cpp \
         -o "$WORK/exact_consumer" >"$WORK/exact_build.log" 2>&1 && "$WORK/exact_consumer" >"$WORK/exact.run" 2>&1; then
      ok "--no-general: 8x16 runs, 9x16 fails with _NO_VARIANT: $(cat "$WORK/exact.run")"
    else
      bad "--no-general consumer: $(tail -5 "$WORK/exact_build.log") $(cat "$WORK/exact.run" 2>/dev/null)"
    fi
  else
    bad "aot --no-general: $(tail -3 "$WORK/exact.log")"
  fi

  # Bad command lines: clear errors, no crash, nothing written.
  expect_error "unknown kernel" "unknown kernel 'nosuch'" "$BIN" aot nosuch --shapes 4x4 --out "$WORK/x"
  expect_error "hostile kernel name" "unknown kernel" "$BIN" aot 'soft$(touch pwned);max' --shapes 4x4 --out "$WORK/x"
  [ ! -e pwned ] && [ ! -e "$WORK/pwned" ] && ok "a hostile kernel name runs nothing" || bad "a hostile name ran"
  expect_error "kernel given twice" "given twice" "$BIN" aot softmax,softmax --shapes 4x4 --out "$WORK/x"
  expect_error "shapes file that does not exist" "is no file and no list of shapes" "$BIN" aot softmax --shapes "$WORK/none.txt" --out "$WORK/x"
  expect_error "bad size in the list" "'ab' is not a positive integer" "$BIN" aot softmax --shapes '4xab' --out "$WORK/x"
  expect_error "size 0" "is not a positive integer" "$BIN" aot softmax --shapes '0x4' --out "$WORK/x"
  expect_error "wrong rank" "has 3 sizes; kernel 'softmax' takes 2" "$BIN" aot softmax --shapes 'softmax:4x4x4' --out "$WORK/x"
  expect_error "shape for a kernel not built" "not among those built" "$BIN" aot softmax --shapes 'matmul:4x4x4' --out "$WORK/x"
  expect_error "empty list" "no shape in --shapes fits kernel 'softmax'" "$BIN" aot softmax --shapes ' ; ' --out "$WORK/x"
  expect_error "no shape of a kernel's rank" "no shape in --shapes fits kernel 'matmul'" "$BIN" aot softmax,matmul --shapes '4x4' --out "$WORK/x"
  expect_error "dtype the kernel lacks" "does not run in int32" "$BIN" aot softmax --shapes 4x4 --dtype int32 --out "$WORK/x"
  touch "$WORK/a-file"
  expect_error "unwritable out dir" "cannot make the output folder" "$BIN" aot softmax --shapes 4x4 --out "$WORK/a-file/sub"
  expect_error "hostile library name" "is not a C identifier" "$BIN" aot softmax --shapes 4x4 --out "$WORK/x" --name 'x;rm -rf'
  [ ! -e "$WORK/x" ] && ok "nothing written by a failed command" || bad "a failed command wrote $WORK/x"
  exit $fail
fi

# Python targets: modules and a dispatch table, run in the target's interpreter.
TARGET="$MODE"
export TRITON_INTERPRET=1 JAX_PLATFORMS=cpu
# attention: its head dim is one block of the call's size in a general module.
KERNELS=softmax,layer_norm,cumsum,attention
SHAPES='softmax:130x1000;softmax:1x128;layer_norm:64x257;cumsum:64x257;attention:1x2x32x16'
if [ "$TARGET" = pallas ]; then
  # matmul: K = 600 loops in blocks of 512 (emit_pipeline), M and N in blocks of 32 and 128.
  # cross_entropy: a one-hot gather along the whole vocabulary, int64 labels passed as int32.
  KERNELS="$KERNELS,matmul,cross_entropy"
  SHAPES="$SHAPES;matmul:64x600x160;cross_entropy:64x300"
fi
if "$BIN" aot "$KERNELS" --target "$TARGET" --shapes "$SHAPES" \
     --out "$WORK/py" --name py_kernels --effort none >"$WORK/aot.log" 2>&1; then
  ok "aot $KERNELS --target $TARGET"
else
  bad "aot --target $TARGET: $(tail -5 "$WORK/aot.log")"
  exit 1
fi
[ -f "$WORK/py/py_kernels.py" ] && [ -f "$WORK/py/modules/softmax_130x1000.py" ] && ok "writes the table and a module per shape" || bad "files: $(ls -R "$WORK/py")"
[ -f "$WORK/py/modules/softmax_general0.py" ] && [ -f "$WORK/py/modules/layer_norm_general0.py" ] &&
  grep -q "softmax: 2 tuned variants, [12] general variants\? for other shapes" "$WORK/aot.log" &&
  grep -q "layer_norm: 1 tuned variant, 1 general variant for other shapes" "$WORK/aot.log" &&
  grep -q "cumsum: 1 tuned variant, 1 general variant for other shapes" "$WORK/aot.log" &&
  ok "writes general modules for softmax, layer_norm and cumsum" || bad "no general modules: $(cat "$WORK/aot.log")"
if [ "$TARGET" = pallas ]; then
  grep -q "matmul: 1 tuned variant, 1 general variant for other shapes" "$WORK/aot.log" &&
    ok "writes a general module for matmul" || bad "no general module for matmul: $(cat "$WORK/aot.log")"
  # Same inputs, same files.
  "$BIN" aot "$KERNELS" --target "$TARGET" --shapes "$SHAPES" --out "$WORK/py2" --name py_kernels --effort none >/dev/null 2>&1
  diff -r "$WORK/py" "$WORK/py2" >/dev/null && ok "a second build writes byte-identical modules" ||
    bad "builds differ: $(diff -r "$WORK/py" "$WORK/py2" | head -5)"
  # Every catalogue kernel at one small shape, emitted (not run): every one gets a general
  # module (attention's scale is a device value of the head dim, so its code does not follow it).
  "$BIN" list --json >"$WORK/list.json" 2>/dev/null
  all=$(python3 -c 'import json, sys; print(",".join(e["name"] for e in json.load(open(sys.argv[1])) if "pallas" in e.get("targets", ["pallas"])))' "$WORK/list.json")
  shapes=$(python3 -c 'import json, sys; print(";".join(e["name"] + ":" + "x".join(map(str, e["small_shape"])) for e in json.load(open(sys.argv[1]))))' "$WORK/list.json")
  if "$BIN" aot "$all" --target pallas --shapes "$shapes" --out "$WORK/all" --name all_kernels --effort none >"$WORK/all.log" 2>&1; then
    without=$(grep -o '^[a-z_0-9]*: [0-9]* tuned variants\?, no general variant' "$WORK/all.log" | cut -d: -f1 | sort | paste -sd, -)
    [ -z "$without" ] && ok "every catalogue kernel gets a general module" ||
      bad "kernels without a general module: '$without' ($(grep 'no general' "$WORK/all.log" | head -5))"
    if "$PY" - "$WORK/all" <<'PYEOF'; then ok "the dispatch table picks attention's general module for an unbuilt shape"; else bad "attention's dispatch"; fi
import sys
sys.path.insert(0, sys.argv[1])
import all_kernels
for kernel in ("attention", "attention_causal"):
    name, general = all_kernels.variant(kernel, (1, 2, 37, 40))
    assert general and "general" in name, (kernel, name)
PYEOF
  else
    bad "aot of every catalogue kernel: $(tail -5 "$WORK/all.log")"
  fi
fi
# --no-general: a shape not built raises LookupError, saying why and what to run.
if "$BIN" aot softmax --target "$TARGET" --shapes 8x16 --out "$WORK/py_exact" --name exact_only --effort none \
     --no-general >"$WORK/exact.log" 2>&1 &&
   "$PY" - "$WORK/py_exact" "$TARGET" >"$WORK/exact.run" 2>&1 <<'PYEOF'; then
import sys
sys.path.insert(0, sys.argv[1])
import exact_only
assert exact_only.variant("softmax", (8, 16)) == ("softmax_8x16", False), exact_only.variant("softmax", (8, 16))
try:
    exact_only.variant("softmax", (9, 16))
except LookupError as e:
    text = str(e)
    assert "no module for 9x16 and no general one (built with --no-general" in text, text
    assert f"deuteron aot softmax --target {sys.argv[2]} --shapes 9x16" in text, text
    print(text)
else:
    raise AssertionError("9x16 found a module")
PYEOF
  ok "--no-general: 9x16 raises LookupError: $(tail -1 "$WORK/exact.run")"
else
  bad "--no-general ($TARGET): $(tail -3 "$WORK/exact.log") $(tail -5 "$WORK/exact.run" 2>/dev/null)"
fi
if ( cd "$WORK" && "$PY" - "$WORK/py" "$TARGET" "$SRC" ) <<'PYEOF'; then ok "$TARGET modules run through the dispatch table and match the reference"; else bad "$TARGET dispatch"; fi
import sys
import numpy as np
sys.path.insert(0, sys.argv[1])
import py_kernels

target = sys.argv[2]
if target == "pallas":
    # emit_pipeline asks pltpu.get_tpu_info(), which a CPU host cannot answer: the runner's shim
    # answers for a v5e (on a TPU nothing is needed).
    sys.path[:0] = [f"{sys.argv[3]}/src/backends/pallas/runtime", f"{sys.argv[3]}/src/backends/python/runtime"]
    import deuteron_pallas_runner
    deuteron_pallas_runner.install_cpu_tpu_info("v5e")


def softmax_reference(x):
    x = x.astype(np.float64)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def layer_norm_reference(x, w, b, eps):
    x = x.astype(np.float64)
    mean = x.mean(axis=1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * w + b


def attention_reference(q, k, v):
    q, k, v = (a.astype(np.float64) for a in (q, k, v))
    s = q @ np.swapaxes(k, 2, 3) / np.sqrt(q.shape[3])
    p = np.exp(s - s.max(axis=3, keepdims=True))
    return (p / p.sum(axis=3, keepdims=True)) @ v


def matmul_reference(x, y):
    return x.astype(np.float64) @ y.astype(np.float64)


def cross_entropy_reference(logits, labels, ignore_index):
    x = logits.astype(np.float64)
    top = x.max(axis=1)
    loss = np.log(np.exp(x - top[:, None]).sum(axis=1)) + top - x[np.arange(len(x)), np.clip(labels, 0, None)]
    return np.array([loss[labels != ignore_index].mean()])


def call(kernel, *arrays, **options):
    if target == "triton":
        import torch
        out = py_kernels.run(kernel, *[torch.from_numpy(a) for a in arrays], **options)
        return out.numpy()
    return np.asarray(py_kernels.run(kernel, *arrays, **options))


rng = np.random.default_rng(1)
# Built shapes run their tuned module, the others (ragged, size 1) the general module of the
# built shape nearest them.
built = {"softmax": [(130, 1000), (1, 128)], "layer_norm": [(64, 257)], "cumsum": [(64, 257)],
         "attention": [(1, 2, 32, 16)]}
unbuilt = {"softmax": [(7, 3), (1, 1), (3, 300), (20, 2000)], "layer_norm": [(1, 1), (5, 77)],
           "cumsum": [(1, 1), (7, 3), (3, 2000)], "attention": [(1, 1, 1, 1), (2, 1, 37, 40)]}
if target == "pallas":
    # M, K, N: one K block and several, N inside one block and across two, size 1.
    built["matmul"] = [(64, 600, 160)]
    unbuilt["matmul"] = [(1, 1, 1), (9, 300, 5), (70, 7, 200), (3, 520, 130)]
    built["cross_entropy"] = [(64, 300)]
    unbuilt["cross_entropy"] = [(1, 1), (9, 300), (130, 7)]
for kernel in built:
    for shape in built[kernel] + unbuilt[kernel]:
        name, general = py_kernels.variant(kernel, shape)
        assert general == (shape not in built[kernel]), (kernel, shape, name)
        x = rng.uniform(-1, 3, shape[:2]).astype(np.float32)
        tol = 2e-5
        if kernel == "attention":  # q, k, v [B, H, S, D]
            q, k, v = (rng.uniform(-1, 1, shape).astype(np.float32) for _ in range(3))
            y, want = call(kernel, q, k, v), attention_reference(q, k, v)
        elif kernel == "softmax":
            y, want = call(kernel, x), softmax_reference(x)
        elif kernel == "cumsum":
            # f32 sums of up to n terms in a tree (pallas, triton): a few ulps of the prefix's size
            y, want = call(kernel, x), np.cumsum(x.astype(np.float64), axis=1)
            tol = 4e-6 * np.cumsum(np.abs(x.astype(np.float64)), axis=1) + 1e-7
        elif kernel == "matmul":  # f32 products summed over K
            w = rng.uniform(-1, 1, shape[1:]).astype(np.float32)
            y, want = call(kernel, x, w), matmul_reference(x, w)
            tol = 1e-4 * shape[1]
        elif kernel == "cross_entropy":  # every 7th row ignored (none of a single row)
            labels = rng.integers(0, shape[1], shape[0]).astype(np.int32)
            labels[1::7] = -100
            y, want = call(kernel, x, labels, ignore_index=-100), cross_entropy_reference(x, labels, -100)
        else:
            w = rng.uniform(0.5, 1.5, shape[1]).astype(np.float32)
            b = rng.uniform(-1, 1, shape[1]).astype(np.float32)
            y, want = call(kernel, x, w, b, eps=1e-5), layer_norm_reference(x, w, b, 1e-5)
        err = np.abs(y - want).max()
        print(f"{kernel} {shape} ({name}): max abs error {err:.3g}")
        assert y.shape == want.shape and np.all(np.abs(y - want) < tol), (kernel, shape, err)
# A general module checks its inputs against each other and the table's sizes.
if target == "pallas":
    general = py_kernels._load(py_kernels.variant("matmul", (5, 6, 7))[0])
    try:
        general.run(np.zeros((5, 6), np.float32), np.zeros((7, 7), np.float32))
        raise SystemExit("mismatched inputs did not raise")
    except ValueError as e:
        print("mismatched inputs:", e)
    try:
        general.run(np.zeros((5, 6), np.float32), np.zeros((6, 7), np.float32), sizes=py_kernels.sizes_of("matmul", (5, 6, 8)))
        raise SystemExit("mismatched sizes did not raise")
    except ValueError as e:
        print("mismatched sizes:", e)
try:
    py_kernels.variant("softmax", (0, 3))
    raise SystemExit("a size of 0 did not raise")
except ValueError as e:
    print("size 0:", e)
PYEOF
exit $fail
