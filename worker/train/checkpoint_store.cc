#include "worker/train/checkpoint_store.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sodium.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <optional>
#include <regex>
#include <sstream>

#include "common/logging.h"

namespace geo::train {

namespace fs = std::filesystem;

namespace {

bool syncPath(const fs::path& path, bool directory) {
  const int fd = ::open(path.c_str(), (directory ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC);
  if (fd < 0) return false;
  const bool ok = ::fsync(fd) == 0;
  ::close(fd);
  return ok;
}

// Checkpoints in `dir`, newest first.
std::vector<std::pair<int64_t, fs::path>> listCheckpoints(const fs::path& dir) {
  std::vector<std::pair<int64_t, fs::path>> out;
  std::error_code ec;
  static const std::regex kName(R"(ckpt-(\d+)\.pt)");
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    std::smatch m;
    const std::string name = entry.path().filename().string();
    if (std::regex_match(name, m, kName)) out.emplace_back(std::stoll(m[1]), entry.path());
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  return out;
}

// Checkpoint integrity. LibTorch does not check its archive's CRCs when it
// reads one, so a flipped bit in a tensor loads as a wrong value. Every
// checkpoint therefore gets a sidecar, <name>.sum, with its byte count and
// the SHA-256 of the whole file, and is loaded only if both match.
//  - A sidecar rather than a trailer: the .pt stays a plain LibTorch archive
//    that other tools (and older versions of this worker) read as before.
//  - SHA-256 (libsodium, already a dependency): a cryptographic hash makes
//    an accidental match of a damaged file practically impossible, whatever
//    the damage; its cost (some 200 MB/s on one core: half a second for a
//    ResNet-18 checkpoint) is small next to the checkpoint interval. The
//    byte count only makes a truncation say so.
//  - Atomicity: both files are written to temporaries and fsynced; the
//    sidecar is renamed into place (and the folder fsynced) before the
//    checkpoint is. A crash in between leaves a sidecar without its
//    checkpoint (removed by the next rotation) -- or, when a checkpoint of
//    that step existed, the old file with the new sidecar, which is refused
//    like any damaged one -- but never a new checkpoint without its sidecar,
//    which would be loaded unverified.
//  - A checkpoint without a sidecar was written by an older version: it is
//    loaded unverified, with a warning (the finiteness and fit checks still
//    apply).
constexpr const char* kChecksumHeader = "geotrain checkpoint checksum v1";

std::string sha256Hex(std::string_view bytes) {
  // SHA-256 has a single, portable implementation in libsodium: the result
  // of sodium_init() (runtime CPU dispatch for other primitives) does not
  // affect it.
  static const int sodiumReady = sodium_init();
  (void)sodiumReady;
  unsigned char digest[crypto_hash_sha256_BYTES];
  crypto_hash_sha256(digest, reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size());
  char hex[2 * crypto_hash_sha256_BYTES + 1];
  sodium_bin2hex(hex, sizeof hex, digest, sizeof digest);
  return hex;
}

std::string checksumText(const fs::path& checkpoint, std::string_view bytes) {
  return fmt::format("{}\nfile {}\nbytes {}\nsha256 {}\n", kChecksumHeader,
                     checkpoint.filename().string(), bytes.size(), sha256Hex(bytes));
}

// Writes `bytes` to `path` (created or truncated) and fsyncs it.
Status writeFileSynced(const fs::path& path, std::string_view bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    return unavailable(
        fmt::format("checkpoint: cannot create {}: {}", path.string(), std::strerror(errno)));
  }
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      ::close(fd);
      return unavailable(fmt::format("checkpoint: writing {} failed: {}", path.string(),
                                     n < 0 ? std::strerror(err) : "no progress"));
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) {
    const int err = errno;
    ::close(fd);
    return unavailable(
        fmt::format("checkpoint: fsync of {} failed: {}", path.string(), std::strerror(err)));
  }
  if (::close(fd) != 0) {
    return unavailable(
        fmt::format("checkpoint: closing {} failed: {}", path.string(), std::strerror(errno)));
  }
  return {};
}

std::optional<std::string> readWholeFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return std::nullopt;
  const std::streamoff size = in.tellg();
  if (size < 0) return std::nullopt;
  std::string bytes(static_cast<size_t>(size), '\0');
  in.seekg(0);
  in.read(bytes.data(), size);
  if (in.gcount() != size) return std::nullopt;
  return bytes;
}

}  // namespace

