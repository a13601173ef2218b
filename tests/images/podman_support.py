"""What the image tests share: podman with the settings scripts/images.sh
writes (CONTAINERS_CONF), the images' names, the skip rule, networks with
addresses chosen by the test, and clean-up of everything a test created.

Skip rule: a test that cannot run podman exits 77 (ctest: skipped) with the
reason, except under CI=true, where the images are part of what CI checks:
there it fails.
"""

import ipaddress
import json
import os
import shutil
import subprocess
import sys
import time

REPO = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "../.."))
TAG = os.environ.get("GEO_IMAGE_TAG", "0.1.0")
CONTROLLER = f"ghcr.io/geotrain/controller:{TAG}"
WORKER = f"ghcr.io/geotrain/worker-cpu:{TAG}"

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../support"))
from checks import check, failures, finish  # noqa: E402,F401


def skip_or_fail(reason):
    """Ends the test: skipped (77) with `reason`, or failed under CI=true."""
    if os.environ.get("CI") == "true":
        print(f"FAIL (CI=true, no skipping): {reason}", flush=True)
        sys.exit(1)
    print(f"SKIP: {reason}", flush=True)
    sys.exit(77)




class Podman:
    """podman with scripts/images.sh's containers.conf; every container and
    network made through it carries `prefix` in its name and is removed by
    cleanup()."""

    def __init__(self, prefix):
        if shutil.which("podman") is None:
            skip_or_fail("podman is not installed (scripts/images.sh installs it)")
        r = subprocess.run([os.path.join(REPO, "scripts", "images.sh"), "--containers-conf"],
                           capture_output=True, text=True)
        if r.returncode != 0:
            skip_or_fail(f"scripts/images.sh --containers-conf: {r.stderr.strip()}")
        self.env = dict(os.environ, CONTAINERS_CONF=r.stdout.strip().splitlines()[-1])
        self.prefix = f"{prefix}-{os.getpid()}"
        self.containers, self.networks = [], []
        for image in (CONTROLLER, WORKER):
            if self.run("image", "exists", image, ok=None).returncode != 0:
                skip_or_fail(f"image {image} is not built (the images_build test, "
                             "scripts/images.sh)")

    def run(self, *args, ok=True, timeout=600, **kwargs):
        """podman ARGS; ok=True: a failure is a failed check, None: not checked."""
        r = subprocess.run(["podman", *args], capture_output=True, text=True, env=self.env,
                           timeout=timeout, **kwargs)
        if ok:
            check(r.returncode == 0, f"podman {' '.join(args)}: exit {r.returncode}: "
                                     f"{r.stderr.strip()[-1500:]}")
        return r

    def name(self, what):
        return f"{self.prefix}-{what}"

    def network(self, what):
        """A new bridge network; returns (name, its addresses from the 10th on)."""
        name = self.name(what)
        self.run("network", "create", name)
        self.networks.append(name)
        info = json.loads(self.run("network", "inspect", name).stdout or "[{}]")[0]
        subnet = ipaddress.ip_network(info["subnets"][0]["subnet"])
        return name, [str(a) for a in list(subnet.hosts())[9:]]

    def start(self, what, args, image_and_command):
        """podman run -d --name PREFIX-WHAT ARGS IMAGE_AND_COMMAND; the name."""
        name = self.name(what)
        self.containers.append(name)
        self.run("run", "-d", "--name", name, *args, *image_and_command)
        return name

    def wait(self, name, timeout):
        """The container's exit code, or None when it is still running after
        `timeout` seconds."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            r = self.run("inspect", "--format", "{{.State.Status}} {{.State.ExitCode}}", name,
                         ok=None)
            status, _, code = r.stdout.strip().partition(" ")
            if r.returncode == 0 and status in ("exited", "stopped"):
                return int(code)
            time.sleep(0.5)
        return None

    def logs(self, name):
        r = self.run("logs", name, ok=None)
        return r.stdout + r.stderr

    def ip(self, name, network):
        r = self.run("inspect", "--format", "{{json .NetworkSettings.Networks}}", name, ok=None)
        return (json.loads(r.stdout or "{}").get(network) or {}).get("IPAddress", "")

    def cleanup(self):
        for name in self.containers:
            self.run("rm", "-f", "-t", "0", name, ok=None)
        for name in self.networks:
            self.run("network", "rm", "-f", name, ok=None)
