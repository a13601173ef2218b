#include "controller/reconcile/task_pool.h"

#include <atomic>
#include <exception>

namespace geo::reconcile {

struct TaskPool::Batch {
  size_t n = 0;
  const std::function<void(size_t)>* f = nullptr;
  std::atomic<size_t> next{0};  // the next index to claim
  std::mutex mu;
  std::condition_variable finished;
  size_t done = 0;  // guarded by mu
  std::exception_ptr error;
};

TaskPool::TaskPool(size_t threads) {
  for (size_t i = 0; i < threads; ++i) threads_.emplace_back([this] { work(); });
}

TaskPool::~TaskPool() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void TaskPool::drain(Batch& batch) {
  for (size_t i = batch.next.fetch_add(1); i < batch.n; i = batch.next.fetch_add(1)) {
    std::exception_ptr error;
    try {
      (*batch.f)(i);
    } catch (...) {
      error = std::current_exception();
    }
    std::lock_guard lock(batch.mu);
    if (error && !batch.error) batch.error = error;
    if (++batch.done == batch.n) batch.finished.notify_all();
  }
}

void TaskPool::work() {
  while (true) {
    std::shared_ptr<Batch> batch;
    {
      std::unique_lock lock(mu_);
      wake_.wait(lock, [&] { return stopping_ || !batches_.empty(); });
      if (batches_.empty()) return;  // stopping, nothing left
      batch = batches_.front();
      if (batch->next.load() >= batch->n) {  // every index claimed already
        batches_.pop_front();
        continue;
      }
    }
    drain(*batch);
    // Every index is claimed now: no other thread should pick it up.
    std::lock_guard lock(mu_);
    for (auto it = batches_.begin(); it != batches_.end(); ++it) {
      if (*it == batch) {
        batches_.erase(it);
        break;
      }
    }
  }
}

void TaskPool::parallelFor(size_t n, const std::function<void(size_t)>& f) {
  if (n == 0) return;
  auto batch = std::make_shared<Batch>();
  batch->n = n;
  batch->f = &f;
  if (n > 1 && !threads_.empty()) {
    {
      std::lock_guard lock(mu_);
      batches_.push_back(batch);
    }
    if (n == 2) {
      wake_.notify_one();
    } else {
      wake_.notify_all();
    }
  }
  drain(*batch);
  {
    std::unique_lock lock(batch->mu);
    batch->finished.wait(lock, [&] { return batch->done == batch->n; });
  }
  {
    // Drop it from the queue if no worker did (all claimed by the caller).
    std::lock_guard lock(mu_);
    for (auto it = batches_.begin(); it != batches_.end(); ++it) {
      if (*it == batch) {
        batches_.erase(it);
        break;
      }
    }
  }
  if (batch->error) std::rethrow_exception(batch->error);
}

}  // namespace geo::reconcile
