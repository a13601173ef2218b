// CPU QSGD kernels. Work is cut into blocks of whole buckets (start a multiple
// of 8 elements so blocks never share an output byte) that OpenMP threads take
// in parallel; inside a block, bucket scales are computed first and then the
// values are quantized tile by tile while the block is still in cache. The hot
// loops are written so GCC vectorizes them (checked with -fopt-info-vec) and
// are multi-versioned for AVX2 / AVX-512 (kernels/simd.h).

#include <omp.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "common/enforce.h"
#include "kernels/qsgd.h"
#include "kernels/qsgd_math.h"
#include "kernels/simd.h"

static_assert(std::endian::native == std::endian::little,
              "the QSGD wire format is little-endian; add byte swaps for this host");

namespace geo::kernels {

using detail::EncodeParams;

namespace {

constexpr int64_t kTile = 512;             // elements per tile (multiple of 32)
constexpr int64_t kBlockTarget = 1 << 14;  // elements per parallel work block
constexpr int64_t kParallelMin = 1 << 16;  // below this, one thread is faster

int resolveThreads(int threads) {
  GEO_ENFORCE(threads >= 0, "threads must be >= 0 (0 = all OpenMP threads), got {}", threads);
  return threads == 0 ? omp_get_max_threads() : threads;
}

// ---- hot loops -------------------------------------------------------------

// The 16-bit randoms of elements [8*block0, 8*(block0 + nBlocks)): block j
// yields 8 of them, element 8j+h taking half-word h (see qsgd_math.h), i.e.
// the four 32-bit words of each block stored in order (little-endian). The
// portable loop vectorizes (the 10 rounds unroll inside it); AVX-512 has a
// hand-written path that is about twice as fast, and the generator is most of
// the cost of encoding.
GEO_VECTOR_CLONES void philoxFillPortable(RngKey key, uint64_t block0, int64_t nBlocks,
                                          uint32_t* __restrict out) {
  for (int64_t j = 0; j < nBlocks; ++j) {
    const Philox4x32 r = philoxBlock(key.seed, key.stream, block0 + static_cast<uint64_t>(j));
    for (int w = 0; w < 4; ++w) out[4 * j + w] = r.v[w];
  }
}

#if defined(__x86_64__) && defined(__GNUC__)
#define GEO_HAVE_AVX512_PHILOX 1
// GCC 12's AVX-512 headers initialize "undefined" operands from themselves,
// which -Wmaybe-uninitialized reports at every use (GCC PR 105593).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
// (hi, lo) of the 32x32->64 products x * m in all 16 lanes.
__attribute__((target("avx512f"))) inline void mulHiLo(__m512i x, __m512i m, __m512i* hi,
                                                       __m512i* lo) {
  const __m512i even = _mm512_mul_epu32(x, m);
  const __m512i odd = _mm512_mul_epu32(_mm512_srli_epi64(x, 32), m);
  *hi = _mm512_mask_blend_epi32(0xAAAA, _mm512_srli_epi64(even, 32), odd);
  *lo = _mm512_mask_blend_epi32(0xAAAA, even, _mm512_slli_epi64(odd, 32));
}

// 16 blocks per iteration in structure-of-arrays form, then a 4x16 transpose
// to the per-block word order. nBlocks is rounded up to a multiple of 16, so
// `out` must have room for that.
__attribute__((target("avx512f"))) void philoxFillAvx512(RngKey key, uint64_t block0,
                                                         int64_t nBlocks, uint32_t* out) {
  const __m512i m0 = _mm512_set1_epi32(static_cast<int>(kPhiloxM0));
  const __m512i m1 = _mm512_set1_epi32(static_cast<int>(kPhiloxM1));
  const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  for (int64_t i = 0; i < nBlocks; i += 16) {
    const uint64_t first = block0 + static_cast<uint64_t>(i);
    __m512i c0 = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(first)), iota);
    // The high word carries where the low word of first + lane wrapped.
    const __mmask16 wrapped =
        _mm512_cmplt_epu32_mask(c0, _mm512_set1_epi32(static_cast<int>(first)));
    __m512i c1 = _mm512_mask_add_epi32(_mm512_set1_epi32(static_cast<int>(first >> 32)), wrapped,
                                       _mm512_set1_epi32(static_cast<int>(first >> 32)),
                                       _mm512_set1_epi32(1));
    __m512i c2 = _mm512_set1_epi32(static_cast<int>(key.stream));
    __m512i c3 = _mm512_set1_epi32(static_cast<int>(key.stream >> 32));
    uint32_t k0 = static_cast<uint32_t>(key.seed);
    uint32_t k1 = static_cast<uint32_t>(key.seed >> 32);
    for (int round = 0; round < kPhiloxRounds; ++round) {
      __m512i hi0, lo0, hi1, lo1;
      mulHiLo(c0, m0, &hi0, &lo0);
      mulHiLo(c2, m1, &hi1, &lo1);
      // 0x96 = a ^ b ^ c
      c0 = _mm512_ternarylogic_epi32(hi1, c1, _mm512_set1_epi32(static_cast<int>(k0)), 0x96);
      c2 = _mm512_ternarylogic_epi32(hi0, c3, _mm512_set1_epi32(static_cast<int>(k1)), 0x96);
      c1 = lo1;
      c3 = lo0;
      k0 += kPhiloxW0;
      k1 += kPhiloxW1;
    }
    // Transpose: within each 128-bit lane L, r_b holds block 4L+b's 4 words.
    const __m512i t0 = _mm512_unpacklo_epi32(c0, c1);
    const __m512i t1 = _mm512_unpackhi_epi32(c0, c1);
    const __m512i t2 = _mm512_unpacklo_epi32(c2, c3);
    const __m512i t3 = _mm512_unpackhi_epi32(c2, c3);
    const __m512i r0 = _mm512_unpacklo_epi64(t0, t2);
    const __m512i r1 = _mm512_unpackhi_epi64(t0, t2);
    const __m512i r2 = _mm512_unpacklo_epi64(t1, t3);
    const __m512i r3 = _mm512_unpackhi_epi64(t1, t3);
    const __m512i a = _mm512_shuffle_i32x4(r0, r1, _MM_SHUFFLE(2, 0, 2, 0));
    const __m512i b = _mm512_shuffle_i32x4(r2, r3, _MM_SHUFFLE(2, 0, 2, 0));
    const __m512i c = _mm512_shuffle_i32x4(r0, r1, _MM_SHUFFLE(3, 1, 3, 1));
    const __m512i d = _mm512_shuffle_i32x4(r2, r3, _MM_SHUFFLE(3, 1, 3, 1));
    uint32_t* o = out + 4 * i;
    _mm512_storeu_si512(o, _mm512_shuffle_i32x4(a, b, _MM_SHUFFLE(2, 0, 2, 0)));
    _mm512_storeu_si512(o + 16, _mm512_shuffle_i32x4(c, d, _MM_SHUFFLE(2, 0, 2, 0)));
    _mm512_storeu_si512(o + 32, _mm512_shuffle_i32x4(a, b, _MM_SHUFFLE(3, 1, 3, 1)));
    _mm512_storeu_si512(o + 48, _mm512_shuffle_i32x4(c, d, _MM_SHUFFLE(3, 1, 3, 1)));
  }
}
#pragma GCC diagnostic pop
#endif

