// Device tensors to host payloads and back (kernels/qsgd_cuda.h, "Device
// tensors, host payloads"): a per-thread stream ordered after the caller's
// compute stream by an event, and grow-only device and pinned host staging
// buffers, so that only the packed bytes cross PCIe and no call allocates
// once the sizes are known.

#include <cuda_runtime_api.h>

#include <cstring>
#include <vector>

#include "common/enforce.h"
#include "kernels/qsgd.h"
#include "kernels/qsgd_cuda.h"

namespace geo::kernels {
namespace {

void check(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return;
  cudaGetLastError();  // a non-sticky error must not be blamed on a later call
  GEO_ENFORCE(err == cudaSuccess, "CUDA {} failed: {} ({})", what, cudaGetErrorName(err),
              cudaGetErrorString(err));
}

// One host thread's stream, event and staging buffers on one device.
struct Staging {
  cudaStream_t stream = nullptr;
  cudaEvent_t ready = nullptr;  // recorded on the caller's stream
  void* device = nullptr;
  size_t deviceBytes = 0;
  void* host = nullptr;  // pinned
  size_t hostBytes = 0;

  void* deviceBuffer(size_t bytes) {
    if (bytes > deviceBytes) {
      cudaFree(device);
      device = nullptr;
      deviceBytes = 0;
      check(cudaMalloc(&device, bytes), "cudaMalloc (payload staging)");
      deviceBytes = bytes;
    }
    return device;
  }
  void* hostBuffer(size_t bytes) {
    if (bytes > hostBytes) {
      cudaFreeHost(host);
      host = nullptr;
      hostBytes = 0;
      check(cudaMallocHost(&host, bytes), "cudaMallocHost (payload staging)");
      hostBytes = bytes;
    }
    return host;
  }
  // Makes this thread's stream wait for everything queued on `after` so far.
  void orderAfter(cudaStream_t after) {
    check(cudaEventRecord(ready, after), "cudaEventRecord");
    check(cudaStreamWaitEvent(stream, ready, 0), "cudaStreamWaitEvent");
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
    check(cudaGetDevice(&device), "cudaGetDevice");
    if (perDevice_.size() <= static_cast<size_t>(device)) perDevice_.resize(device + 1);
    Staging& s = perDevice_[device];
    if (s.stream == nullptr) {
      check(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking), "cudaStreamCreate");
      if (const cudaError_t err = cudaEventCreateWithFlags(&s.ready, cudaEventDisableTiming);
          err != cudaSuccess) {
        cudaStreamDestroy(s.stream);
        s.stream = nullptr;
        check(err, "cudaEventCreate");
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
  check(
      cudaMemcpyAsync(pinned, packed, static_cast<size_t>(need), cudaMemcpyDeviceToHost, s.stream),
      "cudaMemcpyAsync (payload to host)");
  check(cudaStreamSynchronize(s.stream), "cudaStreamSynchronize");
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
  check(cudaMemcpyAsync(packed, pinned, bytes, cudaMemcpyHostToDevice, s.stream),
        "cudaMemcpyAsync (payload to device)");
  s.orderAfter(after);
  qsgdDecodeAccumulateCuda(packed, inBytes, n, cfg, alpha, out, s.stream);  // synchronizes
}

}  // namespace geo::kernels
