// Codec kernel throughput on 64 MiB of fp32 (16 Mi values), as GB/s of fp32
// input and as a ratio to memcpy measured in the same run (these machines are
// noisy; ratios travel, absolute numbers do not).
//
//   geo_kernels_bench                       # all, 1 thread and all threads
//   geo_kernels_bench --benchmark_filter=1T # one core only
//
// Targets (issue "Foundation"): on one core, encode >= 0.4x memcpy and
// decode-accumulate >= 0.5x memcpy; with several threads, scaling with cores;
// on a GPU, encode and decode >= 0.7x a device-to-device copy.

#include <benchmark/benchmark.h>
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "bench/kernels_bench.h"
#include "kernels/casts.h"
#include "kernels/qsgd.h"

namespace geo::bench {

const std::vector<float>& input64MiB() {
  static const std::vector<float> data = [] {
    std::vector<float> v(kBenchValues);
    std::mt19937 gen(42);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    for (auto& x : v) x = dist(gen);
    return v;
  }();
  return data;
}

namespace {

using kernels::QsgdConfig;

void setBytes(benchmark::State& state) {
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * kBenchValues * 4);
}

void BM_Memcpy(benchmark::State& state) {
  const auto& in = input64MiB();
  std::vector<float> out(in.size());
  const int threads = static_cast<int>(state.range(0));
  const int64_t chunk = (kBenchValues + threads - 1) / threads;
  for (auto _ : state) {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int t = 0; t < threads; ++t) {
      const int64_t s = t * chunk;
      const int64_t e = std::min<int64_t>(kBenchValues, s + chunk);
      std::memcpy(out.data() + s, in.data() + s, static_cast<size_t>(e - s) * 4);
    }
    benchmark::ClobberMemory();
  }
  setBytes(state);
}

void BM_QsgdEncode(benchmark::State& state) {
  const auto& in = input64MiB();
  const QsgdConfig cfg{static_cast<int>(state.range(1)), 512, kernels::QsgdScale::kMaxAbs};
  std::vector<uint8_t> out(static_cast<size_t>(kernels::qsgdEncodedBytes(kBenchValues, cfg)));
  uint64_t round = 0;
  for (auto _ : state) {
    kernels::qsgdEncode(in.data(), kBenchValues, cfg, {7, round++}, out.data(),
                        static_cast<int64_t>(out.size()), nullptr,
                        static_cast<int>(state.range(0)));
    benchmark::ClobberMemory();
  }
  setBytes(state);
}

void BM_QsgdEncodeFeedback(benchmark::State& state) {
  const auto& in = input64MiB();
  const QsgdConfig cfg{static_cast<int>(state.range(1)), 512, kernels::QsgdScale::kMaxAbs};
  std::vector<uint8_t> out(static_cast<size_t>(kernels::qsgdEncodedBytes(kBenchValues, cfg)));
  std::vector<float> residual(kBenchValues, 0.0f);
  uint64_t round = 0;
  for (auto _ : state) {
    kernels::qsgdEncode(in.data(), kBenchValues, cfg, {7, round++}, out.data(),
                        static_cast<int64_t>(out.size()), residual.data(),
                        static_cast<int>(state.range(0)));
    benchmark::ClobberMemory();
  }
  setBytes(state);
}

void BM_QsgdDecodeAccumulate(benchmark::State& state) {
  const auto& in = input64MiB();
  const QsgdConfig cfg{static_cast<int>(state.range(1)), 512, kernels::QsgdScale::kMaxAbs};
  std::vector<uint8_t> enc(static_cast<size_t>(kernels::qsgdEncodedBytes(kBenchValues, cfg)));
  kernels::qsgdEncode(in.data(), kBenchValues, cfg, {7, 0}, enc.data(),
                      static_cast<int64_t>(enc.size()));
  std::vector<float> out(kBenchValues, 0.0f);
  for (auto _ : state) {
    kernels::qsgdDecodeAccumulate(enc.data(), static_cast<int64_t>(enc.size()), kBenchValues, cfg,
                                  0.25f, out.data(), static_cast<int>(state.range(0)));
    benchmark::ClobberMemory();
  }
  setBytes(state);
}

