#include "worker/sync/parity.h"

#include <algorithm>
#include <cmath>

namespace geo::sync {
namespace {

// splitmix64: four well-mixed sign bits per index, the same on every worker.
uint64_t mix(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace

ParityFingerprint fingerprintOf(const float* values, size_t n) {
  ParityFingerprint f;
  std::array<double, 4> sums{};
  double norm = 0;
  for (size_t j = 0; j < n; ++j) {
    const double v = values[j];
    const uint64_t bits = mix(j);
    for (size_t k = 0; k < 4; ++k) sums[k] += (bits >> k) & 1 ? v : -v;
    norm += v * v;
  }
  f.projections = sums;
  f.squaredNorm = norm;
  return f;
}

double parityDistance(const ParityFingerprint& a, const ParityFingerprint& b) {
  double worst = 0;
  for (size_t k = 0; k < a.projections.size(); ++k) {
    worst = std::max(worst, std::abs(a.projections[k] - b.projections[k]));
  }
  const double norm = std::sqrt(std::max(a.squaredNorm, b.squaredNorm));
  if (!std::isfinite(norm) || !std::isfinite(worst)) return INFINITY;
  if (norm == 0) return worst == 0 ? 0 : INFINITY;
  return worst / norm;
}

bool sameModel(const ParityFingerprint& a, const ParityFingerprint& b, double tolerance) {
  return parityDistance(a, b) <= tolerance;
}

ParityVerdict parityVerdict(const std::vector<ParityFingerprint>& fingerprints, size_t self,
                            double tolerance) {
  ParityVerdict v;
  const size_t n = fingerprints.size();
  if (self >= n) return v;
  size_t winner = 0;
  size_t most = 0;
  for (size_t a = 0; a < n; ++a) {
    size_t agree = 0;
    for (size_t b = 0; b < n; ++b) agree += sameModel(fingerprints[a], fingerprints[b], tolerance);
    if (agree > most) {  // strictly more: a tie keeps the lower index
      most = agree;
      winner = a;
    }
  }
  for (size_t b = 0; b < n; ++b) {
    if (b != self && !sameModel(fingerprints[self], fingerprints[b], tolerance)) {
      v.disagreeing.push_back(b);
    }
  }
  if (sameModel(fingerprints[self], fingerprints[winner], tolerance)) return v;
  v.selfDiffers = true;
  for (size_t b = 0; b < n; ++b) {
    if (b != self && sameModel(fingerprints[winner], fingerprints[b], tolerance)) {
      v.sources.push_back(b);
    }
  }
  return v;
}

}  // namespace geo::sync
