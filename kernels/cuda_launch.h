#pragma once
// Internal to kernels/: the thin boundary between the CUDA translation units
// (qsgd_cuda.cu, casts_cuda.cu: kernels and their launch configuration) and
// the host wrappers of qsgd_cuda.h (cuda_runtime.cc: argument checks, scratch,
// synchronization and geo::Error). Launchers validate nothing: the caller has
// checked sizes, pointers and the configuration. They return the first CUDA
// error (cudaSuccess when every launch was queued).

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>

#include "kernels/qsgd.h"

namespace geo::kernels::detail {

// Device-side results of one call, in a per-thread device scratch block that
// is all zero when a call starts (cuda_runtime.cc keeps it so).
struct DeviceStatus {
  // QSGD encode: nonzero when a bucket is not encodable (NaN/Inf, L2
  // overflow). QSGD decode: ~b for the smallest bucket b with a bad scale
  // (atomicMax of ~b), 0 when all are valid.
  unsigned long long error;
  // castTo*: the number of non-finite outputs.
  unsigned long long count;
};

// ~b as stored in DeviceStatus::error for a bad decode bucket, and back.
inline constexpr unsigned long long badBucketCode(int64_t bucket) {
  return ~static_cast<unsigned long long>(bucket);
}
inline constexpr int64_t badBucketFromCode(unsigned long long code) {
  return static_cast<int64_t>(~code);
}

struct QsgdEncodeArgs {
  const float* in;
  float* residual;  // nullptr: no error feedback
  int64_t n;        // > 0
  int64_t bucketSize;
  int64_t numBuckets;
  int bits;
  bool l2;
  RngKey key;
  uint8_t* out;  // qsgdEncodedBytes(n, cfg) bytes
};

// Scales into out[0, 4B), then (unless a bucket failed, see DeviceStatus) the
// codes and the residual. `status` must be zero on entry.
cudaError_t launchQsgdEncode(const QsgdEncodeArgs& args, DeviceStatus* status, cudaStream_t stream);

struct QsgdDecodeArgs {
  const uint8_t* in;  // qsgdEncodedBytes(n, cfg) bytes
  int64_t n;          // > 0
  int64_t bucketSize;
  int64_t numBuckets;
  int bits;
  bool accumulate;  // out += alpha * Q instead of out = Q
  float alpha;
  float* out;
};

// Validates every scale first; writes `out` only when all are valid.
cudaError_t launchQsgdDecode(const QsgdDecodeArgs& args, DeviceStatus* status, cudaStream_t stream);

enum class HalfFormat { kFp16, kBf16 };

// out[k] = half(in[k]); adds the number of non-finite outputs to status->count.
cudaError_t launchCastToHalf(const float* in, int64_t n, uint16_t* out, HalfFormat format,
                             DeviceStatus* status, cudaStream_t stream);

// out[k] = float(in[k]), or out[k] + alpha * float(in[k]) with `accumulate`.
cudaError_t launchCastFromHalf(const uint16_t* in, int64_t n, HalfFormat format, bool accumulate,
                               float alpha, float* out, cudaStream_t stream);

// Host side (cuda_runtime.cc): throws geo::Error naming `what` and the CUDA
// error unless err is cudaSuccess, after clearing a non-sticky error so that
// later calls are not blamed for it.
void checkCuda(cudaError_t err, const char* what);

// Host side (cuda_runtime.cc): queues launch(status) on `stream` with this
// thread's zeroed status block, then the status's copy back, waits for the
// stream and returns what the kernels reported. Throws geo::Error naming
// `what` (or the synchronization) on a CUDA failure, after waiting for what
// was queued.
DeviceStatus runWithStatusOn(cudaStream_t stream, const char* what,
                             const std::function<cudaError_t(DeviceStatus*)>& launch);

// Whether the current device can run these kernels (the binary carries code
// for its architecture). Clears the error it may leave behind; never throws.
bool cudaKernelsRunnable() noexcept;

// ---- launch configuration shared by the .cu files ---------------------------

inline constexpr int kCudaThreads = 256;  // threads per block, every kernel

// Blocks of kCudaThreads for `items` work items, `perBlock` per block, but at
// most as many as the current device keeps resident at once for `kernel`
// (one full wave, from its register use): the grid-stride kernels then
// saturate memory bandwidth without a partial second wave, and per-thread
// setup is amortized over many items. Only instantiated in the .cu files.
template <typename Kernel>
cudaError_t gridFor(Kernel* kernel, int64_t items, int64_t perBlock, int* blocks) {
  int device = 0;
  int sms = 0;
  int perSm = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess)
    err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (err == cudaSuccess) {
    err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        &perSm, reinterpret_cast<const void*>(kernel), kCudaThreads, 0);
  }
  if (err != cudaSuccess) return err;
  const int64_t maxBlocks = int64_t{sms} * (perSm > 0 ? perSm : 1);
  const int64_t need = (items + perBlock - 1) / perBlock;
  *blocks = static_cast<int>(need < 1 ? 1 : (need < maxBlocks ? need : maxBlocks));
  return cudaSuccess;
}

}  // namespace geo::kernels::detail
