#pragma once
// RunState: what `geotrain local` knows about a running job, folded from the
// workers' events; and RunSummary, the numbers it reports at the end (the
// summary table and <out>/summary.json).
//
// record() takes each event with the rank of the pipe it came from (not the
// rank the event claims) and the launcher's wall time since launch. A field
// an event leaves out keeps its last value, so a worker may send partial
// events. Definitions used by the summary, per region and overall:
//   testAccuracy     mean over the workers that reported one in "done"
//   testLoss         the same for the final model's test loss per sample
//   wallSeconds      overall: the time passed in (launch to end); region: its
//                    last "done" once all its workers sent one, else overall
//   steps            smallest last step over the workers
//   stepsPerSecond   smallest (step / worker time) over the workers, from
//                    each worker's own clock
//   wan/lan bytes    sums of the workers' last cumulative counts; wanBytes
//                    and lanBytes are sent + received
//   compressionRatio payload / wanSent (null when nothing was sent)
//   stalenessMean    mean of the workers' means weighted by applied updates
//                    (unweighted when no worker reports appliedUpdates)
//   stalenessMax     largest; missing: sum
//   waitSeconds      largest of the workers' time blocked waiting for peers
//                    or the uplink (what the links cost the slowest worker)
//   perStep          milliseconds per step computing, in the synchronizer,
//                    encoding and decoding, waiting (StepBreakdown)
//   maxRssBytes      the largest peak resident memory of one worker
//   timeToAccuracy   wall time of rank 0's first evalAccuracy >= threshold
//
// Not thread-safe (the launcher's poll loop owns it); never throws except
// GEO_ENFORCE on a rank out of range.

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "worker/local/topology.h"
#include "worker/local/worker_event.h"

namespace geo::local {

inline constexpr std::array<double, 3> kAccuracyThresholds = {0.80, 0.85, 0.88};

// An evaluation, placed at the wall time and step of the parameters it
// measured (for a background evaluation, earlier than the line that
// reported it).
struct EvalPoint {
  double wallSeconds = 0;
  double accuracy = 0;
  std::optional<int64_t> step;
};

struct RankProgress {
  int64_t rank = 0;
  std::string region;
  int64_t regionIndex = 0;
  int64_t localIndex = 0;

  bool started = false;
  bool done = false;
  int64_t step = 0;
  std::optional<double> workerTime;  // `time` of the first event at `step`
  std::optional<double> loss;
  std::optional<double> samplesPerSecond;
  std::optional<double> evalAccuracy;  // the latest evaluation
  std::optional<double> evalLoss;      // the latest evaluation's test loss
  std::optional<double> testAccuracy;  // from "done"
  std::optional<double> testLoss;      // from "done"
  std::optional<double> doneWallSeconds;
  SyncStats sync;
  ByteCounts bytes;
  StepTime stepTime;
  std::vector<EvalPoint> evals;
  std::string errorMessage;  // from an "error" event

  // Membership: the longest step (a stall), the final model's hash, and the
  // latest join of a (re)started worker.
  std::optional<double> stepSecondsMax;
  std::optional<uint64_t> maxRssBytes;  // the worker's peak resident memory
  std::string modelHash;
  int64_t starts = 0;  // "start" events: 1 + restarts
  std::optional<double> joinedWallSeconds;
  std::optional<int64_t> joinedStep;
  bool joinTransferred = false;
  std::optional<double> stateTransferSeconds;
};

// What the live display shows for one region.
struct RegionSnapshot {
  int64_t step = 0;             // of its slowest worker
  std::optional<double> loss;   // mean over its workers
  double samplesPerSecond = 0;  // sum over its workers
  uint64_t wanSentBytes = 0;    // cumulative, sum over its workers
  std::optional<double> stalenessMean;
  std::optional<double> delay;         // the leader's, else any worker's
  std::optional<double> evalAccuracy;  // the leader's latest, else any worker's
  std::optional<double> evalLoss;      // the same, for tasks without an accuracy
  bool done = false;                   // every worker sent "done"
};

// Where a step's time went on the training threads of a group's workers,
// in milliseconds per step (their seconds summed over their steps summed;
// WorkerEvent::stepTime): computing, and in the synchronizer -- of which
// encoding and decoding (codec; of that, encoding this worker's updates:
// encode) and waiting for peers or the uplink (wait).
struct StepBreakdown {
  double computeMs = 0;
  double syncMs = 0;
  double codecMs = 0;
  double encodeMs = 0;
  double waitMs = 0;
};

struct GroupSummary {
  std::optional<double> testAccuracy;
  std::optional<double> testLoss;  // mean over the workers that reported one in "done"
  double wallSeconds = 0;
  int64_t steps = 0;
  std::optional<double> stepsPerSecond;
  uint64_t wanSentBytes = 0;
  uint64_t wanReceivedBytes = 0;
  uint64_t lanSentBytes = 0;
  uint64_t lanReceivedBytes = 0;
  uint64_t payloadBytes = 0;
  std::optional<double> compressionRatio;
  std::optional<double> stalenessMean;
  std::optional<double> stalenessMax;
  int64_t missing = 0;
  std::optional<double> waitSeconds;
  std::optional<StepBreakdown> perStep;  // workers that reported stepTime
  std::optional<uint64_t> maxRssBytes;   // the largest peak of one worker
  // The longest step of one worker after its first (a stall for its peers,
  // a reconnect, a wait at a due round, shows there).
  std::optional<double> longestStepSeconds;

