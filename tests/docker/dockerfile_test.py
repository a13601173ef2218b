#!/usr/bin/python3
"""Checks docker/*.Dockerfile without a Docker engine (there is none here, and
no Dockerfile linter in Debian).

With --lint (ctest dockerfile_lint, label lint: no binaries, no network), each
Dockerfile's text:
- every instruction is one Docker knows, with flags it takes; JSON forms
  (ENTRYPOINT, CMD) are JSON lists of strings; EXPOSE takes port numbers;
- multi-stage, every base image pinned to a tag (no :latest), the final stage
  runs as a non-root USER;
- every path COPY takes from the build context exists and is not excluded by
  .dockerignore; COPY --from names an earlier stage, and takes the binaries
  from where the build puts them;
- every -D option of a cmake call is a CMake or project option (or one of
  the variables LibTorch's CMake package reads), with a value the option
  takes (ON/OFF, GEO_USE_CUDA's AUTO/ON/OFF), and every --target is a target
  the project defines;
- every variable an instruction uses is an ARG declared in its stage (or
  before the first FROM, for FROM lines), an ENV of the stage, or set by the
  RUN itself; a stage's ARG without a default has a global one, and every
  global ARG is used;
- docker/worker.Dockerfile (CUDA): CUDA_VERSION, CUDA_PKG_VERSION, the
  CUDA packages and the LibTorch download (cuXY0, 2.9 or newer, the C++11 ABI
  build) name the same CUDA major version; TORCH_CUDA_ARCH_LIST is the
  project's CMAKE_CUDA_ARCHITECTURES (cmake/GeoCuda.cmake); the image does
  not expose every GPU of a node to pods that asked for none;
and then that each of these checks fails on a copy of worker.Dockerfile
broken the way it guards against (a missing source, an unknown target or
option, an undeclared ARG, a LibTorch for another CUDA, ...).
podman is not used here: its parser (imagebuilder) accepts nearly any text
(a FROM without an image, two stages of one name, an unterminated heredoc)
and checks an instruction only as it runs it, which for these files needs
the base images and the network first.

Without --lint (ctest dockerfiles; needs the binaries built here):
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
Usage: dockerfile_test.py --lint REPO
       dockerfile_test.py REPO GEOTRAIN_CONTROLLER GEOTRAIN_WORKER GEOTRAIN
       dockerfile_test.py --built REPO
"""

import fnmatch
import glob
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../support"))
from checks import check, failures, finish  # noqa: E402,F401


def instructions(path, text=None):
    """(keyword, argument text) of each instruction, continuations joined
    (comment lines inside a continuation are dropped, as Docker does)."""
    out, current = [], ""
    for line in (open(path).read() if text is None else text).splitlines():
        stripped = line.rstrip("\n")
        if not stripped.strip() or stripped.lstrip().startswith("#"):
            continue
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        current += stripped
        keyword, _, rest = current.strip().partition(" ")
        out.append((keyword.upper(), rest.strip()))
        current = ""
    return out


def cmake_files(repo):
    for cm in glob.glob(os.path.join(repo, "**", "CMakeLists.txt"), recursive=True) + \
            glob.glob(os.path.join(repo, "cmake", "*.cmake")):
        if "/build" in cm or "/.tools/" in cm:
            continue
        yield cm


def project_options(repo):
    """{option: the values it takes, or None for any}: option() takes a
    boolean, a cache STRING with a STRINGS property one of those."""
    options = {}
    for cm in cmake_files(repo):
        text = open(cm).read()
        for name in re.findall(r"\boption\((\w+)", text):
            options[name] = {"ON", "OFF", "TRUE", "FALSE", "YES", "NO", "1", "0"}
        for name in re.findall(r"\bset\((\w+)\s+[^)]*\bCACHE\b", text):
            options.setdefault(name, None)
        for name, values in re.findall(r"set_property\(CACHE (\w+) PROPERTY STRINGS ([^)]*)\)",
                                       text):
            options[name] = set(values.split())
    return options


