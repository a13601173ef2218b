// CUDA codec throughput on 64 MiB of fp32 (16 Mi values), reported as GB/s of
// fp32 input next to a device-to-device copy of the same 64 MiB (the
// RatioReporter of kernels_bench.cc divides every BM_Gpu* run by BM_GpuCopy).
// Times are GPU times between two events around each call (manual time); the
// QSGD calls include their final stream synchronization, as a caller sees it.
//
//   geo_kernels_bench --benchmark_filter=Gpu
//
// Target (issue "Foundation"): encode and decode >= 0.7x the device copy.

#include <benchmark/benchmark.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <exception>
#include <string>
#include <vector>

#include "bench/kernels_bench.h"
#include "kernels/qsgd.h"
#include "kernels/qsgd_cuda.h"

namespace geo::bench {
namespace {

using kernels::QsgdConfig;

constexpr int64_t kBucket = 512;

// Records a CUDA failure as the benchmark's error; returns whether `err` is ok.
bool cudaOk(benchmark::State& state, cudaError_t err, const char* what) {
  if (err == cudaSuccess) return true;
  state.SkipWithError((std::string(what) + ": " + cudaGetErrorString(err)).c_str());
  return false;
}

// Device buffers, a stream and two events shared by one benchmark run.
class GpuFixture {
 public:
  GpuFixture() = default;
  GpuFixture(const GpuFixture&) = delete;
  GpuFixture& operator=(const GpuFixture&) = delete;
  ~GpuFixture() {
    for (void* p : buffers_) cudaFree(p);
    if (start_ != nullptr) cudaEventDestroy(start_);
    if (stop_ != nullptr) cudaEventDestroy(stop_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  // False (and the benchmark skipped) without a device or on a CUDA error.
  bool init(benchmark::State& state) {
    if (!kernels::cudaDeviceAvailable()) {
      state.SkipWithError("no CUDA device");
      return false;
    }
    return cudaOk(state, cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking),
                  "cudaStreamCreate") &&
           cudaOk(state, cudaEventCreate(&start_), "cudaEventCreate") &&
           cudaOk(state, cudaEventCreate(&stop_), "cudaEventCreate");
  }

  template <typename T>
  T* alloc(benchmark::State& state, int64_t count) {
    void* p = nullptr;
    if (!cudaOk(state, cudaMalloc(&p, static_cast<size_t>(count) * sizeof(T)), "cudaMalloc")) {
      return nullptr;
    }
    buffers_.push_back(p);
    return static_cast<T*>(p);
  }

  // The benchmark input (kernels_bench.h) on the device.
  float* input(benchmark::State& state) {
    const std::vector<float>& host = input64MiB();
    float* d = alloc<float>(state, kBenchValues);
    if (d == nullptr ||
        !cudaOk(state,
                cudaMemcpy(d, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice),
                "cudaMemcpy")) {
      return nullptr;
    }
    return d;
  }

  cudaStream_t stream() const { return stream_; }

  // Runs `body` once per iteration between two events on the stream and
  // reports the GPU time between them. A throwing body skips the benchmark.
  template <typename Body>
  void run(benchmark::State& state, Body&& body) {
    if (!guarded(state, body) ||  // warm-up: first launch, scratch allocation
        !cudaOk(state, cudaStreamSynchronize(stream_), "warm-up")) {
      return;
    }
    for (auto _ : state) {
      cudaEventRecord(start_, stream_);
      if (!guarded(state, body)) return;
      cudaEventRecord(stop_, stream_);
      if (!cudaOk(state, cudaEventSynchronize(stop_), "cudaEventSynchronize")) return;
      float ms = 0.0f;
      cudaEventElapsedTime(&ms, start_, stop_);
      state.SetIterationTime(static_cast<double>(ms) * 1e-3);
    }
    state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * kBenchValues * 4);
  }

  // Calls f(); a std::exception becomes the benchmark's error.
  template <typename F>
  static bool guarded(benchmark::State& state, F&& f) {
    try {
      f();
      return true;
    } catch (const std::exception& e) {
      state.SkipWithError(e.what());
      return false;
    }
  }

