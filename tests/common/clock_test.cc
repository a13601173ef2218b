#include "common/clock.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

namespace geo {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

TEST(FakeClockTest, StandsStillUntilAdvanced) {
  FakeClock clock;
  const auto start = clock.now();
  const auto wall = clock.wallNow();
  EXPECT_EQ(clock.now(), start);
  clock.advance(seconds(90));
  EXPECT_EQ(clock.now() - start, seconds(90));
  EXPECT_EQ(clock.wallNow() - wall, seconds(90));
  EXPECT_EQ(std::chrono::system_clock::to_time_t(FakeClock().wallNow()), 1704067200);
}

TEST(FakeClockTest, WaitUntilReturnsAtOnceWhenTheDeadlinePassed) {
  FakeClock clock;
  std::mutex mu;
  std::condition_variable cv;
  std::unique_lock lock(mu);
  clock.waitUntil(lock, cv, clock.now());  // would block forever if it waited
  EXPECT_TRUE(lock.owns_lock());
  EXPECT_EQ(clock.waiters(), 0u);
}

// A sleeper wakes only once the fake time reaches its deadline, however long
// it waits in real time.
TEST(FakeClockTest, SleepEndsOnlyWhenAdvancedPastTheDeadline) {
  FakeClock clock;
  std::atomic<bool> woke{false};
  std::thread sleeper([&] {
    clock.sleepFor(seconds(10));
    woke = true;
  });
  ASSERT_TRUE(clock.awaitWaiters(1));
  clock.advance(seconds(9));
  EXPECT_EQ(clock.waiters(), 1u);  // not woken: its deadline is ahead
  EXPECT_FALSE(woke);
  clock.advance(seconds(1));
  sleeper.join();
  EXPECT_TRUE(woke);
  EXPECT_EQ(clock.waiters(), 0u);
}

// advance() wakes the waiters it makes due (with the others on the same
// condition variable, which its notification wakes too) and leaves the rest
// asleep; nextDeadline() is the earliest deadline of those asleep.
TEST(FakeClockTest, AdvanceWakesOnlyTheWaitersItMakesDue) {
  FakeClock clock;
  const auto start = clock.now();
  EXPECT_EQ(clock.nextDeadline(), Clock::TimePoint::max());
  std::atomic<int> woke{0};
  std::thread early([&] {
    clock.sleepFor(seconds(1));
    ++woke;
  });
  std::thread late([&] {
    clock.sleepFor(seconds(5));
    ++woke;
  });
  ASSERT_TRUE(clock.awaitWaiters(2));
  EXPECT_EQ(clock.nextDeadline(), start + seconds(1));
  clock.advance(seconds(1));
  early.join();
  EXPECT_EQ(woke.load(), 1);
  EXPECT_EQ(clock.waiters(), 1u) << "the late sleeper was woken before its deadline";
  EXPECT_EQ(clock.nextDeadline(), start + seconds(5));
  clock.advance(seconds(4));
  late.join();
  EXPECT_EQ(woke.load(), 2);
  EXPECT_EQ(clock.nextDeadline(), Clock::TimePoint::max());
}

// A wait on the caller's condition variable ends on its notification too,
// before the deadline.
TEST(FakeClockTest, WaitUntilEndsOnNotify) {
  FakeClock clock;
  std::mutex mu;
  std::condition_variable cv;
  bool ready = false;
  std::thread waiter([&] {
    std::unique_lock lock(mu);
    while (!ready) clock.waitUntil(lock, cv, clock.now() + seconds(60));
  });
  ASSERT_TRUE(clock.awaitWaiters(1));
  {
    std::lock_guard lock(mu);
    ready = true;
  }
  cv.notify_all();
  waiter.join();
}

// A thread woken through the clock counts as running, not waiting, until it
// waits again: a test driving simulated time must not move the clock on
// before that thread has acted on what woke it.
TEST(FakeClockTest, AThreadNotifiedThroughTheClockIsNotCountedAsWaiting) {
  FakeClock clock;
  std::mutex mu;
  std::condition_variable cv;
  int wakes = 0;
  std::thread waiter([&] {
    std::unique_lock lock(mu);
    while (wakes < 2) {
      clock.waitUntil(lock, cv, clock.now() + seconds(60));
      ++wakes;
    }
  });
  ASSERT_TRUE(clock.awaitWaiters(1));
  {
    // Held, so the woken waiter cannot get past its wait yet.
    std::lock_guard lock(mu);
    clock.notifyAll(cv);
    EXPECT_EQ(clock.waiters(), 0u) << "a notified thread still counted as waiting";
  }
  ASSERT_TRUE(clock.awaitWaiters(1));  // it woke and waits again
  {
    // Under the mutex, as every notification must be: the waiter registers
    // with the clock before it waits on `cv`, and a notification between
    // the two would be lost.
    std::lock_guard lock(mu);
    clock.notifyAll(cv);
  }
  waiter.join();
  EXPECT_EQ(wakes, 2);
  EXPECT_EQ(clock.waiters(), 0u);
}

// Many waiters on one mutex and many advances: none misses its deadline
// (a lost wake-up would hang the join).
TEST(FakeClockTest, NoWakeUpIsLost) {
  FakeClock clock;
  std::mutex mu;
  std::condition_variable cv;
  const auto deadline = clock.now() + milliseconds(100);
  std::vector<std::thread> waiters;
  for (int i = 0; i < 8; ++i) {
    waiters.emplace_back([&] {
      std::unique_lock lock(mu);
      while (clock.now() < deadline) clock.waitUntil(lock, cv, deadline);
    });
  }
  for (int i = 0; i < 100; ++i) clock.advance(milliseconds(1));
  for (auto& t : waiters) t.join();
  EXPECT_EQ(clock.waiters(), 0u);
}

TEST(SystemClockTest, IsTheRealClock) {
  const auto before = std::chrono::steady_clock::now();
  const auto now = systemClock().now();
  EXPECT_GE(now, before);
  EXPECT_LE(now, std::chrono::steady_clock::now());
  const auto wall = systemClock().wallNow() - std::chrono::system_clock::now();
  EXPECT_LT(std::chrono::abs(wall), seconds(5));
  std::mutex mu;
  std::condition_variable cv;
  std::unique_lock lock(mu);
  systemClock().waitUntil(lock, cv, systemClock().now() + milliseconds(1));
  EXPECT_TRUE(lock.owns_lock());
}

}  // namespace
}  // namespace geo
