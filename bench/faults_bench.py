#!/usr/bin/env python3
"""What a fault costs a geo-distributed job: `geotrain local` runs on the world
preset (four regions, 50-230 ms round trips, 100 Mbit/s uplinks), mlp on
Fashion-MNIST, each scenario next to the same run without a fault.

Scenarios (4 regions x 1 worker unless said; dts K = 4, D = auto, qsgd-4):
  dts  kill      tokyo SIGKILLed at --at, started again --down later
  dts  partition tokyo cut off from the others for --partition seconds
  swarm kill     H = 4, the same kill
  hier member    2 regions x 2 workers, dts; a member of tokyo killed
  allreduce kill the survivors fail fast, naming tokyo (time to fail)

Columns:
  stall        the longest step of the workers outside the fault's region
  during       their steps/s between the fault and its end (restart or
               heal), against the fault-free run's steps/s
  rejoin       from the restart to holding the job's model and step
  skew         the fault's region finished this much after the others
  accuracy     final test accuracy (fault-free in brackets)
  transfer     state-transfer bytes received by the restarted worker
  agree        every worker that finished holds the same final model bytes

Usage: bench/faults_bench.py [--geotrain build/worker/geotrain] [--steps 3000]
       [--at 15] [--down 10] [--partition 30] [--only dts-kill,...]
       [--network userspace|netns] [--dts-defaults]
--network netns: kernel TCP between network namespaces, the WAN emulated
below TCP (geotrain local --network netns; needs root). --dts-defaults: dts
with K and D auto (the default) instead of K = 4.
"""

import argparse
import csv
import json
import os
import re
import subprocess
import sys
import tempfile
import time


