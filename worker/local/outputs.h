#pragma once
// The outputs of a `geotrain local` run before it starts: the files named by
// flags (--csv, --prometheus-config, --plot), which may lie outside the run
// folder, are checked before anything is written; and whatever the run wrote
// is taken back when it fails before its workers start, so that the same
// command (the same --out) can simply be run again.
//
// Plain functions and a scope guard over std::filesystem; nothing throws.
// Thread-compatible.

#include <filesystem>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace geo::local {

// Whether a file can be written at `path` (absolute), given with `flag`:
// `path` is not a folder and, if it exists, may be written; its folder
// exists, is a folder and may be written into -- unless that folder is
// `runFolder`, which the run creates. InvalidArgument naming the flag, the
// path and what is wrong. (As root, permissions always pass: only a missing
// folder, a folder in place of a file or a read-only file system fail then.)
Status checkOutputFile(std::string_view flag, const std::filesystem::path& path,
                       const std::filesystem::path& runFolder);

// Takes back what a run created, unless keep() was called before it goes out
// of scope. Register each path before creating it:
//   folder(dir): a folder that did not exist is removed with everything in it,
//     and so is each of its parents that did not exist either; a folder that
//     existed (empty, as the run folder must be) is emptied again;
//   file(path): a file that did not exist is removed; one that existed was
//     overwritten by the run and is left as it is.
class OutputRollback {
 public:
  OutputRollback() = default;
  ~OutputRollback();
  OutputRollback(const OutputRollback&) = delete;
  OutputRollback& operator=(const OutputRollback&) = delete;

  void folder(const std::filesystem::path& dir);
  void file(const std::filesystem::path& path);
  void keep() { keep_ = true; }

 private:
  std::vector<std::filesystem::path> created_;  // removed with their contents
  std::vector<std::filesystem::path> emptied_;  // existed: only their contents go
  bool keep_ = false;
};

}  // namespace geo::local
