#include "controller/reconcile/task_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

namespace geo::reconcile {
namespace {

TEST(TaskPool, RunsEveryIndexOnceOnSeveralThreads) {
  for (size_t threads : {0u, 1u, 4u}) {
    TaskPool pool(threads);
    for (size_t n : {0u, 1u, 2u, 3u, 17u, 200u}) {
      std::vector<std::atomic<int>> runs(n);
      pool.parallelFor(n, [&](size_t i) { runs[i]++; });
      for (size_t i = 0; i < n; ++i)
        EXPECT_EQ(runs[i].load(), 1) << threads << " " << n << " " << i;
    }
  }
  // Tasks that wait for each other need the pool's threads: 4 tasks of a
  // batch on 3 workers and the caller all run at the same time.
  TaskPool pool(3);
  std::atomic<int> arrived{0};
  std::set<std::thread::id> ids;
  std::mutex mu;
  pool.parallelFor(4, [&](size_t) {
    ++arrived;
    while (arrived.load() < 4) std::this_thread::yield();
    std::lock_guard lock(mu);
    ids.insert(std::this_thread::get_id());
  });
  EXPECT_EQ(ids.size(), 4u);
}

TEST(TaskPool, NestedBatchesDoNotDeadlockAndErrorsReachTheCaller) {
  TaskPool pool(2);
  std::atomic<int> inner{0};
  // More nested batches than threads: every caller works on its own batch.
  pool.parallelFor(6, [&](size_t) { pool.parallelFor(5, [&](size_t) { ++inner; }); });
  EXPECT_EQ(inner.load(), 30);

  std::atomic<int> ran{0};
  EXPECT_THROW(pool.parallelFor(8,
                                [&](size_t i) {
                                  ++ran;
                                  if (i == 3) throw std::runtime_error("region 3");
                                }),
               std::runtime_error);
  EXPECT_EQ(ran.load(), 8);                     // the others still ran
  pool.parallelFor(3, [&](size_t) { ++ran; });  // and the pool still works
  EXPECT_EQ(ran.load(), 11);
}

}  // namespace
}  // namespace geo::reconcile
