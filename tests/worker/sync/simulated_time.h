#pragma once
// Simulated time for tests of a job's threads on a FakeClock (the
// synchronizers with SyncOptions::clock, the in-memory network on the same
// clock): time moves on only when every thread of the job waits on the
// clock, so a thread's own work takes no simulated time and every wait ends
// exactly when the clock says.

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>

#include "common/clock.h"

namespace geo::testing {

// While `running` (the job's threads that have not finished) is above 0:
// moves `clock` on whenever every one of them waits on it, by `step` or, when
// the earliest of their deadlines is further off, straight to it (nothing
// can happen before it). So a wait ends at its deadline or up to `step`
// later, as on a clock that ticks every `step`, without the ticks in which
// nobody wakes. Fails the test, and lets every wait time out, when they are
// not all done within `limit` of simulated time; returns whether they were.
inline bool driveWhileRunning(FakeClock& clock, const std::atomic<size_t>& running,
                              Clock::Duration step, Clock::Duration limit) {
  const auto end = clock.now() + limit;
  while (running.load() > 0 && clock.now() < end) {
    const size_t n = running.load();
    if (n > 0 && clock.waiters() >= n) {
      const auto now = clock.now();
      const auto next = clock.nextDeadline();
      const auto by = next != Clock::TimePoint::max() && next - now > step ? next - now : step;
      clock.advance(std::min(by, end - now));
    } else {
      // Blocks (in real time) until one more thread waits, instead of taking
      // a core from the job's threads; the time-out notices a thread that
      // finished (running fell) rather than waited.
      clock.awaitWaiters(n, std::chrono::milliseconds(1));
    }
  }
  const bool done = running.load() == 0;
  EXPECT_TRUE(done) << running.load() << " thread(s) still running after "
                    << std::chrono::duration<double>(limit).count() << " s of simulated time";
  if (!done) clock.advance(std::chrono::hours(24));
  return done;
}

}  // namespace geo::testing
