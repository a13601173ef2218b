// WanModel: what the emulated WAN path does to each packet, on exact times.

#include "worker/wan/wan_model.h"

#include <gtest/gtest.h>

#include <chrono>

namespace geo::wan {
namespace {

using namespace std::chrono_literals;

const SteadyClock::time_point t0 = SteadyClock::time_point(100s);

WanShape twoSites(Microseconds oneWay, double egress = 0, double ingress = 0) {
  WanShape shape;
  shape.sites = {"a", "b"};
  shape.oneWay = {{0us, oneWay}, {oneWay, 0us}};
  shape.site.resize(2);
  shape.site[0].egressBitsPerSecond = egress;
  shape.site[1].ingressBitsPerSecond = ingress;
  return shape;
}

TEST(WanModel, AnUnshapedPathDelaysByItsOneWayTime) {
  WanModel model(twoSites(50ms));
  const auto sent = model.send(0, 1, 1500, t0);
  ASSERT_EQ(sent.fate, Fate::kDelivered);
  EXPECT_EQ(sent.at, t0 + 50ms);
  const auto got = model.arrive(0, 1, 1500, sent.at);
  ASSERT_EQ(got.fate, Fate::kDelivered);
  EXPECT_EQ(got.at, sent.at) << "no ingress rate: delivered on arrival";
  EXPECT_EQ(model.counters(0).packetsSent, 1u);
  EXPECT_EQ(model.counters(1).packetsDelivered, 1u);
  EXPECT_EQ(model.counters(1).bytesDelivered, 1500u);
}

TEST(WanModel, DelaysArePerOrderedPair) {
  WanShape shape = twoSites(0us);
  shape.oneWay[0][1] = 30ms;
  shape.oneWay[1][0] = 70ms;
  WanModel model(shape);
  EXPECT_EQ(model.send(0, 1, 100, t0).at, t0 + 30ms);
  EXPECT_EQ(model.send(1, 0, 100, t0).at, t0 + 70ms);
}

TEST(WanModel, TheUplinkSerializesEverythingASiteSends) {
  // 12 Mbit/s: a 1500-byte packet takes 1 ms on the wire.
  WanModel model(twoSites(10ms, 12e6));
  EXPECT_EQ(model.send(0, 1, 1500, t0).at, t0 + 1ms + 10ms);
  EXPECT_EQ(model.send(0, 1, 1500, t0).at, t0 + 2ms + 10ms) << "queued behind the first";
  EXPECT_EQ(model.send(0, 1, 1500, t0 + 5ms).at, t0 + 6ms + 10ms) << "the queue had drained";
  EXPECT_EQ(model.send(1, 0, 1500, t0).at, t0 + 10ms) << "b's uplink is unlimited";
}

TEST(WanModel, AFullQueueDropsTheTail) {
  // 12 Mbit/s and a queue of 5 ms: the sixth packet sent at once would wait
  // 5 ms, the seventh 6 ms.
  WanShape shape = twoSites(0us, 12e6);
  shape.site[0].queue = 5ms;
  WanModel model(shape);
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(model.send(0, 1, 1500, t0).fate, Fate::kDelivered) << i;
  }
  EXPECT_EQ(model.send(0, 1, 1500, t0).fate, Fate::kQueueFull);
  EXPECT_EQ(model.counters(0).egressDropped, 1u);
  EXPECT_EQ(model.send(0, 1, 1500, t0 + 3ms).fate, Fate::kDelivered) << "drained by three";
}

TEST(WanModel, TheDownlinkSerializesWhatASiteReceives) {
  WanShape shape;
  shape.sites = {"a", "b", "c"};
  shape.oneWay = {{0us, 10ms, 10ms}, {10ms, 0us, 10ms}, {10ms, 10ms, 0us}};
  shape.site.resize(3);
  shape.site[2].ingressBitsPerSecond = 12e6;
  WanModel model(shape);
  ASSERT_TRUE(model.shapesIngress(2));
  const auto fromA = model.send(0, 2, 1500, t0);
  const auto fromB = model.send(1, 2, 1500, t0);
  EXPECT_EQ(model.arrive(0, 2, 1500, fromA.at).at, t0 + 11ms);
  EXPECT_EQ(model.arrive(1, 2, 1500, fromB.at).at, t0 + 12ms) << "behind a's packet";
}

TEST(WanModel, APartitionLosesEverythingBothWaysAndInFlight) {
  WanModel model(twoSites(50ms));
  const auto inFlight = model.send(0, 1, 100, t0);
  ASSERT_EQ(inFlight.fate, Fate::kDelivered);
  model.setPartitioned(1, true);
  EXPECT_EQ(model.send(0, 1, 100, t0).fate, Fate::kPartitioned);
  EXPECT_EQ(model.send(1, 0, 100, t0).fate, Fate::kPartitioned);
  EXPECT_EQ(model.arrive(0, 1, 100, inFlight.at).fate, Fate::kPartitioned);
  model.setPartitioned(1, false);
  EXPECT_EQ(model.send(0, 1, 100, t0 + 1s).fate, Fate::kDelivered);
  EXPECT_EQ(model.counters(0).partitioned, 2u);
  EXPECT_EQ(model.counters(1).partitioned, 1u);
}

// A partial partition: the link between a and b is cut both ways (a packet
// already on it too), while each still reaches c; mended, it carries again.
TEST(WanModel, ALinkCutLosesItsPacketsOnlyAndBothWays) {
  WanShape shape;
  shape.sites = {"a", "b", "c"};
  shape.oneWay.assign(3, std::vector<Microseconds>(3, 20ms));
  for (size_t i = 0; i < 3; ++i) shape.oneWay[i][i] = 0us;
  shape.site.resize(3);
  WanModel model(shape);
  const auto inFlight = model.send(1, 0, 100, t0);
  ASSERT_EQ(inFlight.fate, Fate::kDelivered);
  model.setLinkCut(0, 1, true);
  EXPECT_TRUE(model.linkCut(1, 0));
  EXPECT_FALSE(model.partitioned(0));
  EXPECT_EQ(model.send(0, 1, 100, t0).fate, Fate::kPartitioned);
  EXPECT_EQ(model.send(1, 0, 100, t0).fate, Fate::kPartitioned);
  EXPECT_EQ(model.arrive(1, 0, 100, inFlight.at).fate, Fate::kPartitioned);
  for (const auto& [s, d] : {std::pair{0, 2}, {2, 0}, {1, 2}, {2, 1}}) {
    EXPECT_EQ(model.send(s, d, 100, t0).fate, Fate::kDelivered) << s << "->" << d;
  }
  model.setLinkCut(1, 0, false);
  EXPECT_EQ(model.send(0, 1, 100, t0 + 1s).fate, Fate::kDelivered);
  EXPECT_EQ(model.counters(0).partitioned, 1u);
  EXPECT_EQ(model.counters(1).partitioned, 2u);
}

TEST(WanModel, LossDropsTheAskedShareOfPackets) {
  WanShape shape = twoSites(1ms);
  shape.site[0].loss = 0.1;
  shape.seed = 7;
  WanModel model(shape);
  int lost = 0;
  for (int i = 0; i < 20000; ++i) {
    lost += model.send(0, 1, 100, t0 + std::chrono::microseconds(i)).fate == Fate::kLost ? 1 : 0;
  }
  // Binomial(20000, 0.1): sd 42; 5 sd either way.
  EXPECT_NEAR(lost, 2000, 210);
  EXPECT_EQ(model.counters(0).lost, static_cast<uint64_t>(lost));
}

TEST(WanModel, JitterVariesTheDelayButKeepsTheOrder) {
  WanShape shape = twoSites(20ms);
  shape.jitter = 10ms;
  WanModel model(shape);
  SteadyClock::time_point last{};
  bool varied = false;
  for (int i = 0; i < 1000; ++i) {
    const auto now = t0 + std::chrono::microseconds(100 * i);
    const auto at = model.send(0, 1, 100, now).at;
    EXPECT_GE(at, now + 20ms);
    EXPECT_LE(at, std::max(now + 30ms, last));
    EXPECT_GE(at, last) << "packet " << i << " overtook the one before";
    varied = varied || (at - now != 20ms && at != last);
    last = at;
  }
  EXPECT_TRUE(varied);
}

TEST(WanModel, ARateChangeAppliesToWhatIsSentFromThenOn) {
  WanModel model(twoSites(0us, 12e6));
  EXPECT_EQ(model.send(0, 1, 1500, t0).at, t0 + 1ms);
  model.setEgressRate(0, 1.2e6);
  EXPECT_EQ(model.send(0, 1, 1500, t0 + 1ms).at, t0 + 11ms);
  model.setEgressRate(0, 0);
  EXPECT_EQ(model.send(0, 1, 1500, t0 + 2ms).at, t0 + 11ms) << "unlimited, but not ahead of the "
                                                               "packet before it on the path";
  EXPECT_EQ(model.send(0, 1, 1500, t0 + 20ms).at, t0 + 20ms) << "unlimited";
}

TEST(WanModel, ShapesAreCheckedWithTheirNames) {
  WanShape shape = twoSites(1ms);
  shape.site[1].loss = 1;
  Status s = validateShape(shape);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("b: loss 1 is not allowed"), std::string::npos) << s.message();
  shape = twoSites(1ms);
  shape.site[0].egressBitsPerSecond = -1;
  s = validateShape(shape);
  EXPECT_NE(s.message().find("a egress"), std::string::npos) << s.message();
  shape = twoSites(1ms);
  shape.oneWay[1].pop_back();
  s = validateShape(shape);
  EXPECT_NE(s.message().find("site b: 1 delays for 2 sites"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace geo::wan
