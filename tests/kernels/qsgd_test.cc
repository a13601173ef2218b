// QSGD CPU kernels against the contract of kernels/qsgd.h: an independent
// scalar reference of the documented arithmetic (exact bytes), the error bound,
// unbiasedness and variance (statistical tests with sharp bounds), determinism,
// edge cases and bad input.

#include "kernels/qsgd.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "common/enforce.h"
#include "kernels/philox.h"

namespace geo::kernels {
namespace {

using Bytes = std::vector<uint8_t>;

std::vector<float> gaussian(int64_t n, uint32_t seed, float sigma = 1.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, sigma);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = dist(gen);
  return v;
}

Bytes encode(const std::vector<float>& v, const QsgdConfig& cfg, RngKey key,
             float* residual = nullptr, int threads = 1) {
  const auto n = static_cast<int64_t>(v.size());
  Bytes out(static_cast<size_t>(qsgdEncodedBytes(n, cfg)), 0xAB);
  qsgdEncode(v.data(), n, cfg, key, out.data(), static_cast<int64_t>(out.size()), residual,
             threads);
  return out;
}

std::vector<float> decode(const Bytes& enc, int64_t n, const QsgdConfig& cfg) {
  std::vector<float> out(static_cast<size_t>(n), -7.0f);
  qsgdDecode(enc.data(), static_cast<int64_t>(enc.size()), n, cfg, out.data(), 1);
  return out;
}

float scaleOf(const Bytes& enc, int64_t bucket) {
  float s;
  std::memcpy(&s, enc.data() + 4 * bucket, 4);
  return s;
}

float levelsOf(int bits) {
  return static_cast<float>((1 << (bits - 1)) - 1);
}

// ---- independent scalar reference of the documented format ----------------

Bytes referenceEncode(const std::vector<float>& v, const QsgdConfig& cfg, RngKey key) {
  const auto n = static_cast<int64_t>(v.size());
  const int64_t d = cfg.bucketSize;
  const int64_t buckets = (n + d - 1) / d;
  const float s = levelsOf(cfg.bits);
  Bytes out(static_cast<size_t>(4 * buckets + (n * cfg.bits + 7) / 8), 0);
  for (int64_t b = 0; b < buckets; ++b) {
    const int64_t lo = b * d;
    const int64_t hi = std::min(n, lo + d);
    float m = 0.0f;
    if (cfg.scale == QsgdScale::kMaxAbs) {
      for (int64_t k = lo; k < hi; ++k) m = std::max(m, std::fabs(v[k]));
    } else {
      double lanes[32] = {};
      for (int64_t k = lo; k < hi; ++k) {
        lanes[(k - lo) % 32] += static_cast<double>(v[k]) * static_cast<double>(v[k]);
      }
      for (int w = 16; w >= 1; w /= 2) {
        for (int j = 0; j < w; ++j) lanes[j] += lanes[j + w];
      }
      m = static_cast<float>(std::sqrt(lanes[0]));
    }
    std::memcpy(out.data() + 4 * b, &m, 4);
    const float f = m < 0x1p-60f ? 0x1p64f : 1.0f;
    const float inv = m == 0.0f ? 0.0f : s / (m * f);
    for (int64_t k = lo; k < hi; ++k) {
      const Philox4x32 r = philoxBlock(key.seed, key.stream, static_cast<uint64_t>(k / 8));
      const uint32_t word = r.v[(k % 8) / 2];
      const uint32_t r16 = (k % 2 == 0) ? (word & 0xffff) : (word >> 16);
      const float u = static_cast<float>(2 * r16 + 1) / 131072.0f;
      float y = (std::fabs(v[k]) * (m == 0.0f ? 0.0f : f)) * inv;
      y = std::min(y, s);
      const float l = std::floor(y);
      const uint32_t level = static_cast<uint32_t>(l) + (u < y - l ? 1 : 0);
      const uint32_t code = (std::signbit(v[k]) ? 1u << (cfg.bits - 1) : 0u) | level;
      const int64_t bit = k * cfg.bits;
      out[static_cast<size_t>(4 * buckets + bit / 8)] |= static_cast<uint8_t>(code << (bit % 8));
    }
  }
  return out;
}

// ---- parameterized over bits x bucket size x length x scale ---------------

using Param = std::tuple<int, int64_t, int64_t, QsgdScale>;

class QsgdTest : public ::testing::TestWithParam<Param> {
 protected:
  QsgdConfig cfg() const {
    return {std::get<0>(GetParam()), std::get<1>(GetParam()), std::get<3>(GetParam())};
  }
  int64_t n() const { return std::get<2>(GetParam()); }
};

TEST_P(QsgdTest, EncodedSizeIsExact) {
  const QsgdConfig c = cfg();
  const int64_t buckets = (n() + c.bucketSize - 1) / c.bucketSize;
  EXPECT_EQ(qsgdNumBuckets(n(), c), buckets);
  EXPECT_EQ(qsgdEncodedBytes(n(), c), 4 * buckets + (n() * c.bits + 7) / 8);
}

TEST_P(QsgdTest, BytesMatchTheScalarReference) {
  const auto v = gaussian(n(), 11);
  const RngKey key{0x5eed, 42};
  EXPECT_EQ(encode(v, cfg(), key), referenceEncode(v, cfg(), key));
}

TEST_P(QsgdTest, EveryValueWithinOneStep) {
  const auto v = gaussian(n(), 12, 3.0f);
  const QsgdConfig c = cfg();
  const Bytes enc = encode(v, c, {1, 2});
  const auto q = decode(enc, n(), c);
  for (int64_t k = 0; k < n(); ++k) {
    const float step = scaleOf(enc, k / c.bucketSize) / levelsOf(c.bits);
    ASSERT_LE(std::fabs(q[k] - v[k]), step * (1 + 1e-6f)) << "k=" << k;
  }
}

TEST_P(QsgdTest, SameSeedSameBytesOtherSeedOtherBytes) {
  const auto v = gaussian(n(), 13);
  const Bytes a = encode(v, cfg(), {9, 1});
  EXPECT_EQ(a, encode(v, cfg(), {9, 1}));
  // Short inputs may legitimately collide; one-value buckets hold only
  // |v| = scale, which quantizes exactly, without randomness.
  if (n() >= 64 && cfg().bucketSize > 1) {
    EXPECT_NE(a, encode(v, cfg(), {10, 1}));
    EXPECT_NE(a, encode(v, cfg(), {9, 2}));
  }
}

TEST_P(QsgdTest, ThreadCountDoesNotChangeOutput) {
  const auto v = gaussian(n(), 14);
  EXPECT_EQ(encode(v, cfg(), {3, 4}, nullptr, 1), encode(v, cfg(), {3, 4}, nullptr, 4));
}

TEST_P(QsgdTest, DecodeAccumulateAddsTheDecodedValues) {
  const auto v = gaussian(n(), 15);
  const QsgdConfig c = cfg();
  const Bytes enc = encode(v, c, {5, 6});
  const auto q = decode(enc, n(), c);
  const auto base = gaussian(n(), 16);
  for (float alpha : {1.0f, 0.25f}) {
    auto acc = base;
    qsgdDecodeAccumulate(enc.data(), static_cast<int64_t>(enc.size()), n(), c, alpha, acc.data(),
                         1);
    for (int64_t k = 0; k < n(); ++k) {
      ASSERT_EQ(acc[k], base[k] + alpha * q[k]) << "k=" << k << " alpha=" << alpha;
    }
  }
}

TEST_P(QsgdTest, ErrorFeedbackKeepsWhatWasNotSent) {
  const QsgdConfig c = cfg();
  auto residual = gaussian(n(), 17, 0.1f);
  std::vector<double> sentTotal(static_cast<size_t>(n()), 0.0), inputTotal(sentTotal),
      maxW(sentTotal);
  const auto residual0 = residual;
  for (uint64_t round = 0; round < 5; ++round) {
    const auto v = gaussian(n(), static_cast<uint32_t>(100 + round));
    const auto before = residual;
    const Bytes enc = encode(v, c, {7, round}, residual.data());
    const auto q = decode(enc, n(), c);
    for (int64_t k = 0; k < n(); ++k) {
      // residual' = (v + e) - Q(v + e), computed in fp32.
      ASSERT_EQ(residual[k], (v[k] + before[k]) - q[k]) << "k=" << k;
      sentTotal[k] += q[k];
      inputTotal[k] += v[k];
      maxW[k] = std::max<double>(
          {maxW[k], std::fabs(v[k] + before[k]), std::fabs(q[k]), std::fabs(residual[k])});
    }
  }
  // Telescoping: everything put in is either sent or still in the residual,
  // up to the fp32 rounding of w = v + e and e = w - q (2 ulp of the largest
  // magnitude involved, per round).
  for (int64_t k = 0; k < n(); ++k) {
    ASSERT_NEAR(sentTotal[k] + residual[k], inputTotal[k] + residual0[k],
                5 * 2 * 1.2e-7 * (maxW[k] + 1))
        << "k=" << k;
  }
}

std::string paramName(const ::testing::TestParamInfo<Param>& info) {
  return "b" + std::to_string(std::get<0>(info.param)) + "_d" +
         std::to_string(std::get<1>(info.param)) + "_n" + std::to_string(std::get<2>(info.param)) +
         (std::get<3>(info.param) == QsgdScale::kMaxAbs ? "_max" : "_l2");
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, QsgdTest,
    ::testing::Combine(::testing::Values(2, 4, 8), ::testing::Values(1, 3, 128, 512, 1000),
                       ::testing::Values(0, 1, 7, 9, 512, 4097, 100003),
                       ::testing::Values(QsgdScale::kMaxAbs, QsgdScale::kL2Norm)),
    paramName);

// Large enough to take the multi-threaded path with several blocks.
INSTANTIATE_TEST_SUITE_P(Large, QsgdTest,
                         ::testing::Combine(::testing::Values(2, 4, 8), ::testing::Values(512, 77),
                                            ::testing::Values((1 << 18) + 5),
                                            ::testing::Values(QsgdScale::kMaxAbs)),
                         paramName);

// ---- statistics ------------------------------------------------------------

using StatsParam = std::tuple<int, int64_t, QsgdScale>;
class QsgdStatsTest : public ::testing::TestWithParam<StatsParam> {};

std::string statsName(const ::testing::TestParamInfo<StatsParam>& info) {
  return "b" + std::to_string(std::get<0>(info.param)) + "_d" +
         std::to_string(std::get<1>(info.param)) +
         (std::get<2>(info.param) == QsgdScale::kMaxAbs ? "_max" : "_l2");
}

// Over N seeds, for every element with fraction p_k = y_k - floor(y_k) strictly
// inside (0, 1), z_k = (mean_k - v_k) / (step * sqrt(p_k (1 - p_k) / N)) is
// approximately standard normal if and only if rounding is unbiased. The mean
// of z must be ~0 (std 1/sqrt(K)) and the mean of z^2 ~1 (std sqrt(2/K)); a
// floor- or nearest-rounding quantizer puts them off by orders of magnitude.
TEST_P(QsgdStatsTest, UnbiasedAndVarianceWithinQsgdBound) {
  const auto [bits, d, scale] = GetParam();
  const QsgdConfig c{bits, d, scale};
  const int64_t n = 2048;
  const int seeds = 3000;
  const auto v = gaussian(n, 21);
  std::vector<double> sum(n, 0.0);
  std::vector<double> sqErr(static_cast<size_t>(qsgdNumBuckets(n, c)), 0.0);
  Bytes enc;
  for (int s = 0; s < seeds; ++s) {
    enc = encode(v, c, {static_cast<uint64_t>(s), 99});
    const auto q = decode(enc, n, c);
    for (int64_t k = 0; k < n; ++k) {
      sum[k] += q[k];
      sqErr[k / d] += static_cast<double>(q[k] - v[k]) * (q[k] - v[k]);
    }
  }
  const float s = levelsOf(bits);
  double zSum = 0, z2Sum = 0;
  int64_t count = 0;
  std::vector<double> expectedVar(sqErr.size(), 0.0);
  for (int64_t k = 0; k < n; ++k) {
    const double m = scaleOf(enc, k / d);  // scales do not depend on the seed
    const double step = m / s;
    const double y = std::fabs(v[k]) * s / m;
    const double p = y - std::floor(y);
    const double mean = sum[k] / seeds;
    expectedVar[k / d] += step * step * p * (1 - p);
    if (p < 1e-3 || p > 1 - 1e-3) {
      EXPECT_NEAR(mean, v[k], step * 0.01) << "k=" << k;
      continue;
    }
    const double z = (mean - v[k]) / (step * std::sqrt(p * (1 - p) / seeds));
    zSum += z;
    z2Sum += z * z;
    ++count;
  }
  ASSERT_GT(count, n / 2);
  EXPECT_LT(std::fabs(zSum / count), 6.0 / std::sqrt(count)) << "mean z";
  EXPECT_NEAR(z2Sum / count, 1.0, 6.0 * std::sqrt(2.0 / count)) << "mean z^2";

  for (size_t b = 0; b < sqErr.size(); ++b) {
    const int64_t lo = static_cast<int64_t>(b) * d;
    const int64_t len = std::min<int64_t>(n, lo + d) - lo;
    double norm2 = 0;
    for (int64_t k = lo; k < lo + len; ++k) norm2 += static_cast<double>(v[k]) * v[k];
    const double measured = sqErr[b] / seeds;
    const double bound =
        std::min(static_cast<double>(len) / (s * s), std::sqrt(static_cast<double>(len)) / s) *
        norm2;
    EXPECT_LE(measured, bound) << "bucket " << b;
    // And the measured variance is the one the rounding rule implies.
    EXPECT_NEAR(measured, expectedVar[b], 0.15 * expectedVar[b] + 1e-12) << "bucket " << b;
  }
}

INSTANTIATE_TEST_SUITE_P(Bits, QsgdStatsTest,
                         ::testing::Combine(::testing::Values(2, 4, 8), ::testing::Values(128, 512),
                                            ::testing::Values(QsgdScale::kMaxAbs,
                                                              QsgdScale::kL2Norm)),
                         statsName);

// ---- edge cases ------------------------------------------------------------

TEST(QsgdEdge, EmptyInputIsANoOp) {
  const QsgdConfig c;
  EXPECT_EQ(qsgdEncodedBytes(0, c), 0);
  qsgdEncode(nullptr, 0, c, {}, nullptr, 0);
  qsgdDecode(nullptr, 0, 0, c, nullptr);
  qsgdDecodeAccumulate(nullptr, 0, 0, c, 1.0f, nullptr);
}

TEST(QsgdEdge, FourBitsOf512IsAbout7_9TimesSmaller) {
  const QsgdConfig c{4, 512, QsgdScale::kMaxAbs};
  const int64_t n = 512 * 1000;
  EXPECT_EQ(qsgdEncodedBytes(n, c), 4 * 1000 + n / 2);
  EXPECT_NEAR(4.0 * n / static_cast<double>(qsgdEncodedBytes(n, c)), 7.88, 0.01);
}

TEST(QsgdEdge, AllZerosDecodeToExactZeros) {
  const std::vector<float> v(1000, 0.0f);
  for (int bits : {2, 4, 8}) {
    const QsgdConfig c{bits, 128, QsgdScale::kMaxAbs};
    const auto q = decode(encode(v, c, {1, 1}), 1000, c);
    for (float x : q) ASSERT_EQ(x, 0.0f);
  }
}

TEST(QsgdEdge, OneValueIsExact) {
  for (int bits : {2, 4, 8}) {
    const QsgdConfig c{bits, 512, QsgdScale::kMaxAbs};
    const std::vector<float> v{-3.25f};
    EXPECT_EQ(decode(encode(v, c, {1, 1}), 1, c)[0], -3.25f) << bits;  // |v| = scale
  }
}

TEST(QsgdEdge, HugeAndTinyMagnitudes) {
  const float kMax = std::numeric_limits<float>::max();
  const float kDenorm = std::numeric_limits<float>::denorm_min();
  const std::vector<std::vector<float>> cases = {
      {kMax, -kMax, kMax / 3, 1.0f},          {1e30f, -2e29f, 3e28f, 0.0f},
      {kDenorm, -kDenorm, 0.0f, 3 * kDenorm}, {1e-40f, -2e-41f, 5e-39f, 1e-45f},
      {1e-30f, 1e30f, -1e-30f, 0.5f},
  };
  for (const auto& v : cases) {
    for (int bits : {2, 4, 8}) {
      const QsgdConfig c{bits, 2, QsgdScale::kMaxAbs};
      const Bytes enc = encode(v, c, {3, 3});
      const auto q = decode(enc, static_cast<int64_t>(v.size()), c);
      for (size_t k = 0; k < v.size(); ++k) {
        const float step = scaleOf(enc, static_cast<int64_t>(k) / 2) / levelsOf(bits);
        ASSERT_TRUE(std::isfinite(q[k])) << v[k];
        ASSERT_LE(std::fabs(q[k] - v[k]), step * (1 + 1e-6f) + kDenorm) << v[k];
      }
    }
  }
}

TEST(QsgdEdge, L2NormOverflowIsAnErrorNotInfinity) {
  const float kMax = std::numeric_limits<float>::max();
  const std::vector<float> v{kMax, kMax, kMax, kMax};
  const QsgdConfig c{4, 4, QsgdScale::kL2Norm};
  EXPECT_THROW(encode(v, c, {1, 1}), Error);
  const QsgdConfig maxAbs{4, 4, QsgdScale::kMaxAbs};
  EXPECT_NO_THROW(encode(v, maxAbs, {1, 1}));
}

// ---- bad input ---------------------------------------------------------------

std::string errorOf(auto&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(QsgdBadInput, NonFiniteValuesAreRejected) {
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    auto v = gaussian(5000, 3);
    v[4321] = bad;
    const std::string msg = errorOf([&] { encode(v, QsgdConfig{}, {1, 1}); });
    EXPECT_NE(msg.find("NaN or Inf"), std::string::npos) << msg;
  }
}

TEST(QsgdBadInput, NonFiniteWithFeedbackLeavesResidualUntouched) {
  auto v = gaussian(200000, 3);
  v[150000] = std::numeric_limits<float>::quiet_NaN();
  auto residual = gaussian(200000, 4);
  const auto before = residual;
  EXPECT_THROW(encode(v, QsgdConfig{}, {1, 1}, residual.data(), 2), Error);
  EXPECT_EQ(residual, before);
}

TEST(QsgdBadInput, ConfigErrorsNameTheFieldAndAllowedValues) {
  const std::vector<float> v(10, 1.0f);
  for (int bits : {0, 1, 3, 16}) {
    const std::string msg = errorOf([&] { encode(v, QsgdConfig{bits, 512}, {}); });
    EXPECT_NE(msg.find("bits must be 2, 4 or 8, got " + std::to_string(bits)), std::string::npos)
        << msg;
  }
  const std::string msg = errorOf([&] { encode(v, QsgdConfig{4, 0}, {}); });
  EXPECT_NE(msg.find("bucket size must be in [1, 2^30], got 0"), std::string::npos) << msg;
  EXPECT_THROW(qsgdEncodedBytes(-1, QsgdConfig{}), Error);
}

// The exported limits (kernels/qsgd_limits.h) are exactly what the kernels
// accept: the layers above state them as their own.
TEST(QsgdBadInput, ExportedLimitsAreExactlyWhatIsAccepted) {
  for (int bits = -1; bits <= 9; ++bits) {
    const QsgdConfig c{bits, 512};
    if (isQsgdBits(bits)) {
      EXPECT_NO_THROW(validateQsgdConfig(c)) << "bits " << bits;
    } else {
      EXPECT_THROW(validateQsgdConfig(c), Error) << "bits " << bits;
    }
  }
  EXPECT_NO_THROW(validateQsgdConfig({4, kQsgdMinBucket}));
  EXPECT_NO_THROW(validateQsgdConfig({4, kQsgdMaxBucket}));
  EXPECT_EQ(qsgdEncodedBytes(10, {4, kQsgdMaxBucket}), 4 + 5);  // one bucket
  const std::string msg = errorOf([&] { validateQsgdConfig({4, int64_t{1} << 31}); });
  EXPECT_NE(msg.find("qsgd bucket size must be in [1, 2^30], got 2147483648"), std::string::npos)
      << msg;
  EXPECT_THROW(validateQsgdConfig({4, kQsgdMaxBucket + 1}), Error);
  EXPECT_THROW(validateQsgdConfig({4, kQsgdMinBucket - 1}), Error);
}

TEST(QsgdBadInput, NullPointersAndShortBuffers) {
  const QsgdConfig c;
  std::vector<float> v(100, 1.0f);
  Bytes out(static_cast<size_t>(qsgdEncodedBytes(100, c)));
  EXPECT_THROW(qsgdEncode(nullptr, 100, c, {}, out.data(), 1000), Error);
  EXPECT_THROW(qsgdEncode(v.data(), 100, c, {}, nullptr, 1000), Error);
  const std::string msg = errorOf([&] { qsgdEncode(v.data(), 100, c, {}, out.data(), 10); });
  EXPECT_NE(msg.find("too small: 10 bytes, need 54"), std::string::npos) << msg;
  EXPECT_THROW(qsgdDecode(out.data(), 53, 100, c, v.data()), Error);
  EXPECT_THROW(qsgdDecode(nullptr, 54, 100, c, v.data()), Error);
  EXPECT_THROW(qsgdEncode(v.data(), 100, c, {}, out.data(), 54, v.data()), Error);  // aliasing
}

TEST(QsgdBadInput, CorruptScalesAreRejectedBeforeWriting) {
  const QsgdConfig c{4, 8, QsgdScale::kMaxAbs};
  const auto v = gaussian(64, 5);
  for (float badScale :
       {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(), -1.0f}) {
    Bytes enc = encode(v, c, {1, 1});
    std::memcpy(enc.data() + 4 * 5, &badScale, 4);
    std::vector<float> out(64, 2.0f);
    const std::string msg = errorOf([&] {
      qsgdDecodeAccumulate(enc.data(), static_cast<int64_t>(enc.size()), 64, c, 1.0f, out.data());
    });
    EXPECT_NE(msg.find("scale of bucket 5"), std::string::npos) << msg;
    EXPECT_EQ(out, std::vector<float>(64, 2.0f));
  }
}

}  // namespace
}  // namespace geo::kernels