def project_targets(repo):
    targets = {}
    for cm in cmake_files(repo):
        if not cm.endswith("CMakeLists.txt"):
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


KNOWN_INSTRUCTIONS = {"FROM", "RUN", "CMD", "LABEL", "EXPOSE", "ENV", "ADD", "COPY",
                      "ENTRYPOINT", "VOLUME", "USER", "WORKDIR", "ARG", "ONBUILD", "STOPSIGNAL",
                      "HEALTHCHECK", "SHELL"}
KNOWN_FLAGS = {"FROM": {"platform"}, "RUN": {"mount", "network", "security"},
               "COPY": {"from", "chown", "chmod", "link", "parents", "exclude"},
               "ADD": {"chown", "chmod", "link", "checksum", "keep-git-dir", "exclude"}}
# Variables LibTorch's CMake package (share/cmake/Caffe2, Torch) reads: -D
# options of a build against it that the project itself does not define.
LIBTORCH_CMAKE_VARIABLES = {"nvtx3_dir", "CAFFE2_USE_CUDNN", "CUDNN_ROOT", "Torch_DIR"}
CMAKE_BUILD_TYPES = {"Release", "Debug", "RelWithDebInfo", "MinSizeRel"}
# Set for every RUN by the builder or the base images.
PREDEFINED = {"PATH", "HOME", "HOSTNAME", "HTTP_PROXY", "http_proxy", "HTTPS_PROXY",
              "https_proxy", "FTP_PROXY", "ftp_proxy", "NO_PROXY", "no_proxy", "ALL_PROXY",
              "all_proxy"}
VARIABLE = re.compile(r"(?<!\\)\$(?:\{(\w+)[^}]*\}|([A-Za-z_]\w*))")


def flags_of(arg):
    """The --flags before an instruction's first other word."""
    out = []
    for word in arg.split():
        if not word.startswith("--"):
            break
        out.append(word[2:].split("=", 1)[0])
    return out


def arg_declarations(arg):
    """[(name, default or None)] of one ARG instruction."""
    out = []
    for word in shlex.split(arg):
        name, eq, default = word.partition("=")
        out.append((name, default if eq else None))
    return out


def cmake_calls(arg):
    """The argument lists of the `cmake ...` commands in one RUN."""
    calls = []
    for command in re.split(r"&&|;|\|\|", arg):
        words = command.split()
        if words and words[0] == "cmake":
            calls.append(words[1:])
    return calls


def project_cuda_architectures(repo):
    """The CMAKE_CUDA_ARCHITECTURES cmake/GeoCuda.cmake defaults to, as the
    set of compute capabilities (80-real;90 -> {80, 90})."""
    text = open(os.path.join(repo, "cmake", "GeoCuda.cmake")).read()
    m = re.search(r'set\(CMAKE_CUDA_ARCHITECTURES "([^"]+)"\)', text)
    return {int(a.split("-")[0]) for a in m.group(1).split(";")} if m else set()


