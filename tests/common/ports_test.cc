#include "common/ports.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <set>

namespace geo {
namespace {

// Whether a plain bind of 127.0.0.1:port succeeds right now.
bool canBind(uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(port);
  const bool ok = ::bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0;
  ::close(fd);
  return ok;
}

TEST(PortReservation, DistinctPortsOutsideTheEphemeralRange) {
  const PortRange eph = ephemeralPortRange();
  ASSERT_LE(eph.first, eph.last);
  auto r = PortReservation::reserve(32);
  ASSERT_TRUE(r.ok()) << r.status().toString();
  ASSERT_EQ(r->ports().size(), 32u);
  std::set<uint16_t> distinct(r->ports().begin(), r->ports().end());
  EXPECT_EQ(distinct.size(), 32u);
  // The kernel picks source ports for outgoing connections from the
  // ephemeral range; reserved ports stay out of it whenever there is room.
  const bool room = eph.first > 10000 + 64 || eph.last < 65535 - 64;
  for (const uint16_t p : r->ports()) {
    EXPECT_GE(p, 1024);
    if (room) {
      EXPECT_TRUE(p < eph.first || p > eph.last)
          << p << " is in [" << eph.first << ", " << eph.last << "]";
    }
  }
}

TEST(PortReservation, PortsAreHeldUntilReleased) {
  auto r = PortReservation::reserve(4);
  ASSERT_TRUE(r.ok()) << r.status().toString();
  for (const uint16_t p : r->ports()) EXPECT_FALSE(canBind(p)) << p;
  r->release();
  r->release();  // idempotent
  EXPECT_EQ(r->ports().size(), 4u);
  for (const uint16_t p : r->ports()) EXPECT_TRUE(canBind(p)) << p;
}

TEST(PortReservation, MovedFromReservationOwnsNothing) {
  auto r = PortReservation::reserve(2);
  ASSERT_TRUE(r.ok());
  PortReservation moved = std::move(*r);
  for (const uint16_t p : moved.ports()) EXPECT_FALSE(canBind(p)) << p;
  r->release();  // the moved-from one must not close the new owner's sockets
  for (const uint16_t p : moved.ports()) EXPECT_FALSE(canBind(p)) << p;
  moved.release();
  for (const uint16_t p : moved.ports()) EXPECT_TRUE(canBind(p)) << p;
}

TEST(PortReservation, FreeLoopbackPortCanBeBound) {
  const uint16_t p = freeLoopbackPort();
  EXPECT_TRUE(canBind(p)) << p;
}

// A test asks for its ranks' ports one at a time and binds none of them
// until its transports start: every port handed out must differ from the
// ones before it, though all of them were released. (Picked at random, 3000
// draws from some 27,000 candidates repeat one about 160 times.)
TEST(PortReservation, APortIsNotHandedOutTwiceByOneProcess) {
  std::set<uint16_t> seen;
  for (int i = 0; i < 3000; ++i) {
    const uint16_t p = i % 3 == 0 ? freeLoopbackPort() : [] {
      auto r = PortReservation::reserve(1);
      EXPECT_TRUE(r.ok()) << r.status().toString();
      return r.ok() ? r->ports().front() : uint16_t{0};
    }();
    EXPECT_TRUE(seen.insert(p).second) << "port " << p << " handed out again at draw " << i;
  }
}

}  // namespace
}  // namespace geo
