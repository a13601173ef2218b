# Sourced (not run) by every shell test of this folder: what each of them
# had copied. Needs $geotrain (the geotrain binary) set first; `set -uo
# pipefail` is the caller's. worker_processes.sh adds what the tests that
# start geotrain-worker processes by hand need.
#
#   $work              a temporary folder, removed at exit with every
#                      background job killed (kept, and its path printed,
#                      with GEO_TEST_KEEP=1).
#   fail MESSAGE...    prints FAIL, the last $fail_lines lines (20) of each
#                      log in $fail_logs (a glob, default $work/*.log), then
#                      what the test's own fail_detail function prints, if it
#                      defines one; exits 1.
#   run NAME [VAR=VALUE...] ARGS...
#                      `geotrain local "${common[@]}" ARGS --out $work/NAME`
#                      with the VAR=VALUE words in its environment; its
#                      output in $work/NAME.log, its exit code in
#                      $work/NAME.rc and returned; prints "NAME: S s (exit
#                      RC)". Needs common=(...), the flags every run shares.

work="$(mktemp -d)"
trap 'kill $(jobs -p) 2>/dev/null; if [[ -n "${GEO_TEST_KEEP:-}" ]]; then echo "kept $work"; else rm -rf "$work"; fi' EXIT
fail_logs='$work/*.log'
fail_lines=20

fail() {
  echo "FAIL: $*" >&2
  local f
  for f in $(eval echo "$fail_logs"); do
    [[ -f $f ]] || continue
    echo "--- ${f#"$work"/}" >&2
    tail -"$fail_lines" "$f" >&2
  done
  if declare -F fail_detail > /dev/null; then fail_detail >&2; fi
  exit 1
}

run() {
  local name="$1" start=$SECONDS rc
  shift
  local -a vars=()
  while (($# > 0)) && [[ $1 =~ ^[A-Z_][A-Z0-9_]*= ]]; do
    vars+=("$1")
    shift
  done
  env "${vars[@]}" "$geotrain" local "${common[@]}" "$@" --out "$work/$name" \
    > "$work/$name.log" 2>&1
  rc=$?
  echo "$rc" > "$work/$name.rc"
  echo "$name: $((SECONDS - start)) s (exit $rc)"
  return "$rc"
}
