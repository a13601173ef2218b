#include "worker/app/training_library.h"

#include <dlfcn.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <filesystem>
#include <string>
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

}  // namespace geo::app
