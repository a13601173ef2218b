#include "controller/kube/cancel.h"

namespace geo::kube {

void CancelToken::cancel() {
  std::lock_guard lock(mu_);
  if (cancelled_.exchange(true, std::memory_order_acq_rel)) return;
  for (auto& [id, callback] : callbacks_) callback();
  cv_.notify_all();
}

bool CancelToken::sleepFor(std::chrono::nanoseconds duration, const Clock& clock) const {
  std::unique_lock lock(mu_);
  const Clock::TimePoint deadline =
      clock.now() + std::chrono::duration_cast<Clock::Duration>(duration);
  while (!cancelled()) {
    if (clock.now() >= deadline) return true;
    clock.waitUntil(lock, cv_, deadline);
  }
  return false;
}

CancelToken::Subscription::Subscription(const CancelToken& token, std::function<void()> callback)
    : token_(token) {
  std::lock_guard lock(token_.mu_);
  if (token_.cancelled()) {
    callback();
    return;
  }
  id_ = token_.nextId_++;
  token_.callbacks_.emplace(id_, std::move(callback));
}

CancelToken::Subscription::~Subscription() {
  if (id_ == 0) return;
  std::lock_guard lock(token_.mu_);
  token_.callbacks_.erase(id_);
}

}  // namespace geo::kube
