# Sourced (not run) by the tests that start geotrain-worker processes by
# hand over loopback: what each of them had copied. Needs $geotrain (the
# geotrain binary, for keygen) set first; `set -uo pipefail` is the
# caller's.
#
#   (from test_prologue.sh) $work, a temporary folder removed at exit with
#                     every background job killed, and fail MESSAGE...,
#                     which here prints the end of every worker's stderr
#                     log ($work/err-*.log, $work/*/err-*.log).
#   workers_setup N   CURVE keys for ranks 0..N-1 in $work/keys (those not
#                     there yet); N free ports in ports[] (outside the
#                     ephemeral range); $peers: their tcp:// endpoints, in
#                     rank order. Again for new ports.
#   endpoint PORT     tcp://127.0.0.1:PORT

source "$(dirname "${BASH_SOURCE[0]}")/test_prologue.sh"
fail_logs='$work/err-*.log $work/*/err-*.log'
fail_lines=5

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
