#!/usr/bin/python3
"""Checks docker/*.Dockerfile without a Docker engine (there is none here, and
no Dockerfile linter in Debian):

- multi-stage, every base image pinned to a tag (no :latest), the final stage
  runs as a non-root USER;
- every path COPY takes from the build context exists and is not excluded by
  .dockerignore;
- every -D option of a cmake call is a CMake or project option, and every
  --target is a target the project defines; COPY --from=build picks up the
  binaries where the build puts them;
- the runtime stage installs the Debian package of every shared library the
  binaries link directly (read from the binaries built here with readelf,
  mapped with dpkg -S); LibTorch and CUDA come with the image's own copies;
- the controller image's configuration (GEO_BUILD_WORKER=OFF, no tests, no
  benchmarks) configures, without LibTorch, and defines geotrain-controller;
  the CPU worker image's build stage configures on exactly the sources it
  copies, with its options (GEO_BUILD_CONTROLLER=OFF).
With --built (the images label, after scripts/images.sh built the controller
and CPU worker images with podman): in each built image, every binary the
Dockerfile copies in is there and finds every shared library it links
(ldd in the image), and the packages that take the most space are listed.
docker/worker.Dockerfile (CUDA) is checked statically only: it downloads
from NVIDIA's and PyTorch's sites, which a build here cannot reach.
Usage: dockerfile_test.py REPO GEOTRAIN_CONTROLLER GEOTRAIN_WORKER GEOTRAIN
       dockerfile_test.py --built REPO
"""

import fnmatch
import glob
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

failures = []


def check(ok, what):
    if not ok:
        failures.append(what)
        print("FAIL:", what, flush=True)
    return ok


def instructions(path):
    """(keyword, argument text) of each instruction, continuations joined."""
    out, current = [], ""
    for line in open(path):
        stripped = line.rstrip("\n")
        if not current and (not stripped.strip() or stripped.lstrip().startswith("#")):
            continue
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        current += stripped
        keyword, _, rest = current.strip().partition(" ")
        out.append((keyword.upper(), rest.strip()))
        current = ""
    return out


def project_options(repo):
    options = set()
    for cm in glob.glob(os.path.join(repo, "**", "CMakeLists.txt"), recursive=True) + \
            glob.glob(os.path.join(repo, "cmake", "*.cmake")):
        if "/build" in cm or "/.tools/" in cm:
            continue
        text = open(cm).read()
        options |= set(re.findall(r"\boption\((\w+)", text))
        options |= set(re.findall(r"\bset\((\w+)\s+[^)]*\bCACHE\b", text))
    return options


def project_targets(repo):
    targets = {}
    for cm in glob.glob(os.path.join(repo, "**", "CMakeLists.txt"), recursive=True):
        if "/build" in cm or "/.tools/" in cm:
            continue
        for t in re.findall(r"\badd_executable\(([\w-]+)", open(cm).read()):
            targets[t] = os.path.relpath(os.path.dirname(cm), repo)
    return targets


def package_of(path):
    real = os.path.realpath(path)
    for candidate in (real, real.replace("/usr/lib/", "/lib/", 1),
                      real.replace("/lib/", "/usr/lib/", 1)):
        r = subprocess.run(["dpkg", "-S", candidate], capture_output=True, text=True)
        if r.returncode == 0:
            return r.stdout.split(":")[0]
    return None


def needed_packages(binary):
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[(.+?)\]",
                        subprocess.run(["readelf", "-d", binary], capture_output=True,
                                       text=True).stdout)
    paths = {}
    for line in subprocess.run(["ldd", binary], capture_output=True, text=True).stdout.splitlines():
        m = re.match(r"\s*(\S+) => (\S+)", line)
        if m:
            paths[m.group(1)] = m.group(2)
    out = {}
    for lib in needed:
        if lib in paths:
            out[lib] = package_of(paths[lib])
    return out


