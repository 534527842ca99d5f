#!/usr/bin/env bash
# The CLI end to end, in a fresh cache: run, the compile cache across processes, emit, errors.
# Usage: cli_test.sh path/to/deuteron
set -uo pipefail
BIN="$1"
export DEUTERON_CACHE_DIR="$(mktemp -d)"
# Runs here use the default config; the autotuner has its own tests.
export DEUTERON_AUTOTUNE_EFFORT=none
trap 'rm -rf "$DEUTERON_CACHE_DIR"' EXIT
source "$(dirname "${BASH_SOURCE[0]}")/checks.sh"
has() { grep -q -- "$2" <<<"$1"; }

first=$("$BIN" run add --shapes small --json --repeat 3)
second=$("$BIN" run add --shapes small --json --repeat 3)
check "first run is correct" has "$first" '"correct":true'
check "first run compiles" has "$first" '"compiled":true'
check "second run in a new process does not compile" has "$second" '"compiled":false'
check "run --json has every field" bash -c "for f in kernel target shape dtype config correct max_abs_err median_ms times_ms runs compiled tuned roofline_fraction roofline; do grep -q \"\\\"\$f\\\"\" <<<'$first' || exit 1; done"

unchecked=$("$BIN" run add --shapes small --json --repeat 2 --no-check)
check "run --no-check skips the reference" has "$unchecked" '"correct":null'
check "run --no-check still times" bash -c "grep -q '\"median_ms\":[0-9]' <<<'$unchecked'"
check "run --json lists each timed run" bash -c "grep -Eq '\"runs\":2[,}]' <<<'$unchecked' && grep -Eq '\"times_ms\":\[[0-9.e+-]+,[0-9.e+-]+\]' <<<'$unchecked'"

# Each paired run is followed by a copy pass; the fraction is the median over the pairs of the
# run's bytes per second (the kernel's bytes: gbps x median_ms) over its pass's GB/s.
paired=$("$BIN" run add --shapes small --json --repeat 2 --no-check --paired-copy 3)
check "run --paired-copy pairs each run with a copy pass" python3 -c "
import json, statistics, sys
j = json.loads(sys.argv[1]); p = j['paired_copy']
assert p['pairs'] == 3 and len(p['times_ms']) == 3 and len(p['copy_gbps_each']) == 3, p
assert all(0.05 < g < 1e4 for g in p['copy_gbps_each']) and p['seconds'] > 0, p
nbytes = j['gbps'] * j['median_ms'] * 1e6
want = statistics.median(nbytes / (t * 1e-3) / 1e9 / g for t, g in zip(p['times_ms'], p['copy_gbps_each']))
assert abs(p['fraction'] - want) <= 1e-6 * want, (p['fraction'], want)
" "$paired"
check "run --paired-copy is refused where the target has no copy" bash -c \
  "'$BIN' run add --shapes small --target triton --paired-copy 2 2>&1 | grep -q 'has no copy to pair runs with'"

softmax=$("$BIN" run softmax --shape 257,1000 --dtype bfloat16 --json --repeat 3)
check "softmax bf16 at a ragged shape is correct" has "$softmax" '"correct":true'

# The roofline measured by the runs above is cached; one that all cores did not clearly win
# (other processes were busy) is measured again once it is an hour old.
roof_file=$(ls "$DEUTERON_CACHE_DIR"/roofline-*.json)
check "the roofline is cached" test -f "$roof_file"
sed -i -e 's/"peak_gflops": [0-9.e+]*/"peak_gflops": 123.0/' -e 's/"peak_gflops_1core": [0-9.e+]*/"peak_gflops_1core": 97.0/' \
    -e 's/"measured_at": [0-9.e+]*/"measured_at": 0.0/' "$roof_file"
roof=$("$BIN" roofline --json 2>/dev/null)
check "a disturbed, old roofline is measured again" bash -c "! grep -q '\"peak_gflops\":123.0' <<<'$roof'"
check "the new measurement is cached" bash -c "! grep -q '\"measured_at\": 0.0' '$roof_file'"

ir=$("$BIN" emit softmax --shapes small --ir)
check "emit --ir prints the IR" has "$ir" "kernel softmax"
plan=$("$BIN" emit softmax --shapes small --plan)
check "emit --plan prints the plan" has "$plan" "block specs"
src=$("$BIN" emit softmax --shapes small)
check "emit prints C++ named after the kernel" has "$src" "deuteron_softmax"
check "emit is byte-identical across runs" test "$src" == "$("$BIN" emit softmax --shapes small)"
# Printing never tunes, whatever the effort: it says which config it used.
untuned=$(env -u DEUTERON_AUTOTUNE_EFFORT timeout 60 "$BIN" emit rms_norm --shape 300,700 --plan 2>&1)
check "emit --plan does not tune and says so" has "$untuned" "default config (not tuned"
check "emit --plan shows the cpu target's decisions" has "$untuned" "bytes of scratch per thread"
origin=$(env -u DEUTERON_AUTOTUNE_EFFORT timeout 60 "$BIN" emit rms_norm --shape 300,700 --json)
check "emit --json names the config's origin" has "$origin" '"config_origin":"default"'
check "a default-config emit leaves no tuned entry" test -z "$(ls "$DEUTERON_CACHE_DIR"/autotune/*rms_norm* 2>/dev/null)"

