#!/usr/bin/env bash
# geotrain-worker --tcp-initial-window-only, as a TrainingJob's init
# container runs it: as root it writes a host route with both windows to
# each WAN peer (and says which peer does not resolve, without failing);
# the worker after it, without privileges, finds the route set; without it
# and without privileges, it stops saying what it needs. In a network
# namespace of its own with a TUN device. Needs root, unshare, ip and
# setpriv; exits 77 (skipped) otherwise.
#   initial_window_cli_test.sh GEOTRAIN_WORKER
set -euo pipefail
worker=$1
[[ $(id -u) == 0 ]] || { echo "needs root (a network namespace)"; exit 77; }
for tool in unshare ip setpriv; do
  command -v "$tool" > /dev/null || { echo "needs $tool"; exit 77; }
done
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
chmod 755 "$out"
cat > "$out/worker.yaml" <<'YAML'
worker:
  rank: 0
  worldSize: 4
  region: london
  localRank: 0
  regionSize: 2
transport:
  peers: [tcp://198.18.0.1:7000, tcp://198.18.0.9:7000, tcp://198.18.0.2:7000, tcp://no-such-gateway.invalid:7000]
  regions: [london, london, tokyo, ohio]
  tcpInitialWindow: 100
YAML
chmod 644 "$out/worker.yaml"
unshare -n bash -c '
  set -euo pipefail
  worker=$1 config=$2
  ip tuntap add mode tun geo1
  ip addr add 198.18.0.1/15 dev geo1
  ip link set geo1 up
  as_nobody() { setpriv --reuid=65534 --regid=65534 --clear-groups "$@"; }
  fail() { echo "FAIL: $*"; exit 1; }

  log=$("$worker" --config "$config" --tcp-initial-window-only 2>&1) || fail "as root: $log"
  echo "$log"
  grep -q "tcp://198.18.0.2:7000 open with a window of 100 segments (a new route" <<< "$log" ||
    fail "no route written to tokyo"
  grep -q "cannot resolve no-such-gateway.invalid" <<< "$log" || fail "the unresolved peer unsaid"
  # Only the other regions: not london:1 (198.18.0.9), not itself.
  ip route | grep -q "^198.18.0.2 .*initcwnd 100 initrwnd 100" || fail "route: $(ip route)"
  ! ip route | grep -q "^198.18.0.9" || fail "a route to a peer of its own region"

  log=$(as_nobody "$worker" --config "$config" --tcp-initial-window-only 2>&1) ||
    fail "without privileges, after the route was set: $log"
  grep -q "(already on the route to 198.18.0.2" <<< "$log" || fail "not found set: $log"

  ip route del 198.18.0.2
  if log=$(as_nobody "$worker" --config "$config" --tcp-initial-window-only 2>&1); then
    fail "without privileges and without the route it succeeded: $log"
  fi
  grep -q "transport.tcpInitialWindow = 100: adding a route to 198.18.0.2 with an initial window needs CAP_NET_ADMIN" <<< "$log" ||
    fail "the refusal does not say what it needs: $log"
  echo "initial window cli: ok"
' _ "$worker" "$out/worker.yaml"
