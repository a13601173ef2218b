#pragma once
// NumPy's .npy files (format versions 1.0, 2.0 and 3.0), memory-mapped.
//
// What a user has: `numpy.save("train_x.npy", x)` writes one array as a short
// header (a Python dict literal: dtype, memory order, shape) followed by the
// raw elements. openNpy() reads and checks the header and maps the file
// read-only, so a data set of many gigabytes costs page cache, not private
// memory, and only the pages a worker touches are read from disk.
//
// Supported: little-endian (or single-byte) booleans, integers and floats
// ('|b1', '|u1', '|i1', '<i2', '<u2', '<i4', '<u4', '<i8', '<u8', '<f2', '<f4',
// '<f8'), C order. Refused, with a message that names the file and what to
// do: big-endian data, Fortran order, object and structured dtypes, a file
// shorter or longer than its header says.
//
// Threading: an NpyArray is immutable once opened; its bytes may be read from
// any thread. No LibTorch here (see dataset.cc for the tensors).

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace geo::train {

enum class NpyKind { kBool, kUnsigned, kSigned, kFloat };

struct NpyArray {
  std::filesystem::path path;
  std::string descr;  // as written, e.g. "<f4"
  NpyKind kind = NpyKind::kFloat;
  size_t itemSize = 4;         // bytes per element
  std::vector<int64_t> shape;  // () for a scalar
  // The elements, C order; valid while `mapping` (or a copy of it) lives.
  const std::byte* data = nullptr;
  size_t bytes = 0;
  std::shared_ptr<const void> mapping;  // unmaps the file when the last owner goes

  int64_t elements() const;
  // "float32 [60000, 784]", for messages.
  std::string describe() const;
};

// A whole regular file, mapped read-only (the .npy arrays and the token
// files): unmapped when the last copy of `mapping` goes.
struct MappedFile {
  std::shared_ptr<const void> mapping;
  const std::byte* data = nullptr;
  size_t size = 0;
};

// Errors: NotFound (no such file), PermissionDenied, DataLoss (not a regular
// file, an empty one, one that cannot be mapped); each names the file.
StatusOr<MappedFile> mapFile(const std::filesystem::path& path);

// Parses a .npy header (the bytes from the magic string on; `fileBytes` is
// the whole file's size). Exposed for tests; openNpy() is the entry point.
// On success sets every field of `out` but data/mapping, and `*dataOffset`.
Status parseNpyHeader(std::string_view head, size_t fileBytes, const std::filesystem::path& path,
                      NpyArray& out, size_t* dataOffset);

// Opens and maps `path`. Errors: NotFound (no such file), PermissionDenied,
// DataLoss (not a .npy file, a damaged header, a truncated or over-long
// payload), InvalidArgument (a dtype or order this loader does not take;
// the message says how to convert it in NumPy).
StatusOr<NpyArray> openNpy(const std::filesystem::path& path);

}  // namespace geo::train