def run(geotrain, out, args):
    t0 = time.time()
    p = subprocess.run([geotrain, "local", "--out", out] + args, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
    summary = json.load(open(os.path.join(out, "summary.json")))
    return p.returncode, summary, time.time() - t0, p.stdout


def rate_between(out, ranks, start, end):
    """Mean steps/s of `ranks` between launcher times start and end, from the
    progress CSV (linear between the rows around each bound)."""
    rows = {}
    with open(os.path.join(out, "progress.csv")) as f:
        for r in csv.DictReader(f):
            rows.setdefault(int(r["rank"]), []).append((float(r["wall_seconds"]), int(r["step"])))

    def step_at(points, t):
        before = [p for p in points if p[0] <= t]
        after = [p for p in points if p[0] >= t]
        if not before or not after:
            return None
        (t0, s0), (t1, s1) = before[-1], after[0]
        return s0 if t1 == t0 else s0 + (s1 - s0) * (t - t0) / (t1 - t0)

    rates = []
    for rank in ranks:
        pts = sorted(rows.get(rank, []))
        a, b = step_at(pts, start), step_at(pts, end)
        if a is not None and b is not None and end > start:
            rates.append((b - a) / (end - start))
    return min(rates) if rates else None


def transfer_bytes(out, rank):
    log = open(os.path.join(out, "logs", f"worker-{rank}.log")).read()
    m = re.findall(r"took the model of .*?\(([\d.]+) MB", log)
    return float(m[-1]) * 1e6 if m else None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--geotrain", default="build/worker/geotrain")
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--at", type=float, default=15)
    ap.add_argument("--down", type=float, default=10)
    ap.add_argument("--partition", type=float, default=30)
    ap.add_argument("--only", default="")
    ap.add_argument("--network", default="userspace", choices=["userspace", "netns"])
    ap.add_argument("--dts-defaults", action="store_true")
    a = ap.parse_args()
    if not os.access(a.geotrain, os.X_OK):
        sys.exit(f"faults_bench: {a.geotrain} is not an executable (build the geotrain target)")
    work = tempfile.mkdtemp(prefix="geotrain-faults-")
    common = ["--preset", "world", "--model", "mlp", "--eval-interval", "0", "--steps",
              str(a.steps), "--codec", "qsgd", "--bits", "4", "--set", "training.logInterval=10",
              "--set", f"checkpoint.dir={work}/ckpt-SCENARIO", "--set", "checkpoint.interval=100",
              "--network", a.network]
    dts = ["--algorithm", "dts", "--period", "auto" if a.dts_defaults else "4", "--delay", "auto"]
    kill = ["--kill", f"tokyo@{a.at:g}s", "--restart-after", f"{a.down:g}s"]
    scenarios = [
        ("dts kill", "dts", dts, kill, [1], False),
        ("dts partition", "dts", dts, ["--partition", f"tokyo@{a.at:g}s+{a.partition:g}s"], [1], False),
        ("swarm kill", "swarm", ["--algorithm", "swarm", "--swarm-h", "4"], kill, [1], False),
        ("hier member kill", "hier", dts + ["--regions", "london,tokyo", "--workers-per-region", "2"],
         ["--kill", f"tokyo:1@{a.at:g}s", "--restart-after", f"{a.down:g}s"], [3], True),
    ]
    only = set(a.only.split(",")) if a.only else None
    baselines = {}
    rows = []
    for name, base, algo, fault, killed, hier in scenarios:
        key = name.replace(" ", "-")
        if only and key not in only:
            continue
        if base not in baselines:
            out = os.path.join(work, f"{base}-clean")
            args = common + algo
            args = [x.replace("SCENARIO", f"{base}-clean") for x in args]
            rc, s, secs, _ = run(a.geotrain, out, args)
            baselines[base] = s
            print(f"# {base} without faults: {secs:.0f} s, {s['stepsPerSecond']:.1f} steps/s, "
                  f"accuracy {s['testAccuracy']:.4f}", flush=True)
        clean = baselines[base]
        out = os.path.join(work, key)
        args = [x.replace("SCENARIO", key) for x in common + algo + fault]
        rc, s, secs, text = run(a.geotrain, out, args)
        f = s["faults"][0] if s["faults"] else {}
        end = f.get("endSeconds")
        world = 4
        region_ranks = {1} if not hier else {2, 3}
        others = [r for r in range(world) if r not in region_ranks]
        during = rate_between(out, others, f.get("atSeconds", 0), end) if end else None
        ratio = during / clean["stepsPerSecond"] if during and clean["stepsPerSecond"] else None
        tb = transfer_bytes(out, killed[0]) if "kill" in name else None
        rows.append((name, rc, f.get("othersStallSeconds"), ratio, f.get("rejoinSeconds"),
                     f.get("finishSkewSeconds"), s["testAccuracy"], clean["testAccuracy"], tb,
                     s["modelsAgree"]))
        print(f"# {name}: {secs:.0f} s, outcome {s['outcome']}", flush=True)

    if not only or "allreduce-kill" in only:
        out = os.path.join(work, "allreduce-kill")
        args = [x.replace("SCENARIO", "allreduce-kill") for x in common] + [
            "--algorithm", "allreduce", "--codec", "identity", "--timeout-seconds", "5", "--kill",
            f"tokyo@{a.at:g}s"]
        rc, s, secs, text = run(a.geotrain, out, args)
        named = "rank 1 (tokyo)" in text
        print(f"# allreduce kill: exit {rc} after {secs:.0f} s (kill at {a.at:g} s, "
              f"--timeout-seconds 5); the failure names tokyo: {named}")

    fmt = lambda v, f="{:.1f}": "-" if v is None else f.format(v)
    print()
    print("| scenario | stall (s) | survivors' steps/s while down | time to contribute again (s) "
          "| finish skew (s) | final accuracy (fault-free) | state transfer | same final bytes |")
    print("|---|---|---|---|---|---|---|---|")
    for name, rc, stall, ratio, rejoin, skew, acc, clean, tb, agree in rows:
        print(f"| {name} | {fmt(stall)} | {fmt(ratio and ratio * 100, '{:.0f}%')} | {fmt(rejoin)} "
              f"| {fmt(skew)} | {fmt(acc and acc * 100, '{:.1f}%')} ({fmt(clean * 100, '{:.1f}%')}) "
              f"| {fmt(tb and tb / 1e6, '{:.2f} MB')} | {'yes' if agree else 'NO'} |")
    print(f"\n(runs in {work})")


if __name__ == "__main__":
    main()
