#!/usr/bin/python3
"""The pods the controller renders, run: a two-region TrainingJob end to end
with the built images.

Two test apiservers (the hub, whose region is london, and the member
cluster tokyo), the controller image watching them (host network), and per
cluster tests/support/podman_kubelet.py playing the kubelet, the Job
controller and the cloud's load balancer with podman: each region's pods
run as containers of the worker image with the ConfigMap and Secret as
read-only files at the pod's mount paths (fsGroup ownership, item modes,
the kubelet's ..data links), JOB_COMPLETION_INDEX in the env, the pod's args
expanded, its security context, on one network per region plus a `wan`
network that carries the gateways' load-balancer addresses.

Checks: the TrainingJob reaches Succeeded with its progress (step, loss,
accuracy scraped from rank 0 through the API server's pod proxy) filled in;
every worker container exits 0 after all the steps; every pod is Succeeded
and every region's Job Complete.
Usage: pods_e2e_test.py GEO_TEST_APISERVER REPO
Exit 77 (skipped) when podman or the images are missing, except with CI=true.
"""

import base64
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import yaml

from podman_support import CONTROLLER, WORKER, Podman, check, finish

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../support"))
from podman_kubelet import KubeApi, PodmanKubelet  # noqa: E402

STEPS = 300
NS = "ml"


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def wait_for(what, predicate, timeout, every=None):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if every:
            every()
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    check(False, f"timed out after {timeout} s waiting for {what}")
    return None


