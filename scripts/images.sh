#!/usr/bin/env bash
# Builds the controller image and the CPU worker image with podman, from
# Debian packages and without any registry:
#
#   scripts/images.sh                    # both images
#   scripts/images.sh controller         # or worker-cpu; several may be named
#   scripts/images.sh --containers-conf  # only write the podman settings, print their path
#
# Images: ghcr.io/geotrain/controller:$TAG and ghcr.io/geotrain/worker-cpu:$TAG
# (TAG: $GEO_IMAGE_TAG, default the project's version, 0.1.0).
#
# 1. Writes a containers.conf for podman and passes it through CONTAINERS_CONF
#    (never editing /etc): runtime runc, and RLIMIT_NOFILE and RLIMIT_NPROC
#    at values this process may set. podman otherwise asks the runtime for
#    1048576 of each, which a root without CAP_SYS_RESOURCE (a container or
#    a sandboxed VM) is not allowed: "error setting rlimit type 6/7:
#    operation not permitted". crun, where installed, also fails on such
#    machines (setrlimit, hybrid cgroups); runc works. The file is
#    $GEO_PODMAN_CONF_DIR/containers.conf (default /tmp/geotrain-podman-UID);
#    run podman by hand with CONTAINERS_CONF set to it.
# 2. Installs podman, buildah, runc and debootstrap with apt-get when one is
#    missing (as root, or through sudo).
# 3. When debian:12 or debian:12-slim is not in podman's local storage,
#    makes both from one `debootstrap --variant=minbase bookworm` root file
#    system (`podman import`): debian:12 with apt's sources for bookworm,
#    bookworm-updates and bookworm-security; debian:12-slim also without
#    documentation, manual pages and translations, and dpkg told to leave
#    them out of every package installed later, as Debian's own slim images.
# 4. `podman build --pull=never` of docker/controller.Dockerfile and
#    docker/worker-cpu.Dockerfile from the repository root. The RUN steps
#    fetch packages from Debian's archive ($GEO_DEBIAN_MIRROR, default
#    http://deb.debian.org/debian, also used by debootstrap).
#
# Exit status: 0 when every image was built; 77 when podman cannot work on
# this machine (not root and no sudo to install it, or `podman info` fails:
# the reason is printed); 1 on any other failure.
set -euo pipefail
cd "$(dirname "$0")/.."

TAG=${GEO_IMAGE_TAG:-0.1.0}
MIRROR=${GEO_DEBIAN_MIRROR:-http://deb.debian.org/debian}
CONF_DIR=${GEO_PODMAN_CONF_DIR:-${TMPDIR:-/tmp}/geotrain-podman-$(id -u)}

cannot() {
  echo "images: podman cannot work here: $*" >&2
  exit 77
}

conf_only=0
images=()
for arg in "$@"; do
  case "$arg" in
    --containers-conf) conf_only=1 ;;
    controller | worker-cpu) images+=("$arg") ;;
    -h | --help)
      sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
      exit 0
      ;;
    *)
      echo "images: unknown argument '$arg'; allowed: controller, worker-cpu, --containers-conf" >&2
      exit 1
      ;;
  esac