def dockerignored(repo, relpath):
    patterns = [p.strip() for p in open(os.path.join(repo, ".dockerignore"))
                if p.strip() and not p.startswith("#")]
    return any(fnmatch.fnmatch(relpath + "/", p) or fnmatch.fnmatch(relpath, p.rstrip("/"))
               or relpath.startswith(p.rstrip("/*") + "/") for p in patterns)


# Libraries the images bring other than from Debian's archive, and the C and
# C++ runtime every Debian image has.
BUNDLED = re.compile(r"^(libtorch|libc10|libcudart|libcuda|libgcc-s1|libc6|libstdc\+\+6)")


def check_dockerfile(repo, path, binaries):
    name = os.path.basename(path)
    ins = instructions(path)
    stages = [arg for kw, arg in ins if kw == "FROM"]
    check(len(stages) >= 2, f"{name}: not multi-stage")
    for s in stages:
        image = s.split()[0]
        check(":" in image and not image.endswith(":latest"), f"{name}: FROM {image} not pinned")
    final = max(i for i, (kw, _) in enumerate(ins) if kw == "FROM")
    users = [arg for kw, arg in ins[final:] if kw == "USER"]
    check(users and users[-1].split(":")[0] not in ("0", "root"), f"{name}: runs as root")
    options, targets = project_options(repo), project_targets(repo)
    for i, (kw, arg) in enumerate(ins):
        if kw == "COPY" and "--from=" not in arg:
            *sources, _dest = shlex.split(arg)
            for src in sources:
                check(os.path.exists(os.path.join(repo, src)), f"{name}: COPY {src}: missing")
                check(not dockerignored(repo, src), f"{name}: COPY {src}: .dockerignore drops it")
        if kw == "RUN" and "cmake" in arg:
            for opt in re.findall(r"-D(\w+)=", arg):
                check(opt.startswith("CMAKE_") or opt in options,
                      f"{name}: cmake -D{opt} is not an option of the project")
            for group in re.findall(r"--target ([\w\- ]+?)(?:\s*&&|\s*\\|$)", arg):
                for t in group.split():
                    check(t in targets, f"{name}: --target {t} is not a target of the project")
        if kw == "COPY" and "--from=build" in arg:
            *sources, _dest = shlex.split(arg.replace("--from=build", ""))
            for src in sources:
                m = re.match(r"/src/build/(.+)/([\w-]+)$", src)
                if m and m.group(2) in targets:
                    check(targets[m.group(2)] == m.group(1),
                          f"{name}: {src}: the build puts {m.group(2)} in {targets[m.group(2)]}")
    runtime = " ".join(arg for kw, arg in ins[final:] if kw == "RUN")
    installed = set(re.findall(r"\b([a-z0-9][a-z0-9.+-]+[a-z0-9])\b", runtime))
    for binary in binaries:
        for lib, pkg in needed_packages(binary).items():
            if pkg is None or BUNDLED.match(pkg):
                continue
            check(pkg in installed, f"{name}: {os.path.basename(binary)} links {lib} "
                                    f"(Debian package {pkg}), not installed in the runtime stage")
    print(f"{name}: {len(stages)} stages, {len(ins)} instructions checked", flush=True)


def check_built(repo):
    """The images scripts/images.sh built, inspected with podman."""
    sys.path.insert(0, os.path.join(repo, "tests", "images"))
    from podman_support import CONTROLLER, WORKER, Podman
    podman = Podman("geo-dockerfiles")
    for image, dockerfile in ((CONTROLLER, "controller.Dockerfile"),
                              (WORKER, "worker-cpu.Dockerfile")):
        ins = instructions(os.path.join(repo, "docker", dockerfile))
        copied = []
        for kw, arg in ins:
            if kw == "COPY" and "--from=build" in arg:
                *sources, dest = shlex.split(arg.replace("--from=build", ""))
                copied += [dest.rstrip("/") + "/" + os.path.basename(s) if dest.endswith("/")
                           else dest for s in sources]
        for binary in copied:
            r = podman.run("run", "--rm", "--entrypoint", "ldd", image, binary, ok=None)
            check(r.returncode == 0 and "not found" not in r.stdout,
                  f"{image}: ldd {binary}: exit {r.returncode}: "
                  f"{[l for l in r.stdout.splitlines() if 'not found' in l] or r.stderr[-500:]}")
        size = int(podman.run("image", "inspect", "--format", "{{.Size}}", image).stdout or 0)
        r = podman.run("run", "--rm", "--entrypoint", "dpkg-query", image, "-W",
                       "-f=${Installed-Size} ${Package}\\n", ok=None)
        packages = sorted(((int(kb), name) for kb, name in
                           (line.split() for line in r.stdout.splitlines() if line.strip())),
                          reverse=True)
        total = sum(kb for kb, _ in packages)
        print(f"{image}: {size / 1e6:.0f} MB, {len(packages)} packages ({total / 1e3:.0f} MB); "
              "largest: " + ", ".join(f"{n} {kb / 1e3:.0f} MB" for kb, n in packages[:12]),
              flush=True)
        check(len(copied) >= 1, f"{dockerfile}: copies no binary from the build stage")