StatusOr<CheckpointFile> CheckpointStore::read(const fs::path& path) {
  CheckpointFile file;
  auto bytes = readWholeFile(path);
  if (!bytes) return dataLoss(fmt::format("checkpoint {} cannot be opened", path.string()));
  file.bytes = std::move(*bytes);
  const fs::path sumPath = checksumPath(path);
  std::error_code ec;
  if (!fs::exists(sumPath, ec)) return file;
  const auto text = readWholeFile(sumPath);
  if (!text) {
    return dataLoss(fmt::format("checkpoint {}: its checksum file {} cannot be read", path.string(),
                                sumPath.filename().string()));
  }
  std::istringstream lines(*text);
  std::string header, fileKey, name, bytesKey, shaKey, sha;
  uint64_t size = 0;
  std::getline(lines, header);
  lines >> fileKey >> name >> bytesKey >> size >> shaKey >> sha;
  if (!lines || header != kChecksumHeader || fileKey != "file" || bytesKey != "bytes" ||
      shaKey != "sha256" || sha.size() != 2 * crypto_hash_sha256_BYTES) {
    return dataLoss(fmt::format("checkpoint {}: its checksum file {} is malformed", path.string(),
                                sumPath.filename().string()));
  }
  if (name != path.filename().string()) {
    return dataLoss(fmt::format("checkpoint {}: its checksum file {} is for {}", path.string(),
                                sumPath.filename().string(), name));
  }
  if (file.bytes.size() != size) {
    return dataLoss(fmt::format("checkpoint {} is {}: it has {} bytes, {} were written",
                                path.string(), file.bytes.size() < size ? "truncated" : "too long",
                                file.bytes.size(), size));
  }
  const std::string actual = sha256Hex(file.bytes);
  if (actual != sha) {
    return dataLoss(fmt::format(
        "checkpoint {} is corrupt: its SHA-256 is {}, {} says {} (the file changed after it was "
        "written)",
        path.string(), actual, sumPath.filename().string(), sha));
  }
  file.verified = true;
  return file;
}

CheckpointStore::CheckpointStore(fs::path dir, int keep) : dir_(std::move(dir)), keep_(keep) {}

fs::path CheckpointStore::checksumPath(const fs::path& checkpoint) {
  return checkpoint.parent_path() / (checkpoint.filename().string() + ".sum");
}

std::vector<std::pair<int64_t, fs::path>> CheckpointStore::list() const {
  return listCheckpoints(dir_);
}

Status CheckpointStore::write(int64_t step, std::string_view bytes,
                              const std::function<void()>& beforeRename) {
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) {
    return unavailable(
        fmt::format("checkpoint: cannot create {}: {}", dir_.string(), ec.message()));
  }
  const fs::path final = dir_ / fmt::format("ckpt-{:010d}.pt", step);
  const fs::path tmp = dir_ / fmt::format(".ckpt-{:010d}.pt.tmp", step);
  const fs::path sumFinal = checksumPath(final);
  const fs::path sumTmp = dir_ / fmt::format(".ckpt-{:010d}.pt.sum.tmp", step);
  Status written = writeFileSynced(tmp, bytes);
  if (written.ok()) written = writeFileSynced(sumTmp, checksumText(final, bytes));
  if (!written.ok()) {
    fs::remove(tmp, ec);
    fs::remove(sumTmp, ec);
    return written;
  }
  if (beforeRename) beforeRename();
  // The sidecar first (see kChecksumHeader).
  fs::rename(sumTmp, sumFinal, ec);
  if (ec) {
    fs::remove(tmp, ec);
    fs::remove(sumTmp, ec);
    return unavailable(fmt::format("checkpoint: rename to {} failed", sumFinal.string()));
  }
  syncPath(dir_, true);
  fs::rename(tmp, final, ec);
  if (ec) {
    fs::remove(tmp, ec);
    return unavailable(fmt::format("checkpoint: rename to {} failed", final.string()));
  }
  syncPath(dir_, true);
  refused_.erase(final);
  rotate(final);
  return {};
}

void CheckpointStore::rotate(const fs::path& written) {
  const fs::path& dir = dir_;
  const auto all = list();
  // What verifies is what resume() would not refuse for its bytes: a
  // checksum that matches, or no sidecar at all (an older version's). The
  // one just written verifies by construction: its sidecar holds the hash of
  // the very bytes written and fsynced (reading it back would come from the
  // page cache and prove nothing more), so the usual rotation reads nothing.
  auto verifies = [&](const fs::path& path) {
    if (refused_.count(path) != 0) return false;
    if (path == written) return true;
    return read(path).ok();
  };
  const size_t keep = std::min(all.size(), static_cast<size_t>(keep_));
  bool keptOneThatVerifies = false;
  for (size_t i = 0; i < keep && !keptOneThatVerifies; ++i) {
    keptOneThatVerifies = verifies(all[i].second);
  }
  std::optional<size_t> alsoKeep;
  for (size_t i = keep; i < all.size() && !keptOneThatVerifies && !alsoKeep; ++i) {
    if (verifies(all[i].second)) alsoKeep = i;
  }
  if (alsoKeep) {
    logger()->warn("checkpoint: none of the newest {} checkpoints in {} verifies; keeping {} too",
                   keep, dir.string(), all[*alsoKeep].second.filename().string());
  }
  std::error_code ec;
  for (size_t i = keep; i < all.size(); ++i) {
    if (alsoKeep && i == *alsoKeep) continue;
    fs::remove(all[i].second, ec);
    fs::remove(checksumPath(all[i].second), ec);
  }
  // Sidecars whose checkpoint is gone (a crash between the two renames).
  static const std::regex kSum(R"(ckpt-\d+\.pt\.sum)");
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (!std::regex_match(name, kSum)) continue;
    const fs::path checkpoint = dir / name.substr(0, name.size() - 4);
    if (!fs::exists(checkpoint, ec)) fs::remove(entry.path(), ec);
  }
}

}  // namespace geo::train