// Fills 4 words per block for nBlocks blocks; `out` holds 4 * roundUp(nBlocks, 16).
void philoxFill(RngKey key, uint64_t block0, int64_t nBlocks, uint32_t* out) {
#if defined(GEO_HAVE_AVX512_PHILOX)
  static const bool avx512 = __builtin_cpu_supports("avx512f");
  if (avx512) return philoxFillAvx512(key, block0, nBlocks, out);
#endif
  philoxFillPortable(key, block0, nBlocks, out);
}

// Largest |v + e| as fp32 bits (integer max orders non-negative floats and
// puts Inf/NaN above every finite value, so one pass also detects them).
template <bool kFeedback>
GEO_VECTOR_CLONES uint32_t maxAbsBits(const float* v, const float* e, int64_t len) {
  uint32_t m = 0;
  for (int64_t k = 0; k < len; ++k) {
    const float w = kFeedback ? v[k] + e[k] : v[k];
    m = std::max(m, std::bit_cast<uint32_t>(w) & detail::kAbsMask);
  }
  return m;
}

// Sum of squares in fp64 in the fixed lane order of qsgd.h.
template <bool kFeedback>
GEO_VECTOR_CLONES double sumSquares(const float* v, const float* e, int64_t len) {
  constexpr int kLanes = detail::kL2Lanes;
  double acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= len; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) {
      const double w = kFeedback ? v[i + j] + e[i + j] : v[i + j];
      acc[j] += w * w;
    }
  }
  for (int j = 0; i + j < len; ++j) {
    const double w = kFeedback ? v[i + j] + e[i + j] : v[i + j];
    acc[j] += w * w;
  }
  for (int width = kLanes / 2; width >= 1; width /= 2) {
    for (int j = 0; j < width; ++j) acc[j] += acc[j + width];
  }
  return acc[0];
}

