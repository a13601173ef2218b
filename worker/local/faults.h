#pragma once
// Fault injection for `geotrain local`: what --kill, --restart-after,
// --partition and --slow ask for, checked against the job's topology, and
// the record of what happened, for the summary.
//
//   --kill REGION[:INDEX]@TIME      SIGKILL that worker (local index INDEX of
//                                   the region, default 0: its leader) TIME
//                                   after launch; repeatable
//   --restart-after DURATION        start a killed worker again this long
//                                   after its kill, with the same config (it
//                                   rejoins the running job); default: never
//   --partition REGION@TIME+DURATION  cut every worker of the region off from
//                                   the other regions for DURATION (the
//                                   emulated links drop everything both ways:
//                                   SIGUSR1 to start, SIGUSR2 to end)
//   --partition REGION/OTHER@TIME+DURATION  cut the link between two regions
//                                   only, both ways (a partial partition:
//                                   each still reaches every other region);
//                                   the namespace network's links only
//   --slow REGION=FACTORx           every worker of the region takes FACTOR
//                                   times as long per step (a straggler)
//   --throttle REGION@TIME=RATE     from TIME on, the emulated WAN uplink of
//                                   every worker of the region carries RATE
//                                   (e.g. 5mbit; 0 or none: unlimited), as
//                                   when a link's bandwidth drops (a queued
//                                   signal, SIGRTMIN, carries the new rate in
//                                   kbit/s)
// TIME and DURATION: a number with s or ms ("20s", "1500ms"). Parsing is
// pure; errors name the flag, the value and what is allowed.
//
// With any fault, a worker killed by a --kill is not a failure of the job.
// With --restart-after, a worker that fails is started again after the same
// delay, at most 3 times (as a Kubernetes Job retries a failed index): a
// member whose region leader was killed fails and rejoins this way. Without
// --restart-after every other exit keeps its meaning.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "worker/local/topology.h"

namespace geo::local {

struct FaultOptions {
  std::vector<std::string> kill;  // --kill values
  std::optional<std::string> restartAfter;
  std::vector<std::string> partition;  // --partition values
  std::vector<std::string> slow;       // --slow values
  std::vector<std::string> throttle;   // --throttle values
};

struct KillFault {
  int64_t rank = 0;
  std::string what;  // "tokyo:0"
  double atSeconds = 0;
};

struct PartitionFault {
  int64_t regionIndex = 0;
  // REGION/OTHER: the link between the two regions only; nullopt: the
  // region from every other.
  std::optional<int64_t> otherRegionIndex;
  double atSeconds = 0;
  double forSeconds = 0;
};

struct ThrottleFault {
  int64_t regionIndex = 0;
  double atSeconds = 0;
  int64_t kbitPerSecond = 0;  // 0: unlimited
  std::string rate;           // as given, for the record
};

struct FaultPlan {
  std::vector<KillFault> kills;
  std::optional<double> restartAfterSeconds;
  std::vector<PartitionFault> partitions;
  std::vector<double> slowdown;  // by rank; 1 = none
  std::vector<ThrottleFault> throttles;

  bool any() const {
    return !kills.empty() || !partitions.empty() || anySlow() || !throttles.empty();
  }
  bool anySlow() const;
};

StatusOr<FaultPlan> makeFaultPlan(const FaultOptions& options, const Topology& topology);

// "20s", "1500ms", "2.5s" -> seconds (>= 0).
StatusOr<double> parseSeconds(const std::string& text);

// What happened to one injected fault (filled in by the launcher).
struct FaultRecord {
  std::string kind;  // kill | partition | throttle
  std::string what;  // "tokyo:0 (rank 1)", "oregon"
  std::string region;
  // A link cut between two regions (--partition REGION/OTHER): the other
  // end, whose workers are not "the others" either.
  std::string otherRegion;
  double atSeconds = 0;
  std::optional<double> endSeconds;     // partition end, or restart of a killed worker
  std::optional<double> joinedSeconds;  // the restarted worker took the job's state
  std::optional<int64_t> joinedStep;
  std::optional<double> stateTransferSeconds;
};

}  // namespace geo::local
