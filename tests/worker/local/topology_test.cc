// Topology of `geotrain local`: presets, --rtt overrides, region names,
// uplink, rank placement. No processes.

#include "worker/local/topology.h"

#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace geo::local {
namespace {

using std::chrono::milliseconds;

TopologyOptions options(std::string regions, std::vector<std::string> rtt = {}) {
  TopologyOptions o;
  o.regions = std::move(regions);
  o.rtt = std::move(rtt);
  return o;
}

std::string errorOf(const TopologyOptions& o) {
  auto t = makeTopology(o);
  EXPECT_FALSE(t.ok());
  return t.ok() ? std::string() : t.status().message();
}

TEST(LocalTopology, WorldPresetMatrix) {
  auto t = makeTopology(TopologyOptions{});
  ASSERT_TRUE(t.ok()) << t.status().toString();
  ASSERT_EQ(t->regions, (std::vector<std::string>{"london", "tokyo", "oregon", "ohio"}));
  // Rows and columns in --regions order; symmetric; zero diagonal.
  const int64_t expectedMs[4][4] = {
      {0, 230, 140, 90}, {230, 0, 100, 160}, {140, 100, 0, 50}, {90, 160, 50, 0}};
  for (size_t i = 0; i < 4; ++i) {
    for (size_t j = 0; j < 4; ++j) {
      EXPECT_EQ(t->rtt[i][j], milliseconds(expectedMs[i][j])) << i << "," << j;
    }
  }
  EXPECT_EQ(t->uplink, "rate=100mbit");
  EXPECT_EQ(t->worldSize(), 4);
  EXPECT_EQ(t->preset, Preset::kWorld);
}

TEST(LocalTopology, PresetRttIsSymmetricAndKnowsOnlyItsRegions) {
  EXPECT_EQ(presetRtt(Preset::kWorld, "tokyo", "london"), milliseconds(230));
  EXPECT_EQ(presetRtt(Preset::kWorld, "ohio", "oregon"), milliseconds(50));
  EXPECT_FALSE(presetRtt(Preset::kWorld, "london", "paris").has_value());
  EXPECT_EQ(presetRtt(Preset::kLan, "london", "paris"), milliseconds(0));
  EXPECT_EQ(presetUplink(Preset::kLan), "");
}

// world16's table is docs/data/world16-rtt.csv's, pair for pair, and a job
// of it without --regions has its 16 regions, every pair known.
TEST(LocalTopology, World16IsTheTableOfItsSourceFile) {
  std::ifstream csv(GEO_WORLD16_CSV);
  ASSERT_TRUE(csv.good()) << GEO_WORLD16_CSV;
  std::string line;
  int pairs = 0;
  std::set<std::string> regions;
  while (std::getline(csv, line)) {
    if (line.empty() || line[0] == '#' || line.rfind("region_a,", 0) == 0) continue;
    std::vector<std::string> f;
    std::stringstream fields(line);
    for (std::string v; std::getline(fields, v, ',');) f.push_back(v);
    ASSERT_EQ(f.size(), 5u) << line;
    EXPECT_EQ(presetRtt(Preset::kWorld16, f[0], f[1]), milliseconds(std::stoi(f[4]))) << line;
    EXPECT_EQ(presetRtt(Preset::kWorld16, f[1], f[0]), milliseconds(std::stoi(f[4]))) << line;
    regions.insert(f[0]);
    regions.insert(f[1]);
    ++pairs;
  }
  EXPECT_EQ(pairs, 16 * 15 / 2);
  EXPECT_EQ(regions.size(), 16u);

  TopologyOptions o;
  o.preset = "world16";
  auto t = makeTopology(o);
  ASSERT_TRUE(t.ok()) << t.status().toString();
  EXPECT_EQ(t->regions, presetRegions(Preset::kWorld16));
  EXPECT_EQ(std::set<std::string>(t->regions.begin(), t->regions.end()), regions);
  EXPECT_EQ(t->rtt[7][8], milliseconds(11)) << "london-paris";
  EXPECT_EQ(t->uplink, "rate=100mbit");
  // A subset, four workers each (the 4 x 4 job of docs/wan-emulation.md).
  o.regions = "london,tokyo,oregon,virginia";
  o.workersPerRegion = 4;
  t = makeTopology(o);
  ASSERT_TRUE(t.ok()) << t.status().toString();
  EXPECT_EQ(t->worldSize(), 16);
  EXPECT_EQ(t->rtt[0][1], milliseconds(212)) << "london-tokyo";
  // world's regions are not all world16's.
  o.regions = "london,atlantis";
  EXPECT_NE(errorOf(o).find("preset world16 knows only virginia, ohio"), std::string::npos)
      << errorOf(o);
}

TEST(LocalTopology, LanPresetHasNoDelayAndNoUplink) {
  TopologyOptions o = options("a,b,c");
  o.preset = "lan";
  auto t = makeTopology(o);
  ASSERT_TRUE(t.ok()) << t.status().toString();
  for (const auto& row : t->rtt) {
    for (const auto& v : row) EXPECT_EQ(v.count(), 0);
  }
  EXPECT_EQ(t->uplink, "");
}

TEST(LocalTopology, RegionOrderFollowsTheFlag) {
  auto t = makeTopology(options("ohio,london"));
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->regions, (std::vector<std::string>{"ohio", "london"}));
  EXPECT_EQ(t->rtt[0][1], milliseconds(90));
}