// Codes of one bucket segment; with feedback, also e = w - Q(w).
template <bool kFeedback>
GEO_VECTOR_CLONES void quantizeSegment(const float* v, float* e, const uint16_t* random,
                                       int64_t len, EncodeParams p, float levels,
                                       detail::DecodeParams dp, int signShift, uint8_t* codes) {
  const uint32_t levelMask = (1u << signShift) - 1;
  for (int64_t k = 0; k < len; ++k) {
    const float w = kFeedback ? v[k] + e[k] : v[k];
    const uint32_t code = detail::quantizeOne(w, random[k], p, levels, signShift);
    codes[k] = static_cast<uint8_t>(code);
    if constexpr (kFeedback) e[k] = w - detail::dequantizeOne(code, dp, signShift, levelMask);
  }
}

// out[k] (=|+=) ±level_k * step for one bucket segment.
template <bool kAccumulate>
GEO_VECTOR_CLONES void dequantizeSegment(const uint8_t* codes, int64_t len, detail::DecodeParams dp,
                                         int signShift, float* out) {
  const uint32_t levelMask = (1u << signShift) - 1;
  for (int64_t k = 0; k < len; ++k) {
    const float x = detail::dequantizeOne(codes[k], dp, signShift, levelMask);
    if constexpr (kAccumulate) {
      out[k] = out[k] + x;
    } else {
      out[k] = x;
    }
  }
}

// 8 one-byte codes (little-endian in a uint64) <-> 8*b bits.
template <int kBits>
inline uint64_t pack8(uint64_t x) {
  if constexpr (kBits == 2) {
    x = (x | (x >> 6)) & 0x00FF00FF00FF00FFull;
    x = (x | (x >> 12)) & 0x000000FF000000FFull;
    return (x | (x >> 24)) & 0xFFFFull;
  } else if constexpr (kBits == 4) {
    x = (x | (x >> 4)) & 0x00FF00FF00FF00FFull;
    x = (x | (x >> 8)) & 0x0000FFFF0000FFFFull;
    return (x | (x >> 16)) & 0xFFFFFFFFull;
  } else {
    return x;
  }
}

template <int kBits>
inline uint64_t unpack8(uint64_t x) {
  if constexpr (kBits == 2) {
    x = (x | (x << 24)) & 0x000000FF000000FFull;
    x = (x | (x << 12)) & 0x000F000F000F000Full;
    return (x | (x << 6)) & 0x0303030303030303ull;
  } else if constexpr (kBits == 4) {
    x = (x | (x << 16)) & 0x0000FFFF0000FFFFull;
    x = (x | (x << 8)) & 0x00FF00FF00FF00FFull;
    return (x | (x << 4)) & 0x0F0F0F0F0F0F0F0Full;
  } else {
    return x;
  }
}

