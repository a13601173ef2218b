#!/usr/bin/env bash
# sync.period: auto follows a change of uplink bandwidth, across real
# processes: `geotrain local` on the world preset's london and tokyo links
# (115 ms one way, 100 Mbit/s uplinks), mlp on Fashion-MNIST, dts with an
# automatic period and delay, steps of at least 25 ms (--step-time: the
# same K on any machine; on OpenBLAS a bare mlp step takes ~1 ms, for which
# 100 Mbit/s is itself the limit). At 100 Mbit/s a round (~100 KB of 4-bit
# updates) leaves in ~8 ms and the workers keep the K they start with (16:
# rounds of 400 ms); 3 s in, both uplinks drop to 1 Mbit/s (--throttle: a
# queued signal to each worker), a round then takes most of a second to
# leave, more than half a round of 16, and the workers must agree on a
# larger K (>= 32) before the end, finish, and end with the same model.
# (At 4 Mbit/s, what the test throttled to when K started at 4, a round of
# 16 steps carries its transfer: K stays 16.)
# Usage: auto_period_test.sh GEOTRAIN
set -uo pipefail
geotrain="$1"
source "$(dirname "$0")/test_prologue.sh"
fail_detail() {
  for f in "$work"/out/logs/worker-*.log; do echo "--- $f"; grep -E "period K|uplink now" "$f" | tail -8; done
}
common=(--preset world --regions london,tokyo --workers-per-region 1)

run out --algorithm dts --period auto --delay auto --codec qsgd --bits 4 --model mlp \
  --step-time 25ms --steps 1500 --eval-interval 0 --throttle london@3s=1mbit \
  --throttle tokyo@3s=1mbit || fail "geotrain local failed"
grep -q "final models   identical on every worker that finished" "$work/out.log" ||
  fail "the workers did not end with the same model"
grep -q "fault throttle tokyo uplink 1mbit from" "$work/out.log" ||
  fail "the summary does not report the throttle as such"

for r in 0 1; do
  log="$work/out/logs/worker-$r.log"
  grep -q "uplink now 1 Mbit/s" "$log" || fail "worker $r was not throttled"
  # K in force before and after the throttle (adopted changes only).
  before=$(sed -n '/uplink now/q;s/.*period K = \([0-9]*\) steps (was.*/\1/p' "$log" | tail -1)
  after=$(sed -n '/uplink now/,$s/.*period K = \([0-9]*\) steps (was.*/\1/p' "$log" | tail -1)
  echo "worker $r: K before the throttle ${before:-16 (the start)}, after ${after:-unchanged}"
  [[ -z "$before" || "$before" -le 16 ]] || fail "worker $r: K = $before at 100 Mbit/s (expected <= 16)"
  [[ -n "$after" && "$after" -ge 32 ]] || fail "worker $r: K did not grow to >= 32 at 1 Mbit/s"
done
echo "PASS: auto period followed the uplink from 100 to 1 Mbit/s"
