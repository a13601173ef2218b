#include "controller/kube/controller.h"

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

namespace geo::kube {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

// Waits (in real time, bounded) for another thread to get somewhere; the
// fake clock decides every delay, this only waits for the thread to run.
template <typename Pred>
bool eventually(Pred pred) {
  const auto limit = std::chrono::steady_clock::now() + seconds(10);
  while (!pred()) {
    if (std::chrono::steady_clock::now() > limit) return false;
    std::this_thread::yield();
  }
  return true;
}

// The passes a controller made, by key, and how each ended.
struct Record {
  std::mutex mu;
  std::vector<std::string> keys;
  std::vector<PassOutcome> outcomes;
  std::vector<Clock::Duration> took;

  Controller::PassFn onPass() {
    return [this](const std::string& key, PassOutcome outcome, Clock::Duration d) {
      std::lock_guard lock(mu);
      keys.push_back(key);
      outcomes.push_back(outcome);
      took.push_back(d);
    };
  }
  size_t passes() {
    std::lock_guard lock(mu);
    return outcomes.size();
  }
};

ControllerOptions oneWorker() {
  ControllerOptions options;
  options.workers = 1;
  options.baseDelay = milliseconds(100);
  options.maxDelay = seconds(10);
  return options;
}

TEST(ControllerTest, RejectsNoWorkersAndNoReconcile) {
  ControllerOptions none = oneWorker();
  none.workers = 0;
  EXPECT_THROW(Controller(none, [](const std::string&) { return Requeue{}; }), Error);
  EXPECT_THROW(Controller(oneWorker(), nullptr), Error);
}

// An error puts the key back after the backoff (base, then twice that), and
// a success forgets the failures.
TEST(ControllerTest, ErrorRequeuesWithBackoffAndSuccessForgets) {
  FakeClock clock;
  Record record;
  std::atomic<int> calls{0};
  Controller controller(
      oneWorker(),
      [&](const std::string&) -> StatusOr<Requeue> {
        if (++calls <= 2) return unavailable("the hub did not answer");
        return Requeue{};
      },
      record.onPass(), clock);
  controller.queue().add("ns/a");
  controller.start();
  ASSERT_TRUE(clock.awaitWaiters(1));  // the failed key waits for its backoff
  EXPECT_EQ(record.passes(), 1u);
  EXPECT_EQ(controller.queue().numRequeues("ns/a"), 1);
  clock.advance(milliseconds(99));
  ASSERT_TRUE(clock.awaitWaiters(1));
  EXPECT_EQ(record.passes(), 1u);
  clock.advance(milliseconds(1));
  ASSERT_TRUE(eventually([&] { return record.passes() == 2; }));
  // The second failure waits 200 ms.
  ASSERT_TRUE(clock.awaitWaiters(1));
  clock.advance(milliseconds(199));
  ASSERT_TRUE(clock.awaitWaiters(1));
  EXPECT_EQ(record.passes(), 2u);
  clock.advance(milliseconds(1));
  ASSERT_TRUE(eventually([&] { return record.passes() == 3; }));
  ASSERT_TRUE(eventually([&] { return controller.queue().numRequeues("ns/a") == 0; }));
  controller.shutdown();
  EXPECT_EQ(record.outcomes, (std::vector<PassOutcome>{PassOutcome::kError, PassOutcome::kError,
                                                       PassOutcome::kSuccess}));
  EXPECT_EQ(calls, 3);  // nothing more after the success
}

TEST(ControllerTest, RetryBacksOffLikeAnError) {
  FakeClock clock;
  Record record;
  std::atomic<int> calls{0};
  Controller controller(
      oneWorker(),
      [&](const std::string&) -> StatusOr<Requeue> {
        return Requeue{.retry = ++calls == 1, .after = std::nullopt};
      },
      record.onPass(), clock);
  controller.queue().add("ns/a");
  controller.start();
  ASSERT_TRUE(clock.awaitWaiters(1));
  clock.advance(milliseconds(99));
  ASSERT_TRUE(clock.awaitWaiters(1));
  EXPECT_EQ(record.passes(), 1u);
  clock.advance(milliseconds(1));
  ASSERT_TRUE(eventually([&] { return record.passes() == 2; }));
  controller.shutdown();
  EXPECT_EQ(record.outcomes,
            (std::vector<PassOutcome>{PassOutcome::kRetry, PassOutcome::kSuccess}));
}

// Requeue::after brings the key back that long after, not before, and
// without counting a failure.
TEST(ControllerTest, RequeueAfterComesBackThen) {
  FakeClock clock;
  Record record;
  std::atomic<int> calls{0};
  Controller controller(
      oneWorker(),
      [&](const std::string&) -> StatusOr<Requeue> {
        if (++calls == 1) return Requeue{.retry = false, .after = seconds(30)};
        return Requeue{};
      },
      record.onPass(), clock);
  controller.queue().add("ns/a");
  controller.start();
  ASSERT_TRUE(clock.awaitWaiters(1));
  EXPECT_EQ(controller.queue().numRequeues("ns/a"), 0);
  clock.advance(seconds(29));
  ASSERT_TRUE(clock.awaitWaiters(1));
  EXPECT_EQ(record.passes(), 1u);
  clock.advance(seconds(1));
  ASSERT_TRUE(eventually([&] { return record.passes() == 2; }));
  controller.shutdown();
  EXPECT_EQ(record.outcomes,
            (std::vector<PassOutcome>{PassOutcome::kRequeue, PassOutcome::kSuccess}));
}

TEST(ControllerTest, ReportsHowLongAPassTookOnItsClock) {
  FakeClock clock;
  Record record;
  Controller controller(
      oneWorker(),
      [&](const std::string&) -> StatusOr<Requeue> {
        clock.advance(milliseconds(1500));  // a slow region
        return Requeue{};
      },
      record.onPass(), clock);
  controller.queue().add("ns/a");
  controller.start();
  ASSERT_TRUE(eventually([&] { return record.passes() == 1; }));
  controller.shutdown();
  EXPECT_EQ(record.keys, std::vector<std::string>{"ns/a"});
  EXPECT_EQ(record.took, std::vector<Clock::Duration>{milliseconds(1500)});
}

// shutdown(): the pass in progress ends, keys already queued are still
// reconciled, delayed ones are dropped, later adds ignored.
TEST(ControllerTest, ShutdownDrainsQueuedKeys) {
  FakeClock clock;
  Record record;
  std::mutex mu;
  std::condition_variable cv;
  bool release = false;
  std::atomic<bool> inFirst{false};
  Controller controller(
      oneWorker(),
      [&](const std::string& key) -> StatusOr<Requeue> {
        if (key == "ns/a") {
          inFirst = true;
          std::unique_lock lock(mu);
          cv.wait(lock, [&] { return release; });
        }
        return Requeue{};
      },
      record.onPass(), clock);
  controller.queue().add("ns/a");
  controller.queue().add("ns/b");
  controller.queue().add("ns/c");
  controller.queue().addAfter("ns/later", seconds(1));
  controller.start();
  ASSERT_TRUE(eventually([&] { return inFirst.load(); }));
  std::thread stopper([&] { controller.shutdown(); });
  ASSERT_TRUE(eventually([&] { return controller.queue().shuttingDown(); }));
  controller.queue().add("ns/too-late");
  {
    std::lock_guard lock(mu);
    release = true;
  }
  cv.notify_all();
  stopper.join();
  clock.advance(seconds(5));
  EXPECT_EQ(record.keys, (std::vector<std::string>{"ns/a", "ns/b", "ns/c"}));
}

// Many workers and many adds of few keys: no key is ever in two passes at
// once, and every key is reconciled.
TEST(ControllerTest, ConcurrentWorkersNeverShareAKey) {
  constexpr int kKeys = 8;
  std::mutex mu;
  std::set<std::string> active;
  std::map<std::string, int> passes;
  std::atomic<bool> overlap{false};
  ControllerOptions options;
  options.workers = 4;
  Controller controller(options, [&](const std::string& key) -> StatusOr<Requeue> {
    {
      std::lock_guard lock(mu);
      if (!active.insert(key).second) overlap = true;
    }
    for (int i = 0; i < 50; ++i) std::this_thread::yield();
    std::lock_guard lock(mu);
    active.erase(key);
    ++passes[key];
    return Requeue{};
  });
  controller.start();
  std::vector<std::thread> producers;
  for (int p = 0; p < 4; ++p) {
    producers.emplace_back([&, p] {
      for (int i = 0; i < 2000; ++i)
        controller.queue().add("ns/" + std::to_string((i + p) % kKeys));
    });
  }
  for (auto& t : producers) t.join();
  controller.shutdown();  // drains what the producers left
  EXPECT_FALSE(overlap);
  EXPECT_EQ(passes.size(), static_cast<size_t>(kKeys));
}

TEST(PassOutcomeTest, Names) {
  EXPECT_EQ(passOutcomeName(PassOutcome::kSuccess), "success");
  EXPECT_EQ(passOutcomeName(PassOutcome::kRequeue), "requeue");
  EXPECT_EQ(passOutcomeName(PassOutcome::kRetry), "retry");
  EXPECT_EQ(passOutcomeName(PassOutcome::kError), "error");
}

}  // namespace
}  // namespace geo::kube