// Packs codes[0, count) (count a multiple of 8) to `out` (count*b/8 bytes).
template <int kBits>
GEO_VECTOR_CLONES void packCodesT(const uint8_t* codes, int64_t count, uint8_t* out) {
  for (int64_t g = 0; g < count / 8; ++g) {
    uint64_t x;
    std::memcpy(&x, codes + 8 * g, 8);
    const uint64_t packed = pack8<kBits>(x);
    std::memcpy(out + g * kBits, &packed, kBits);
  }
}

void packCodes(const uint8_t* codes, int64_t count, int bits, uint8_t* out) {
  switch (bits) {
    case 2: return packCodesT<2>(codes, count, out);
    case 4: return packCodesT<4>(codes, count, out);
    default: std::memcpy(out, codes, static_cast<size_t>(count));
  }
}

// Inverse of packCodes: byteCount*8/b codes from `in`; reads exactly
// `byteCount` bytes (the last group may be partial).
template <int kBits>
GEO_VECTOR_CLONES void unpackCodesT(const uint8_t* in, int64_t byteCount, uint8_t* codes) {
  const int64_t groups = byteCount / kBits;
  for (int64_t g = 0; g < groups; ++g) {
    uint64_t x = 0;
    std::memcpy(&x, in + g * kBits, kBits);
    const uint64_t codes8 = unpack8<kBits>(x);
    std::memcpy(codes + 8 * g, &codes8, 8);
  }
  if (const int64_t rest = byteCount - groups * kBits; rest > 0) {
    uint64_t x = 0;
    std::memcpy(&x, in + groups * kBits, static_cast<size_t>(rest));
    const uint64_t codes8 = unpack8<kBits>(x);
    std::memcpy(codes + 8 * groups, &codes8, 8);
  }
}

void unpackCodes(const uint8_t* in, int64_t byteCount, int bits, uint8_t* codes) {
  switch (bits) {
    case 2: return unpackCodesT<2>(in, byteCount, codes);
    case 4: return unpackCodesT<4>(in, byteCount, codes);
    default: std::memcpy(codes, in, static_cast<size_t>(byteCount));
  }
}

// ---- drivers ---------------------------------------------------------------

struct Plan {
  int64_t n;
  int64_t d;
  int bits;
  int signShift;
  float levels;
  bool l2;
  int64_t buckets;
  int64_t blockElems;  // multiple of 8 and (for encode) of d
  int64_t blocks;
};

Plan makePlan(int64_t n, const QsgdConfig& cfg, bool bucketAlignedBlocks) {
  Plan p{};
  p.n = n;
  p.d = cfg.bucketSize;
  p.bits = cfg.bits;
  p.signShift = cfg.bits - 1;
  p.levels = detail::qsgdLevels(cfg.bits);
  p.l2 = cfg.scale == QsgdScale::kL2Norm;
  p.buckets = qsgdNumBuckets(n, cfg);
  int64_t unit = 8;
  if (bucketAlignedBlocks) unit = p.d * (8 / std::gcd<int64_t>(p.d, 8));
  p.blockElems = std::max(unit, kBlockTarget / unit * unit);
  p.blocks = n == 0 ? 0 : (n + p.blockElems - 1) / p.blockElems;
  return p;
}

void storeScale(uint8_t* out, int64_t bucket, float scale) {
  std::memcpy(out + 4 * bucket, &scale, 4);
}

float loadScale(const uint8_t* in, int64_t bucket) {
  float scale;
  std::memcpy(&scale, in + 4 * bucket, 4);
  return scale;
}