def lint_cuda(repo, name, ins, problems):
    """docker/worker.Dockerfile: one CUDA major version throughout, the
    kernels' architectures, no GPU for a pod that asked for none."""
    globals_ = {}
    first = next(i for i, (kw, _) in enumerate(ins) if kw == "FROM")
    for kw, arg in ins[:first]:
        if kw == "ARG":
            globals_.update(arg_declarations(arg))
    cuda = globals_.get("CUDA_VERSION") or ""
    m = re.fullmatch(r"(\d+)\.(\d+)", cuda)
    if not m:
        problems.append(f"{name}: ARG CUDA_VERSION={cuda!r} is not MAJOR.MINOR")
        return
    major, minor = m.groups()
    package = globals_.get("CUDA_PKG_VERSION")
    if package != f"{major}-{minor}":
        problems.append(f"{name}: ARG CUDA_PKG_VERSION={package} is not CUDA_VERSION {cuda} "
                        f"as NVIDIA's packages spell it ({major}-{minor})")
    url = globals_.get("LIBTORCH_URL") or ""
    m = re.fullmatch(r"https://download\.pytorch\.org/libtorch/cu(\d+)(\d)/"
                     r"libtorch-shared-with-deps-(\d+)\.(\d+)\.(\d+)%2Bcu(\d+)\.zip", url)
    if not m:
        problems.append(f"{name}: ARG LIBTORCH_URL={url} is not a LibTorch CUDA download of "
                        "download.pytorch.org (https://download.pytorch.org/libtorch/cuXY0/"
                        "libtorch-shared-with-deps-V%2BcuXY0.zip, the C++11 ABI build)")
    else:
        torch_major, torch_minor, tag = m.group(1), m.group(2), m.group(6)
        if tag != torch_major + torch_minor:
            problems.append(f"{name}: LIBTORCH_URL names two CUDA versions, "
                            f"cu{torch_major}{torch_minor} and cu{tag}")
        if torch_major != major:
            problems.append(f"{name}: LIBTORCH_URL is a LibTorch for CUDA {torch_major} "
                            f"(cu{torch_major}{torch_minor}) and CUDA_VERSION is {cuda}: "
                            "the CUDA major versions must match")
        if (int(m.group(3)), int(m.group(4))) < (2, 9):
            problems.append(f"{name}: LIBTORCH_URL is LibTorch {m.group(3)}.{m.group(4)}; "
                            "the CUDA 13 builds start at 2.9")
    runs = " ".join(arg for kw, arg in ins if kw == "RUN")
    for literal in re.findall(r"\bcuda-[a-z-]+?-(\d+-\d+)\b", runs):
        problems.append(f"{name}: a CUDA package of version {literal} written out: "
                        "use ${CUDA_PKG_VERSION}")
    for pkg, pkg_major in re.findall(r"\b([a-z0-9-]+-cuda-(\d+))\b", runs):
        if pkg_major != major:
            problems.append(f"{name}: {pkg} is for CUDA {pkg_major}, CUDA_VERSION is {cuda}")
    wanted = project_cuda_architectures(repo)
    arch_list = None
    final = max(i for i, (kw, _) in enumerate(ins) if kw == "FROM")
    for kw, arg in ins[:final]:
        if kw == "ENV":
            m = re.search(r'TORCH_CUDA_ARCH_LIST="?([0-9.;+ PTX]+?)"?(\s|$)', arg)
            if m:
                arch_list = {int(float(a.replace("+PTX", "")) * 10)
                             for a in re.split(r"[; ]+", m.group(1)) if a}
        for call in cmake_calls(arg) if kw == "RUN" else []:
            for word in call:
                m = re.match(r"-DCMAKE_CUDA_ARCHITECTURES=(\S+)", word)
                if m and {int(a.split("-")[0]) for a in m.group(1).strip("\"'").split(";")} \
                        != wanted:
                    problems.append(f"{name}: {word}: the kernels are built for "
                                    f"{sorted(wanted)} (cmake/GeoCuda.cmake)")
            if "-S" in call and "-DGEO_USE_CUDA=ON" not in call:
                problems.append(f"{name}: the build does not pass -DGEO_USE_CUDA=ON")
    if arch_list != wanted:
        problems.append(f"{name}: TORCH_CUDA_ARCH_LIST is {sorted(arch_list or [])}, the "
                        f"project's CMAKE_CUDA_ARCHITECTURES {sorted(wanted)} "
                        "(cmake/GeoCuda.cmake): LibTorch's CMake package adds its own "
                        "architectures to the kernels' flags")
    for kw, arg in ins[final:]:
        if kw == "ENV" and re.search(r"NVIDIA_VISIBLE_DEVICES=\"?all", arg):
            problems.append(f"{name}: ENV NVIDIA_VISIBLE_DEVICES=all gives a pod every GPU of "
                            "its node, whatever it asked for")


