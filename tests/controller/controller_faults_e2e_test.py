#!/usr/bin/python3
"""geotrain-controller under faults, as processes: a hub and a member cluster
"tokyo" (test apiservers), two controller replicas with leader election, and
real kubectl. Each fault must end with the region objects a job gets without
it, and no duplicate Job:

1. The leader killed while it creates a job's regions: the standby takes over
   and finishes them.
2. The member unreachable for a minute and back: its apiserver stopped
   (SIGSTOP: connections open, nothing answers, as a partition looks) while
   a job is applied. The hub's Services are written meanwhile (within one
   request time-out, 30 s: a request with no answer is not retried), no
   workers start before every region's objects exist, the member is
   reported unreachable, and once it answers again every object is created.
3. The hub's history compacted and every watch cut (SIGUSR1 to its test
   apiserver: an etcd compaction) just before a job is applied: the
   controller's watches come back from versions that are gone, get 410
   Gone, list again, and create the job's regions.
4. The hub's apiserver killed (SIGKILL) the moment a job is applied, and
   started again 3 s later on the same port, certificates and objects (as
   a control plane restarts): the controller reconnects and completes the
   job's regions. A leader that could not renew its Lease meanwhile exits
   (as controller-runtime's managers do, so that two never lead at once);
   the standby, or the replica itself once restarted, completes them.

Each replica is restarted 10 s after it exits, as its Deployment would be
(Clusters.start_controller).

Usage: controller_faults_e2e_test.py GEOTRAIN_CONTROLLER GEO_TEST_APISERVER TOOLS_BIN REPO
Exit 77 (skipped) without kubectl.
"""

import json
import os
import re
import signal
import sys
import tempfile
import time
import urllib.request

from e2e_support import Clusters, check, report, wait_for

OUTAGE_SECONDS = 60
HUB_DOWN_SECONDS = float(os.environ.get("GEO_HUB_DOWN_SECONDS", "3"))


def http(url):
    try:
        with urllib.request.urlopen(url, timeout=3) as r:
            return r.read().decode()
    except OSError:
        return ""


def job(name):
    return {"apiVersion": "geotrain.io/v1alpha1", "kind": "TrainingJob",
            "metadata": {"name": name, "namespace": "ml"},
            "spec": {"sync": {"algorithm": "dts", "period": 4},
                     "regions": [{"name": "london", "replicas": 2,
                                  "gateway": {"serviceType": "ClusterIP"}},
                                 {"name": "tokyo", "cluster": "tokyo",
                                  "gateway": {"serviceType": "NodePort",
                                              "endpoint": "tk.example.org:31000"}}]}}


