#!/usr/bin/python3
"""Scrapes the /metrics endpoints of a running two-region `geotrain local` run.

Checks, against a real run (two geotrain-worker processes, DTS K=4 D=2 with
qsgd-4 over an emulated 40 ms WAN, the built-in mlp on Fashion-MNIST):

1. the exposition is valid Prometheus text format: parsed by the reference
   Python client's parser (python3-prometheus-client) and held to the format's
   rules that parser lets pass (TYPE before samples, one TYPE per family,
   label syntax, cumulative histogram buckets ending in +Inf = _count);
2. the scrape config written by --prometheus-config lists every worker's port;
3. while training, the compression ratio a dashboard computes,
   rate(payload_bytes_total) / rate(bytes_sent_total{link="wan"}), is within 5%
   of the ratio the codec's wire format gives for this model (docs/architecture.md section 3:
   4 bytes per bucket + b bits per value; tensors under 10000 values as fp32;
   a 64-byte frame header per update);
4. after training (metrics.lingerSeconds keeps the endpoint up), the counters
   equal the totals the worker reported in its `done` event (progress.csv):
   WAN bytes sent and received (the transport's own counts), payload bytes,
   missing contributions, and the staleness histogram's count equals the
   number of applied updates (its mean the reported mean staleness); each
   worker reports geotrain_peer_up for the other one, and every label value
   of the state-transfer and late-update counters;
5. every metric named in a PromQL expression of the Grafana dashboard, and
   every label it selects on, exists in this real scrape;
6. a real Prometheus server (Debian's prometheus), started on the scrape
   config of step 2, scrapes the workers, and every PromQL expression of the
   dashboard evaluates without error and returns data (those on link="lan"
   excepted: this run has one worker per region, so no LAN traffic).

Usage: scrape_local_test.py GEOTRAIN DASHBOARD.json
Exit status 0 when every check passes; otherwise each failure is printed.
"""

import csv
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

from prometheus_client.parser import text_string_to_metric_families
import yaml

STEPS = 400
BATCH = 64
PERIOD = 4
DELAY = 2
BITS = 4
BUCKET = 512
SMALL_TENSOR = 10000  # sync.smallTensorThreshold: smaller tensors travel as fp32
FRAME_HEADER = 64     # worker/transport/frame.h kFrameHeaderBytes
# The built-in mlp for 28x28 inputs and 10 classes: fc1 784x256 + bias, fc2 256x10 + bias.
MLP_TENSORS = [784 * 256, 256, 256 * 10, 10]

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../support"))
from checks import check, failures, finish  # noqa: E402,F401

# The dashboard's Controller row: exported by geotrain-controller, not by
# workers (tests/controller/controller_e2e_test.py checks those).
CONTROLLER_METRICS = {"geotrain_reconcile_total", "geotrain_reconcile_seconds_bucket",
                      "geotrain_jobs", "geotrain_region_reachable"}


