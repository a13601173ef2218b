#pragma once
// TCP's initial windows toward the WAN peers (transport.tcpInitialWindow).
//
// A fresh connection sends 10 segments (about 14 KB) in its first round trip
// and doubles from there (slow start), whatever the link: over 230 ms the
// first 100 KB take three round trips, and every connection a worker makes
// -- at the start, and again after each partition or restart -- pays it.
// Linux takes a larger initial congestion window (initcwnd) and initial
// receive window (initrwnd) from the route a connection uses, not from the
// socket. So the worker adds a host route to each WAN peer (a /32 or /128:
// the same next hop, device, table and metrics as the route the kernel
// chooses for it today, plus the two windows) and leaves every other route
// of its network namespace as it was. The routes stay when the worker exits
// (they carry nothing but the windows; a restarted worker replaces them).

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/worker_config.h"

namespace geo::transport {

struct InitialWindowRoute {
  std::string peer;     // as given, e.g. "tcp://198.18.0.2:7000"
  std::string address;  // the address the route is for, e.g. "198.18.0.2"
  std::string via;      // its next hop, or "" on a link of this host
  std::string device;   // the interface's name, e.g. "eth0"
  // The route the kernel chose carried both windows already (set before,
  // by this worker or an init container): nothing was written.
  bool alreadySet = false;
  // Why nothing was done for this endpoint (its host did not resolve);
  // empty when the route is there. address, via and device are then empty.
  std::string unresolved;
};

// Sets the initial congestion and receive windows of the connections this
// process (and anything else in its network namespace) opens to each
// endpoint's host, in segments (1..kMaxTcpInitialWindow): one host
// route per address the host name resolves to (IPv4 and IPv6). Addresses
// of this host itself (loopback, its own interfaces) are skipped: their
// traffic never crosses a WAN. Endpoints are ZeroMQ TCP endpoints,
// tcp://host:port; anything else is an InvalidArgument naming it.
//
// Where the route the kernel chooses carries both windows already, it is
// left as it is (alreadySet): a worker without privileges runs after an
// init container that had them. Writing a route needs CAP_NET_ADMIN in the
// calling thread's network namespace; without it, PermissionDenied saying
// so and how to grant it or turn this off. On failure the routes already
// added stay (each is complete in itself).
//
// A host that does not resolve now (a gateway's name not yet in DNS) is
// not an error: its entry says why (unresolved), and its connections open
// with the kernel's window; failing a pod's start on a passing DNS fault
// would cost a retry of the worker.
//
// Returns the routes, in endpoint order (written, found set, or a host
// left unresolved).
StatusOr<std::vector<InitialWindowRoute>> setInitialWindow(
    const std::vector<std::string>& endpoints, uint32_t segments);

// What the kernel would use for a connection to `address` now (a numeric
// IPv4 or IPv6 address): its initial congestion and receive windows in
// segments, 0 where the route sets none (the kernel's default, 10). For
// tests and diagnostics.
struct RouteWindows {
  uint32_t initcwnd = 0;
  uint32_t initrwnd = 0;
};
StatusOr<RouteWindows> routeWindows(const std::string& address);

}  // namespace geo::transport
