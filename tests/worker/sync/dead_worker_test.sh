#!/usr/bin/env bash
# A worker killed mid-run (real geotrain-worker processes over loopback,
# CURVE, 2 regions x 2 workers): with dts the others finish and their logs
# name the dead rank; with allreduce the others exit 1 within the timeout,
# naming it. Nobody hangs.
# Usage: dead_worker_test.sh GEOTRAIN GEOTRAIN_WORKER
set -uo pipefail
geotrain="$1"
worker="$2"
source "$(dirname "$0")/worker_processes.sh"
workers_setup 4
regions=(london london tokyo tokyo)

# run ALGORITHM: starts 4 workers, kills rank 3 once it reached step 40,
# leaves the exit codes of ranks 0..2 in $work/ALGORITHM/rc-R.
run() {
  local alg="$1" dir="$work/$1"
  mkdir -p "$dir"
  local pids=()
  for r in 0 1 2 3; do
    "$worker" --progress-format jsonl --set job.id="dead-$alg" \
      --set worker.rank=$r --set worker.worldSize=4 --set worker.region="${regions[$r]}" \
      --set worker.localRank=$((r % 2)) --set worker.regionSize=2 \
      --set transport.regions=london,london,tokyo,tokyo --set transport.peers="$peers" \
      --set transport.listen="tcp://127.0.0.1:${ports[$r]}" --set transport.keyDir="$work/keys" \
      --set sync.algorithm="$alg" --set sync.hierarchical=false --set sync.period=2 \
      --set sync.delay=1 --set sync.timeoutSeconds=3 --set sync.codec=qsgd \
      --set dataset.name=synthetic --set dataset.syntheticSamples=4096 \
      --set training.steps=400 --set training.logInterval=10 --set training.evalInterval=0 \
      --set training.threads=1 --set metrics.enabled=false \
      > "$dir/out-$r.jsonl" 2> "$dir/err-$r.log" &
    pids+=($!)
  done
  local waited=0
  until grep -q '"step":40,' "$dir/out-3.jsonl" 2>/dev/null; do
    sleep 0.2
    waited=$((waited + 1))
    [[ $waited -lt 600 ]] || fail "$alg: rank 3 never reached step 40"
  done
  local start=$SECONDS
  { kill -9 "${pids[3]}"; wait "${pids[3]}"; } 2>/dev/null
  for r in 0 1 2; do
    wait "${pids[$r]}"
    echo $? > "$dir/rc-$r"
  done
  echo "$alg: the survivors exited $((SECONDS - start)) s after the kill"
  [[ $((SECONDS - start)) -lt 120 ]] || fail "$alg: the survivors took $((SECONDS - start)) s"
}

run dts
for r in 0 1 2; do
  [[ "$(cat "$work/dts/rc-$r")" == 0 ]] || fail "dts: rank $r exited $(cat "$work/dts/rc-$r")"
  grep -q 'rank 3 (tokyo)' "$work/dts/err-$r.log" || fail "dts: rank $r's log does not name rank 3 (tokyo)"
  grep -q '"event":"done"' "$work/dts/out-$r.jsonl" || fail "dts: rank $r has no done event"
  grep '"event":"done"' "$work/dts/out-$r.jsonl" | grep -qv '"missing":0,' ||
    fail "dts: rank $r counted no missing contribution"
done

run allreduce
for r in 0 1 2; do
  [[ "$(cat "$work/allreduce/rc-$r")" == 1 ]] ||
    fail "allreduce: rank $r exited $(cat "$work/allreduce/rc-$r"), expected 1"
  grep -q 'rank 3 (tokyo)' "$work/allreduce/err-$r.log" ||
    fail "allreduce: rank $r's error does not name rank 3 (tokyo)"
  grep -q '"event":"error"' "$work/allreduce/out-$r.jsonl" || fail "allreduce: rank $r has no error event"
done
echo "dead worker: ok"
