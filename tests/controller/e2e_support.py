"""What the controller's end-to-end tests share: checks that record failures
instead of stopping at the first, loopback ports that no outgoing connection
can take (outside the kernel's ephemeral range, see tests/worker/free_ports.py),
and polling with a time-out."""

import json
import os
import re
import subprocess
import sys
import threading
import time
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../worker"))
from free_ports import free_ports  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../support"))
from checks import check, failures, finish  # noqa: E402,F401


def report(work):
    """Exits: 0 when every check passed; else 1, after the end of each
    controller log under `work`."""
    if failures:
        for name in sorted(os.listdir(work)):
            if name.endswith(".log") and name.startswith("controller"):
                print(f"--- {name}")
                print(open(os.path.join(work, name)).read()[-3000:])
        print(f"{len(failures)} check(s) failed")
        sys.exit(1)
    print("all checks passed")


_given = set()


def free_port():
    """A free loopback port (free_ports), never one this process handed out
    before: a replica picks its ports before the one started just before it
    has bound its own, and a port two replicas share fails one of them at
    every restart."""
    while True:
        port = free_ports(1)[0]
        if port not in _given:
            _given.add(port)
            return port


def wait_for(what, predicate, timeout=30):
    """predicate()'s first truthy value, polled every 0.25 s; None (and a
    failed check) after `timeout` seconds."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.25)
    check(False, f"timed out after {timeout} s waiting for {what}")
    return None


class Clusters:
    """Test apiservers (HTTPS, tokens) as processes, one per cluster name, with
    real kubectl against them, the TrainingJob CRD in the first (the hub),
    namespace `ml` everywhere, a kubeconfig Secret per member in
    geotrain-system, and geotrain-controller replicas on demand, each kept
    running as its Deployment would keep it. Every process is killed by
    close()."""

    def __init__(self, apiserver, controller, kubectl_bin, repo, work, names):
        self.apiserver, self.controller, self.kubectl_bin = apiserver, controller, kubectl_bin
        self.repo, self.work, self.names = repo, work, list(names)
        self.kc, self.procs, self.servers, self.tokens = {}, [], {}, {}
        self.closing, self.lock = threading.Event(), threading.Lock()
        try:
            self._set_up()
        except BaseException:
            self.close()  # no server outlives a set-up that failed
            raise

    def _set_up(self):
        apiserver, repo, work = self.apiserver, self.repo, self.work
        for cluster in self.names:
            self.kc[cluster] = os.path.join(work, f"{cluster}.kubeconfig")
            self.servers[cluster] = self._start_server(cluster, 0)
        for cluster in self.names:
            wait_for(f"{cluster} kubeconfig", lambda c=cluster: os.path.exists(self.kc[c]) and
                     os.path.getsize(self.kc[c]) > 0)
        hub = self.names[0]
        self.kubectl(hub, "apply", "-f", os.path.join(repo, "manifests", "crd"))
        self.kubectl(hub, "wait", "--for=condition=Established", "--timeout=20s",
                     "crd/trainingjobs.geotrain.io")
        for cluster in self.names:
            self.kubectl(cluster, "create", "namespace", "ml")
        self.kubectl(hub, "create", "namespace", "geotrain-system")
        for member in self.names[1:]:
            self.kubectl(hub, "-n", "geotrain-system", "create", "secret", "generic",
                         f"geotrain-member-{member}", f"--from-file=kubeconfig={self.kc[member]}")

    def _start_server(self, cluster, port):
        # Its certificates and objects in files of its own, so that
        # restart_server() brings back the same cluster.
        token = self.tokens.setdefault(cluster, uuid.uuid4().hex)
        return self.start(
            [self.apiserver, "--tls", "--port", str(port), "--kubeconfig-out", self.kc[cluster],
             "--token", token,
             "--tls-dir", os.path.join(self.work, f"tls-{cluster}"),
             "--state-file", os.path.join(self.work, f"state-{cluster}.json")],
            os.path.join(self.work, f"apiserver-{cluster}.log"), append=port != 0)

    def restart_server(self, cluster, down_seconds):
        """Kills a cluster's apiserver (SIGKILL: no clean stop) and starts it
        again after `down_seconds` on the same port, certificates and
        objects, as a control plane restarts."""
        with open(self.kc[cluster]) as f:
            port = int(re.search(r'"server": "https://127\.0\.0\.1:(\d+)"', f.read()).group(1))
        self.servers[cluster].kill()
        self.servers[cluster].wait()
        time.sleep(down_seconds)
        self.servers[cluster] = self._start_server(cluster, port)
        wait_for(f"{cluster}'s apiserver back", lambda: self.kubectl(
            cluster, "get", "namespace", "ml", ok=False).returncode == 0)

    def start(self, args, log, append=False):
        with self.lock:  # nothing starts once close() has begun
            if self.closing.is_set():
                raise RuntimeError("Clusters closed")
            p = subprocess.Popen(args, stdout=open(log, "a" if append else "w"),
                                 stderr=subprocess.STDOUT)
            self.procs.append(p)
            return p

    def kubectl(self, cluster, *args, ok=True):
        r = subprocess.run([self.kubectl_bin, "--kubeconfig", self.kc[cluster],
                            "--request-timeout=10s", "--cache-dir",
                            f"{self.work}/cache-{cluster}"] + list(args),
                           capture_output=True, text=True)
        if ok:
            check(r.returncode == 0, f"kubectl {' '.join(args)}: {r.stdout}{r.stderr}")
        return r

    def get(self, cluster, *args):
        r = self.kubectl(cluster, "get", *args, "-o", "json", ok=False)
        return json.loads(r.stdout) if r.returncode == 0 else None

    def start_controller(self, name, lease="4s", renew="3s", restart_after=10):
        """A replica with leader election against the hub, every member by
        its Secret; returns {proc, metrics, health, log, restarts}.

        Whenever it exits (killed, or a leader that could not renew its Lease
        within `renew`, which exits as controller-runtime's managers do) it is
        started again `restart_after` seconds later with the same arguments,
        ports and log, as the kubelet restarts a Deployment's container (10 s
        is its first back-off); "proc" is then the new process and "restarts"
        counts them."""
        metrics, health = free_port(), free_port()
        log = os.path.join(self.work, f"controller-{name}.log")
        args = [self.controller, "--kubeconfig", self.kc[self.names[0]],
                "--namespace", "geotrain-system", "--identity", name,
                "--lease-duration", lease, "--renew-deadline", renew,
                "--metrics-listen", f"127.0.0.1:{metrics}",
                "--health-listen", f"127.0.0.1:{health}",
                "--worker-image", "registry.example/worker:1"]
        for member in self.names[1:]:
            args += ["--member", f"{member}=geotrain-member-{member}"]
        replica = {"proc": self.start(args, log), "metrics": metrics, "health": health,
                   "log": log, "restarts": 0}

        def supervise():
            while not self.closing.wait(0.2):
                if replica["proc"].poll() is None:
                    continue
                if self.closing.wait(restart_after):
                    return
                try:
                    replica["proc"] = self.start(args, log, append=True)
                except RuntimeError:
                    return
                replica["restarts"] += 1

        threading.Thread(target=supervise, name=f"supervise-{name}", daemon=True).start()
        return replica

    def leader(self):
        return (self.get(self.names[0], "lease", "geotrain-controller", "-n", "geotrain-system")
                or {}).get("spec", {}).get("holderIdentity")

    def close(self):
        with self.lock:
            self.closing.set()
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()
