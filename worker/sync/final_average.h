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

// Whether the coordinator hands the average out in shards
// (detail::Base::averageModels): `members` workers besides itself take
// it, a model of `modelBytes`, the coordinator's uplink seen carrying
// `uplinkBytesPerSecond` (<= 0: not known), the farthest member
// `latencySeconds` away one way. Sent whole, the average leaves the
// coordinator's uplink `members` times in a row, members x model / rate; in
// shards, the coordinator sends one model's worth (a shard to each member)
// and each member forwards its shard to the others over its own uplink, side
// by side: about (2 - 1/members) x model / rate, and a hop more of latency.
// Shards when that saves more than two such latencies: never for two
// members (nothing saved), nor for a model that crosses the link in less
// time than its latency (the 0.2M-parameter mlp: 64 ms at 100 Mbit/s
// against 115 ms one way on the world links). For the 19.9M-parameter mlp
// on four regions at 100 Mbit/s this reckons 19 s against about 11; on
// the namespace network the average was handed out in 20.7-21.1 s whole
// and 12.9-13.3 s in shards (docs/benchmarks.md).
constexpr bool shardFinalAverage(size_t members, uint64_t modelBytes, double uplinkBytesPerSecond,
                                 double latencySeconds) {
  if (members < 3 || uplinkBytesPerSecond <= 0) return false;
  const double model = static_cast<double>(modelBytes) / uplinkBytesPerSecond;
  const double k = static_cast<double>(members);
  return (k - 2 + 1 / k) * model > 2 * latencySeconds;
}
// The uplink's rate shardFinalAverage is given where none was measured
// (allreduce, swarm, a fixed K, a run too short for DTS's measurement):
// 1 Gbit/s, so that only a model whose average would take long even over
// a fast uplink is sharded (the 19.9M-parameter mlp among four regions
// on the world links: 0.85 s saved by this reckoning against 0.23 s of
// hops; not a 2M-parameter one).
inline constexpr double kUnmeasuredUplinkBytesPerSecond = 125e6;
static_assert(!shardFinalAverage(2, uint64_t{80} << 20, 12.5e6, 0.115) &&
              shardFinalAverage(3, uint64_t{80} << 20, 12.5e6, 0.115) &&
              !shardFinalAverage(3, 800'000, 12.5e6, 0.115));

// The values of shard `index` of `shards` of a model of `values`: the
// first values % shards shards one value longer. {offset, length}.
struct ShardRange {
  uint64_t offset = 0;
  uint64_t length = 0;
};
constexpr ShardRange finalShard(uint64_t values, size_t shards, size_t index) {
  const uint64_t base = values / shards;
  const uint64_t extra = values % shards;
  return {index * base + (index < extra ? index : extra), base + (index < extra ? 1 : 0)};
}
static_assert(finalShard(10, 3, 0).length == 4 && finalShard(10, 3, 1).offset == 4 &&
              finalShard(10, 3, 2).offset == 7 && finalShard(10, 3, 2).length == 3);

}  // namespace geo::sync
