#include "common/logging.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

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

TEST(Logging, JsonFormatWritesOneParsableObjectPerLine) {
  ASSERT_TRUE(initLogging("info").ok());
  ASSERT_TRUE(setLogFormat("json").ok());
  ::testing::internal::CaptureStderr();
  logger()->warn("region \"tokyo\": a\\b\nnext\tline \x01 ünïcode");
  logger()->flush();
  const std::string out = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(setLogFormat("text").ok());
  ASSERT_FALSE(out.empty());
  EXPECT_EQ(out.find('\n'), out.size() - 1) << out;  // one line
  const nlohmann::json line = nlohmann::json::parse(out);
  EXPECT_EQ(line["level"], "warning");
  EXPECT_EQ(line["msg"], "region \"tokyo\": a\\b\nnext\tline \x01 ünïcode");
  const std::string time = line["time"];
  EXPECT_EQ(time.size(), 24u) << time;  // 2026-11-23T12:00:00.000Z
  EXPECT_EQ(time.back(), 'Z');
}

TEST(Logging, RejectsUnknownFormat) {
  const Status s = setLogFormat("yaml");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("allowed values are text, json"), std::string::npos);
}

}  // namespace
}  // namespace geo
