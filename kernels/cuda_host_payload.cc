// Device tensors to host payloads and back (kernels/qsgd_cuda.h, "Device
// tensors, host payloads"): a per-thread stream ordered after the caller's
// compute stream by an event, and grow-only device and pinned host staging
// buffers, so that only the packed bytes cross PCIe and no call allocates
// once the sizes are known.

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "common/enforce.h"
#include "kernels/cuda_launch.h"
#include "kernels/qsgd.h"
#include "kernels/qsgd_cuda.h"

namespace geo::kernels {
namespace {

using detail::checkCuda;

// One host thread's stream, event and staging buffers on one device.
struct Staging {
  cudaStream_t stream = nullptr;
  cudaEvent_t ready = nullptr;  // recorded on the caller's stream
  void* device = nullptr;
  size_t deviceBytes = 0;
  void* host = nullptr;  // pinned
  size_t hostBytes = 0;

  void* deviceBuffer(size_t bytes) {
    return grow(device, deviceBytes, bytes, cudaMalloc, cudaFree, "cudaMalloc (payload staging)");
  }
  void* hostBuffer(size_t bytes) {
    return grow(host, hostBytes, bytes, cudaMallocHost, cudaFreeHost,
                "cudaMallocHost (payload staging)");
  }
  // `buffer` of `have` bytes, replaced by one of `need` if it is smaller
  // (the contents are not kept: every call fills what it uses).
  static void* grow(void*& buffer, size_t& have, size_t need,
                    cudaError_t (*allocate)(void**, size_t), cudaError_t (*release)(void*),
                    const char* what) {
    if (need > have) {
      release(buffer);
      buffer = nullptr;
      have = 0;
      checkCuda(allocate(&buffer, need), what);
      have = need;
    }
    return buffer;
  }
  // Makes this thread's stream wait for everything queued on `after` so far.
  void orderAfter(cudaStream_t after) {
    checkCuda(cudaEventRecord(ready, after), "cudaEventRecord");
    checkCuda(cudaStreamWaitEvent(stream, ready, 0), "cudaStreamWaitEvent");
  }
};

class ThreadStaging {
 public:
  ThreadStaging() = default;
  ThreadStaging(const ThreadStaging&) = delete;
  ThreadStaging& operator=(const ThreadStaging&) = delete;
  // At thread exit; errors are ignored, the runtime may be shutting down.
  ~ThreadStaging() {
    for (size_t device = 0; device < perDevice_.size(); ++device) {
      Staging& s = perDevice_[device];
      if (s.stream == nullptr || cudaSetDevice(static_cast<int>(device)) != cudaSuccess) continue;
      cudaStreamSynchronize(s.stream);
      cudaFree(s.device);
      cudaFreeHost(s.host);
      cudaEventDestroy(s.ready);
      cudaStreamDestroy(s.stream);
    }
    cudaGetLastError();
  }

  Staging& forCurrentDevice() {
    int device = 0;
    checkCuda(cudaGetDevice(&device), "cudaGetDevice");
    if (perDevice_.size() <= static_cast<size_t>(device)) perDevice_.resize(device + 1);
    Staging& s = perDevice_[device];
    if (s.stream == nullptr) {
      checkCuda(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking), "cudaStreamCreate");
      if (const cudaError_t err = cudaEventCreateWithFlags(&s.ready, cudaEventDisableTiming);
          err != cudaSuccess) {
        cudaStreamDestroy(s.stream);
        s.stream = nullptr;
        checkCuda(err, "cudaEventCreate");
      }
    }
    return s;
  }

 private:
  std::vector<Staging> perDevice_;
};

Staging& staging() {
  thread_local ThreadStaging perThread;
  return perThread.forCurrentDevice();
}

// The payload bytes [lo, hi) the slices span; checks that each slice lies
// within the n values and the payload's `bytes`.
struct Span {
  int64_t lo = 0;
  int64_t hi = 0;
};

Span checkSlices(const QsgdSlice* slices, int64_t count, int64_t n, int64_t bytes,
                 const QsgdConfig& cfg) {
  GEO_ENFORCE(count >= 0, "slice count must be >= 0, got {}", count);
  GEO_ENFORCE(count == 0 || slices != nullptr, "null slice table with {} slices", count);
  Span span{bytes, 0};
  for (int64_t k = 0; k < count; ++k) {
    const QsgdSlice& s = slices[k];
    GEO_ENFORCE(s.numel > 0 && s.offset >= 0 && s.offset <= n - s.numel,
                "slice {} (values {} to {}) is not within the {} values", k, s.offset,
                s.offset + s.numel, n);
    const int64_t end = s.byteOffset + qsgdEncodedBytes(s.numel, cfg);
    GEO_ENFORCE(s.byteOffset >= 0 && end <= bytes,
                "slice {} (payload bytes {} to {}) is not within the {}-byte payload", k,
                s.byteOffset, end, bytes);
    span.lo = std::min(span.lo, s.byteOffset);
    span.hi = std::max(span.hi, end);
  }
  return span;
}

}  // namespace

