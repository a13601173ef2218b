#pragma once
// A folder of checkpoints on disk: written atomically with a checksum
// sidecar, read back only when the checksum matches, rotated so that at
// least one that verifies is kept. Bytes in, bytes out: what a checkpoint
// holds (the LibTorch archive of the model, optimizer and synchronizer) is
// the Trainer's; this store knows files, fsync and SHA-256 only, and needs
// no LibTorch.
//
// Files: <dir>/ckpt-<step, 10 digits>.pt and its sidecar
// <dir>/ckpt-<step>.pt.sum ("geotrain checkpoint checksum v1", the file's
// name, byte count and SHA-256).
//
// Thread-compatible: one writer (the training thread).

#include <cstdint>
#include <filesystem>
#include <functional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"

namespace geo::train {

struct CheckpointFile {
  std::string bytes;
  bool verified = false;  // false: no sidecar (an older version wrote it)
};

class CheckpointStore {
 public:
  // `keep`: how many of the newest checkpoints rotation keeps (>= 1).
  CheckpointStore(std::filesystem::path dir, int keep);

  const std::filesystem::path& dir() const { return dir_; }

  // Writes the checkpoint of `step` and its sidecar, each to a temporary
  // file that is fsynced, then renames the sidecar and the checkpoint into
  // place (fsyncing the folder after each), then rotates. Unavailable names
  // the file and the error (ENOSPC, EIO, EROFS, a folder that cannot be
  // made), and nothing of the failed write is left behind.
  // `beforeRename` (a test seam) runs between the writes and the renames.
  Status write(int64_t step, std::string_view bytes,
               const std::function<void()>& beforeRename = {});

  // The checkpoints in the folder, newest first.
  std::vector<std::pair<int64_t, std::filesystem::path>> list() const;

  // Reads a checkpoint and checks it against its sidecar. DataLoss names
  // the file and what is wrong: an unreadable or malformed sidecar, a size
  // or a SHA-256 that differs from what was written. A checkpoint without a
  // sidecar (an older version's) is returned unverified.
  static StatusOr<CheckpointFile> read(const std::filesystem::path& path);

  // A checkpoint the reader refused for its contents (another model or
  // optimizer, a NaN): rotation no longer counts it as one that verifies.
  void refuse(const std::filesystem::path& path) { refused_.insert(path); }

  static std::filesystem::path checksumPath(const std::filesystem::path& checkpoint);

 private:
  // Deletes checkpoints beyond keep_ -- keeping, when none of those
  // verifies, the newest one that does -- and sidecars whose checkpoint is
  // gone. `written` is the one just written.
  void rotate(const std::filesystem::path& written);

  std::filesystem::path dir_;
  int keep_;
  std::set<std::filesystem::path> refused_;
};

}  // namespace geo::train