void BM_Fp16Encode(benchmark::State& state) {
  const auto& in = input64MiB();
  std::vector<uint16_t> out(kBenchValues);
  for (auto _ : state) {
    benchmark::DoNotOptimize(kernels::castToFp16(in.data(), kBenchValues, out.data()));
  }
  setBytes(state);
}

void BM_Bf16Encode(benchmark::State& state) {
  const auto& in = input64MiB();
  std::vector<uint16_t> out(kBenchValues);
  for (auto _ : state) {
    benchmark::DoNotOptimize(kernels::castToBf16(in.data(), kBenchValues, out.data()));
  }
  setBytes(state);
}

// Thread counts: 1 and, where the machine has more cores, all of them.
void threadArgs(benchmark::internal::Benchmark* b, bool withBits) {
  std::vector<int64_t> threads{1};
  if (omp_get_max_threads() > 1) threads.push_back(omp_get_max_threads());
  for (int64_t t : threads) {
    if (!withBits) {
      b->Args({t});
      continue;
    }
    for (int64_t bits : {2, 4, 8}) b->Args({t, bits});
  }
  b->ArgNames(withBits ? std::vector<std::string>{"threads", "bits"}
                       : std::vector<std::string>{"threads"});
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}

BENCHMARK(BM_Memcpy)->Apply([](auto* b) { threadArgs(b, false); });
BENCHMARK(BM_QsgdEncode)->Apply([](auto* b) { threadArgs(b, true); });
BENCHMARK(BM_QsgdEncodeFeedback)->Apply([](auto* b) { threadArgs(b, true); });
BENCHMARK(BM_QsgdDecodeAccumulate)->Apply([](auto* b) { threadArgs(b, true); });
BENCHMARK(BM_Fp16Encode)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Bf16Encode)->Unit(benchmark::kMillisecond)->UseRealTime();

// Prints the usual console table, then a summary: GB/s of fp32 input and the
// ratio to the memcpy (or device copy) run with the same thread count.
class RatioReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const auto& run : runs) {
      if (run.error_occurred || run.run_type != Run::RT_Iteration) continue;
      const auto it = run.counters.find("bytes_per_second");
      if (it == run.counters.end()) continue;
      rows_.push_back({run.benchmark_name(), it->second.value / 1e9});
    }
  }

  void Finalize() override {
    ConsoleReporter::Finalize();
    std::printf("\n%-52s %10s %12s\n", "kernel (GB/s of fp32 input)", "GB/s", "vs copy");
    for (const auto& [name, gbps] : rows_) {
      const double ref = referenceFor(name);
      if (ref > 0) {
        std::printf("%-52s %10.2f %11.2fx\n", name.c_str(), gbps, gbps / ref);
      } else {
        std::printf("%-52s %10.2f %12s\n", name.c_str(), gbps, "-");
      }
    }
  }

 private:
  // The copy run matching `name`: same device and thread count.
  double referenceFor(const std::string& name) const {
    const bool gpu = name.rfind("BM_Gpu", 0) == 0;
    std::string threads = "threads:1";
    if (auto pos = name.find("threads:"); pos != std::string::npos) {
      threads = name.substr(pos, name.find('/', pos) - pos);
    }
    // GPU runs end in "/values:N" (and "/manual_time"): the copy of as many values.
    std::string values;
    if (auto pos = name.find("values:"); pos != std::string::npos) {
      values = name.substr(pos, name.find('/', pos) - pos);
    }
    for (const auto& [other, gbps] : rows_) {
      if (gpu && other.rfind("BM_GpuCopy/" + values + "/", 0) == 0) return gbps;
      if (!gpu && other.rfind("BM_Memcpy/" + threads, 0) == 0) return gbps;
    }
    return 0.0;
  }

  std::vector<std::pair<std::string, double>> rows_;
};

}  // namespace
}  // namespace geo::bench

#if !defined(GEO_HAVE_CUDA)
bool geo::bench::registerGpuBenchmarks() {
  return false;
}
#endif

int main(int argc, char** argv) {
  if (!geo::bench::registerGpuBenchmarks()) {
    std::printf("no CUDA device (or a build without CUDA): GPU cases are not run\n");
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  geo::bench::RatioReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  return 0;
}
