#pragma once
// Z85 (ZeroMQ RFC 32): four bytes as five printable characters, the text form
// of CurveZMQ keys. Written here, not taken from libzmq, so that key files can
// be read and written by programs that do not link ZeroMQ (the controller).
//
// Encoding: each group of 4 bytes is a big-endian 32-bit value written as 5
// base-85 digits, most significant first, from the alphabet kZ85Alphabet.
// Only whole groups exist: bytes come in multiples of 4, text in multiples of
// 5. A group of 5 characters can spell values up to 85^5 - 1 > 2^32 - 1;
// those are not encodings of anything and are refused.

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "common/status.h"

namespace geo::keys {

inline constexpr std::string_view kZ85Alphabet =
    "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#";

// Encodes `bytes` into `out`. Contract: bytes.size() is a multiple of 4 and
// out.size() == bytes.size() / 4 * 5 (GEO_ENFORCE otherwise). No terminator
// is written. Callers that hold secret material pass a buffer they wipe.
void z85Encode(std::span<const uint8_t> bytes, std::span<char> out);

// The same, returned as a string.
std::string z85Encode(std::span<const uint8_t> bytes);

// Decodes `text` into `out`. Contract: out.size() == text.size() / 5 * 4
// (GEO_ENFORCE otherwise). InvalidArgument, naming the position, when
// text.size() is not a multiple of 5, a character is not in kZ85Alphabet, or
// a 5-character group encodes a value above 2^32 - 1; `out` is then
// unspecified (the caller wipes it if it matters). The message never quotes
// the text, which may be a secret key: only the offending character when it
// is not a Z85 character at all.
Status z85Decode(std::string_view text, std::span<uint8_t> out);

}  // namespace geo::keys
