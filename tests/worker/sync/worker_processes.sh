# Sourced (not run) by the tests that start geotrain-worker processes by
# hand over loopback: what each of them had copied. Needs $geotrain (the
# geotrain binary, for keygen) set first; `set -uo pipefail` is the
# caller's.
#
#   $work             a temporary folder, removed at exit with every
#                     background job killed.
#   workers_setup N   CURVE keys for ranks 0..N-1 in $work/keys (those not
#                     there yet); N free ports in ports[] (outside the
#                     ephemeral range); $peers: their tcp:// endpoints, in
#                     rank order. Again for new ports.
#   fail MESSAGE...   prints FAIL and the end of every worker's stderr log
#                     ($work/err-*.log, $work/*/err-*.log), exits 1.
#   endpoint PORT     tcp://127.0.0.1:PORT

work="$(mktemp -d)"
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$work"' EXIT

fail() {
  echo "FAIL: $*" >&2
  local f
  for f in "$work"/err-*.log "$work"/*/err-*.log; do
    [[ -f $f ]] || continue
    echo "--- $f" >&2
    tail -5 "$f" >&2
  done
  exit 1
}

endpoint() { echo "tcp://127.0.0.1:$1"; }

workers_setup() {
  local n="$1" r
  for ((r = 0; r < n; ++r)); do
    [[ -f $work/keys/worker-$r.key ]] ||
      "$geotrain" keygen --out "$work/keys" --name "worker-$r" >/dev/null || fail keygen
  done
  mapfile -t ports < <(python3 "$(dirname "${BASH_SOURCE[0]}")/../free_ports.py" "$n")
  ((${#ports[@]} == n)) || fail "no $n free ports"
  peers=""
  for ((r = 0; r < n; ++r)); do peers+="${peers:+,}$(endpoint "${ports[$r]}")"; done
}