def main():
    apiserver, repo = sys.argv[1:3]
    podman = Podman("geo-pods")
    work = tempfile.mkdtemp(prefix="geo-images-pods-")
    procs, nodes = [], []
    started = time.time()
    try:
        # The clusters.
        kc = {}
        for cluster in ("hub", "tokyo"):
            kc[cluster] = os.path.join(work, f"{cluster}.kubeconfig")
            procs.append(subprocess.Popen(
                [apiserver, "--tls", "--port", "0", "--kubeconfig-out", kc[cluster]],
                stdout=open(os.path.join(work, f"apiserver-{cluster}.log"), "w"),
                stderr=subprocess.STDOUT))
        for cluster in kc:
            wait_for(f"{cluster}'s kubeconfig", lambda c=cluster: os.path.exists(kc[c]) and
                     os.path.getsize(kc[c]) > 0, 30)
            os.chmod(kc[cluster], 0o644)  # read by the controller's user 65532
        api = {c: KubeApi.from_kubeconfig(kc[c]) for c in kc}
        with open(os.path.join(repo, "manifests", "crd", "trainingjobs.geotrain.io.yaml")) as f:
            crd = next(d for d in yaml.safe_load_all(f) if d)
        api["hub"].create("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
        for c in api:
            api[c].create("/api/v1/namespaces", {"metadata": {"name": NS}})
        api["hub"].create("/api/v1/namespaces", {"metadata": {"name": "geotrain-system"}})
        with open(kc["tokyo"], "rb") as f:
            api["hub"].create("/api/v1/namespaces/geotrain-system/secrets", {
                "metadata": {"name": "geotrain-member-tokyo"},
                "data": {"kubeconfig": base64.b64encode(f.read()).decode()}})

        # The controller, from its image.
        health = free_port()
        controller = podman.start("controller", [
            "--read-only", "--cap-drop=ALL", "--network", "host",
            "-v", f"{kc['hub']}:/etc/geotrain/kubeconfig:ro"],
            [CONTROLLER, "--kubeconfig", "/etc/geotrain/kubeconfig",
             "--namespace", "geotrain-system", "--member", "tokyo=geotrain-member-tokyo",
             "--worker-image", WORKER, "--leader-elect=false",
             "--health-listen", f"127.0.0.1:{health}",
             "--metrics-listen", f"127.0.0.1:{free_port()}"])

        # The nodes: one network per region, and the wan between them.
        wan, wan_ips = podman.network("wan")
        for i, cluster in enumerate(("hub", "tokyo")):
            net, ips = podman.network("london" if cluster == "hub" else "tokyo")
            node_dir = os.path.join(work, f"node-{cluster}")
            os.mkdir(node_dir)
            nodes.append(PodmanKubelet(api[cluster], NS, ["podman"], podman.env, (net, ips),
                                       (wan, wan_ips[i * 8:(i + 1) * 8]), node_dir,
                                       node_name=f"node-{cluster}"))

        tj = {"apiVersion": "geotrain.io/v1alpha1", "kind": "TrainingJob",
              "metadata": {"name": "world", "namespace": NS},
              "spec": {"model": {"builtin": "mlp"},
                       "training": {"steps": STEPS, "batchSize": 64, "lr": 0.05,
                                    "evalInterval": 100},
                       "sync": {"algorithm": "dts", "period": 4, "codec": "qsgd", "bits": 4},
                       "regions": [{"name": "london", "replicas": 2},
                                   {"name": "tokyo", "cluster": "tokyo", "replicas": 1}]}}
        # The CRD's API is served once it is Established.
        wait_for("the TrainingJob API", lambda: api["hub"].get(
            f"/apis/geotrain.io/v1alpha1/namespaces/{NS}/trainingjobs") is not None, 30)
        api["hub"].create(f"/apis/geotrain.io/v1alpha1/namespaces/{NS}/trainingjobs", tj)

        def state():
            obj = api["hub"].get(f"/apis/geotrain.io/v1alpha1/namespaces/{NS}/trainingjobs/world")
            return (obj or {}).get("status", {})

        def step():
            for node in nodes:
                try:
                    node.sync()
                except RuntimeError as e:  # a write raced the controller's: next pass
                    print(f"node pass: {e}", flush=True)

        seen = set()

        def finished():
            s = state()
            if s.get("state") not in seen:
                seen.add(s.get("state"))
                print(f"{time.time() - started:.0f} s: TrainingJob {s.get('state')} "
                      f"progress {s.get('progress')}", flush=True)
            return s.get("state") in ("Succeeded", "Failed") and s

        final = wait_for("the TrainingJob to finish", finished, 480, every=step) or state()
        wall = time.time() - started
        check(final.get("state") == "Succeeded", f"TrainingJob state {final.get('state')}: "
                                                 f"{json.dumps(final)[:2000]}")
        progress = final.get("progress", {})
        check(progress.get("step", 0) >= 1 and "loss" in progress,
              f"status.progress not filled in: {progress}")
        check(0 < progress.get("accuracy", 0) <= 1, f"status.progress.accuracy: {progress}")

        # Every pod ran to the end.
        workers = 0
        for node in nodes:
            for name, out in node.container_logs().items():
                workers += 1
                pod = node.pods[name]
                check(pod["phase"] == "Succeeded" and pod["exit"] == 0,
                      f"pod {name}: {pod['phase']}, exit {pod['exit']}: {out[-2500:]}")
                # The worker's last log line of a finished run (the pods run
                # it with text progress): "done: 300 steps, test accuracy 84.76%".
                done = re.search(r" done: (\d+) steps, test accuracy ([\d.]+)%", out)
                check(done and int(done.group(1)) == STEPS,
                      f"pod {name}: no 'done: {STEPS} steps' in its output: {out[-1500:]}")
                print(f"pod {name}: exit {pod['exit']}, {done and done.group(1)} steps, "
                      f"test accuracy {done and done.group(2)}%", flush=True)
            stored = node.api.get(f"/api/v1/namespaces/{NS}/pods") or {"items": []}
            for p in stored["items"]:
                check(p.get("status", {}).get("phase") == "Succeeded",
                      f"pod {p['metadata']['name']} is {p.get('status', {}).get('phase')}")
        check(workers == 3, f"{workers} worker pods ran, expected 3")
        print(f"end to end: regions london (2 workers) and tokyo (1), {STEPS} steps, "
              f"progress {progress}, wall {wall:.0f} s", flush=True)
        if sys.modules["podman_support"].failures:
            print("--- controller")
            print(podman.logs(controller)[-4000:])
            for node in nodes:
                print("\n".join(node.events))
    finally:
        for node in nodes:
            node.cleanup()
        podman.cleanup()
        for p in procs:
            p.kill()
            p.wait()
        shutil.rmtree(work, ignore_errors=True)
    finish()


if __name__ == "__main__":
    main()
