#!/usr/bin/python3
"""Controller at scale: N TrainingJobs of 3 regions each (the hub and two
members), reconciled by one geotrain-controller process against three
geo-test-apiserver processes (HTTPS, tokens).

Prints: time from the controller's start until every job has its workloads in
all three clusters (status Created=True), reconcile latency p50/p99 (from the
controller's geotrain_reconcile_seconds histogram, interpolated within buckets
as Prometheus' histogram_quantile does), reconciles done, and the controller's
peak RSS (VmHWM). Targets (issue 7): p99 <= 50 ms, RSS <= 100 MiB.

Usage: bench/controller_bench.py [--jobs N] [--build DIR]
  (DIR defaults to build/; kubectl from .tools/bin)
"""

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def quantile(q, buckets):
    """histogram_quantile over [(upper bound, cumulative count)]."""
    total = buckets[-1][1]
    rank = q * total
    prev_bound, prev_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if bound == float("inf"):
                return prev_bound
            return prev_bound + (bound - prev_bound) * (rank - prev_count) / max(count - prev_count, 1e-9)
        prev_bound, prev_count = bound, count
    return prev_bound


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--build", default="build")
    args = ap.parse_args()
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    build = os.path.join(repo, args.build)
    apiserver = os.path.join(build, "tests", "support", "geo-test-apiserver")
    controller = os.path.join(build, "controller", "geotrain-controller")
    kubectl_bin = os.path.join(repo, ".tools", "bin", "kubectl")
    work = tempfile.mkdtemp(prefix="geo-controller-bench-")
    procs = []
    try:
        kc = {}
        for cluster in ("hub", "tokyo", "oregon"):
            kc[cluster] = os.path.join(work, f"{cluster}.kubeconfig")
            procs.append(subprocess.Popen([apiserver, "--tls", "--port", "0", "--kubeconfig-out",
                                           kc[cluster]], stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL))
        for path in kc.values():
            while not (os.path.exists(path) and os.path.getsize(path) > 0):
                time.sleep(0.1)

        def kubectl(cluster, *a):
            subprocess.run([kubectl_bin, "--kubeconfig", kc[cluster], "--cache-dir",
                            f"{work}/cache-{cluster}"] + list(a), check=True,
                           capture_output=True, text=True)

        kubectl("hub", "apply", "-f", os.path.join(repo, "manifests", "crd"))
        kubectl("hub", "wait", "--for=condition=Established", "--timeout=30s",
                "crd/trainingjobs.geotrain.io")
        for c in kc:
            kubectl(c, "create", "namespace", "bench")
        kubectl("hub", "create", "namespace", "geotrain-system")
        for m in ("tokyo", "oregon"):
            kubectl("hub", "-n", "geotrain-system", "create", "secret", "generic", f"member-{m}",
                    f"--from-file=kubeconfig={kc[m]}")
        jobs = os.path.join(work, "jobs.json")
        items = []
        for i in range(args.jobs):
            items.append({"apiVersion": "geotrain.io/v1alpha1", "kind": "TrainingJob",
                          "metadata": {"name": f"job-{i}", "namespace": "bench"},
                          "spec": {"regions": [
                              {"name": "london", "gateway": {"serviceType": "ClusterIP"}},
                              {"name": "tokyo", "cluster": "tokyo",
                               "gateway": {"serviceType": "ClusterIP"}},
                              {"name": "oregon", "cluster": "oregon",
                               "gateway": {"serviceType": "ClusterIP"}}]}})
        with open(jobs, "w") as f:
            json.dump({"apiVersion": "v1", "kind": "List", "items": items}, f)
        kubectl("hub", "create", "-f", jobs)
        print(f"{args.jobs} TrainingJobs created; starting the controller", flush=True)

        metrics = free_port()
        start = time.time()
        ctl = subprocess.Popen([controller, "--kubeconfig", kc["hub"], "--namespace",
                                "geotrain-system", "--member", "tokyo=member-tokyo",
                                "--member", "oregon=member-oregon", "--leader-elect=false",
                                "--metrics-listen", f"127.0.0.1:{metrics}", "--health-listen",
                                f"127.0.0.1:{free_port()}", "--log-level", "warn"],
                               stdout=subprocess.DEVNULL, stderr=open(f"{work}/controller.log", "w"))
        procs.append(ctl)

        def created():
            r = subprocess.run([kubectl_bin, "--kubeconfig", kc["hub"], "--cache-dir",
                                f"{work}/cache-hub", "get", "tj", "-n", "bench", "-o",
                                "jsonpath={range .items[*]}{.status.regionsReady}{\" \"}"
                                "{.status.conditions[?(@.type==\"Created\")].status}{\"\\n\"}{end}"],
                               capture_output=True, text=True)
            return sum(1 for line in r.stdout.splitlines() if line.endswith("True"))

        done = 0
        while time.time() - start < 600:
            done = created()
            if done >= args.jobs:
                break
            time.sleep(1)
        elapsed = time.time() - start
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics") as r:
            text = r.read().decode()
        buckets = []
        for le, count in re.findall(r'geotrain_reconcile_seconds_bucket\{le="([^"]+)"\} (\S+)', text):
            buckets.append((float("inf") if le == "+Inf" else float(le), float(count)))
        buckets.sort()
        total = re.findall(r"geotrain_reconcile_seconds_count (\S+)", text)
        rss = 0
        with open(f"/proc/{ctl.pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    rss = int(line.split()[1]) / 1024
        print(f"jobs with workloads in all 3 clusters: {done}/{args.jobs} after {elapsed:.1f} s")
        print(f"reconcile passes: {float(total[0]) if total else 0:.0f}; "
              f"p50 {quantile(0.5, buckets) * 1000:.1f} ms, p99 {quantile(0.99, buckets) * 1000:.1f} ms")
        print(f"controller peak RSS: {rss:.1f} MiB")
        # Where the CPU went: the controller against the three API servers.
        ticks = os.sysconf("SC_CLK_TCK")
        for name, p in [("controller", ctl)] + list(zip(kc, procs[:3])):
            with open(f"/proc/{p.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            print(f"  cpu {name}: {(int(fields[11]) + int(fields[12])) / ticks:.1f} s")
        return 0 if done >= args.jobs else 1
    finally:
        for p in procs:
            p.kill()
            p.wait()


if __name__ == "__main__":
    sys.exit(main())
