#!/usr/bin/env bash
# Creates (or updates) the project's Python virtual environment at <repo>/.venv.
#
#   scripts/setup_python.sh           jax/jaxlib/numpy for the Pallas tests (python/requirements-pallas.txt)
#   scripts/setup_python.sh --triton  adds torch and triton for the Triton tests (requirements-triton.txt;
#                                     ~3 GB download, ~6 GB installed: what CI installs), and what
#                                     the Python package builds and tests with (requirements-package.txt)
#   scripts/setup_python.sh --bench   adds matplotlib to those (python/requirements-bench.txt)
#   scripts/setup_python.sh --force   reinstall even if the stamp says it is up to date
#
# Idempotent: a stamp file in the venv holds a hash of the requirement files and of the base
# interpreter; when it matches, the script only checks that the venv's python starts (<1 s).
# Environment: DEUTERON_PYTHON=/path/to/python3 picks the base interpreter (default: python3 on
# PATH, falling back to /usr/bin/python3). Needs Python >= 3.11 (jax 0.10 requires it).
# Exit status: 0 on success, non-zero on any failure.
set -euo pipefail

log() { printf 'setup_python: %s\n' "$*"; }
die() { printf 'setup_python: error: %s\n' "$*" >&2; exit 1; }

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$REPO/.venv"
STAMP="$VENV/.deuteron-requirements.stamp"
MODE=pallas
FORCE=0
for arg in "$@"; do
  case "$arg" in
    --triton) MODE=triton ;;
    --bench) MODE=bench ;;
    --force) FORCE=1 ;;
    -h|--help) sed -n '2,14p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument: $arg (use --triton, --bench, --force or --help)" ;;
  esac
done
REQ="$REPO/python/requirements-$MODE.txt"
[ -f "$REQ" ] || die "missing $REQ"

# Serialise concurrent runs (e.g. parallel test jobs) on the same checkout.
if command -v flock >/dev/null 2>&1; then
  LOCK="${TMPDIR:-/tmp}/deuteron-venv-$(printf '%s' "$REPO" | cksum | cut -d' ' -f1).lock"
  exec 9>"$LOCK"
  flock 9
fi

# ---- base interpreter --------------------------------------------------------------------
py_ok() {  # usable base interpreter: runs and is >= 3.11
  "$1" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' >/dev/null 2>&1
}
BASE_PY=""
for cand in "${DEUTERON_PYTHON:-}" python3 /usr/bin/python3; do
  [ -n "$cand" ] || continue
  if command -v "$cand" >/dev/null 2>&1 && py_ok "$cand"; then BASE_PY="$cand"; break; fi
done
[ -n "$BASE_PY" ] || die "no Python >= 3.11 found (set DEUTERON_PYTHON)"
# Resolve pyenv shims etc. to the real interpreter so the stamp notices a changed interpreter.
BASE_REAL="$("$BASE_PY" -c 'import sys; print(getattr(sys, "_base_executable", sys.executable))')"
BASE_VER="$("$BASE_PY" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])')"

# ---- stamp: hash of requirement files (incl. the ones pulled in with -r) + interpreter -------
req_hash() {  # $1 = mode
  {
    printf 'python %s %s\n' "$BASE_REAL" "$BASE_VER"
    cat "$REPO/python/requirements-pallas.txt"
    [ "$1" != pallas ] && cat "$REPO/python/requirements-triton.txt" "$REPO/python/requirements-package.txt"
    [ "$1" = bench ] && cat "$REPO/python/requirements-bench.txt"
    true
  } | sha256sum | cut -d' ' -f1
}
WANT="$(req_hash "$MODE")"

if [ "$FORCE" = 0 ] && [ -x "$VENV/bin/python" ] && [ -f "$STAMP" ] \
   && grep -qx "$MODE $WANT" "$STAMP" && "$VENV/bin/python" -c 'pass' >/dev/null 2>&1; then
  log "$VENV is up to date for python/requirements-$MODE.txt (stamp matches); nothing to do"
  exit 0
