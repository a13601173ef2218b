"""A kubelet, a Job controller and a cloud load balancer for the test
apiserver, with podman: runs the pods of the Indexed Jobs in a namespace as
podman containers and writes back what those three would. Test
infrastructure, not product; README.md lists what it does and does not do.

    cluster = KubeApi.from_kubeconfig(path)
    node = PodmanKubelet(cluster, "ml", podman_argv, env, region_net, wan, work_dir)
    while ...: node.sync()        # one pass: Services, Jobs, pods, probes
    node.cleanup()                 # removes every container it started

Addresses are the test's to give: `region_net` and `wan` are (network name,
list of free addresses); pod k of a region's Job gets the k-th region
address (its pod IP) and a wan address, the first wan address of a Job's
index 0 being what a LoadBalancer Service selecting index 0 gets as its
ingress IP (so it is known before the pod exists, as a cloud's is).
"""

import base64
import copy
import json
import os
import re
import secrets
import ssl
import subprocess
import urllib.error
import urllib.request
from datetime import datetime, timezone


def now():
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class KubeApi:
    """A few REST calls against one API server, from a kubeconfig whose
    user has a bearer token (what the test apiserver writes)."""

    def __init__(self, server, ca_pem=None, token=None):
        self.server = server.rstrip("/")
        self.token = token
        self.context = ssl.create_default_context(cadata=ca_pem) if ca_pem else None

    @classmethod
    def from_kubeconfig(cls, path):
        with open(path) as f:
            config = json.load(f)  # the test apiserver writes JSON
        cluster = config["clusters"][0]["cluster"]
        ca = cluster.get("certificate-authority-data")
        return cls(cluster["server"], base64.b64decode(ca).decode() if ca else None,
                   config["users"][0]["user"].get("token"))

    def request(self, method, path, body=None, content_type="application/json"):
        """The decoded JSON answer, or None for 404; other errors raise."""
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.server + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", content_type)
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(req, context=self.context, timeout=10) as r:
                return json.loads(r.read() or b"null")
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return None
            raise RuntimeError(f"{method} {path}: {e.code} {e.read().decode()[:500]}") from None

    def get(self, path):
        return self.request("GET", path)

    def create(self, path, body):
        return self.request("POST", path, body)

    def merge_patch(self, path, body):
        return self.request("PATCH", path, body, "application/merge-patch+json")


def expand(text, env):
    """Kubernetes' $(VAR) expansion of command, args and env values: $(VAR)
    is VAR's value when VAR is defined (else left as written), $$ is $."""
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)",
                  lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), text)


def ranges(indexes):
    """Job status.completedIndexes: "0-2,4"."""
    out, run = [], []
    for i in sorted(indexes):
        if run and i == run[-1] + 1:
            run.append(i)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [i]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)


