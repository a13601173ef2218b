#pragma once
// What the kernel's TCP buffer limits allow one connection to carry over a
// long path, so that a worker can say so once it has measured its links.
//
// A TCP connection keeps at most its receive window in flight, and Linux
// advertises half to two thirds of the receive buffer as window (the rest
// pays for the kernel's per-packet bookkeeping; 6.x kernels set the share
// from the sizes of the packets received). Autotuning grows each buffer up
// to the third field of net.ipv4.tcp_rmem (receive) and tcp_wmem (send),
// both per network namespace (a pod sets them with securityContext.sysctls).
// So one connection carries at most a half to two thirds of tcp_rmem's
// maximum per round trip: Linux's default of 6 MiB is 110-146 Mbit/s over
// 230 ms, whatever the link (geo_fat_pipe_bench measured 144 on the
// namespace network).
//
// The transport sets no SO_RCVBUF or SO_SNDBUF (ZMQ_RCVBUF, ZMQ_SNDBUF) of
// its own: a socket buffer set explicitly is no longer autotuned, is capped
// by net.core.rmem_max / wmem_max (208 KiB by default) instead, and fixes
// the connection's window scale at the handshake, before any round trip is
// measured. The kernel's autotuning sizes the buffers from the measured
// bandwidth-delay product already; what an operator sets is its ceiling.

#include <cstdint>
#include <optional>
#include <string>

#include "common/status.h"

namespace geo::app {

struct TcpBufferLimits {
  int64_t receiveMaxBytes = 0;      // net.ipv4.tcp_rmem, third field
  int64_t sendMaxBytes = 0;         // net.ipv4.tcp_wmem, third field
  int64_t receiveInitialBytes = 0;  // net.ipv4.tcp_rmem, second field
};

// A TCP segment's payload on an Ethernet path (MTU 1500).
inline constexpr int64_t kSegmentBytes = 1448;

// Reads both limits of this thread's network namespace from `procSys`
// (/proc/sys, or a test's folder with net/ipv4/tcp_rmem and tcp_wmem). An
// error names the file and what it held.
StatusOr<TcpBufferLimits> readTcpBufferLimits(const std::string& procSys = "/proc/sys");

// What one connection carries (bits per second) over a round trip of
// `rttSeconds` (> 0) when its receiver's buffer may grow to `receiveMaxBytes`
// and `windowShare` of it is window (1/2 and 2/3 bound what Linux does).
double windowCeilingBitsPerSecond(int64_t receiveMaxBytes, double rttSeconds,
                                  double windowShare = 0.5);

// The line a worker logs once it knows the longest round trip to a peer,
// `peer` at `rttSeconds`: what one connection can carry there, what its
// `connections` data connections per peer (transport.connections) carry
// together, and which settings raise it -- the buffer maximums, or the
// connections, each with the value a 1 Gbit/s link would need.
std::string describeWindowCeiling(const TcpBufferLimits& limits, const std::string& peer,
                                  double rttSeconds, int64_t connections = 1);

// A warning when an initial window of `segments` (transport.tcpInitialWindow)
// cannot be advertised by a receiver whose buffer starts at
// receiveInitialBytes (a half of it is window at the least): the peers'
// connections to this worker then open no faster than the buffer lets them.
// It names the setting and the value that would do (a power of two).
// nullopt when it fits, or for segments <= 0.
std::optional<std::string> initialWindowWarning(const TcpBufferLimits& limits, int64_t segments);

}  // namespace geo::app