err=$("$BIN" run no_such_kernel 2>&1); code=$?
check "unknown kernel exits non-zero" test "$code" -ne 0
check "unknown kernel lists the catalogue" has "$err" "known kernels"
# Each target says which kernels it can express, and names the construct where it cannot.
list=$("$BIN" list --json)
check "add runs on every target" bash -c "grep -q '\"name\":\"add\",\"not_on\":{},\"small_shape\":\[[0-9,]*\],\"summary\":\"[^\"]*\",\"targets\":\[\"cpu\",\"pallas\",\"triton\"\]' <<<'$list'"
check "every catalogue kernel runs on every target" bash -c "! grep -q '\"not_on\":{\"' <<<'$list'"
err=$("$BIN" run softmax --shape 10,x 2>&1); code=$?
check "bad shape exits non-zero with a message" bash -c "test $code -ne 0 && grep -q 'bad shape' <<<'$err'"
err=$("$BIN" run softmax --shapes small --config '{"block_rows": ' 2>&1); code=$?
check "bad JSON exits non-zero with a message" bash -c "test $code -ne 0 && grep -q 'not valid JSON' <<<'$err'"
err=$("$BIN" run softmax --shapes small --config '{"block_rows": 3}' 2>&1); code=$?
check "illegal block size names the legal values" bash -c "test $code -ne 0 && grep -q 'legal values' <<<'$err'"

# Tuning: a tuned kernel's next run in a new process neither tunes nor compiles.
tune=$("$BIN" tune softmax --shapes small --max-candidates 6 --time-budget 60 --progress quiet 2>&1)
check "tune prints the best config" has "$tune" "block_rows"
after=$(DEUTERON_AUTOTUNE_EFFORT=quick "$BIN" run softmax --shapes small --json --repeat 3)
check "a tuned kernel runs from the cache" has "$after" '"config_origin":"cache"'
check "a tuned kernel's run does not tune" has "$after" '"tuned":false'
check "a tuned kernel's run does not compile" has "$after" '"compiled":false'
# The quick effort ranks by the model and times the default and the model's top configs.
tune=$("$BIN" tune add --shapes small --max-candidates 2 --retune --json 2>&1)
# The JSON holds free text (the search note has an apostrophe), so it is never pasted into bash -c.
check "tune --effort quick searches by the model" has "$tune" '"search":"model"'
check "tune --effort quick says how the model ranked" has "$tune" 'the model ranked'
sample=$("$BIN" model softmax --shapes small --sample 3 --json)
check "model --sample draws 3 valid configs, each predicted, none the default" python3 -c "
import json, sys
j = json.loads(sys.argv[1]); d = json.loads(sys.argv[2])['config']; s = j['samples']
assert len(s) == 3 and len({json.dumps(x['config'], sort_keys=True) for x in s}) == 3, s
assert all(x['fits'] and x['predicted_ms'] > 0 and x['config'] != d for x in s), s
" "$sample" "$("$BIN" model softmax --shapes small --json)"

# The pallas target (TPU interpret mode, needs the project's .venv: scripts/setup_python.sh).
for k in add softmax; do
  out=$("$BIN" run $k --target pallas --shapes small --json 2>&1)
  check "$k on the pallas target is correct" has "$out" '"correct":true'
done
# Where it ran: one line (stderr), and a field of --json. JAX_PLATFORMS=cpu: no TPU anywhere.
out=$(JAX_PLATFORMS=cpu "$BIN" run add --target pallas --shapes small 2>&1 >/dev/null)
check "pallas says it runs in interpret mode" has "$out" '^pallas: no TPU visible to JAX [0-9.]*; running in interpret mode on the CPU$'
out=$(JAX_PLATFORMS=cpu "$BIN" run add --target pallas --shapes small --json 2>/dev/null)
check "pallas run --json carries the device" has "$out" '"device":"pallas: no TPU visible to JAX'
# --chip picks the TPU generation the pallas target plans for (its VMEM rules); every row.
for chip in v4 v5e v5p v6e v7x; do
  out=$("$BIN" emit add --target pallas --shapes small --chip $chip 2>/dev/null)
  check "emit --chip $chip plans for $chip" has "$out" "^# VMEM on $chip: "
done
out=$("$BIN" emit add --target pallas --shapes small --chip v9 2>&1)
check "an unknown --chip names the known ones" has "$out" 'choose one of v4, v5e, v5p, v6e, v7x'
out=$("$BIN" emit add --shapes small --chip v5e 2>&1)
check "the cpu target takes no --chip" has "$out" 'the cpu target takes no --chip'
out=$(JAX_PLATFORMS=cpu DEUTERON_PALLAS_DEVICE=tpu "$BIN" run add --target pallas --shapes small 2>&1)
check "pallas with DEUTERON_PALLAS_DEVICE=tpu and no TPU is an error" has "$out" 'error: .*no TPU visible to JAX'