 private:
  cudaStream_t stream_ = nullptr;
  cudaEvent_t start_ = nullptr;
  cudaEvent_t stop_ = nullptr;
  std::vector<void*> buffers_;
};

QsgdConfig benchConfig(const benchmark::State& state) {
  return {static_cast<int>(state.range(0)), kBucket, kernels::QsgdScale::kMaxAbs};
}

void BM_GpuCopy(benchmark::State& state) {
  GpuFixture gpu;
  if (!gpu.init(state)) return;
  float* in = gpu.input(state);
  float* out = gpu.alloc<float>(state, kBenchValues);
  if (in == nullptr || out == nullptr) return;
  gpu.run(state, [&] {
    cudaMemcpyAsync(out, in, kBenchValues * sizeof(float), cudaMemcpyDeviceToDevice, gpu.stream());
  });
}

void BM_GpuQsgdEncode(benchmark::State& state) {
  GpuFixture gpu;
  if (!gpu.init(state)) return;
  const QsgdConfig cfg = benchConfig(state);
  const int64_t bytes = kernels::qsgdEncodedBytes(kBenchValues, cfg);
  float* in = gpu.input(state);
  uint8_t* out = gpu.alloc<uint8_t>(state, bytes);
  if (in == nullptr || out == nullptr) return;
  uint64_t round = 0;
  gpu.run(state, [&] {
    kernels::qsgdEncodeCuda(in, kBenchValues, cfg, {7, round++}, out, bytes, nullptr, gpu.stream());
  });
}

// Decodes the encoding of the benchmark input (into `out`, or onto it).
template <bool kAccumulate>
void gpuDecode(benchmark::State& state) {
  GpuFixture gpu;
  if (!gpu.init(state)) return;
  const QsgdConfig cfg = benchConfig(state);
  const int64_t bytes = kernels::qsgdEncodedBytes(kBenchValues, cfg);
  float* in = gpu.input(state);
  uint8_t* payload = gpu.alloc<uint8_t>(state, bytes);
  if (in == nullptr || payload == nullptr) return;
  const bool encoded = GpuFixture::guarded(state, [&] {
    kernels::qsgdEncodeCuda(in, kBenchValues, cfg, {7, 0}, payload, bytes, nullptr, gpu.stream());
  });
  if (!encoded) return;
  float* out = in;  // the input is no longer needed
  gpu.run(state, [&] {
    if constexpr (kAccumulate) {
      kernels::qsgdDecodeAccumulateCuda(payload, bytes, kBenchValues, cfg, 0.25f, out,
                                        gpu.stream());
    } else {
      kernels::qsgdDecodeCuda(payload, bytes, kBenchValues, cfg, out, gpu.stream());
    }
  });
}

void BM_GpuQsgdDecodeAccumulate(benchmark::State& state) {
  gpuDecode<true>(state);
}
void BM_GpuQsgdDecode(benchmark::State& state) {
  gpuDecode<false>(state);
}

void bitsArgs(benchmark::internal::Benchmark* b) {
  b->ArgName("bits")->Arg(2)->Arg(4)->Arg(8);
  b->UseManualTime()->Unit(benchmark::kMicrosecond);
}

}  // namespace

bool registerGpuBenchmarks() {
  if (!kernels::cudaDeviceAvailable()) return false;
  benchmark::RegisterBenchmark("BM_GpuCopy", BM_GpuCopy)
      ->UseManualTime()
      ->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark("BM_GpuQsgdEncode", BM_GpuQsgdEncode)->Apply(bitsArgs);
  benchmark::RegisterBenchmark("BM_GpuQsgdDecodeAccumulate", BM_GpuQsgdDecodeAccumulate)
      ->Apply(bitsArgs);
  benchmark::RegisterBenchmark("BM_GpuQsgdDecode", BM_GpuQsgdDecode)->Apply(bitsArgs);
  return true;
}
}  // namespace geo::bench
