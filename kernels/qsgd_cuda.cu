// CUDA QSGD kernels (contract and wire layout: kernels/qsgd.h; host API:
// kernels/qsgd_cuda.h). They reproduce the CPU kernels bit for bit:
//
//  - Per-element arithmetic is detail::quantizeOne / dequantizeOne /
//    encodeParams / bucketScale of qsgd_math.h, which map every fp32 operation
//    to a round-to-nearest intrinsic (__fmul_rn, ...) on the device, so nvcc
//    cannot contract them into FMAs; the few operations written here use the
//    same helpers (fadd, fsub) and the fp64 ones __dmul_rn / __dadd_rn.
//    Per-bucket constants come from encodeParams / decodeParams exactly as on
//    the CPU (decodeParams with alpha = 1 for the residual and plain decode).
//  - The L2 sum of squares has the CPU's order by construction: lane k % 32
//    of the warp that owns a bucket accumulates its elements in ascending
//    order, then __shfl_down_sync adds lanes pairwise (16, 8, 4, 2, 1).
//  - Element k takes 16-bit half-word k % 8 of Philox block k / 8.
//
// Encoding is two kernels: one warp per bucket computes the scales (and flags
// NaN/Inf or an L2 overflow), then one thread per group of 8 consecutive
// elements -- exactly one Philox block and exactly b code bytes, so no two
// threads share an output byte -- quantizes. The second kernel reads the flag
// first and does nothing when it is set, so a failing call never touches the
// residual. Decoding is likewise a scale check, then one thread per 8 values.
// When the bucket size is a multiple of 8 (the default 512 is), no group spans
// two buckets and the quantize kernel's full groups skip the per-element
// bucket and length checks (decoding, bound by memory, keeps them).

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda_launch.h"
#include "kernels/philox.h"
#include "kernels/qsgd_limits.h"
#include "kernels/qsgd_math.h"

