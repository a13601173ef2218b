#pragma once
// State parity (docs/membership.md, "State parity"): workers of a DTS job
// compare a fingerprint of the job model every few rounds, find the one
// whose model differs (a bit flipped in its state, a round it missed, a
// contribution it applied that the others dropped), and that one repairs
// itself from a peer. Pure functions, no LibTorch, unit-tested on exact
// inputs; dts.cc computes the job model, exchanges the fingerprints and
// carries out the repair.
//
// Why a fingerprint with a tolerance and not a hash: under DTS the job model
// x0 - Σ q̄ is not a tensor any worker keeps. Each worker reconstructs it
// from its own model, round start, error feedback and rounds in flight
// (Dts::jobModel), which float arithmetic rounds differently on each worker:
// equal in exact arithmetic, a few units in the last place apart in fp32. A
// hash of those bytes would differ on every check. Projections onto random
// ±1 vectors, summed in double, move by the rounding (about 1e-7 of the
// model's norm; 1e-6 after a late contribution was applied on some workers
// and arrived in time at others) and by any real difference in full.

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace geo::sync {

// Rounds between parity checks: round r is checked when r % kParityEvery
// == 0, so a difference that arises in round r is seen at round r + 4 at
// the latest.
inline constexpr uint64_t kParityEvery = 4;

// Two fingerprints are of the same model when every projection differs by
// at most this fraction of the larger norm. Rounding measured on the world
// preset (docs/membership.md) stays below 1e-6. What it sees: one weight
// moved by more than 2e-5 of the norm; for the mlp (200k weights of about
// 0.05), any exponent bit or one of the upper five of the mantissa.
inline constexpr double kParityTolerance = 2e-5;

struct ParityFingerprint {
  std::array<double, 4> projections{};  // Σ_j s_k(j) v_j, s_k(j) = ±1
  double squaredNorm = 0;               // Σ_j v_j²
};

// The sign of value j in projection k is bit k of parityClassOf(j): +1 where
// it is set. The signs depend on the index only, so that every worker
// projects onto the same vectors.
inline constexpr size_t kParityClasses = 16;

// splitmix64 of the index, its low four bits: well mixed, the same on every
// worker and every device (detail::tensorFingerprint computes it on a GPU
// with tensor ops).
inline constexpr uint64_t kParityMixAdd = 0x9e3779b97f4a7c15ull;
inline constexpr uint64_t kParityMixMul1 = 0xbf58476d1ce4e5b9ull;
inline constexpr uint64_t kParityMixMul2 = 0x94d049bb133111ebull;
inline constexpr size_t parityClassOf(uint64_t j) {
  uint64_t z = j + kParityMixAdd;
  z = (z ^ (z >> 30)) * kParityMixMul1;
  z = (z ^ (z >> 27)) * kParityMixMul2;
  return static_cast<size_t>((z ^ (z >> 31)) & (kParityClasses - 1));
}

// The fingerprint of `n` values. A value that is not finite makes the norm
// infinite (sameModel() is then false).
ParityFingerprint fingerprintOf(const float* values, size_t n);

// The fingerprint from the sums of the values of each class (the values j
// with parityClassOf(j) == m, summed in double) and Σ v²: what a device
// computes in place of fingerprintOf(), whose result it is up to rounding.
ParityFingerprint fingerprintOfClasses(const std::array<double, kParityClasses>& classes,
                                       double squaredNorm);

// fingerprintOf() a part at a time: add(values, n) the parts in order,
// then fingerprint(). The same sums in the same order, so the same
// fingerprint to the bit, without the model whole in memory.
class FingerprintSums {
 public:
  void add(const float* values, size_t n);
  ParityFingerprint fingerprint() const { return fingerprintOfClasses(classes_, norm_); }

 private:
  std::array<double, kParityClasses> classes_{};
  double norm_ = 0;
  uint64_t next_ = 0;  // the index of the next value added
};

// max_k |a_k - b_k| / max(|a|, |b|); 0 for two zero models.
double parityDistance(const ParityFingerprint& a, const ParityFingerprint& b);

bool sameModel(const ParityFingerprint& a, const ParityFingerprint& b,
               double tolerance = kParityTolerance);

// Which model wins among the fingerprints of one round (index 0..n-1, all
// comparable: see dts.cc for what makes two reports comparable): the one
// most others agree with, ties to the lowest index -- so that both halves
// of a 2 + 2 split agree on which half keeps its model.
struct ParityVerdict {
  bool selfDiffers = false;         // `self` disagrees with the winner
  std::vector<size_t> sources;      // selfDiffers: the winner's side, to repair from
  std::vector<size_t> disagreeing;  // the reporters whose model differs from self's
};
ParityVerdict parityVerdict(const std::vector<ParityFingerprint>& fingerprints, size_t self,
                            double tolerance = kParityTolerance);

}  // namespace geo::sync
