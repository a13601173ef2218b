#include "controller/app/flags.h"

#include <gtest/gtest.h>

#include <CLI/CLI.hpp>

namespace geo::controller {
namespace {

TEST(ParseSecondsTest, WholeSecondsWithOrWithoutTheUnit) {
  EXPECT_EQ(parseSeconds("15s", 2), 15);
  EXPECT_EQ(parseSeconds("15", 2), 15);
  EXPECT_EQ(parseSeconds("2s", 2), 2);
  EXPECT_EQ(parseSeconds("1s", 2), std::nullopt);  // below the minimum
  for (const char* bad : {"", "s", "1.5s", "-3s", "15m", "15ss", " 15s", "99999999999999s"})
    EXPECT_EQ(parseSeconds(bad, 0), std::nullopt) << bad;
}

// Parses `args` (after the program name) into `flags`; the CLI11 message on
// a parse error, "" on success.
std::string parse(ControllerFlags& flags, std::vector<std::string> args) {
  CLI::App app("test");
  addFlags(app, flags);
  std::vector<std::string> reversed(args.rbegin(), args.rend());
  try {
    app.parse(reversed);
  } catch (const CLI::ParseError& e) {
    return e.what();
  }
  return "";
}

TEST(AddFlagsTest, DefaultsAndValues) {
  ControllerFlags f;
  ASSERT_EQ(parse(f, {}), "");
  EXPECT_EQ(f.leaseDurationSeconds, 15);
  EXPECT_EQ(f.renewDeadlineSeconds, 10);
  EXPECT_EQ(f.workers, 2);
  EXPECT_TRUE(f.leaderElect);
  ASSERT_EQ(
      parse(f, {"--lease-duration", "4s", "--renew-deadline=3", "--workers", "8", "--member",
                "tokyo=kc-tokyo", "--member", "ohio=kc-ohio:config", "--leader-elect", "false"}),
      "");
  EXPECT_EQ(f.leaseDurationSeconds, 4);
  EXPECT_EQ(f.renewDeadlineSeconds, 3);
  EXPECT_EQ(f.workers, 8);
  EXPECT_FALSE(f.leaderElect);
  EXPECT_EQ(f.members, (std::vector<std::string>{"tokyo=kc-tokyo", "ohio=kc-ohio:config"}));
}

// Both duration flags refuse the same spellings, each naming its minimum.
TEST(AddFlagsTest, DurationsAreCheckedAlike) {
  ControllerFlags f;
  EXPECT_NE(parse(f, {"--lease-duration", "1s"}).find("a whole number of seconds >= 2, e.g. 15s"),
            std::string::npos);
  EXPECT_NE(parse(f, {"--renew-deadline", "0s"}).find("a whole number of seconds >= 1, e.g. 10s"),
            std::string::npos);
  EXPECT_NE(parse(f, {"--renew-deadline", "ten"}), "");
  EXPECT_NE(parse(f, {"--workers", "0"}), "");
  EXPECT_NE(parse(f, {"--cleanup-timeout", "-1"}), "");
  EXPECT_NE(parse(f, {"--key-rotation-step", "0"}), "");
  EXPECT_EQ(parse(f, {"--key-rotation-step", "30"}), "");
  EXPECT_EQ(f.keyRotationStepSeconds, 30);
}

TEST(CheckFlagsTest, RenewDeadlineBelowLeaseDuration) {
  ControllerFlags f;
  f.leaseDurationSeconds = 10;
  f.renewDeadlineSeconds = 10;
  auto checked = checkFlags(f);
  ASSERT_FALSE(checked.ok());
  EXPECT_EQ(checked.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(checked.status().message(),
            "--renew-deadline 10s is not allowed (allowed: less than --lease-duration 10s)");
  f.renewDeadlineSeconds = 9;
  EXPECT_TRUE(checkFlags(f).ok());
}

TEST(CheckFlagsTest, MembersParsedAndNamedOnce) {
  ControllerFlags f;
  f.members = {"tokyo=kc-tokyo", "ohio=kc-ohio:config"};
  auto members = checkFlags(f);
  ASSERT_TRUE(members.ok()) << members.status().toString();
  ASSERT_EQ(members->size(), 2u);
  EXPECT_EQ(members->at("tokyo").secret, "kc-tokyo");
  EXPECT_EQ(members->at("tokyo").key, "kubeconfig");
  EXPECT_EQ(members->at("ohio").key, "config");
  f.members.push_back("tokyo=other");
  auto twice = checkFlags(f);
  ASSERT_FALSE(twice.ok());
  EXPECT_EQ(twice.status().message(), "--member tokyo is given twice");
  f.members = {"no-secret"};
  EXPECT_FALSE(checkFlags(f).ok());
}

}  // namespace
}  // namespace geo::controller
