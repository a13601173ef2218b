#!/usr/bin/python3
"""The Helm chart (charts/geotrain), checked with real helm and kubectl.

1. yamllint on every YAML file of the repository; helm lint --strict,
   for role hub and role member;
2. helm template for hub (default values and tests/charts/values-hub.yaml)
   and member: every object well formed, namespaced ones in the release
   namespace, the output passes yamllint (.yamllint);
   names start with the release's (or fullnameOverride), so two releases
   share no object name, cluster-scoped ones included; serviceAccount,
   priorityClassName, the PodDisruptionBudget, and the monitors: the
   ServiceMonitor selects the controller, the PodMonitor (both roles) the
   worker pods the controller renders (tests/controller/reconcile/golden);
3. values.schema.json and the templates refuse bad values, naming them in
   --set's spelling and saying why, and the chart refuses a Kubernetes older
   than its kubeVersion;
4. no drift from manifests/: the chart's CRD is byte-identical to
   manifests/crd, its RBAC has the same rules, roleRefs and subjects as
   manifests/rbac, and the dashboard ConfigMap holds the dashboard file;
5. helm install, upgrade and uninstall of a hub and a member into two test
   apiservers (tests/support, TLS), with kubectl seeing what was installed;
   with the Prometheus Operator's kinds served, auto creates the monitors;
   two releases in one cluster (a hub and a member, two members); the
   member's NOTES, run as printed, write a kubeconfig that reaches the
   member and store it in the hub.
Usage: chart_test.py TOOLS_BIN GEO_TEST_APISERVER REPO_ROOT
Exit 77 (skipped) when helm or kubectl is not installed.
"""

import base64
import json
import os
import subprocess
import sys
import tempfile
import time

import yaml

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../support"))
from checks import check, failures, finish  # noqa: E402,F401


def run(cmd, env=None, ok=True, cwd=None):
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd)
    if ok:
        check(r.returncode == 0, f"{' '.join(cmd)} exited {r.returncode}:\n{r.stdout}{r.stderr}")
    return r


def objects(text):
    return [d for d in yaml.safe_load_all(text) if d]


def key(o):
    return (o["kind"], o["metadata"]["name"])


CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition"}


def notes_blocks(notes):
    """The command blocks of NOTES (lines indented by exactly two spaces,
    between blank lines), in order, each as one shell script."""
    blocks, block = [], []
    for line in notes.splitlines() + [""]:
        if line.startswith("  ") and not line.startswith("   "):
            block.append(line[2:])
        elif block:
            blocks.append("\n".join(block) + "\n")
            block = []
    return blocks


def worker_pod_template(repo):
    """A worker pod template as the controller renders it (a golden file)."""
    path = os.path.join(repo, "tests", "controller", "reconcile", "golden", "world", "tokyo.yaml")
    with open(path) as f:
        for o in objects(f.read()):
            if o["kind"] == "Job":
                return o["spec"]["template"]
    raise RuntimeError(f"no Job in {path}")


