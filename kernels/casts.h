#pragma once
// fp32 <-> fp16 / bf16 casts: the cheap codecs (2x smaller, no randomness).
//
// Encoding rounds to nearest, ties to even, exactly as IEEE 754 and CUDA's
// __float2half_rn / __float2bfloat16_rn: finite values too large for the target
// become ±Inf, NaN stays NaN (quiet). Decoding is exact. The encoders return
// how many outputs are not finite (overflow, or Inf/NaN input) so a codec can
// refuse to send them; they never throw on values.
//
// Threading: callable concurrently on disjoint buffers; runs on the calling
// thread (these loops are memory-bound; one core saturates them at the sizes
// the synchronizers send per tensor). Null pointers with n > 0 throw geo::Error.

#include <cstdint>

namespace geo::kernels {

int64_t castToFp16(const float* in, int64_t n, uint16_t* out);
int64_t castToBf16(const float* in, int64_t n, uint16_t* out);
void castFromFp16(const uint16_t* in, int64_t n, float* out);
void castFromBf16(const uint16_t* in, int64_t n, float* out);
// out[k] = out[k] + alpha * decoded(in[k]): fused decode + axpy for averaging.
void accumulateFp16(const uint16_t* in, int64_t n, float alpha, float* out);
void accumulateBf16(const uint16_t* in, int64_t n, float alpha, float* out);

}  // namespace geo::kernels
