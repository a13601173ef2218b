#include "common/ports.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fmt/format.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <random>
#include <utility>

namespace geo {
namespace {

// Ports below this are left to system services.
constexpr uint32_t kLowestPort = 10000;
// Candidates tried per port before falling back to port 0.
constexpr int kAttemptsPerPort = 64;

// Binds a fresh socket to 127.0.0.1:port (0: the kernel chooses). Returns
// the socket, or -1 with errno set.
int bindLoopback(uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(port);
  if (::bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) {
    const int saved = errno;
    ::close(fd);
    errno = saved;
    return -1;
  }
  return fd;
}

}  // namespace

PortRange ephemeralPortRange() {
  PortRange range;
  std::ifstream in("/proc/sys/net/ipv4/ip_local_port_range");
  uint32_t first = 0;
  uint32_t last = 0;
  if (in >> first >> last && first >= 1 && first <= last && last <= 65535) {
    range.first = static_cast<uint16_t>(first);
    range.last = static_cast<uint16_t>(last);
  }
  return range;
}

StatusOr<PortReservation> PortReservation::reserve(size_t count) {
  const PortRange eph = ephemeralPortRange();
  // Candidates: [kLowestPort, eph.first) and (eph.last, 65535].
  const uint32_t below = eph.first > kLowestPort ? eph.first - kLowestPort : 0;
  const uint32_t above = 65535u - eph.last;
  const uint32_t candidates = below + above;
  auto candidate = [&](uint32_t i) {
    return static_cast<uint16_t>(i < below ? kLowestPort + i : eph.last + 1 + (i - below));
  };

  // One cursor per process from a random start, past every port tried
  // (ports.h says why).
  static std::mutex mutex;
  static uint32_t cursor = [] {
    std::random_device seed;
    return static_cast<uint32_t>(seed());
  }();
  const std::lock_guard<std::mutex> lock(mutex);

  PortReservation reservation;
  for (size_t i = 0; i < count; ++i) {
    int fd = -1;
    for (int attempt = 0; candidates > 0 && fd < 0 && attempt < kAttemptsPerPort; ++attempt) {
      fd = bindLoopback(candidate(cursor++ % candidates));
    }
    if (fd < 0) fd = bindLoopback(0);  // no room outside the ephemeral range
    if (fd < 0) {
      return unavailable(
          fmt::format("reserving loopback ports: bind(127.0.0.1): {}", std::strerror(errno)));
    }
    reservation.fds_.push_back(fd);
    sockaddr_in addr{};
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

uint16_t freeLoopbackPort() {
  auto r = PortReservation::reserve(1);
  if (!r.ok()) {
    std::fprintf(stderr, "freeLoopbackPort: %s\n", r.status().message().c_str());
    std::abort();
  }
  return r->ports().front();
}

}  // namespace geo
