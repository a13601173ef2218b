#!/usr/bin/env bash
# sync.period: auto follows a change of uplink bandwidth, across real
# processes: `geotrain local` on the world preset's london and tokyo links
# (115 ms one way, 100 Mbit/s uplinks), mlp on Fashion-MNIST, dts with an
# automatic period and delay, steps of at least 25 ms (--step-time: the
# same K on any machine; on OpenBLAS a bare mlp step takes ~1 ms, for which
# 100 Mbit/s is itself the limit). At 100 Mbit/s a round (~100 KB of 4-bit
# updates) leaves in ~8 ms and the workers keep a small K; 3 s in, both
# uplinks drop to 4 Mbit/s (--throttle: a queued signal to each worker), a
# round then takes ~200 ms to leave, and the workers must agree on a larger K
# (>= 8) before the end, finish, and end with the same model.
# Usage: auto_period_test.sh GEOTRAIN
set -uo pipefail
geotrain="$1"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
fail() {
  echo "FAIL: $*" >&2
  tail -20 "$work/run.log" >&2
  for f in "$work"/out/logs/worker-*.log; do echo "--- $f" >&2; grep -E "period K|uplink now" "$f" | tail -8 >&2; done
  exit 1
}

"$geotrain" local --preset world --regions london,tokyo --workers-per-region 1 \
  --algorithm dts --period auto --delay auto --codec qsgd --bits 4 --model mlp --step-time 25ms \
  --steps 1500 --eval-interval 0 --throttle london@3s=4mbit --throttle tokyo@3s=4mbit \
  --out "$work/out" > "$work/run.log" 2>&1 || fail "geotrain local failed"
grep -q "final models   identical on every worker that finished" "$work/run.log" ||
  fail "the workers did not end with the same model"
grep -q "fault throttle tokyo uplink 4mbit from" "$work/run.log" ||
  fail "the summary does not report the throttle as such"

for r in 0 1; do
  log="$work/out/logs/worker-$r.log"
  grep -q "uplink now 4 Mbit/s" "$log" || fail "worker $r was not throttled"
  # K in force before and after the throttle (adopted changes only).
  before=$(sed -n '/uplink now/q;s/.*period K = \([0-9]*\) steps (was.*/\1/p' "$log" | tail -1)
  after=$(sed -n '/uplink now/,$s/.*period K = \([0-9]*\) steps (was.*/\1/p' "$log" | tail -1)
  echo "worker $r: K before the throttle ${before:-4 (the start)}, after ${after:-unchanged}"
  [[ -z "$before" || "$before" -le 4 ]] || fail "worker $r: K = $before at 100 Mbit/s (expected <= 4)"
  [[ -n "$after" && "$after" -ge 8 ]] || fail "worker $r: K did not grow to >= 8 at 4 Mbit/s"
done
echo "PASS: auto period followed the uplink from 100 to 4 Mbit/s"
