#!/usr/bin/env bash
# The main job: set up, build, then tune-or-load, compile and run a catalogue kernel on the
# CPU, verify it against its reference and print its speed.
#
#   scripts/run.sh                      softmax at its CPU bench shape [8192, 2560]
#   scripts/run.sh layer_norm --dtype bfloat16 ...   any `deuteron run` arguments
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$REPO/scripts/setup.sh"
if [ $# -eq 0 ]; then set -- softmax; fi
exec "$REPO/build/deuteron" run "$@"
