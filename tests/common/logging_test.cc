#include "common/logging.h"

#include <gtest/gtest.h>

namespace geo {
namespace {

TEST(Logging, AcceptsKnownLevels) {
  for (const char* level : {"trace", "debug", "info", "warn", "error", "critical", "off"}) {
    EXPECT_TRUE(initLogging(level).ok()) << level;
  }
  EXPECT_TRUE(initLogging("debug").ok());
  EXPECT_EQ(logger()->level(), spdlog::level::debug);
  EXPECT_EQ(spdlog::default_logger()->name(), "geo");
}

TEST(Logging, RejectsUnknownLevelNamingTheAllowedOnes) {
  Status s = initLogging("verbose");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("'verbose'"), std::string::npos);
  EXPECT_NE(s.message().find("trace, debug, info"), std::string::npos);
}

}  // namespace
}  // namespace geo