// Scales of the buckets in [begin, end). Returns false on a non-finite input
// or an L2 norm that overflows fp32 (the caller reports it after the loop).
template <bool kFeedback>
bool encodeScales(const Plan& p, const float* in, const float* res, int64_t begin, int64_t end,
                  float* scales) {
  bool ok = true;
  for (int64_t b = begin / p.d, i = 0; b * p.d < end; ++b, ++i) {
    const int64_t s = b * p.d;
    const int64_t len = std::min(p.n, s + p.d) - s;
    const uint32_t maxBits = maxAbsBits<kFeedback>(in + s, res + (kFeedback ? s : 0), len);
    if (maxBits >= detail::kInfBits) {
      ok = false;
      scales[i] = 0.0f;
      continue;
    }
    const double sq = p.l2 ? sumSquares<kFeedback>(in + s, res + (kFeedback ? s : 0), len) : 0.0;
    scales[i] = detail::bucketScale(maxBits, sq, p.l2);
    if (scales[i] < 0.0f) {
      ok = false;
      scales[i] = 0.0f;
    }
  }
  return ok;
}

// Whether every bucket in [begin, end) of in + res can be encoded: finite,
// and (L2) a norm that fits fp32. Cheap unless a bucket is near overflow.
bool blockEncodable(const Plan& p, const float* in, const float* res, int64_t begin, int64_t end) {
  for (int64_t s = begin; s < end; s += p.d) {
    const int64_t len = std::min(end, s + p.d) - s;
    const uint32_t maxBits = maxAbsBits<true>(in + s, res + s, len);
    if (maxBits >= detail::kInfBits) return false;
    const double bound = static_cast<double>(detail::bitsFloat(maxBits)) * std::sqrt(len);
    if (p.l2 && bound > 1e38 &&
        detail::bucketScale(maxBits, sumSquares<true>(in + s, res + s, len), true) < 0.0f) {
      return false;
    }
  }
  return true;
}

template <bool kFeedback>
bool encodeBlock(const Plan& p, const float* in, float* res, RngKey key, int64_t begin, int64_t end,
                 uint8_t* out, float* scales) {
  if (!encodeScales<kFeedback>(p, in, res, begin, end, scales)) return false;
  const int64_t firstBucket = begin / p.d;
  for (int64_t b = firstBucket; b * p.d < end; ++b) storeScale(out, b, scales[b - firstBucket]);

  uint8_t* codesOut = out + 4 * p.buckets;
  // 16-bit randoms viewed as the generator's 32-bit words (kTile/8 blocks,
  // a multiple of 16).
  alignas(64) uint32_t randomWords[kTile / 2];
  const auto* random = reinterpret_cast<const uint16_t*>(randomWords);
  alignas(64) uint8_t codes[kTile];
  for (int64_t t0 = begin; t0 < end; t0 += kTile) {
    const int64_t t1 = std::min(end, t0 + kTile);
    const int64_t count = t1 - t0;
    philoxFill(key, static_cast<uint64_t>(t0) / detail::kRandomsPerBlock,
               (count + detail::kRandomsPerBlock - 1) / detail::kRandomsPerBlock, randomWords);
    for (int64_t b = t0 / p.d; b * p.d < t1; ++b) {
      const int64_t s = std::max(t0, b * p.d);
      const int64_t e = std::min(t1, (b + 1) * p.d);
      const float scale = scales[b - firstBucket];
      const EncodeParams params = detail::encodeParams(scale, p.levels);
      const detail::DecodeParams dp = detail::decodeParams(scale, p.levels, 1.0f);
      quantizeSegment<kFeedback>(in + s, kFeedback ? res + s : nullptr, random + (s - t0), e - s,
                                 params, p.levels, dp, p.signShift, codes + (s - t0));
    }
    const int64_t padded = (count + 7) / 8 * 8;
    std::fill(codes + count, codes + padded, uint8_t{0});
    if (padded == count) {
      packCodes(codes, count, p.bits, codesOut + t0 * p.bits / 8);
    } else {  // the last tile of the tensor: write only the bytes that exist
      uint8_t tail[kTile];
      packCodes(codes, padded, p.bits, tail);
      std::memcpy(codesOut + t0 * p.bits / 8, tail, static_cast<size_t>((count * p.bits + 7) / 8));
    }
  }
  return true;
}

