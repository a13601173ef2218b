#pragma once
// QSGD stochastic quantization (Alistarh et al., NeurIPS 2017) on raw fp32
// buffers, CPU implementation. docs/architecture.md section 3 is the contract; this
// header pins down the exact arithmetic and the wire layout.
//
// Encoding of n values with b bits and bucket size d:
//   buckets   B = ceil(n / d); bucket j holds elements [j*d, min(n, (j+1)*d)).
//   scale     m_j = max_k |w_k| (kMaxAbs) or ||w||_2 (kL2Norm) over the bucket.
//   levels    s = 2^(b-1) - 1 (1, 7 or 127); code = sign << (b-1) | level.
//   level     y = (|w_k| * f) * (s / (m_j * f)), clamped to s, where f = 2^64
//             when m_j < 2^-60 and 1 otherwise (keeps s / m finite for tiny
//             buckets); l = floor(y); level = l + 1 if u_k < y - l else l.
//   random    r_k = 16-bit half-word k%8 (low half of word (k%8)/2 first) of
//             Philox4x32-10 block k/8 under key = seed, counter = (k/8,
//             stream) (kernels/philox.h); u_k = (2 r_k + 1) / 2^17. Rounding
//             is thus unbiased to within 2^-17 of a step (m_j / s) -- 16 bits
//             halve the generator's cost, which dominates encoding.
//   value     Q(w)_k = ±min((level * (m_j f / s)) / f, m_j) with f as above
//             (keeps subnormal steps exact; the clamp only matters when
//             m_j / s rounds up, for m_j near FLT_MAX).
// All arithmetic is IEEE fp32 in this order with no fused multiply-add, so the
// CUDA kernels (kernels/qsgd_cuda.h) produce the same bytes. The L2 norm is
// summed in fp64 in a fixed order: lane k%32 accumulates its elements in
// ascending order, then lanes are added pairwise (16, 8, 4, 2, 1).
//
// Wire layout (little-endian), exactly qsgdEncodedBytes(n, cfg) bytes:
//   B fp32 scales, then ceil(n*b/8) bytes of codes; element k occupies bits
//   [(k*b) % 8, +b) of code byte (k*b) / 8; unused high bits of the last byte
//   are zero.
//
// Threading: every function here may be called concurrently on disjoint
// buffers. Large inputs are split over OpenMP threads by whole buckets;
// `threads` = 0 uses omp_get_max_threads(), 1 runs on the calling thread only.
// Output does not depend on the thread count.
//
// Errors: bad configuration (bits or bucket size outside kernels/qsgd_limits.h,
// which every layer above states as its own limits), null pointers
// with n > 0, too small an output buffer, NaN/Inf input (encode), and scales
// that are not +0 or positive finite (decode: corrupt or hostile payload) throw
// geo::Error. Inputs and the error-feedback residual are never modified by a
// call that throws; the output buffer's contents are then unspecified.

#include <cstddef>
#include <cstdint>

#include "kernels/qsgd_limits.h"

namespace geo::kernels {

enum class QsgdScale : uint8_t { kMaxAbs = 0, kL2Norm = 1 };

struct QsgdConfig {
  int bits = 4;              // sign + level bits per value: one of kQsgdBits (2, 4, 8)
  int64_t bucketSize = 512;  // values per scale, kQsgdMinBucket..kQsgdMaxBucket (1..2^30)
  QsgdScale scale = QsgdScale::kMaxAbs;
};

// Names the random stream: the same (seed, stream) gives the same bytes. The
// synchronizers derive `stream` from (tensor id, round).
struct RngKey {
  uint64_t seed = 0;
  uint64_t stream = 0;
};

// The kernels' own check of their contract, in their own terms (`qsgd bits`,
// `qsgd bucket size`); callers that take these settings from users check them
// earlier against the same limits and name their own keys. Throws geo::Error
// naming the field, the value and the allowed values.
void validateQsgdConfig(const QsgdConfig& cfg);

// Checks shared by the CPU and CUDA front ends, so both report alike.
// Throws geo::Error unless alpha is finite.
void validateQsgdAlpha(float alpha);
// Throws the encoder's error (NaN/Inf input, or an L2 norm overflowing fp32)
// unless `encodable`; `feedback`: the failure was found in the check that
// runs before the residual is touched.
void enforceQsgdEncodable(bool encodable, bool feedback, const QsgdConfig& cfg);

int64_t qsgdNumBuckets(int64_t n, const QsgdConfig& cfg);
int64_t qsgdCodeBytes(int64_t n, const QsgdConfig& cfg);
// Exact encoded size in bytes: 4 * qsgdNumBuckets + qsgdCodeBytes.
int64_t qsgdEncodedBytes(int64_t n, const QsgdConfig& cfg);

// Quantizes in[0, n) into out[0, outBytes). With `residual` non-null (error
// feedback) it quantizes w = in + residual and then stores
// residual = w - Q(w); residual may not alias `in`.
void qsgdEncode(const float* in, int64_t n, const QsgdConfig& cfg, RngKey key, uint8_t* out,
                int64_t outBytes, float* residual = nullptr, int threads = 0);

// out[k] = Q(w)_k for the encoding in[0, inBytes) of n values.
void qsgdDecode(const uint8_t* in, int64_t inBytes, int64_t n, const QsgdConfig& cfg, float* out,
                int threads = 0);

// out[k] = out[k] + alpha * Q(w)_k, computed as ±min((level * (|alpha| *
// (m_j f / s))) / f, |alpha| * m_j) with the sign of alpha folded in: fused
// decode + axpy, what averaging needs. With alpha = 1 (or any power of two, barring
// underflow) it adds exactly alpha times what qsgdDecode writes.
void qsgdDecodeAccumulate(const uint8_t* in, int64_t inBytes, int64_t n, const QsgdConfig& cfg,
                          float alpha, float* out, int threads = 0);

}  // namespace geo::kernels
