#!/usr/bin/python3
"""The README's "Deploy on Kubernetes" block, run as written.

Four test apiservers (tests/support, TLS, tokens) stand in for the clusters
london (hub), tokyo, oregon and ohio, as contexts of one kubeconfig. The
block's commands run in bash, in order, from a folder that has the
repository's charts/ and manifests/, with real helm and kubectl; only what
cannot run here is left out: the `docker build` lines, and `-w` of the last
`kubectl get` (it would watch forever). The test apiserver has no token
controller, so the test fills in each member's token Secret the way
kube-controller-manager does, as soon as it appears.
Afterwards: every member's kubeconfig Secret in the hub reaches that member
with the member's token, the controller Deployment names the three members,
and the TrainingJob exists.
Usage: readme_deploy_test.py TOOLS_BIN GEO_TEST_APISERVER REPO_ROOT
Exit 77 (skipped) when helm or kubectl is not installed.
"""

import base64
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time

CLUSTERS = ("london", "tokyo", "oregon", "ohio")
MEMBERS = CLUSTERS[1:]
NS = "geotrain-system"

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../support"))
from checks import check, failures, finish  # noqa: E402,F401


def deploy_block(readme):
    """The first ```sh block of the section "## Deploy on Kubernetes"."""
    section = readme.split("## Deploy on Kubernetes", 1)[1].split("\n## ", 1)[0]
    match = re.search(r"```sh\n(.*?)```", section, re.S)
    if match is None:
        raise RuntimeError("README.md: no sh block in 'Deploy on Kubernetes'")
    return match.group(1)


def runnable(block):
    """The block without what needs a container runtime or never ends."""
    lines = []
    for line in block.splitlines():
        if line.startswith("docker build"):
            continue
        if re.match(r"kubectl .*\bget tj -w$", line):
            line = line[:-len(" -w")]
        lines.append(line)
    return "\n".join(lines) + "\n"


def main():
    tools, apiserver, repo = sys.argv[1], sys.argv[2], sys.argv[3]
    helm, kubectl = os.path.join(tools, "helm"), os.path.join(tools, "kubectl")
    for tool in (helm, kubectl):
        if not os.access(tool, os.X_OK):
            print(f"SKIP: {tool} is not installed (scripts/install-kube-tools.sh)")
            sys.exit(77)
    with open(os.path.join(repo, "README.md")) as f:
        block = deploy_block(f.read())
    check(block.count("docker build") == 2, "the block no longer builds the two images")
    script = runnable(block)

    work = tempfile.mkdtemp(prefix="geo-readme-deploy-")
    servers, configs = [], {}
    stop = threading.Event()
    try:
        for cluster in CLUSTERS:
            cfg = os.path.join(work, f"{cluster}.json")
            servers.append(subprocess.Popen([apiserver, "--tls", "--port", "0",
                                             "--kubeconfig-out", cfg],
                                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            for _ in range(100):
                if os.path.exists(cfg) and os.path.getsize(cfg) > 0:
                    break
                time.sleep(0.1)
            with open(cfg) as f:
                configs[cluster] = json.load(f)
        # One kubeconfig, a context per cluster, named after its region.
        merged = {"apiVersion": "v1", "kind": "Config", "current-context": "london",
                  "clusters": [], "users": [], "contexts": []}
        for cluster, cfg in configs.items():
            merged["clusters"].append({"name": cluster, "cluster": cfg["clusters"][0]["cluster"]})
            merged["users"].append({"name": cluster, "user": cfg["users"][0]["user"]})
            merged["contexts"].append({"name": cluster, "context": {"cluster": cluster,
                                                                    "user": cluster}})
        kubeconfig = os.path.join(work, "kubeconfig")
        with open(kubeconfig, "w") as f:
            json.dump(merged, f)

        def k(cluster, *args, ok=True):
            r = subprocess.run([kubectl, "--kubeconfig", kubeconfig, "--context", cluster,
                                "--cache-dir", f"{work}/kcache"] + list(args),
                               capture_output=True, text=True)
            if ok:
                check(r.returncode == 0, f"kubectl {' '.join(args)}: {r.stdout}{r.stderr}")
            return r

        # kube-controller-manager's token controller, for the members.
        def token_controller():
            pending = set(MEMBERS)
            while pending and not stop.is_set():
                for m in sorted(pending):
                    r = k(m, "-n", NS, "get", "secret", "geotrain-member-token", ok=False)
                    if r.returncode != 0:
                        continue
                    user, cluster = configs[m]["users"][0]["user"], configs[m]["clusters"][0]
                    data = {"token": base64.b64encode(user["token"].encode()).decode(),
                            "ca.crt": cluster["cluster"]["certificate-authority-data"]}
                    k(m, "-n", NS, "patch", "secret", "geotrain-member-token", "--type", "merge",
                      "-p", json.dumps({"data": data}))
                    pending.discard(m)
                time.sleep(0.2)

        filler = threading.Thread(target=token_controller, daemon=True)
        filler.start()

        here = os.path.join(work, "repo")
        os.makedirs(os.path.join(here, "home"))
        for d in ("charts", "manifests"):
            os.symlink(os.path.join(os.path.abspath(repo), d), os.path.join(here, d))
        env = dict(os.environ, KUBECONFIG=kubeconfig, HOME=os.path.join(here, "home"),
                   PATH=os.path.abspath(tools) + os.pathsep + os.environ["PATH"],
                   HELM_CACHE_HOME=f"{work}/helm/cache", HELM_CONFIG_HOME=f"{work}/helm/config",
                   HELM_DATA_HOME=f"{work}/helm/data")
        r = subprocess.run(["bash", "-c", "set -euo pipefail -x\n" + script], cwd=here, env=env,
                           capture_output=True, text=True, timeout=240)
        check(r.returncode == 0, f"the README's block exited {r.returncode}:\n{r.stdout}{r.stderr}")
        check("world" in r.stdout, f"kubectl get tj did not list the job: {r.stdout}")

        # What the block left behind works.
        for m in MEMBERS:
            secret = k("london", "-n", NS, "get", "secret", f"geotrain-member-{m}", "-o", "json",
                       ok=False)
            if not check(secret.returncode == 0, f"no Secret geotrain-member-{m} in the hub"):
                continue
            path = os.path.join(work, f"stored-{m}.kubeconfig")
            with open(path, "wb") as f:
                f.write(base64.b64decode(json.loads(secret.stdout)["data"]["kubeconfig"]))
            got = subprocess.run([kubectl, "--kubeconfig", path, "--cache-dir", f"{work}/kc-{m}",
                                  "get", "jobs", "--all-namespaces"],
                                 capture_output=True, text=True)
            check(got.returncode == 0,
                  f"the stored kubeconfig of {m} does not reach it: {got.stdout}{got.stderr}")
        deploy = k("london", "-n", NS, "get", "deployment", "geotrain-controller", "-o", "json")
        if deploy.returncode == 0:
            args = json.loads(deploy.stdout)["spec"]["template"]["spec"]["containers"][0]["args"]
            for m in MEMBERS:
                check(f"--member={m}=geotrain-member-{m}:kubeconfig" in args,
                      f"the controller does not name member {m}: {args}")
        k("london", "get", "trainingjob", "world")
    finally:
        stop.set()
        for s in servers:
            s.terminate()
            s.wait()

    if failures:
        print(f"{len(failures)} check(s) failed")
        sys.exit(1)
    print("the README's deploy block ran top to bottom")


if __name__ == "__main__":
    main()
