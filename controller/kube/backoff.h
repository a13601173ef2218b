#pragma once
// Jittered exponential backoff for reconnects and retries.
//
// The n-th delay (n from 0) is base_n = min(max, initial * factor^n), shrunk
// by a random fraction of up to `jitter`: a value in [base_n * (1 - jitter),
// base_n]. It never exceeds `max`, so callers can bound their total wait; the
// jitter spreads the reconnects of many clients after an API server restart.
// Not thread-safe: one Backoff per retry loop.

#include <chrono>
#include <cstdint>
#include <random>

namespace geo::kube {

struct BackoffPolicy {
  std::chrono::milliseconds initial{200};
  std::chrono::milliseconds max{30000};
  double factor = 2.0;  // >= 1
  double jitter = 0.5;  // in [0, 1]
};

// A different seed on every call: one std::random_device draw per process,
// then a counter through splitmix64. Every request makes a Backoff, and a
// std::random_device each (an open, read and close of /dev/urandom) showed
// in the controller's profile. Thread-safe.
uint64_t freshSeed();

class Backoff {
 public:
  // `seed` makes the jitter reproducible in tests; the default draws one.
  explicit Backoff(BackoffPolicy policy = {}, uint64_t seed = freshSeed());

  // The delay before the next attempt; each call counts one failure.
  std::chrono::milliseconds next();
  // After a success: the next delay starts again from `initial`.
  void reset() { attempts_ = 0; }
  int attempts() const { return attempts_; }
  const BackoffPolicy& policy() const { return policy_; }

 private:
  BackoffPolicy policy_;
  std::mt19937_64 rng_;
  int attempts_ = 0;
};

}  // namespace geo::kube
