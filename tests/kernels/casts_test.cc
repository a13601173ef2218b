// fp16/bf16 casts against references: GCC's _Float16 (IEEE binary16 with
// round-to-nearest-even conversions in libgcc) and a first-principles bf16
// rounding written with integers.

#include "kernels/casts.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "common/enforce.h"

namespace geo::kernels {
namespace {

// Finite and special floats plus random bit patterns (all exponents, so
// subnormal, overflow and tie cases are all hit).
std::vector<float> probeFloats() {
  std::vector<float> v = {0.0f,
                          -0.0f,
                          1.0f,
                          -1.0f,
                          65504.0f,
                          65519.0f,
                          65520.0f,
                          -65520.0f,
                          6.1035e-5f,
                          5.96e-8f,
                          2.98e-8f,
                          2.99e-8f,
                          1e-10f,
                          3.0e38f,
                          std::numeric_limits<float>::max(),
                          std::numeric_limits<float>::denorm_min(),
                          std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::quiet_NaN()};
  // Exact ties between two fp16 values: 1 + (2k+1) * 2^-11.
  for (int k = 0; k < 64; ++k) v.push_back(1.0f + static_cast<float>(2 * k + 1) * 0x1p-11f);
  std::mt19937 gen(7);
  for (int i = 0; i < 200000; ++i) v.push_back(std::bit_cast<float>(static_cast<uint32_t>(gen())));
  return v;
}

uint16_t referenceBf16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  if (std::isnan(f)) return static_cast<uint16_t>((u >> 16) | 0x40);
  const uint32_t truncated = u >> 16;
  const uint32_t rest = u & 0xffff;
  if (rest > 0x8000 || (rest == 0x8000 && (truncated & 1)))
    return static_cast<uint16_t>(truncated + 1);
  return static_cast<uint16_t>(truncated);
}

TEST(Casts, Fp16EncodeMatchesIeeeRounding) {
  const auto v = probeFloats();
  std::vector<uint16_t> out(v.size());
  const int64_t bad = castToFp16(v.data(), static_cast<int64_t>(v.size()), out.data());
  int64_t expectedBad = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    const auto ref = static_cast<_Float16>(v[i]);
    const uint16_t refBits = std::bit_cast<uint16_t>(ref);
    if (std::isnan(v[i])) {
      ASSERT_EQ(out[i] & 0x7c00, 0x7c00);
      ASSERT_NE(out[i] & 0x03ff, 0);
    } else {
      ASSERT_EQ(out[i], refBits) << std::hexfloat << v[i];
    }
    expectedBad += std::isfinite(static_cast<float>(ref)) ? 0 : 1;
  }
  EXPECT_EQ(bad, expectedBad);
  EXPECT_GT(bad, 0);
}

TEST(Casts, Fp16DecodeIsExactForAllCodes) {
  std::vector<uint16_t> codes(65536);
  for (uint32_t i = 0; i < 65536; ++i) codes[i] = static_cast<uint16_t>(i);
  std::vector<float> out(65536);
  castFromFp16(codes.data(), 65536, out.data());
  for (uint32_t i = 0; i < 65536; ++i) {
    const float ref = static_cast<float>(std::bit_cast<_Float16>(codes[i]));
    if (std::isnan(ref)) {
      ASSERT_TRUE(std::isnan(out[i])) << i;
    } else {
      ASSERT_EQ(std::bit_cast<uint32_t>(out[i]), std::bit_cast<uint32_t>(ref)) << i;
    }
  }
}

TEST(Casts, Bf16EncodeRoundsToNearestEven) {
  const auto v = probeFloats();
  std::vector<uint16_t> out(v.size());
  const int64_t bad = castToBf16(v.data(), static_cast<int64_t>(v.size()), out.data());
  int64_t expectedBad = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    ASSERT_EQ(out[i], referenceBf16(v[i])) << std::hexfloat << v[i];
    expectedBad += (referenceBf16(v[i]) & 0x7f80) == 0x7f80 ? 1 : 0;
  }
  EXPECT_EQ(bad, expectedBad);
}

TEST(Casts, Bf16DecodeIsExact) {
  std::vector<uint16_t> codes(65536);
  for (uint32_t i = 0; i < 65536; ++i) codes[i] = static_cast<uint16_t>(i);
  std::vector<float> out(65536);
  castFromBf16(codes.data(), 65536, out.data());
  for (uint32_t i = 0; i < 65536; ++i) ASSERT_EQ(std::bit_cast<uint32_t>(out[i]), i << 16);
}

TEST(Casts, AccumulateAddsScaledDecodedValues) {
  const std::vector<float> v = {1.5f, -2.25f, 1000.0f, 0.0f, 3.0e-5f};
  std::vector<uint16_t> h(v.size()), b(v.size());
  (void)castToFp16(v.data(), 5, h.data());
  (void)castToBf16(v.data(), 5, b.data());
  std::vector<float> dh(5), db(5);
  castFromFp16(h.data(), 5, dh.data());
  castFromBf16(b.data(), 5, db.data());
  std::vector<float> acc16(5, 1.0f), accBf(5, 1.0f);
  accumulateFp16(h.data(), 5, 0.5f, acc16.data());
  accumulateBf16(b.data(), 5, 0.5f, accBf.data());
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(acc16[i], 1.0f + 0.5f * dh[i]);
    EXPECT_EQ(accBf[i], 1.0f + 0.5f * db[i]);
  }
}

TEST(Casts, NullWithElementsIsAnError) {
  uint16_t h = 0;
  EXPECT_THROW(castToFp16(nullptr, 1, &h), Error);
  EXPECT_THROW(castFromBf16(&h, 1, nullptr), Error);
  EXPECT_NO_THROW(castToBf16(nullptr, 0, nullptr));
}

}  // namespace
}  // namespace geo::kernels