TEST(LocalTopology, RttOverrideReplacesThePresetInEitherOrder) {
  auto t = makeTopology(options("london,tokyo,ohio", {"tokyo-london=300ms", "ohio-tokyo=1.5s"}));
  ASSERT_TRUE(t.ok()) << t.status().toString();
  EXPECT_EQ(t->rtt[0][1], milliseconds(300));
  EXPECT_EQ(t->rtt[1][0], milliseconds(300));
  EXPECT_EQ(t->rtt[1][2], milliseconds(1500));
  EXPECT_EQ(t->rtt[0][2], milliseconds(90));  // untouched
}

TEST(LocalTopology, RttOverrideUnitsAndRegionNamesWithDashes) {
  const std::vector<std::string> regions = {"us-east", "eu-west-1", "ap"};
  auto o = parseRttOverride("us-east-eu-west-1=250us", regions);
  ASSERT_TRUE(o.ok()) << o.status().toString();
  EXPECT_EQ(o->regionA, 0u);
  EXPECT_EQ(o->regionB, 1u);
  EXPECT_EQ(o->rtt.count(), 250);
  o = parseRttOverride("ap-us-east=2s", regions);
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o->rtt, std::chrono::seconds(2));
}

TEST(LocalTopology, RttOverrideErrorsNameTheFlagAndWhatIsAllowed) {
  const std::vector<std::string> regions = {"london", "tokyo"};
  auto e = parseRttOverride("london-tokyo", regions);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("--rtt london-tokyo: expected <regionA>-<regionB>=<round"),
            std::string::npos)
      << e.status().message();

  e = parseRttOverride("london-paris=10ms", regions);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("'london-paris' is not <regionA>-<regionB>"),
            std::string::npos)
      << e.status().message();
  EXPECT_NE(e.status().message().find("london, tokyo"), std::string::npos);

  e = parseRttOverride("london-tokyo=fast", regions);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("round-trip time 'fast' is not valid"), std::string::npos)
      << e.status().message();
  EXPECT_NE(e.status().message().find("us, ms or s"), std::string::npos);

  e = parseRttOverride("london-tokyo=10", regions);  // no unit
  EXPECT_FALSE(e.ok());

  e = parseRttOverride("london-london=10ms", {"london", "london-london"});
  EXPECT_FALSE(e.ok());

  const std::string twice =
      errorOf(options("london,tokyo", {"london-tokyo=1ms", "tokyo-london=2ms"}));
  EXPECT_NE(twice.find("more than once"), std::string::npos) << twice;
}

TEST(LocalTopology, PairUnknownToThePresetNeedsRtt) {
  const std::string e = errorOf(options("london,paris"));
  EXPECT_NE(e.find("london-paris"), std::string::npos) << e;
  EXPECT_NE(e.find("--rtt london-paris="), std::string::npos) << e;

  auto t = makeTopology(options("london,paris", {"paris-london=20ms"}));
  ASSERT_TRUE(t.ok()) << t.status().toString();
  EXPECT_EQ(t->rtt[0][1], milliseconds(20));
}

