#include "controller/kube/backoff.h"

#include <atomic>

#include <algorithm>
#include <cmath>

#include "common/enforce.h"

namespace geo::kube {

uint64_t freshSeed() {
  static const uint64_t base = (static_cast<uint64_t>(std::random_device{}()) << 32) ^
                               static_cast<uint64_t>(std::random_device{}());
  static std::atomic<uint64_t> counter{0};
  uint64_t z = base + 0x9e3779b97f4a7c15ULL * (counter.fetch_add(1, std::memory_order_relaxed) + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

Backoff::Backoff(BackoffPolicy policy, uint64_t seed) : policy_(policy), rng_(seed) {
  GEO_ENFORCE(policy_.initial.count() >= 0 && policy_.max >= policy_.initial,
              "backoff needs 0 <= initial <= max (got {} ms, {} ms)", policy_.initial.count(),
              policy_.max.count());
  GEO_ENFORCE(policy_.factor >= 1.0, "backoff factor must be >= 1 (got {})", policy_.factor);
  GEO_ENFORCE(policy_.jitter >= 0.0 && policy_.jitter <= 1.0,
              "backoff jitter must be in [0, 1] (got {})", policy_.jitter);
}

std::chrono::milliseconds Backoff::next() {
  const double maxMs = static_cast<double>(policy_.max.count());
  // In double, with the exponent capped, so no count of failures overflows.
  const double base = std::min(maxMs, static_cast<double>(policy_.initial.count()) *
                                          std::pow(policy_.factor, std::min(attempts_, 64)));
  ++attempts_;
  const double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng_);
  const double delay = base * (1.0 - policy_.jitter * u);
  return std::chrono::milliseconds(static_cast<int64_t>(std::clamp(delay, 0.0, maxMs)));
}

}  // namespace geo::kube
