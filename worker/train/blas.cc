#include "worker/train/blas.h"

#include <dlfcn.h>

#include <filesystem>
#include <system_error>

namespace geo::train {
namespace {

// OpenBLAS's C interface (cblas.h), found in the process by name: the
// symbols are there when libblas.so.3 is OpenBLAS's, and absent otherwise.
template <typename Fn>
Fn* openblasFunction(const char* name) {
  return reinterpret_cast<Fn*>(dlsym(RTLD_DEFAULT, name));
}

}  // namespace

BlasInfo blasInfo() {
  BlasInfo info;
  // OpenBLAS may be loaded (liblapack.so.3 can be its LAPACK) while the
  // matrix product LibTorch calls, sgemm_, is another BLAS's: what counts is
  // the library that defines sgemm_.
  Dl_info where{};
  const void* sgemm = dlsym(RTLD_DEFAULT, "sgemm_");
  if (sgemm != nullptr && dladdr(sgemm, &where) != 0 && where.dli_fname != nullptr) {
    // The file behind the alternatives' symbolic links
    // (/lib/x86_64-linux-gnu/libblas.so.3 -> .../openblas-pthread/libblas.so.3).
    std::error_code error;
    const auto real = std::filesystem::canonical(where.dli_fname, error);
    info.library = error ? std::string(where.dli_fname) : real.string();
  }
  const auto config = openblasFunction<char*()>("openblas_get_config");
  if (config == nullptr || info.library.find("openblas") == std::string::npos) return info;
  info.openblas = config();
  if (const auto parallel = openblasFunction<int()>("openblas_get_parallel")) {
    switch (parallel()) {
      case 0: info.parallel = "sequential"; break;
      case 1: info.parallel = "pthreads"; break;
      case 2: info.parallel = "openmp"; break;
      default: info.parallel = "unknown"; break;
    }
  }
  if (const auto threads = openblasFunction<int()>("openblas_get_num_threads")) {
    info.threads = threads();
  }
  return info;
}

void setBlasThreads(int threads) {
  if (threads <= 0) return;
  if (const auto set = openblasFunction<void(int)>("openblas_set_num_threads")) set(threads);
}

std::optional<std::string> blasWarning(const BlasInfo& info) {
  if (!info.openblas) {
    return "LibTorch runs on the reference BLAS (libblas3): CPU training takes about four times "
           "as long per step as on OpenBLAS (apt-get install libopenblas0-pthread)";
  }
  if (info.parallel == "sequential") {
    return "LibTorch runs on OpenBLAS's sequential build (libopenblas0-serial), which is not safe "
           "to call from two threads at once, and a worker evaluates on its own thread while it "
           "trains: install libopenblas0-pthread (its products take the locks), or select it with "
           "update-alternatives --config libblas.so.3-x86_64-linux-gnu";
  }
  return std::nullopt;
}

}  // namespace geo::train