TEST(LocalTopology, RegionNamesAreUniqueLowercaseDnsLabels) {
  EXPECT_TRUE(validateRegionNames({"london", "us-east-1", "a", std::string(63, 'x')}).ok());
  for (const std::string& bad : std::vector<std::string>{
           "London", "-lon", "lon-", "lon_don", "", "l.on", "t\xc3\xb6kyo", std::string(64, 'x')}) {
    const Status s = validateRegionNames({bad});
    ASSERT_FALSE(s.ok()) << "'" << bad << "'";
    EXPECT_NE(s.message().find("--regions"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("lowercase letters"), std::string::npos) << s.message();
  }
  const Status twice = validateRegionNames({"tokyo", "london", "tokyo"});
  ASSERT_FALSE(twice.ok());
  EXPECT_NE(twice.message().find("'tokyo' is listed twice"), std::string::npos);
  EXPECT_FALSE(validateRegionNames({}).ok());

  auto list = parseRegionList(" london , tokyo ");
  ASSERT_TRUE(list.ok());
  EXPECT_EQ(*list, (std::vector<std::string>{"london", "tokyo"}));
  EXPECT_FALSE(parseRegionList("london,,tokyo").ok());
  EXPECT_FALSE(parseRegionList("").ok());
}

TEST(LocalTopology, UplinkAndPresetFlags) {
  EXPECT_EQ(*parseUplink("100mbit"), "rate=100mbit");
  EXPECT_EQ(*parseUplink("1.5gbit"), "rate=1.5gbit");
  EXPECT_EQ(*parseUplink("0"), "");
  EXPECT_EQ(*parseUplink("none"), "");
  EXPECT_EQ(*parseUplink("0mbit"), "");
  for (const char* bad : {"100", "fast", "", "100MB", "-5mbit"}) {
    auto u = parseUplink(bad);
    ASSERT_FALSE(u.ok()) << bad;
    EXPECT_NE(u.status().message().find("--uplink"), std::string::npos);
    EXPECT_NE(u.status().message().find("0 or none for unlimited"), std::string::npos);
  }
  TopologyOptions o;
  o.uplink = "none";
  EXPECT_EQ(makeTopology(o)->uplink, "");
  o.uplink = "20mbit";
  EXPECT_EQ(makeTopology(o)->uplink, "rate=20mbit");

  o = TopologyOptions{};
  o.preset = "mars";
  EXPECT_NE(errorOf(o).find("--preset mars: unknown preset (allowed: world, world16, lan)"),
            std::string::npos);
  o = TopologyOptions{};
  o.workersPerRegion = 0;
  EXPECT_NE(errorOf(o).find("--workers-per-region 0"), std::string::npos);
}

// Worker and region counts are bounded before anything is sized by them.
TEST(LocalTopology, WorkerAndRegionCountsAreBounded) {
  TopologyOptions o;  // four regions
  o.workersPerRegion = 100000;
  EXPECT_EQ(errorOf(o),
            "--workers-per-region 100000: 4 regions x 100000 workers is not allowed (allowed: at "
            "most 256 workers in all, each a process on this machine: 1..64 per region with 4 "
            "regions)");
  o.workersPerRegion = INT64_MAX;
  EXPECT_NE(errorOf(o).find("4 regions x 9223372036854775807 workers is not allowed"),
            std::string::npos);
  o.workersPerRegion = 64;
  auto t = makeTopology(o);
  ASSERT_TRUE(t.ok()) << t.status().toString();
  EXPECT_EQ(t->worldSize(), kMaxLocalWorkers);
  o.workersPerRegion = 65;
  EXPECT_NE(errorOf(o).find("--workers-per-region 65:"), std::string::npos);

  std::string names;
  for (int i = 0; i < 300; ++i) names += (i ? ",r" : "r") + std::to_string(i);
  o = options(names);
  o.preset = "lan";
  EXPECT_EQ(errorOf(o),
            "--regions: 300 regions is not allowed (allowed: 1 to 256, as geotrain local runs at "
            "most 256 workers)");
  // A huge list is refused before its names are copied or checked.
  o = options(std::string(10000000, ','));
  EXPECT_NE(errorOf(o).find("--regions: 10000001 regions is not allowed"), std::string::npos);
}

TEST(LocalTopology, RanksAreAssignedRegionByRegion) {
  TopologyOptions o = options("london,tokyo,oregon");
  o.workersPerRegion = 3;
  auto t = makeTopology(o);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->worldSize(), 9);
  EXPECT_EQ(rankOf(*t, 0, 0), 0);
  EXPECT_EQ(rankOf(*t, 1, 0), 3);
  EXPECT_EQ(rankOf(*t, 2, 2), 8);
  for (int64_t r = 0; r < 9; ++r) {
    const RankPlace p = placeOf(*t, r);
    EXPECT_EQ(p.regionIndex, r / 3);
    EXPECT_EQ(p.localIndex, r % 3);
    EXPECT_EQ(rankOf(*t, p.regionIndex, p.localIndex), r);
  }
  EXPECT_THROW(placeOf(*t, 9), geo::Error);
  EXPECT_EQ(linkKey("london", "tokyo"), "london-tokyo");
}

}  // namespace
}  // namespace geo::local
