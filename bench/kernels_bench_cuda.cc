// CUDA codec throughput on 16 Mi and 100 M fp32 values (64 MiB and 400 MB),
// reported as GB/s of fp32 input next to a device-to-device copy of the same
// bytes (the RatioReporter of kernels_bench.cc divides every BM_Gpu* run by
// the BM_GpuCopy run of the same size).
// Times are GPU times between two events around each call (manual time); the
// QSGD calls include their final stream synchronization, as a caller sees it.
//
//   geo_kernels_bench --benchmark_filter=Gpu
//
// Target: QSGD-4 encode and decode-accumulate of 100 M values >= 0.7x the
// device copy (docs/benchmarks.md, "The GPU path").

#include <benchmark/benchmark.h>
#include <cuda_runtime_api.h>

#include <algorithm>
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

  // `n` values on the device: the benchmark input (kernels_bench.h) repeated.
  float* input(benchmark::State& state, int64_t n) {
    const std::vector<float>& host = input64MiB();
    float* d = alloc<float>(state, n);
    if (d == nullptr) return nullptr;
    for (int64_t at = 0; at < n; at += static_cast<int64_t>(host.size())) {
      const auto count = std::min(static_cast<int64_t>(host.size()), n - at);
      if (!cudaOk(state,
                  cudaMemcpy(d + at, host.data(), static_cast<size_t>(count) * sizeof(float),
                             cudaMemcpyHostToDevice),
                  "cudaMemcpy")) {
        return nullptr;
      }
    }
    return d;
  }

  cudaStream_t stream() const { return stream_; }

  // Runs `body` once per iteration between two events on the stream and
  // reports the GPU time between them. A throwing body skips the benchmark.
  template <typename Body>
  void run(benchmark::State& state, int64_t n, Body&& body) {
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
    state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * n * 4);
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

// The number of values: the copy's only argument, the codecs' second.
int64_t benchValues(const benchmark::State& state, int index) {
  return state.range(index);
}

void BM_GpuCopy(benchmark::State& state) {
  GpuFixture gpu;
  if (!gpu.init(state)) return;
  const int64_t n = benchValues(state, 0);
  float* in = gpu.input(state, n);
  float* out = gpu.alloc<float>(state, n);
  if (in == nullptr || out == nullptr) return;
  gpu.run(state, n, [&] {
    cudaMemcpyAsync(out, in, static_cast<size_t>(n) * sizeof(float), cudaMemcpyDeviceToDevice,
                    gpu.stream());
  });
}

void BM_GpuQsgdEncode(benchmark::State& state) {
  GpuFixture gpu;
  if (!gpu.init(state)) return;
  const QsgdConfig cfg = benchConfig(state);
  const int64_t n = benchValues(state, 1);
  const int64_t bytes = kernels::qsgdEncodedBytes(n, cfg);
  float* in = gpu.input(state, n);
  uint8_t* out = gpu.alloc<uint8_t>(state, bytes);
  if (in == nullptr || out == nullptr) return;
  uint64_t round = 0;
  gpu.run(state, n, [&] {
    kernels::qsgdEncodeCuda(in, n, cfg, {7, round++}, out, bytes, nullptr, gpu.stream());
  });
}

// Decodes the encoding of the benchmark input (into `out`, or onto it).
template <bool kAccumulate>
void gpuDecode(benchmark::State& state) {
  GpuFixture gpu;
  if (!gpu.init(state)) return;
  const QsgdConfig cfg = benchConfig(state);
  const int64_t n = benchValues(state, 1);
  const int64_t bytes = kernels::qsgdEncodedBytes(n, cfg);
  float* in = gpu.input(state, n);
  uint8_t* payload = gpu.alloc<uint8_t>(state, bytes);
  if (in == nullptr || payload == nullptr) return;
  const bool encoded = GpuFixture::guarded(state, [&] {
    kernels::qsgdEncodeCuda(in, n, cfg, {7, 0}, payload, bytes, nullptr, gpu.stream());
  });
  if (!encoded) return;
  float* out = in;  // the input is no longer needed
  gpu.run(state, n, [&] {
    if constexpr (kAccumulate) {
      kernels::qsgdDecodeAccumulateCuda(payload, bytes, n, cfg, 0.25f, out, gpu.stream());
    } else {
      kernels::qsgdDecodeCuda(payload, bytes, n, cfg, out, gpu.stream());
    }
  });
}

void BM_GpuQsgdDecodeAccumulate(benchmark::State& state) {
  gpuDecode<true>(state);
}
void BM_GpuQsgdDecode(benchmark::State& state) {
  gpuDecode<false>(state);
}

// 16 Mi values (the CPU benchmarks' size) and 100 M (a 100M-parameter model).
constexpr int64_t kLargeValues = 100'000'000;

void bitsArgs(benchmark::internal::Benchmark* b) {
  b->ArgNames({"bits", "values"});
  for (int64_t n : {kBenchValues, kLargeValues}) {
    for (int64_t bits : {2, 4, 8}) b->Args({bits, n});
  }
  b->UseManualTime()->Unit(benchmark::kMicrosecond);
}

}  // namespace

bool registerGpuBenchmarks() {
  if (!kernels::cudaDeviceAvailable()) return false;
  benchmark::RegisterBenchmark("BM_GpuCopy", BM_GpuCopy)
      ->ArgName("values")
      ->Arg(kBenchValues)
      ->Arg(kLargeValues)
      ->UseManualTime()
      ->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark("BM_GpuQsgdEncode", BM_GpuQsgdEncode)->Apply(bitsArgs);
  benchmark::RegisterBenchmark("BM_GpuQsgdDecodeAccumulate", BM_GpuQsgdDecodeAccumulate)
      ->Apply(bitsArgs);
  benchmark::RegisterBenchmark("BM_GpuQsgdDecode", BM_GpuQsgdDecode)->Apply(bitsArgs);
  return true;
}
}  // namespace geo::bench