fi

# ---- create the venv ---------------------------------------------------------------------
make_venv() { "$BASE_PY" -m venv "$VENV" >/dev/null 2>&1; }
if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c 'pass' >/dev/null 2>&1 \
   && [ "$("$VENV/bin/python" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])')" = "$BASE_VER" ]; then
  log "reusing existing venv $VENV (Python $BASE_VER)"
else
  if [ -e "$VENV" ]; then
    log "removing broken or mismatched venv $VENV"
    rm -rf "$VENV"
  fi
  log "creating venv $VENV with $BASE_PY (Python $BASE_VER, $BASE_REAL)"
  if ! make_venv; then
    rm -rf "$VENV"
    # Debian's own python3 ships venv/ensurepip separately; pyenv builds include them.
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
      minor="$("$BASE_PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
      log "'$BASE_PY -m venv' failed; installing Debian's python3-venv python$minor-venv with apt-get"
      apt-get update -qq || die "apt-get update failed"
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv "python$minor-venv" \
        || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv \
        || die "apt-get install python3-venv failed"
      make_venv || { rm -rf "$VENV"; die "'$BASE_PY -m venv $VENV' still fails after installing python3-venv"; }
    else
      die "'$BASE_PY -m venv $VENV' failed (install the venv module, e.g. Debian's python3-venv)"
    fi
  fi
fi

# ---- install -----------------------------------------------------------------------------
log "installing python/requirements-$MODE.txt into $VENV (pip)"
start=$(date +%s)
"$VENV/bin/python" -m pip install --disable-pip-version-check --progress-bar off -q -r "$REQ" \
  || die "pip install -r $REQ failed"
log "pip install took $(( $(date +%s) - start )) s"

"$VENV/bin/python" - <<'EOF' || die "installed packages do not import"
import jax, jaxlib, numpy, ml_dtypes
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
pltpu.InterpretParams(detect_races=True, out_of_bounds_reads="raise", uninitialized_memory="nan")
print("setup_python: ok: jax %s, jaxlib %s, numpy %s, ml_dtypes %s"
      % (jax.__version__, jaxlib.__version__, numpy.__version__, ml_dtypes.__version__))
EOF
if [ "$MODE" != pallas ]; then
  # Triton's interpreter on torch CPU tensors: what the triton target's tests run.
  TRITON_INTERPRET=1 "$VENV/bin/python" - <<'EOF' || die "torch/triton do not import, or Triton's interpreter does not run"
import torch, triton, triton.language as tl

@triton.jit
def _twice(x, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(x + offs, tl.load(x + offs, mask=offs < n) * 2, mask=offs < n)

x = torch.ones(3)
_twice[(1,)](x, 3, BLOCK=4)
assert x.tolist() == [2.0, 2.0, 2.0], x
print("setup_python: ok: torch %s, triton %s (interpreter runs)" % (torch.__version__, triton.__version__))
EOF
fi
if [ "$MODE" != pallas ]; then
  "$VENV/bin/python" -c 'import scikit_build_core, nanobind, pytest; print("setup_python: ok: scikit-build-core %s, nanobind %s, pytest %s" % (scikit_build_core.__version__, nanobind.__version__, pytest.__version__))' \
    || die "scikit-build-core, nanobind or pytest do not import"
fi
if [ "$MODE" = bench ]; then
  "$VENV/bin/python" -c 'import matplotlib; print("setup_python: ok: matplotlib %s" % matplotlib.__version__)' \
    || die "matplotlib does not import"
fi

# Record the stamp. Each mode's install also satisfies the modes it includes
# (pallas within triton within bench).
{
  echo "$MODE $WANT"
  [ "$MODE" = bench ] && echo "triton $(req_hash triton)"
  [ "$MODE" != pallas ] && echo "pallas $(req_hash pallas)"
  true
} > "$STAMP"
log "done: $VENV ($(du -sh "$VENV" 2>/dev/null | cut -f1)); use $VENV/bin/python"
