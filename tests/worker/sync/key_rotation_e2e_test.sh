#!/usr/bin/env bash
# Key rotation mid-run, without a restart (docs/security.md, "Rotating
# keys"): 4 regions (world preset, namespace network as root, user-space
# emulation otherwise), DTS, mlp. While the job trains, every worker's key
# files are replaced in the three phases an operator (or the controller)
# follows, a few seconds apart as files reach pods at different times:
#   1. worker-<r>.next.pub added for every rank: every worker admits the
#      next keys as well;
#   2. each rank switches: worker-<r>.key and worker-<r>.pub become the new
#      pair, the old public key worker-<r>.previous.pub;
#   3. worker-<r>.previous.pub removed: the old keys are refused.
# Checks: the job ends 0 with the same final model on every worker; no
# step of any worker took more than 5 s; nothing was refused (no connection
# made with a key that should pass was turned away); every worker took its
# new keypair and retired the old keys; accuracy of at least 85%.
# Usage: key_rotation_e2e_test.sh GEOTRAIN
set -uo pipefail
geotrain="$1"
source "$(dirname "$0")/test_prologue.sh"
fail_logs='$work/run.log'
fail_detail() {
  grep -H "keys\|refused\|silent\|time-out\|timed out" "$out"/logs/worker-*.log 2>/dev/null |
    sed "s|$work/||" | head -60
}
network=userspace
[[ "$(id -u)" -eq 0 ]] && network=netns
out="$work/run"
keys="$out/keys"
world=4

# In the background, not through run(): the test signals the job while it
# trains, and the prologue's exit trap kills it (a background job) should
# the test fail first.
"$geotrain" local --network "$network" --preset world --model mlp --eval-interval 0 \
  --threads 1 --steps 3000 --step-time 10ms --set training.logInterval=100 --out "$out" \
  > "$work/run.log" 2>&1 &
pid=$!

# Training, past its start.
for _ in $(seq 1 600); do
  if [[ -f "$out/progress.csv" ]] && awk -F, 'NR > 1 && $4 >= 300 { found = 1 } END { exit !found }' \
      "$out/progress.csv"; then
    break
  fi
  kill -0 "$pid" 2>/dev/null || fail "the job ended before the rotation"
  sleep 0.1
done

# Each file is written next to its place and renamed over it, as the
# kubelet swaps a volume's files: a worker never reads half a key.
put() {  # put SOURCE DEST
  cp -p "$1" "$2.tmp" && mv -f "$2.tmp" "$2"
}
for r in $(seq 0 $((world - 1))); do
  "$geotrain" keygen --out "$work/next" --name "worker-$r" > /dev/null || fail "keygen"
done

start=$SECONDS
echo "phase 1: the next keys admitted"
for r in $(seq 0 $((world - 1))); do
  put "$work/next/worker-$r.pub" "$keys/worker-$r.next.pub"
done
sleep 4
echo "phase 2: each worker switches to its new keypair"
for r in $(seq 0 $((world - 1))); do
  put "$keys/worker-$r.pub" "$keys/worker-$r.previous.pub"
  put "$work/next/worker-$r.key" "$keys/worker-$r.key"
  put "$work/next/worker-$r.pub" "$keys/worker-$r.pub"
  rm -f "$keys/worker-$r.next.pub"
  sleep 1
done
sleep 4
echo "phase 3: the old keys retired"
for r in $(seq 0 $((world - 1))); do
  rm -f "$keys/worker-$r.previous.pub"
done
echo "rotated in $((SECONDS - start)) s"
kill -0 "$pid" 2>/dev/null || fail "the job ended during the rotation: its figures say nothing"
wait "$pid"
rc=$?
[[ $rc -eq 0 ]] || fail "geotrain local exited $rc"

python3 - "$out" "$world" "$(dirname "$0")/../../support" <<'PY' || fail "figures out of bounds"
import json, os, re, sys
out, world = sys.argv[1], int(sys.argv[2])
sys.path.insert(0, sys.argv[3])
from checks import check, finish  # noqa: E402
summary = json.load(open(os.path.join(out, "summary.json")))
check(summary["modelsAgree"] is True, "the final models differ")
check(summary["longestStepSeconds"] <= 5.0,
      f"a worker was held up {summary['longestStepSeconds']:.1f} s at once (its longest step)")
check(summary["testAccuracy"] >= 0.85, f"accuracy {summary['testAccuracy']:.4f}")
for r in range(world):
    text = open(os.path.join(out, "logs", f"worker-{r}.log")).read()
    refused = re.findall(r"refused connection #\d+", text)
    check(not refused, f"rank {r} refused {len(refused)} connection(s) during the rotation")
    check("this worker's own keypair is new" in text, f"rank {r} never took its new keypair")
    retired = [int(n) for n in re.findall(r"keys changed: \d+ public key\(s\) admitted anew, (\d+) retired", text)]
    check(sum(retired) >= world, f"rank {r} retired {sum(retired)} old key(s), expected {world}")
print(f"longest step {summary['longestStepSeconds']:.2f} s, accuracy {summary['testAccuracy']:.4f}, "
      f"{summary['wallSeconds']:.1f} s, models agree")
finish()
PY
