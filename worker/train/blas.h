#pragma once
// What LibTorch's CPU matrix products run on, and how many threads one call
// may use. Debian's libtorch links the generic libblas.so.3, which the
// alternatives system points at the reference BLAS (libblas3, no threads,
// no vector kernels) or at an OpenBLAS build; on the mlp a step takes a
// quarter of the time on OpenBLAS. Nothing here links OpenBLAS: its
// functions are looked up in the process at run time.

#include <optional>
#include <string>

namespace geo::train {

struct BlasInfo {
  // The shared library that defines sgemm_, the matrix product LibTorch
  // calls (e.g. /usr/lib/x86_64-linux-gnu/blas/libblas.so.3, the reference
  // BLAS); empty if none does.
  std::string library;
  // OpenBLAS's build configuration (openblas_get_config(), e.g. "OpenBLAS
  // 0.3.21 DYNAMIC_ARCH NO_AFFINITY Haswell MAX_THREADS=64") where sgemm_ is
  // OpenBLAS's, else nullopt (the reference BLAS).
  std::optional<std::string> openblas;
  // OpenBLAS's threading: "sequential", "pthreads" or "openmp".
  std::string parallel;
  // The threads one BLAS call may use now (1 for any BLAS but OpenBLAS).
  int threads = 1;
};

// The BLAS in this process, as above.
BlasInfo blasInfo();

// Lets one BLAS call use `threads` threads (> 0), where the BLAS has such a
// setting (OpenBLAS's pthreads and OpenMP builds); a no-op otherwise.
// Workers call it with their intra-op thread count, so that a matrix
// product does not spread over the cores that other workers of the same
// machine train on: OpenBLAS's default is every core, and its idle threads
// spin.
void setBlasThreads(int threads);

// A warning about this BLAS for CPU training, or nullopt when there is none:
// the reference BLAS (four times slower than OpenBLAS on the mlp), or
// OpenBLAS's sequential build, whose Debian package is built without
// locking and so is not safe to call from two threads at once, as a worker
// does when it evaluates on its own thread while it trains (concurrent
// calls were seen to return wrong products).
std::optional<std::string> blasWarning(const BlasInfo& info);

}  // namespace geo::train