namespace geo::kernels::detail {
namespace {

constexpr int kThreads = kCudaThreads;
constexpr int kWarpSize = 32;
constexpr unsigned kFullMask = 0xffffffffu;
// Elements per thread step: one Philox block of randoms, b bytes of codes.
constexpr int kGroup = kRandomsPerBlock;
// Loads each lane issues before it accumulates, in the scale kernel (more
// bytes in flight; the per-lane order of the sums is unchanged).
constexpr int kScaleUnroll = 4;

static_assert(kL2Lanes == kWarpSize, "the L2 summation order is that of one warp's lanes");
static_assert(kGroup == 8, "a group of 8 values fills whole code bytes for every b");

// Alignment facts about one call's buffers (uniform branches in the kernels).
struct Layout {
  bool vecIo;          // fp32 buffers 16-byte aligned: float4 accesses
  bool scalesAligned;  // payload 4-byte aligned: fp32 scale accesses
  bool codesAligned;   // code bytes b-byte aligned: one access per group
};

// Grid-stride walk over groups of kGroup elements. Stepping a thread's group
// by the grid stride moves its first element by strideBuckets * d +
// strideOffset, so threads track their bucket without dividing per group.
struct GroupWalk {
  int64_t numGroups;
  int64_t strideBuckets;
  int32_t strideOffset;
  int32_t d;  // bucket size (<= kQsgdMaxBucket, see validateQsgdConfig)
};
// advance() adds two offsets below d in int32.
static_assert(2 * (kQsgdMaxBucket - 1) <= INT32_MAX, "kQsgdMaxBucket overflows the bucket cursor");

GroupWalk makeWalk(int64_t n, int64_t d, int blocks) {
  const int64_t strideElems = int64_t{kGroup} * blocks * kThreads;
  return {(n + kGroup - 1) / kGroup, strideElems / d, static_cast<int32_t>(strideElems % d),
          static_cast<int32_t>(d)};
}

// The bucket of an element and the element's index inside it.
struct BucketCursor {
  int64_t bucket;
  int32_t offset;
};

__device__ __forceinline__ BucketCursor cursorAt(int64_t k, int32_t d) {
  return {k / d, static_cast<int32_t>(k % d)};
}

__device__ __forceinline__ void advance(BucketCursor& c, const GroupWalk& walk) {
  c.bucket += walk.strideBuckets;
  c.offset += walk.strideOffset;  // both < d <= kQsgdMaxBucket: no overflow
  if (c.offset >= walk.d) {
    c.offset -= walk.d;
    ++c.bucket;
  }
}

// Scales are the fp32 at byte 4*b of a payload that may start at any address
// (it can follow a header in a message buffer); aligned payloads use one
// access, others four byte accesses (little-endian, as on the CPU).
__device__ __forceinline__ float loadScale(const uint8_t* payload, int64_t b, bool aligned) {
  if (aligned) return reinterpret_cast<const float*>(payload)[b];
  const uint8_t* p = payload + 4 * b;
  return bitsFloat(static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
                   static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24);
}

__device__ __forceinline__ void storeScale(uint8_t* payload, int64_t b, float scale, bool aligned) {
  if (aligned) {
    reinterpret_cast<float*>(payload)[b] = scale;
    return;
  }
  const uint32_t u = floatBits(scale);
  uint8_t* p = payload + 4 * b;
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(u >> (8 * i));
}

template <int kBits>
struct CodeWord;
template <>
struct CodeWord<2> {
  using Type = uint16_t;
};
template <>
struct CodeWord<4> {
  using Type = uint32_t;
};
template <>
struct CodeWord<8> {
  using Type = uint64_t;
};

// The first `bytes` (kBits for a full group, fewer for the tensor's last
// group, which must not write past the payload) code bytes of a group.
template <int kBits>
__device__ __forceinline__ void storeCodes(uint8_t* p, uint64_t packed, int bytes, bool aligned) {
  if (aligned && bytes == kBits) {
    *reinterpret_cast<typename CodeWord<kBits>::Type*>(p) =
        static_cast<typename CodeWord<kBits>::Type>(packed);
    return;
  }
  for (int i = 0; i < bytes; ++i) p[i] = static_cast<uint8_t>(packed >> (8 * i));
}

template <int kBits>
__device__ __forceinline__ uint64_t loadCodes(const uint8_t* p, int bytes, bool aligned) {
  if (aligned && bytes == kBits) return *reinterpret_cast<const typename CodeWord<kBits>::Type*>(p);
  uint64_t packed = 0;
  for (int i = 0; i < bytes; ++i) packed |= static_cast<uint64_t>(p[i]) << (8 * i);
  return packed;
}

// v[0, count) = p[0, count), the rest 0; a full group of a 16-byte aligned
// buffer is two float4 loads (p + 8g is then 32-byte aligned).
__device__ __forceinline__ void loadGroup(const float* p, int count, bool vec, float (&v)[kGroup]) {
  if (vec && count == kGroup) {
    const float4 lo = reinterpret_cast<const float4*>(p)[0];
    const float4 hi = reinterpret_cast<const float4*>(p)[1];
    v[0] = lo.x;
    v[1] = lo.y;
    v[2] = lo.z;
    v[3] = lo.w;
    v[4] = hi.x;
    v[5] = hi.y;
    v[6] = hi.z;
    v[7] = hi.w;
    return;
  }
#pragma unroll
  for (int j = 0; j < kGroup; ++j) v[j] = j < count ? p[j] : 0.0f;
}

__device__ __forceinline__ void storeGroup(float* p, int count, bool vec,
                                           const float (&v)[kGroup]) {
  if (vec && count == kGroup) {
    reinterpret_cast<float4*>(p)[0] = make_float4(v[0], v[1], v[2], v[3]);
    reinterpret_cast<float4*>(p)[1] = make_float4(v[4], v[5], v[6], v[7]);
    return;
  }
#pragma unroll
  for (int j = 0; j < kGroup; ++j) {
    if (j < count) p[j] = v[j];
  }
}

// ---- encode ------------------------------------------------------------------

// The value being quantized: in[i], or in[i] + residual[i] in fp32 as on the CPU.
template <bool kFeedback>
__device__ __forceinline__ float encodedValue(const float* v, const float* e, int32_t i) {
  if constexpr (kFeedback) {
    return fadd(v[i], e[i]);
  } else {
    return v[i];
  }
}

template <bool kL2>
__device__ __forceinline__ void accumulateStats(float w, uint32_t& maxBits, double& sum) {
  const uint32_t a = floatBits(w) & kAbsMask;
  maxBits = a > maxBits ? a : maxBits;
  if constexpr (kL2) {
    const double x = w;
    sum = __dadd_rn(sum, __dmul_rn(x, x));
  }
}

// Bucket scales into payload[0, 4B). A segment of `lanes` = 2^lanesLog2 lanes
// owns a bucket: 32 lanes for d >= 32; for smaller d the smallest power of two
// >= d, so a warp handles 32 / lanes buckets at once. With d <= lanes every
// lane holds at most element k = lane, and the CPU's extra tree levels over
// the (zero) lanes >= lanes only add +0 to non-negative sums, which changes
// nothing. Buckets are visited last to first so that what is still in L2 when
// this kernel ends is the start of the input, where the quantize kernel
// begins. Non-encodable buckets get scale 0 and set status->error.
template <bool kFeedback, bool kL2>
__global__ void __launch_bounds__(kThreads)
    qsgdScalesKernel(QsgdEncodeArgs a, int lanesLog2, bool scalesAligned, DeviceStatus* status) {
  const int lanes = 1 << lanesLog2;
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int sub = lane & (lanes - 1);
  const int64_t bucketsPerWarp = kWarpSize >> lanesLog2;
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) / kWarpSize;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (kThreads / kWarpSize);
  const int64_t d = a.bucketSize;
  // `first` is uniform across the warp, so every lane reaches the shuffles.
  for (int64_t first = warp * bucketsPerWarp; first < a.numBuckets;
       first += warps * bucketsPerWarp) {
    const int64_t slot = first + (lane >> lanesLog2);
    const bool valid = slot < a.numBuckets;
    const int64_t bucket = a.numBuckets - 1 - slot;
    uint32_t maxBits = 0;
    double sum = 0.0;
    if (valid) {
      const int64_t start = bucket * d;
      const int32_t len = static_cast<int32_t>(a.n - start < d ? a.n - start : d);
      const float* v = a.in + start;
      const float* e = kFeedback ? a.residual + start : nullptr;
      int32_t i = sub;
      for (; i + (kScaleUnroll - 1) * lanes < len; i += kScaleUnroll * lanes) {
        float w[kScaleUnroll];
#pragma unroll
        for (int u = 0; u < kScaleUnroll; ++u) w[u] = encodedValue<kFeedback>(v, e, i + u * lanes);
#pragma unroll
        for (int u = 0; u < kScaleUnroll; ++u) accumulateStats<kL2>(w[u], maxBits, sum);
      }
      for (; i < len; i += lanes) {
        accumulateStats<kL2>(encodedValue<kFeedback>(v, e, i), maxBits, sum);
      }
    }
    for (int width = lanes / 2; width >= 1; width /= 2) {
      const uint32_t m = __shfl_down_sync(kFullMask, maxBits, width, lanes);
      maxBits = m > maxBits ? m : maxBits;
      if constexpr (kL2) sum = __dadd_rn(sum, __shfl_down_sync(kFullMask, sum, width, lanes));
    }
    if (valid && sub == 0) {
      float scale = 0.0f;
      bool ok = maxBits < kInfBits;  // otherwise NaN or Inf in the bucket
      if (ok) {
        scale = bucketScale(maxBits, sum, kL2);
        ok = scale >= 0.0f;  // negative: the L2 norm overflows fp32
      }
      if (!ok) {
        scale = 0.0f;
        atomicOr(&status->error, 1ull);
      }
      storeScale(a.out, bucket, scale, scalesAligned);
    }
  }
}

// Codes (and, with feedback, residual = w - Q(w)) of groups of 8 elements;
// group g uses Philox block g and writes code bytes [g*b, g*b + b).
// kInOneBucket (d % 8 == 0): no group spans two buckets, so a full group takes
// one scale and quantizes without a bucket or length check per element. The
// kernel is bound by instruction issue (on an H200: 3 of 4 instructions a
// cycle, a third of the memory bandwidth), so those checks cost time.
template <int kBits, bool kFeedback, bool kInOneBucket>
__global__ void __launch_bounds__(kThreads)
    qsgdQuantizeKernel(QsgdEncodeArgs a, GroupWalk walk, Layout layout,
                       const DeviceStatus* status) {
  // Written by qsgdScalesKernel, which completed before this kernel started.
  if (status->error != 0) return;
  constexpr int kSignShift = kBits - 1;
  constexpr uint32_t kLevelMask = (1u << kSignShift) - 1;
  const float levels = qsgdLevels(kBits);
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  if (first >= walk.numGroups) return;
  uint8_t* codes = a.out + 4 * a.numBuckets;
  BucketCursor cursor = cursorAt(first * kGroup, walk.d);
  for (int64_t g = first; g < walk.numGroups; g += stride, advance(cursor, walk)) {
    const int64_t k0 = g * kGroup;
    const int count = a.n - k0 < kGroup ? static_cast<int>(a.n - k0) : kGroup;
    float v[kGroup];
    float e[kGroup];
    loadGroup(a.in + k0, count, layout.vecIo, v);
    if constexpr (kFeedback) loadGroup(a.residual + k0, count, layout.vecIo, e);
    const Philox4x32 random = philoxBlock(a.key.seed, a.key.stream, static_cast<uint64_t>(g));

    int64_t bucket = cursor.bucket;
    int32_t offset = cursor.offset;
    float scale = loadScale(a.out, bucket, layout.scalesAligned);
    EncodeParams params = encodeParams(scale, levels);
    DecodeParams back{};  // Q(w), for the residual
    if constexpr (kFeedback) back = decodeParams(scale, levels, 1.0f);
    uint64_t packed = 0;
    if (kInOneBucket && count == kGroup) {
#pragma unroll
      for (int j = 0; j < kGroup; ++j) {
        float w = v[j];
        if constexpr (kFeedback) w = fadd(v[j], e[j]);
        const uint32_t r16 = (random.v[j / 2] >> (16 * (j % 2))) & 0xffffu;
        const uint32_t code = quantizeOne(w, r16, params, levels, kSignShift);
        packed |= static_cast<uint64_t>(code) << (kBits * j);
        if constexpr (kFeedback) e[j] = fsub(w, dequantizeOne(code, back, kSignShift, kLevelMask));
      }
    } else {
#pragma unroll
      for (int j = 0; j < kGroup; ++j) {
        if (j < count) {
          if (offset == walk.d) {  // element k0 + j starts the next bucket
            ++bucket;
            offset = 0;
            scale = loadScale(a.out, bucket, layout.scalesAligned);
            params = encodeParams(scale, levels);
            if constexpr (kFeedback) back = decodeParams(scale, levels, 1.0f);
          }
          float w = v[j];
          if constexpr (kFeedback) w = fadd(v[j], e[j]);
          const uint32_t r16 = (random.v[j / 2] >> (16 * (j % 2))) & 0xffffu;
          const uint32_t code = quantizeOne(w, r16, params, levels, kSignShift);
          packed |= static_cast<uint64_t>(code) << (kBits * j);
          if constexpr (kFeedback)
            e[j] = fsub(w, dequantizeOne(code, back, kSignShift, kLevelMask));
          ++offset;
        }
      }
    }
    const int bytes = count == kGroup ? kBits : (count * kBits + 7) / 8;
    storeCodes<kBits>(codes + g * kBits, packed, bytes, layout.codesAligned);
    if constexpr (kFeedback) storeGroup(a.residual + k0, count, layout.vecIo, e);
  }
}

// ---- decode ------------------------------------------------------------------

// Marks the smallest bucket whose scale is negative (including -0), Inf or
// NaN: the CPU's check `scale >= 0 && bits < Inf bits`.
__global__ void __launch_bounds__(kThreads)
    qsgdCheckScalesKernel(const uint8_t* payload, int64_t numBuckets, bool aligned,
                          DeviceStatus* status) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t b = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; b < numBuckets;
       b += stride) {
    const float scale = loadScale(payload, b, aligned);
    if (!(scale >= 0.0f && floatBits(scale) < kInfBits)) {
      atomicMax(&status->error, ~static_cast<unsigned long long>(b));  // see DeviceStatus
    }
  }
}

