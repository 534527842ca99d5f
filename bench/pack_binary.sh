#!/usr/bin/env bash
# Copies build/deuteron, stripped, and the shared libraries it needs beyond the C and C++
# runtimes and OpenMP (fmt, xxhash, cairo and what cairo loads) into DIR, so that it runs on a
# machine without the build's packages
# (a GPU machine for bench/triton_gpu.py, say): LD_LIBRARY_PATH=DIR DIR/deuteron ...
# Usage: bash bench/pack_binary.sh DIR [BINARY]
set -euo pipefail
DIR="${1:?usage: pack_binary.sh DIR [BINARY]}"
BIN="${2:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/build/deuteron}"
mkdir -p "$DIR"
strip -o "$DIR/deuteron" "$BIN"
ldd "$BIN" | awk '/=> \// {print $3}' |
  grep -vE '/(libc|libm|libstdc\+\+|libgcc_s|libpthread|libdl|librt|libgomp|ld-linux[^/]*)\.so' | while read -r lib; do
  cp -L "$lib" "$DIR/"
done
ls -la "$DIR"
