#include "common/keys/keys.h"

#include <fcntl.h>
#include <sodium.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <span>
#include <system_error>

#include "common/keys/z85.h"

namespace geo::keys {
namespace {

constexpr size_t kRawKeyBytes = 32;  // X25519 keys; Z85 turns 4 bytes into 5 chars
static_assert(crypto_box_PUBLICKEYBYTES == kRawKeyBytes);
static_assert(crypto_box_SECRETKEYBYTES == kRawKeyBytes);
static_assert(crypto_scalarmult_BYTES == kRawKeyBytes);
static_assert(kZ85KeyChars == kRawKeyBytes * 5 / 4);

// Bytes that are wiped with sodium_memzero when they go out of scope, for
// every temporary that holds secret key material.
template <size_t N>
struct WipedBytes {
  std::array<uint8_t, N> bytes{};
  WipedBytes() = default;
  WipedBytes(const WipedBytes&) = delete;
  WipedBytes& operator=(const WipedBytes&) = delete;
  ~WipedBytes() { sodium_memzero(bytes.data(), bytes.size()); }
  uint8_t* data() { return bytes.data(); }
  char* chars() { return reinterpret_cast<char*>(bytes.data()); }
};

// sodium_init() must run before any other libsodium call; it is thread-safe
// and idempotent, but a function-local static makes the cost once per process.
// A failure (no entropy source at all) is not recoverable, so it throws.
void ensureSodium() {
  static const int result = sodium_init();
  GEO_ENFORCE(result >= 0, "sodium_init() failed: libsodium cannot be used on this system");
}

Status errnoStatus(int err, std::string message) {
  StatusCode code = StatusCode::kInternal;
  switch (err) {
    case ENOENT:
    case ENOTDIR: code = StatusCode::kNotFound; break;
    case EACCES:
    case EPERM:
    case EROFS: code = StatusCode::kPermissionDenied; break;
    case EEXIST: code = StatusCode::kAlreadyExists; break;
    case ENOSPC:
    case EDQUOT: code = StatusCode::kResourceExhausted; break;
    default: break;
  }
  return Status(code, fmt::format("{}: {}", message, std::strerror(err)));
}

std::string describeChar(char c) {
  const auto u = static_cast<unsigned char>(c);
  if (u >= 0x21 && u < 0x7F) return fmt::format("'{}'", c);
  return fmt::format("byte {:#04x}", u);
}

// Whether `key` is kZ85KeyChars characters of the Z85 alphabet, and if not,
// why. Secret key material never appears in the message: only the position
// and (for a non-alphabet character) the character itself, which a key file
// cannot contain anyway.
Status checkZ85Text(std::string_view key) {
  if (key.size() != kZ85KeyChars) {
    return invalidArgument(
        fmt::format("a key has {} Z85 characters, got {}", kZ85KeyChars, key.size()));
  }
  for (size_t i = 0; i < key.size(); ++i) {
    if (kZ85Alphabet.find(key[i]) == std::string_view::npos) {
      return invalidArgument(
          fmt::format("character {} ({}) is not a Z85 character", i + 1, describeChar(key[i])));
    }
  }
  return {};
}

// Decodes a 40-character Z85 key into `out`. Besides the alphabet, Z85 rejects
// 5-character groups worth more than 2^32 - 1 (e.g. "#####").
Status decodeZ85Key(std::string_view key, uint8_t* out) {
  GEO_RETURN_IF_ERROR(checkZ85Text(key));
  if (!z85Decode(key, std::span<uint8_t>(out, kRawKeyBytes)).ok()) {
    return invalidArgument(
        "not a valid Z85 key: a 5-character group encodes a value above 2^32 - 1");
  }
  return {};
}

std::string encodeZ85Key(const uint8_t* raw) {
  WipedBytes<kZ85KeyChars> text;
  z85Encode(std::span<const uint8_t>(raw, kRawKeyBytes),
            std::span<char>(text.chars(), kZ85KeyChars));
  return std::string(text.chars(), kZ85KeyChars);
}

// A key file name: one path component, so that `name` cannot escape `dir`.
Status checkKeyName(const std::string& name) {
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos ||
      name.find('\0') != std::string::npos) {
    return invalidArgument(fmt::format(
        "key name '{}' is not a plain file name (non-empty, no '/', not '.' or '..')", name));
  }
  return {};
}

Status writeAll(int fd, std::string_view data, const std::filesystem::path& path) {
  while (!data.empty()) {
    const ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return errnoStatus(errno, fmt::format("cannot write {}", path.string()));
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return {};
}

// Creates `path` with O_EXCL (never replaces an existing file, never follows a
// symlink planted at `path`), writes `key` (kZ85KeyChars characters, checked
// by the caller) and a newline, sets `mode` exactly (the umask could otherwise
// turn 0644 into 0600) and fsyncs. On any failure the file is removed again,
// so nothing half-written remains.
Status writeKeyFile(const std::filesystem::path& path, std::string_view key, mode_t mode) {
  const int fd = ::open(path.c_str(), O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC | O_NOFOLLOW, mode);
  if (fd < 0) {
    const int err = errno;
    if (err == EEXIST) {
      return Status(StatusCode::kAlreadyExists,
                    fmt::format("{} already exists; refusing to overwrite a key (move it away or "
                                "choose another --name/--out)",
                                path.string()));
    }
    return errnoStatus(err, fmt::format("cannot create {}", path.string()));
  }
  // One write of key + newline from a buffer that is wiped afterwards.
  WipedBytes<kZ85KeyChars + 1> contents;
  std::memcpy(contents.data(), key.data(), kZ85KeyChars);
  contents.bytes[kZ85KeyChars] = '\n';
  Status status = writeAll(fd, std::string_view(contents.chars(), contents.bytes.size()), path);
  if (status.ok() && ::fchmod(fd, mode) != 0) {
    status = errnoStatus(errno, fmt::format("cannot set the mode of {}", path.string()));
  }
  if (status.ok() && ::fsync(fd) != 0) {
    status = errnoStatus(errno, fmt::format("cannot fsync {}", path.string()));
  }
  if (::close(fd) != 0 && status.ok()) {
    status = errnoStatus(errno, fmt::format("cannot close {}", path.string()));
  }
  if (!status.ok()) ::unlink(path.c_str());
  return status;
}

// Creates `dir` (mode 0700) and any missing parents (default mode).
Status ensureDirectory(const std::filesystem::path& dir) {
  std::error_code ec;
  if (std::filesystem::is_directory(dir, ec)) return {};
  if (std::filesystem::exists(dir, ec)) {
    return failedPrecondition(fmt::format("{} exists and is not a directory", dir.string()));
  }
  const std::filesystem::path parent = dir.parent_path();
  if (!parent.empty()) {
    std::filesystem::create_directories(parent, ec);
    if (ec) {
      return errnoStatus(ec.value(), fmt::format("cannot create directory {}", parent.string()));
    }
  }
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return errnoStatus(errno, fmt::format("cannot create directory {}", dir.string()));
  }
  return {};
}

// Reads a key file. The checks look at the opened descriptor (fstat), so the
// file that was checked is the file that is read. O_NONBLOCK keeps a FIFO at
// `path` from blocking the open; it is then refused as not a regular file.
StatusOr<std::string> loadKey(const std::filesystem::path& path, bool secret,
                              SecretKeyAccess access = SecretKeyAccess::kOwnerOnly) {
  const char* what = secret ? "secret key file" : "public key file";
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) {
      return notFound(fmt::format("{} {} does not exist", what, path.string()));
    }
    return errnoStatus(err, fmt::format("cannot open {} {}", what, path.string()));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return errnoStatus(err, fmt::format("cannot stat {} {}", what, path.string()));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return invalidArgument(fmt::format("{} {} is not a regular file", what, path.string()));
  }
  const bool groupRead = access == SecretKeyAccess::kOwnerAndGroupRead;
  if (secret && (st.st_mode & (groupRead ? 037 : 077)) != 0) {
    ::close(fd);
    return Status(StatusCode::kPermissionDenied,
                  groupRead ? fmt::format("{} {} has mode {:04o}, so others can access it or its "
                                          "group can write it; a secret key must be private: "
                                          "run `chmod 640 {}`",
                                          what, path.string(), st.st_mode & 07777, path.string())
                            : fmt::format("{} {} has mode {:04o}, so group or others can access "
                                          "it; a secret key must be private: run `chmod 600 {}`",
                                          what, path.string(), st.st_mode & 07777, path.string()));
  }

  // Read one byte more than the largest valid file, so that a file that grew
  // after fstat is still reported as too long.
  WipedBytes<kZ85KeyChars + 2> buffer;
  size_t size = 0;
  while (size < buffer.bytes.size()) {
    const ssize_t n = ::read(fd, buffer.data() + size, buffer.bytes.size() - size);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      return errnoStatus(err, fmt::format("cannot read {} {}", what, path.string()));
    }
    if (n == 0) break;
    size += static_cast<size_t>(n);
  }
  ::close(fd);

  if (size < kZ85KeyChars || size > kZ85KeyChars + 1) {
    // Past the buffer only fstat knows the real size.
    const uint64_t found = size > kZ85KeyChars + 1
                               ? std::max<uint64_t>(size, static_cast<uint64_t>(st.st_size))
                               : size;
    return invalidArgument(fmt::format(
        "{} {} has {} bytes; expected {} Z85 characters, optionally followed by a newline", what,
        path.string(), found, kZ85KeyChars));
  }
  if (size == kZ85KeyChars + 1 && buffer.bytes[kZ85KeyChars] != '\n') {
    return invalidArgument(fmt::format(
        "{} {} has 41 bytes and byte 41 is {}; expected {} Z85 characters, optionally followed "
        "by a newline",
        what, path.string(), describeChar(static_cast<char>(buffer.bytes[kZ85KeyChars])),
        kZ85KeyChars));
  }
  const std::string_view text(buffer.chars(), kZ85KeyChars);
  WipedBytes<kRawKeyBytes> raw;
  Status status = decodeZ85Key(text, raw.data());
  if (!status.ok()) return status.withContext(fmt::format("{} {}", what, path.string()));
  return std::string(text);
}

}  // namespace

