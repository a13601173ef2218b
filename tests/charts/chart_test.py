#!/usr/bin/python3
"""The Helm chart (charts/geotrain), checked with real helm and kubectl.

1. yamllint on every YAML file of the repository; helm lint --strict,
   for role hub and role member;
2. helm template for hub (default values and tests/charts/values-hub.yaml)
   and member: every object well formed, namespaced ones in the release
   namespace, the output passes yamllint (.yamllint);
3. values.schema.json refuses bad values, naming them, and the chart refuses
   a Kubernetes older than its kubeVersion;
4. no drift from manifests/: the chart's CRD is byte-identical to
   manifests/crd, its RBAC has the same rules, roleRefs and subjects as
   manifests/rbac, and the dashboard ConfigMap holds the dashboard file;
5. helm install, upgrade and uninstall of a hub and a member into two test
   apiservers (tests/support, TLS), with kubectl seeing what was installed.
Usage: chart_test.py TOOLS_BIN GEO_TEST_APISERVER REPO_ROOT
Exit 77 (skipped) when helm or kubectl is not installed.
"""

import json
import os
import subprocess
import sys
import tempfile
import time

import yaml

failures = []


def check(ok, what):
    if not ok:
        failures.append(what)
        print("FAIL:", what, flush=True)
    return ok


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
    args = deploy["spec"]["template"]["spec"]["containers"][0]["args"]
    check("--member=tokyo=geotrain-member-tokyo:kubeconfig" in args, f"member args: {args}")
    check(("ServiceMonitor", "geotrain-controller") in hub, "serviceMonitor.enabled: true")
    check(("ServiceMonitor", "geotrain-controller") not in
          {key(o) for o in objects(rendered["hub"])}, "a ServiceMonitor without the operator")
    member_kinds = sorted(o["kind"] for o in objects(rendered["member"]))
    check(member_kinds == ["ClusterRole", "ClusterRoleBinding", "Secret", "ServiceAccount"],
          f"member objects (no CRD, no controller): {member_kinds}")

    # 3.
    for bad, phrase in ((["--set", "role=bogus"], "role"),
                        (["--set", "replicaCount=0"], "/replicaCount"),
                        (["--set", "logLevel=loud"], "/logLevel"),
                        (["--set", "members[0].name=Tokyo,members[0].kubeconfigSecret=s"],
                         "/members/0/name"),
                        # The region Jobs' per-worker retries (docs/kubernetes.md).
                        (["--kube-version", "1.28.9"], "kubeVersion")):
        r = run([helm, "template", "geotrain", chart] + bad, env, ok=False)
        check(r.returncode != 0 and phrase in r.stderr, f"{bad} accepted or unclear: {r.stderr}")

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
        out = k("hub", "get", "deployment,serviceaccount,configmap", "-n", ns, "-o", "name").stdout
        for name in ("deployment.apps/geotrain-controller", "serviceaccount/geotrain-controller",
                     "configmap/geotrain-dashboard-wan"):
            check(name in out, f"hub install: {name} missing in {out}")
        # (Without the Prometheus Operator's CRDs a ServiceMonitor cannot be
        # installed, as on a real cluster: auto leaves it out.)
        h("hub", "upgrade", "geotrain", chart, "-n", ns, "-f", values_hub, "--set",
          "metrics.serviceMonitor.enabled=auto")
        args = json.loads(k("hub", "get", "deployment", "geotrain-controller", "-n", ns, "-o",
                            "json").stdout)["spec"]["template"]["spec"]["containers"][0]["args"]
        check("--member=tokyo=geotrain-member-tokyo:kubeconfig" in args,
              f"upgrade did not change the args: {args}")
        h("tokyo", "install", "geotrain", chart, "-n", ns, "--create-namespace", "--set",
          "role=member")
        out = k("tokyo", "get", "clusterrole,serviceaccount", "-n", ns, "-o", "name").stdout
        check("clusterrole.rbac.authorization.k8s.io/geotrain-member" in out, out)
        check("trainingjobs" not in k("tokyo", "api-resources", "-o", "name").stdout,
              "a member got the CRD")
        for cluster in ("hub", "tokyo"):
            h(cluster, "uninstall", "geotrain", "-n", ns, "--wait")
        out = k("hub", "get", "deployment,configmap", "-n", ns, "-o", "name").stdout
        check("geotrain-controller" not in out and "geotrain-dashboard" not in out,
              f"left after uninstall: {out}")
        check("trainingjobs.geotrain.io" in k("hub", "get", "crd", "-o", "name").stdout,
              "the CRD went with the release (its TrainingJobs with it)")
        print("helm install, upgrade and uninstall of hub and member done", flush=True)
    finally:
        for s in servers:
            s.terminate()
            s.wait()

    if failures:
        print(f"{len(failures)} check(s) failed")
        sys.exit(1)
    print("all checks passed")


if __name__ == "__main__":
    main()
