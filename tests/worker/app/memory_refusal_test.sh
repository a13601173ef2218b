#!/usr/bin/env bash
# A DTS job whose workers cannot hold their rounds and final average in the
# memory they may use is refused before it trains, naming the figure: two
# workers of a 104M-parameter mlp (at least 1.9 GB each) in a cgroup of 1.5 GB.
# Needs root and a memory cgroup it can make (v1, or v2 with the memory
# controller); exits 77 (skipped) otherwise.
#   memory_refusal_test.sh GEOTRAIN
set -euo pipefail
geotrain=$1
[[ $(id -u) == 0 ]] || { echo "needs root (a memory cgroup)"; exit 77; }
name="geo-memtest-$$"
if [[ -w /sys/fs/cgroup/memory ]]; then
  group=/sys/fs/cgroup/memory/$name
  limit_file=memory.limit_in_bytes
elif grep -qw memory /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null; then
  group=/sys/fs/cgroup/$name
  limit_file=memory.max
else
  echo "no memory cgroup to make here"
  exit 77
fi
mkdir "$group" || { echo "cannot make $group"; exit 77; }
out=$(mktemp -d)
cleanup() {
  rmdir "$group" 2>/dev/null || true
  rm -rf "$out"
}
trap cleanup EXIT
echo 1500000000 > "$group/$limit_file"

set +e
# shellcheck disable=SC2016
sh -c 'echo $$ > "$1/cgroup.procs" && shift && exec "$@"' sh "$group" \
  "$geotrain" local --regions a,b --preset lan --model mlp --set model.width=131072 \
  --steps 5 --eval-interval 0 --threads 1 -o "$out/run" >"$out/launcher.txt" 2>&1
rc=$?
set -e
fail() {
  echo "FAIL: $*" >&2
  tail -20 "$out/launcher.txt" >&2
  exit 1
}
[[ $rc == 1 ]] || fail "geotrain local exited $rc, not 1"
# Whichever worker is refused first, the launcher stops the other: the
# refusal is in one log or both.
logs=("$out"/run/logs/worker-*.log)
grep -q "memory: at least" "${logs[@]}" || fail "no worker logged its memory plan"
grep -q "needs at least .* of memory .* more than the 1.5 GB it may use" "${logs[@]}" ||
  fail "no worker was refused naming the figure and the limit"
grep -q "resources.limits.memory" "${logs[@]}" || fail "the refusal does not say what to change"
# Before the trainer was made: no worker got as far as its start line.
grep -q "steps of" "${logs[@]}" && fail "a worker got past its set-up before it was refused"
echo "refused at start: $(grep -ho 'needs at least [^(]*' "${logs[@]}" | head -1)"
