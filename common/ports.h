#pragma once
// Free loopback TCP ports for processes that will bind them a moment later
// (the workers of a `geotrain local` job, and tests).
//
// Why not simply bind to port 0: the kernel answers with a port from its
// ephemeral range (net.ipv4.ip_local_port_range), the same range it draws
// from for the source port of every outgoing connection. Between releasing
// such a port and the worker binding it, any connect() on the machine (one
// worker dialling another that has not started yet, ZeroMQ retrying every
// 100 ms) may take it as its source port, and the bind then fails with
// "Address already in use". reserve() therefore picks random ports *outside*
// the ephemeral range (above 10000, below 65536), which the kernel never
// hands out by itself; only a process that binds that exact port can take
// it. It falls back to port 0 when the ephemeral range leaves no room.
//
// The candidates are walked in order from a random start, one cursor per
// process: the same process never gets a port twice until it has been
// through all of them (some 27,000), so ports asked for one at a time and
// bound later (a test's world of four ranks) are distinct, and two test
// processes running side by side meet only where their cursors do.
//
// reserve(n) binds n sockets to 127.0.0.1 (no SO_REUSEADDR, so a port in
// use or in TIME_WAIT is skipped) and keeps them open until release(), which
// the caller invokes right before the processes that bind them start.
//
// Owns its sockets (close-on-exec, closed by release() or the destructor);
// move-only; reserve() is thread-safe, an object is not. Errors:
// Unavailable naming the failed call.

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/status.h"

namespace geo {

class PortReservation {
 public:
  static StatusOr<PortReservation> reserve(size_t count);

  PortReservation(PortReservation&& other) noexcept;
  PortReservation& operator=(PortReservation&& other) noexcept;
  PortReservation(const PortReservation&) = delete;
  PortReservation& operator=(const PortReservation&) = delete;
  ~PortReservation();

  // One distinct port per reserved socket, in reservation order.
  const std::vector<uint16_t>& ports() const { return ports_; }

  // Closes the sockets; the ports stay listed. Idempotent.
  void release();

 private:
  PortReservation() = default;

  std::vector<int> fds_;
  std::vector<uint16_t> ports_;
};

// The kernel's ephemeral port range [first, last] as read from
// /proc/sys/net/ipv4/ip_local_port_range; Linux's default (32768, 60999)
// when it cannot be read.
struct PortRange {
  uint16_t first = 32768;
  uint16_t last = 60999;
};
PortRange ephemeralPortRange();

// One port reserved and released at once: for tests that bind it within
// milliseconds. Aborts the process if no port can be had (tests only).
uint16_t freeLoopbackPort();

}  // namespace geo
