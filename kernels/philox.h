#pragma once
// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3",
// SC'11), the counter-based generator of Random123 and cuRAND. Shared verbatim
// by the CPU and CUDA kernels so both draw the same numbers for the same
// (key, counter): that is what makes their QSGD output bit-identical.
//
// geotrain's use: key = the 64-bit seed, counter = (block index lo, hi,
// stream lo, hi), where the stream id names the tensor and round; how a
// kernel maps elements onto blocks is its own contract (QSGD: qsgd_math.h).

#include <cstdint>

#if defined(__CUDACC__)
#define GEO_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define GEO_HOST_DEVICE inline
#endif

namespace geo::kernels {

struct Philox4x32 {
  uint32_t v[4];
};

inline constexpr uint32_t kPhiloxM0 = 0xD2511F53u;
inline constexpr uint32_t kPhiloxM1 = 0xCD9E8D57u;
inline constexpr uint32_t kPhiloxW0 = 0x9E3779B9u;
inline constexpr uint32_t kPhiloxW1 = 0xBB67AE85u;
inline constexpr int kPhiloxRounds = 10;

// One Philox4x32-10 block: 128 random bits for a 128-bit counter and 64-bit key.
GEO_HOST_DEVICE Philox4x32 philox4x32(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3,
                                      uint32_t k0, uint32_t k1) {
#if defined(__CUDA_ARCH__)  // device pass only: GCC warns on unknown pragmas
#pragma unroll
#endif
  for (int round = 0; round < kPhiloxRounds; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(kPhiloxM0) * c0;
    const uint64_t p1 = static_cast<uint64_t>(kPhiloxM1) * c2;
    const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ k0;
    const uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ k1;
    c1 = static_cast<uint32_t>(p1);
    c3 = static_cast<uint32_t>(p0);
    c0 = n0;
    c2 = n2;
    k0 += kPhiloxW0;
    k1 += kPhiloxW1;
  }
  return {{c0, c1, c2, c3}};
}

// The geotrain keying: block `block` of stream `stream` under `seed`.
GEO_HOST_DEVICE Philox4x32 philoxBlock(uint64_t seed, uint64_t stream, uint64_t block) {
  return philox4x32(static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32),
                    static_cast<uint32_t>(stream), static_cast<uint32_t>(stream >> 32),
                    static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
}

}  // namespace geo::kernels