def lint_dockerfile(repo, name, text):
    """The problems of one Dockerfile's text (see the top of the file)."""
    problems = []
    ins = instructions(None, text)
    for kw, arg in ins:
        if kw not in KNOWN_INSTRUCTIONS:
            problems.append(f"{name}: {kw}: not a Dockerfile instruction")
        for flag in flags_of(arg):
            if flag not in KNOWN_FLAGS.get(kw, set()):
                problems.append(f"{name}: {kw} --{flag}: not a flag of {kw}")
        if kw in ("ENTRYPOINT", "CMD") and arg.startswith("["):
            try:
                form = json.loads(arg)
                ok = isinstance(form, list) and all(isinstance(w, str) for w in form)
            except ValueError:
                ok = False
            if not ok:
                problems.append(f"{name}: {kw} {arg}: not a JSON list of strings (Docker "
                                "would run it as a shell command)")
        if kw == "EXPOSE":
            for port in arg.split():
                if not re.fullmatch(r"\d{1,5}(/(tcp|udp))?", port):
                    problems.append(f"{name}: EXPOSE {port}: not a port")
    stages = [i for i, (kw, _) in enumerate(ins) if kw == "FROM"]
    if not stages:
        return problems + [f"{name}: no FROM"]
    if len(stages) < 2:
        problems.append(f"{name}: not multi-stage")
    named = {}  # stage name: index of its FROM
    for i in stages:
        words = ins[i][1].split()
        image = words[0] if words else ""
        if ":" not in image or image.endswith(":latest"):
            problems.append(f"{name}: FROM {image} not pinned")
        if len(words) == 3 and words[1].upper() == "AS":
            named[words[2]] = i
    final = stages[-1]
    users = [arg for kw, arg in ins[final:] if kw == "USER"]
    if not users or users[-1].split(":")[0] in ("0", "root"):
        problems.append(f"{name}: runs as root")

    # Variables: the global ARGs in FROM lines; in a stage, its ARGs (a global
    # one's default when it has none of its own), its ENVs and the RUN's own.
    global_args = dict(arg_declarations(" ".join(a for kw, a in ins[:stages[0]] if kw == "ARG")))
    used_globals = set()
    for k, start in enumerate(stages):
        end = stages[k + 1] if k + 1 < len(stages) else len(ins)
        declared = set(PREDEFINED)
        for var in (a or b for a, b in VARIABLE.findall(ins[start][1])):
            used_globals.add(var)
            if var not in global_args:
                problems.append(f"{name}: FROM uses ${var}, not an ARG before the first FROM")
        for kw, arg in ins[start + 1:end]:
            if kw == "ARG":
                for var, default in arg_declarations(arg):
                    declared.add(var)
                    if var in global_args:
                        used_globals.add(var)
                    if default is None and global_args.get(var) is None:
                        problems.append(f"{name}: ARG {var} (stage {k + 1}) has no value: no "
                                        "default, here or in an ARG before the first FROM")
                continue
            own = set()
            if kw == "RUN":
                own = set(re.findall(r"(?:^|[\s;&|(])([A-Za-z_]\w*)=", arg)) | \
                      set(re.findall(r"\bfor\s+([A-Za-z_]\w*)\s+in\b", arg))
            for var in (a or b for a, b in VARIABLE.findall(arg)):
                if var not in declared and var not in own:
                    problems.append(f"{name}: {kw} uses ${var}, which is not declared in its "
                                    f"stage (ARG {var} after FROM, or ENV)")
            if kw == "ENV":
                declared |= set(re.findall(r"(?:^|\s)([A-Za-z_]\w*)=", arg))
    for var in global_args:
        if var not in used_globals:
            problems.append(f"{name}: ARG {var} before the first FROM is never used")

    options, targets = project_options(repo), project_targets(repo)
    for i, (kw, arg) in enumerate(ins):
        if kw == "COPY" and "--from=" not in arg:
            *sources, _dest = shlex.split(arg)
            for src in sources:
                if src.startswith("--"):
                    continue
                if not os.path.exists(os.path.join(repo, src)):
                    problems.append(f"{name}: COPY {src}: missing")
                elif dockerignored(repo, src):
                    problems.append(f"{name}: COPY {src}: .dockerignore drops it")
        if kw == "COPY" and "--from=" in arg:
            stage = re.search(r"--from=(\S+)", arg).group(1)
            if named.get(stage, len(ins)) > i and not stage.isdigit():
                problems.append(f"{name}: COPY --from={stage}: no stage of that name before it")
        if kw == "RUN":
            for call in cmake_calls(arg):
                for word in call:
                    m = re.match(r"-D(\w+)(?::\w+)?=(\S*)", word)
                    if not m:
                        continue
                    opt, value = m.group(1), m.group(2).strip("\"'")
                    if opt == "CMAKE_BUILD_TYPE" and value not in CMAKE_BUILD_TYPES:
                        problems.append(f"{name}: -DCMAKE_BUILD_TYPE={value} (allowed: "
                                        f"{', '.join(sorted(CMAKE_BUILD_TYPES))})")
                    elif opt.startswith("CMAKE_") or opt in LIBTORCH_CMAKE_VARIABLES:
                        continue
                    elif opt not in options:
                        problems.append(f"{name}: cmake -D{opt} is not an option of the project")
                    elif options[opt] is not None and value.upper() not in options[opt]:
                        problems.append(f"{name}: -D{opt}={value} (allowed: "
                                        f"{', '.join(sorted(options[opt]))})")
                if "--target" in call:
                    for t in call[call.index("--target") + 1:]:
                        if t.startswith("-"):
                            break
                        if t not in targets:
                            problems.append(f"{name}: --target {t} is not a target of the project")
        if kw == "COPY" and "--from=build" in arg:
            *sources, _dest = shlex.split(arg.replace("--from=build", ""))
            for src in sources:
                m = re.match(r"/src/build/(?:(.+)/)?([\w-]+)$", src)
                if m and m.group(2) in targets and targets[m.group(2)] != (m.group(1) or "."):
                    problems.append(f"{name}: {src}: the build puts {m.group(2)} in "
                                    f"{targets[m.group(2)]}")
    if name == "worker.Dockerfile":
        lint_cuda(repo, name, ins, problems)
    return problems


