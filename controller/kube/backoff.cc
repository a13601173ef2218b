#include "controller/kube/backoff.h"

#include <algorithm>
#include <cmath>

#include "common/enforce.h"

namespace geo::kube {

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
