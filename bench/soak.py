#!/usr/bin/env python3
"""A churn soak: one long `geotrain local` job under a stream of faults.

Eight workers in four regions (the world preset: 50-230 ms round trips,
100 Mbit/s uplinks; two workers per region, hierarchical DTS with its
defaults), mlp on Fashion-MNIST, steps of at least --step-time, for about
--minutes. Every 10-60 s (--every) a fault drawn from a seeded generator
(--seed: the same seed gives the same schedule, so a failing one can be
replayed) hits a random worker or region:
  kill       SIGKILL a worker; it is started again --restart-after later
             (a leader's members fail with it and are restarted too)
  partition  cut a region off from the others for 5-20 s
  throttle   a region's uplink drops to 10 Mbit/s for 10-30 s
No fault starts in the last 30 s, so that whoever is alive at the end
takes part in the final average. Then the same job without faults, for
the reference accuracy.

It runs on the namespace network (--network netns: kernel TCP between
network namespaces) where it is root, and on the user-space emulation
otherwise. While the job runs it samples every worker process's resident
memory (VmRSS) and open file descriptors once a second.

Report (printed, and written to OUT/soak.json):
  faults           injected, by kind
  longest stall    the longest step of any worker outside the fault's
                   region, over all faults
  rejoin           per restart, from the restart to contributing again
  agree            every worker alive at the end holds the same final bytes
  accuracy         final test accuracy against the fault-free run's
  rss, fds         per process at its start (5 s in) and its end: no growth
                   across restarts

Exit status 1 when a check fails: the job does not succeed, the final
models differ, a stall exceeds --max-stall seconds, the accuracy falls more
than --max-accuracy-drop below the reference, or a process that lived at
least a minute grew its descriptors by more than 16 or its RSS by more than
half (plus 64 MB).

Usage: bench/soak.py [--geotrain build/worker/geotrain] [--minutes 30]
       [--seed 1] [--network auto|netns|userspace] [--out DIR]
"""

import argparse
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

REGIONS = ["london", "tokyo", "oregon", "ohio"]
PER_REGION = 2


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--geotrain", default="build/worker/geotrain",
                   help="the geotrain binary (default: %(default)s)")
    p.add_argument("--minutes", type=float, default=30,
                   help="length of the faulted run, about (default: %(default)s)")
    p.add_argument("--seed", type=int, default=1, help="fault schedule seed (default: 1)")
    p.add_argument("--every", default="10,60",
                   help="seconds between faults, drawn uniformly from MIN,MAX (default: 10,60)")
    p.add_argument("--restart-after", type=float, default=5,
                   help="seconds from a kill to the restart (default: %(default)s)")
    p.add_argument("--step-time", type=float, default=0.05,
                   help="seconds a step lasts at least (default: %(default)s)")
    p.add_argument("--network", choices=["auto", "netns", "userspace"], default="auto",
                   help="auto: netns as root, else userspace (default: auto)")
    p.add_argument("--max-stall", type=float, default=10,
                   help="the longest stall allowed, seconds (default: %(default)s)")
    p.add_argument("--max-accuracy-drop", type=float, default=0.03,
                   help="below the fault-free run's accuracy (default: %(default)s)")
    p.add_argument("--out", help="folder for both runs and soak.json (default: a temporary "
                   "one, removed when the soak passes)")
    a = p.parse_args()
    try:
        lo, hi = (float(v) for v in a.every.split(","))
        if not 0 < lo <= hi:
            raise ValueError
    except ValueError:
        p.error(f"--every {a.every!r}: expected MIN,MAX seconds with 0 < MIN <= MAX")
    a.every = (lo, hi)
    if a.minutes <= 0:
        p.error(f"--minutes {a.minutes}: must be positive")
    if a.network == "auto":
        a.network = "netns" if os.geteuid() == 0 else "userspace"
    if a.network == "netns" and os.geteuid() != 0:
        p.error("--network netns needs root (network namespaces and TUN devices)")
    return a


