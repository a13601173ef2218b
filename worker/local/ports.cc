#include "worker/local/ports.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <utility>

namespace geo::local {

StatusOr<PortReservation> PortReservation::reserve(size_t count) {
  PortReservation reservation;
  for (size_t i = 0; i < count; ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      return unavailable(
          fmt::format("reserving loopback ports: socket(): {}", std::strerror(errno)));
    }
    reservation.fds_.push_back(fd);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    if (::bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) {
      return unavailable(
          fmt::format("reserving loopback ports: bind(127.0.0.1:0): {}", std::strerror(errno)));
    }
    socklen_t len = sizeof addr;
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      return unavailable(
          fmt::format("reserving loopback ports: getsockname(): {}", std::strerror(errno)));
    }
    reservation.ports_.push_back(ntohs(addr.sin_port));
  }
  return reservation;
}

PortReservation::PortReservation(PortReservation&& other) noexcept
    : fds_(std::exchange(other.fds_, {})), ports_(std::move(other.ports_)) {}

PortReservation& PortReservation::operator=(PortReservation&& other) noexcept {
  if (this != &other) {
    release();
    fds_ = std::exchange(other.fds_, {});
    ports_ = std::move(other.ports_);
  }
  return *this;
}

PortReservation::~PortReservation() {
  release();
}

void PortReservation::release() {
  for (const int fd : fds_) ::close(fd);
  fds_.clear();
}

}  // namespace geo::local
