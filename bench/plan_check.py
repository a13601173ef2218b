#!/usr/bin/env python3
"""Checks `geotrain plan` against measured `geotrain local` runs.

For each job size it runs the same regions twice, each step padded to
--step-time (geotrain local's emulated compute, so that the machine's two
cores shared by up to 16 workers are not what sets the pace): once with
--algorithm none on the lan preset (the step time a worker takes without
any exchange), then with DTS's defaults on the planned links. It gives the first run's step time to
`geotrain plan` and compares the plan's dts K=auto D=auto row with the
second run: steps/s and WAN bytes sent per worker per step, both measured
in the steady part of the run (between --window fractions of the steps,
from progress.csv: the start's connection set-up and warm-up padding and
the final average excluded), and the K and D the workers settled on.
The codec's share of the machine is its cores over the workers.

  bench/plan_check.py --geotrain build/worker/geotrain --sizes 4,8,16 --out runs/plan
  bench/plan_check.py --geotrain build/worker/geotrain --sizes 4x4 --steps 400 --out runs/plan
  bench/plan_check.py --geotrain build/worker/geotrain --sizes 16 --exchange reducescatter \
      --network netns --out runs/plan-rs

--exchange reducescatter runs DTS's reduce-scatter exchange and compares
the plan's "dts K=auto D=auto reducescatter" row.

WAN bytes are the region leaders' (under hierarchical sync only they send
over the WAN), steps/s every worker's.

Prints one table row per size and exits 1 when a figure is off by more
than --tolerance (default 0.15) and --check is given.
"""
import argparse
import csv
import json
import os
import re
import shutil
import subprocess
import sys

WORLD16 = ("virginia,ohio,california,oregon,montreal,saopaulo,ireland,london,paris,frankfurt,"
           "stockholm,mumbai,singapore,tokyo,seoul,sydney").split(",")
# N = 8: every other world16 region, so the links span the globe as at 16.
# "4x4": the world's 4 regions with 4 workers each (hierarchical sync).
SIZES = {
    "4": ("world", None, 1),
    "8": ("world16", ",".join(WORLD16[::2]), 1),
    "16": ("world16", None, 1),
    "4x4": ("world", None, 4),
}


def run_local(geotrain, out, preset, regions, per_region, steps, step_time, network, extra):
    cmd = [geotrain, "local", "--preset", preset, "--steps", str(steps), "--eval-interval", "0",
           "--threads", "1", "--step-time", step_time, "--workers-per-region", str(per_region),
           "--network", network, "--out", out] + extra
    if regions:
        cmd += ["--regions", regions]
    shutil.rmtree(out, ignore_errors=True)  # this script's own run folder, from an earlier run
    print("$", " ".join(cmd), flush=True)
    with open(out + ".log", "w") as log:
        rc = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT)
    if rc != 0:
        sys.exit(f"plan_check: {' '.join(cmd)} exited {rc}; see {out}.log")
    return out


