#pragma once
// The per-element QSGD arithmetic, shared by the CPU and CUDA kernels so they
// cannot drift apart. Internal to kernels/; see qsgd.h for the contract.
//
// No expression here may be contracted into a fused multiply-add: the CPU
// target is compiled with -ffp-contract=off and device code uses the explicit
// round-to-nearest intrinsics below.

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/philox.h"

namespace geo::kernels::detail {

#if defined(__CUDA_ARCH__)
GEO_HOST_DEVICE float fmul(float a, float b) {
  return __fmul_rn(a, b);
}
GEO_HOST_DEVICE float fadd(float a, float b) {
  return __fadd_rn(a, b);
}
GEO_HOST_DEVICE float fsub(float a, float b) {
  return __fsub_rn(a, b);
}
GEO_HOST_DEVICE float fdiv(float a, float b) {
  return __fdiv_rn(a, b);
}
#else
GEO_HOST_DEVICE float fmul(float a, float b) {
  return a * b;
}
GEO_HOST_DEVICE float fadd(float a, float b) {
  return a + b;
}
GEO_HOST_DEVICE float fsub(float a, float b) {
  return a - b;
}
GEO_HOST_DEVICE float fdiv(float a, float b) {
  return a / b;
}
#endif

GEO_HOST_DEVICE uint32_t floatBits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}
GEO_HOST_DEVICE float bitsFloat(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

inline constexpr uint32_t kAbsMask = 0x7fffffffu;
inline constexpr uint32_t kInfBits = 0x7f800000u;  // |x| bits >= this: Inf or NaN
inline constexpr int kL2Lanes = 32;

GEO_HOST_DEVICE float qsgdLevels(int bits) {
  return static_cast<float>((1 << (bits - 1)) - 1);
}

// Per-bucket encode constants: y = (|w| * fac) * inv.
struct EncodeParams {
  float fac;
  float inv;
};

GEO_HOST_DEVICE EncodeParams encodeParams(float scale, float levels) {
  if (scale == 0.0f) return {0.0f, 0.0f};
  const float fac = scale < 0x1p-60f ? 0x1p64f : 1.0f;
  return {fac, fdiv(levels, fmul(scale, fac))};
}

// Each Philox4x32 block yields 8 16-bit randoms: element k uses half-word
// k % 8 (low half of word (k%8)/2 first) of block k / 8.
inline constexpr int kRandomsPerBlock = 8;

// The threshold u in (0, 1) on the 2^-16 grid's midpoints for 16 random bits:
// P(u < f) = round(f * 2^16) / 2^16, so rounding up is unbiased to within
// 2^-17 of a quantization step (and u is exact in fp32 on CPU and GPU).
GEO_HOST_DEVICE float uniformFromRandom16(uint32_t r16) {
  return static_cast<float>(2 * r16 + 1) * 0x1p-17f;
}

// The b-bit code of w (finite) given the bucket constants and 16 random bits.
GEO_HOST_DEVICE uint32_t quantizeOne(float w, uint32_t random, EncodeParams p, float levels,
                                     int signShift) {
  const uint32_t bits = floatBits(w);
  const float a = bitsFloat(bits & kAbsMask);
  float y = fmul(fmul(a, p.fac), p.inv);
  y = y < levels ? y : levels;
  const int l = static_cast<int>(y);  // y >= 0: truncation is floor
  const float frac = fsub(y, static_cast<float>(l));
  const uint32_t up = uniformFromRandom16(random) < frac ? 1u : 0u;
  return ((bits >> 31) << signShift) | (static_cast<uint32_t>(l) + up);
}

// Decode constants of one bucket for out += alpha * Q^-1(code). The magnitude
// is min((level * step) * unfac, cap): buckets with scale < 2^-60 work on
// scale * 2^64 and scale back once at the end, so subnormal scales do not lose
// their step to underflow; the clamp keeps level s of a bucket whose scale is
// near FLT_MAX from rounding up to Inf. The sign is the code's sign bit xor
// the sign of alpha, applied by flipping the sign bit (exact).
struct DecodeParams {
  float step;         // |alpha| * (scale * fac / s)
  float unfac;        // 1 / fac
  float cap;          // |alpha| * scale
  uint32_t signFlip;  // sign bit of alpha
};

GEO_HOST_DEVICE DecodeParams decodeParams(float scale, float levels, float alpha) {
  const uint32_t alphaBits = floatBits(alpha);
  const float absAlpha = bitsFloat(alphaBits & kAbsMask);
  const bool tiny = scale < 0x1p-60f;
  const float step = fdiv(fmul(scale, tiny ? 0x1p64f : 1.0f), levels);
  return {fmul(absAlpha, step), tiny ? 0x1p-64f : 1.0f, fmul(absAlpha, scale),
          alphaBits & ~kAbsMask};
}

GEO_HOST_DEVICE float dequantizeOne(uint32_t code, DecodeParams p, int signShift,
                                    uint32_t levelMask) {
  float mag = fmul(fmul(static_cast<float>(code & levelMask), p.step), p.unfac);
  mag = mag < p.cap ? mag : p.cap;
  return bitsFloat(floatBits(mag) ^ ((code >> signShift) << 31) ^ p.signFlip);
}

// The bucket scale from its statistics: the largest |w| (as bits) and the fp64
// sum of squares. Returns a negative value when the L2 norm overflows fp32.
GEO_HOST_DEVICE float bucketScale(uint32_t maxAbsBits, double sumSquares, bool l2) {
  if (!l2) return bitsFloat(maxAbsBits);
  const double norm = sqrt(sumSquares);
  return norm > 3.4028234663852886e38 ? -1.0f : static_cast<float>(norm);
}

}  // namespace geo::kernels::detail
