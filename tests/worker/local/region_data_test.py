#!/usr/bin/python3
"""Each region's own data is read whole: region sharding in `geotrain local`.

Four regions, two workers each, and different data in each region (npy files
under DIR/<region>: london's and oregon's samples have labels 0-4, tokyo's
and ohio's 5-9, drawn apart, and the four sets have different sizes). With --set dataset.path=DIR/{region}
every worker must read shard localRank of 2 of its own region's copy, so the
two shards of a region add up to all of that region's samples (each sample
in exactly one shard: the shards are strided, every 2nd sample from the
worker's local index on). The same run with dataset.sharding=job (the split
that took a quarter of each region's copy and never read the rest) must
fail the check, and the job's model must have learned every region's classes.

Usage: region_data_test.py GEOTRAIN_BINARY
Exit 77 (skipped) without Debian's python3-numpy.
"""
import json
import os
import re
import subprocess
import sys
import tempfile

try:
    import numpy as np
except ImportError as e:
    print(f"skipped: {e} (apt-get install python3-numpy)")
    sys.exit(77)

GEOTRAIN = sys.argv[1]
# Each region's own data: samples, first label, seed.
REGIONS = {"london": (1200, 0, 1), "tokyo": (1000, 5, 2), "oregon": (800, 0, 3),
           "ohio": (600, 5, 4)}
SIZES = {region: n for region, (n, _, _) in REGIONS.items()}
WORKERS = 2 * len(REGIONS)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../support"))
from checks import check, failures, finish  # noqa: E402,F401
import checks  # noqa: E402

checks.verbose = True  # the passes are this test's evidence


def write_region(folder, n, first_label, seed):
    """n samples of 20 features; the label (first_label + 0..4) is which
    feature block is lit, so a model can learn every class it is shown."""
    rng = np.random.default_rng(seed)
    os.makedirs(folder)
    for split, count in (("train", n), ("test", n // 4)):
        labels = rng.integers(0, 5, count)
        x = rng.normal(0, 0.3, (count, 20)).astype("<f4")
        x[np.arange(count), labels * 4 + (first_label // 5)] += 2.0
        np.save(f"{folder}/{split}_x.npy", x)
        np.save(f"{folder}/{split}_y.npy", (labels + first_label).astype("<i8"))


def shards(out):
    """{rank: (region, index, count, samples)} from each worker's first line."""
    found = {}
    for rank in range(WORKERS):
        text = open(os.path.join(out, "logs", f"worker-{rank}.log")).read()
        m = re.search(r"\((\w+)\): .* npy shard (\d+)/(\d+) (.*?) \((\d+) samples in (\S+)\)", text)
        if m:
            found[rank] = (m.group(1), int(m.group(2)), int(m.group(3)), m.group(4),
                           int(m.group(5)), m.group(6))
    return found


def run(data, out, *extra):
    cmd = [GEOTRAIN, "local", "--regions", ",".join(REGIONS), "--workers-per-region", "2",
           "--steps", "200", "--eval-interval", "0", "--set", "dataset.name=npy",
           "--set", f"dataset.path={data}/{{region}}", "--set", "model.classes=10",
           "--set", "training.batchSize=32", "--out", out, *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600)


def per_region_total(found):
    totals = {}
    for region, _, _, _, samples, _ in found.values():
        totals[region] = totals.get(region, 0) + samples
    return totals


with tempfile.TemporaryDirectory(prefix="geo-region-data-") as tmp:
    data = os.path.join(tmp, "data")
    for region, (n, first_label, seed) in REGIONS.items():
        write_region(f"{data}/{region}", n, first_label, seed)

    out = os.path.join(tmp, "region")
    r = run(data, out)
    check(r.returncode == 0, f"the job exits 0 (got {r.returncode}: {r.stderr[-400:]})")
    found = shards(out)
    check(len(found) == WORKERS,
          f"every worker names its shard in its first log line ({len(found)} of {WORKERS})")
    for rank, (region, index, count, of, samples, path) in sorted(found.items()):
        check(count == 2 and index == rank % 2 and of == f"of region {region}'s copy"
              and path == f"{data}/{region}",
              f"rank {rank} reads shard {index}/{count} {of} in {path}")
    totals = per_region_total(found)
    check(totals == SIZES, f"each region's workers read all of its samples: {totals} == {SIZES}")
    if r.returncode == 0:
        summary = json.load(open(os.path.join(out, "summary.json")))
        accuracy = summary["testAccuracy"]
        # Each worker's test split is its own region's (5 classes each): a
        # model that learned only one region's classes would score about 0.5
        # on the other region's workers, so the mean stays near 0.75.
        check(accuracy is not None and accuracy > 0.9,
              f"the job's model learned every region's classes (test accuracy {accuracy})")

    # Without model.classes each region's labels would size its model (5 and
    # 10 classes): refused at start, naming the key.
    out = os.path.join(tmp, "classes")
    r = run(data, out, "--set", "model.classes=0")
    output = r.stdout + r.stderr
    check(r.returncode != 0 and "model.classes: 0 is not allowed with dataset.sharding: region"
          in output, f"regions' own labels without model.classes are refused (exit {r.returncode})")

    # The job's split over the same files: an eighth of each copy per worker,
    # three quarters of each region's samples never read. The check above
    # must fail.
    out = os.path.join(tmp, "job")
    r = run(data, out, "--set", "dataset.sharding=job")
    found = shards(out)
    totals = per_region_total(found)
    check(r.returncode == 0 and totals == {region: n // 4 for region, n in SIZES.items()},
          f"with sharding job a region's workers read a quarter of its samples ({totals})")

finish()
