#pragma once
// Free loopback ports for the workers of a `geotrain local` job.
//
// reserve(n) binds n TCP sockets to 127.0.0.1:0 and reads back the port the
// kernel chose for each. The sockets stay open (so the kernel cannot hand
// the same port out twice, to us or to anyone else) until release(), which
// the launcher calls right before it spawns the workers that bind them.
//
// Owns its sockets (close-on-exec, closed by release() or the destructor);
// move-only; not thread-safe. Errors: Unavailable naming the failed call.

#include <cstdint>
#include <vector>

#include "common/status.h"

namespace geo::local {

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

}  // namespace geo::local
