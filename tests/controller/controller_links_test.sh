#!/usr/bin/env bash
# The controller links neither ZeroMQ nor LibTorch: it writes CURVE key
# Secrets through common/keys (libsodium only), and its image ships neither
# library. Fails, naming the library, when a dependency brings one back.
# Usage: controller_links_test.sh <geotrain-controller>
set -euo pipefail
binary=${1:?usage: controller_links_test.sh <geotrain-controller>}
needed=$(readelf -d "$binary" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
[[ -n "$needed" ]] || { echo "FAIL: readelf found no NEEDED entries in $binary" >&2; exit 1; }
status=0
for forbidden in libzmq libtorch libc10; do
  if grep -q "^${forbidden}" <<<"$needed"; then
    echo "FAIL: $binary needs $(grep "^${forbidden}" <<<"$needed" | tr '\n' ' ')(the controller must not link ${forbidden})" >&2
    status=1
  fi
done
# What the loader resolves, so a library pulled in indirectly shows too.
if ldd "$binary" | grep -E 'libzmq|libtorch|libc10' >&2; then
  echo "FAIL: $binary loads the libraries above" >&2
  status=1
fi
[[ $status -eq 0 ]] && echo "ok: $binary needs: $(tr '\n' ' ' <<<"$needed")"
exit $status
