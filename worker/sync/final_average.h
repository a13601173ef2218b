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

// How the coordinator's average reaches every worker (Base::averageModels):
// the members' models to the coordinator and the average back whole (one
// copy per member through its uplink) or in shards each member forwards
// (above); or by reduce-scatter, where no model goes to the coordinator:
// every worker (the coordinator too) owns one shard, sends shard j of its
// model to the owner of j, averages the shard it owns from every worker's,
// and sends that to every other worker. Each worker's uplink carries
// 2 (n - 1) / n models for n workers, side by side, in place of the
// coordinator's 1 + (2 - 1/members) after the members' own one.
enum class FinalAverageWay : uint8_t { kWhole, kShards, kReduceScatter };

// The way's name in log lines: "whole", "in shards", "by reduce-scatter".
constexpr const char* finalAverageWayName(FinalAverageWay way) {
  switch (way) {
    case FinalAverageWay::kWhole: return "whole";
    case FinalAverageWay::kShards: return "in shards";
    case FinalAverageWay::kReduceScatter: return "by reduce-scatter";
  }
  return "?";
}

// What each way should take by this reckoning, in seconds, for `members`
// workers besides the coordinator, a model of `modelBytes`, uplinks seen
// carrying `uplinkBytesPerSecond` (> 0) and the farthest worker
// `latencySeconds` away one way: the models to the coordinator side by
// side (one model's time) and a hop, then the average back (`members`
// models' time in a row and a hop; in shards, (2 - 1/members) and two hops);
// by reduce-scatter, 2 (n - 1) / n models' time and four hops (the shards
// out, the averages back, each worker's word that it holds them all, and
// the coordinator's word to take them). The asks before are left out
// (one hop for every way).
constexpr double finalAverageSeconds(FinalAverageWay way, size_t members, uint64_t modelBytes,
                                     double uplinkBytesPerSecond, double latencySeconds) {
  const double model = static_cast<double>(modelBytes) / uplinkBytesPerSecond;
  const double k = static_cast<double>(members);
  switch (way) {
    case FinalAverageWay::kWhole: return 2 * latencySeconds + model + k * model;
    case FinalAverageWay::kShards: return 3 * latencySeconds + model + (2 - 1 / k) * model;
    case FinalAverageWay::kReduceScatter: return 4 * latencySeconds + 2 * k / (k + 1) * model;
  }
  return 0;
}

// The way for `members` workers besides the coordinator (see above;
// `budget` as finalModelsInFlight's): in shards where shardFinalAverage
// says so, else whole; by reduce-scatter instead where that saves more
// than two one-way latencies by finalAverageSeconds' reckoning (its two
// hops more, the margin shardFinalAverage keeps too) and where a worker
// may hold two models' worth at the end (the shards of the others' models
// it averages, then the shards of the average it takes before it copies
// them in: at most (2n - 1) / n models). The 19.9M-parameter mlp among
// four regions at 100 Mbit/s, 115 ms one way: 10.1 s by reduce-scatter
// against 17.4 s in shards and 25.8 s whole; the 0.2M-parameter mlp
// there: whole (0.49 s against 0.56 s).
constexpr FinalAverageWay finalAverageWay(size_t members, uint64_t modelBytes,
                                          double uplinkBytesPerSecond, double latencySeconds,
                                          uint64_t budget = 0) {
  if (members == 0 || uplinkBytesPerSecond <= 0) return FinalAverageWay::kWhole;
  if (budget == 0) budget = kFinalModelsInFlightBytes;
  const FinalAverageWay other =
      shardFinalAverage(members, modelBytes, uplinkBytesPerSecond, latencySeconds)
          ? FinalAverageWay::kShards
          : FinalAverageWay::kWhole;
  const auto seconds = [&](FinalAverageWay way) {
    return finalAverageSeconds(way, members, modelBytes, uplinkBytesPerSecond, latencySeconds);
  };
  if (2 * modelBytes <= budget &&
      seconds(FinalAverageWay::kReduceScatter) + 2 * latencySeconds < seconds(other)) {
    return FinalAverageWay::kReduceScatter;
  }
  return other;
}
static_assert(finalAverageWay(3, uint64_t{80} << 20, 12.5e6, 0.115) ==
                  FinalAverageWay::kReduceScatter &&
              finalAverageWay(1, uint64_t{80} << 20, 12.5e6, 0.115) ==
                  FinalAverageWay::kReduceScatter &&
              finalAverageWay(3, 800'000, 12.5e6, 0.115) == FinalAverageWay::kWhole &&
              finalAverageWay(3, uint64_t{400} << 20, 12.5e6, 0.115) == FinalAverageWay::kShards);

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