done
((${#images[@]} > 0)) || images=(controller worker-cpu)

SUDO=""
if [[ $(id -u) -ne 0 ]]; then
  command -v sudo >/dev/null ||
    cannot "not root, and sudo is not installed (podman runs rootful here)"
  SUDO="sudo"
fi

# 1. podman's settings. podman lowers its own RLIMIT_NPROC to the kernel's
# pid_max when that is lower than the hard limit (seen: 32768 under a hard
# limit of 96365), and the runtime it starts cannot raise it again.
nofile=$(ulimit -Hn)
nproc=$(ulimit -Hu)
pid_max=$(cat /proc/sys/kernel/pid_max)
[[ $nofile == unlimited ]] && nofile=1048576
[[ $nproc == unlimited || $nproc -gt $pid_max ]] && nproc=$pid_max
mkdir -p "$CONF_DIR"
cat >"$CONF_DIR/containers.conf" <<EOF
# Written by scripts/images.sh; podman reads it through CONTAINERS_CONF.
[containers]
default_ulimits = ["nofile=$nofile:$nofile", "nproc=$nproc:$nproc"]

[engine]
runtime = "runc"
EOF
export CONTAINERS_CONF="$CONF_DIR/containers.conf"
if ((conf_only)); then
  echo "$CONTAINERS_CONF"
  exit 0
fi
# 2. The tools.
missing=()
for tool in podman:podman buildah:buildah runc:runc debootstrap:debootstrap; do
  command -v "${tool%%:*}" >/dev/null || [[ -x /usr/sbin/${tool%%:*} ]] || missing+=("${tool#*:}")
done
if ((${#missing[@]} > 0)); then
  echo "images: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

PODMAN=(env CONTAINERS_CONF="$CONTAINERS_CONF" podman)
[[ -z $SUDO ]] || PODMAN=("$SUDO" "${PODMAN[@]}")
"${PODMAN[@]}" info >/dev/null 2>"$CONF_DIR/podman-info.err" ||
  cannot "podman info fails: $(tail -3 "$CONF_DIR/podman-info.err")"

# 3. The base images.
if ! "${PODMAN[@]}" image exists debian:12 || ! "${PODMAN[@]}" image exists debian:12-slim; then
  started=$SECONDS
  root=$(mktemp -d "${TMPDIR:-/tmp}/geotrain-debootstrap.XXXXXX")
  trap '$SUDO rm -rf "$root"' EXIT
  echo "images: debootstrap --variant=minbase bookworm ($MIRROR)"
  $SUDO debootstrap --variant=minbase bookworm "$root/fs" "$MIRROR" >"$root/debootstrap.log" 2>&1 ||
    {
      tail -20 "$root/debootstrap.log" >&2
      exit 1
    }
  security=${MIRROR%/debian}/debian-security
  $SUDO rm -f "$root/fs/etc/apt/sources.list"
  $SUDO tee "$root/fs/etc/apt/sources.list.d/debian.sources" >/dev/null <<EOF
Types: deb
URIs: $MIRROR
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: $security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  $SUDO find "$root/fs/var/cache/apt" "$root/fs/var/lib/apt/lists" "$root/fs/var/log" \
    -type f -delete
  import() { # import NAME: the root file system as image NAME
    $SUDO tar -C "$root/fs" --numeric-owner -c . |
      "${PODMAN[@]}" import --change 'CMD ["bash"]' - "$1" >/dev/null
  }
  import debian:12
  $SUDO tee "$root/fs/etc/dpkg/dpkg.cfg.d/slim" >/dev/null <<'EOF'
# Leave documentation, manual pages and translations out (copyright files stay).
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
EOF
  $SUDO find "$root/fs/usr/share/doc" -mindepth 1 ! -name copyright ! -type d -delete
  $SUDO find "$root/fs/usr/share/man" "$root/fs/usr/share/groff" "$root/fs/usr/share/info" \
    "$root/fs/usr/share/lintian" "$root/fs/usr/share/locale" -mindepth 1 \
    ! -name locale.alias -delete 2>/dev/null || true
  import debian:12-slim
  echo "images: debian:12 and debian:12-slim imported in $((SECONDS - started)) s"
fi

# 4. The images.
for image in "${images[@]}"; do
  started=$SECONDS
  echo "images: building ghcr.io/geotrain/$image:$TAG (docker/$image.Dockerfile)"
  "${PODMAN[@]}" build --pull=never -f "docker/$image.Dockerfile" \
    -t "ghcr.io/geotrain/$image:$TAG" .
  size=$("${PODMAN[@]}" image inspect --format '{{.Size}}' "ghcr.io/geotrain/$image:$TAG")
  echo "images: ghcr.io/geotrain/$image:$TAG built in $((SECONDS - started)) s," \
    "$((size / 1000000)) MB"
done
