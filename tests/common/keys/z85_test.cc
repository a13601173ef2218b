#include "common/keys/z85.h"

#include <gtest/gtest.h>
#include <zmq.h>

#include <array>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace geo::keys {
namespace {

std::vector<uint8_t> decode(const std::string& text) {
  std::vector<uint8_t> out(text.size() / 5 * 4);
  const Status s = z85Decode(text, out);
  EXPECT_TRUE(s.ok()) << s.message();
  return out;
}

// The example of ZeroMQ RFC 32.
TEST(Z85, EncodesTheRfcExample) {
  const std::vector<uint8_t> bytes = {0x86, 0x4F, 0xD2, 0x6F, 0xB5, 0x59, 0xF7, 0x5B};
  EXPECT_EQ(z85Encode(bytes), "HelloWorld");
  EXPECT_EQ(decode("HelloWorld"), bytes);
}

TEST(Z85, EncodesTheExtremeGroups) {
  EXPECT_EQ(z85Encode(std::vector<uint8_t>{0, 0, 0, 0}), "00000");
  // 2^32 - 1 is the largest value of a group: "%nSc0" in Z85.
  EXPECT_EQ(z85Encode(std::vector<uint8_t>{0xFF, 0xFF, 0xFF, 0xFF}), "%nSc0");
  EXPECT_EQ(decode("%nSc0"), (std::vector<uint8_t>{0xFF, 0xFF, 0xFF, 0xFF}));
  EXPECT_EQ(z85Encode(std::vector<uint8_t>{}), "");
  EXPECT_TRUE(decode("").empty());
}

// libzmq's encoder is an independent implementation of the same RFC.
TEST(Z85, AgreesWithZeroMqAndRoundTrips) {
  std::mt19937 rng(7);
  for (size_t groups : {1u, 2u, 8u, 25u}) {
    for (int trial = 0; trial < 50; ++trial) {
      std::vector<uint8_t> bytes(groups * 4);
      for (auto& b : bytes) b = static_cast<uint8_t>(rng());
      const std::string text = z85Encode(bytes);
      std::vector<char> zmqText(text.size() + 1);
      ASSERT_NE(zmq_z85_encode(zmqText.data(), bytes.data(), bytes.size()), nullptr);
      EXPECT_EQ(text, std::string(zmqText.data()));
      EXPECT_EQ(decode(text), bytes);
    }
  }
}

TEST(Z85, RefusesCharactersOutsideTheAlphabet) {
  std::array<uint8_t, 8> out{};
  for (const std::string text : {"Hello World", "HelloWorl\"", "Hell\x01World"}) {
    const std::string t = text.substr(0, 10);
    const Status s = z85Decode(t, out);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << t;
    EXPECT_NE(s.message().find("is not a Z85 character"), std::string::npos) << s.message();
  }
  const Status s = z85Decode("Hello Worl", out);
  EXPECT_NE(s.message().find("character 6 (byte 0x20)"), std::string::npos) << s.message();
}

TEST(Z85, RefusesGroupsAboveTwoToTheThirtyTwo) {
  std::array<uint8_t, 8> out{};
  // "%nSc1" is 2^32, one above the largest group; "#####" is 85^5 - 1.
  for (const char* text : {"00000%nSc1", "#####00000"}) {
    const Status s = z85Decode(text, out);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << text;
    EXPECT_NE(s.message().find("above 2^32 - 1"), std::string::npos) << s.message();
  }
  // libzmq refuses the same texts.
  EXPECT_EQ(zmq_z85_decode(out.data(), "00000%nSc1"), nullptr);
}

TEST(Z85, RefusesTextThatIsNotWholeGroups) {
  std::array<uint8_t, 4> out{};
  const Status s = z85Decode("Hello1", std::span<uint8_t>(out.data(), 4));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("not a multiple of 5"), std::string::npos) << s.message();
}

TEST(Z85, EnforcesItsBufferContract) {
  std::array<uint8_t, 3> three{};
  EXPECT_THROW(z85Encode(three), Error);
  std::array<uint8_t, 4> four{};
  std::array<char, 4> small{};
  EXPECT_THROW(z85Encode(four, small), Error);
}

}  // namespace
}  // namespace geo::keys