def steady(out, steps, window, per_region):
    """Median over ranks of steps/s, and over the region leaders (the ranks
    that send over the WAN) of WAN bytes sent per step, between the window's
    steps, from progress.csv."""
    lo, hi = int(steps * window[0]), int(steps * window[1])
    by_rank = {}
    with open(os.path.join(out, "progress.csv")) as f:
        for r in csv.DictReader(f):
            if r["event"] != "progress":
                continue
            by_rank.setdefault(r["rank"], []).append(r)
    rates, sent = [], []
    for rows in by_rank.values():
        inside = [r for r in rows if lo <= int(r["step"]) <= hi]
        if len(inside) < 2:
            continue
        a, b = inside[0], inside[-1]
        ds = int(b["step"]) - int(a["step"])
        dt = float(b["wall_seconds"]) - float(a["wall_seconds"])
        rates.append(ds / dt)
        if int(a["rank"]) % per_region == 0:
            sent.append((int(b["wan_sent_bytes"]) - int(a["wan_sent_bytes"])) / ds)
    if not rates or not sent:
        sys.exit(f"plan_check: no progress rows between steps {lo} and {hi} in {out}")
    rates.sort()
    sent.sort()
    return rates[len(rates) // 2], sent[len(sent) // 2]


def settled(out):
    """The K and D rank 0 used last, from its log."""
    k = d = None
    with open(os.path.join(out, "logs", "worker-0.log"), errors="replace") as f:
        for line in f:
            m = (re.search(r"period K = auto \(from (\d+)\)", line) or
                 re.search(r"period K = (\d+)", line))
            if m:
                k = int(m.group(1))
            m = re.search(r"delay D = (\d+)", line)
            if m:
                d = int(m.group(1))
    return k, d


def plan_row(geotrain, preset, regions, per_region, step_seconds, cores_per_worker, algorithm):
    cmd = [geotrain, "plan", "--preset", preset, "--step-time", f"{step_seconds * 1e3:.3f}ms",
           "--cores-per-worker", f"{cores_per_worker:.4f}", "--workers-per-region", str(per_region)]
    if regions:
        cmd += ["--regions", regions]
    text = subprocess.check_output(cmd, text=True)
    for line in text.splitlines():
        cols = line[len(algorithm):].split()
        if line.startswith(algorithm) and cols and cols[0].isdigit():  # not a longer name
            return {"K": int(cols[0]), "D": int(cols[1]), "step_ms": float(cols[2]),
                    "steps_per_s": float(cols[4]), "wan_kb_per_step": float(cols[5])}, text
    sys.exit(f"plan_check: no '{algorithm}' row in:\n{text}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--geotrain", required=True)
    ap.add_argument("--sizes", default="4,8,16",
                    help="jobs: 4, 8 and/or 16 regions of one worker, 4x4 (4 regions x 4 workers)")
    ap.add_argument("--steps", type=int, default=600, help="steps per run")
    ap.add_argument("--step-time", default="25ms", help="each step padded to this")
    ap.add_argument("--network", default="userspace", choices=["userspace", "netns"],
                    help="what carries the WAN (netns: kernel TCP between network namespaces, "
                         "root only)")
    ap.add_argument("--window", default="0.3,0.85", help="fractions of the steps measured")
    ap.add_argument("--tolerance", type=float, default=0.15)
    ap.add_argument("--check", action="store_true", help="exit 1 beyond the tolerance")
    ap.add_argument("--exchange", default="allgather", choices=["allgather", "reducescatter"],
                    help="DTS's exchange in the measured runs (sync.exchange)")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    window = tuple(float(x) for x in a.window.split(","))
    results, bad = [], []
    for n in a.sizes.split(","):
        if n not in SIZES:
            sys.exit(f"plan_check: --sizes {n} (allowed: {', '.join(SIZES)})")
        preset, regions, per_region = SIZES[n]
        workers = (16 if preset == "world16" and not regions else
                   len(regions.split(",")) if regions else 4) * per_region
        steps = a.steps
        base = run_local(a.geotrain, os.path.join(a.out, f"n{n}-none"), "lan",
                         regions if regions else (",".join(WORLD16) if preset == "world16" else None),
                         per_region, steps, a.step_time, a.network, ["--algorithm", "none"])
        base_rate, _ = steady(base, steps, window, per_region)
        real = run_local(a.geotrain, os.path.join(a.out, f"n{n}-dts"), preset, regions,
                         per_region, steps, a.step_time, a.network, ["--exchange", a.exchange])
        rate, sent = steady(real, steps, window, per_region)
        k, d = settled(real)
        # The workers share this machine's cores, as the codec's work does.
        cores = min(1.0, (os.cpu_count() or 1) / workers)
        predicted, text = plan_row(a.geotrain, preset, regions, per_region, 1.0 / base_rate,
                                   cores, "dts K=auto D=auto" +
                                   (" reducescatter" if a.exchange == "reducescatter" else ""))
        with open(os.path.join(a.out, f"n{n}-plan.txt"), "w") as f:
            f.write(text)
        row = {"regions": n, "step_ms_alone": 1e3 / base_rate,
               "steps_per_s": rate, "planned_steps_per_s": predicted["steps_per_s"],
               "wan_kb_per_step": sent / 1e3, "planned_wan_kb_per_step": predicted["wan_kb_per_step"],
               "K": k, "planned_K": predicted["K"], "D": d, "planned_D": predicted["D"]}
        results.append(row)
        for what in ("steps_per_s", "wan_kb_per_step"):
            err = row["planned_" + what] / row[what] - 1
            row[what + "_error"] = err
            if abs(err) > a.tolerance:
                bad.append(f"{n} regions: {what} planned {row['planned_' + what]:.1f}, "
                           f"measured {row[what]:.1f} ({err:+.0%})")
    print("\n| regions | step alone | steps/s measured | planned | WAN KB/step measured | planned "
          "| K measured, planned | D measured, planned |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['regions']} | {r['step_ms_alone']:.2f} ms | {r['steps_per_s']:.1f} | "
              f"{r['planned_steps_per_s']:.1f} ({r['steps_per_s_error']:+.0%}) | "
              f"{r['wan_kb_per_step']:.1f} | {r['planned_wan_kb_per_step']:.1f} "
              f"({r['wan_kb_per_step_error']:+.0%}) | {r['K']}, {r['planned_K']} | "
              f"{r['D']}, {r['planned_D']} |")
    with open(os.path.join(a.out, "plan_check.json"), "w") as f:
        json.dump(results, f, indent=1)
    for b in bad:
        print("OFF:", b)
    return 1 if bad and a.check else 0


if __name__ == "__main__":
    sys.exit(main())
