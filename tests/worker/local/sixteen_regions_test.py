#!/usr/bin/env python3
"""Sixteen regions, short: `geotrain local --preset world16` runs 16 real
workers (one per region, the world16 round trips, 100 Mbit/s uplinks, DTS
with its defaults) for 150 steps on this machine, and the job ends as a
4-region one does: every worker exits 0, all hold the same final model,
none waited for a round time-out, and the model learned. 16 x 1 shares the
machine's cores 16 ways (docs/wan-emulation.md, "Sixteen regions"), so
the steps are slow and the accuracy bound is loose: this checks the job's
end-to-end behaviour at 16 regions, not its speed.

Usage: sixteen_regions_test.py GEOTRAIN
"""

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


def main():
    geotrain = sys.argv[1]
    with tempfile.TemporaryDirectory() as work:
        out = os.path.join(work, "run")
        started = time.monotonic()
        run = subprocess.run([geotrain, "local", "--preset", "world16", "--model", "mlp",
                              "--threads", "1", "--steps", str(STEPS), "--eval-interval", "0",
                              "--out", out], capture_output=True, text=True, timeout=600)
        took = time.monotonic() - started
        if not check(run.returncode == 0, f"geotrain local exited {run.returncode}"):
            print(run.stdout[-3000:], run.stderr[-3000:])
            finish()
        summary = json.load(open(os.path.join(out, "summary.json")))
        check(summary["outcome"] == "succeeded", f"outcome {summary['outcome']}")
        check(len(summary["regions"]) == REGIONS,
              f"{len(summary['regions'])} regions in the summary, expected {REGIONS}")
        check(summary["steps"] == STEPS, f"the slowest worker took {summary['steps']} steps")
        check(summary["modelsAgree"] is True, "the final models differ")
        check(summary["missing"] == 0, f"{summary['missing']} contribution(s) missed")
        # A round time-out is 60 s: one would show as a wait of that size.
        check(summary["waitSeconds"] < 30,
              f"a worker waited {summary['waitSeconds']:.1f} s for its peers")
        check(summary["testAccuracy"] >= 0.75, f"test accuracy {summary['testAccuracy']:.4f}")
        print(f"16 regions x 1 worker, {STEPS} steps: {took:.1f} s, "
              f"{summary['stepsPerSecond']:.1f} steps/s, longest wait {summary['waitSeconds']:.2f} s, "
              f"test accuracy {summary['testAccuracy']:.4f}, WAN {summary['wanBytes'] / 1e6:.0f} MB, "
              f"final models {'identical' if summary['modelsAgree'] else 'different'}")
    finish()


if __name__ == "__main__":
    main()