  uint64_t wanBytes() const { return wanSentBytes + wanReceivedBytes; }
  uint64_t lanBytes() const { return lanSentBytes + lanReceivedBytes; }
};

// One injected fault and what it cost (geotrain local --kill/--partition).
struct FaultSummary {
  std::string kind;  // kill | partition
  std::string what;  // "tokyo:0 (rank 1)", "oregon"
  double atSeconds = 0;
  std::optional<double> endSeconds;     // restart of a killed worker; end of a partition
  std::optional<double> downSeconds;    // kill: until restarted
  std::optional<double> rejoinSeconds;  // kill: restart -> holding the job's state and step
  std::optional<int64_t> rejoinStep;
  // The longest step of the workers outside the fault's region: their stall.
  std::optional<double> othersStallSeconds;
  // Its region's last "done" minus the others' last "done".
  std::optional<double> finishSkewSeconds;
};

struct RunSummary {
  std::string outcome;               // succeeded | failed | interrupted (set by the launcher)
  std::vector<FaultSummary> faults;  // set by the launcher
  // Whether every worker that finished holds the same final model (by
  // modelHash); nullopt when fewer than two reported one.
  std::optional<bool> modelsAgree;
  GroupSummary overall;
  std::vector<std::pair<std::string, GroupSummary>> regions;  // --regions order
  // (threshold, wall seconds or nullopt when rank 0 never reached it)
  std::vector<std::pair<double, std::optional<double>>> timeToAccuracy;
};

class RunState {
 public:
  RunState(Topology topology, int64_t totalSteps);

  void record(int64_t rank, double wallSeconds, const WorkerEvent& event);

  const Topology& topology() const { return topology_; }
  int64_t totalSteps() const { return totalSteps_; }
  const std::vector<RankProgress>& ranks() const { return ranks_; }
  const RankProgress& rank(int64_t r) const;

  RegionSnapshot regionSnapshot(size_t regionIndex) const;
  RunSummary summarize(double wallSeconds) const;

 private:
  GroupSummary summarizeRanks(const std::vector<const RankProgress*>& ranks,
                              double wallSeconds) const;

  Topology topology_;
  int64_t totalSteps_;
  std::vector<RankProgress> ranks_;
};

// The first time rank 0's evaluation reached each threshold.
std::vector<std::pair<double, std::optional<double>>> timeToAccuracy(
    const std::vector<EvalPoint>& evals, const std::vector<double>& thresholds);

// summary.json (pretty-printed, trailing newline):
// {"outcome":..,"wallSeconds":..,"testAccuracy":..,"steps":..,
//  "stepsPerSecond":..,"wanBytes":..,"wanSentBytes":..,"wanReceivedBytes":..,
//  "lanBytes":..,"payloadBytes":..,"compressionRatio":..,"stalenessMean":..,
//  "stalenessMax":..,"missing":..,"waitSeconds":..,
//  "perStepMilliseconds":{"compute":..,"sync":..,"codec":..,"encode":..,"wait":..}|null,
//  "maxRssBytes":..|null,
//  "regions":{"london":{same keys}},
//  "timeToAccuracy":{"0.80":seconds|null,"0.85":..,"0.88":..},
//  "modelsAgree":true|false|null, "faults":[{"kind":..,"what":..,"atSeconds":..,
//  "endSeconds":..,"downSeconds":..,"rejoinSeconds":..,"rejoinStep":..,
//  "othersStallSeconds":..,"finishSkewSeconds":..}]}
// Unknown values are null.
std::string summaryJson(const RunSummary& summary);

}  // namespace geo::local
