#include "controller/kube/workqueue.h"

#include <algorithm>
#include <cmath>

#include "common/enforce.h"

namespace geo::kube {

ItemExponentialRateLimiter::ItemExponentialRateLimiter(std::chrono::milliseconds base,
                                                       std::chrono::milliseconds max)
    : base_(base), max_(max) {
  GEO_ENFORCE(base.count() > 0 && max >= base, "rate limiter needs 0 < base <= max");
}

std::chrono::milliseconds ItemExponentialRateLimiter::when(const std::string& key) {
  std::lock_guard lock(mu_);
  const int failures = failures_[key]++;
  // In double so that many failures cannot overflow before the cap.
  const double delay = static_cast<double>(base_.count()) * std::pow(2.0, std::min(failures, 62));
  return std::chrono::milliseconds(
      static_cast<int64_t>(std::min(delay, static_cast<double>(max_.count()))));
}

void ItemExponentialRateLimiter::forget(const std::string& key) {
  std::lock_guard lock(mu_);
  failures_.erase(key);
}

int ItemExponentialRateLimiter::numRequeues(const std::string& key) const {
  std::lock_guard lock(mu_);
  const auto it = failures_.find(key);
  return it == failures_.end() ? 0 : it->second;
}

WorkQueue::WorkQueue(std::chrono::milliseconds baseDelay, std::chrono::milliseconds maxDelay,
                     const Clock& clock)
    : limiter_(baseDelay, maxDelay), clock_(clock) {}

void WorkQueue::addLocked(const std::string& key) {
  if (shuttingDown_ || dirty_.contains(key)) return;
  dirty_.insert(key);
  if (processing_.contains(key)) return;  // done() queues it
  queue_.push_back(key);
  cv_.notify_one();
}

void WorkQueue::add(const std::string& key) {
  std::lock_guard lock(mu_);
  addLocked(key);
}

void WorkQueue::addAfter(const std::string& key, std::chrono::milliseconds delay) {
  std::lock_guard lock(mu_);
  if (shuttingDown_) return;
  if (delay.count() <= 0) {
    addLocked(key);
    return;
  }
  const auto at = clock_.now() + delay;
  if (const auto it = waitingSince_.find(key); it != waitingSince_.end()) {
    if (it->second <= at) return;
    const auto [first, last] = waiting_.equal_range(it->second);
    for (auto entry = first; entry != last; ++entry) {
      if (entry->second == key) {
        waiting_.erase(entry);
        break;
      }
    }
  }
  waiting_.emplace(at, key);
  waitingSince_[key] = at;
  // A waiting worker may be sleeping until a later deadline.
  cv_.notify_all();
}

void WorkQueue::addRateLimited(const std::string& key) {
  addAfter(key, limiter_.when(key));
}

void WorkQueue::forget(const std::string& key) {
  limiter_.forget(key);
}

int WorkQueue::numRequeues(const std::string& key) const {
  return limiter_.numRequeues(key);
}

void WorkQueue::promoteDueLocked(TimePoint now) {
  while (!waiting_.empty() && waiting_.begin()->first <= now) {
    const std::string key = std::move(waiting_.begin()->second);
    waiting_.erase(waiting_.begin());
    waitingSince_.erase(key);
    addLocked(key);
  }
}

std::optional<std::string> WorkQueue::get() {
  std::unique_lock lock(mu_);
  while (true) {
    promoteDueLocked(clock_.now());
    if (!queue_.empty()) break;
    if (shuttingDown_) return std::nullopt;
    if (waiting_.empty()) {
      cv_.wait(lock);
    } else {
      clock_.waitUntil(lock, cv_, waiting_.begin()->first);
    }
  }
  std::string key = std::move(queue_.front());
  queue_.pop_front();
  processing_.insert(key);
  dirty_.erase(key);
  return key;
}

void WorkQueue::done(const std::string& key) {
  std::lock_guard lock(mu_);
  processing_.erase(key);
  if (dirty_.contains(key)) {
    queue_.push_back(key);
    cv_.notify_one();
  }
}

void WorkQueue::shutdown() {
  std::lock_guard lock(mu_);
  shuttingDown_ = true;
  waiting_.clear();
  waitingSince_.clear();
  cv_.notify_all();
}

bool WorkQueue::shuttingDown() const {
  std::lock_guard lock(mu_);
  return shuttingDown_;
}

size_t WorkQueue::length() const {
  std::lock_guard lock(mu_);
  return queue_.size();
}

}  // namespace geo::kube
