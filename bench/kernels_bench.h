#pragma once
// Shared input of the kernel benchmarks (CPU and CUDA halves).

#include <cstdint>
#include <vector>

namespace geo::bench {

inline constexpr int64_t kBenchValues = int64_t{16} << 20;  // 64 MiB of fp32

// Standard-normal values, generated once.
const std::vector<float>& input64MiB();

// Registers the GPU cases (bench/kernels_bench_cuda.cc) when the build has
// CUDA and a device is present; returns whether it did.
bool registerGpuBenchmarks();

}  // namespace geo::bench
