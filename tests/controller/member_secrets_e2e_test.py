#!/usr/bin/python3
"""geotrain-controller and its member kubeconfig Secrets, as processes: a hub
and two test apiservers that stand for member cluster "tokyo" before and after
its credentials change (another server, another token), real kubectl.

1. The member Secret holds a kubeconfig whose user is an exec credential
   plugin (client.authentication.k8s.io/v1), as EKS, GKE and AKS write them:
   a small script that prints an ExecCredential. The controller runs it and
   writes a TrainingJob's region into tokyo with its token.
2. The Secret is replaced (kubectl apply) with a kubeconfig for the other
   server, whose v1beta1 plugin prints the other token: the same controller
   process, not restarted, writes the next TrainingJob there.
Usage: member_secrets_e2e_test.py GEOTRAIN_CONTROLLER GEO_TEST_APISERVER TOOLS_BIN
Exit 77 (skipped) without kubectl.
"""

import json
import os
import signal
import subprocess
import sys
import tempfile

from e2e_support import check, failures, free_port, wait_for


def main():
    controller, apiserver, tools = sys.argv[1:4]
    kubectl_bin = os.path.join(tools, "kubectl")
    if not os.access(kubectl_bin, os.X_OK):
        print(f"SKIP: {kubectl_bin} is not installed (scripts/install-kube-tools.sh)")
        sys.exit(77)
    work = tempfile.mkdtemp(prefix="geo-member-secrets-")
    procs = []
    log = os.path.join(work, "controller.log")

    def start(args, out):
        p = subprocess.Popen(args, stdout=open(out, "w"), stderr=subprocess.STDOUT)
        procs.append(p)
        return p

    try:
        kc = {}
        for cluster in ("hub", "tokyo-a", "tokyo-b"):
            kc[cluster] = os.path.join(work, f"{cluster}.kubeconfig")
            start([apiserver, "--tls", "--port", "0", "--kubeconfig-out", kc[cluster]],
                  os.path.join(work, f"apiserver-{cluster}.log"))
        for cluster in kc:
            wait_for(f"{cluster} kubeconfig", lambda c=cluster: os.path.exists(kc[c]) and
                     os.path.getsize(kc[c]) > 0)

        def kubectl(cluster, *args, ok=True, stdin=None):
            r = subprocess.run([kubectl_bin, "--kubeconfig", kc[cluster], "--cache-dir",
                                f"{work}/cache-{cluster}"] + list(args),
                               capture_output=True, text=True, input=stdin)
            if ok:
                check(r.returncode == 0, f"kubectl {' '.join(args)}: {r.stdout}{r.stderr}")
            return r

        def get(cluster, *args):
            r = kubectl(cluster, "get", *args, "-o", "json", ok=False)
            return json.loads(r.stdout) if r.returncode == 0 else None

        def exec_kubeconfig(cluster, version):
            """The cluster's kubeconfig with its token replaced by a plugin
            that prints it (and counts its runs)."""
            with open(kc[cluster]) as f:
                config = json.load(f)
            token = config["users"][0]["user"].pop("token")
            plugin = os.path.join(work, f"plugin-{cluster}.sh")
            with open(plugin, "w") as f:
                f.write("#!/bin/sh\n"
                        f"echo run >> {work}/runs-{cluster}\n"
                        "printf '{\"apiVersion\":\"client.authentication.k8s.io/%s\","
                        "\"kind\":\"ExecCredential\",\"status\":{\"token\":\"%s\"}}' "
                        "\"$1\" \"$GEO_TOKEN\"\n")
            os.chmod(plugin, 0o755)
            config["users"][0]["user"]["exec"] = {
                "apiVersion": f"client.authentication.k8s.io/{version}",
                "command": plugin, "args": [version],
                "env": [{"name": "GEO_TOKEN", "value": token}],
                "interactiveMode": "Never", "provideClusterInfo": True}
            path = os.path.join(work, f"{cluster}-exec.kubeconfig")
            with open(path, "w") as f:
                json.dump(config, f)
            return path

        def store_member_secret(path):
            secret = kubectl("hub", "-n", "geotrain-system", "create", "secret", "generic",
                             "geotrain-member-tokyo", f"--from-file=kubeconfig={path}",
                             "--dry-run=client", "-o", "json").stdout
            kubectl("hub", "apply", "-f", "-", stdin=secret)

        def runs(cluster):
            path = os.path.join(work, f"runs-{cluster}")
            return len(open(path).read().split()) if os.path.exists(path) else 0

        crd = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "manifests",
                           "crd")
        kubectl("hub", "apply", "-f", crd)
        kubectl("hub", "wait", "--for=condition=Established", "--timeout=20s",
                "crd/trainingjobs.geotrain.io")
        for cluster in kc:
            kubectl(cluster, "create", "namespace", "ml")
        kubectl("hub", "create", "namespace", "geotrain-system")
        store_member_secret(exec_kubeconfig("tokyo-a", "v1"))

        metrics, health = free_port(), free_port()
        p = start([controller, "--kubeconfig", kc["hub"], "--namespace", "geotrain-system",
                   "--member", "tokyo=geotrain-member-tokyo", "--leader-elect=false",
                   "--metrics-listen", f"127.0.0.1:{metrics}",
                   "--health-listen", f"127.0.0.1:{health}", "--log-level", "debug",
                   "--worker-image", "registry.example/worker:1"], log)

        def apply_job(name):
            tj = {"apiVersion": "geotrain.io/v1alpha1", "kind": "TrainingJob",
                  "metadata": {"name": name, "namespace": "ml"},
                  "spec": {"regions": [{"name": "london", "gateway": {"serviceType": "ClusterIP"}},
                                       {"name": "tokyo", "cluster": "tokyo",
                                        "gateway": {"serviceType": "NodePort",
                                                    "endpoint": "tk.example.org:31000"}}]}}
            kubectl("hub", "apply", "-f", "-", stdin=json.dumps(tj))

        # 1. An exec plugin's token.
        apply_job("first")
        wait_for("job first in tokyo (exec plugin, v1)",
                 lambda: get("tokyo-a", "job", "first-tokyo", "-n", "ml"))
        check(runs("tokyo-a") >= 1, "the v1 plugin never ran")

        # 2. The Secret replaced while the controller runs.
        store_member_secret(exec_kubeconfig("tokyo-b", "v1beta1"))
        wait_for("the controller to switch", lambda: "changed; the member's requests use its new "
                 "kubeconfig" in open(log).read())
        apply_job("second")
        wait_for("job second in the new tokyo (exec plugin, v1beta1)",
                 lambda: get("tokyo-b", "job", "second-tokyo", "-n", "ml"))
        check(get("tokyo-a", "job", "second-tokyo", "-n", "ml") is None,
              "job second went to the old tokyo")
        check(runs("tokyo-b") >= 1, "the v1beta1 plugin never ran")
        check(p.poll() is None, f"the controller exited ({p.returncode})")

        p.send_signal(signal.SIGTERM)
        try:
            check(p.wait(timeout=15) == 0, f"the controller exited {p.returncode} on SIGTERM")
        except subprocess.TimeoutExpired:
            check(False, "the controller did not stop within 15 s of SIGTERM")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    if failures:
        print("--- controller.log")
        print(open(log).read()[-4000:] if os.path.exists(log) else "(none)")
        print(f"{len(failures)} check(s) failed")
        sys.exit(1)
    print("all checks passed")


if __name__ == "__main__":
    main()
