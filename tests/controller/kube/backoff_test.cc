#include "controller/kube/backoff.h"

#include "common/enforce.h"

#include <gtest/gtest.h>

#include "controller/kube/cancel.h"
#include "controller/kube/kube_time.h"

#include <chrono>
#include <thread>

namespace geo::kube {
namespace {

using std::chrono::milliseconds;

TEST(BackoffTest, GrowsWithinJitterBoundsAndCaps) {
  const BackoffPolicy policy{milliseconds(100), milliseconds(3000), 2.0, 0.5};
  for (uint64_t seed = 0; seed < 50; ++seed) {
    Backoff backoff(policy, seed);
    double base = 100;
    for (int attempt = 0; attempt < 12; ++attempt) {
      const auto delay = backoff.next();
      const double expected = std::min(base, 3000.0);
      EXPECT_LE(delay.count(), expected) << "attempt " << attempt;
      EXPECT_GE(delay.count(), expected * 0.5 - 1) << "attempt " << attempt;
      base *= 2;
    }
    EXPECT_EQ(backoff.attempts(), 12);
  }
}

TEST(BackoffTest, ResetStartsOver) {
  Backoff backoff({milliseconds(10), milliseconds(1000), 2.0, 0.0}, 1);
  EXPECT_EQ(backoff.next(), milliseconds(10));
  EXPECT_EQ(backoff.next(), milliseconds(20));
  EXPECT_EQ(backoff.next(), milliseconds(40));
  backoff.reset();
  EXPECT_EQ(backoff.next(), milliseconds(10));
}

TEST(BackoffTest, ManyFailuresStayAtTheCap) {
  Backoff backoff({milliseconds(1), milliseconds(500), 10.0, 0.0}, 1);
  for (int i = 0; i < 1000; ++i) (void)backoff.next();
  EXPECT_EQ(backoff.next(), milliseconds(500));
}

TEST(BackoffTest, JitterSpreadsDelays) {
  Backoff a({milliseconds(1000), milliseconds(1000), 2.0, 0.5}, 1);
  Backoff b({milliseconds(1000), milliseconds(1000), 2.0, 0.5}, 2);
  EXPECT_NE(a.next(), b.next());
}

TEST(BackoffTest, RejectsBadPolicies) {
  EXPECT_THROW(Backoff({milliseconds(10), milliseconds(5), 2.0, 0.5}), Error);
  EXPECT_THROW(Backoff({milliseconds(10), milliseconds(50), 0.5, 0.5}), Error);
  EXPECT_THROW(Backoff({milliseconds(10), milliseconds(50), 2.0, 1.5}), Error);
}

TEST(CancelTokenTest, CancelWakesSleepersAndRunsCallbacksOnce) {
  CancelToken token;
  int calls = 0;
  {
    CancelToken::Subscription subscription(token, [&] { ++calls; });
    std::thread canceller([&] {
      std::this_thread::sleep_for(milliseconds(20));
      token.cancel();
    });
    const auto start = std::chrono::steady_clock::now();
    EXPECT_FALSE(token.sleepFor(std::chrono::seconds(30)));
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
    canceller.join();
    token.cancel();
  }
  EXPECT_EQ(calls, 1);
  // Subscribing to a cancelled token calls back at once.
  CancelToken::Subscription late(token, [&] { ++calls; });
  EXPECT_EQ(calls, 2);
  EXPECT_TRUE(token.cancelled());
}

TEST(CancelTokenTest, SleepRunsItsCourseWithoutCancel) {
  CancelToken token;
  EXPECT_TRUE(token.sleepFor(milliseconds(5)));
}

TEST(KubeTimeTest, FormatsAndParses) {
  using namespace std::chrono;
  const system_clock::time_point time =
      sys_days(year(2024) / 5 / 1) + hours(10) + minutes(2) + seconds(3) + microseconds(45);
  EXPECT_EQ(formatTime(time), "2024-05-01T10:02:03Z");
  EXPECT_EQ(formatMicroTime(time), "2024-05-01T10:02:03.000045Z");
  EXPECT_EQ(parseTime("2024-05-01T10:02:03.000045Z"), time);
  EXPECT_EQ(parseTime("2024-05-01T12:02:03.000045+02:00"), time);
  EXPECT_EQ(parseTime("2024-05-01T10:02:03Z"), time - microseconds(45));
  EXPECT_FALSE(parseTime("2024-05-01 10:02:03Z"));
  EXPECT_FALSE(parseTime("2024-13-01T10:02:03Z"));
  EXPECT_FALSE(parseTime("2024-05-01T10:02:03"));
  EXPECT_FALSE(parseTime("2024-05-01T10:02:03.Z"));
}

}  // namespace
}  // namespace geo::kube
