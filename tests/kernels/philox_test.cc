#include "kernels/philox.h"

#include <gtest/gtest.h>

namespace geo::kernels {
namespace {

// Known-answer vectors of Random123 (kat_vectors, philox4x32_10), which cuRAND
// and every other Philox4x32-10 implementation reproduce.
TEST(Philox, MatchesRandom123KnownAnswers) {
  struct Kat {
    uint32_t ctr[4];
    uint32_t key[2];
    uint32_t expect[4];
  };
  const Kat kats[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
      {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
       {0xffffffff, 0xffffffff},
       {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
      {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
       {0xa4093822, 0x299f31d0},
       {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
  };
  for (const Kat& k : kats) {
    const Philox4x32 r = philox4x32(k.ctr[0], k.ctr[1], k.ctr[2], k.ctr[3], k.key[0], k.key[1]);
    for (int w = 0; w < 4; ++w) EXPECT_EQ(r.v[w], k.expect[w]) << "word " << w;
  }
}

TEST(Philox, BlockKeyingSplitsSeedStreamAndIndex) {
  const uint64_t seed = 0x0123456789abcdefull;
  const uint64_t stream = 0xfedcba9876543210ull;
  const uint64_t block = 0x1122334455667788ull;
  const Philox4x32 a = philoxBlock(seed, stream, block);
  const Philox4x32 b =
      philox4x32(0x55667788, 0x11223344, 0x76543210, 0xfedcba98, 0x89abcdef, 0x01234567);
  for (int w = 0; w < 4; ++w) EXPECT_EQ(a.v[w], b.v[w]);
}

}  // namespace
}  // namespace geo::kernels