void qsgdEncodeCudaToHost(const float* in, int64_t n, const QsgdConfig& cfg, RngKey key,
                          uint8_t* hostOut, int64_t outBytes, float* residual, cudaStream_t after) {
  const int64_t need = qsgdEncodedBytes(n, cfg);  // validates cfg and n
  if (n == 0) return;
  GEO_ENFORCE(hostOut != nullptr, "null output buffer with n = {}", n);
  GEO_ENFORCE(outBytes >= need, "QSGD output buffer too small: {} bytes, need {}", outBytes, need);
  Staging& s = staging();
  auto* packed = static_cast<uint8_t*>(s.deviceBuffer(static_cast<size_t>(need)));
  auto* pinned = static_cast<uint8_t*>(s.hostBuffer(static_cast<size_t>(need)));
  s.orderAfter(after);
  qsgdEncodeCuda(in, n, cfg, key, packed, need, residual, s.stream);  // synchronizes s.stream
  checkCuda(
      cudaMemcpyAsync(pinned, packed, static_cast<size_t>(need), cudaMemcpyDeviceToHost, s.stream),
      "cudaMemcpyAsync (payload to host)");
  checkCuda(cudaStreamSynchronize(s.stream), "cudaStreamSynchronize");
  std::memcpy(hostOut, pinned, static_cast<size_t>(need));
}

void qsgdDecodeAccumulateCudaFromHost(const uint8_t* hostIn, int64_t inBytes, int64_t n,
                                      const QsgdConfig& cfg, float alpha, float* out,
                                      cudaStream_t after) {
  validateQsgdConfig(cfg);
  validateQsgdAlpha(alpha);
  GEO_ENFORCE(n >= 0, "element count must be >= 0, got {}", n);
  if (n == 0) return;
  GEO_ENFORCE(hostIn != nullptr, "null payload with n = {}", n);
  GEO_ENFORCE_EQ(inBytes, qsgdEncodedBytes(n, cfg),
                 "QSGD payload size does not match {} values at {} bits, bucket {}", n, cfg.bits,
                 cfg.bucketSize);
  Staging& s = staging();
  const auto bytes = static_cast<size_t>(inBytes);
  auto* packed = static_cast<uint8_t*>(s.deviceBuffer(bytes));
  auto* pinned = static_cast<uint8_t*>(s.hostBuffer(bytes));
  // The previous call on this thread has finished (each call synchronizes),
  // so the pinned buffer is free to overwrite.
  std::memcpy(pinned, hostIn, bytes);
  checkCuda(cudaMemcpyAsync(packed, pinned, bytes, cudaMemcpyHostToDevice, s.stream),
            "cudaMemcpyAsync (payload to device)");
  s.orderAfter(after);
  qsgdDecodeAccumulateCuda(packed, inBytes, n, cfg, alpha, out, s.stream);  // synchronizes
}