def scrape(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return r.read().decode("utf-8")


SAMPLE = re.compile(
    r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(?:[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*"'
    r'(?:,[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*")*,?)?\})? '
    r'(\S+)( -?\d+)?$')


def strict_check(text, where):
    """The text format's rules beyond what the reference parser enforces."""
    typed = {}
    for n, line in enumerate(text.splitlines(), 1):
        if line.startswith("# TYPE "):
            parts = line.split()
            check(len(parts) == 4 and parts[3] in
                  ("counter", "gauge", "histogram", "summary", "untyped"),
                  f"{where}:{n}: bad TYPE line {line!r}")
            check(parts[2] not in typed, f"{where}:{n}: second TYPE for {parts[2]}")
            # Counters end in _total (Prometheus naming; OpenMetrics parsers,
            # this one included, would otherwise rename their samples).
            check(len(parts) < 4 or parts[3] != "counter" or parts[2].endswith("_total"),
                  f"{where}:{n}: counter {parts[2]} does not end in _total")
            typed[parts[2]] = parts[3]
            continue
        if line.startswith("#") or not line:
            continue
        m = SAMPLE.match(line)
        if not check(m is not None, f"{where}:{n}: malformed sample {line!r}"):
            continue
        name = m.group(1)
        family = re.sub(r"_(bucket|count|sum)$", "", name)
        check(name in typed or family in typed,
              f"{where}:{n}: sample {name} before (or without) its TYPE line")
        value = m.group(3)
        try:
            float(value)
        except ValueError:
            check(value in ("NaN", "Nan", "+Inf", "-Inf"), f"{where}:{n}: bad value {value!r}")


def parse(text, where):
    """{name: [(labels, value)]} from the reference parser, after strict checks."""
    strict_check(text, where)
    samples = {}
    families = list(text_string_to_metric_families(text))
    for f in families:
        for s in f.samples:
            samples.setdefault(s.name, []).append((s.labels, s.value))
        if f.type == "histogram":
            series = {}
            for s in f.samples:
                key = tuple(sorted((k, v) for k, v in s.labels.items() if k != "le"))
                series.setdefault(key, {"buckets": [], "count": None})
                if s.name.endswith("_bucket"):
                    series[key]["buckets"].append((float(s.labels["le"]), s.value))
                elif s.name.endswith("_count"):
                    series[key]["count"] = s.value
            for key, h in series.items():
                b = h["buckets"]
                check(b and b[-1][0] == math.inf, f"{where}: {f.name}{key}: no +Inf bucket")
                check(all(b[i][0] < b[i + 1][0] and b[i][1] <= b[i + 1][1]
                          for i in range(len(b) - 1)),
                      f"{where}: {f.name}{key}: buckets not increasing and cumulative")
                check(b and b[-1][1] == h["count"], f"{where}: {f.name}{key}: +Inf != _count")
    return samples


def total(samples, name, **labels):
    return sum(v for l, v in samples.get(name, [])
               if all(l.get(k) == val for k, val in labels.items()))


def encoded_update_bytes():
    encoded = 0
    for n in MLP_TENSORS:
        if n < SMALL_TENSOR:
            encoded += 4 * n
        else:
            encoded += 4 * math.ceil(n / BUCKET) + math.ceil(n * BITS / 8)
    return encoded + FRAME_HEADER


sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from free_ports import free_ports  # noqa: E402  (outside the ephemeral range)


def free_port():
    return free_ports(1)[0]


def start_prometheus(config, out):
    """A Prometheus server on `config`; (process, base URL) once it is ready."""
    port = free_port()
    proc = subprocess.Popen(
        ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={out}/tsdb",
         f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
        stdout=subprocess.DEVNULL, stderr=open(os.path.join(out, "prometheus.log"), "w"))
    url = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            with urllib.request.urlopen(url + "/-/ready", timeout=1) as r:
                if r.status == 200:
                    return proc, url
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("prometheus did not become ready; see " + out + "/prometheus.log")


def promql(url, expr):
    query = urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(f"{url}/api/v1/query?{query}", timeout=10) as r:
        return json.load(r)


def dashboard_exprs(dash):
    exprs = []

    def walk(panels):
        for p in panels:
            exprs.extend(t["expr"] for t in p.get("targets", []) if t.get("expr"))
            walk(p.get("panels", []))

    walk(dash["panels"])
    return exprs


def prometheus_check(url, dashboard, job):
    """Step 6: the dashboard's queries, with its variables filled in, on real data."""
    with open(dashboard) as f:
        exprs = dashboard_exprs(json.load(f))
    # rate() needs two samples in its window: on a loaded machine Prometheus
    # may have started scraping only near the end of training, so wait (the
    # workers linger) until it holds three samples of every worker.
    deadline = time.time() + 25
    while time.time() < deadline:
        r = promql(url, f'count_over_time(geotrain_samples_total{{job="{job}"}}[1m])')
        counts = [float(v["value"][1]) for v in r["data"]["result"]]
        if len(counts) == 2 and min(counts) >= 3:
            break
        time.sleep(1)
    check(len(counts) == 2 and min(counts) >= 3,
          f"prometheus scraped the workers only {counts} times")
    answered = 0
    for e in exprs:
        q = (e.replace("$__rate_interval", "30s").replace("$job", job)
             .replace("$region", ".*"))
        try:
            result = promql(url, q)
        except urllib.error.HTTPError as err:
            check(False, f"prometheus rejects {q}: {err.read().decode()[:300]}")
            continue
        empty = not result["data"]["result"]
        if 'link="lan"' in e or any(m in e for m in CONTROLLER_METRICS):
            continue
        if check(result["status"] == "success" and not empty,
                 f"prometheus: no data for {q}: {json.dumps(result)[:300]}"):
            answered += 1
    print(f"prometheus: {answered} of {len(exprs)} dashboard queries return data "
          f"(the others select LAN traffic or the controller)")


def done_rows(csv_path):
    rows = {}
    if not os.path.exists(csv_path):
        return rows
    with open(csv_path, newline="") as f:
        for row in csv.DictReader(f):
            if row.get("event") == "done":
                rows[int(row["rank"])] = row
    return rows


def dashboard_check(path, samples):
    with open(path) as f:
        dash = json.load(f)
    exprs = dashboard_exprs(dash)
    for v in dash.get("templating", {}).get("list", []):
        q = v.get("query")
        if isinstance(q, dict):
            q = q.get("query")
        if v.get("type") == "query" and q:
            exprs.append(q)
    check(len(exprs) >= 15, f"dashboard has only {len(exprs)} PromQL expressions")
    used = set()
    for e in exprs:
        for name, matchers in re.findall(r"\b(geotrain_[a-zA-Z0-9_]+)(\{[^}]*\})?", e):
            if name in CONTROLLER_METRICS:
                continue
            used.add(name)
            if not check(name in samples, f"dashboard uses {name}, which no worker exports"):
                continue
            labels = set().union(*(l.keys() for l, _ in samples[name]))
            for label in re.findall(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)", matchers):
                check(label in labels, f"dashboard selects {name} on label {label}, "
                                       f"which it does not have ({sorted(labels)})")
        if any(m in e for m in CONTROLLER_METRICS):
            continue
        for by in re.findall(r"\bby\s*\(([^)]*)\)", e):
            for label in (x.strip() for x in by.split(",")):
                check(any(label in l for series in samples.values() for l, _ in series),
                      f"dashboard groups by {label}, which no series has")
    print(f"dashboard: {len(exprs)} expressions over {len(used)} metrics checked")


def main():
    geotrain, dashboard = sys.argv[1], sys.argv[2]
    out = tempfile.mkdtemp(prefix="geo-scrape-")
    prom = os.path.join(out, "prometheus.yml")
    run_dir = os.path.join(out, "run")
    cmd = [geotrain, "local", "--regions", "east,west", "--rtt", "east-west=40ms",
           "--steps", str(STEPS), "--batch-size", str(BATCH), "--algorithm", "dts",
           "--period", str(PERIOD), "--delay", str(DELAY), "--codec", "qsgd",
           "--bits", str(BITS), "--set", f"sync.bucket={BUCKET}", "--eval-interval", "0",
           "--threads", "1", "--set", "metrics.lingerSeconds=30", "--out", run_dir,
           # Steps of at least 25 ms (10 s of training): the scrapes during
           # training need time to fall between steps 60 and 300, and on
           # OpenBLAS the bare mlp takes ~1 ms a step.
           "--step-time", "25ms",
           "--prometheus-config", prom]
    print("running:", " ".join(cmd), flush=True)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    prometheus = None
    try:
        deadline = time.time() + 240
        while not os.path.exists(prom) and time.time() < deadline and proc.poll() is None:
            time.sleep(0.1)
        if not check(os.path.exists(prom), "--prometheus-config file was not written"):
            return
        with open(prom) as f:
            config = yaml.safe_load(f)
        jobs = config["scrape_configs"]
        check(len(jobs) == 1 and jobs[0].get("honor_labels") is True,
              "scrape config: one job with honor_labels")
        targets = [t for sc in jobs[0]["static_configs"] for t in sc["targets"]]
        check(len(targets) == 2, f"scrape config lists {targets}, expected 2 workers")
        ports = [int(t.rsplit(":", 1)[1]) for t in targets]
        prometheus, prometheus_url = start_prometheus(prom, out)

        # 3. Compression ratio over a window in the middle of training: both
        # workers are polled together, the window opens at step 60 and closes
        # at step 340 of each.
        ratio_expected = 4 * sum(MLP_TENSORS) / encoded_update_bytes()
        first, ratios = {}, {}
        while len(ratios) < len(ports) and time.time() < deadline and proc.poll() is None:
            for rank, port in enumerate(ports):
                if rank in ratios:
                    continue
                try:
                    s = parse(scrape(port), f"rank {rank}")
                except OSError:
                    continue  # not serving yet
                step = total(s, "geotrain_samples_total") / BATCH
                if rank not in first and 60 <= step < 300:
                    first[rank] = s
                elif rank in first and step >= 340:
                    d_payload = (total(s, "geotrain_payload_bytes_total") -
                                 total(first[rank], "geotrain_payload_bytes_total"))
                    d_sent = (total(s, "geotrain_bytes_sent_total", link="wan") -
                              total(first[rank], "geotrain_bytes_sent_total", link="wan"))
                    ratios[rank] = d_payload / d_sent if d_sent else 0
            time.sleep(0.1)
        for rank in range(len(ports)):
            if not check(rank in ratios, f"rank {rank}: no scrape between steps 60 and 300 "
                                         f"and another after step 340"):
                continue
            print(f"rank {rank}: compression ratio {ratios[rank]:.4f} "
                  f"(wire format: {ratio_expected:.4f})", flush=True)
            check(abs(ratios[rank] / ratio_expected - 1) <= 0.05,
                  f"rank {rank}: compression ratio {ratios[rank]:.4f} is not within 5% of "
                  f"{ratio_expected:.4f}")

        # 4. Final values against the done events.
        logs = [os.path.join(run_dir, "logs", f"worker-{r}.log") for r in range(2)]
        csv_path = os.path.join(run_dir, "progress.csv")
        while time.time() < deadline:
            finished = all(os.path.exists(p) and "done:" in open(p).read() for p in logs)
            if finished and len(done_rows(csv_path)) == 2:
                break
            time.sleep(0.2)
        rows = done_rows(csv_path)
        if not check(len(rows) == 2, "no done event from both workers"):
            return
        log0 = open(logs[0]).read()
        check(f"({sum(MLP_TENSORS)} parameters)" in log0,
              f"the model is not the mlp of {sum(MLP_TENSORS)} parameters this test assumes")
        final = {}
        for rank, port in enumerate(ports):
            s = parse(scrape(port), f"rank {rank} (final)")
            final[rank] = s
            row = rows[rank]
            pairs = [
                ("WAN bytes sent", total(s, "geotrain_bytes_sent_total", link="wan"),
                 int(row["wan_sent_bytes"])),
                ("WAN bytes received", total(s, "geotrain_bytes_received_total", link="wan"),
                 int(row["wan_received_bytes"])),
                ("payload bytes", total(s, "geotrain_payload_bytes_total"),
                 int(row["payload_bytes"])),
                ("missing", total(s, "geotrain_sync_missing_total"), int(row["missing"])),
                ("staleness count = applied updates",
                 total(s, "geotrain_update_staleness_steps_count"), int(row["applied_updates"])),
                ("samples", total(s, "geotrain_samples_total"), STEPS * BATCH),
            ]
            for what, scraped, reported in pairs:
                print(f"rank {rank}: {what}: scraped {scraped:.0f}, reported {reported}")
                check(scraped == reported,
                      f"rank {rank}: {what}: /metrics says {scraped}, the worker {reported}")
            count = total(s, "geotrain_update_staleness_steps_count")
            check(count > 0, f"rank {rank}: no update applied")
            if count:
                mean = total(s, "geotrain_update_staleness_steps_sum") / count
                check(abs(mean - float(row["staleness_mean"])) < 1e-3,
                      f"rank {rank}: staleness mean {mean} vs reported {row['staleness_mean']}")
            # Membership: each worker synchronizes with the other one only.
            other = 1 - rank
            up = s.get("geotrain_peer_up", [])
            check(len(up) == 1 and up[0][0].get("peer") == str(other) and
                  up[0][0].get("peer_region") == ("east", "west")[other] and up[0][1] in (0, 1),
                  f"rank {rank}: geotrain_peer_up {up}, expected one series for rank {other}")
            for name, label, values in (("geotrain_state_transfer_bytes_total", "direction",
                                         {"sent", "received"}),
                                        ("geotrain_late_updates_total", "result",
                                         {"applied", "dropped"})):
                got = {l.get(label) for l, _ in s.get(name, [])}
                check(got == values, f"rank {rank}: {name} has {label} {got}, expected {values}")
            own = [l for name, series in s.items() if not name.startswith("exposer_")
                   for l, _ in series]
            check(all(l.get("region") == ("east", "west")[rank] and l.get("rank") == str(rank)
                      for l in own), f"rank {rank}: a series without its region and rank labels")

        # 5. The dashboard only uses what the workers export.
        merged = {}
        for s in final.values():
            for name, series in s.items():
                merged.setdefault(name, []).extend(series)
        dashboard_check(dashboard, merged)

        # 6. Prometheus has scraped the run while it trained (every 5 s).
        jobs_seen = {l["job"] for l, _ in merged["geotrain_samples_total"]}
        check(len(jobs_seen) == 1, f"workers report jobs {jobs_seen}, expected one")
        prometheus_check(prometheus_url, dashboard, jobs_seen.pop())
    finally:
        if prometheus is not None:
            prometheus.terminate()
            prometheus.wait()
        try:
            remaining = proc.communicate(timeout=90)[0]
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGINT)
            remaining = proc.communicate()[0]
        check(proc.returncode == 0,
              f"geotrain local exited with {proc.returncode}:\n{remaining[-3000:]}")
    if failures:
        print(f"{len(failures)} check(s) failed; run folder {run_dir}")
        sys.exit(1)
    shutil.rmtree(out, ignore_errors=True)
    print("all checks passed")


if __name__ == "__main__":
    main()