template <int kBits, bool kAccumulate>
__global__ void __launch_bounds__(kThreads)
    qsgdDequantizeKernel(QsgdDecodeArgs a, GroupWalk walk, Layout layout,
                         const DeviceStatus* status) {
  // Written by qsgdCheckScalesKernel, which completed before this kernel.
  if (status->error != 0) return;
  constexpr int kSignShift = kBits - 1;
  constexpr uint32_t kLevelMask = (1u << kSignShift) - 1;
  constexpr uint32_t kCodeMask = (1u << kBits) - 1;
  const float levels = qsgdLevels(kBits);
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  if (first >= walk.numGroups) return;
  const uint8_t* codes = a.in + 4 * a.numBuckets;
  BucketCursor cursor = cursorAt(first * kGroup, walk.d);
  for (int64_t g = first; g < walk.numGroups; g += stride, advance(cursor, walk)) {
    const int64_t k0 = g * kGroup;
    const int count = a.n - k0 < kGroup ? static_cast<int>(a.n - k0) : kGroup;
    const int bytes = count == kGroup ? kBits : (count * kBits + 7) / 8;
    const uint64_t packed = loadCodes<kBits>(codes + g * kBits, bytes, layout.codesAligned);
    float o[kGroup];
    if constexpr (kAccumulate) loadGroup(a.out + k0, count, layout.vecIo, o);

    int64_t bucket = cursor.bucket;
    int32_t offset = cursor.offset;
    // alpha is 1 for a plain decode, as on the CPU.
    DecodeParams params =
        decodeParams(loadScale(a.in, bucket, layout.scalesAligned), levels, a.alpha);
#pragma unroll
    for (int j = 0; j < kGroup; ++j) {
      if (j < count) {
        if (offset == walk.d) {
          ++bucket;
          offset = 0;
          params = decodeParams(loadScale(a.in, bucket, layout.scalesAligned), levels, a.alpha);
        }
        const uint32_t code = static_cast<uint32_t>(packed >> (kBits * j)) & kCodeMask;
        const float x = dequantizeOne(code, params, kSignShift, kLevelMask);
        if constexpr (kAccumulate) {
          o[j] = fadd(o[j], x);
        } else {
          o[j] = x;
        }
        ++offset;
      }
    }
    storeGroup(a.out + k0, count, layout.vecIo, o);
  }
}