void qsgdEncodeSlicesCudaToHost(const float* in, float* residual, int64_t n,
                                const QsgdSlice* slices, int64_t count, const QsgdConfig& cfg,
                                uint8_t* hostOut, int64_t outBytes, cudaStream_t after) {
  validateQsgdConfig(cfg);
  const Span span = checkSlices(slices, count, n, outBytes, cfg);
  if (count == 0) return;
  GEO_ENFORCE(in != nullptr && hostOut != nullptr, "null buffer with {} slices", count);
  GEO_ENFORCE(residual != in, "residual must not alias the input");
  Staging& s = staging();
  const auto bytes = static_cast<size_t>(span.hi - span.lo);
  auto* packed = static_cast<uint8_t*>(s.deviceBuffer(bytes));
  auto* pinned = static_cast<uint8_t*>(s.hostBuffer(bytes));
  s.orderAfter(after);
  // Every slice's kernels, then the payload's copy, then one wait.
  const detail::DeviceStatus status =
      detail::runWithStatusOn(s.stream, "QSGD encode launch", [&](detail::DeviceStatus* st) {
        for (int64_t k = 0; k < count; ++k) {
          const QsgdSlice& sl = slices[k];
          const detail::QsgdEncodeArgs args{in + sl.offset,
                                            residual == nullptr ? nullptr : residual + sl.offset,
                                            sl.numel,
                                            cfg.bucketSize,
                                            qsgdNumBuckets(sl.numel, cfg),
                                            cfg.bits,
                                            cfg.scale == QsgdScale::kL2Norm,
                                            sl.key,
                                            packed + (sl.byteOffset - span.lo)};
          if (const cudaError_t err = detail::launchQsgdEncode(args, st, s.stream);
              err != cudaSuccess) {
            return err;
          }
        }
        return cudaMemcpyAsync(pinned, packed, bytes, cudaMemcpyDeviceToHost, s.stream);
      });
  enforceQsgdEncodable(status.error == 0, residual != nullptr, cfg);
  for (int64_t k = 0; k < count; ++k) {
    const QsgdSlice& sl = slices[k];
    std::memcpy(hostOut + sl.byteOffset, pinned + (sl.byteOffset - span.lo),
                static_cast<size_t>(qsgdEncodedBytes(sl.numel, cfg)));
  }
}

void qsgdDecodeAccumulateSlicesCudaFromHost(const uint8_t* hostIn, int64_t inBytes,
                                            const QsgdSlice* slices, int64_t count,
                                            const QsgdConfig& cfg, float alpha, float* out,
                                            int64_t n, cudaStream_t after) {
  validateQsgdConfig(cfg);
  validateQsgdAlpha(alpha);
  const Span span = checkSlices(slices, count, n, inBytes, cfg);
  if (count == 0) return;
  GEO_ENFORCE(hostIn != nullptr && out != nullptr, "null buffer with {} slices", count);
  Staging& s = staging();
  const auto bytes = static_cast<size_t>(span.hi - span.lo);
  auto* packed = static_cast<uint8_t*>(s.deviceBuffer(bytes));
  auto* pinned = static_cast<uint8_t*>(s.hostBuffer(bytes));
  std::memcpy(pinned, hostIn + span.lo, bytes);  // the previous call has finished with it
  checkCuda(cudaMemcpyAsync(packed, pinned, bytes, cudaMemcpyHostToDevice, s.stream),
            "cudaMemcpyAsync (payload to device)");
  s.orderAfter(after);
  const detail::DeviceStatus status =
      detail::runWithStatusOn(s.stream, "QSGD decode launch", [&](detail::DeviceStatus* st) {
        for (int64_t k = 0; k < count; ++k) {
          const QsgdSlice& sl = slices[k];
          const detail::QsgdDecodeArgs args{packed + (sl.byteOffset - span.lo),
                                            sl.numel,
                                            cfg.bucketSize,
                                            qsgdNumBuckets(sl.numel, cfg),
                                            cfg.bits,
                                            /*accumulate=*/true,
                                            alpha,
                                            out + sl.offset};
          if (const cudaError_t err = detail::launchQsgdDecode(args, st, s.stream);
              err != cudaSuccess) {
            return err;
          }
        }
        return cudaSuccess;
      });
  if (status.error == 0) return;
  // The kernels share one status block: find the slice and bucket on the
  // host, with the kernels' own rule (+0 or a positive finite number).
  for (int64_t k = 0; k < count; ++k) {
    const QsgdSlice& sl = slices[k];
    for (int64_t b = 0; b < qsgdNumBuckets(sl.numel, cfg); ++b) {
      float scale = 0.0f;
      uint32_t bits = 0;
      std::memcpy(&scale, hostIn + sl.byteOffset + 4 * b, sizeof scale);
      std::memcpy(&bits, &scale, sizeof bits);
      GEO_ENFORCE(scale >= 0.0f && bits < 0x7f800000u,
                  "corrupt QSGD payload: scale of bucket {} of slice {} is {} (must be finite and "
                  ">= 0)",
                  b, k, scale);
    }
  }
  GEO_ENFORCE(false, "corrupt QSGD payload: the device refused a scale the host finds valid");
}

}  // namespace geo::kernels