def schedule(seed, seconds, every, restart_after):
    """The faults, as geotrain local flags, and a readable list of them."""
    rng = random.Random(seed)
    flags, plan = [], []
    busy_until = {}  # a worker or region: when its last fault is over
    t = rng.uniform(*every)
    while t < seconds - 30:
        kind = rng.choice(["kill", "kill", "partition", "throttle"])
        region = rng.choice(REGIONS)
        if kind == "kill":
            index = rng.randrange(PER_REGION)
            target = f"{region}:{index}"
            # Down, restarted, rejoined (with a margin) before it is hit again.
            if busy_until.get(target, 0) <= t and busy_until.get(region, 0) <= t:
                flags += ["--kill", f"{target}@{t:.1f}s"]
                plan.append({"at": round(t, 1), "kind": "kill", "what": target})
                busy_until[target] = t + restart_after + 20
        elif busy_until.get(region, 0) <= t:
            length = rng.uniform(5, 20) if kind == "partition" else rng.uniform(10, 30)
            length = min(length, seconds - 30 - t)
            if kind == "partition":
                flags += ["--partition", f"{region}@{t:.1f}s+{length:.1f}s"]
            else:
                flags += ["--throttle", f"{region}@{t:.1f}s=10mbit",
                          "--throttle", f"{region}@{t + length:.1f}s=100mbit"]
            plan.append({"at": round(t, 1), "kind": kind, "what": region,
                         "seconds": round(length, 1)})
            busy_until[region] = t + length + 5
        t += rng.uniform(*every)
    return flags, plan


class Sampler(threading.Thread):
    """Every second: VmRSS and open descriptors of each geotrain-worker whose
    command line names a config in `run`."""

    def __init__(self, run):
        super().__init__(daemon=True)
        self.run_dir = run
        self.stop = threading.Event()
        self.procs = {}  # pid -> {"rank", "first", "warm", "last"}

    def sample(self):
        now = time.monotonic()
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                cmd = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
                if not cmd or not cmd[0].endswith(b"geotrain-worker"):
                    continue
                line = b" ".join(cmd).decode(errors="replace")
                m = re.search(re.escape(self.run_dir) + r"/worker-(\d+)\.yaml", line)
                if not m:
                    continue
                rss = 0
                for status in open(f"/proc/{pid}/status"):
                    if status.startswith("VmRSS:"):
                        rss = int(status.split()[1]) * 1024
                fds = len(os.listdir(f"/proc/{pid}/fd"))
            except (FileNotFoundError, ProcessLookupError, PermissionError):
                continue
            p = self.procs.setdefault(int(pid), {"rank": int(m.group(1)), "start": now})
            point = {"t": round(now - p["start"], 1), "rss": rss, "fds": fds}
            # The "start" figures: 5 s in (its data loaded and its peers
            # connected), the first sample where it died sooner.
            if "warm" not in p or p["warm"]["t"] < 5:
                p["warm"] = point
            p["last"] = point

    def run(self):
        while not self.stop.is_set():
            self.sample()
            self.stop.wait(1.0)


def run_job(args, out, steps, extra, sample):
    cmd = [args.geotrain, "local", "--network", args.network, "--preset", "world",
           "--regions", ",".join(REGIONS), "--workers-per-region", str(PER_REGION),
           "--model", "mlp", "--steps", str(steps), "--eval-interval", "0", "--threads", "1",
           "--step-time", f"{int(args.step_time * 1000)}ms",
           "--set", "training.logInterval=200",
           "--set", f"checkpoint.dir={out}-ckpt", "--set", "checkpoint.interval=200",
           "--out", out, *extra]
    sampler = Sampler(out) if sample else None
    if sampler:
        sampler.start()
    started = time.monotonic()
    with open(out + ".log", "w") as log:
        rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT).returncode
    if sampler:
        sampler.stop.set()
        sampler.join()
    summary = None
    try:
        summary = json.load(open(os.path.join(out, "summary.json")))
    except (OSError, ValueError):
        pass
    return rc, summary, time.monotonic() - started, sampler.procs if sampler else {}


