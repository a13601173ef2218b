#!/usr/bin/python3
"""The built images, run with podman (scripts/images.sh builds them; the
images_build test does so once per ctest run):

- both images run as the non-root user 65532;
- the controller image: `--help`, and /healthz and /readyz of a controller
  that watches the test apiserver (on the host), with a read-only root file
  system and every capability dropped;
- the CPU worker image: 50 steps on Fashion-MNIST from the image's own
  dataset-fashion-mnist, read-only root, no capabilities, no network;
- two worker containers in two regions (london, tokyo) on a podman network,
  with CURVE keys made by the image's `geotrain keygen`, training with DTS to
  the end: both exit 0 with the same number of steps;
- a worker whose secret key does not match the public key the job lists for
  its rank is refused: its peer counts and logs the refused key.
Usage: smoke_test.py GEO_TEST_APISERVER
Exit 77 (skipped) when podman or the images are missing, except with CI=true.
"""

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import yaml

from podman_support import CONTROLLER, REPO, WORKER, Podman, check, finish

sys.path.insert(0, os.path.join(REPO, "tests", "support"))
from podman_kubelet import KubeApi  # noqa: E402

# Every container runs like a restricted pod.
LOCKED = ["--read-only", "--cap-drop=ALL", "--security-opt", "no-new-privileges"]


def http_get(url, timeout=3):
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, ""
    except OSError:
        return 0, ""


def wait_until(what, predicate, timeout):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    check(False, f"timed out after {timeout} s waiting for {what}")
    return None


def done_event(output):
    """The worker's `done` progress event (--progress-format jsonl), or {}."""
    for line in output.splitlines():
        if line.startswith("{") and '"event":"done"' in line.replace(" ", ""):
            return json.loads(line)
    return {}


def timed(what, f):
    started = time.time()
    f()
    print(f"{what}: {time.time() - started:.1f} s", flush=True)


def users(podman):
    for image in (CONTROLLER, WORKER):
        user = podman.run("image", "inspect", "--format", "{{.Config.User}}", image).stdout.strip()
        check(user == "65532:65532", f"{image}: USER {user!r}, expected 65532:65532")
        r = podman.run("run", "--rm", "--entrypoint", "id", image)
        check(r.stdout.startswith("uid=65532") and "gid=65532" in r.stdout,
              f"{image}: id says {r.stdout.strip()!r}")