// ---- launchers ---------------------------------------------------------------

bool aligned(const void* p, uintptr_t alignment) {
  return reinterpret_cast<uintptr_t>(p) % alignment == 0;
}

// log2 of the lanes that own one bucket in qsgdScalesKernel.
int scaleLanesLog2(int64_t d) {
  int log2 = 0;
  while (log2 < 5 && (int64_t{1} << log2) < d) ++log2;
  return log2;
}

template <bool kFeedback, bool kL2>
cudaError_t launchScales(const QsgdEncodeArgs& a, bool scalesAligned, DeviceStatus* status,
                         cudaStream_t stream) {
  const int lanesLog2 = scaleLanesLog2(a.bucketSize);
  const int64_t bucketsPerBlock = (kThreads / kWarpSize) * (kWarpSize >> lanesLog2);
  const auto kernel = qsgdScalesKernel<kFeedback, kL2>;
  int blocks = 0;
  const cudaError_t gridErr = gridFor(kernel, a.numBuckets, bucketsPerBlock, &blocks);
  if (gridErr != cudaSuccess) return gridErr;
  kernel<<<blocks, kThreads, 0, stream>>>(a, lanesLog2, scalesAligned, status);
  return cudaGetLastError();
}

template <int kBits>
cudaError_t launchQuantize(const QsgdEncodeArgs& a, const Layout& layout, DeviceStatus* status,
                           cudaStream_t stream) {
  const bool inOneBucket = a.bucketSize % kGroup == 0;
  const bool feedback = a.residual != nullptr;
  const auto kernel = feedback ? (inOneBucket ? qsgdQuantizeKernel<kBits, true, true>
                                              : qsgdQuantizeKernel<kBits, true, false>)
                               : (inOneBucket ? qsgdQuantizeKernel<kBits, false, true>
                                              : qsgdQuantizeKernel<kBits, false, false>);
  int blocks = 0;
  const cudaError_t gridErr = gridFor(kernel, (a.n + kGroup - 1) / kGroup, kThreads, &blocks);
  if (gridErr != cudaSuccess) return gridErr;
  kernel<<<blocks, kThreads, 0, stream>>>(a, makeWalk(a.n, a.bucketSize, blocks), layout, status);
  return cudaGetLastError();
}

