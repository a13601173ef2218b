#include "controller/kube/workqueue.h"

#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <set>
#include <thread>
#include <vector>

namespace geo::kube {
namespace {

using std::chrono::milliseconds;

TEST(WorkQueueTest, AddDeduplicatesWaitingKeys) {
  WorkQueue queue;
  queue.add("a");
  queue.add("b");
  queue.add("a");
  EXPECT_EQ(queue.length(), 2u);
  EXPECT_EQ(queue.get(), "a");
  EXPECT_EQ(queue.get(), "b");
  EXPECT_EQ(queue.length(), 0u);
}

TEST(WorkQueueTest, KeyReAddedWhileProcessingComesBackAfterDone) {
  WorkQueue queue;
  queue.add("a");
  const auto key = queue.get();
  ASSERT_EQ(key, "a");
  queue.add("a");
  queue.add("a");
  EXPECT_EQ(queue.length(), 0u);  // not handed to a second worker meanwhile
  queue.done("a");
  EXPECT_EQ(queue.length(), 1u);
  EXPECT_EQ(queue.get(), "a");
  queue.done("a");
  EXPECT_EQ(queue.length(), 0u);
}

TEST(WorkQueueTest, ShutdownDrainsThenEnds) {
  WorkQueue queue;
  queue.add("a");
  queue.addAfter("later", milliseconds(10));
  queue.shutdown();
  EXPECT_TRUE(queue.shuttingDown());
  queue.add("b");  // ignored
  EXPECT_EQ(queue.get(), "a");
  EXPECT_EQ(queue.get(), std::nullopt);
}

TEST(WorkQueueTest, ShutdownWakesBlockedWorkers) {
  WorkQueue queue;
  std::atomic<int> ended{0};
  std::vector<std::thread> workers;
  for (int i = 0; i < 3; ++i) {
    workers.emplace_back([&] {
      if (!queue.get()) ++ended;
    });
  }
  std::this_thread::sleep_for(milliseconds(20));
  queue.shutdown();
  for (auto& worker : workers) worker.join();
  EXPECT_EQ(ended, 3);
}

TEST(WorkQueueTest, AddAfterWaitsAndKeepsTheEarlierTime) {
  FakeClock clock;
  WorkQueue queue(milliseconds(5), milliseconds(1000), clock);
  queue.addAfter("slow", milliseconds(5000));
  queue.addAfter("slow", milliseconds(30));  // earlier wins
  queue.addAfter("slow", milliseconds(4000));
  EXPECT_EQ(queue.length(), 0u);
  std::optional<std::string> got;
  std::thread worker([&] { got = queue.get(); });
  ASSERT_TRUE(clock.awaitWaiters(1));
  clock.advance(milliseconds(29));
  ASSERT_TRUE(clock.awaitWaiters(1));  // still waiting at 29 ms
  EXPECT_EQ(queue.length(), 0u);
  clock.advance(milliseconds(1));
  worker.join();
  EXPECT_EQ(got, "slow");
  queue.done("slow");
  // Zero delay is a plain add.
  queue.addAfter("now", milliseconds(0));
  EXPECT_EQ(queue.length(), 1u);
}

TEST(WorkQueueTest, DelayedKeyWakesAWorkerAlreadyWaiting) {
  FakeClock clock;
  WorkQueue queue(milliseconds(5), milliseconds(1000), clock);
  queue.addAfter("far", milliseconds(60000));
  std::optional<std::string> got;
  std::thread worker([&] { got = queue.get(); });
  ASSERT_TRUE(clock.awaitWaiters(1));  // sleeping until the far key is due
  queue.addAfter("x", milliseconds(20));
  clock.advance(milliseconds(20));
  worker.join();
  EXPECT_EQ(got, "x");
}

TEST(RateLimiterTest, ExponentialPerKeyUntilForget) {
  ItemExponentialRateLimiter limiter(milliseconds(5), milliseconds(100));
  EXPECT_EQ(limiter.when("a"), milliseconds(5));
  EXPECT_EQ(limiter.when("a"), milliseconds(10));
  EXPECT_EQ(limiter.when("a"), milliseconds(20));
  EXPECT_EQ(limiter.when("b"), milliseconds(5));  // keys are independent
  EXPECT_EQ(limiter.when("a"), milliseconds(40));
  EXPECT_EQ(limiter.when("a"), milliseconds(80));
  EXPECT_EQ(limiter.when("a"), milliseconds(100));  // capped
  for (int i = 0; i < 100; ++i) (void)limiter.when("a");
  EXPECT_EQ(limiter.when("a"), milliseconds(100));
  EXPECT_EQ(limiter.numRequeues("b"), 1);
  limiter.forget("a");
  EXPECT_EQ(limiter.numRequeues("a"), 0);
  EXPECT_EQ(limiter.when("a"), milliseconds(5));
}

TEST(WorkQueueTest, AddRateLimitedBacksOff) {
  FakeClock clock;
  WorkQueue queue(milliseconds(10), milliseconds(1000), clock);
  queue.addRateLimited("a");
  queue.addRateLimited("a");  // still waiting at 10 ms: keeps the earlier time
  EXPECT_EQ(queue.numRequeues("a"), 2);
  clock.advance(milliseconds(10));
  EXPECT_EQ(queue.get(), "a");  // due: no wait
  queue.done("a");
  // The third failure waits 10 * 2^2 ms.
  queue.addRateLimited("a");
  clock.advance(milliseconds(39));
  std::optional<std::string> got;
  std::thread worker([&] { got = queue.get(); });
  ASSERT_TRUE(clock.awaitWaiters(1));
  EXPECT_FALSE(got);
  clock.advance(milliseconds(1));
  worker.join();
  EXPECT_EQ(got, "a");
  queue.done("a");
  queue.forget("a");
  EXPECT_EQ(queue.numRequeues("a"), 0);
}

// Many producers and workers: every key added is processed at least once
// after its last add, and no key is ever processed by two workers at once.
TEST(WorkQueueTest, ConcurrentProducersAndWorkers) {
  WorkQueue queue(milliseconds(1), milliseconds(4));
  constexpr int kKeys = 50;
  constexpr int kProducers = 4;
  constexpr int kAddsPerProducer = 2000;
  std::mutex mu;
  std::set<std::string> active;
  std::map<std::string, int> processed;
  std::atomic<bool> overlap{false};
  std::vector<std::thread> workers;
  for (int w = 0; w < 4; ++w) {
    workers.emplace_back([&] {
      while (auto key = queue.get()) {
        {
          std::lock_guard lock(mu);
          if (!active.insert(*key).second) overlap = true;
        }
        std::this_thread::yield();
        bool fail = false;  // every 7th run of a key fails and backs off
        {
          std::lock_guard lock(mu);
          active.erase(*key);
          fail = ++processed[*key] % 7 == 0;
        }
        if (fail) {
          queue.addRateLimited(*key);
        } else {
          queue.forget(*key);
        }
        queue.done(*key);
      }
    });
  }
  std::vector<std::thread> producers;
  for (int p = 0; p < kProducers; ++p) {
    producers.emplace_back([&, p] {
      for (int i = 0; i < kAddsPerProducer; ++i)
        queue.add("key-" + std::to_string((i + p) % kKeys));
    });
  }
  for (auto& producer : producers) producer.join();
  // Let delayed keys drain, then stop.
  while (true) {
    std::this_thread::sleep_for(milliseconds(20));
    std::lock_guard lock(mu);
    if (queue.length() == 0 && active.empty()) break;
  }
  std::this_thread::sleep_for(milliseconds(20));
  queue.shutdown();
  for (auto& worker : workers) worker.join();
  EXPECT_FALSE(overlap);
  EXPECT_EQ(processed.size(), static_cast<size_t>(kKeys));
  int total = 0;
  for (const auto& [key, count] : processed) total += count;
  // Deduplication: far fewer runs than adds.
  EXPECT_LT(total, kProducers * kAddsPerProducer);
}

}  // namespace
}  // namespace geo::kube