# Broken copies of docker/worker.Dockerfile and what --lint must say of each:
# (what is replaced, by what, a phrase of the expected problem).
BREAKAGES = [
    ("COPY kernels kernels", "COPY kernel kernel", "COPY kernel: missing"),
    ("--target geotrain-worker geotrain", "--target geotrain-worker geotrain-cli",
     "--target geotrain-cli is not a target of the project"),
    ("-DGEO_USE_CUDA=ON", "-DGEO_USE_CUDA=YES", "-DGEO_USE_CUDA=YES (allowed: AUTO, OFF, ON)"),
    ("-DGEO_USE_CUDA=ON", "-DGEO_USE_CUDA=AUTO", "the build does not pass -DGEO_USE_CUDA=ON"),
    ("-DGEO_BUILD_TESTS=OFF", "-DGEO_BUILD_TEST=OFF",
     "cmake -DGEO_BUILD_TEST is not an option of the project"),
    ("-DGEO_BUILD_BENCHMARKS=OFF", "-DGEO_BUILD_BENCHMARKS=NONE",
     "-DGEO_BUILD_BENCHMARKS=NONE (allowed: "),
    ("ARG CUDA_PKG_VERSION\nARG LIBTORCH_URL\n", "ARG CUDA_PKG_VERSION\n",
     "RUN uses $LIBTORCH_URL, which is not declared"),
    ("ARG CUDA_VERSION=13.0", "ARG CUDA_VERSION", "ARG CUDA_VERSION (stage 1) has no value"),
    ("cu130/libtorch-shared-with-deps-2.9.1%2Bcu130",
     "cu128/libtorch-shared-with-deps-2.9.1%2Bcu128", "the CUDA major versions must match"),
    ("cu130/libtorch-shared-with-deps-2.9.1%2Bcu130",
     "cu130/libtorch-cxx11-abi-shared-with-deps-2.9.1%2Bcu130", "is not a LibTorch CUDA download"),
    ("ARG CUDA_PKG_VERSION=13-0", "ARG CUDA_PKG_VERSION=13-1", "CUDA_PKG_VERSION=13-1 is not"),
    ("cuda-nvtx-${CUDA_PKG_VERSION}", "cuda-nvtx-12-4", "a CUDA package of version 12-4"),
    ("libcudnn9-dev-cuda-13", "libcudnn9-dev-cuda-12", "libcudnn9-dev-cuda-12 is for CUDA 12"),
    ('TORCH_CUDA_ARCH_LIST="8.0;9.0"', 'TORCH_CUDA_ARCH_LIST="7.0;8.0;9.0"',
     "TORCH_CUDA_ARCH_LIST is [70, 80, 90]"),
    ("COPY --from=build /opt", "COPY --from=builder /opt", "COPY --from=builder: no stage"),
    ("/src/build/worker/geotrain-worker /src", "/src/build/geotrain-worker /src",
     "the build puts geotrain-worker in worker"),
    ("WORKDIR /src", "WORKDIRR /src", "WORKDIRR: not a Dockerfile instruction"),
    ('ENTRYPOINT ["/usr/local/bin/geotrain-worker"]',
     'ENTRYPOINT ["/usr/local/bin/geotrain-worker"', "not a JSON list of strings"),
    ("USER 65532:65532", "USER root", "runs as root"),
    ("FROM debian:12-slim", "FROM debian:latest", "FROM debian:latest not pinned"),
    ("NVIDIA_DRIVER_CAPABILITIES=compute,utility",
     "NVIDIA_DRIVER_CAPABILITIES=compute,utility NVIDIA_VISIBLE_DEVICES=all",
     "NVIDIA_VISIBLE_DEVICES=all gives a pod every GPU"),
]