template <int kBits>
cudaError_t launchDequantize(const QsgdDecodeArgs& a, const Layout& layout, DeviceStatus* status,
                             cudaStream_t stream) {
  const auto kernel =
      a.accumulate ? qsgdDequantizeKernel<kBits, true> : qsgdDequantizeKernel<kBits, false>;
  int blocks = 0;
  const cudaError_t gridErr = gridFor(kernel, (a.n + kGroup - 1) / kGroup, kThreads, &blocks);
  if (gridErr != cudaSuccess) return gridErr;
  kernel<<<blocks, kThreads, 0, stream>>>(a, makeWalk(a.n, a.bucketSize, blocks), layout, status);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launchQsgdEncode(const QsgdEncodeArgs& a, DeviceStatus* status, cudaStream_t stream) {
  const uint8_t* codes = a.out + 4 * a.numBuckets;
  const Layout layout{aligned(a.in, 16) && (a.residual == nullptr || aligned(a.residual, 16)),
                      aligned(a.out, 4), aligned(codes, static_cast<uintptr_t>(a.bits))};
  const bool feedback = a.residual != nullptr;
  cudaError_t err = cudaSuccess;
  if (feedback && a.l2) {
    err = launchScales<true, true>(a, layout.scalesAligned, status, stream);
  } else if (feedback) {
    err = launchScales<true, false>(a, layout.scalesAligned, status, stream);
  } else if (a.l2) {
    err = launchScales<false, true>(a, layout.scalesAligned, status, stream);
  } else {
    err = launchScales<false, false>(a, layout.scalesAligned, status, stream);
  }
  if (err != cudaSuccess) return err;
  switch (a.bits) {
    case 2: return launchQuantize<2>(a, layout, status, stream);
    case 4: return launchQuantize<4>(a, layout, status, stream);
    case 8: return launchQuantize<8>(a, layout, status, stream);
    default: return cudaErrorInvalidValue;
  }
}

cudaError_t launchQsgdDecode(const QsgdDecodeArgs& a, DeviceStatus* status, cudaStream_t stream) {
  const uint8_t* codes = a.in + 4 * a.numBuckets;
  const Layout layout{aligned(a.out, 16), aligned(a.in, 4),
                      aligned(codes, static_cast<uintptr_t>(a.bits))};
  int blocks = 0;
  const cudaError_t gridErr = gridFor(qsgdCheckScalesKernel, a.numBuckets, kThreads, &blocks);
  if (gridErr != cudaSuccess) return gridErr;
  qsgdCheckScalesKernel<<<blocks, kThreads, 0, stream>>>(a.in, a.numBuckets, layout.scalesAligned,
                                                         status);
  if (const cudaError_t err = cudaGetLastError(); err != cudaSuccess) return err;
  switch (a.bits) {
    case 2: return launchDequantize<2>(a, layout, status, stream);
    case 4: return launchDequantize<4>(a, layout, status, stream);
    case 8: return launchDequantize<8>(a, layout, status, stream);
    default: return cudaErrorInvalidValue;
  }
}

bool cudaKernelsRunnable() noexcept {
  cudaFuncAttributes attributes{};
  const cudaError_t err = cudaFuncGetAttributes(&attributes, qsgdCheckScalesKernel);
  cudaGetLastError();  // clear it: a missing image is not sticky
  return err == cudaSuccess;
}

}  // namespace geo::kernels::detail
