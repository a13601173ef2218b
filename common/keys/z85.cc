#include "common/keys/z85.h"

#include <fmt/format.h>

#include <array>

namespace geo::keys {
namespace {

// Character -> digit, 0xFF for a character outside the alphabet.
constexpr std::array<uint8_t, 256> makeDigits() {
  std::array<uint8_t, 256> digits{};
  for (auto& d : digits) d = 0xFF;
  for (size_t i = 0; i < kZ85Alphabet.size(); ++i) {
    digits[static_cast<unsigned char>(kZ85Alphabet[i])] = static_cast<uint8_t>(i);
  }
  return digits;
}
constexpr std::array<uint8_t, 256> kDigits = makeDigits();
static_assert(kZ85Alphabet.size() == 85);

std::string describeChar(char c) {
  const auto u = static_cast<unsigned char>(c);
  if (u >= 0x21 && u < 0x7F) return fmt::format("'{}'", c);
  return fmt::format("byte {:#04x}", u);
}

}  // namespace

void z85Encode(std::span<const uint8_t> bytes, std::span<char> out) {
  GEO_ENFORCE(bytes.size() % 4 == 0, "z85Encode: {} bytes is not a multiple of 4", bytes.size());
  GEO_ENFORCE(out.size() == bytes.size() / 4 * 5,
              "z85Encode: {} bytes need {} characters, the buffer has {}", bytes.size(),
              bytes.size() / 4 * 5, out.size());
  for (size_t g = 0; g < bytes.size() / 4; ++g) {
    uint32_t value = 0;
    for (size_t i = 0; i < 4; ++i) value = (value << 8) | bytes[g * 4 + i];
    for (size_t i = 5; i-- > 0;) {
      out[g * 5 + i] = kZ85Alphabet[value % 85];
      value /= 85;
    }
  }
}

std::string z85Encode(std::span<const uint8_t> bytes) {
  std::string text(bytes.size() / 4 * 5, '\0');
  z85Encode(bytes, std::span<char>(text.data(), text.size()));
  return text;
}

Status z85Decode(std::string_view text, std::span<uint8_t> out) {
  if (text.size() % 5 != 0) {
    return invalidArgument(fmt::format(
        "Z85 text has {} characters, not a multiple of 5 (each 5 encode 4 bytes)", text.size()));
  }
  GEO_ENFORCE(out.size() == text.size() / 5 * 4,
              "z85Decode: {} characters decode to {} bytes, the buffer has {}", text.size(),
              text.size() / 5 * 4, out.size());
  for (size_t g = 0; g < text.size() / 5; ++g) {
    uint64_t value = 0;  // 85^5 - 1 fits in 64 bits: check the range once, at the end
    for (size_t i = 0; i < 5; ++i) {
      const char c = text[g * 5 + i];
      const uint8_t digit = kDigits[static_cast<unsigned char>(c)];
      if (digit == 0xFF) {
        return invalidArgument(fmt::format("character {} ({}) is not a Z85 character",
                                           g * 5 + i + 1, describeChar(c)));
      }
      value = value * 85 + digit;
    }
    if (value > 0xFFFFFFFFu) {
      return invalidArgument(
          fmt::format("Z85 characters {}-{}: a 5-character group encodes a value above 2^32 - 1",
                      g * 5 + 1, g * 5 + 5));
    }
    for (size_t i = 0; i < 4; ++i) {
      out[g * 4 + i] = static_cast<uint8_t>(value >> (8 * (3 - i)));
    }
  }
  return {};
}

}  // namespace geo::keys