def main():
    args = parse_args()
    out = args.out or tempfile.mkdtemp(prefix="geo-soak-")
    os.makedirs(out, exist_ok=True)
    seconds = args.minutes * 60
    # 8 workers on few cores step slower than --step-time; the run is as long
    # as its steps take, about --minutes where the machine keeps up.
    steps = max(400, int(seconds / args.step_time))
    flags, plan = schedule(args.seed, seconds, args.every, args.restart_after)
    flags += ["--restart-after", f"{args.restart_after:g}s"]
    print(f"soak: {args.network} network, {len(REGIONS)} regions x {PER_REGION} workers, "
          f"{steps} steps of >= {args.step_time * 1000:.0f} ms, seed {args.seed}: "
          f"{len(plan)} faults", flush=True)
    for f in plan:
        print(f"  {f['at']:7.1f} s  {f['kind']:9s} {f['what']}"
              + (f" for {f['seconds']} s" if "seconds" in f else ""), flush=True)

    rc, summary, wall, procs = run_job(args, os.path.join(out, "faults"), steps, flags, True)
    print(f"faulted run: exit {rc}, {wall:.0f} s", flush=True)
    rc_ref, reference, wall_ref, _ = run_job(args, os.path.join(out, "reference"), steps, [],
                                             False)
    print(f"fault-free run: exit {rc_ref}, {wall_ref:.0f} s", flush=True)

    problems = []
    report = {"seed": args.seed, "network": args.network, "steps": steps, "plan": plan,
              "wallSeconds": round(wall, 1)}
    if summary is None:
        problems.append(f"the faulted run wrote no summary (exit {rc}; see {out}/faults.log)")
    else:
        faults = summary.get("faults", [])
        kinds = {}
        for f in plan:
            kinds[f["kind"]] = kinds.get(f["kind"], 0) + 1
        stalls = [f["othersStallSeconds"] for f in faults if f.get("othersStallSeconds") is not None]
        rejoins = [f["rejoinSeconds"] for f in faults
                   if f["kind"] == "kill" and f.get("rejoinSeconds") is not None]
        report.update({
            "outcome": summary["outcome"], "faults": kinds,
            "longestStallSeconds": max(stalls) if stalls else None,
            "rejoinSeconds": [round(r, 2) for r in rejoins],
            "modelsAgree": summary["modelsAgree"],
            "testAccuracy": summary["testAccuracy"],
            "referenceAccuracy": reference["testAccuracy"] if reference else None,
        })
        if rc != 0 or summary["outcome"] != "succeeded":
            problems.append(f"the faulted job did not succeed (exit {rc}, {summary['outcome']})")
        if summary["modelsAgree"] is not True:
            problems.append(f"final models agree: {summary['modelsAgree']}")
        if stalls and max(stalls) > args.max_stall:
            problems.append(f"a stall of {max(stalls):.1f} s (limit {args.max_stall:g} s)")
        kills = sum(1 for f in plan if f["kind"] == "kill")
        if len(rejoins) < kills:
            problems.append(f"{kills - len(rejoins)} of {kills} killed workers never contributed "
                            "again")
        if reference is None or rc_ref != 0:
            problems.append(f"the fault-free run failed (exit {rc_ref})")
        elif summary["testAccuracy"] is None or \
                summary["testAccuracy"] < reference["testAccuracy"] - args.max_accuracy_drop:
            problems.append(f"accuracy {summary['testAccuracy']} against the fault-free "
                            f"{reference['testAccuracy']}")
    processes = []
    for pid, p in sorted(procs.items(), key=lambda kv: (kv[1]["rank"], kv[1]["start"])):
        warm, last = p["warm"], p["last"]
        processes.append({"rank": p["rank"], "pid": pid, "seconds": last["t"],
                          "rssStartMB": round(warm["rss"] / 1e6, 1),
                          "rssEndMB": round(last["rss"] / 1e6, 1),
                          "fdsStart": warm["fds"], "fdsEnd": last["fds"]})
        if last["t"] >= 60 and (last["fds"] > warm["fds"] + 16 or
                                last["rss"] > 1.5 * warm["rss"] + 64e6):
            problems.append(f"rank {p['rank']} (pid {pid}) grew from {warm['fds']} descriptors "
                            f"and {warm['rss'] / 1e6:.0f} MB to {last['fds']} and "
                            f"{last['rss'] / 1e6:.0f} MB in {last['t']:.0f} s")
    report["processes"] = processes
    report["problems"] = problems
    with open(os.path.join(out, "soak.json"), "w") as f:
        json.dump(report, f, indent=2)

    print(f"faults injected   {report.get('faults')}")
    print(f"longest stall     {report.get('longestStallSeconds')} s (others' longest step)")
    print(f"rejoin            {report.get('rejoinSeconds')} s after each restart")
    print(f"final models      {'identical' if report.get('modelsAgree') else 'DIFFER'}")
    print(f"accuracy          {report.get('testAccuracy')} (fault-free "
          f"{report.get('referenceAccuracy')})")
    print("processes         rank pid seconds rss MB (start -> end) fds (start -> end)")
    for p in processes:
        print(f"                  {p['rank']:4d} {p['pid']:6d} {p['seconds']:7.0f} "
              f"{p['rssStartMB']:7.1f} -> {p['rssEndMB']:7.1f} {p['fdsStart']:4d} -> "
              f"{p['fdsEnd']:4d}")
    print(f"report            {out}/soak.json" + ("" if args.out else " (removed if it passes)"))
    if problems:
        print("soak: FAILED: " + "; ".join(problems))
        print(f"(the runs are kept in {out})")
        return 1
    print("soak: ok")
    if not args.out:
        shutil.rmtree(out, ignore_errors=True)  # a temporary folder of a passing soak
    return 0


if __name__ == "__main__":
    sys.exit(main())
