#!/usr/bin/env bash
# Two projects that use the library the ways a user's would, each running and tuning a kernel
# of its own against a double-precision reference:
#   find_package      against this build installed into a fresh prefix (cmake --install)
#   add_subdirectory  building the library from its source folder inside the project
# Both run in a fresh cache; the second run of a program must find its tuned configs there.
# Usage: consumers_test.sh build-dir source-dir path/to/cmake
set -uo pipefail
BUILD="$1"
SRC="$2"
CMAKE="$3"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
export DEUTERON_CACHE_DIR="$WORK/cache"
unset DEUTERON_AUTOTUNE_EFFORT DEUTERON_CPU_RUNTIME_DIR
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
jobs="$(nproc)"

source "$SRC/tests/checks.sh"
has() { grep -q -- "$2" "$1"; }
lacks() { ! grep -q -- "$2" "$1"; }
# step NAME LOG COMMAND...: runs a build step, showing its log when it fails.
step() {
  local name="$1" log="$2"
  shift 2
  if "$@" >"$log" 2>&1; then return 0; fi
  echo "FAILED: $name"
  tail -40 "$log"
  return 1
}
# runs NAME PROGRAM KERNEL: the program twice; the first tunes, the second reads the cache.
runs() {
  local name="$1" program="$2" kernel="$3"
  "$program" >"$WORK/$name.1.out" 2>"$WORK/$name.1.err"
  check "$name: first run exits 0" test $? -eq 0
  "$program" >"$WORK/$name.2.out" 2>"$WORK/$name.2.err"
  check "$name: second run exits 0" test $? -eq 0
  check "$name: both shapes correct" test "$(grep -c ': correct' "$WORK/$name.1.out")" -eq 2
  check "$name: the first run tunes" has "$WORK/$name.1.err" "deuteron: tuned $kernel"
  check "$name: the second run finds the tuned configs" lacks "$WORK/$name.2.err" "deuteron: tun"
  cat "$WORK/$name.1.out"
  [[ $failed -eq 0 ]] || cat "$WORK/$name.1.err" "$WORK/$name.2.err"
}

if step "install the build" "$WORK/install.log" "$CMAKE" --install "$BUILD" --prefix "$WORK/prefix" &&
  step "configure find_package" "$WORK/fp-configure.log" "$CMAKE" -S "$SRC/tests/consumers/find_package" \
    -B "$WORK/fp" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$WORK/prefix" &&
  step "build find_package" "$WORK/fp-build.log" "$CMAKE" --build "$WORK/fp" -j "$jobs"; then
  check "find_package finds the installed package" has "$WORK/fp-configure.log" "from $WORK/prefix/"
  runs find_package "$WORK/fp/gated_scale" gated_scale
else
  failed=$((failed + 1))
fi

# Built without optimisation, to keep the test short: the kernels are compiled at run time.
if step "configure add_subdirectory" "$WORK/as-configure.log" "$CMAKE" -S "$SRC/tests/consumers/add_subdirectory" \
  -B "$WORK/as" "${generator[@]}" -DCMAKE_BUILD_TYPE= -DDEUTERON_DIR="$SRC" &&
  step "build add_subdirectory" "$WORK/as-build.log" "$CMAKE" --build "$WORK/as" -j "$jobs"; then
  runs add_subdirectory "$WORK/as/row_normalize" row_normalize
else
  failed=$((failed + 1))
fi

checks_done
