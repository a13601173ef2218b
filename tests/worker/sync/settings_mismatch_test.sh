#!/usr/bin/env bash
# Workers whose sync settings differ refuse each other when they connect
# (real geotrain-worker processes over loopback and CURVE, synthetic data):
# rank 0 runs sync.bits = 4, rank 1 sync.bits = 8. Both exit 2 (a
# configuration error) before training, naming the peer and both values on
# stderr and in an error event; a run with equal settings still finishes.
# Usage: settings_mismatch_test.sh GEOTRAIN GEOTRAIN_WORKER
set -uo pipefail
geotrain="$1"
worker="$2"
source "$(dirname "$0")/worker_processes.sh"

# run NAME BITS0 BITS1 STEPS: two workers in two regions.
run() {
  local name="$1" dir="$work/$1" bits=("$2" "$3") steps="$4"
  mkdir -p "$dir"
  local pids=()
  workers_setup 2  # new ports (the keys stay)
  for r in 0 1; do
    timeout 120 "$worker" --progress-format jsonl --set job.id="mismatch-$name" \
      --set worker.rank=$r --set worker.worldSize=2 --set worker.region="region-$r" \
      --set transport.regions=region-0,region-1 --set transport.peers="$peers" \
      --set transport.listen="tcp://127.0.0.1:${ports[$r]}" --set transport.keyDir="$work/keys" \
      --set sync.algorithm=dts --set sync.period=2 --set sync.codec=qsgd \
      --set sync.bits="${bits[$r]}" --set sync.timeoutSeconds=10 \
      --set model.builtin=mlp --set dataset.name=synthetic --set dataset.path= \
      --set training.steps="$steps" --set training.logInterval=10 \
      --set training.evalInterval=0 --set training.threads=1 --set metrics.enabled=false \
      > "$dir/out-$r.jsonl" 2> "$dir/err-$r.log" &
    pids+=($!)
  done
  for r in 0 1; do
    wait "${pids[$r]}"
    echo $? > "$dir/rc-$r"
  done
}

# Steps enough that only a refusal ends the run within the time-out.
run mismatch 4 8 100000
for r in 0 1; do
  rc="$(cat "$work/mismatch/rc-$r")"
  [[ "$rc" == 2 ]] || fail "mismatch: rank $r exited $rc, expected 2"
  ! grep -q '"event":"progress"' "$work/mismatch/out-$r.jsonl" ||
    fail "mismatch: rank $r trained before refusing its peer"
done
want0='peer region-1 (rank 1) runs sync.bits = 8, this worker sync.bits = 4: every worker of a job must use the same sync settings'
want1='peer region-0 (rank 0) runs sync.bits = 4, this worker sync.bits = 8: every worker of a job must use the same sync settings'
grep -qF "geotrain-worker: $want0" "$work/mismatch/err-0.log" || fail "rank 0's stderr does not say: $want0"
grep -qF "geotrain-worker: $want1" "$work/mismatch/err-1.log" || fail "rank 1's stderr does not say: $want1"
python3 - "$work/mismatch/out-0.jsonl" "$want0" <<'PY' || fail "rank 0 has no error event with the refusal"
import json, sys
events = [json.loads(line) for line in open(sys.argv[1])]
assert any(e["event"] == "error" and e["message"] == sys.argv[2] for e in events), events
PY

run agree 4 4 40
for r in 0 1; do
  rc="$(cat "$work/agree/rc-$r")"
  [[ "$rc" == 0 ]] || fail "agree: rank $r exited $rc, expected 0"
  grep -q '"event":"done"' "$work/agree/out-$r.jsonl" || fail "agree: rank $r has no done event"
done
echo "ok: different sync.bits refused at connect time (exit 2), equal settings train"
