#include "worker/app/training_library.h"

#include <dlfcn.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <malloc.h>

#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace geo::app {

StatusOr<TrainingLibrary> loadTrainingLibrary() {
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) {
    return failedPrecondition(
        fmt::format("cannot find this executable's folder (/proc/self/exe: {}), where {} should be",
                    ec.message(), kTrainingLibrary));
  }
  const std::filesystem::path folder = exe.parent_path();
  const std::vector<std::filesystem::path> candidates = {
      folder / kTrainingLibrary,
      folder.parent_path() / "lib" / "geotrain" / kTrainingLibrary,
  };
  std::vector<std::string> tried;
  for (const auto& path : candidates) {
    if (!std::filesystem::exists(path, ec)) {
      tried.push_back(path.string() + ": no such file");
      continue;
    }
    // RTLD_NOW: a missing symbol fails here, with its name, not at a call.
    void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* why = ::dlerror();
      tried.push_back(fmt::format("{}: {}", path.string(), why ? why : "not loadable"));
      continue;
    }
    void* entry = ::dlsym(handle, kTrainingEntry);
    if (entry == nullptr) {
      tried.push_back(fmt::format("{}: has no {}", path.string(), kTrainingEntry));
      continue;
    }
    return TrainingLibrary{reinterpret_cast<int (*)(TrainingCall*)>(entry), path.string()};
  }
  return failedPrecondition(
      fmt::format("cannot load the training library {} (install it next to geotrain-worker, or in "
                  "../lib/geotrain/; it is the build's target geotrain-worker-training): {}",
                  kTrainingLibrary, fmt::join(tried, "; ")));
}

std::optional<std::string> chooseBlasKernels() {
  if (const char* set = std::getenv("OPENBLAS_CORETYPE"); set != nullptr && *set != '\0') {
    return std::nullopt;
  }
#if defined(__x86_64__)
  __builtin_cpu_init();
  const char* core = nullptr;
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") &&
      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512vl")) {
    core = "SkylakeX";
  } else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    core = "Haswell";
  }
  if (core == nullptr) return std::nullopt;
  ::setenv("OPENBLAS_CORETYPE", core, /*overwrite=*/1);  // unset or empty
  return fmt::format(
      "OpenBLAS kernels: OPENBLAS_CORETYPE={} (the CPU has {}; set OPENBLAS_CORETYPE to choose "
      "otherwise)",
      core, std::string_view(core) == "SkylakeX" ? "AVX-512" : "AVX2 and FMA");
#else
  return std::nullopt;
#endif
}

bool fixMmapThreshold() {
  if (const char* set = std::getenv("MALLOC_MMAP_THRESHOLD_"); set != nullptr && *set != '\0') {
    return false;
  }
  return ::mallopt(M_MMAP_THRESHOLD, 1 << 20) == 1;
}

}  // namespace geo::app
