#include "worker/local/outputs.h"

#include <unistd.h>

#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <system_error>

namespace geo::local {

namespace fs = std::filesystem;

Status checkOutputFile(std::string_view flag, const fs::path& path, const fs::path& runFolder) {
  std::error_code error;
  const fs::file_status status = fs::status(path, error);
  if (fs::is_directory(status)) {
    return invalidArgument(
        fmt::format("{} {}: is a folder (allowed: a file path)", flag, path.string()));
  }
  const fs::path folder = path.parent_path();
  if (folder != runFolder) {
    const fs::file_status folderStatus = fs::status(folder, error);
    if (!fs::exists(folderStatus)) {
      return invalidArgument(
          fmt::format("{} {}: the folder {} does not exist", flag, path.string(), folder.string()));
    }
    if (!fs::is_directory(folderStatus)) {
      return invalidArgument(
          fmt::format("{} {}: {} is not a folder", flag, path.string(), folder.string()));
    }
    if (!fs::exists(status) && ::access(folder.c_str(), W_OK | X_OK) != 0) {
      return invalidArgument(fmt::format("{} {}: cannot create a file in {}: {}", flag,
                                         path.string(), folder.string(), std::strerror(errno)));
    }
  }
  if (fs::exists(status) && ::access(path.c_str(), W_OK) != 0) {
    return invalidArgument(
        fmt::format("{} {}: cannot write the file: {}", flag, path.string(), std::strerror(errno)));
  }
  return {};
}

OutputRollback::~OutputRollback() {
  if (keep_) return;
  std::error_code ignored;
  for (auto it = created_.rbegin(); it != created_.rend(); ++it) fs::remove_all(*it, ignored);
  for (const fs::path& dir : emptied_) {
    std::vector<fs::path> entries;  // listed first: removing while listing is unspecified
    for (const fs::directory_entry& entry : fs::directory_iterator(dir, ignored)) {
      entries.push_back(entry.path());
    }
    for (const fs::path& entry : entries) fs::remove_all(entry, ignored);
  }
}

void OutputRollback::folder(const fs::path& dir) {
  std::error_code error;
  if (fs::exists(dir, error)) {
    emptied_.push_back(dir);
    return;
  }
  // The outermost folder that does not exist yet: creating `dir` creates it.
  fs::path outermost = dir;
  for (fs::path parent = dir.parent_path();
       !parent.empty() && parent != outermost && !fs::exists(parent, error);
       parent = parent.parent_path()) {
    outermost = parent;
  }
  created_.push_back(outermost);
}

void OutputRollback::file(const fs::path& path) {
  std::error_code error;
  if (!fs::exists(fs::symlink_status(path, error))) created_.push_back(path);
}

}  // namespace geo::local