class PodmanKubelet:
    def __init__(self, api, namespace, podman, env, region_net, wan, work,
                 cluster_domain="cluster.local", node_name="podman"):
        self.api, self.ns, self.podman, self.env = api, namespace, podman, env
        self.region_net, self.region_ips = region_net
        self.wan, self.wan_ips = wan
        self.work, self.domain, self.node = work, cluster_domain, node_name
        self.pods = {}  # pod name -> what this node knows of it
        self.events = []  # what happened, for the test's log
        self.wan_of = {}  # (job name, index) -> wan address

    # -- helpers ------------------------------------------------------------

    def run(self, *args):
        return subprocess.run([*self.podman, *args], capture_output=True, text=True,
                              env=self.env, timeout=120)

    def note(self, text):
        self.events.append(f"{now()} {text}")
        print(f"[node {self.region_net}] {text}", flush=True)

    def wan_address(self, job, index):
        key = (job, index)
        if key not in self.wan_of:
            self.wan_of[key] = self.wan_ips[len(self.wan_of)]
        return self.wan_of[key]

    def base(self):
        return f"/api/v1/namespaces/{self.ns}"

    # -- the cloud's load balancer -------------------------------------------

    def serve_load_balancers(self):
        """A LoadBalancer Service selecting a Job's completion index 0 gets
        the wan address of that pod as its ingress IP."""
        services = self.api.get(self.base() + "/services") or {"items": []}
        for svc in services["items"]:
            spec = svc.get("spec", {})
            if spec.get("type") != "LoadBalancer":
                continue
            if svc.get("status", {}).get("loadBalancer", {}).get("ingress"):
                continue
            selector = spec.get("selector", {})
            index = selector.get("batch.kubernetes.io/job-completion-index")
            job = selector.get("batch.kubernetes.io/job-name") or \
                f"{selector.get('geotrain.io/job')}-{selector.get('geotrain.io/region')}"
            if index is None:
                continue
            ip = self.wan_address(job, int(index))
            self.api.request("PATCH", f"{self.base()}/services/{svc['metadata']['name']}/status",
                             {"status": {"loadBalancer": {"ingress": [{"ip": ip}]}}},
                             "application/merge-patch+json")
            self.note(f"service {svc['metadata']['name']}: load balancer {ip}")

    # -- the Job controller --------------------------------------------------

    def sync(self):
        self.serve_load_balancers()
        jobs = self.api.get(f"/apis/batch/v1/namespaces/{self.ns}/jobs") or {"items": []}
        for job in jobs["items"]:
            self.sync_job(job)

    def sync_job(self, job):
        name = job["metadata"]["name"]
        spec = job["spec"]
        if spec.get("suspend") or spec.get("completionMode") != "Indexed":
            return
        if any(c.get("type") in ("Complete", "Failed") and c.get("status") == "True"
               for c in job.get("status", {}).get("conditions", [])):
            return
        mine = {p: s for p, s in self.pods.items() if s["job"] == name}
        have = {s["index"] for s in mine.values()}
        for index in range(spec.get("completions", 1)):
            if index not in have:
                self.start_pod(job, index)
        for pod in [p for p, s in self.pods.items() if s["job"] == name]:
            self.sync_pod(pod)
        self.write_job_status(job)

    def write_job_status(self, job):
        name = job["metadata"]["name"]
        mine = [s for s in self.pods.values() if s["job"] == name]
        done = {s["index"] for s in mine if s["phase"] == "Succeeded"}
        failed = [s for s in mine if s["phase"] == "Failed"]
        status = {"active": sum(s["phase"] in ("Pending", "Running") for s in mine),
                  "ready": sum(s["ready"] for s in mine),
                  "succeeded": len(done), "failed": len(failed),
                  "completedIndexes": ranges(done) or None,
                  "startTime": job.get("status", {}).get("startTime") or now()}
        conditions = []
        if failed:
            # No retries here: the first failed pod fails its index, and
            # maxFailedIndexes 0 fails the Job.
            message = f"pod {failed[0]['pod']} exited {failed[0]['exit']}"
            conditions = [{"type": t, "status": "True", "reason": "MaxFailedIndexesExceeded",
                           "message": message, "lastTransitionTime": now(),
                           "lastProbeTime": now()} for t in ("FailureTarget", "Failed")]
            status["failedIndexes"] = ranges({s["index"] for s in failed})
        elif len(done) == job["spec"].get("completions", 1):
            conditions = [{"type": t, "status": "True", "reason": "CompletionsReached",
                           "message": "Reached expected number of succeeded pods",
                           "lastTransitionTime": now(), "lastProbeTime": now()}
                          for t in ("SuccessCriteriaMet", "Complete")]
            status["completionTime"] = now()
        if conditions:
            status["conditions"] = conditions
            status["active"] = 0
            status["ready"] = 0
        old = job.get("status", {})
        if all(old.get(k) == v for k, v in status.items() if k not in ("startTime",)) and \
                old.get("startTime"):
            return
        self.api.merge_patch(f"/apis/batch/v1/namespaces/{self.ns}/jobs/{name}/status",
                             {"status": status})

    # -- the kubelet ---------------------------------------------------------

    def start_pod(self, job, index):
        """Creates the Pod object as the Job controller would, then runs it."""
        meta, template = job["metadata"], copy.deepcopy(job["spec"]["template"])
        name = f"{meta['name']}-{index}-{secrets.token_hex(3)[:5]}"
        labels = dict(template.get("metadata", {}).get("labels", {}))
        labels.update({"batch.kubernetes.io/job-completion-index": str(index),
                       "batch.kubernetes.io/controller-uid": meta["uid"],
                       "batch.kubernetes.io/job-name": meta["name"],
                       "controller-uid": meta["uid"], "job-name": meta["name"]})
        annotations = dict(template.get("metadata", {}).get("annotations", {}))
        annotations["batch.kubernetes.io/job-completion-index"] = str(index)
        spec = template["spec"]
        spec["hostname"] = f"{meta['name']}-{index}"
        spec["nodeName"] = self.node
        for c in spec["containers"]:
            c.setdefault("env", []).append({"name": "JOB_COMPLETION_INDEX", "value": str(index)})
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": name, "namespace": self.ns, "labels": labels,
                            "annotations": annotations,
                            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job",
                                                 "name": meta["name"], "uid": meta["uid"],
                                                 "controller": True,
                                                 "blockOwnerDeletion": True}]},
               "spec": spec}
        created = self.api.create(self.base() + "/pods", pod)
        state = {"pod": name, "job": meta["name"], "index": index, "phase": "Pending",
                 "ready": False, "exit": None, "container": None,
                 "ip": self.region_ips[index], "uid": created["metadata"]["uid"],
                 "completions": job["spec"].get("completions", 1)}
        self.pods[name] = state
        self.note(f"pod {name} (index {index}) created")
        self.set_pod_status(name, {"phase": "Pending", "conditions": [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": now()}]})
        try:
            self.run_container(created, state)
        except ContainerConfigError as e:
            self.note(f"pod {name}: {e}")
            self.set_pod_status(name, {"containerStatuses": [{
                "name": spec["containers"][0]["name"], "ready": False, "restartCount": 0,
                "image": spec["containers"][0]["image"],
                "state": {"waiting": {"reason": "CreateContainerConfigError",
                                      "message": str(e)}}}]})

    def materialize(self, pod, volume, into):
        """Writes a configMap, secret or projected volume as the kubelet's
        atomic writer does: the files in a timestamped folder, ..data a link
        to it, and each file a link through ..data; group fsGroup, modes as
        the items say (default 0644), plus group read (fsGroup)."""
        files = {}  # path -> (bytes, mode)

        def take(source, kind, default_mode):
            obj = self.api.get(f"{self.base()}/{kind}s/{source['name']}")
            if obj is None:
                if source.get("optional"):
                    return
                raise ContainerConfigError(f"{kind} \"{source['name']}\" not found")
            data = {k: v.encode() for k, v in obj.get("data", {}).items()} if kind == "configmap" \
                else {k: base64.b64decode(v) for k, v in obj.get("data", {}).items()}
            items = source.get("items") or [{"key": k, "path": k} for k in data]
            for item in items:
                if item["key"] not in data:
                    # As the kubelet's MakePayload: a key missing from an
                    # optional source is skipped, from a required one it
                    # fails the mount.
                    if source.get("optional"):
                        continue
                    raise ContainerConfigError(
                        f"{kind} references non-existent config key: {item['key']} "
                        f"({kind} {self.ns}/{source['name']})")
                files[item["path"]] = (data[item["key"]], item.get("mode", default_mode))

        if "configMap" in volume:
            take(volume["configMap"], "configmap", volume["configMap"].get("defaultMode", 0o644))
        elif "secret" in volume:
            s = dict(volume["secret"], name=volume["secret"]["secretName"])
            take(s, "secret", s.get("defaultMode", 0o644))
        elif "projected" in volume:
            default = volume["projected"].get("defaultMode", 0o644)
            for source in volume["projected"]["sources"]:
                for kind, key in (("configmap", "configMap"), ("secret", "secret")):
                    if key in source:
                        take(source[key], kind, default)
        fs_group = pod["spec"].get("securityContext", {}).get("fsGroup")
        stamp = "..{}".format(datetime.now().strftime("%Y_%m_%d_%H_%M_%S.%f"))
        os.makedirs(os.path.join(into, stamp))
        for path, (content, mode) in files.items():
            target = os.path.join(into, stamp, path)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with open(target, "wb") as f:
                f.write(content)
            os.chmod(target, mode | (0o440 if fs_group is not None else 0))
            if fs_group is not None:
                os.chown(target, 0, fs_group)
            top = path.split("/")[0]
            if not os.path.lexists(os.path.join(into, top)):
                os.symlink(os.path.join("..data", top), os.path.join(into, top))
        os.symlink(stamp, os.path.join(into, "..data"))
        for d in (into, os.path.join(into, stamp)):
            if fs_group is not None:
                os.chown(d, 0, fs_group)
                os.chmod(d, 0o2755 | 0o050)
            else:
                os.chmod(d, 0o755)

    def run_container(self, pod, state):
        spec = pod["spec"]
        if len(spec["containers"]) != 1 or spec.get("initContainers"):
            raise ContainerConfigError("this node runs pods of exactly one container")
        c = spec["containers"][0]
        psc, csc = spec.get("securityContext", {}), c.get("securityContext", {})
        image = c["image"]
        inspect = self.run("image", "inspect", "--format", "{{.Config.User}}", image)
        if inspect.returncode != 0:
            raise ContainerConfigError(f"image {image} is not on this node (ErrImageNeverPull)")
        image_user = inspect.stdout.strip().split(":")[0]
        uid = csc.get("runAsUser", psc.get("runAsUser"))
        gid = csc.get("runAsGroup", psc.get("runAsGroup"))
        if csc.get("runAsNonRoot", psc.get("runAsNonRoot")):
            effective = uid if uid is not None else (int(image_user) if image_user.isdigit()
                                                     else None)
            if effective is None or effective == 0:
                raise ContainerConfigError(
                    f"container has runAsNonRoot and image user {image_user!r} is root or "
                    "not numeric")
        env = {}
        for e in c.get("env", []):
            if "value" in e:
                env[e["name"]] = expand(e["value"], env)
            elif "valueFrom" in e:
                raise ContainerConfigError(f"env {e['name']}: valueFrom is not supported here")
        args = ["run", "-d", "--name", f"{self.ns}-{state['pod']}",
                "--hostname", spec.get("hostname", state["pod"]),
                "--network", f"{self.region_net}:ip={state['ip']}",
                "--network", f"{self.wan}:ip={self.wan_address(state['job'], state['index'])}",
                "--read-only-tmpfs=false"]
        # Cluster DNS: every pod of the region's headless Services, and this
        # pod's own name.
        subdomain = spec.get("subdomain")
        for k in range(state["completions"] if subdomain else 0):
            host = f"{state['job']}-{k}"
            args.append(f"--add-host={host}.{subdomain}.{self.ns}.svc.{self.domain}:"
                        f"{self.region_ips[k]}")
        for k, v in env.items():
            args += ["--env", f"{k}={v}"]
        if uid is not None:
            args += ["--user", f"{uid}:{gid if gid is not None else 0}"]
        elif gid is not None:
            args += ["--user", f"{image_user or 0}:{gid}"]
        groups = list(psc.get("supplementalGroups", []))
        if psc.get("fsGroup") is not None:
            groups.append(psc["fsGroup"])
        for g in groups:
            args += ["--group-add", str(g)]
        if csc.get("readOnlyRootFilesystem"):
            args.append("--read-only")
        caps = csc.get("capabilities", {})
        for cap in caps.get("drop", []):
            args.append(f"--cap-drop={cap}")
        for cap in caps.get("add", []):
            args.append(f"--cap-add={cap}")
        if csc.get("allowPrivilegeEscalation") is False:
            args += ["--security-opt", "no-new-privileges"]
        if csc.get("privileged"):
            args.append("--privileged")
        seccomp = csc.get("seccompProfile", psc.get("seccompProfile", {})).get("type")
        if seccomp == "Unconfined":
            args += ["--security-opt", "seccomp=unconfined"]
        limits = c.get("resources", {}).get("limits", {})
        if "memory" in limits:
            args += ["--memory", str(limits["memory"]).replace("Mi", "m").replace("Gi", "g")]
        if "cpu" in limits:
            cpu = str(limits["cpu"])
            args += ["--cpus", str(int(cpu[:-1]) / 1000 if cpu.endswith("m") else float(cpu))]
        # Volumes.
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        pod_dir = os.path.join(self.work, state["pod"])
        made = {}
        for m in c.get("volumeMounts", []):
            v = volumes.get(m["name"])
            if v is None:
                raise ContainerConfigError(f"volumeMount {m['name']}: no such volume")
            host = made.get(m["name"])
            if host is None:
                host = made[m["name"]] = os.path.join(pod_dir, m["name"])
                os.makedirs(host)
                if "emptyDir" in v:
                    os.chmod(host, 0o777)
                    if psc.get("fsGroup") is not None:
                        os.chown(host, 0, psc["fsGroup"])
                        os.chmod(host, 0o2777)
                elif any(k in v for k in ("configMap", "secret", "projected")):
                    self.materialize(pod, v, host)
                else:
                    raise ContainerConfigError(f"volume {m['name']}: only configMap, secret, "
                                               "projected and emptyDir volumes here")
            sub = m.get("subPath") or expand(m.get("subPathExpr", ""), env)
            if sub:
                host = os.path.join(host, sub)
                os.makedirs(host, exist_ok=True)
            options = "ro" if m.get("readOnly") else "rw"
            args += ["-v", f"{host}:{m['mountPath']}:{options}"]
        if c.get("command"):
            args += ["--entrypoint", json.dumps([expand(a, env) for a in c["command"]])]
        args.append(image)
        args += [expand(a, env) for a in c.get("args", [])]
        # Named before it runs: a container that failed to start is removed too.
        state["container"] = f"{self.ns}-{state['pod']}"
        r = self.run(*args)
        if r.returncode != 0:
            state["phase"] = "Pending"
            raise ContainerConfigError(f"podman run: {r.stderr.strip()[-800:]}")
        state["started"] = now()
        state["phase"] = "Running"
        state["probe"] = c.get("readinessProbe")
        state["ports"] = {p.get("name"): p["containerPort"] for p in c.get("ports", [])}
        self.note(f"pod {state['pod']}: container started, pod IP {state['ip']}")
        self.write_running(state, c)

    def write_running(self, state, c):
        ready = "True" if state["ready"] else "False"
        self.set_pod_status(state["pod"], {
            "phase": "Running", "podIP": state["ip"], "podIPs": [{"ip": state["ip"]}],
            "hostIP": "127.0.0.1", "startTime": state["started"],
            "conditions": [{"type": t, "status": s, "lastTransitionTime": now()} for t, s in
                           (("PodScheduled", "True"), ("Initialized", "True"),
                            ("ContainersReady", ready), ("Ready", ready))],
            "containerStatuses": [{"name": c["name"], "image": c["image"], "ready":
                                   state["ready"], "started": True, "restartCount": 0,
                                   "state": {"running": {"startedAt": state["started"]}}}]})

    def probe(self, state):
        """The readiness probe (httpGet only; every sync pass, not every
        periodSeconds): ready while it answers 2xx or 3xx."""
        p = state.get("probe")
        if not p:
            return True
        get = p.get("httpGet")
        if not get:
            return True
        port = get["port"]
        port = state["ports"].get(port, port) if isinstance(port, str) else port
        try:
            with urllib.request.urlopen(f"http://{state['ip']}:{port}{get.get('path', '/')}",
                                        timeout=1) as r:
                return 200 <= r.status < 400
        except (OSError, urllib.error.HTTPError):
            return False

    def sync_pod(self, name):
        state = self.pods[name]
        if state["phase"] != "Running" or not state.get("started"):
            return
        r = self.run("inspect", "--format",
                     "{{.State.Status}} {{.State.ExitCode}} {{.State.FinishedAt}}",
                     state["container"])
        status, code, _ = (r.stdout.strip() + "  ").split(" ", 2)
        pod = self.api.get(f"{self.base()}/pods/{name}") or {"spec": {"containers": [{}]}}
        c = pod["spec"]["containers"][0]
        if status in ("exited", "stopped"):
            state["exit"] = int(code)
            state["ready"] = False
            state["phase"] = "Succeeded" if state["exit"] == 0 else "Failed"
            logs = self.run("logs", state["container"])
            with open(os.path.join(self.work, f"{name}.log"), "w") as f:
                f.write(logs.stdout + logs.stderr)
            self.note(f"pod {name}: exited {state['exit']}: {state['phase']}")
            ready = "False"
            self.set_pod_status(name, {
                "phase": state["phase"],
                "conditions": [{"type": t, "status": s, "lastTransitionTime": now()} for t, s in
                               (("PodScheduled", "True"), ("Initialized", "True"),
                                ("ContainersReady", ready), ("Ready", ready))],
                "containerStatuses": [{"name": c.get("name"), "image": c.get("image"),
                                       "ready": False, "started": False, "restartCount": 0,
                                       "state": {"terminated": {
                                           "exitCode": state["exit"],
                                           "reason": "Completed" if state["exit"] == 0
                                           else "Error",
                                           "startedAt": state["started"],
                                           "finishedAt": now()}}}]})
            return
        ready = self.probe(state)
        if ready != state["ready"]:
            state["ready"] = ready
            self.note(f"pod {name}: ready {ready}")
            self.write_running(state, c)

    def set_pod_status(self, name, status):
        self.api.merge_patch(f"{self.base()}/pods/{name}/status", {"status": status})

    def container_logs(self):
        """Pod name -> its container's output (so far)."""
        out = {}
        for name, state in self.pods.items():
            if state["container"]:
                r = self.run("logs", state["container"])
                out[name] = r.stdout + r.stderr
        return out

    def cleanup(self):
        for state in self.pods.values():
            if state["container"]:
                self.run("rm", "-f", "-t", "0", state["container"])


class ContainerConfigError(Exception):
    """The pod cannot start (the kubelet's CreateContainerConfigError)."""