def main():
    controller, apiserver, tools, repo = sys.argv[1:5]
    kubectl_bin = os.path.join(tools, "kubectl")
    if not os.access(kubectl_bin, os.X_OK):
        print(f"SKIP: {kubectl_bin} is not installed (scripts/install-kube-tools.sh)")
        sys.exit(77)
    work = tempfile.mkdtemp(prefix="geo-controller-faults-")
    clusters = Clusters(apiserver, controller, kubectl_bin, repo, work, ["hub", "tokyo"])
    try:
        replicas = {name: clusters.start_controller(name) for name in ("c1", "c2")}
        leader = wait_for("a leader", lambda: clusters.leader() in replicas and clusters.leader())
        standby = "c2" if leader == "c1" else "c1"

        def apply(name):
            path = os.path.join(work, f"{name}.json")
            with open(path, "w") as f:
                json.dump(job(name), f)
            clusters.kubectl("hub", "apply", "-f", path)

        def objects(cluster, name):
            """Kind and name (the job's name replaced by X) of every object
            the job owns in `cluster`, and how many Jobs it has there."""
            found, jobs = set(), 0
            for kind in ("job", "configmap", "secret", "service"):
                listed = clusters.get(cluster, kind, "-n", "ml", "-l",
                                      f"geotrain.io/job={name}") or {"items": []}
                for item in listed["items"]:
                    found.add((kind, item["metadata"]["name"].replace(name, "X")))
                    jobs += kind == "job"
            return found, jobs

        def settled(name, want):
            got = {c: objects(c, name)[0] for c in ("hub", "tokyo")}
            return got == want and got

        def check_settled(name, after, timeout):
            """Waits until `name` has the baseline's objects; fails naming what
            it has instead."""
            got = wait_for(f"{name}'s objects", lambda: settled(name, baseline), timeout=timeout)
            check(got, f"after {after}: {({c: objects(c, name)[0] for c in baseline})}"
                       f" against {baseline}")

        # The objects of a job applied without a fault.
        apply("base")
        wait_for("base's Jobs", lambda: clusters.get("tokyo", "job", "base-tokyo", "-n", "ml")
                 and clusters.get("hub", "job", "base-london", "-n", "ml"))
        time.sleep(2)  # every object of the pass written
        baseline = {c: objects(c, "base")[0] for c in ("hub", "tokyo")}
        check(("job", "X-london") in baseline["hub"] and ("job", "X-tokyo") in baseline["tokyo"],
              f"baseline {baseline}")
        print(f"baseline: {sum(len(v) for v in baseline.values())} objects", flush=True)

        # 1. The leader killed as it creates a job's regions.
        # Killed as soon as kubectl returns: the leader has seen the job or
        # is about to, and writes its regions' objects within milliseconds.
        apply("takeover")
        replicas[leader]["proc"].kill()
        replicas[leader]["proc"].wait()
        killed = time.time()
        partial = {c: len(objects(c, "takeover")[0]) for c in ("hub", "tokyo")}
        print(f"leader {leader} killed with {partial} of the job's objects written", flush=True)
        wait_for("the standby to lead", lambda: clusters.leader() == standby, timeout=20)
        check_settled("takeover", "the takeover", 30)
        print(f"takeover's regions complete {time.time() - killed:.1f} s after the kill",
              flush=True)
        for cluster in ("hub", "tokyo"):
            check(objects(cluster, "takeover")[1] == 1, f"{cluster}: one Job for takeover")

        # 2. tokyo unreachable for a minute while a job is applied.
        metrics = f"http://127.0.0.1:{replicas[standby]['metrics']}/metrics"
        tokyo = clusters.servers["tokyo"]
        tokyo.send_signal(signal.SIGSTOP)
        stopped = time.time()
        try:
            apply("outage")
            # The hub's Services are written all the same; no region's
            # workers start before every region's objects exist.
            london = wait_for("outage's london Services while tokyo is out", lambda: (
                lambda got: ("service", "X-london-gateway") in got and got)(
                    objects("hub", "outage")[0]), timeout=50)
            check(london, "the hub's region was held up by the unreachable member")
            unreachable = wait_for("tokyo reported unreachable", lambda: re.search(
                r'geotrain_region_reachable\{[^}]*region="tokyo"[^}]*\} 0', http(metrics)),
                timeout=50)
            check(unreachable, "geotrain_region_reachable{region=\"tokyo\"} never went to 0")
            time.sleep(max(0.0, OUTAGE_SECONDS - (time.time() - stopped)))
            check(objects("hub", "outage")[1] == 0, "london's workers started without tokyo's")
        finally:
            tokyo.send_signal(signal.SIGCONT)
        back = time.time()
        check_settled("outage", "the outage", 60)
        print(f"tokyo out {back - stopped:.0f} s; its region complete {time.time() - back:.1f} s "
              f"after it answered again", flush=True)
        check(wait_for("tokyo reachable again", lambda: re.search(
            r'geotrain_region_reachable\{[^}]*region="tokyo"[^}]*\} 1', http(metrics)),
            timeout=30), "geotrain_region_reachable{region=\"tokyo\"} did not come back to 1")

        # 3. The hub's history compacted, every watch cut, and a job applied
        # before the controller watches again.
        log = replicas[standby]["log"]
        relists_before = open(log).read().count("listing again")
        clusters.servers["hub"].send_signal(signal.SIGUSR1)
        apply("compacted")
        compacted = time.time()
        check_settled("compacted", "the compaction", 30)
        relisted = [line for line in open(log).read().split("\n")
                    if "listing again" in line][relists_before:]
        check(any("410" in line for line in relisted),
              f"no informer listed again after a 410: {relisted[-3:]}")
        print(f"compaction: {len(relisted)} informer(s) listed again after "
              f"410 Gone; compacted's regions complete {time.time() - compacted:.1f} s after "
              f"the apply", flush=True)
        # 4. The hub's apiserver restarted as a job is applied.
        restarts_before = {name: r["restarts"] for name, r in replicas.items()}
        apply("restarted")
        clusters.restart_server("hub", HUB_DOWN_SECONDS)
        back = time.time()
        check_settled("restarted", "the restart", 60)
        exited = [name for name, r in replicas.items()
                  if r["restarts"] > restarts_before[name] or r["proc"].poll() is not None]
        print(f"hub restart: restarted's regions complete {time.time() - back:.1f} s after the "
              f"hub answered again; replicas that exited: {exited or 'none'}; "
              f"{clusters.leader()} leads", flush=True)
        for name in ("base", "takeover", "outage", "compacted", "restarted"):
            for cluster in ("hub", "tokyo"):
                check(objects(cluster, name)[1] == 1, f"{cluster}: one Job for {name}")
    finally:
        clusters.close()
    report(work)


if __name__ == "__main__":
    main()
