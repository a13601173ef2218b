#pragma once
// TaskPool: a few long-lived threads for the reconciler's per-region work, so
// a pass does not create and destroy a thread for every region and step
// (which showed in the controller's profile as kernel time and as malloc
// arenas, one per short-lived thread).
//
// parallelFor(n, f) runs f(0) .. f(n-1), each exactly once, on the pool's
// threads and on the calling thread, and returns when all have ended. The
// caller takes part in its own batch, so a task may call parallelFor again
// (nesting) without deadlock, and a pool of 0 threads runs everything on the
// caller. An exception from a task is rethrown to the caller once the batch
// has ended (the first one, if several). Thread-safe.

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace geo::reconcile {

class TaskPool {
 public:
  explicit TaskPool(size_t threads);
  ~TaskPool();
  TaskPool(const TaskPool&) = delete;
  TaskPool& operator=(const TaskPool&) = delete;

  void parallelFor(size_t n, const std::function<void(size_t)>& f);

 private:
  struct Batch;
  // Runs indices of `batch` until none is left.
  static void drain(Batch& batch);
  void work();

  std::mutex mu_;
  std::condition_variable wake_;
  std::deque<std::shared_ptr<Batch>> batches_;  // with indices left to claim
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace geo::reconcile
