// Host side of the CUDA codecs (kernels/qsgd_cuda.h): the CPU functions'
// argument checks (same functions, same messages), a per-thread scratch block
// where kernels leave their results, the launches (kernels/cuda_launch.h),
// synchronization and geo::Error. It is compiled by the host compiler so that
// {fmt} and common/enforce.h never go through nvcc.

#include <cuda_runtime_api.h>

#include <bit>
#include <cstdint>
#include <vector>

#include "common/enforce.h"
#include "kernels/cuda_launch.h"
#include "kernels/qsgd.h"
#include "kernels/qsgd_cuda.h"

namespace geo::kernels {

using detail::checkCuda;
using detail::DeviceStatus;
using detail::HalfFormat;

void detail::checkCuda(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return;
  cudaGetLastError();  // reset a non-sticky error so that later calls are not blamed for it
  GEO_ENFORCE(err == cudaSuccess, "CUDA {} failed: {} ({})", what, cudaGetErrorName(err),
              cudaGetErrorString(err));
}

namespace {

template <typename T>
void checkAligned(const T* p, const char* name) {
  GEO_ENFORCE(reinterpret_cast<uintptr_t>(p) % alignof(T) == 0, "{} is not aligned to {} bytes: {}",
              name, alignof(T), static_cast<const void*>(p));
}

// The DeviceStatus block of one host thread on one device, and a pinned host
// copy to read it back. Kernels only ever set its fields, so it must be zero
// when a call starts: a call that reads back zeros leaves it clean, any other
// outcome leaves it dirty and the next call queues a memset first (in the
// common case no memset is queued at all).
struct StatusScratch {
  DeviceStatus* device = nullptr;
  DeviceStatus* host = nullptr;  // pinned
  bool clean = false;
};

class ThreadScratch {
 public:
  ThreadScratch() = default;
  ThreadScratch(const ThreadScratch&) = delete;
  ThreadScratch& operator=(const ThreadScratch&) = delete;

  // Runs at thread (or process) exit; errors are ignored, as the CUDA runtime
  // may already be shutting down.
  ~ThreadScratch() {
    for (size_t device = 0; device < perDevice_.size(); ++device) {
      const StatusScratch& s = perDevice_[device];
      if (s.device != nullptr && cudaSetDevice(static_cast<int>(device)) == cudaSuccess) {
        cudaFree(s.device);
      }
      if (s.host != nullptr) cudaFreeHost(s.host);
    }
    cudaGetLastError();
  }

  StatusScratch& forCurrentDevice() {
    int device = 0;
    checkCuda(cudaGetDevice(&device), "cudaGetDevice");
    if (perDevice_.size() <= static_cast<size_t>(device)) perDevice_.resize(device + 1);
    StatusScratch& s = perDevice_[device];
    if (s.device == nullptr) {
      void* d = nullptr;
      checkCuda(cudaMalloc(&d, sizeof(DeviceStatus)), "cudaMalloc (status)");
      void* h = nullptr;
      if (const cudaError_t err = cudaMallocHost(&h, sizeof(DeviceStatus)); err != cudaSuccess) {
        cudaFree(d);
        checkCuda(err, "cudaMallocHost (status)");
      }
      s.device = static_cast<DeviceStatus*>(d);
      s.host = static_cast<DeviceStatus*>(h);
      s.clean = false;
    }
    return s;
  }

