#pragma once
// Clock: where code that waits or stamps times reads the time, so that tests
// can drive it (FakeClock) instead of sleeping in real time.
//
// A Clock has two faces: a monotonic time (now(): delays, deadlines, how
// long something took) and a wall time (wallNow(): time stamps written into
// objects, ages counted from a time stamp read back). Waiting goes through
// the clock too: waitUntil() blocks on the caller's condition variable until
// it is notified or the clock reaches the deadline, which a FakeClock does
// when a test advances it. Code under test therefore never calls
// std::chrono::*_clock::now() or a sleep of its own where a test wants to
// control time.
//
// Threading: every member of both clocks is thread-safe. Errors: none.

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>

namespace geo {

class Clock {
 public:
  using Duration = std::chrono::steady_clock::duration;
  using TimePoint = std::chrono::steady_clock::time_point;
  using WallTime = std::chrono::system_clock::time_point;

  virtual ~Clock() = default;

  // The monotonic time: never goes back.
  virtual TimePoint now() const = 0;
  // The wall time, for time stamps (may jump on a real clock).
  virtual WallTime wallNow() const = 0;

  // With `lock` (which holds the mutex guarding the caller's state) taken:
  // waits on `cv` until it is notified or now() reaches `deadline`, and
  // returns with `lock` taken again. It may return early (a spurious wake-up,
  // as std::condition_variable may): callers loop and check their state and
  // now() again. Returns at once when the deadline has passed.
  virtual void waitUntil(std::unique_lock<std::mutex>& lock, std::condition_variable& cv,
                         TimePoint deadline) const = 0;

  // Wakes every thread that waits on `cv` (cv.notify_all()). Code whose
  // threads wait through this clock notifies through it too: a FakeClock
  // then counts the woken threads as running until they wait again, so a
  // test that moves time on only when every thread waits (waiters()) does
  // not move it past a thread that has yet to act on the notification.
  // As with any condition variable, notify with the mutex that the waiters
  // passed to waitUntil() held (or after changing, under it, what they
  // check): a waiter registers with the clock before it waits on `cv`, and
  // a notification between the two, not under that mutex, is lost.
  virtual void notifyAll(std::condition_variable& cv) const { cv.notify_all(); }

  // Blocks the calling thread until now() reaches `deadline`.
  void sleepUntil(TimePoint deadline) const;
  void sleepFor(Duration duration) const { sleepUntil(now() + duration); }
};

// The real clocks (std::chrono::steady_clock and system_clock); one per
// process, never destroyed.
Clock& systemClock();

// A clock that stands still until a test moves it. It starts at an arbitrary
// fixed monotonic time and at `wallStart` on the wall; advance() moves both
// by the same amount and wakes every waitUntil() whose deadline it reaches,
// so a test decides exactly when a delay is over.
class FakeClock : public Clock {
 public:
  // 2024-01-01T00:00:00Z by default: a readable, fixed time stamp.
  explicit FakeClock(WallTime wallStart = WallTime(std::chrono::seconds(1704067200)));

  TimePoint now() const override;
  WallTime wallNow() const override;
  void waitUntil(std::unique_lock<std::mutex>& lock, std::condition_variable& cv,
                 TimePoint deadline) const override;
  void notifyAll(std::condition_variable& cv) const override;

  // Moves the time on by `by` (>= 0) and wakes every waiter whose deadline
  // it reaches, and with each the other waiters on the same condition
  // variable (a notification wakes them all; each rechecks its own
  // deadline). A waiter whose deadline is still ahead is left asleep, as a
  // real clock leaves it: a job of many threads that each wait on a timer of
  // their own is moved on without waking all of them at every advance. Must
  // not be called with a mutex held that a waiter passed to waitUntil().
  void advance(Duration by);
  // How many threads wait in waitUntil() or sleepUntil() now and have not
  // been woken since (by advance() or notifyAll()): a test that must know a
  // thread reached its wait (before advancing) polls this. A woken thread
  // counts again only once it waits again, so right after advance() this is
  // 0 until the woken threads have looked at the new time.
  size_t waiters() const;
  // Blocks (in real time, briefly) until at least `n` threads wait on this
  // clock, as waiters() counts them; false when that did not happen within
  // `timeout`.
  bool awaitWaiters(size_t n, std::chrono::milliseconds timeout = std::chrono::seconds(10)) const;
  // The earliest deadline of the waiters waiters() counts (TimePoint::max()
  // when there are none): a test that moves time on only when every thread
  // waits can jump straight there, since nothing happens before it.
  TimePoint nextDeadline() const;

 private:
  struct Waiter {
    std::mutex* mu;
    std::condition_variable* cv;
    TimePoint deadline;
    uint64_t woken;         // the last advance() that notified it
    bool notified = false;  // woken by advance() or notifyAll(), not yet running
  };
  size_t idleWaiters() const;  // with mu_ held

  mutable std::mutex mu_;
  mutable std::condition_variable waitersChanged_;
  Duration elapsed_{0};
  const WallTime wallStart_;
  uint64_t generation_ = 0;  // advance() calls so far
  mutable uint64_t nextWaiter_ = 1;
  mutable std::map<uint64_t, Waiter> waiters_;
};

}  // namespace geo
