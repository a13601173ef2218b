#pragma once
// The settings the QSGD kernels (kernels/qsgd.h) accept, as constants. Every
// layer that takes a QSGD setting states exactly these limits instead of a
// copy: the worker.yaml schema (common/worker_config.h, which the controller
// and `geotrain local` check with), the codec (worker/codec), the CRD (its
// maximum is pinned by tests/controller/api/crd_schema_test.py) and
// docs/worker-config.md.
//
// Why a header of its own: the limits are facts about the kernels'
// arithmetic, so the kernel layer owns them; but the schema in common/ must
// state them, and common/ depends on none of our libraries (geo_kernels
// itself links geo_common). Constants in a header that includes only the
// standard library give common/ the values without a dependency on
// geo_kernels. Keep it that way: nothing of ours may be included here.

#include <array>
#include <cstdint>

namespace geo::kernels {

// Bits per value, sign + level: 2^(b-1) - 1 levels (1, 7 or 127). The code
// packing (a value never straddles a byte) handles exactly these widths.
inline constexpr std::array<int, 3> kQsgdBits = {2, 4, 8};

constexpr bool isQsgdBits(int64_t bits) {
  for (int b : kQsgdBits) {
    if (bits == b) return true;
  }
  return false;
}

// Values per bucket (one fp32 scale each), 1 to 2^30. The CUDA kernels hold
// the bucket size and offsets inside a bucket in int32 and add two offsets
// below it, which cannot overflow while it is at most 2^30.
inline constexpr int kQsgdMaxBucketLog2 = 30;
inline constexpr int64_t kQsgdMinBucket = 1;
inline constexpr int64_t kQsgdMaxBucket = int64_t{1} << kQsgdMaxBucketLog2;

}  // namespace geo::kernels
