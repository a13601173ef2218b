#pragma once
// The final average's memory rule, shared by the synchronizers
// (Base::averageModels) and the worker's memory plan (app/memory_plan.h),
// which must count what the coordinator holds. Free of LibTorch.

#include <cstddef>
#include <cstdint>

namespace geo::sync {

// How many members' final models the coordinator of the final average
// asks for at once (detail::Base::averageModels), for models of
// `modelBytes`: as many as fit in `budget` bytes (0:
// kFinalModelsInFlightBytes), at least one. Each copy crosses its member's
// own uplink, so more at once end sooner; each is a model more in the
// coordinator's memory until it is added. A 0.2M-parameter model's are
// all asked for at once; a 100M-parameter model's one at a time (N - 1
// transfers in a row instead of side by side: a minute more at 100 Mbit/s
// for four regions, at the end of a job of hours).
inline constexpr uint64_t kFinalModelsInFlightBytes = uint64_t{256} << 20;
constexpr size_t finalModelsInFlight(uint64_t modelBytes, uint64_t budget = 0) {
  if (budget == 0) budget = kFinalModelsInFlightBytes;
  return modelBytes == 0 || modelBytes >= budget ? 1 : static_cast<size_t>(budget / modelBytes);
}
static_assert(finalModelsInFlight(uint64_t{405} << 20) == 1 && finalModelsInFlight(1 << 20) == 256);

}  // namespace geo::sync
