#include "common/clock.h"

#include <algorithm>
#include <thread>

#include "common/enforce.h"

namespace geo {

namespace {

class SystemClock final : public Clock {
 public:
  TimePoint now() const override { return std::chrono::steady_clock::now(); }
  WallTime wallNow() const override { return std::chrono::system_clock::now(); }
  void waitUntil(std::unique_lock<std::mutex>& lock, std::condition_variable& cv,
                 TimePoint deadline) const override {
    cv.wait_until(lock, deadline);
  }
};

// The fake clock's monotonic time starts here rather than at the epoch, so
// that code subtracting a delay from now() stays positive.
constexpr auto kFakeStart = std::chrono::hours(24);

}  // namespace

void Clock::sleepUntil(TimePoint deadline) const {
  std::mutex mu;
  std::condition_variable cv;  // nobody notifies it: only the clock ends the wait
  std::unique_lock lock(mu);
  while (now() < deadline) waitUntil(lock, cv, deadline);
}

Clock& systemClock() {
  static SystemClock* const clock = new SystemClock();  // never destroyed: used until exit
  return *clock;
}

FakeClock::FakeClock(WallTime wallStart) : wallStart_(wallStart) {}

Clock::TimePoint FakeClock::now() const {
  std::lock_guard lock(mu_);
  return TimePoint(kFakeStart + elapsed_);
}

Clock::WallTime FakeClock::wallNow() const {
  std::lock_guard lock(mu_);
  return wallStart_ + std::chrono::duration_cast<WallTime::duration>(elapsed_);
}

void FakeClock::waitUntil(std::unique_lock<std::mutex>& lock, std::condition_variable& cv,
                          TimePoint deadline) const {
  uint64_t id = 0;
  {
    std::lock_guard guard(mu_);
    if (TimePoint(kFakeStart + elapsed_) >= deadline) return;
    id = nextWaiter_++;
    // Registered while the caller's mutex is held, which cv.wait() releases
    // only once this thread waits: advance() takes that mutex before it
    // notifies, so its wake-up cannot fall between the two and be lost.
    waiters_.emplace(id, Waiter{lock.mutex(), &cv, deadline, generation_});
    waitersChanged_.notify_all();
  }
  cv.wait(lock);
  std::lock_guard guard(mu_);
  waiters_.erase(id);
  waitersChanged_.notify_all();
}

void FakeClock::advance(Duration by) {
  GEO_ENFORCE(by.count() >= 0, "FakeClock::advance: time does not go back");
  std::unique_lock lock(mu_);
  elapsed_ += by;
  const TimePoint now(kFakeStart + elapsed_);
  const uint64_t generation = ++generation_;
  // The condition variables of the waiters this advance wakes: those whose
  // deadline it reaches. A waiter's thread takes its own mutex, then this
  // clock's; blocking on its mutex here, with the clock's held, could
  // deadlock, so try it and, if it is busy, let go of the clock's mutex for
  // a moment and look again. A waiter cannot leave while the clock's mutex is
  // held, so its mutex and cv stay valid.
  while (true) {
    bool busy = false;
    for (auto& [id, w] : waiters_) {
      if (w.woken == generation || w.deadline > now) continue;
      std::unique_lock theirs(*w.mu, std::try_to_lock);
      if (!theirs.owns_lock()) {
        busy = true;
        continue;
      }
      // notify_all() wakes every thread on this cv, due or not: each of them
      // runs until it waits again, and counts as running until then.
      for (auto& [otherId, other] : waiters_) {
        if (other.cv != w.cv) continue;
        other.woken = generation;
        other.notified = true;
      }
      w.cv->notify_all();
    }
    if (!busy) return;
    lock.unlock();
    std::this_thread::yield();
    lock.lock();
  }
}

void FakeClock::notifyAll(std::condition_variable& cv) const {
  {
    std::lock_guard lock(mu_);
    for (auto& [id, w] : waiters_) {
      if (w.cv == &cv) w.notified = true;
    }
  }
  cv.notify_all();
}

size_t FakeClock::idleWaiters() const {
  size_t n = 0;
  for (const auto& [id, w] : waiters_) n += w.notified ? 0 : 1;
  return n;
}

Clock::TimePoint FakeClock::nextDeadline() const {
  std::lock_guard lock(mu_);
  TimePoint next = TimePoint::max();
  for (const auto& [id, w] : waiters_) {
    if (!w.notified) next = std::min(next, w.deadline);
  }
  return next;
}

size_t FakeClock::waiters() const {
  std::lock_guard lock(mu_);
  return idleWaiters();
}

bool FakeClock::awaitWaiters(size_t n, std::chrono::milliseconds timeout) const {
  std::unique_lock lock(mu_);
  return waitersChanged_.wait_for(lock, timeout, [&] { return idleWaiters() >= n; });
}

}  // namespace geo
