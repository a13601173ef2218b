// State parity's fingerprints and verdicts (worker/sync/parity.h) on exact
// inputs: what rounding moves, what a flipped bit moves, who repairs.

#include "worker/sync/parity.h"

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace geo::sync {
namespace {

// A model of `n` weights of a trained network's size (about N(0, 0.05)).
std::vector<float> weights(size_t n, unsigned seed = 1) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(0.0f, 0.05f);
  std::vector<float> v(n);
  for (float& x : v) x = d(gen);
  return v;
}

float flipBit(float x, int bit) {
  uint32_t u = 0;
  std::memcpy(&u, &x, sizeof u);
  u ^= uint32_t{1} << bit;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

ParityFingerprint fp(const std::vector<float>& v) {
  return fingerprintOf(v.data(), v.size());
}

TEST(ParityFingerprint, IsTheSameForTheSameValues) {
  const auto a = weights(200'000);
  EXPECT_EQ(parityDistance(fp(a), fp(a)), 0.0);
  EXPECT_TRUE(sameModel(fp(a), fp(a)));
}

TEST(ParityFingerprint, ProjectsOntoTheSignsOfEachIndexsClass) {
  // The definition, written out: projection k adds v_j where bit k of j's
  // class is set and subtracts it where it is not.
  const auto v = weights(1000, 3);
  std::array<double, 4> expected{};
  double norm = 0;
  for (size_t j = 0; j < v.size(); ++j) {
    for (size_t k = 0; k < 4; ++k) expected[k] += (parityClassOf(j) >> k) & 1 ? v[j] : -v[j];
    norm += static_cast<double>(v[j]) * v[j];
  }
  const ParityFingerprint f = fp(v);
  for (size_t k = 0; k < 4; ++k) EXPECT_NEAR(f.projections[k], expected[k], 1e-12) << k;
  EXPECT_NEAR(f.squaredNorm, norm, 1e-12);
  // The classes are the low bits of splitmix64's step applied to the index
  // (0xe220a8397b1dcdaf, 0x910a2dec89025cc1, 0x975835de1c9756ce for 0, 1,
  // 2; the first is splitmix64's first output from seed 0): the same on
  // every worker and every build.
  EXPECT_EQ(parityClassOf(0), 0xfu);
  EXPECT_EQ(parityClassOf(1), 0x1u);
  EXPECT_EQ(parityClassOf(2), 0xeu);
  // All sixteen classes occur, about equally often.
  std::array<int, kParityClasses> count{};
  for (size_t j = 0; j < 16000; ++j) ++count[parityClassOf(j)];
  for (int c : count) EXPECT_NEAR(c, 1000, 150);
}

TEST(ParityFingerprint, AcceptsRoundingAcrossTheWholeModel) {
  // Every weight a few units in the last place off, as the job model
  // reconstructed on two workers is (parity.h).
  const auto a = weights(200'000);
  auto b = a;
  std::mt19937 gen(7);
  std::uniform_int_distribution<int> ulps(-4, 4);
  for (float& x : b) {
    for (int u = ulps(gen); u != 0; u += u > 0 ? -1 : 1) {
      x = std::nextafter(x, u > 0 ? 1.0f : -1.0f);
    }
  }
  EXPECT_LT(parityDistance(fp(a), fp(b)), 1e-6);
  EXPECT_TRUE(sameModel(fp(a), fp(b)));
}

TEST(ParityFingerprint, FindsAFlippedBitThatMovesAWeightBeyondTheTolerance) {
  // What a sketch can see: one weight moved by more than the tolerance
  // times the model's norm. For 200k weights of 0.05 (the mlp) that is
  // every exponent bit and the upper five of the mantissa.
  const auto a = weights(200'000);
  const double norm = std::sqrt(fp(a).squaredNorm);
  size_t k = 0;  // a weight of typical size
  while (std::abs(a[k]) < 0.04f || std::abs(a[k]) > 0.06f) ++k;
  int seen = 0;
  for (int bit = 0; bit < 31; ++bit) {
    auto b = a;
    b[k] = flipBit(b[k], bit);
    const double moved = std::abs(static_cast<double>(b[k]) - a[k]);
    if (moved > 1.5 * kParityTolerance * norm) {
      EXPECT_FALSE(sameModel(fp(a), fp(b))) << "bit " << bit;
      ++seen;
    } else if (moved < 0.5 * kParityTolerance * norm) {
      EXPECT_TRUE(sameModel(fp(a), fp(b))) << "bit " << bit;
    }
  }
  EXPECT_GE(seen, 5 + 8);  // mantissa bits 18..22 and the exponent's 8
}

TEST(ParityFingerprint, ANonFiniteValueMatchesNothing) {
  const auto a = weights(1000);
  auto b = a;
  b[3] = std::numeric_limits<float>::infinity();
  EXPECT_FALSE(sameModel(fp(a), fp(b)));
  EXPECT_FALSE(sameModel(fp(b), fp(b)));  // not even itself: it is no model
}

TEST(ParityFingerprint, ZeroModelsAgree) {
  const std::vector<float> zeros(100, 0.0f);
  EXPECT_TRUE(sameModel(fp(zeros), fp(zeros)));
  auto one = zeros;
  one[5] = 1e-30f;
  EXPECT_FALSE(sameModel(fp(zeros), fp(one)));
}

TEST(ParityVerdict, TheOneThatDiffersRepairsFromTheOthers) {
  const auto a = weights(5000);
  auto bad = a;
  bad[10] = flipBit(bad[10], 29);
  const std::vector<ParityFingerprint> f{fp(a), fp(a), fp(bad), fp(a)};
  const ParityVerdict odd = parityVerdict(f, 2);
  EXPECT_TRUE(odd.selfDiffers);
  EXPECT_EQ(odd.sources, (std::vector<size_t>{0, 1, 3}));
  EXPECT_EQ(odd.disagreeing, (std::vector<size_t>{0, 1, 3}));
  for (size_t self : {0, 1, 3}) {
    const ParityVerdict v = parityVerdict(f, self);
    EXPECT_FALSE(v.selfDiffers) << self;
    EXPECT_TRUE(v.sources.empty());
    EXPECT_EQ(v.disagreeing, (std::vector<size_t>{2})) << self;
  }
}

TEST(ParityVerdict, ATieGoesToTheSideOfTheLowestIndex) {
  // Two halves after a partition: 0 and 3 on one side, 1 and 2 on the other.
  const auto a = weights(5000, 1);
  const auto b = weights(5000, 2);
  const std::vector<ParityFingerprint> f{fp(a), fp(b), fp(b), fp(a)};
  for (size_t self : {0, 3}) EXPECT_FALSE(parityVerdict(f, self).selfDiffers) << self;
  for (size_t self : {1, 2}) {
    const ParityVerdict v = parityVerdict(f, self);
    EXPECT_TRUE(v.selfDiffers) << self;
    EXPECT_EQ(v.sources, (std::vector<size_t>{0, 3})) << self;
  }
  // Two workers that differ: the higher index repairs.
  const std::vector<ParityFingerprint> two{fp(b), fp(a)};
  EXPECT_FALSE(parityVerdict(two, 0).selfDiffers);
  EXPECT_TRUE(parityVerdict(two, 1).selfDiffers);
  EXPECT_EQ(parityVerdict(two, 1).sources, (std::vector<size_t>{0}));
}

TEST(ParityVerdict, AWorkerAloneHasNothingToCompare) {
  const auto a = weights(100);
  const ParityVerdict v = parityVerdict({fp(a)}, 0);
  EXPECT_FALSE(v.selfDiffers);
  EXPECT_TRUE(v.disagreeing.empty());
  EXPECT_FALSE(parityVerdict({fp(a)}, 3).selfDiffers);  // an index out of range: no verdict
}

}  // namespace
}  // namespace geo::sync
