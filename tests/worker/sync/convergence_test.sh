#!/usr/bin/env bash
# Convergence of the WAN algorithms against the allreduce baseline, with real
# `geotrain local` runs (4 geotrain-worker processes in 2 regions, CURVE over
# loopback, Fashion-MNIST, mlp, 1000 steps of 64 samples per worker):
#   allreduce fp32                       (its result does not depend on the
#                                         links: synchronous SGD computes the
#                                         same thing at any latency, so it runs
#                                         on the lan preset to save minutes)
#   dts K = 4, D = 2, qsgd 4-bit         over an emulated 200 ms RTT
#   swarm H = 4, qsgd 4-bit              over an emulated 200 ms RTT
# Each must end above 85% (docs/architecture.md section 3's reference
# simulation of the same rules reaches 87.5-87.7% for all three) and near
# allreduce's test accuracy (the final, averaged model): dts within 1 point,
# swarm within 1.5. Allreduce and dts give the same figure run after run;
# swarm's pairs form in the order requests arrive, so its figure spreads:
# eight runs on a 2-core VM ended at 86.77-87.39% (mean 87.1%) against
# allreduce's 87.79%, the lowest 1.02 points below, so a 1-point bound fails
# about one run in eight with nothing wrong.
# Usage: convergence_test.sh GEOTRAIN
set -uo pipefail
geotrain="$1"
source "$(dirname "$0")/test_prologue.sh"
fail_lines=30
common=(--regions london,tokyo --workers-per-region 2 --hierarchical false --model mlp
        --steps 1000 --eval-interval 500 --threads 1)

accuracy() {
  python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["testAccuracy"])' \
    "$work/$1/summary.json"
}

run allreduce --preset lan --algorithm allreduce --codec identity || fail "allreduce failed"
run dts --rtt london-tokyo=200ms --uplink none --algorithm dts --period 4 --delay 2 \
  --codec qsgd --bits 4 || fail "dts failed"
run swarm --rtt london-tokyo=200ms --uplink none --algorithm swarm --swarm-h 4 \
  --codec qsgd --bits 4 || fail "swarm failed"
allreduce=$(accuracy allreduce)
dts=$(accuracy dts)
swarm=$(accuracy swarm)
echo "test accuracy after 1000 steps: allreduce fp32 $allreduce, dts K4 D2 qsgd-4 $dts, swarm H4 qsgd-4 $swarm"
python3 - "$allreduce" "$dts" "$swarm" <<'PY'
import sys
allreduce, dts, swarm = map(float, sys.argv[1:])
ok = True
for name, acc in (("allreduce", allreduce), ("dts", dts), ("swarm", swarm)):
    if acc < 0.85:
        print(f"FAIL: {name} reached {acc:.4f}, below 0.85"); ok = False
for name, acc, points in (("dts", dts, 1.0), ("swarm", swarm, 1.5)):
    if acc < allreduce - points / 100:
        print(f"FAIL: {name} {acc:.4f} is more than {points:g} point(s) below allreduce {allreduce:.4f}")
        ok = False
sys.exit(0 if ok else 1)
PY