template <bool kAccumulate>
void decodeBlock(const Plan& p, const uint8_t* in, float alpha, int64_t begin, int64_t end,
                 float* out) {
  const uint8_t* codesIn = in + 4 * p.buckets;
  alignas(64) uint8_t codes[kTile];
  for (int64_t t0 = begin; t0 < end; t0 += kTile) {
    const int64_t t1 = std::min(end, t0 + kTile);
    const int64_t count = t1 - t0;
    unpackCodes(codesIn + t0 * p.bits / 8, (count * p.bits + 7) / 8, p.bits, codes);
    for (int64_t b = t0 / p.d; b * p.d < t1; ++b) {
      const int64_t s = std::max(t0, b * p.d);
      const int64_t e = std::min(t1, (b + 1) * p.d);
      const detail::DecodeParams dp = detail::decodeParams(loadScale(in, b), p.levels, alpha);
      dequantizeSegment<kAccumulate>(codes + (s - t0), e - s, dp, p.signShift, out + s);
    }
  }
}

void checkScales(const uint8_t* in, int64_t buckets) {
  for (int64_t b = 0; b < buckets; ++b) {
    const float scale = loadScale(in, b);
    // Sign bit clear and exponent not all ones: +0 or a positive finite value
    // (the encoder never writes -0).
    GEO_ENFORCE(std::bit_cast<uint32_t>(scale) < detail::kInfBits,
                "corrupt QSGD payload: scale of bucket {} is {} (must be +0 or positive finite)", b,
                scale);
  }
}

template <bool kAccumulate>
void decodeImpl(const uint8_t* in, int64_t inBytes, int64_t n, const QsgdConfig& cfg, float alpha,
                float* out, int threads) {
  validateQsgdConfig(cfg);
  GEO_ENFORCE(n >= 0, "element count must be >= 0, got {}", n);
  if (n == 0) return;
  GEO_ENFORCE(in != nullptr && out != nullptr, "null buffer with n = {}", n);
  GEO_ENFORCE_EQ(inBytes, qsgdEncodedBytes(n, cfg),
                 "QSGD payload size does not match {} values at {} bits, bucket {}", n, cfg.bits,
                 cfg.bucketSize);
  const Plan p = makePlan(n, cfg, /*bucketAlignedBlocks=*/false);
  checkScales(in, p.buckets);
  const int nThreads = n >= kParallelMin ? resolveThreads(threads) : 1;
#pragma omp parallel for num_threads(nThreads) schedule(static) if (nThreads > 1 && p.blocks > 1)
  for (int64_t blk = 0; blk < p.blocks; ++blk) {
    const int64_t begin = blk * p.blockElems;
    decodeBlock<kAccumulate>(p, in, alpha, begin, std::min(n, begin + p.blockElems), out);
  }
}

}  // namespace

void validateQsgdConfig(const QsgdConfig& cfg) {
  static_assert(kQsgdBits == std::array<int, 3>{2, 4, 8}, "update the message below");
  GEO_ENFORCE(isQsgdBits(cfg.bits), "qsgd bits must be 2, 4 or 8, got {}", cfg.bits);
  GEO_ENFORCE(cfg.bucketSize >= kQsgdMinBucket && cfg.bucketSize <= kQsgdMaxBucket,
              "qsgd bucket size must be in [{}, 2^{}], got {}", kQsgdMinBucket, kQsgdMaxBucketLog2,
              cfg.bucketSize);
  GEO_ENFORCE(cfg.scale == QsgdScale::kMaxAbs || cfg.scale == QsgdScale::kL2Norm,
              "qsgd scale must be max-abs or l2, got enum value {}", static_cast<int>(cfg.scale));
}

void validateQsgdAlpha(float alpha) {
  GEO_ENFORCE(std::bit_cast<uint32_t>(alpha) << 1 >> 24 != 0xff, "alpha must be finite, got {}",
              alpha);
}