 private:
  std::vector<StatusScratch> perDevice_;
};

StatusScratch& statusScratch() {
  thread_local ThreadScratch scratch;
  return scratch.forCurrentDevice();
}

// Queues `launch(deviceStatus)` on `stream`, waits for the stream and returns
// what the kernels reported. If queuing fails it still waits for the work
// already queued (so no kernel touches the scratch once we have thrown), then
// throws.
template <typename Launch>
DeviceStatus runWithStatus(cudaStream_t stream, const char* what, Launch&& launch) {
  StatusScratch& s = statusScratch();
  if (!s.clean) {
    checkCuda(cudaMemsetAsync(s.device, 0, sizeof(DeviceStatus), stream), "cudaMemsetAsync");
  }
  s.clean = false;
  cudaError_t err = launch(s.device);
  if (err == cudaSuccess) {
    err = cudaMemcpyAsync(s.host, s.device, sizeof(DeviceStatus), cudaMemcpyDeviceToHost, stream);
  }
  const cudaError_t syncErr = cudaStreamSynchronize(stream);
  checkCuda(err, what);
  checkCuda(syncErr, "cudaStreamSynchronize");
  const DeviceStatus status = *s.host;
  s.clean = status.error == 0 && status.count == 0;
  return status;
}

template <bool kAccumulate>
void decodeCuda(const uint8_t* in, int64_t inBytes, int64_t n, const QsgdConfig& cfg, float alpha,
                float* out, cudaStream_t stream) {
  validateQsgdConfig(cfg);
  GEO_ENFORCE(n >= 0, "element count must be >= 0, got {}", n);
  if (n == 0) return;
  GEO_ENFORCE(in != nullptr && out != nullptr, "null buffer with n = {}", n);
  checkAligned(out, "out");
  GEO_ENFORCE_EQ(inBytes, qsgdEncodedBytes(n, cfg),
                 "QSGD payload size does not match {} values at {} bits, bucket {}", n, cfg.bits,
                 cfg.bucketSize);
  const detail::QsgdDecodeArgs args{in,       n,           cfg.bucketSize, qsgdNumBuckets(n, cfg),
                                    cfg.bits, kAccumulate, alpha,          out};
  const DeviceStatus status = runWithStatus(stream, "QSGD decode launch", [&](DeviceStatus* s) {
    return detail::launchQsgdDecode(args, s, stream);
  });
  if (status.error != 0) {
    // Only the bucket index came back; fetch its scale for the CPU's message.
    const int64_t bucket = detail::badBucketFromCode(status.error);
    float scale = 0.0f;
    checkCuda(
        cudaMemcpyAsync(&scale, in + 4 * bucket, sizeof scale, cudaMemcpyDeviceToHost, stream),
        "cudaMemcpyAsync (scale)");
    checkCuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    GEO_ENFORCE(status.error == 0,
                "corrupt QSGD payload: scale of bucket {} is {} (must be finite and >= 0)", bucket,
                scale);
  }
}

void checkCastArgs(const void* in, int64_t n, const void* out) {
  GEO_ENFORCE(n >= 0, "element count must be >= 0, got {}", n);
  GEO_ENFORCE(n == 0 || (in != nullptr && out != nullptr), "null buffer with n = {}", n);
}

int64_t castToHalfCuda(const float* in, int64_t n, uint16_t* out, HalfFormat format,
                       cudaStream_t stream) {
  checkCastArgs(in, n, out);
  if (n == 0) return 0;
  checkAligned(in, "in");
  checkAligned(out, "out");
  const DeviceStatus status = runWithStatus(stream, "cast launch", [&](DeviceStatus* s) {
    return detail::launchCastToHalf(in, n, out, format, s, stream);
  });
  return static_cast<int64_t>(status.count);
}

void castFromHalfCuda(const uint16_t* in, int64_t n, HalfFormat format, bool accumulate,
                      float alpha, float* out, cudaStream_t stream) {
  checkCastArgs(in, n, out);
  if (n == 0) return;
  checkAligned(in, "in");
  checkAligned(out, "out");
  checkCuda(detail::launchCastFromHalf(in, n, format, accumulate, alpha, out, stream),
            "cast launch");
}

}  // namespace

namespace detail {

DeviceStatus runWithStatusOn(cudaStream_t stream, const char* what,
                             const std::function<cudaError_t(DeviceStatus*)>& launch) {
  return runWithStatus(stream, what, launch);
}

}  // namespace detail

bool cudaDeviceAvailable() noexcept {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count < 1) {
    cudaGetLastError();
    return false;
  }
  return detail::cudaKernelsRunnable();
}

void qsgdEncodeCuda(const float* in, int64_t n, const QsgdConfig& cfg, RngKey key, uint8_t* out,
                    int64_t outBytes, float* residual, cudaStream_t stream) {
  const int64_t need = qsgdEncodedBytes(n, cfg);  // validates cfg and n
  if (n == 0) return;
  GEO_ENFORCE(in != nullptr && out != nullptr, "null buffer with n = {}", n);
  GEO_ENFORCE(outBytes >= need, "QSGD output buffer too small: {} bytes, need {}", outBytes, need);
  GEO_ENFORCE(residual != in, "residual must not alias the input");
  checkAligned(in, "in");
  checkAligned(residual, "residual");
  const bool l2 = cfg.scale == QsgdScale::kL2Norm;
  const detail::QsgdEncodeArgs args{
      in, residual, n, cfg.bucketSize, qsgdNumBuckets(n, cfg), cfg.bits, l2, key, out};
  const DeviceStatus status = runWithStatus(stream, "QSGD encode launch", [&](DeviceStatus* s) {
    return detail::launchQsgdEncode(args, s, stream);
  });
  enforceQsgdEncodable(status.error == 0, residual != nullptr, cfg);
}

void qsgdDecodeCuda(const uint8_t* in, int64_t inBytes, int64_t n, const QsgdConfig& cfg,
                    float* out, cudaStream_t stream) {
  decodeCuda<false>(in, inBytes, n, cfg, 1.0f, out, stream);
}

void qsgdDecodeAccumulateCuda(const uint8_t* in, int64_t inBytes, int64_t n, const QsgdConfig& cfg,
                              float alpha, float* out, cudaStream_t stream) {
  validateQsgdAlpha(alpha);
  decodeCuda<true>(in, inBytes, n, cfg, alpha, out, stream);
}

int64_t castToFp16Cuda(const float* in, int64_t n, uint16_t* out, cudaStream_t stream) {
  return castToHalfCuda(in, n, out, HalfFormat::kFp16, stream);
}

int64_t castToBf16Cuda(const float* in, int64_t n, uint16_t* out, cudaStream_t stream) {
  return castToHalfCuda(in, n, out, HalfFormat::kBf16, stream);
}

void castFromFp16Cuda(const uint16_t* in, int64_t n, float* out, cudaStream_t stream) {
  castFromHalfCuda(in, n, HalfFormat::kFp16, false, 1.0f, out, stream);
}

void castFromBf16Cuda(const uint16_t* in, int64_t n, float* out, cudaStream_t stream) {
  castFromHalfCuda(in, n, HalfFormat::kBf16, false, 1.0f, out, stream);
}

void accumulateFp16Cuda(const uint16_t* in, int64_t n, float alpha, float* out,
                        cudaStream_t stream) {
  castFromHalfCuda(in, n, HalfFormat::kFp16, true, alpha, out, stream);
}

void accumulateBf16Cuda(const uint16_t* in, int64_t n, float alpha, float* out,
                        cudaStream_t stream) {
  castFromHalfCuda(in, n, HalfFormat::kBf16, true, alpha, out, stream);
}

}  // namespace geo::kernels
