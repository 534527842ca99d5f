# Sourced by the test scripts: `check NAME COMMAND...` runs COMMAND and counts it as a passed
# or failed check (printing NAME when it fails); `checks_done` prints the counts and returns
# non-zero if any failed.
passed=0
failed=0
check() {
  local name="$1"
  shift
  if "$@"; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAILED: $name"; fi
}
checks_done() {
  echo "$passed passed, $failed failed"
  test "$failed" -eq 0
}
