#!/usr/bin/env bash
# Installs the Debian 12 packages geotrain needs to build, test and run, then
# the tools that have no Debian package (kubectl and helm, into .tools/bin,
# through scripts/install-kube-tools.sh).
# Idempotent: installs only what is missing and runs `apt-get update` at most
# once. Later components add their packages to PACKAGES below.
set -euo pipefail

PACKAGES=(
  build-essential cmake git pkg-config ca-certificates
  libfmt-dev libspdlog-dev          # common/: logging
  libgtest-dev libgmock-dev         # tests
  libbenchmark-dev                  # bench/
  libzmq3-dev cppzmq-dev libsodium-dev  # worker/transport: ZeroMQ + CURVE
  libcli11-dev                      # command lines
  clang-14 libclang-rt-14-dev       # libFuzzer targets (tests/fuzz)
  libtorch-dev zlib1g-dev           # worker/train: LibTorch (CPU), gzipped IDX files
  libopenblas0-pthread              # LibTorch's BLAS: 4x the steps/s of the reference BLAS (not
                                    # the serial build: no locks, and workers call it from 2 threads)
  libyaml-cpp-dev                   # worker.yaml
  nlohmann-json3-dev                # geotrain local: workers' JSON progress lines, summary.json
  prometheus-cpp-dev                # worker/metrics: the /metrics endpoint
  dataset-fashion-mnist             # the demo's and the convergence tests' data
  python3                           # multi-process tests and the WAN benchmark read JSON with it
  libcurl4-openssl-dev              # controller/kube: the Kubernetes REST client
  libcpp-httplib-dev libssl-dev     # tests/support: the test apiserver (HTTPS)
  python3-prometheus-client python3-yaml  # metrics tests: parse the exposition and the scrape config
  prometheus                        # metrics tests: scrape a run and evaluate the dashboard's PromQL
  python3-jsonschema                # the CRD's schema against the controller's validation
  python3-torch python3-numpy       # the exported model read back by Python (torch.load, torch.jit.load)
  python3.11-doc                    # the gpt test's corpus: the documentation's reStructuredText (scripts/prepare-text.py)
  yamllint                          # manifests/ and the chart's YAML
  iproute2                          # tests: the routes of transport.tcpInitialWindow (ip route)
)

missing=()
for pkg in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$pkg")
  fi
done
# kubectl and helm come from npm; Debian's npm only when none is on PATH.
if ! command -v npm >/dev/null; then
  missing+=(npm)
fi

if ((${#missing[@]} == 0)); then
  echo "setup: all ${#PACKAGES[@]} packages present"
else
  SUDO=""
  if [[ $(id -u) -ne 0 ]]; then
    if command -v sudo >/dev/null; then
      SUDO="sudo"
    else
      echo "setup: missing packages (${missing[*]}) and not root, and sudo is not installed" >&2
      exit 1
    fi
  fi
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

"$(dirname "${BASH_SOURCE[0]}")/install-kube-tools.sh"
