#!/usr/bin/env python3
"""Sixteen regions, short: `geotrain local --preset world16` runs 16 real
workers (one per region, the world16 round trips, 100 Mbit/s uplinks, DTS
with its defaults) for 150 steps on this machine, and the job ends as a
4-region one does: every worker exits 0, all hold the same final model,
none waited for a round time-out, and the model learned. 16 x 1 shares the
machine's cores 16 ways (docs/wan-emulation.md, "Sixteen regions"), so
the steps are slow and the accuracy bound is loose: this checks the job's
end-to-end behaviour at 16 regions, not its speed.

Then the same with DTS's reduce-scatter exchange (sync.exchange) and
K = 16 on a wider mlp (0.8M parameters, so that the pings are a small
part of the bytes): the same end, and the WAN bytes each region sends a
round, measured between 30% and 85% of the steps, at most 2.2 times the
round's payload (all-gather sends 15 times it).

Usage: sixteen_regions_test.py GEOTRAIN
"""

import csv

import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "support"))
from checks import check, finish  # noqa: E402

REGIONS = 16
STEPS = 150


def run(geotrain, work, name, extra):
    """One 16-region run; its summary and folder (None where it failed)."""
    out = os.path.join(work, name)
    started = time.monotonic()
    done = subprocess.run([geotrain, "local", "--preset", "world16", "--model", "mlp",
                           "--threads", "1", "--steps", str(STEPS), "--eval-interval", "0",
                           "--out", out] + extra, capture_output=True, text=True, timeout=600)
    took = time.monotonic() - started
    if not check(done.returncode == 0, f"{name}: geotrain local exited {done.returncode}"):
        print(done.stdout[-3000:], done.stderr[-3000:])
        return None, out
    summary = json.load(open(os.path.join(out, "summary.json")))
    check(summary["outcome"] == "succeeded", f"{name}: outcome {summary['outcome']}")
    check(len(summary["regions"]) == REGIONS,
          f"{name}: {len(summary['regions'])} regions in the summary, expected {REGIONS}")
    check(summary["steps"] == STEPS, f"{name}: the slowest worker took {summary['steps']} steps")
    check(summary["modelsAgree"] is True, f"{name}: the final models differ")
    check(summary["missing"] == 0, f"{name}: {summary['missing']} contribution(s) missed")
    # A round time-out is 60 s: one would show as a wait of that size.
    check(summary["waitSeconds"] < 30,
          f"{name}: a worker waited {summary['waitSeconds']:.1f} s for its peers")
    check(summary["testAccuracy"] >= 0.75, f"{name}: test accuracy {summary['testAccuracy']:.4f}")
    print(f"{name}: 16 regions x 1 worker, {STEPS} steps: {took:.1f} s, "
          f"{summary['stepsPerSecond']:.1f} steps/s, longest wait {summary['waitSeconds']:.2f} s, "
          f"test accuracy {summary['testAccuracy']:.4f}, WAN {summary['wanBytes'] / 1e6:.0f} MB, "
          f"final models {'identical' if summary['modelsAgree'] else 'different'}")
    return summary, out


def qsgd_payload(sizes, bits=4, bucket=512, small=10000):
    """A round's encoded bytes (the worker's FlatCodec layout): tensors under
    the small-tensor threshold as fp32, the others one 4-byte scale a bucket
    and `bits` a value."""
    return sum(4 * n if n < small else 4 * -(-n // bucket) + -(-n * bits // 8) for n in sizes)


def wan_bytes_per_step(out, lo, hi):
    """Median over the workers of WAN bytes sent per step between steps lo and hi."""
    rows = {}
    with open(os.path.join(out, "progress.csv")) as f:
        for r in csv.DictReader(f):
            if r["event"] == "progress":
                rows.setdefault(r["rank"], []).append(r)
    rates = []
    for mine in rows.values():
        inside = [r for r in mine if lo <= int(r["step"]) <= hi]
        if len(inside) >= 2:
            a, b = inside[0], inside[-1]
            rates.append((int(b["wan_sent_bytes"]) - int(a["wan_sent_bytes"])) /
                         (int(b["step"]) - int(a["step"])))
    rates.sort()
    return rates[len(rates) // 2] if rates else None


def main():
    geotrain = sys.argv[1]
    with tempfile.TemporaryDirectory() as work:
        run(geotrain, work, "allgather", [])
        width, period = 1024, 16
        summary, out = run(geotrain, work, "reducescatter",
                           ["--exchange", "reducescatter", "--period", str(period),
                            "--set", f"model.width={width}",
                            # A progress row every round: a window of whole rounds.
                            "--set", f"training.logInterval={period}"])
        if summary is not None:
            payload = qsgd_payload([784 * width, width, 10 * width, 10])
            per_step = wan_bytes_per_step(out, int(STEPS * 0.3), int(STEPS * 0.85))
            if check(per_step is not None, "reducescatter: no progress rows to measure"):
                per_round = per_step * period
                print(f"reducescatter: WAN bytes a region sends a round {per_round / 1e3:.0f} KB, "
                      f"{per_round / payload:.2f} x the payload of {payload / 1e3:.0f} KB "
                      f"(all-gather: 15 x)")
                check(per_round <= 2.2 * payload,
                      f"reducescatter: {per_round / payload:.2f} x the payload a round (at most 2.2)")
    finish()


if __name__ == "__main__":
    main()