def controller(podman, apiserver, work):
    r = podman.run("run", "--rm", *LOCKED, "--network", "none", CONTROLLER, "--help")
    check("--kubeconfig" in r.stdout and "--worker-image" in r.stdout,
          f"controller --help: {r.stdout[:500]}")
    # The test apiserver on the host's loopback; the controller in the
    # host's network namespace reaches it there.
    kubeconfig = os.path.join(work, "kubeconfig")
    server = subprocess.Popen([apiserver, "--tls", "--port", "0", "--kubeconfig-out", kubeconfig],
                              stdout=open(os.path.join(work, "apiserver.log"), "w"),
                              stderr=subprocess.STDOUT)
    try:
        wait_until("the test apiserver's kubeconfig",
                   lambda: os.path.exists(kubeconfig) and os.path.getsize(kubeconfig) > 0, 30)
        os.chmod(kubeconfig, 0o644)  # read by user 65532 in the container
        # Ready means watching TrainingJobs: their API must be served.
        with open(os.path.join(REPO, "manifests", "crd", "trainingjobs.geotrain.io.yaml")) as f:
            crd = next(d for d in yaml.safe_load_all(f) if d)
        KubeApi.from_kubeconfig(kubeconfig).create(
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        health = sock.getsockname()[1]
        sock.close()
        name = podman.start("controller", [*LOCKED, "--network", "host", "-v",
                                           f"{kubeconfig}:/etc/geotrain/kubeconfig:ro"],
                            [CONTROLLER, "--kubeconfig", "/etc/geotrain/kubeconfig",
                             "--namespace", "default", "--leader-elect=false",
                             "--health-listen", f"127.0.0.1:{health}",
                             "--metrics-listen", "127.0.0.1:0"])
        for path in ("healthz", "readyz"):
            ok = wait_until(f"the controller's /{path}", lambda p=path: http_get(
                f"http://127.0.0.1:{health}/{p}")[0] == 200, 60)
            if not ok:
                print(podman.logs(name)[-3000:])
        podman.run("rm", "-f", "-t", "5", name, ok=None)
    finally:
        server.kill()
        server.wait()


def single_worker(podman):
    r = podman.run("run", "--rm", *LOCKED, "--network", "none", WORKER, "--steps", "50",
                   "--set", "metrics.enabled=false", "--set", "training.evalInterval=50",
                   "--progress-format", "jsonl", timeout=300)
    done = done_event(r.stdout)
    check(done.get("step") == 50, f"one worker, 50 steps: done event {done}; "
                                  f"stderr {r.stderr[-2000:]}")
    print(f"one worker: {done.get('step')} steps, test accuracy {done.get('testAccuracy')}",
          flush=True)


def keygen(podman, keys, names):
    for name in names:
        r = podman.run("run", "--rm", "--network", "none", *LOCKED, "-v", f"{keys}:/keys",
                       "--entrypoint", "geotrain", WORKER, "keygen", "--out", "/keys",
                       "--name", name)
        check(f"wrote /keys/{name}.key" in r.stdout, f"geotrain keygen --name {name}: {r.stdout}")


def two_regions(podman, steps, keys, what):
    """Rank 0 in london, rank 1 in tokyo, each on its region's network and
    the `wan` network, DTS between them; keys[i] (a folder) read-only at
    /keys of region i. Returns the two container names."""
    wan, wan_ips = podman.network(f"{what}-wan")
    regions = ("london", "tokyo")
    common = ["--set", "worker.worldSize=2", "--set", "transport.regions=london,tokyo",
              "--set", "transport.peers=tcp://london-0:7000,tcp://tokyo-0:7000",
              "--set", "transport.keyDir=/keys", "--set", "sync.algorithm=dts",
              "--set", "sync.period=4", "--set", "metrics.listen=0.0.0.0:9400",
              "--set", "metrics.lingerSeconds=0", "--steps", str(steps),
              "--set", f"training.evalInterval={steps}", "--progress-format", "jsonl"]
    hosts = [f"--add-host=london-0:{wan_ips[0]}", f"--add-host=tokyo-0:{wan_ips[1]}"]
    names = []
    for i, region in enumerate(regions):
        net, _ = podman.network(f"{what}-{region}")
        names.append(podman.start(f"{what}-{region}-0", [
            *LOCKED, "--network", net, "--network", f"{wan}:ip={wan_ips[i]}", *hosts,
            "--hostname", f"{region}-0", "-v", f"{keys[i]}:/keys:ro"],
            [WORKER, "--set", f"worker.region={region}", *common, "--completion-index", "0"]))
    return names


def dts(podman, work):
    keys = os.path.join(work, "keys")
    os.mkdir(keys)
    os.chmod(keys, 0o777)  # keygen writes as user 65532
    keygen(podman, keys, ["worker-0", "worker-1"])
    steps = 200
    names = two_regions(podman, steps, [keys, keys], "dts")
    codes = [podman.wait(n, 300) for n in names]
    for name, code in zip(names, codes):
        out = podman.logs(name)
        check(code == 0, f"{name}: exit {code}: {out[-2500:]}")
        done = done_event(podman.run("logs", name, ok=None).stdout)
        check(done.get("step") == steps, f"{name}: done event {done}")
        print(f"{name}: exit {code}, {done.get('step')} steps, "
              f"test accuracy {done.get('testAccuracy')}", flush=True)


def wrong_key(podman, work):
    # Each region's keys from its own keygen: tokyo's pair is sound (so it
    # starts), but london lists another public key for rank 1.
    dirs = [os.path.join(work, f"wrong-{r}") for r in ("london", "tokyo")]
    for d in dirs:
        os.mkdir(d)
        os.chmod(d, 0o777)
    keygen(podman, dirs[0], ["worker-0", "worker-1"])
    keygen(podman, dirs[1], ["worker-1"])
    os.remove(os.path.join(dirs[0], "worker-1.key"))
    shutil.copy(os.path.join(dirs[0], "worker-0.pub"), dirs[1])
    names = two_regions(podman, 100000, dirs, "wrong")
    london, tokyo = names
    refused = wait_until("london to refuse tokyo's key",
                         lambda: "refused connection" in podman.logs(london), 90)
    if refused:
        ip = podman.ip(london, podman.name("wrong-london"))

        def counted():
            return [float(line.split()[-1]) for line in
                    http_get(f"http://{ip}:9400/metrics")[1].splitlines()
                    if line.startswith("geotrain_transport_refused_total{") and
                    'reason="key"' in line]

        if not wait_until("london's /metrics to count the refused key",
                          lambda: any(v >= 1 for v in counted()), 30):
            print(f"refused key counters: {counted()}")
    else:
        print(podman.logs(london)[-3000:])
    check(not done_event(podman.run("logs", tokyo, ok=None).stdout),
          "the worker with the wrong key finished training")


def main():
    apiserver = sys.argv[1]
    podman = Podman("geo-smoke")
    work = tempfile.mkdtemp(prefix="geo-images-smoke-")
    try:
        timed("non-root users", lambda: users(podman))
        timed("controller --help, /healthz, /readyz", lambda: controller(podman, apiserver, work))
        timed("one worker, 50 steps", lambda: single_worker(podman))
        timed("two regions, DTS", lambda: dts(podman, work))
        timed("a wrong key", lambda: wrong_key(podman, work))
    finally:
        podman.cleanup()
        shutil.rmtree(work, ignore_errors=True)
    finish()


if __name__ == "__main__":
    main()
