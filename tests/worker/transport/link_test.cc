#include "worker/transport/link.h"

#include <gtest/gtest.h>

namespace geo::transport {
namespace {

using std::chrono::microseconds;
using std::chrono::milliseconds;

TEST(LinkProfile, ParsesAllKeysAndUnits) {
  auto p = parseLinkProfile("delay=50ms,rate=20mbit,burst=128kb");
  ASSERT_TRUE(p.ok()) << p.status().toString();
  EXPECT_EQ(p->oneWayDelay, microseconds(50000));
  EXPECT_DOUBLE_EQ(p->bytesPerSecond, 2.5e6);
  EXPECT_EQ(p->burstBytes, 128u * 1024);
  EXPECT_TRUE(p->shaped());

  auto q = parseLinkProfile("rate=1.5gbit,delay=250us");
  ASSERT_TRUE(q.ok());
  EXPECT_DOUBLE_EQ(q->bytesPerSecond, 1.5e9 / 8);
  EXPECT_EQ(q->oneWayDelay, microseconds(250));

  auto none = parseLinkProfile("");
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->shaped());
}

TEST(LinkProfile, ErrorsNameTheKeyAndAllowedForms) {
  const std::pair<const char*, const char*> cases[] = {
      {"delay=50", "delay='50' is not valid: expected a number with unit us, ms or s"},
      {"rate=20mbps", "rate='20mbps' is not valid"},
      {"burst=-1kb", "burst='-1kb' is not valid"},
      {"jitter=5ms", "unknown key 'jitter' (allowed: delay, rate, burst)"},
      {"delay", "'delay' is not key=value"},
  };
  for (const auto& [spec, expected] : cases) {
    auto p = parseLinkProfile(spec);
    ASSERT_FALSE(p.ok()) << spec;
    EXPECT_NE(p.status().message().find(expected), std::string::npos) << p.status().message();
  }
}

TEST(LinkShaper, UnshapedLinkReleasesAtOnce) {
  LinkShaper s(LinkProfile{});
  const auto t0 = SteadyClock::now();
  EXPECT_EQ(s.schedule(1 << 20, t0), t0);
}

TEST(LinkShaper, DelayIsAddedToEveryMessage) {
  LinkShaper s(LinkProfile{milliseconds(40), 0, 0});
  const auto t0 = SteadyClock::now();
  EXPECT_EQ(s.schedule(100, t0), t0 + milliseconds(40));
  EXPECT_EQ(s.schedule(100, t0 + milliseconds(1)), t0 + milliseconds(41));
}

TEST(LinkShaper, BandwidthSerializesBackToBackMessagesAfterTheBurst) {
  // 1 MB/s, 1000-byte burst: 10 messages of 1000 bytes sent at once leave at
  // 0 (burst credit), 1, 2, ... 9 ms, then arrive 5 ms later.
  LinkShaper s(LinkProfile{milliseconds(5), 1e6, 1000});
  const auto t0 = SteadyClock::now();
  s.schedule(0, t0 - std::chrono::seconds(10));  // long idle: credit capped at the burst
  for (int i = 0; i < 10; ++i) {
    const auto arrival = s.schedule(1000, t0);
    const double ms = std::chrono::duration<double, std::milli>(arrival - t0).count();
    EXPECT_NEAR(ms, 5.0 + i, 1e-3) << i;
  }
}

TEST(LinkShaper, IdleTimeDoesNotBankMoreThanTheBurst) {
  LinkShaper s(LinkProfile{milliseconds(0), 1e6, 2000});
  const auto t0 = SteadyClock::now();
  s.schedule(1000, t0);
  // After an hour idle, only 2000 bytes go without waiting.
  const auto later = t0 + std::chrono::hours(1);
  EXPECT_EQ(s.schedule(2000, later), later);
  const double ms =
      std::chrono::duration<double, std::milli>(s.schedule(1000, later) - later).count();
  EXPECT_NEAR(ms, 1.0, 1e-3);
}

}  // namespace
}  // namespace geo::transport
