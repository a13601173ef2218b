#!/usr/bin/python3
"""Controller at scale: N TrainingJobs of 3 regions each (the hub and two
members), reconciled by one geotrain-controller process against three
geo-test-apiserver processes (HTTPS, tokens).

Prints: time from the controller's start until every job has its workloads in
all three clusters (status Created=True), reconcile latency p50/p99 (from the
controller's geotrain_reconcile_seconds histogram, interpolated within buckets
as Prometheus' histogram_quantile does) over that burst and over the
following --steady seconds (every job converged and polled), reconciles
done, and the controller's peak RSS (VmHWM). Targets (issue 7): p99 <= 50 ms, RSS <= 100 MiB.

Usage: bench/controller_bench.py [--jobs N] [--workers W] [--steady S] [--build DIR]
  (DIR defaults to build/; kubectl from .tools/bin)
"""

import argparse
import base64
import json
import os
import re
import socket
import ssl
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
    ap.add_argument("--workers", type=int, default=2,
                    help="the controller's --workers (TrainingJobs reconciled at once)")
    ap.add_argument("--steady", type=int, default=15,
                    help="seconds of steady state measured after every job is created")
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
                                f"127.0.0.1:{free_port()}", "--log-level", "warn",
                                "--workers", str(args.workers)],
                               stdout=subprocess.DEVNULL, stderr=open(f"{work}/controller.log", "w"))
        procs.append(ctl)

        # Polled once a second straight from the hub's API server: a kubectl
        # process per poll cost the 2-core machine ~20% of its CPU, which the
        # controller and the API servers then lacked.
        hub_cfg = json.load(open(kc["hub"]))
        hub_server = hub_cfg["clusters"][0]["cluster"]["server"]
        hub_ctx = ssl.create_default_context(cadata=base64.b64decode(
            hub_cfg["clusters"][0]["cluster"]["certificate-authority-data"]).decode())
        hub_token = hub_cfg["users"][0]["user"]["token"]

        def created():
            req = urllib.request.Request(
                f"{hub_server}/apis/geotrain.io/v1alpha1/namespaces/bench/trainingjobs",
                headers={"Authorization": f"Bearer {hub_token}"})
            with urllib.request.urlopen(req, context=hub_ctx) as r:
                items = json.load(r)["items"]
            return sum(1 for tj in items
                       if any(c.get("type") == "Created" and c.get("status") == "True"
                              for c in tj.get("status", {}).get("conditions", [])))

        done = 0
        while time.time() - start < 600:
            done = created()
            if done >= args.jobs:
                break
            time.sleep(1)
        elapsed = time.time() - start

        def histogram():
            with urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics") as r:
                text = r.read().decode()
            out = []
            for le, count in re.findall(r'geotrain_reconcile_seconds_bucket\{le="([^"]+)"\} (\S+)',
                                        text):
                out.append((float("inf") if le == "+Inf" else float(le), float(count)))
            return sorted(out)

        buckets = histogram()
        total = [buckets[-1][1]] if buckets else []
        rss_burst = 0
        with open(f"/proc/{ctl.pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    rss_burst = int(line.split()[1]) / 1024
        # Steady state: every job converged, each polled every 10 s (the
        # jobs stay Pending: the test apiservers run no pods).
        time.sleep(args.steady)
        after = histogram()
        steady = [(b, c - c0) for (b, c), (_, c0) in zip(after, buckets)]
        rss = 0
        with open(f"/proc/{ctl.pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    rss = int(line.split()[1]) / 1024
        print(f"jobs with workloads in all 3 clusters: {done}/{args.jobs} after {elapsed:.1f} s")
        print(f"reconcile passes until then: {float(total[0]) if total else 0:.0f}; "
              f"p50 {quantile(0.5, buckets) * 1000:.1f} ms, p99 {quantile(0.99, buckets) * 1000:.1f} ms")
        if steady and steady[-1][1] > 0:
            print(f"steady state, the next {args.steady} s: {steady[-1][1]:.0f} passes; "
                  f"p50 {quantile(0.5, steady) * 1000:.1f} ms, "
                  f"p99 {quantile(0.99, steady) * 1000:.1f} ms")
        print(f"controller peak RSS: {rss_burst:.1f} MiB until all were created, {rss:.1f} MiB "
              f"at the end")
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
