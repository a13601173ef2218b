#pragma once
// Whether a DTS worker decodes the contributions it applies early (D =
// auto) beside the steps, shared by the synchronizer (dts.cc) and the
// worker's memory plan (app/memory_plan.h), which must count what that
// holds. Free of LibTorch.

#include <cstdint>

namespace geo::sync {

// Beside the steps, the training thread only adds the decoded correction
// to the model and the round's start: two passes over the model, against
// three decodes and four passes per contribution on it. The correction is
// one more model-sized tensor while it is decoded and until the next step
// takes it up. A model of a slice (2^20 values) or less decodes in a
// millisecond or two, and would be applied a step later for nothing; past
// 256 MiB (64M parameters) the extra model costs more memory than the
// design allows (the 100M-parameter mlp's 5.5 B of fp32 parameters per
// worker would be 6.5 B): those decode on the training thread. A GPU
// worker's decodes are queued on the device already.
inline constexpr int64_t kEarlyBesideMinValues = int64_t{1} << 20;
inline constexpr int64_t kEarlyBesideMaxBytes = int64_t{256} << 20;
constexpr bool decodesEarlyBeside(int64_t parameters) {
  return parameters > kEarlyBesideMinValues && 4 * parameters <= kEarlyBesideMaxBytes;
}
static_assert(!decodesEarlyBeside(199'210) && decodesEarlyBeside(19'900'000) &&
              !decodesEarlyBeside(100'000'000));

}  // namespace geo::sync