def configure_from_copies(repo, dockerfile):
    """Configures the build stage's cmake call on exactly what its COPY
    instructions take from the context (the sources a build has)."""
    ins = instructions(os.path.join(repo, "docker", dockerfile))
    final = max(i for i, (kw, _) in enumerate(ins) if kw == "FROM")
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "src")
        os.mkdir(src)
        for kw, arg in ins[:final]:
            if kw == "COPY" and "--from=" not in arg:
                *sources, dest = shlex.split(arg)
                for s in sources:
                    to = os.path.join(src, dest if dest not in ("./", ".") else s)
                    if os.path.isdir(os.path.join(repo, s)):
                        shutil.copytree(os.path.join(repo, s), to)
                    else:
                        os.makedirs(os.path.dirname(to), exist_ok=True)
                        shutil.copy(os.path.join(repo, s), to)
        cmake = next(arg for kw, arg in ins[:final] if kw == "RUN" and "cmake -S" in arg)
        options = re.findall(r"(-D\w+=\S+)", cmake.split("&&")[0])
        r = subprocess.run(["cmake", "-S", src, "-B", os.path.join(tmp, "build"), *options],
                           capture_output=True, text=True)
        check(r.returncode == 0, f"{dockerfile}: the build stage's configure fails on what it "
                                 f"copies:\n{r.stderr[-2000:]}")


def main():
    if sys.argv[1] == "--built":
        check_built(sys.argv[2])
        failures.extend(sys.modules["podman_support"].failures)
        if failures:
            print(f"{len(failures)} check(s) failed")
            sys.exit(1)
        print("all checks passed")
        return
    repo, controller, worker, cli = sys.argv[1:5]
    check_dockerfile(repo, os.path.join(repo, "docker", "controller.Dockerfile"), [controller])
    check_dockerfile(repo, os.path.join(repo, "docker", "worker.Dockerfile"), [worker, cli])
    check_dockerfile(repo, os.path.join(repo, "docker", "worker-cpu.Dockerfile"), [worker, cli])
    with tempfile.TemporaryDirectory() as build:
        r = subprocess.run(["cmake", "-S", repo, "-B", build, "-DGEO_BUILD_WORKER=OFF",
                            "-DGEO_BUILD_TESTS=OFF", "-DGEO_BUILD_BENCHMARKS=OFF"],
                           capture_output=True, text=True)
        check(r.returncode == 0, f"the controller image's configuration fails:\n{r.stderr[-2000:]}")
        cache = open(os.path.join(build, "CMakeCache.txt")).read() if r.returncode == 0 else ""
        check("Torch_DIR:" not in cache, "the controller's configuration looks for LibTorch")
        targets = subprocess.run(["cmake", "--build", build, "--target", "help"],
                                 capture_output=True, text=True).stdout
        check("geotrain-controller" in targets, "no geotrain-controller target without the worker")
    configure_from_copies(repo, "worker-cpu.Dockerfile")
    if failures:
        print(f"{len(failures)} check(s) failed")
        sys.exit(1)
    print("all checks passed")


if __name__ == "__main__":
    main()
