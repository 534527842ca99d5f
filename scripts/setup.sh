#!/usr/bin/env bash
# Installs what is missing (Debian packages with apt-get) and builds Deuteron into build/.
#
#   scripts/setup.sh            C++ toolchain and libraries, then configure and build
#   scripts/setup.sh --python   also the project's Python venv (.venv) for the Pallas and Triton targets,
#                               and the Python package `deuteron` in it (pip install .)
#
# Idempotent: packages already installed are not touched; the build is incremental.
set -euo pipefail

log() { printf 'setup: %s\n' "$*"; }
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WITH_PYTHON=0
for arg in "$@"; do
  case "$arg" in
    --python) WITH_PYTHON=1 ;;
    *) printf 'setup: unknown argument %s (use --python)\n' "$arg" >&2; exit 1 ;;
  esac
done

# What each package is for is listed in README.md.
PACKAGES=(g++ cmake ninja-build libfmt-dev nlohmann-json3-dev libcli11-dev libxxhash-dev
          libdlpack-dev libgtest-dev pkg-config libcairo2-dev)
# The Python package's native module compiles against the interpreter's headers (Debian's
# python3 lacks them; a pyenv build has its own).
if [ "$WITH_PYTHON" -eq 1 ]; then PACKAGES+=(python3-dev); fi
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

if [ "$WITH_PYTHON" -eq 1 ]; then
  bash "$REPO/scripts/setup_python.sh" --triton  # jax for pallas, torch and triton for triton
fi

log "building into build/"
cmake -S "$REPO" -B "$REPO/build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$REPO/build" -j "$(nproc)"

if [ "$WITH_PYTHON" -eq 1 ]; then
  # The Python package (pyproject.toml: scikit-build-core, nanobind) into the venv, for the
  # `python` tests. Built in build/python (Release, kept: a second install rebuilds only what
  # changed), from the venv's pinned build tools, so no build isolation is needed.
  log "installing the Python package deuteron into .venv (pip install .)"
  start=$(date +%s)
  CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" "$REPO/.venv/bin/python" -m pip install --disable-pip-version-check \
    --no-build-isolation --no-deps -q "$REPO"
  log "pip install . took $(( $(date +%s) - start )) s"
fi