def main():
    tools, apiserver, repo = sys.argv[1], sys.argv[2], sys.argv[3]
    helm, kubectl = os.path.join(tools, "helm"), os.path.join(tools, "kubectl")
    for tool in (helm, kubectl):
        if not os.access(tool, os.X_OK):
            print(f"SKIP: {tool} is not installed (scripts/install-kube-tools.sh)")
            sys.exit(77)
    chart = os.path.join(repo, "charts", "geotrain")
    ns = "geotrain-system"
    work = tempfile.mkdtemp(prefix="geo-chart-")
    env = dict(os.environ, HELM_CACHE_HOME=f"{work}/cache", HELM_CONFIG_HOME=f"{work}/config",
               HELM_DATA_HOME=f"{work}/data")

    # 1. (and every YAML file of the repository's manifests, chart and tests)
    # Relative paths: .yamllint's ignore patterns are relative to the root.
    lint = run(["yamllint", "-c", ".yamllint", "-f", "parsable", "."], ok=False, cwd=repo)
    errors = [line for line in lint.stdout.splitlines() if "[error]" in line]
    check(not errors, f"yamllint: {errors[:5]}")
    for role in ("hub", "member"):
        run([helm, "lint", "--strict", chart, "--set", f"role={role}"], env)

    # 2.
    values_hub = os.path.join(repo, "tests", "charts", "values-hub.yaml")
    rendered = {
        "hub": run([helm, "template", "geotrain", chart, "-n", ns], env).stdout,
        "hub-values": run([helm, "template", "geotrain", chart, "-n", ns, "-f", values_hub],
                          env).stdout,
        "member": run([helm, "template", "geotrain", chart, "-n", ns, "--set", "role=member"],
                      env).stdout,
    }
    for name, text in rendered.items():
        objs = objects(text)
        check(objs, f"{name}: no objects")
        for o in objs:
            check(all(k in o for k in ("apiVersion", "kind", "metadata")), f"{name}: {o}")
            if o["kind"] not in CLUSTER_SCOPED:
                check(o["metadata"].get("namespace") == ns,
                      f"{name}: {key(o)} not in the release namespace")
        path = os.path.join(work, f"{name}.yaml")
        with open(path, "w") as f:
            f.write(text)
        lint = run(["yamllint", "-c", os.path.join(repo, ".yamllint"), "-f", "parsable", path],
                   ok=False)
        errors = [line for line in lint.stdout.splitlines() if "[error]" in line]
        check(not errors, f"yamllint on the {name} output: {errors[:5]}")
    hub = {key(o): o for o in objects(rendered["hub-values"])}
    deploy = hub[("Deployment", "geotrain-controller")]
    pod = deploy["spec"]["template"]["spec"]
    args = pod["containers"][0]["args"]
    check("--member=tokyo=geotrain-member-tokyo:kubeconfig" in args, f"member args: {args}")
    check("--lease-name=geotrain-controller" in args, f"lease name: {args}")
    check(pod["serviceAccountName"] == "geotrain-controller", f"serviceAccountName: {pod}")
    check("priorityClassName" not in pod, "a priorityClassName by default")
    check(("ServiceMonitor", "geotrain-controller") in hub, "serviceMonitor.enabled: true")
    default_hub = {key(o): o for o in objects(rendered["hub"])}
    check(("ServiceMonitor", "geotrain-controller") not in default_hub,
          "a ServiceMonitor without the operator")
    check(("PodMonitor", "geotrain-workers") not in default_hub,
          "a PodMonitor without the operator")
    sm = hub[("ServiceMonitor", "geotrain-controller")]
    service = hub[("Service", "geotrain-controller-metrics")]
    check(sm["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
          and sm["spec"]["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"],
          f"the ServiceMonitor does not select the controller's Service: {sm['spec']}")
    pdb = default_hub.get(("PodDisruptionBudget", "geotrain-controller"))
    if check(pdb is not None, "no PodDisruptionBudget for two replicas"):
        check(pdb["spec"]["maxUnavailable"] == 1 and
              pdb["spec"]["selector"] == default_hub[("Deployment", "geotrain-controller")]
              ["spec"]["selector"], f"PodDisruptionBudget: {pdb['spec']}")
    member_kinds = sorted(o["kind"] for o in objects(rendered["member"]))
    check(member_kinds == ["ClusterRole", "ClusterRoleBinding", "Secret", "ServiceAccount"],
          f"member objects (no CRD, no controller): {member_kinds}")

    def template(release, *args):
        r = run([helm, "template", release, chart, "-n", ns] + list(args), env)
        return {key(o): o for o in objects(r.stdout)}

    # Two releases in one cluster: no object name in common (helm refuses to
    # take over another release's object), cluster-scoped ones included.
    monitors = ["--api-versions", "monitoring.coreos.com/v1/PodMonitor",
                "--api-versions", "monitoring.coreos.com/v1/ServiceMonitor"]
    for a, b in ((["geotrain"], ["team-a", "--set", "role=member"]),
                 (["geotrain", "--set", "role=member"], ["team-a", "--set", "role=member"]),
                 (["geotrain"], ["x", "--set", "fullnameOverride=second"])):
        objs_a, objs_b = template(*(a + monitors)), template(*(b + monitors))
        common = set(objs_a) & set(objs_b) - {("CustomResourceDefinition",
                                               "trainingjobs.geotrain.io")}
        check(not common, f"releases {a} and {b} both write {sorted(common)}")
    team = template("team-a", "--set", "role=member")
    check(("ClusterRole", "team-a-geotrain-member") in team and
          ("Secret", "team-a-geotrain-member-token") in team, f"release team-a: {sorted(team)}")
    binding = team[("ClusterRoleBinding", "team-a-geotrain-member")]
    check(binding["roleRef"]["name"] == "team-a-geotrain-member" and
          binding["subjects"][0]["name"] == "team-a-geotrain-member", f"binding: {binding}")
    over = template("x", "--set", "fullnameOverride=ml", "--set", "nameOverride=gt")
    d = over.get(("Deployment", "ml-controller"))
    if check(d is not None, f"fullnameOverride: {sorted(over)}"):
        check("--lease-name=ml-controller" in d["spec"]["template"]["spec"]["containers"][0]["args"]
              and d["metadata"]["labels"]["app.kubernetes.io/name"] == "gt",
              f"fullnameOverride / nameOverride: {d['metadata']}")
        check(("ClusterRoleBinding", "ml-member-local") in over and
              over[("ClusterRoleBinding", "ml-hub")]["subjects"][0]["name"] == "ml-controller",
              f"fullnameOverride: {sorted(over)}")
    long = template("a" * 53)  # the longest release name helm allows
    check(all(len(n) <= 63 for _, n in long), f"names over 63 characters: {sorted(long)}")

    # serviceAccount, priorityClassName, the PDB's conditions.
    sa = template("geotrain", "--set", "serviceAccount.annotations.iam\\.gke\\.io/gcp-service-account"
                  "=geotrain@p.iam.gserviceaccount.com", "--set", "priorityClassName=high")
    check(sa[("ServiceAccount", "geotrain-controller")]["metadata"].get("annotations") ==
          {"iam.gke.io/gcp-service-account": "geotrain@p.iam.gserviceaccount.com"},
          f"serviceAccount.annotations: {sa[('ServiceAccount', 'geotrain-controller')]}")
    check(sa[("Deployment", "geotrain-controller")]["spec"]["template"]["spec"]
          .get("priorityClassName") == "high", "priorityClassName")
    # A writable HOME for exec credential plugins, and what users add.
    extra = template("geotrain", "--set", "extraEnv[0].name=AWS_REGION",
                     "--set", "extraEnv[0].value=ap-northeast-1",
                     "--set", "extraVolumes[0].name=plugin,extraVolumes[0].emptyDir.medium=Memory",
                     "--set", "extraVolumeMounts[0].name=plugin",
                     "--set", "extraVolumeMounts[0].mountPath=/opt/plugin")
    pod = extra[("Deployment", "geotrain-controller")]["spec"]["template"]["spec"]
    container = pod["containers"][0]
    variables = {e["name"]: e.get("value") for e in container["env"]}
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    check(variables.get("HOME") == "/home/geotrain" and mounts.get("home") == "/home/geotrain"
          and container["securityContext"]["readOnlyRootFilesystem"] is True,
          f"a writable HOME on a read-only root: {variables} {mounts}")
    check(variables.get("AWS_REGION") == "ap-northeast-1" and
          mounts.get("plugin") == "/opt/plugin" and
          {"name": "plugin", "emptyDir": {"medium": "Memory"}} in pod["volumes"],
          f"extraEnv, extraVolumes, extraVolumeMounts: {variables} {mounts} {pod['volumes']}")
    sa = template("geotrain", "--set", "serviceAccount.create=false",
                  "--set", "serviceAccount.name=ml-identity")
    check(("ServiceAccount", "geotrain-controller") not in sa, "serviceAccount.create=false")
    check(sa[("Deployment", "geotrain-controller")]["spec"]["template"]["spec"]
          ["serviceAccountName"] == "ml-identity", "serviceAccount.name")
    for o in sa.values():
        for subject in o.get("subjects", []):
            check(subject["name"] == "ml-identity", f"{key(o)} binds {subject}")
    check(("PodDisruptionBudget", "geotrain-controller") not in
          template("geotrain", "--set", "replicaCount=1"), "a PDB for a single replica")
    check(("PodDisruptionBudget", "geotrain-controller") not in
          template("geotrain", "--set", "podDisruptionBudget.enabled=false"),
          "podDisruptionBudget.enabled=false")

    # The PodMonitor, in both roles, selects the worker pods the controller
    # renders, by their metrics port, keeping their job/region/rank labels.
    worker = worker_pod_template(repo)
    ports = [p["name"] for c in worker["spec"]["containers"] for p in c.get("ports", [])]
    for role in ("hub", "member"):
        objs = template("geotrain", "--set", f"role={role}", *monitors)
        pm = objs.get(("PodMonitor", "geotrain-workers"))
        if not check(pm is not None, f"{role}: no PodMonitor with the operator's kinds served"):
            continue
        check(pm["spec"]["selector"]["matchLabels"].items() <= worker["metadata"]["labels"].items(),
              f"{role}: the PodMonitor selects {pm['spec']['selector']}, the workers have "
              f"{worker['metadata']['labels']}")
        endpoint = pm["spec"]["podMetricsEndpoints"][0]
        check(endpoint["port"] in ports and endpoint.get("honorLabels") is True,
              f"{role}: PodMonitor endpoint {endpoint}, worker ports {ports}")
        check(pm["spec"]["namespaceSelector"] == {"any": True}, f"{role}: {pm['spec']}")
        check((("ServiceMonitor", "geotrain-controller") in objs) == (role == "hub"),
              f"{role}: ServiceMonitor")
    pm = template("geotrain", "--set", "metrics.podMonitor.enabled=true",
                  "--set", "metrics.podMonitor.namespaces={ml,research}")[("PodMonitor",
                                                                         "geotrain-workers")]
    check(pm["spec"]["namespaceSelector"] == {"matchNames": ["ml", "research"]},
          f"podMonitor.namespaces: {pm['spec']}")
    check(not template("geotrain", "--set", "metrics.podMonitor.enabled=false",
                       *monitors).get(("PodMonitor", "geotrain-workers")),
          "podMonitor.enabled=false")

    # 3.
    for bad, phrase in ((["--set", "role=bogus"], "role"),
                        (["--set", "replicaCount=0"], "/replicaCount"),
                        (["--set", "logLevel=loud"], "/logLevel"),
                        (["--set", "members[0].name=Tokyo,members[0].kubeconfigSecret=s"],
                         'members[0].name: "Tokyo" is not allowed: a member\'s name must be a DNS '
                         'label'),
                        (["--set", "members[0].name=local,members[0].kubeconfigSecret=s"],
                         'members[0].name: "local" is not allowed: local is the hub\'s own '
                         'cluster'),
                        (["--set", "members[0].name=tokyo,members[0].kubeconfigSecret=s,"
                          "members[1].name=tokyo,members[1].kubeconfigSecret=t"],
                         'members[1].name: "tokyo" is not allowed: members[0] has the same name'),
                        (["--set", "members[0].kubeconfigSecret=s"],
                         "missing property 'name'"),
                        (["--set", "fullnameOverride=Team_A"],
                         'fullnameOverride: "Team_A" is not allowed'),
                        (["--set", "serviceAccount.create=maybe"], "/serviceAccount/create"),
                        (["--set", "podDisruptionBudget.maxUnavailable=0"],
                         "/podDisruptionBudget/maxUnavailable"),
                        (["--set", "metrics.podMonitor.enabled=yes"],
                         "/metrics/podMonitor/enabled"),
                        # The region Jobs' per-worker retries (docs/kubernetes.md).
                        (["--kube-version", "1.28.9"], "kubeVersion")):
        r = run([helm, "template", "geotrain", chart] + bad, env, ok=False)
        check(r.returncode != 0 and phrase in r.stderr, f"{bad} accepted or unclear: {r.stderr}")
    run([helm, "template", "geotrain", chart, "--kube-version", "1.29.0"], env)

    # 4.
    for name in os.listdir(os.path.join(repo, "manifests", "crd")):
        with open(os.path.join(repo, "manifests", "crd", name)) as a, \
                open(os.path.join(chart, "files", name)) as b:
            check(a.read() == b.read(), f"charts/geotrain/files/{name} differs from manifests/crd")
            crd = objects(open(os.path.join(repo, "manifests", "crd", name)).read())[0]
        rendered_crd = hub[("CustomResourceDefinition", crd["metadata"]["name"])]
        check(rendered_crd["spec"] == crd["spec"], "the chart renders another CRD spec")
        check(rendered_crd["metadata"]["annotations"].get("helm.sh/resource-policy") == "keep",
              "the CRD is not kept on uninstall")
    member = {key(o): o for o in objects(rendered["member"])}
    for name in ("hub.yaml", "member.yaml", "member-local-binding.yaml"):
        with open(os.path.join(repo, "manifests", "rbac", name)) as f:
            for o in objects(f.read()):
                if o["kind"] not in ("ClusterRole", "Role", "ClusterRoleBinding", "RoleBinding"):
                    continue
                chart_obj = hub.get(key(o)) or member.get(key(o))
                if not check(chart_obj is not None, f"the chart has no {key(o)}"):
                    continue
                for field in ("rules", "roleRef", "subjects"):
                    check(o.get(field) == chart_obj.get(field),
                          f"{key(o)}.{field}: manifests/rbac {o.get(field)} != chart "
                          f"{chart_obj.get(field)}")
    cm = hub[("ConfigMap", "geotrain-dashboard-wan")]
    with open(os.path.join(chart, "dashboards", "geotrain-wan.json")) as f:
        check(json.loads(cm["data"]["geotrain-wan.json"]) == json.load(f),
              "the dashboard ConfigMap differs from dashboards/geotrain-wan.json")
    print("lint, template, schema and drift checks done", flush=True)

    # 5.
    servers = []
    try:
        configs = {}
        for cluster in ("hub", "tokyo"):
            cfg = os.path.join(work, f"{cluster}.kubeconfig")
            servers.append(subprocess.Popen([apiserver, "--tls", "--port", "0",
                                             "--kubeconfig-out", cfg],
                                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
            for _ in range(100):
                if os.path.exists(cfg) and os.path.getsize(cfg) > 0:
                    break
                time.sleep(0.1)
            configs[cluster] = cfg

        def k(cluster, *args):
            return run([kubectl, "--kubeconfig", configs[cluster], "--cache-dir",
                        f"{work}/kcache-{cluster}"] + list(args))

        def h(cluster, *args):
            return run([helm, "--kubeconfig", configs[cluster]] + list(args), env)

        h("hub", "install", "geotrain", chart, "-n", ns, "--create-namespace")
        k("hub", "wait", "--for=condition=Established", "--timeout=20s",
          "crd/trainingjobs.geotrain.io")
        out = k("hub", "get", "deployment,serviceaccount,configmap,poddisruptionbudget", "-n", ns,
                "-o", "name").stdout
        for name in ("deployment.apps/geotrain-controller", "serviceaccount/geotrain-controller",
                     "configmap/geotrain-dashboard-wan",
                     "poddisruptionbudget.policy/geotrain-controller"):
            check(name in out, f"hub install: {name} missing in {out}")
        # (Without the Prometheus Operator's CRDs a ServiceMonitor cannot be
        # installed, as on a real cluster: auto leaves it out.)
        h("hub", "upgrade", "geotrain", chart, "-n", ns, "-f", values_hub, "--set",
          "metrics.serviceMonitor.enabled=auto")
        args = json.loads(k("hub", "get", "deployment", "geotrain-controller", "-n", ns, "-o",
                            "json").stdout)["spec"]["template"]["spec"]["containers"][0]["args"]
        check("--member=tokyo=geotrain-member-tokyo:kubeconfig" in args,
              f"upgrade did not change the args: {args}")
        # Once the cluster serves the operator's kinds, auto creates both.
        k("hub", "apply", "-f", os.path.join(repo, "tests", "charts", "testdata",
                                             "prometheus-operator-crds.yaml"))
        k("hub", "wait", "--for=condition=Established", "--timeout=20s",
          "crd/servicemonitors.monitoring.coreos.com", "crd/podmonitors.monitoring.coreos.com")
        h("hub", "upgrade", "geotrain", chart, "-n", ns, "-f", values_hub, "--set",
          "metrics.serviceMonitor.enabled=auto")
        out = k("hub", "get", "servicemonitors,podmonitors", "-n", ns, "-o", "name").stdout
        for name in ("servicemonitor.monitoring.coreos.com/geotrain-controller",
                     "podmonitor.monitoring.coreos.com/geotrain-workers"):
            check(name in out, f"auto with the operator's kinds: {name} missing in {out}")

        # A second release in the hub's cluster: a member of another hub.
        h("hub", "install", "team-b", chart, "-n", "team-b", "--create-namespace", "--set",
          "role=member", "--set", "metrics.podMonitor.enabled=false")
        out = k("hub", "get", "clusterrole,clusterrolebinding", "-o", "name").stdout
        for name in ("clusterrole.rbac.authorization.k8s.io/geotrain-member",
                     "clusterrole.rbac.authorization.k8s.io/team-b-geotrain-member",
                     "clusterrolebinding.rbac.authorization.k8s.io/geotrain-member-local",
                     "clusterrolebinding.rbac.authorization.k8s.io/team-b-geotrain-member"):
            check(name in out, f"hub and member releases in one cluster: {name} missing in {out}")

        h("tokyo", "install", "geotrain", chart, "-n", ns, "--create-namespace", "--set",
          "role=member")
        out = k("tokyo", "get", "clusterrole,serviceaccount", "-n", ns, "-o", "name").stdout
        check("clusterrole.rbac.authorization.k8s.io/geotrain-member" in out, out)
        check("trainingjobs" not in k("tokyo", "api-resources", "-o", "name").stdout,
              "a member got the CRD")
        # Two members of two hubs in one cluster.
        h("tokyo", "install", "other", chart, "-n", "other", "--create-namespace", "--set",
          "role=member")
        out = k("tokyo", "get", "clusterrolebinding", "-o", "json").stdout
        subjects = {b["metadata"]["name"]: b["subjects"] for b in json.loads(out)["items"]}
        check(subjects.get("geotrain-member") ==
              [{"kind": "ServiceAccount", "name": "geotrain-member", "namespace": ns}] and
              subjects.get("other-geotrain-member") ==
              [{"kind": "ServiceAccount", "name": "other-geotrain-member", "namespace": "other"}],
              f"two member releases: {subjects}")

        # The member's NOTES, run as printed: first against the member (the
        # test apiserver has no token controller, so the test fills in the
        # token Secret as kube-controller-manager would), then the hub.
        with open(configs["tokyo"]) as f:
            tokyo_cfg = yaml.safe_load(f)
        tokyo_cluster = tokyo_cfg["clusters"][0]["cluster"]
        tokyo_token = tokyo_cfg["users"][0]["user"]["token"]
        k("tokyo", "-n", ns, "patch", "secret", "geotrain-member-token", "--type", "merge", "-p",
          json.dumps({"data": {"token": base64.b64encode(tokyo_token.encode()).decode(),
                               "ca.crt": tokyo_cluster["certificate-authority-data"]}}))
        notes = h("tokyo", "get", "notes", "geotrain", "-n", ns).stdout
        blocks = notes_blocks(notes)
        if check(len(blocks) == 2, f"the member's NOTES: two command blocks expected:\n{notes}"):
            recipe = os.path.join(work, "recipe")
            os.makedirs(os.path.join(recipe, "home"))
            shell_env = dict(env, HOME=os.path.join(recipe, "home"),
                             PATH=tools + os.pathsep + os.environ["PATH"],
                             KUBECONFIG=configs["tokyo"])
            script = "set -euo pipefail\n" + blocks[0] + \
                f"export KUBECONFIG={configs['hub']}\n" + blocks[1]
            r = run(["bash", "-c", script], shell_env, cwd=recipe)
            secret = json.loads(k("hub", "-n", ns, "get", "secret", "geotrain-member-tokyo", "-o",
                                  "json").stdout or "{}")
            written = os.path.join(work, "from-secret.kubeconfig")
            with open(written, "wb") as f:
                f.write(base64.b64decode(secret.get("data", {}).get("kubeconfig", "")))
            with open(written) as f:
                cfg = yaml.safe_load(f) or {}
            check(cfg.get("clusters", [{}])[0].get("cluster", {}).get("server") ==
                  tokyo_cluster["server"], f"the stored kubeconfig's server: {cfg}")
            run([kubectl, "--kubeconfig", written, "--cache-dir", f"{work}/kcache-recipe", "get",
                 "jobs", "--all-namespaces"])

        for cluster, release, namespace in (("hub", "geotrain", ns), ("hub", "team-b", "team-b"),
                                            ("tokyo", "geotrain", ns), ("tokyo", "other", "other")):
            h(cluster, "uninstall", release, "-n", namespace, "--wait")
        out = k("hub", "get", "deployment,configmap,clusterrole", "-A", "-o", "name").stdout
        check("geotrain-controller" not in out and "geotrain-dashboard" not in out and
              "geotrain-member" not in out, f"left after uninstall: {out}")
        check("trainingjobs.geotrain.io" in k("hub", "get", "crd", "-o", "name").stdout,
              "the CRD went with the release (its TrainingJobs with it)")
        print("helm install, upgrade and uninstall of hubs and members, and the member's "
              "NOTES, done", flush=True)
    finally:
        for s in servers:
            s.terminate()
            s.wait()

    finish()


if __name__ == "__main__":
    main()
