#!/usr/bin/env bash
# Installs what is missing (Debian packages with apt-get) and builds Deuteron into build/.
#
#   scripts/setup.sh            C++ toolchain and libraries, then configure and build
#   scripts/setup.sh --python   also the project's Python venv (.venv) for the Pallas target
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
