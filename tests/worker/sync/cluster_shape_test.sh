#!/usr/bin/env bash
# A job in the shape the controller gives it on Kubernetes (real
# geotrain-worker processes over loopback, CURVE, 2 regions x 2 workers,
# hierarchical DTS on synthetic data): every worker of a region starts from
# the same worker.yaml and differs only in --completion-index (an Indexed
# Job's $(JOB_COMPLETION_INDEX)); a region reaches only the other region's
# leader (its gateway), so the other region's member is `none` in
# transport.peers. Every worker must finish with the same model, and no
# worker may have sent a byte to a `none` peer.
# Usage: cluster_shape_test.sh GEOTRAIN GEOTRAIN_WORKER
set -uo pipefail
geotrain="$1"
worker="$2"
source "$(dirname "$0")/worker_processes.sh"
workers_setup 4
p=("${ports[@]}")
ep() { endpoint "$@"; }
# Region london: ranks 0, 1; tokyo: ranks 2, 3. Rank 3 is not reachable from
# london, nor rank 1 from tokyo.
peers_london="$(ep "${p[0]}"),$(ep "${p[1]}"),$(ep "${p[2]}"),none"
peers_tokyo="$(ep "${p[0]}"),none,$(ep "${p[2]}"),$(ep "${p[3]}")"

pids=()
for r in 0 1 2 3; do
  if ((r < 2)); then region=london peers="$peers_london"; else region=tokyo peers="$peers_tokyo"; fi
  index=$((r % 2))
  # The same settings for every worker of a region (the ConfigMap), except
  # the listen address: on Kubernetes every pod has its own IP and binds
  # tcp://*:7000; here the four share one host.
  # The peer time-out is the round time-out's: this test is about the
  # shape, not failure detection. (Its members once waited out both time-outs
  # for a final model their leader had sent as it exited; the transport now
  # gives what ZeroMQ holds the linger time, transport_test's
  # TransportShutdown.WhatZeroMqHoldsAtCloseLeavesWithinTheLinger.)
  "$worker" --progress-format jsonl --completion-index "$index" --set job.id=cluster-shape \
    --set worker.worldSize=4 --set worker.region="$region" \
    --set transport.regions=london,london,tokyo,tokyo --set transport.peers="$peers" \
    --set transport.listen="$(ep "${p[$r]}")" --set transport.keyDir="$work/keys" \
    --set sync.algorithm=dts --set sync.hierarchical=true --set sync.period=4 \
    --set sync.delay=1 --set sync.timeoutSeconds=20 --set sync.peerTimeoutSeconds=20 \
    --set sync.codec=qsgd \
    --set dataset.name=synthetic --set dataset.syntheticSamples=4096 \
    --set training.steps=120 --set training.logInterval=20 --set training.evalInterval=0 \
    --set training.threads=1 --set metrics.enabled=false \
    > "$work/out-$r.jsonl" 2> "$work/err-$r.log" &
  pids+=($!)
done
for r in 0 1 2 3; do
  wait "${pids[$r]}" || fail "rank $r exited with $?"
done

python3 - "$work" <<'PY' || fail "results"
import json, sys
work = sys.argv[1]
done = {}
for r in range(4):
    events = [json.loads(l) for l in open(f"{work}/out-{r}.jsonl") if l.startswith("{")]
    start = next(e for e in events if e["event"] == "start")
    assert start["rank"] == r, f"--completion-index placed worker {r} at rank {start['rank']}"
    done[r] = next(e for e in events if e["event"] == "done")
accuracies = {done[r]["testAccuracy"] for r in range(4)}
assert len(accuracies) == 1, f"the workers ended with different models: {accuracies}"
# Members send updates only over the LAN (their WAN bytes are the transport's
# 72-byte pings to the other leader); leaders carry the WAN updates.
for r in (1, 3):
    assert done[r]["bytes"]["wanSent"] < 10000, f"member {r} sent WAN data: {done[r]['bytes']}"
for r in (0, 2):
    assert done[r]["bytes"]["wanSent"] > 0, f"leader {r} sent nothing over the WAN"
print("4 workers placed by completion index, one final model, members never crossed the WAN")
PY
for r in 1 3; do
  grep -q "has no endpoint" "$work/err-$r.log" && fail "rank $r tried to send to a none peer"
done
echo "PASS"
