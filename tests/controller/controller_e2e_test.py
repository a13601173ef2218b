#!/usr/bin/python3
"""geotrain-controller end to end, as processes: two test apiservers (a hub and
a member cluster "tokyo", HTTPS with tokens), two controller replicas with
leader election, and real kubectl. The test apiserver runs no controllers, so
the test plays the Job controller by writing Job status with kubectl.

Checks: a TrainingJob applied with kubectl gets its objects in both clusters
(the member through a kubeconfig Secret), its labels on the region Jobs; its
status follows the Jobs (Pending, Running; `kubectl get tj` columns); only
one replica leads; a region Job suspended by field manager kueue makes the
job wait for admission and stays suspended when the leader is killed and the
standby takes over within the Lease time (and applies everything); a region
in an unknown cluster is InvalidSpec naming the field, and `kubectl delete`
of that job completes; deleting the job
removes its objects from both clusters and then the job itself; /metrics,
/healthz, /readyz answer; SIGTERM stops a replica cleanly.
Usage: controller_e2e_test.py GEOTRAIN_CONTROLLER GEO_TEST_APISERVER TOOLS_BIN REPO
Exit 77 (skipped) without kubectl.
"""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

from e2e_support import Clusters, check, free_port, report, wait_for


def http(url):
    try:
        with urllib.request.urlopen(url, timeout=3) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, ""
    except OSError:
        return 0, ""


