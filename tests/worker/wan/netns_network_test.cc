// The namespace network's fidelity: real sockets in real network namespaces,
// measured against the WAN that was asked for. Round trips (UDP echo) within
// 3% plus a millisecond, TCP throughput within 5% of the shaped rate, loss and
// partitions as asked. Needs root; skips itself otherwise.

#include "worker/wan/netns_network.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

namespace geo::wan {
namespace {

using namespace std::chrono_literals;
using Seconds = std::chrono::duration<double>;

constexpr uint16_t kPort = 5001;

sockaddr_in addressOf(size_t site, uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  ::inet_pton(AF_INET, siteAddress(site).c_str(), &a.sin_addr);
  return a;
}

// Three sites: a-b 100 ms round trip, a-c 40 ms, b-c 10 ms; a's uplink
// 20 Mbit/s, b's 50 Mbit/s, c unlimited.
WanShape threeSites() {
  WanShape shape;
  shape.sites = {"a", "b", "c"};
  const auto ms = [](int v) { return Microseconds(v * 1000); };
  shape.oneWay = {{ms(0), ms(50), ms(20)}, {ms(50), ms(0), ms(5)}, {ms(20), ms(5), ms(0)}};
  shape.site.resize(3);
  shape.site[0].egressBitsPerSecond = 20e6;
  shape.site[1].egressBitsPerSecond = 50e6;
  return shape;
}

TEST(NetnsTcpBuffer, TwiceTheLargestBandwidthDelayProductAtLeast32MiB) {
  constexpr int64_t kMiB = int64_t{1} << 20;
  // 20 Mbit/s x 100 ms is 0.25 MB: the floor.
  EXPECT_EQ(tcpBufferBytesFor(threeSites()), 32 * kMiB);
  // 1 Gbit/s at 230 ms holds 28.75 MB in flight: twice that, in whole MiB.
  WanShape fat;
  fat.sites = {"a", "b"};
  fat.oneWay = {{Microseconds(0), Microseconds(115'000)}, {Microseconds(115'000), Microseconds(0)}};
  fat.site.resize(2);
  fat.site[0].egressBitsPerSecond = fat.site[1].egressBitsPerSecond = 1e9;
  EXPECT_EQ(tcpBufferBytesFor(fat), 55 * kMiB);  // 57.5e6 bytes, rounded up to MiB
  // The slower of the sender's uplink and the receiver's downlink counts.
  fat.site[1].ingressBitsPerSecond = 100e6;
  EXPECT_EQ(tcpBufferBytesFor(fat), 55 * kMiB);  // b -> a is still 1 Gbit/s
  fat.site[0].ingressBitsPerSecond = 100e6;
  EXPECT_EQ(tcpBufferBytesFor(fat), 32 * kMiB);
  // Unlimited counts as 1 Gbit/s; 10 Gbit/s across the world is capped.
  fat.site[0] = fat.site[1] = SiteShape{};
  EXPECT_EQ(tcpBufferBytesFor(fat), 55 * kMiB);
  for (auto& site : fat.site) site.egressBitsPerSecond = site.ingressBitsPerSecond = 1e11;
  EXPECT_EQ(tcpBufferBytesFor(fat), 1024 * kMiB);
}

TEST(NetnsTcpInitialWindow, BbrsFirstPacingReachesTheRateOnTheLongestRoundTrip) {
  // 100 Mbit/s at 230 ms: 2.875 MB in flight, over bbr's startup gain of
  // 2.885 and 1448 bytes a segment, 689 segments; a receive buffer that
  // advertises them at once (about half of it) starts at 2 MiB.
  WanShape world;
  world.sites = {"london", "tokyo"};
  world.oneWay = {{Microseconds(0), Microseconds(115'000)},
                  {Microseconds(115'000), Microseconds(0)}};
  world.site.resize(2);
  world.site[0].egressBitsPerSecond = world.site[1].egressBitsPerSecond = 100e6;
  EXPECT_EQ(tcpInitialWindowFor(world), 689);
  EXPECT_EQ(tcpInitialReceiveBytesFor(689), int64_t{2} << 20);
  // The slower of the sender's uplink and the receiver's downlink counts:
  // 50 Mbit/s into both sites, half of it.
  world.site[0].ingressBitsPerSecond = world.site[1].ingressBitsPerSecond = 50e6;
  EXPECT_EQ(tcpInitialWindowFor(world), 345);
  EXPECT_EQ(tcpInitialReceiveBytesFor(345), int64_t{1} << 20);
  // No limit counts as 1 Gbit/s: 6883 segments at 230 ms, the workers' cap.
  world.site[0] = world.site[1] = SiteShape{};
  EXPECT_EQ(tcpInitialWindowFor(world), kMostTcpInitialWindow);
  EXPECT_EQ(tcpInitialReceiveBytesFor(kMostTcpInitialWindow), int64_t{4} << 20);
  // A short, slow path (20 Mbit/s at 100 ms would need 60): not below the
  // 100 segments of hosts tuned for the WAN; 1 MiB at the least.
  world.site[0].egressBitsPerSecond = world.site[1].egressBitsPerSecond = 20e6;
  world.oneWay = {{Microseconds(0), Microseconds(50'000)}, {Microseconds(50'000), Microseconds(0)}};
  EXPECT_EQ(tcpInitialWindowFor(world), kLeastTcpInitialWindow);
  EXPECT_EQ(tcpInitialReceiveBytesFor(kLeastTcpInitialWindow), int64_t{1} << 20);
}

class NetnsNetworkTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (Status s = checkNetnsAllowed(); !s.ok()) GTEST_SKIP() << s.message();
  }

  std::unique_ptr<NetnsNetwork> make(WanShape shape) {
    auto net = NetnsNetwork::create(std::move(shape));
    EXPECT_TRUE(net.ok()) << net.status().toString();
    return net.ok() ? std::move(*net) : nullptr;
  }

  // A UDP echo server in `site` until `stop`.
  static std::thread echoServer(const NetnsNetwork& net, size_t site, std::atomic<bool>& stop,
                                std::atomic<bool>& ready) {
    return std::thread([&net, site, &stop, &ready] {
      Status s = net.runIn(site, [&] {
        const int fd = ::socket(AF_INET, SOCK_DGRAM, 0);
        sockaddr_in a = addressOf(site, kPort);
        if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
          ADD_FAILURE() << "bind: " << std::strerror(errno);
          ready = true;
          return;
        }
        ready = true;
        char buf[2048];
        while (!stop) {
          pollfd p{fd, POLLIN, 0};
          if (::poll(&p, 1, 50) <= 0) continue;
          sockaddr_in from{};
          socklen_t len = sizeof from;
          const ssize_t n =
              ::recvfrom(fd, buf, sizeof buf, 0, reinterpret_cast<sockaddr*>(&from), &len);
          if (n > 0)
            ::sendto(fd, buf, static_cast<size_t>(n), 0, reinterpret_cast<sockaddr*>(&from), len);
        }
        ::close(fd);
      });
      EXPECT_TRUE(s.ok()) << s.toString();
    });
  }

  // Median UDP round trip from `from` to the echo server in `to`; -1 when
  // most probes got no answer within a second.
  static double medianRtt(const NetnsNetwork& net, size_t from, size_t to, int probes = 15) {
    std::vector<double> rtts;
    Status s = net.runIn(from, [&] {
      const int fd = ::socket(AF_INET, SOCK_DGRAM, 0);
      sockaddr_in a = addressOf(to, kPort);
      for (int i = 0; i < probes; ++i) {
        const auto start = std::chrono::steady_clock::now();
        ::sendto(fd, &i, sizeof i, 0, reinterpret_cast<sockaddr*>(&a), sizeof a);
        pollfd p{fd, POLLIN, 0};
        if (::poll(&p, 1, 1000) <= 0) continue;
        int got = -1;
        if (::recv(fd, &got, sizeof got, 0) == sizeof got && got == i) {
          rtts.push_back(Seconds(std::chrono::steady_clock::now() - start).count());
        }
      }
      ::close(fd);
    });
    EXPECT_TRUE(s.ok()) << s.toString();
    if (rtts.size() * 2 < static_cast<size_t>(probes)) return -1;
    std::sort(rtts.begin(), rtts.end());
    return rtts[rtts.size() / 2];
  }
};

TEST_F(NetnsNetworkTest, RoundTripsAreThoseAskedFor) {
  auto net = make(threeSites());
  ASSERT_NE(net, nullptr);
  std::atomic<bool> stop{false}, readyB{false}, readyC{false};
  std::thread b = echoServer(*net, 1, stop, readyB);
  std::thread c = echoServer(*net, 2, stop, readyC);
  while (!readyB || !readyC) std::this_thread::sleep_for(1ms);
  const double ab = medianRtt(*net, 0, 1);
  const double ac = medianRtt(*net, 0, 2);
  const double cb = medianRtt(*net, 2, 1);
  stop = true;
  b.join();
  c.join();
  std::printf(
      "round trips (median of 15): a-b %.2f ms (asked 100), a-c %.2f ms (40), c-b %.2f ms "
      "(10)\n",
      ab * 1e3, ac * 1e3, cb * 1e3);
  EXPECT_NEAR(ab, 0.100, 0.100 * 0.03 + 0.001);
  EXPECT_NEAR(ac, 0.040, 0.040 * 0.03 + 0.001);
  EXPECT_NEAR(cb, 0.010, 0.010 * 0.03 + 0.001);
  EXPECT_EQ(net->counters().foreign, 0u);
}

TEST_F(NetnsNetworkTest, TcpFillsTheShapedUplinkAndNoMore) {
  auto net = make(threeSites());
  ASSERT_NE(net, nullptr);
  // a -> b over TCP for 6 s; the receiver counts what arrived between 2 s
  // (past slow start) and 6 s. On the wire each segment of 1448 payload
  // bytes (MTU 1500 less the IP and TCP headers with timestamps) is 1500+.
  std::atomic<bool> listening{false};
  std::atomic<double> goodput{0};
  std::thread receiver([&] {
    Status s = net->runIn(1, [&] {
      const int l = ::socket(AF_INET, SOCK_STREAM, 0);
      const int one = 1;
      ::setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
      sockaddr_in a = addressOf(1, kPort);
      ASSERT_EQ(::bind(l, reinterpret_cast<sockaddr*>(&a), sizeof a), 0) << std::strerror(errno);
      ::listen(l, 1);
      listening = true;
      const int fd = ::accept(l, nullptr, nullptr);
      ASSERT_GE(fd, 0);
      std::vector<char> buf(1 << 20);
      const auto start = std::chrono::steady_clock::now();
      uint64_t counted = 0;
      while (true) {
        const ssize_t n = ::recv(fd, buf.data(), buf.size(), 0);
        if (n <= 0) break;
        const double t = Seconds(std::chrono::steady_clock::now() - start).count();
        if (t >= 2.0 && t < 6.0) counted += static_cast<uint64_t>(n);
        if (t >= 6.0) break;
      }
      goodput = static_cast<double>(counted) * 8 / 4.0;
      ::close(fd);
      ::close(l);
    });
    EXPECT_TRUE(s.ok()) << s.toString();
  });
  while (!listening) std::this_thread::sleep_for(1ms);
  Status s = net->runIn(0, [&] {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a = addressOf(1, kPort);
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0) << std::strerror(errno);
    std::vector<char> buf(1 << 16, 'x');
    const auto until = std::chrono::steady_clock::now() + 6500ms;
    while (std::chrono::steady_clock::now() < until) {
      if (::send(fd, buf.data(), buf.size(), MSG_NOSIGNAL) <= 0) break;
    }
    ::close(fd);
  });
  ASSERT_TRUE(s.ok()) << s.toString();
  receiver.join();
  const double wire = goodput.load() * 1500.0 / 1448.0;
  std::printf(
      "TCP a -> b over 2-6 s: goodput %.2f Mbit/s, %.2f Mbit/s on the wire (asked 20, "
      "offload %s)\n",
      goodput.load() / 1e6, wire / 1e6, net->offload() ? "on" : "off");
  EXPECT_NEAR(wire, 20e6, 20e6 * 0.05) << "goodput " << goodput.load() / 1e6 << " Mbit/s";
}

TEST_F(NetnsNetworkTest, LossAndPartitionsDropWhatTheyShould) {
  WanShape shape = threeSites();
  shape.site[2].loss = 0.2;
  shape.seed = 11;
  auto net = make(shape);
  ASSERT_NE(net, nullptr);
  std::atomic<bool> stop{false}, ready{false};
  std::thread b = echoServer(*net, 1, stop, ready);
  while (!ready) std::this_thread::sleep_for(1ms);

  // c -> b loses 20% of what c sends (the echoes from b are not lost): of
  // 400 probes, 320 come back (binomial sd 8).
  int answered = 0;
  Status s = net->runIn(2, [&] {
    const int fd = ::socket(AF_INET, SOCK_DGRAM, 0);
    sockaddr_in a = addressOf(1, kPort);
    int got;
    const auto drain = [&](int waitMs) {
      pollfd p{fd, POLLIN, 0};
      while (::poll(&p, 1, waitMs) > 0 && ::recv(fd, &got, sizeof got, 0) == sizeof got) {
        ++answered;
      }
    };
    for (int i = 0; i < 400; ++i) {
      ::sendto(fd, &i, sizeof i, 0, reinterpret_cast<sockaddr*>(&a), sizeof a);
      std::this_thread::sleep_for(200us);
      drain(0);
    }
    drain(300);
    ::close(fd);
  });
  ASSERT_TRUE(s.ok()) << s.toString();
  std::printf("20%% loss at c: %d of 400 probes answered\n", answered);
  EXPECT_NEAR(answered, 320, 40);
  EXPECT_EQ(net->counters().sites[2].lost, 400u - static_cast<uint64_t>(answered));

  // a cut off: nothing crosses either way, and all of it again once healed.
  net->setPartitioned(0, true);
  EXPECT_EQ(medianRtt(*net, 0, 1, 4), -1);
  EXPECT_GT(net->counters().sites[0].partitioned, 0u);
  net->setPartitioned(0, false);
  EXPECT_NEAR(medianRtt(*net, 0, 1, 5), 0.100, 0.004);
  stop = true;
  b.join();
}

TEST_F(NetnsNetworkTest, AThrottledUplinkCarriesTheNewRate) {
  auto net = make(threeSites());
  ASSERT_NE(net, nullptr);
  net->setEgressRate(0, 5e6);
  // 2 MB over UDP at a 5 Mbit/s uplink with a 100 ms queue: the WAN takes
  // in about the rate x (time + queue) and drops the rest.
  const auto before = net->counters().sites[0];
  Status s = net->runIn(0, [&] {
    const int fd = ::socket(AF_INET, SOCK_DGRAM, 0);
    sockaddr_in a = addressOf(2, kPort);
    std::vector<char> packet(1000, 'x');
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < 2000; ++i) {
      ::sendto(fd, packet.data(), packet.size(), 0, reinterpret_cast<sockaddr*>(&a), sizeof a);
      std::this_thread::sleep_for(start + i * 500us - std::chrono::steady_clock::now());
    }
    ::close(fd);
  });
  ASSERT_TRUE(s.ok()) << s.toString();
  const auto after = net->counters().sites[0];
  // 1 s of sending at 16 Mbit/s (1028-byte IP packets) into 5 Mbit/s: about
  // 5 Mbit/s x 1.1 s passes.
  const double passed = static_cast<double>((after.packetsSent - before.packetsSent) -
                                            (after.egressDropped - before.egressDropped));
  std::printf(
      "throttled to 5 Mbit/s: %.2f Mbit passed in 1 s of sending (expected 5.5: 1 s and "
      "the 100 ms queue)\n",
      passed * 1028 * 8 / 1e6);
  EXPECT_NEAR(passed * 1028 * 8, 5e6 * 1.1, 5e6 * 0.15);
}

}  // namespace
}  // namespace geo::wan
