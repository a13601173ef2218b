#pragma once
// CurveZMQ keys: X25519 keypairs in Z85 text form (40 characters per key), as
// `geotrain keygen` and the controller write them and the transport loads
// them. The library (geo_keys) depends on libsodium only, never on ZeroMQ:
// the controller writes key Secrets without linking the transport.
//
// Files: <dir>/<name>.key holds the secret key (mode 0600, created with
// O_EXCL so an existing key is never overwritten), <dir>/<name>.pub the public
// key (mode 0644). Each holds the 40 Z85 characters, optionally followed by a
// newline; anything else is an error.
//
// Loading refuses, with a Status naming the path and the problem: a missing or
// unreadable file, wrong size or characters that are not Z85, and a secret key
// file that group or others can read (like ssh, a leaked key is worse than a
// failed start; SecretKeyAccess::kOwnerAndGroupRead admits group read).

#include <filesystem>
#include <string>

#include "common/status.h"

namespace geo::keys {

inline constexpr size_t kZ85KeyChars = 40;

struct CurveKeyPair {
  std::string publicKey;  // 40 Z85 characters
  std::string secretKey;  // 40 Z85 characters
};

// A fresh keypair from libsodium's CSPRNG (crypto_box_keypair).
CurveKeyPair generateKeyPair();

// Derives the public key of a Z85 secret key (crypto_scalarmult_base).
StatusOr<std::string> publicKeyOf(const std::string& secretKeyZ85);

// Writes <dir>/<name>.key (0600) and <dir>/<name>.pub (0644); fails without
// touching anything if either exists. Creates `dir` if needed (0700).
Status writeKeyPair(const CurveKeyPair& keys, const std::filesystem::path& dir,
                    const std::string& name);

// Who may read a secret key file besides its owner.
enum class SecretKeyAccess {
  kOwnerOnly,  // mode 0600 or 0400: what `geotrain keygen` writes
  // The file's group may read it too (0640, 0440), others still not:
  // Kubernetes mounts a Secret into a non-root pod as root:<fsGroup> 0440.
  kOwnerAndGroupRead,
};

StatusOr<std::string> loadPublicKey(const std::filesystem::path& path);
StatusOr<std::string> loadSecretKey(const std::filesystem::path& path,
                                    SecretKeyAccess access = SecretKeyAccess::kOwnerOnly);

// Whether `key` is 40 valid Z85 characters.
bool isZ85Key(const std::string& key);

}  // namespace geo::keys
