// CUDA fp32 <-> fp16 / bf16 casts (contract: kernels/casts.h; host API:
// kernels/qsgd_cuda.h). The conversions are those of casts_math.h, shared
// with the CPU; their fp32 operations are round-to-nearest intrinsics on the
// device, so results match the CPU bit for bit, with one exception handled
// here: see fp16ToFloatAsCpu. One thread converts 4 consecutive values per
// step (16-byte fp32 and 8-byte half accesses when the buffers allow it).

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/casts_math.h"
#include "kernels/cuda_launch.h"

namespace geo::kernels::detail {
namespace {

constexpr int kThreads = kCudaThreads;
constexpr int kWarpSize = 32;
constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kGroup = 4;

bool aligned(const void* p, uintptr_t alignment) {
  return reinterpret_cast<uintptr_t>(p) % alignment == 0;
}

// fp16ToFloat turns a NaN code into an fp32 NaN and multiplies it by 2^-112.
// A CPU returns that NaN quieted, payload and sign kept; a GPU returns its
// canonical NaN (0x7fffffff). Rebuild the CPU's bits for NaN codes so that
// decoding is bit-identical for all 65536 codes.
__device__ __forceinline__ float fp16ToFloatAsCpu(uint16_t h) {
  if ((h & 0x7FFFu) > 0x7C00u) {
    return bitsFloat(static_cast<uint32_t>(h & 0x8000u) << 16 | 0x7FC00000u |
                     static_cast<uint32_t>(h & 0x03FFu) << 13);
  }
  return fp16ToFloat(h);
}

template <HalfFormat kFormat>
__device__ __forceinline__ uint16_t toHalf(float f) {
  if constexpr (kFormat == HalfFormat::kBf16) {
    return bf16FromFloat(f);
  } else {
    return fp16FromFloat(f);
  }
}

template <HalfFormat kFormat>
__device__ __forceinline__ float fromHalf(uint16_t h) {
  if constexpr (kFormat == HalfFormat::kBf16) {
    return bf16ToFloat(h);
  } else {
    return fp16ToFloatAsCpu(h);
  }
}

// Exponent all ones: Inf or NaN (as casts_cpu.cc counts them).
template <HalfFormat kFormat>
__device__ __forceinline__ unsigned nonFinite(uint16_t h) {
  constexpr uint16_t kExpMask = kFormat == HalfFormat::kBf16 ? 0x7F80u : 0x7C00u;
  return (h & kExpMask) == kExpMask ? 1u : 0u;
}

template <HalfFormat kFormat>
__global__ void __launch_bounds__(kThreads)
    castToHalfKernel(const float* in, int64_t n, uint16_t* out, bool vec, DeviceStatus* status) {
  const int64_t groups = (n + kGroup - 1) / kGroup;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  unsigned long long bad = 0;
  for (int64_t g = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; g < groups;
       g += stride) {
    const int64_t k0 = g * kGroup;
    if (vec && n - k0 >= kGroup) {
      const float4 x = *reinterpret_cast<const float4*>(in + k0);
      const uint16_t h0 = toHalf<kFormat>(x.x);
      const uint16_t h1 = toHalf<kFormat>(x.y);
      const uint16_t h2 = toHalf<kFormat>(x.z);
      const uint16_t h3 = toHalf<kFormat>(x.w);
      *reinterpret_cast<uint2*>(out + k0) =
          make_uint2(h0 | static_cast<uint32_t>(h1) << 16, h2 | static_cast<uint32_t>(h3) << 16);
      bad += nonFinite<kFormat>(h0) + nonFinite<kFormat>(h1) + nonFinite<kFormat>(h2) +
             nonFinite<kFormat>(h3);
    } else {
      for (int64_t k = k0; k < n && k < k0 + kGroup; ++k) {
        out[k] = toHalf<kFormat>(in[k]);
        bad += nonFinite<kFormat>(out[k]);
      }
    }
  }
  // Every thread gets here (no early exit), so the whole warp shuffles.
  for (int width = kWarpSize / 2; width >= 1; width /= 2) {
    bad += __shfl_down_sync(kFullMask, bad, width);
  }
  if (threadIdx.x % kWarpSize == 0 && bad != 0) atomicAdd(&status->count, bad);
}

// out = x, or out + alpha * x in two rounded steps as on the CPU.
template <bool kAccumulate>
__device__ __forceinline__ float combine(float out, float alpha, float x) {
  if constexpr (kAccumulate) {
    return fadd(out, fmul(alpha, x));
  } else {
    return x;
  }
}

template <HalfFormat kFormat, bool kAccumulate>
__global__ void __launch_bounds__(kThreads)
    castFromHalfKernel(const uint16_t* in, int64_t n, float alpha, float* out, bool vec) {
  const int64_t groups = (n + kGroup - 1) / kGroup;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t g = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; g < groups;
       g += stride) {
    const int64_t k0 = g * kGroup;
    if (vec && n - k0 >= kGroup) {
      const uint2 h = *reinterpret_cast<const uint2*>(in + k0);
      float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if constexpr (kAccumulate) o = *reinterpret_cast<const float4*>(out + k0);
      o.x = combine<kAccumulate>(o.x, alpha, fromHalf<kFormat>(static_cast<uint16_t>(h.x)));
      o.y = combine<kAccumulate>(o.y, alpha, fromHalf<kFormat>(static_cast<uint16_t>(h.x >> 16)));
      o.z = combine<kAccumulate>(o.z, alpha, fromHalf<kFormat>(static_cast<uint16_t>(h.y)));
      o.w = combine<kAccumulate>(o.w, alpha, fromHalf<kFormat>(static_cast<uint16_t>(h.y >> 16)));
      *reinterpret_cast<float4*>(out + k0) = o;
    } else {
      for (int64_t k = k0; k < n && k < k0 + kGroup; ++k) {
        out[k] = combine<kAccumulate>(kAccumulate ? out[k] : 0.0f, alpha, fromHalf<kFormat>(in[k]));
      }
    }
  }
}

}  // namespace