# The triton target (torch and triton in the .venv: scripts/setup_python.sh --triton): under
# Triton's interpreter when asked (--interpret, a generic option: the target names its setting).
out=$("$BIN" run add --target triton --interpret --shapes small --json 2>&1)
check "triton --interpret is correct" has "$out" '"correct":true'
check "triton --interpret says where it ran" has "$out" "\"device\":\"triton: running under Triton's interpreter on the CPU"
out=$(TRITON_INTERPRET= DEUTERON_TRITON_DEVICE= "$BIN" run add --target triton --shapes small --json 2>&1)
check "triton without a GPU says so (or runs on the GPU)" has "$out" 'needs a GPU, and none is present\|"correct":true'
out=$("$BIN" run add --shapes small --interpret 2>&1)
check "the cpu target has no --interpret" has "$out" 'the cpu target has no interpreter'

# The performance model: any shape without making inputs, on a TPU it has never seen.
m=$("$BIN" model attention --target pallas --chip v7x --shape 8,32,32768,256 --dtype bfloat16 --strategy emit_pipeline --candidates 20 --json)
check "model predicts a streamed attention at S=32768 on v7x" bash -c "grep -q '\"fits\":true' <<<'$m' && grep -q '\"predicted_ms\"' <<<'$m' && grep -q '\"bound\"' <<<'$m'"
m=$("$BIN" model attention --target pallas --chip v7x --shape 8,32,32768,256 --dtype bfloat16 \
    --config '{"inner_kv":"resident","buffers_kv":2,"block_q":512,"block_kv":512}' --json)
check "model: double-buffered resident K and V do not fit v7x at S=32768, with the arithmetic" \
  bash -c "grep -q '\"fits\":false' <<<'$m' && grep -q 'operand buffers' <<<'$m'"
out=$("$BIN" emit attention --target pallas --chip v7x --shape 8,32,32768,256 --dtype bfloat16 --explain-vmem 2>&1)
check "emit at a shape of 12 GiB of inputs makes none, and explains VMEM" has "$out" 'pruned  inner_kv="resident" buffers_kv=2'

# Pictures of the pipeline: a PNG (its signature, then an IHDR chunk of the drawn size).
png_ok() {  # png_ok FILE: the PNG signature and an IHDR of 1800 x (more than 200) pixels
  local h; h=$(od -An -tx1 -N24 "$1" | tr -d ' \n')
  [ "${h:0:16}" = 89504e470d0a1a0a ] && [ "${h:24:8}" = 49484452 ] && [ $((16#${h:32:8})) -eq 1800 ] &&
    [ $((16#${h:40:8})) -gt 200 ]
}
pics="$DEUTERON_CACHE_DIR/pictures"; mkdir -p "$pics"
"$BIN" model attention --target pallas --chip v7x --shape 8,32,4096,256 --dtype bfloat16 --strategy emit_pipeline \
    --candidates 20 --timeline "$pics/attention.png" >/dev/null
check "model --timeline writes a PNG" png_ok "$pics/attention.png"
"$BIN" model add --shape 300,700 --timeline "$pics/add.png" >/dev/null
check "model --timeline on the cpu target writes a PNG" png_ok "$pics/add.png"
out=$("$BIN" model add --shape 300,700 --timeline /nonexistent/dir/add.png 2>&1)
check "model --timeline into a directory that is not there says so" has "$out" "cannot write the timeline to '/nonexistent/dir/add.png'"
"$BIN" run add --shape 300,700 --repeat 1 --timeline "$pics/run.png" >/dev/null
check "run --timeline draws the measured grid steps on the cpu" png_ok "$pics/run.png"
check "normal runs do not trace" bash -c "! '$BIN' emit add --shape 300,700 | grep -q _trace"

# Offline tuning by the model: a config per chip and shape, no device, no inputs (S=32768 has
# 12 GiB of them); K and V stay resident while they fit VMEM, stream at S=32768.
t=$("$BIN" tune attention --target pallas --chip v7x --shape 8,32,4096,256 --dtype bfloat16 --by-model --model-candidates 40 --json)
check "tune --by-model keeps K and V resident at S=4096 on v7x" has "$t" '"inner_kv":"resident"'
t=$("$BIN" tune attention --target pallas --chip v7x --shape 8,32,32768,256 --dtype bfloat16 --by-model --model-candidates 40 --json)
check "tune --by-model streams K and V at S=32768 on v7x" has "$t" '"inner_kv":"stream"'
check "the cache lists the choice as model-chosen" has "$("$BIN" cache list attention)" "(model-chosen)"
# On a target that measures (the cpu), a measured tune replaces the model's choice.
"$BIN" tune add --shape 300,700 --by-model --model-candidates 20 >/dev/null
check "tune --by-model on the cpu caches a model-chosen entry" has "$("$BIN" cache list add)" "(model-chosen)"
out=$("$BIN" tune add --shape 300,700 --effort quick --max-candidates 3 --time-budget 5 --progress quiet)
check "a measured tune says it replaced the model's choice" has "$out" "replaced the model-chosen config"
check "the model-chosen entry is gone" bash -c "! '$BIN' cache list add | grep -q 'model-chosen'"

checks_done
