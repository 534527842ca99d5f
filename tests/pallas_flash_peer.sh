#!/usr/bin/env bash
# Deuteron's attention and attention_causal on the pallas target against JAX's Pallas TPU flash
# attention (jax.experimental.pallas.ops.tpu.flash_attention), both in TPU interpret mode.
# Usage: pallas_flash_peer.sh path/to/deuteron
set -euo pipefail
BIN="$1"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENV="${DEUTERON_VENV:-$HERE/../.venv}"
export DEUTERON_CACHE_DIR="${DEUTERON_CACHE_DIR:-$(mktemp -d)}"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
shape=1,2,256,64  # JAX's kernel takes whole 128-row blocks
# Deuteron's kernels with key blocks of 64 streamed by a nested pipeline (the pallas default)
for k in attention attention_causal; do
  "$BIN" emit "$k" --target pallas --shape "$shape" --config '{"block_q":128,"block_kv":64}' >"$dir/$k.py"
done
"$VENV/bin/python" "$HERE/pallas_flash_peer.py" "$HERE/../src" "$dir/attention.py" "$dir/attention_causal.py" ${shape//,/ }
