#pragma once
// CancelToken: stops the client's blocking work (a watch stream, a retry
// sleep, a leader-election loop) from another thread, promptly.
//
// Threading: every member is thread-safe. cancel() is idempotent and cannot
// be undone. Callbacks registered with onCancel run once, on the thread that
// calls cancel() (or at once if it already was), under the token's lock: they
// must be short and must not call back into the token (curl_multi_wakeup is
// what the HTTP layer registers). The token must outlive the calls using it.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>

#include "common/clock.h"

namespace geo::kube {

class CancelToken {
 public:
  CancelToken() = default;
  CancelToken(const CancelToken&) = delete;
  CancelToken& operator=(const CancelToken&) = delete;

  void cancel();
  bool cancelled() const { return cancelled_.load(std::memory_order_acquire); }

  // Sleeps for `duration`, measured on `clock` (common/clock.h), or until
  // cancel(); false when cancelled.
  bool sleepFor(std::chrono::nanoseconds duration, const Clock& clock = systemClock()) const;

  // RAII registration of a wake-up callback (see above).
  class Subscription {
   public:
    Subscription(const CancelToken& token, std::function<void()> callback);
    ~Subscription();
    Subscription(const Subscription&) = delete;
    Subscription& operator=(const Subscription&) = delete;

   private:
    const CancelToken& token_;
    uint64_t id_ = 0;
  };

 private:
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  std::atomic<bool> cancelled_{false};
  mutable std::map<uint64_t, std::function<void()>> callbacks_;
  mutable uint64_t nextId_ = 1;
};

}  // namespace geo::kube
