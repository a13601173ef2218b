// What liveness costs a job of many workers (docs/membership.md, "What
// liveness costs at scale"): idle transports on the namespace network
// (root; skips itself otherwise), each connected to every other, with the
// transport's default ping interval. Their only traffic is the pings, the
// pongs that answer them and the kernels' acknowledgements of both, counted
// as IP packets (headers included) at each site's uplink. A worker pings
// every peer, so what it sends grows with the number of peers -- and with
// nothing else: the rate per peer is what the docs scale to 64 and 256
// workers, and what this test bounds.

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "tests/worker/transport/netns_fixture.h"

namespace geo::transport {
namespace {

using namespace std::chrono_literals;
TEST(Liveness, AnIdleWorkerSendsABoundedRatePerPeer) {
  if (Status s = wan::checkNetnsAllowed(); !s.ok()) GTEST_SKIP() << s.message();
  constexpr size_t kSites = 8;
  wan::WanShape shape;
  shape.oneWay.assign(kSites, std::vector<wan::Microseconds>(kSites));
  for (size_t s = 0; s < kSites; ++s) {
    shape.sites.push_back("site" + std::to_string(s));
    for (size_t d = 0; d < kSites; ++d) {
      if (d != s) shape.oneWay[s][d] = wan::Microseconds(20'000 + 5'000 * ((s + d) % 4));
    }
  }
  shape.site.resize(kSites);
  auto net = wan::NetnsNetwork::create(shape, {});
  ASSERT_TRUE(net.ok()) << net.status().toString();
  testing::World world(kSites);
  const auto interval = TransportConfig{}.pingInterval;
  // The default ping interval, not the fixture's fast one.
  const auto t = testing::transportsInSites(
      **net, world, [&](uint32_t, TransportConfig& c) { c.pingInterval = interval; });
  ASSERT_EQ(t.size(), kSites);
  // Every data connection up, then every round trip known: until then a
  // transport pings faster (its first rounds' delay needs the round trips).
  ASSERT_TRUE(testing::connectEveryPair(t));
  const auto everyRoundTripKnown = [&] {
    for (uint32_t r = 0; r < kSites; ++r) {
      for (const PeerCounters& c : t[r]->peerCounters()) {
        if (c.peer != r && c.rttSeconds < 0) return false;
      }
    }
    return true;
  };
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  while (!everyRoundTripKnown() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(100ms);
  }
  ASSERT_TRUE(everyRoundTripKnown()) << "a round trip still unknown after 20 s";
  // Whatever the start left in flight (acknowledgements of the first
  // messages) settles within a few round trips.
  std::this_thread::sleep_for(2 * interval);

  const auto before = (*net)->counters();
  const auto t0 = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(10 * interval);
  const auto after = (*net)->counters();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  double worst = 0;  // bytes per second per peer, the most any site sent
  for (size_t s = 0; s < kSites; ++s) {
    const double bytes = static_cast<double>(after.sites[s].bytesSent - before.sites[s].bytesSent);
    const double packets =
        static_cast<double>(after.sites[s].packetsSent - before.sites[s].packetsSent);
    const double perPeer = bytes / seconds / (kSites - 1);
    worst = std::max(worst, perPeer);
    std::printf("%s: %.0f B/s to its %zu peers (%.0f B/s and %.1f packets/s each)\n",
                shape.sites[s].c_str(), bytes / seconds, kSites - 1, perPeer,
                packets / seconds / (kSites - 1));
  }
  std::printf(
      "liveness, pings every %lld ms: at most %.0f B/s per peer; a worker of 64 would send "
      "%.1f kB/s, of 256 %.1f kB/s\n",
      static_cast<long long>(interval.count()), worst, worst * 63 / 1e3, worst * 255 / 1e3);
  // Every peer is pinged once an interval and answers once: two messages
  // of a 64-byte header and an 8-byte timestamp each way, CURVE's box and
  // ZMTP's framing around each, in a TCP segment each, and the kernel's
  // acknowledgements. Well under a kilobyte a second; a transport that
  // sent anything else while idle, or pinged faster, would not be.
  EXPECT_GT(worst, 0.0) << "no pings crossed the network";
  EXPECT_LT(worst, 1000.0) << "an idle worker sends more than liveness to each peer";
}

}  // namespace
}  // namespace geo::transport