def main():
    controller, apiserver, tools, repo = sys.argv[1:5]
    kubectl_bin = os.path.join(tools, "kubectl")
    if not os.access(kubectl_bin, os.X_OK):
        print(f"SKIP: {kubectl_bin} is not installed (scripts/install-kube-tools.sh)")
        sys.exit(77)
    work = tempfile.mkdtemp(prefix="geo-controller-e2e-")
    clusters = Clusters(apiserver, controller, kubectl_bin, repo, work, ["hub", "tokyo"])
    kubectl, get = clusters.kubectl, clusters.get

    try:
        # A metrics port another process holds: the replica exits 1 and
        # names the flag (it aborted before, "terminate called without an
        # active exception", which a Deployment shows as a crash).
        with socket.socket() as held:
            held.bind(("127.0.0.1", 0))
            held.listen()
            taken = held.getsockname()[1]
            r = subprocess.run([controller, "--kubeconfig", clusters.kc["hub"],
                                "--namespace", "geotrain-system",
                                "--metrics-listen", f"127.0.0.1:{taken}",
                                "--health-listen", f"127.0.0.1:{free_port()}",
                                "--worker-image", "registry.example/worker:1"],
                               capture_output=True, text=True, timeout=60)
        check(r.returncode == 1 and f"--metrics-listen 127.0.0.1:{taken}" in r.stderr,
              f"a taken metrics port: exit {r.returncode}, {r.stderr[-300:]!r}")

        replicas = {name: clusters.start_controller(name) for name in ("c1", "c2")}
        for name, r in replicas.items():
            wait_for(f"{name} /healthz", lambda r=r: http(
                f"http://127.0.0.1:{r['health']}/healthz")[0] == 200)

        lease = wait_for("a leader", lambda: (get("hub", "lease", "geotrain-controller", "-n",
                                                  "geotrain-system") or {})
                         .get("spec", {}).get("holderIdentity"))
        check(lease in replicas, f"Lease holder {lease}")
        leader, standby = lease, ("c2" if lease == "c1" else "c1")
        print(f"leader {leader}, standby {standby}", flush=True)

        tj = {"apiVersion": "geotrain.io/v1alpha1", "kind": "TrainingJob",
              "metadata": {"name": "world", "namespace": "ml",
                           "labels": {"kueue.x-k8s.io/queue-name": "gpu"}},
              "spec": {"sync": {"algorithm": "dts", "period": 4},
                       "regions": [{"name": "london", "replicas": 2,
                                    "gateway": {"serviceType": "ClusterIP"}},
                                   {"name": "tokyo", "cluster": "tokyo",
                                    "gateway": {"serviceType": "NodePort",
                                                "endpoint": "tk.example.org:31000"}}]}}
        path = os.path.join(work, "tj.json")
        with open(path, "w") as f:
            json.dump(tj, f)
        kubectl("hub", "apply", "-f", path)
        wait_for("the Job in the hub", lambda: get("hub", "job", "world-london", "-n", "ml"))
        wait_for("the Job in tokyo", lambda: get("tokyo", "job", "world-tokyo", "-n", "ml"))
        tokyo_job = get("tokyo", "job", "world-tokyo", "-n", "ml") or {}
        check(tokyo_job.get("metadata", {}).get("labels", {}).get("kueue.x-k8s.io/queue-name") ==
              "gpu", f"tokyo's Job lacks the queue-name label: {tokyo_job.get('metadata')}")
        config = get("tokyo", "configmap", "world-tokyo-config", "-n", "ml")
        check(config and "world-london-gateway.ml.svc.cluster.local:7000" in
              config["data"]["worker.yaml"], "tokyo's worker.yaml dials london's gateway")
        check(get("tokyo", "secret", "world-tokyo-keys", "-n", "ml") is not None,
              "tokyo's key Secret")
        out = kubectl("hub", "get", "tj", "-n", "ml").stdout
        check("Pending" in out and "0/2" in out, f"kubectl get tj: {out}")

        # The Job controller: every worker ready.
        kubectl("hub", "-n", "ml", "patch", "job", "world-london", "--subresource=status",
                "--type=merge", "-p", '{"status":{"active":2,"ready":2}}')
        kubectl("tokyo", "-n", "ml", "patch", "job", "world-tokyo", "--subresource=status",
                "--type=merge", "-p", '{"status":{"active":1,"ready":1}}')
        wait_for("state Running", lambda: (get("hub", "tj", "world", "-n", "ml") or {})
                 .get("status", {}).get("state") == "Running", timeout=30)
        out = kubectl("hub", "get", "tj", "-n", "ml").stdout
        check("Running" in out and "2/2" in out, f"kubectl get tj: {out}")

        # The job gauges are refreshed every 2 s from the cache.
        wanted = ("geotrain_reconcile_total", 'geotrain_jobs{state="Running"} 1',
                  'geotrain_region_reachable{region="tokyo"} 1')
        url = f"http://127.0.0.1:{replicas[leader]['metrics']}/metrics"
        text = wait_for("the leader's /metrics", lambda: (lambda t: t if all(
            w in t for w in wanted) else None)(http(url)[1]), timeout=15) or http(url)[1]
        check(all(w in text for w in wanted), f"leader /metrics lacks {wanted}: {text[-800:]}")
        for name, r in replicas.items():
            check(http(f"http://127.0.0.1:{r['health']}/readyz")[0] == 200, f"{name} /readyz")
        # The Grafana dashboard's Controller row uses only what the controller exports.
        with open(os.path.join(repo, "charts", "geotrain", "dashboards", "geotrain-wan.json")) as f:
            panels = json.load(f)["panels"]
        row = next(i for i, p in enumerate(panels) if p["type"] == "row" and
                   p["title"] == "Controller")
        names = set()
        for p in panels[row + 1:]:
            if p["type"] == "row":
                break
            for t in p.get("targets", []):
                names |= set(re.findall(r"\b(geotrain_[a-z_]+)", t["expr"]))
        check(len(names) >= 4, f"the Controller row names {names}")
        exported = set(re.findall(r"^(geotrain_[a-z_]+)[{ ]", text, re.M))
        check(names <= exported, f"the dashboard's controller metrics {sorted(names - exported)} "
                                 f"are not exported")

        # Kueue in tokyo takes the Job back (preempted): the job waits.
        def running_reason():
            tj_now = get("hub", "tj", "world", "-n", "ml") or {}
            return next((c.get("reason") for c in tj_now.get("status", {}).get("conditions", [])
                         if c.get("type") == "Running"), None)

        def tokyo_suspended():
            return (get("tokyo", "job", "world-tokyo", "-n", "ml") or {}).get(
                "spec", {}).get("suspend")

        kubectl("tokyo", "-n", "ml", "patch", "job", "world-tokyo", "--field-manager=kueue",
                "--type=merge", "-p", '{"spec":{"suspend":true}}')
        wait_for("WaitingForAdmission", lambda: running_reason() == "WaitingForAdmission")

        # Kill the leader: the standby takes over within the Lease time.
        replicas[leader]["proc"].kill()
        replicas[leader]["proc"].wait()
        took = time.time()
        wait_for("the standby to lead", lambda: (get("hub", "lease", "geotrain-controller",
                                                     "-n", "geotrain-system") or {})
                 .get("spec", {}).get("holderIdentity") == standby, timeout=20)
        print(f"takeover after {time.time() - took:.1f} s", flush=True)
        # The new leader's passes (the first applies everything) leave
        # kueue's suspend alone; admitted, the job runs again.
        standby_metrics = f"http://127.0.0.1:{replicas[standby]['metrics']}/metrics"
        wait_for("the new leader's passes", lambda: re.search(
            r'geotrain_reconcile_total\{[^}]*\} [1-9]', http(standby_metrics)[1]), timeout=20)
        time.sleep(1)
        check(tokyo_suspended() is True, "the new leader resumed the Job kueue suspended")
        check(running_reason() == "WaitingForAdmission", f"Running reason {running_reason()}")
        kubectl("tokyo", "-n", "ml", "patch", "job", "world-tokyo", "--field-manager=kueue",
                "--type=merge", "-p", '{"spec":{"suspend":false}}')
        wait_for("Running again", lambda: running_reason() == "AllWorkersReady")
        check(tokyo_suspended() is False, "tokyo's Job after admission")

        # A region in a cluster that is no member: InvalidSpec naming the
        # field, and `kubectl delete` completes.
        paris = {"apiVersion": "geotrain.io/v1alpha1", "kind": "TrainingJob",
                 "metadata": {"name": "paris", "namespace": "ml"},
                 "spec": {"regions": [{"name": "london", "gateway": {"serviceType": "ClusterIP"}},
                                      {"name": "paris", "cluster": "paris"}]}}
        paris_path = os.path.join(work, "paris.json")
        with open(paris_path, "w") as f:
            json.dump(paris, f)
        kubectl("hub", "apply", "-f", paris_path)

        def created(name):
            tj_now = get("hub", "tj", name, "-n", "ml") or {}
            return next((c for c in tj_now.get("status", {}).get("conditions", [])
                         if c.get("type") == "Created"), None)

        c = wait_for("InvalidSpec", lambda: (created("paris") or {}).get("reason") == "InvalidSpec"
                     and created("paris"))
        check(c and 'spec.regions[1].cluster: "paris" is not a member cluster; known: local, tokyo'
              in c.get("message", ""), f"paris: {c}")
        check(c and "--member" not in c.get("message", ""), f"CLI wording in {c}")
        r = kubectl("hub", "delete", "tj", "paris", "-n", "ml", "--timeout=30s")
        check(get("hub", "tj", "paris", "-n", "ml") is None, f"paris not deleted: {r.stderr}")

        # Delete: both clusters are cleaned, then the finalizer goes.
        kubectl("hub", "delete", "tj", "world", "-n", "ml", "--wait=false")
        wait_for("the job to be gone", lambda: get("hub", "tj", "world", "-n", "ml") is None,
                 timeout=30)
        check(get("tokyo", "job", "world-tokyo", "-n", "ml") is None, "tokyo's Job left")
        check(get("tokyo", "secret", "world-tokyo-keys", "-n", "ml") is None,
              "tokyo's Secret left")
        check(get("hub", "configmap", "world-london-config", "-n", "ml") is None,
              "london's ConfigMap left")

        p = replicas[standby]["proc"]
        p.send_signal(signal.SIGTERM)
        try:
            check(p.wait(timeout=15) == 0, f"{standby} exited {p.returncode} on SIGTERM")
        except subprocess.TimeoutExpired:
            check(False, f"{standby} did not stop within 15 s of SIGTERM")
    finally:
        clusters.close()
    report(work)


if __name__ == "__main__":
    main()
