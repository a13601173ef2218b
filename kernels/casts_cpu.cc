#include "common/enforce.h"
#include "kernels/casts.h"
#include "kernels/casts_math.h"
#include "kernels/simd.h"

namespace geo::kernels {

namespace {

void checkArgs(const void* in, int64_t n, const void* out) {
  GEO_ENFORCE(n >= 0, "element count must be >= 0, got {}", n);
  GEO_ENFORCE(n == 0 || (in != nullptr && out != nullptr), "null buffer with n = {}", n);
}

// Exponent all ones: Inf or NaN (works for fp16 and bf16 given the mask).
constexpr bool nonFinite16(uint16_t h, uint16_t expMask) {
  return (h & expMask) == expMask;
}

GEO_VECTOR_CLONES int64_t toFp16(const float* in, int64_t n, uint16_t* out) {
  int64_t bad = 0;
  for (int64_t k = 0; k < n; ++k) {
    out[k] = detail::fp16FromFloat(in[k]);
    bad += nonFinite16(out[k], 0x7C00) ? 1 : 0;
  }
  return bad;
}

GEO_VECTOR_CLONES int64_t toBf16(const float* in, int64_t n, uint16_t* out) {
  int64_t bad = 0;
  for (int64_t k = 0; k < n; ++k) {
    out[k] = detail::bf16FromFloat(in[k]);
    bad += nonFinite16(out[k], 0x7F80) ? 1 : 0;
  }
  return bad;
}

template <bool kBf16, bool kAccumulate>
GEO_VECTOR_CLONES void fromHalf(const uint16_t* in, int64_t n, float alpha, float* out) {
  for (int64_t k = 0; k < n; ++k) {
    const float x = kBf16 ? detail::bf16ToFloat(in[k]) : detail::fp16ToFloat(in[k]);
    if constexpr (kAccumulate) {
      out[k] = out[k] + alpha * x;
    } else {
      out[k] = x;
    }
  }
}

}  // namespace

int64_t castToFp16(const float* in, int64_t n, uint16_t* out) {
  checkArgs(in, n, out);
  return toFp16(in, n, out);
}

int64_t castToBf16(const float* in, int64_t n, uint16_t* out) {
  checkArgs(in, n, out);
  return toBf16(in, n, out);
}

void castFromFp16(const uint16_t* in, int64_t n, float* out) {
  checkArgs(in, n, out);
  fromHalf<false, false>(in, n, 1.0f, out);
}

void castFromBf16(const uint16_t* in, int64_t n, float* out) {
  checkArgs(in, n, out);
  fromHalf<true, false>(in, n, 1.0f, out);
}

void accumulateFp16(const uint16_t* in, int64_t n, float alpha, float* out) {
  checkArgs(in, n, out);
  fromHalf<false, true>(in, n, alpha, out);
}

void accumulateBf16(const uint16_t* in, int64_t n, float alpha, float* out) {
  checkArgs(in, n, out);
  fromHalf<true, true>(in, n, alpha, out);
}

}  // namespace geo::kernels