bool isZ85Key(const std::string& key) {
  WipedBytes<kRawKeyBytes> raw;
  return decodeZ85Key(key, raw.data()).ok();
}

CurveKeyPair generateKeyPair() {
  ensureSodium();
  std::array<uint8_t, kRawKeyBytes> publicRaw{};
  WipedBytes<kRawKeyBytes> secretRaw;
  // crypto_box_keypair is what zmq_curve_keypair uses: an X25519 keypair from
  // libsodium's CSPRNG. It cannot fail once sodium_init has succeeded.
  crypto_box_keypair(publicRaw.data(), secretRaw.data());
  CurveKeyPair keys;
  keys.publicKey = encodeZ85Key(publicRaw.data());
  keys.secretKey = encodeZ85Key(secretRaw.data());
  return keys;
}

StatusOr<std::string> publicKeyOf(const std::string& secretKeyZ85) {
  ensureSodium();
  WipedBytes<kRawKeyBytes> secretRaw;
  Status status = decodeZ85Key(secretKeyZ85, secretRaw.data());
  if (!status.ok()) return status.withContext("secret key");
  std::array<uint8_t, kRawKeyBytes> publicRaw{};
  if (crypto_scalarmult_base(publicRaw.data(), secretRaw.data()) != 0) {
    return internalError("crypto_scalarmult_base failed on the secret key");
  }
  return encodeZ85Key(publicRaw.data());
}