cudaError_t launchCastToHalf(const float* in, int64_t n, uint16_t* out, HalfFormat format,
                             DeviceStatus* status, cudaStream_t stream) {
  const auto kernel = format == HalfFormat::kBf16 ? castToHalfKernel<HalfFormat::kBf16>
                                                  : castToHalfKernel<HalfFormat::kFp16>;
  int blocks = 0;
  const cudaError_t gridErr = gridFor(kernel, (n + kGroup - 1) / kGroup, kThreads, &blocks);
  if (gridErr != cudaSuccess) return gridErr;
  kernel<<<blocks, kThreads, 0, stream>>>(in, n, out, aligned(in, 16) && aligned(out, 8), status);
  return cudaGetLastError();
}

cudaError_t launchCastFromHalf(const uint16_t* in, int64_t n, HalfFormat format, bool accumulate,
                               float alpha, float* out, cudaStream_t stream) {
  const bool bf16 = format == HalfFormat::kBf16;
  const auto kernel = bf16 ? (accumulate ? castFromHalfKernel<HalfFormat::kBf16, true>
                                         : castFromHalfKernel<HalfFormat::kBf16, false>)
                           : (accumulate ? castFromHalfKernel<HalfFormat::kFp16, true>
                                         : castFromHalfKernel<HalfFormat::kFp16, false>);
  int blocks = 0;
  const cudaError_t gridErr = gridFor(kernel, (n + kGroup - 1) / kGroup, kThreads, &blocks);
  if (gridErr != cudaSuccess) return gridErr;
  kernel<<<blocks, kThreads, 0, stream>>>(in, n, alpha, out, aligned(in, 8) && aligned(out, 16));
  return cudaGetLastError();
}

}  // namespace geo::kernels::detail
