#pragma once
// Branch-free scalar fp16/bf16 conversions (host and device), written so that
// loops over them vectorize. The fp16 algorithms are those of Marat Dukhan's
// FP16 library (MIT): they let the FPU do the rounding, which is IEEE
// round-to-nearest-even, including subnormals. Internal to kernels/.

#include <cstdint>

#include "kernels/qsgd_math.h"

namespace geo::kernels::detail {

GEO_HOST_DEVICE uint16_t fp16FromFloat(float f) {
  const float scaleToInf = 0x1.0p+112f;
  const float scaleToZero = 0x1.0p-110f;
  float base = fmul(fmul(bitsFloat(floatBits(f) & kAbsMask), scaleToInf), scaleToZero);
  const uint32_t w = floatBits(f);
  const uint32_t shl1W = w + w;
  const uint32_t sign = w & 0x80000000u;
  uint32_t bias = shl1W & 0xFF000000u;
  bias = bias < 0x71000000u ? 0x71000000u : bias;
  base = fadd(bitsFloat((bias >> 1) + 0x07800000u), base);
  const uint32_t bits = floatBits(base);
  const uint32_t expBits = (bits >> 13) & 0x00007C00u;
  const uint32_t mantissaBits = bits & 0x00000FFFu;
  const uint32_t nonsign = expBits + mantissaBits;
  return static_cast<uint16_t>((sign >> 16) | (shl1W > 0xFF000000u ? 0x7E00u : nonsign));
}

GEO_HOST_DEVICE float fp16ToFloat(uint16_t h) {
  const uint32_t w = static_cast<uint32_t>(h) << 16;
  const uint32_t sign = w & 0x80000000u;
  const uint32_t twoW = w + w;
  const float normalized = fmul(bitsFloat((twoW >> 4) + (0xE0u << 23)), 0x1.0p-112f);
  const float denormalized = fsub(bitsFloat((twoW >> 17) | (126u << 23)), 0.5f);
  const uint32_t result =
      sign | (twoW < (1u << 27) ? floatBits(denormalized) : floatBits(normalized));
  return bitsFloat(result);
}

GEO_HOST_DEVICE uint16_t bf16FromFloat(float f) {
  const uint32_t u = floatBits(f);
  if ((u & kAbsMask) > kInfBits) return static_cast<uint16_t>((u >> 16) | 0x0040u);  // quiet NaN
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

GEO_HOST_DEVICE float bf16ToFloat(uint16_t h) {
  return bitsFloat(static_cast<uint32_t>(h) << 16);
}

}  // namespace geo::kernels::detail