Status writeKeyPair(const CurveKeyPair& keys, const std::filesystem::path& dir,
                    const std::string& name) {
  GEO_RETURN_IF_ERROR(checkKeyName(name));
  if (!isZ85Key(keys.publicKey)) return invalidArgument("the public key is not a valid Z85 key");
  // Refuse a pair whose halves do not belong together: the file would load
  // fine and only fail later, as a CURVE handshake that never completes.
  StatusOr<std::string> derived = publicKeyOf(keys.secretKey);
  if (!derived.ok()) return derived.status();
  if (*derived != keys.publicKey) {
    return invalidArgument("the public key does not belong to the secret key");
  }

  // Strip a trailing separator ("keys/") so that parent_path() is the parent.
  std::filesystem::path directory = dir.empty() ? std::filesystem::path(".") : dir;
  if (!directory.has_filename() && directory.has_parent_path() &&
      directory != directory.root_path()) {
    directory = directory.parent_path();
  }
  const std::filesystem::path secretPath = directory / (name + ".key");
  const std::filesystem::path publicPath = directory / (name + ".pub");

  // Check both before creating anything (including the directory), so an
  // existing .pub does not leave behind a fresh .key. O_EXCL below still
  // closes the race with a concurrent writer.
  for (const auto& path : {secretPath, publicPath}) {
    struct stat st {};
    if (::lstat(path.c_str(), &st) == 0) {
      return Status(StatusCode::kAlreadyExists,
                    fmt::format("{} already exists; refusing to overwrite a key (move it away or "
                                "choose another --name/--out)",
                                path.string()));
    }
  }

  GEO_RETURN_IF_ERROR(ensureDirectory(directory));
  GEO_RETURN_IF_ERROR(writeKeyFile(secretPath, keys.secretKey, 0600));
  Status status = writeKeyFile(publicPath, keys.publicKey, 0644);
  if (!status.ok()) {
    ::unlink(secretPath.c_str());
    return status;
  }
  // Make the two new directory entries durable too (best effort: some file
  // systems refuse fsync on a directory, and the files themselves are synced).
  const int dirFd = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dirFd >= 0) {
    (void)::fsync(dirFd);
    ::close(dirFd);
  }
  return {};
}

StatusOr<std::string> loadPublicKey(const std::filesystem::path& path) {
  return loadKey(path, /*secret=*/false);
}

StatusOr<std::string> loadSecretKey(const std::filesystem::path& path, SecretKeyAccess access) {
  return loadKey(path, /*secret=*/true, access);
}

}  // namespace geo::keys
