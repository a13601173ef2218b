#!/usr/bin/env bash
# A stand-in for geotrain-worker in the `geotrain local` process tests: takes
# the same command line (--config FILE --progress-format jsonl), reads its
# rank, region and steps from the config, and prints the jsonl progress
# protocol with made-up, deterministic numbers. For event k = 1..10 (one
# every steps/10 steps):
#   time k/10, loss 1/k, evalAccuracy 0.70 + 0.02 k, samplesPerSecond 100,
#   sync {delay 4, appliedUpdates k, stalenessMean 2 + rank,
#         stalenessMax 3 + rank, missing 1 on rank 1 else 0},
#   bytes {wanSent 1000 k (rank+1), wanReceived 900 k, lanSent 10 k,
#          lanReceived 10 k, payload 8000 k (rank+1)}
# then "done" with testAccuracy 0.875, and exit 0.
# Environment:
#   GEO_FAKE_PIDS=FILE        append "<pid> <rank>" to FILE at start
#   GEO_FAKE_SLEEP=S          seconds between events (default 0.02)
#   GEO_FAKE_FAIL_RANK=R      this rank fails at event GEO_FAKE_FAIL_AT (default 3):
#   GEO_FAKE_FAIL_MODE=M        error (an "error" event, then exit 1; default),
#                               exit (exit 3 without an event), signal (SIGKILL itself),
#                               rejoin (an "error" event with "rejoin": true, then
#                               exit 75: a member whose leader died)
#   GEO_FAKE_FAIL_TIMES=N     with GEO_FAKE_FAIL_COUNT=FILE: fail only the first N
#                             times this rank starts (FILE counts the failures)
#   GEO_FAKE_FOREVER=1        the other ranks never finish (progress every GEO_FAKE_SLEEP)
#   GEO_FAKE_IGNORE_TERM=1    ignore SIGTERM (the launcher must SIGKILL)
set -u

config=""
while (($# > 0)); do
  case "$1" in
    --config) config="$2"; shift 2 ;;
    --progress-format) [[ "$2" == jsonl ]] || { echo "fake: jsonl only" >&2; exit 2; }; shift 2 ;;
    *) echo "fake: unknown argument $1" >&2; exit 2 ;;
  esac
done
[[ -f "$config" ]] || { echo "fake: no --config file" >&2; exit 2; }

# value SECTION KEY: the value of SECTION.KEY in the worker.yaml toYaml() wrote.
value() {
  awk -v section="$1:" -v key="$2:" '
    /^[^ #]/ { in_section = ($1 == section); next }
    in_section && $1 == key { print $2; exit }' "$config"
}
rank=$(value worker rank)
region=$(value worker region)
local_rank=$(value worker localRank)
world=$(value worker worldSize)
steps=$(value training steps)

[[ -n "${GEO_FAKE_PIDS:-}" ]] && echo "$$ $rank" >>"$GEO_FAKE_PIDS"
[[ "${GEO_FAKE_IGNORE_TERM:-0}" == 1 ]] && trap '' TERM

sleep_s=${GEO_FAKE_SLEEP:-0.02}
fail_rank=${GEO_FAKE_FAIL_RANK:--1}
fail_at=${GEO_FAKE_FAIL_AT:-3}
forever=${GEO_FAKE_FOREVER:-0}
every=$((steps / 10 > 0 ? steps / 10 : 1))

echo "fake worker $rank: starting (config $config)" >&2
echo "this line is not JSON"
printf '{"event":"start","rank":%d,"region":"%s","localRank":%d,"worldSize":%d,"model":"mlp","parameters":1000,"shardSamples":500,"steps":%d,"algorithm":"dts","time":0.0,"extraKey":[1,2]}\n' \
  "$rank" "$region" "$local_rank" "$world" "$steps"

k=0
while :; do
  k=$((k + 1))
  if ((k > 10)) && [[ "$forever" != 1 || "$rank" == "$fail_rank" ]]; then break; fi
  failures=0
  if [[ -n "${GEO_FAKE_FAIL_COUNT:-}" && -f "$GEO_FAKE_FAIL_COUNT" ]]; then
    failures=$(wc -l <"$GEO_FAKE_FAIL_COUNT")
  fi
  if [[ "$rank" == "$fail_rank" ]] && ((k == fail_at)) &&
     ((failures < ${GEO_FAKE_FAIL_TIMES:-1000000})); then
    [[ -n "${GEO_FAKE_FAIL_COUNT:-}" ]] && echo failed >>"$GEO_FAKE_FAIL_COUNT"
    echo "fake: fatal: something broke at step $((k * every))" >&2
    case "${GEO_FAKE_FAIL_MODE:-error}" in
      error)
        printf '{"event":"error","rank":%d,"message":"fake failure at step %d"}\n' "$rank" $((k * every))
        exit 1 ;;
      rejoin)
        printf '{"event":"error","rank":%d,"message":"fake: the region leader is gone","rejoin":true}\n' "$rank"
        exit 75 ;;
      exit) exit 3 ;;
      signal) kill -KILL $$ ;;
    esac
  fi
  acc=$((70 + 2 * k > 95 ? 95 : 70 + 2 * k))
  missing=$((rank == 1 ? 1 : 0))
  printf '{"event":"progress","rank":%d,"step":%d,"time":%d.%d,"loss":%s,"lr":0.05,"samplesPerSecond":100,"evalAccuracy":0.%02d,"sync":{"delay":4,"appliedUpdates":%d,"stalenessMean":%d,"stalenessMax":%d,"missing":%d,"waitSeconds":0.1},"bytes":{"wanSent":%d,"wanReceived":%d,"lanSent":%d,"lanReceived":%d,"payload":%d}}\n' \
    "$rank" $((k * every)) $((k / 10)) $((k % 10)) "$(awk -v k="$k" 'BEGIN { printf "%.4f", 1 / k }')" \
    "$acc" "$k" $((2 + rank)) $((3 + rank)) "$missing" \
    $((1000 * k * (rank + 1))) $((900 * k)) $((10 * k)) $((10 * k)) $((8000 * k * (rank + 1)))
  sleep "$sleep_s"
done

k=10
printf '{"event":"done","rank":%d,"step":%d,"time":1.0,"testAccuracy":0.875,"loss":0.1,"sync":{"delay":4,"appliedUpdates":%d,"stalenessMean":%d,"stalenessMax":%d,"missing":%d},"bytes":{"wanSent":%d,"wanReceived":%d,"lanSent":%d,"lanReceived":%d,"payload":%d}}\n' \
  "$rank" "$steps" "$k" $((2 + rank)) $((3 + rank)) $((rank == 1 ? 1 : 0)) \
  $((1000 * k * (rank + 1))) $((900 * k)) $((10 * k)) $((10 * k)) $((8000 * k * (rank + 1)))
echo "fake worker $rank: done" >&2
exit 0
