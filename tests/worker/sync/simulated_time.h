#pragma once
// Simulated time for tests of a job's threads on a FakeClock (the
// synchronizers with SyncOptions::clock, the in-memory network on the same
// clock): time moves on only when every thread of the job waits on the
// clock, so a thread's own work takes no simulated time and every wait ends
// exactly when the clock says.

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <thread>

#include "common/clock.h"

namespace geo::testing {

// While `running` (the job's threads that have not finished) is above 0:
// moves `clock` on by `step` whenever every one of them waits on it. Fails
// the test, and lets every wait time out, when they are not all done within
// `limit` of simulated time; returns whether they were.
inline bool driveWhileRunning(FakeClock& clock, const std::atomic<size_t>& running,
                              Clock::Duration step, Clock::Duration limit) {
  const auto end = clock.now() + limit;
  while (running.load() > 0 && clock.now() < end) {
    const size_t n = running.load();
    if (n > 0 && clock.waiters() >= n) {
      clock.advance(step);
      // Let the woken threads take their turn before looking again.
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    } else {
      std::this_thread::yield();
    }
  }
  const bool done = running.load() == 0;
  EXPECT_TRUE(done) << running.load() << " thread(s) still running after "
                    << std::chrono::duration<double>(limit).count() << " s of simulated time";
  if (!done) clock.advance(std::chrono::hours(24));
  return done;
}

}  // namespace geo::testing
