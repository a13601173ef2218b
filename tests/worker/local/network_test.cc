// --network and the namespace WAN's flags: what they build, and the errors
// that name the flag and what is allowed.

#include "worker/local/network.h"

#include <gtest/gtest.h>

namespace geo::local {
namespace {

using wan::Microseconds;

Topology world(std::optional<std::string> uplink = std::nullopt) {
  TopologyOptions o;
  o.uplink = std::move(uplink);
  auto t = makeTopology(o);
  EXPECT_TRUE(t.ok()) << t.status().toString();
  return *t;
}

std::string errorOf(const NetworkOptions& o, const Topology& t) {
  auto plan = makeNetworkPlan(o, t);
  EXPECT_FALSE(plan.ok());
  return plan.ok() ? std::string() : plan.status().message();
}

TEST(LocalNetwork, UserspaceIsTheDefaultAndBuildsNoWan) {
  auto plan = makeNetworkPlan(NetworkOptions{}, world());
  ASSERT_TRUE(plan.ok()) << plan.status().toString();
  EXPECT_EQ(plan->mode, NetworkMode::kUserspace);
  EXPECT_EQ(plan->shape.size(), 0u);
}

TEST(LocalNetwork, NetnsBuildsOneSitePerRegionFromTheTopology) {
  NetworkOptions o;
  o.mode = "netns";
  auto plan = makeNetworkPlan(o, world());
  ASSERT_TRUE(plan.ok()) << plan.status().toString();
  EXPECT_EQ(plan->mode, NetworkMode::kNetns);
  const wan::WanShape& s = plan->shape;
  EXPECT_EQ(s.sites, (std::vector<std::string>{"london", "tokyo", "oregon", "ohio"}));
  // Half the round trip each way: london-tokyo 230 ms.
  EXPECT_EQ(s.oneWay[0][1], Microseconds(115000));
  EXPECT_EQ(s.oneWay[1][0], Microseconds(115000));
  EXPECT_EQ(s.oneWay[2][3], Microseconds(25000));
  EXPECT_EQ(s.oneWay[1][1], Microseconds(0));
  for (const wan::SiteShape& site : s.site) {
    EXPECT_DOUBLE_EQ(site.egressBitsPerSecond, 100e6);  // the preset's uplink
    EXPECT_DOUBLE_EQ(site.ingressBitsPerSecond, 0);
    EXPECT_EQ(site.queue, Microseconds(100000));
    EXPECT_EQ(site.loss, 0);
  }
  EXPECT_EQ(s.jitter, Microseconds(0));
}

TEST(LocalNetwork, TheNamespaceFlagsShapeTheWan) {
  NetworkOptions o;
  o.mode = "netns";
  o.loss = {"1%", "tokyo=0.5%"};
  o.jitter = "5ms";
  o.downlink = "200mbit";
  o.queue = "50ms";
  auto plan = makeNetworkPlan(o, world("20mbit"));
  ASSERT_TRUE(plan.ok()) << plan.status().toString();
  const wan::WanShape& s = plan->shape;
  EXPECT_DOUBLE_EQ(s.site[0].loss, 0.01);
  EXPECT_DOUBLE_EQ(s.site[1].loss, 0.005) << "a region's own rate wins over the one for all";
  EXPECT_DOUBLE_EQ(s.site[3].loss, 0.01);
  EXPECT_EQ(s.jitter, Microseconds(5000));
  EXPECT_DOUBLE_EQ(s.site[2].egressBitsPerSecond, 20e6);
  EXPECT_DOUBLE_EQ(s.site[2].ingressBitsPerSecond, 200e6);
  EXPECT_EQ(s.site[2].queue, Microseconds(50000));
}

TEST(LocalNetwork, NamespaceFlagsNeedTheNamespaceNetwork) {
  NetworkOptions o;
  o.loss = {"1%"};
  EXPECT_NE(errorOf(o, world()).find("--loss needs --network netns"), std::string::npos);
  o = {};
  o.jitter = "1ms";
  EXPECT_NE(errorOf(o, world()).find("--jitter needs --network netns"), std::string::npos);
  o = {};
  o.mode = "kernel";
  const std::string e = errorOf(o, world());
  EXPECT_NE(e.find("--network kernel: not a network (allowed: userspace"), std::string::npos) << e;
}

TEST(LocalNetwork, BadValuesAreNamed) {
  NetworkOptions o;
  o.mode = "netns";
  o.loss = {"paris=1%"};
  EXPECT_NE(errorOf(o, world()).find("--loss paris=1%: paris is not a region of --regions"),
            std::string::npos);
  o.loss = {"100%"};
  EXPECT_NE(errorOf(o, world()).find("--loss 100%: '100%' is not a loss rate"), std::string::npos);
  o.loss = {};
  o.queue = "0ms";
  EXPECT_NE(errorOf(o, world()).find("--queue 0ms: allowed from 1ms to 60s"), std::string::npos);
  o.queue = {};
  o.downlink = "fast";
  EXPECT_NE(errorOf(o, world()).find("--downlink fast: not a rate"), std::string::npos);
  o.downlink = {};
  o.jitter = "5";
  EXPECT_NE(errorOf(o, world()).find("--jitter: '5' needs a unit"), std::string::npos);
}

TEST(LocalNetwork, LossRates) {
  EXPECT_DOUBLE_EQ(*parseLoss("1%"), 0.01);
  EXPECT_DOUBLE_EQ(*parseLoss("0.5%"), 0.005);
  EXPECT_DOUBLE_EQ(*parseLoss("0.02"), 0.02);
  EXPECT_DOUBLE_EQ(*parseLoss("0"), 0);
  EXPECT_FALSE(parseLoss("1").ok()) << "a probability below 1";
  EXPECT_FALSE(parseLoss("-1%").ok());
  EXPECT_FALSE(parseLoss("%").ok());
  EXPECT_FALSE(parseLoss("1%%").ok());
}

}  // namespace
}  // namespace geo::local