void enforceQsgdEncodable(bool encodable, bool feedback, const QsgdConfig& cfg) {
  GEO_ENFORCE(encodable, "QSGD input{} contains NaN or Inf{}{}",
              feedback ? " + error-feedback residual" : "",
              cfg.scale == QsgdScale::kL2Norm
                  ? ", or a bucket's L2 norm overflows fp32 (use max-abs scaling)"
                  : "",
              feedback ? "" : " (output is not valid)");
}

int64_t qsgdNumBuckets(int64_t n, const QsgdConfig& cfg) {
  validateQsgdConfig(cfg);
  GEO_ENFORCE(n >= 0, "element count must be >= 0, got {}", n);
  return (n + cfg.bucketSize - 1) / cfg.bucketSize;
}

int64_t qsgdCodeBytes(int64_t n, const QsgdConfig& cfg) {
  validateQsgdConfig(cfg);
  GEO_ENFORCE(n >= 0 && n <= (int64_t{1} << 56), "element count must be in [0, 2^56], got {}", n);
  return (n * cfg.bits + 7) / 8;
}

int64_t qsgdEncodedBytes(int64_t n, const QsgdConfig& cfg) {
  return 4 * qsgdNumBuckets(n, cfg) + qsgdCodeBytes(n, cfg);
}

void qsgdEncode(const float* in, int64_t n, const QsgdConfig& cfg, RngKey key, uint8_t* out,
                int64_t outBytes, float* residual, int threads) {
  const int64_t need = qsgdEncodedBytes(n, cfg);
  if (n == 0) return;
  GEO_ENFORCE(in != nullptr && out != nullptr, "null buffer with n = {}", n);
  GEO_ENFORCE(outBytes >= need, "QSGD output buffer too small: {} bytes, need {}", outBytes, need);
  GEO_ENFORCE(residual != in, "residual must not alias the input");
  const Plan p = makePlan(n, cfg, /*bucketAlignedBlocks=*/true);
  const int nThreads = n >= kParallelMin ? resolveThreads(threads) : 1;
  const int64_t scalesPerBlock = p.blockElems / p.d;

  // Error feedback updates `residual` in place, so a bad bucket found late must
  // not leave earlier ones already modified: check every bucket first.
  if (residual != nullptr) {
    bool encodable = true;
#pragma omp parallel for num_threads(nThreads) schedule(static) reduction(&& : encodable) \
    if (nThreads > 1 && p.blocks > 1)
    for (int64_t blk = 0; blk < p.blocks; ++blk) {
      const int64_t begin = blk * p.blockElems;
      encodable =
          encodable && blockEncodable(p, in, residual, begin, std::min(n, begin + p.blockElems));
    }
    enforceQsgdEncodable(encodable, /*feedback=*/true, cfg);
  }

  bool ok = true;
#pragma omp parallel num_threads(nThreads) if (nThreads > 1 && p.blocks > 1) reduction(&& : ok)
  {
    std::vector<float> scales(static_cast<size_t>(scalesPerBlock));
#pragma omp for schedule(static)
    for (int64_t blk = 0; blk < p.blocks; ++blk) {
      const int64_t begin = blk * p.blockElems;
      const int64_t end = std::min(n, begin + p.blockElems);
      const bool blockOk =
          residual ? encodeBlock<true>(p, in, residual, key, begin, end, out, scales.data())
                   : encodeBlock<false>(p, in, nullptr, key, begin, end, out, scales.data());
      ok = ok && blockOk;
    }
  }
  enforceQsgdEncodable(ok, /*feedback=*/false, cfg);
}

void qsgdDecode(const uint8_t* in, int64_t inBytes, int64_t n, const QsgdConfig& cfg, float* out,
                int threads) {
  decodeImpl<false>(in, inBytes, n, cfg, 1.0f, out, threads);
}

void qsgdDecodeAccumulate(const uint8_t* in, int64_t inBytes, int64_t n, const QsgdConfig& cfg,
                          float alpha, float* out, int threads) {
  validateQsgdAlpha(alpha);
  decodeImpl<true>(in, inBytes, n, cfg, alpha, out, threads);
}

}  // namespace geo::kernels