def lint(repo):
    paths = sorted(glob.glob(os.path.join(repo, "docker", "*.Dockerfile")))
    check(len(paths) >= 3, f"only {len(paths)} Dockerfiles in docker/")
    for path in paths:
        name = os.path.basename(path)
        problems = lint_dockerfile(repo, name, open(path).read())
        for p in problems:
            check(False, p)
        print(f"{name}: {len(instructions(path))} instructions linted, {len(problems)} problems",
              flush=True)
    # Every check above fails where it should.
    text = open(os.path.join(repo, "docker", "worker.Dockerfile")).read()
    for old, new, expected in BREAKAGES:
        if not check(old in text, f"worker.Dockerfile has no {old!r} to break"):
            continue
        problems = lint_dockerfile(repo, "worker.Dockerfile", text.replace(old, new, 1))
        check(any(expected in p for p in problems),
              f"worker.Dockerfile with {new!r} for {old!r}: expected a problem with "
              f"{expected!r}, got {problems}")
    print(f"{len(BREAKAGES)} broken copies of worker.Dockerfile: each refused", flush=True)


# Libraries the images bring other than from Debian's archive, and the C and
# C++ runtime every Debian image has.
BUNDLED = re.compile(r"^(libtorch|libc10|libcudart|libcuda|libgcc-s1|libc6|libstdc\+\+6)")


def check_dockerfile(repo, path, binaries):
    """The runtime stage installs the Debian package of every library the
    binaries link directly."""
    name = os.path.basename(path)
    ins = instructions(path)
    final = max(i for i, (kw, _) in enumerate(ins) if kw == "FROM")
    runtime = " ".join(arg for kw, arg in ins[final:] if kw == "RUN")
    installed = set(re.findall(r"\b([a-z0-9][a-z0-9.+-]+[a-z0-9])\b", runtime))
    for binary in binaries:
        for lib, pkg in needed_packages(binary).items():
            if pkg is None or BUNDLED.match(pkg):
                continue
            check(pkg in installed, f"{name}: {os.path.basename(binary)} links {lib} "
                                    f"(Debian package {pkg}), not installed in the runtime stage")
    print(f"{name}: the runtime stage's packages checked against {len(binaries)} binaries",
          flush=True)


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
    if sys.argv[1] == "--lint":
        lint(sys.argv[2])
        finish()
        return
    if sys.argv[1] == "--built":
        check_built(sys.argv[2])
        finish()
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
    finish()


if __name__ == "__main__":
    main()
