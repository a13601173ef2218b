// The `geotrain local` command line parsed into LocalOptions, without
// running anything: the flags the launcher relies on, the last value of a
// flag given twice, and the flags table of options.h matching the CLI.

#include "worker/local/cli.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

namespace geo::local {
namespace {

struct Parsed {
  LocalOptions options;
  bool ran = false;
};

// Parses `geotrain local <args>`; throws CLI::ParseError as CLI11 does.
void parse(Parsed& p, std::vector<std::string> args) {
  CLI::App app("test", "geotrain");
  app.require_subcommand(1);
  addLocalCommand(app, p.options, [&p] { p.ran = true; });
  args.insert(args.begin(), "local");
  std::reverse(args.begin(), args.end());  // CLI11 takes a vector in reverse order
  app.parse(args);
}

TEST(LocalCli, ParsesTopologyFaultsAndKeyFlagsInCommandLineOrder) {
  Parsed p;
  parse(p, {"--regions", "a,b", "--workers-per-region", "2", "--period", "auto", "--delay", "3",
            "--uplink", "10mbit", "--kill", "a@2s", "--throttle", "b@1s=4mbit", "--out", "run"});
  EXPECT_TRUE(p.ran);
  EXPECT_EQ(p.options.regions, "a,b");
  EXPECT_EQ(p.options.workersPerRegion, 2);
  ASSERT_TRUE(p.options.uplink.has_value());
  EXPECT_EQ(*p.options.uplink, "10mbit");
  EXPECT_EQ(p.options.faults.kill, std::vector<std::string>{"a@2s"});
  EXPECT_EQ(p.options.faults.throttle, std::vector<std::string>{"b@1s=4mbit"});
  EXPECT_EQ(p.options.out, "run");
  ASSERT_EQ(p.options.keyFlags.size(), 2u);
  EXPECT_EQ(p.options.keyFlags[0], (std::pair<std::string, std::string>{"--period", "auto"}));
  EXPECT_EQ(p.options.keyFlags[1], (std::pair<std::string, std::string>{"--delay", "3"}));
}

// scripts/demo.sh passes defaults that the user's own flags override.
TEST(LocalCli, ASingleValueFlagGivenTwiceTakesItsLastValue) {
  Parsed p;
  parse(p, {"--regions", "a,b", "--preset", "world", "--regions", "c,d", "--preset", "lan"});
  EXPECT_EQ(p.options.regions, "c,d");
  EXPECT_EQ(p.options.preset, "lan");
}

TEST(LocalCli, EveryWorkerYamlFlagOfTheTableIsACommandLineFlag) {
  for (const KeyFlag& f : kKeyFlags) {
    Parsed p;
    EXPECT_NO_THROW(parse(p, {f.flag, "1"})) << f.flag;
    ASSERT_EQ(p.options.keyFlags.size(), 1u) << f.flag;
    EXPECT_EQ(p.options.keyFlags[0].first, f.flag);
  }
}

TEST(LocalCli, AnUnknownFlagIsAParseErrorAndRunsNothing) {
  Parsed p;
  EXPECT_THROW(parse(p, {"--no-such-flag", "1"}), CLI::ParseError);
  EXPECT_FALSE(p.ran);
}

}  // namespace
}  // namespace geo::local
