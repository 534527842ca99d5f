#!/usr/bin/env bash
# The build's layers hold (CMakeLists.txt: deuteron_layer; README "Layout"):
#   1. a file includes only headers of its own layer, of the layers its library links, or the
#      public <deuteron/...> headers;
#   2. a target's headers (src/backends/<target>/) are included only by that target's own
#      files (and by tests): not by the driver, the autotuner, the CLI or another target;
#   3. each layer's static library uses only symbols of the libraries it links (no upward
#      call hidden behind a declaration written by hand), and only the registry uses a
#      target's library.
# Usage: layers_test.sh build/layers.txt source-dir [files...]
# With files, only those (paths relative to the source dir) are checked for 1 and 2, as
# members of the layer the map gives them (or the layer of their folder): for trying a change.
set -uo pipefail
MAP="$1"
SRC="$2"
shift 2
cd "$SRC" || exit 2

declare -A layer_of may_use is_target library
while read -r kind name rest; do
  case "$kind" in
    layer)
      read -r lib target uses <<<"$rest"
      library[$name]="$lib"
      is_target[$name]="$target"
      may_use[$name]=" $name $uses "
      ;;
    file) layer_of[$rest]="$name" ;;
  esac
done <"$MAP"

failures=0
fail() {
  echo "FAILED: $*"
  failures=$((failures + 1))
}

# The layer a file belongs to: the map's, else that of the files in its folder (a new file).
layer_for() {
  local f="$1" other
  if [[ -n "${layer_of[$f]:-}" ]]; then echo "${layer_of[$f]}"; return; fi
  for other in "${!layer_of[@]}"; do
    if [[ "$(dirname "$other")" == "$(dirname "$f")" ]]; then echo "${layer_of[$other]}"; return; fi
  done
}

# The target whose folder holds a path (src/backends/<target>/... or backends/<target>/...);
# nothing for a shared folder there that is not a target's (src/backends/python/).
target_of() {
  [[ "$1" =~ ^(src/)?backends/([A-Za-z0-9_]+)/ ]] || return 0
  local t="${BASH_REMATCH[2]}"
  [[ "${is_target[backend_$t]:-0}" == 1 ]] && echo "$t"
  return 0
}

check_includes() {
  local f="$1" layer used header owner_target
  layer="$(layer_for "$f")"
  [[ -z "$layer" ]] && { fail "$f belongs to no layer (add its folder to CMakeLists.txt)"; return; }
  while IFS=: read -r line header; do
    owner_target="$(target_of "$header")"
    if [[ -n "$owner_target" && "$layer" != "tests" && "$(target_of "$f")" != "$owner_target" ]]; then
      fail "$f:$line includes $header: only the $owner_target target's own files use its headers" \
        "(go through backends/backend.h, or move the code into src/backends/$owner_target/)"
      continue
    fi
    [[ -f "src/$header" ]] || continue  # a header of the file's own folder, or a system one
    used="${layer_of[src/$header]:-}"
    [[ -z "$used" ]] && continue
    if [[ "${may_use[$layer]}" != *" $used "* ]]; then
      fail "$f:$line includes $header of the $used layer, which the $layer layer does not link" \
        "(move the code down to $used's users, or give $used's side an interface in a lower layer)"
    fi
  done < <(grep -n -o -E '^[[:space:]]*#[[:space:]]*include[[:space:]]*"[^"]+"' "$f" |
             sed -E 's/^([0-9]+):.*"([^"]+)"$/\1:\2/')
}

if [[ $# -gt 0 ]]; then
  for f in "$@"; do check_includes "$f"; done
else
  for f in "${!layer_of[@]}"; do
    [[ "$f" == ../* || "$f" == /* ]] && continue  # generated into the build folder
    check_includes "$f"
  done
  # A file in a layer's folder that the build does not know is not checked: say so.
  while read -r f; do
    [[ -n "${layer_of[$f]:-}" ]] || fail "$f is in no layer's file list (CMakeLists.txt: deuteron_layer)"
  done < <(find src tools -name '*.cpp' -o -name '*.h' | grep -v '^src/backends/[^/]*/runtime/' | sort)

  # 3: symbols. For each layer, the symbols it leaves undefined that another of our libraries
  # defines must come from one it may use.
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  for name in "${!library[@]}"; do
    lib="${library[$name]}"
    [[ "$lib" == "-" ]] && continue
    [[ -f "$lib" ]] || { fail "$lib (the $name layer) is not built"; continue; }
    nm -g --defined-only "$lib" 2>/dev/null | awk 'NF == 3 { print $3 }' | sort -u >"$tmp/def.$name"
    nm -g --undefined-only "$lib" 2>/dev/null | awk '{ print $NF }' | sort -u >"$tmp/undef.$name"
  done
  # Only the registry reaches into a target; the layers above go through it.
  may_link() {
    [[ "$1" == "$2" ]] && return 0
    [[ "${may_use[$1]}" == *" $2 "* ]] || return 1
    [[ "${is_target[$2]}" != 1 || "$1" == backends ]]
  }
  for name in "${!library[@]}"; do
    [[ -f "$tmp/undef.$name" ]] || continue
    # What it may take from: an inline function or a template that a lower library also
    # defines is not a use of a higher one.
    : >"$tmp/allowed"
    for other in "${!library[@]}"; do
      if [[ -f "$tmp/def.$other" ]] && may_link "$name" "$other"; then cat "$tmp/def.$other" >>"$tmp/allowed"; fi
    done
    sort -u -o "$tmp/allowed" "$tmp/allowed"
    for other in "${!library[@]}"; do
      [[ -f "$tmp/def.$other" ]] || continue
      may_link "$name" "$other" && continue
      comm -12 "$tmp/undef.$name" "$tmp/def.$other" | comm -23 - "$tmp/allowed" >"$tmp/used"
      if [[ -s "$tmp/used" ]]; then
        fail "the $name layer uses symbols of the $other layer, which it may not link:"
        head -5 "$tmp/used" | c++filt | sed 's/^/    /'
      fi
    done
  done
fi

if [[ $failures -gt 0 ]]; then
  echo "$failures layering violation(s)"
  exit 1
fi
echo "layers: ok"
