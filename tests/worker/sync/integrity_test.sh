#!/usr/bin/env bash
# A diverging peer cannot poison the job (real geotrain-worker processes over
# loopback, CURVE, Fashion-MNIST, mlp, dts K = 4, D = 1, identity codec,
# 2 regions x 2 workers): rank 3 trains with training.lr = 1e30.
#   flat          rank 3 stops by itself once its loss is no number (before
#                 it sends an update); the others go on without it
#   hierarchical  rank 3 is a member: it stops in the same way, and its
#                 leader goes on with the region's other workers
# (A bad contribution that does reach a peer is refused: sync_test's
# Integrity tests forge them for every codec.)
# In both: rank 3 exits 1 with an error event saying it diverged; the others
# exit 0 with the same final model, within 1 point of the test accuracy of
# the same job without the bad peer; every progress line is valid JSON.
# Usage: integrity_test.sh GEOTRAIN GEOTRAIN_WORKER
set -uo pipefail
geotrain="$1"
worker="$2"
source "$(dirname "$0")/worker_processes.sh"
workers_setup 4
regions=(london london tokyo tokyo)

# run NAME HIERARCHICAL BAD_LR: 4 workers; rank 3 uses BAD_LR.
run() {
  local name="$1" hier="$2" badlr="$3" dir="$work/$1"
  mkdir -p "$dir"
  local pids=()
  for r in 0 1 2 3; do
    local lr=0.05
    [[ $r == 3 ]] && lr="$badlr"
    "$worker" --progress-format jsonl --set job.id="integrity-$name" \
      --set worker.rank=$r --set worker.worldSize=4 --set worker.region="${regions[$r]}" \
      --set worker.localRank=$((r % 2)) --set worker.regionSize=2 \
      --set transport.regions=london,london,tokyo,tokyo --set transport.peers="$peers" \
      --set transport.listen="tcp://127.0.0.1:${ports[$r]}" --set transport.keyDir="$work/keys" \
      --set sync.algorithm=dts --set sync.hierarchical="$hier" --set sync.period=4 \
      --set sync.delay=1 --set sync.codec=identity --set sync.timeoutSeconds=10 \
      --set sync.peerTimeoutSeconds=2 --set training.lr="$lr" \
      --set model.builtin=mlp --set dataset.name=fashion-mnist \
      --set training.steps=300 --set training.logInterval=10 --set training.evalInterval=0 \
      --set training.threads=1 --set metrics.enabled=false \
      > "$dir/out-$r.jsonl" 2> "$dir/err-$r.log" &
    pids+=($!)
  done
  for r in 0 1 2 3; do
    wait "${pids[$r]}"
    echo $? > "$dir/rc-$r"
  done
}

# check NAME: the figures, against the clean run's accuracy.
check() {
  local name="$1" dir="$work/$1"
  [[ "$(cat "$dir/rc-3")" == 1 ]] || fail "$name: the diverged rank 3 exited $(cat "$dir/rc-3"), expected 1"
  grep '"event":"error"' "$dir/out-3.jsonl" | grep -q 'diverged' ||
    fail "$name: rank 3 has no error event saying it diverged"
  for r in 0 1 2; do
    [[ "$(cat "$dir/rc-$r")" == 0 ]] || fail "$name: rank $r exited $(cat "$dir/rc-$r")"
  done
  python3 - "$dir" "$work/clean" "$name" <<'PY' || fail "$name: results out of bounds"
import json, sys, glob, os
d, clean, name = sys.argv[1:]
def events(path):
    out = []
    for n, line in enumerate(open(path), 1):
        try:
            out.append(json.loads(line))
        except ValueError:
            sys.exit(f"{path}:{n} is not JSON: {line!r}")
    return out
done = {}
for r in range(4):
    for e in events(os.path.join(d, f"out-{r}.jsonl")):
        if "loss" in e and e["loss"] is None and "loss" not in e.get("nonFinite", []):
            sys.exit(f"{name}: rank {r}: a null loss without the nonFinite flag: {e}")
        if e["event"] == "done":
            done[r] = e
acc_clean = json.loads([l for l in open(os.path.join(clean, "out-0.jsonl")) if '"done"' in l][0])["testAccuracy"]
hashes = {done[r]["modelHash"] for r in (0, 1, 2)}
if len(hashes) != 1:
    sys.exit(f"{name}: the healthy workers hold different models: {hashes}")
acc = done[0]["testAccuracy"]
refused = sum(done[r]["sync"].get("rejected", 0) for r in (0, 1, 2))
print(f"{name}: healthy accuracy {acc:.4f} (without the bad peer {acc_clean:.4f}), "
      f"{refused} contributions refused")
if abs(acc - acc_clean) > 0.01:
    sys.exit(f"{name}: accuracy {acc:.4f} is more than 1 point from {acc_clean:.4f}")
PY
}

run clean false 0.05
for r in 0 1 2 3; do
  [[ "$(cat "$work/clean/rc-$r")" == 0 ]] || fail "clean: rank $r exited $(cat "$work/clean/rc-$r")"
done
run flat false 1e30
check flat
grep -q 'rank 3 (tokyo) is suspected' "$work/flat/err-0.log" ||
  fail "flat: rank 0's log does not say that rank 3 (tokyo) went away"
run hierarchical true 1e30
check hierarchical
grep -q 'rank 3 (tokyo) is suspected' "$work/hierarchical/err-2.log" ||
  fail "hierarchical: the leader's log does not say that its member rank 3 (tokyo) went away"
echo "integrity: ok"
