#pragma once
// SyncStats: a synchronizer's counters (Synchronizer::stats()), for progress
// output and the worker's metrics. A header of its own, with no LibTorch, so
// that worker/metrics reads these counters as they are instead of a copy of
// them field by field.
//
// Threading: a plain value; Synchronizer::stats() returns a consistent copy.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace geo::sync {

// Counters for progress output and metrics. Monotonic except `delay`, `period`,
// `lrScale`, `linkSeconds`, `uplinkBytesPerSecond`, `stepSeconds` and `peerUp`.
struct SyncStats {
  int64_t delay = 0;   // dts: the D used for the latest round
  int64_t period = 0;  // dts: the K of the round in progress
  // dts: whether the round in progress is exchanged by reduce-scatter
  // (sync.exchange; under `auto`, what the workers agreed on last).
  bool reduceScatter = false;
  // dts, sync.exchange auto: rounds this worker had closed before it heard
  // of a change of exchange that names them, sent again the new way.
  uint64_t reexchangedRounds = 0;
  // dts, reduce-scatter: shards' means applied as a peer relayed them
  // (MessageKind::kRelayed): their owner was lost here before its mean
  // came, and had reached that peer.
  uint64_t relayedMeans = 0;
  // dts: the factor on the gradient of the latest step (delayLrScale of
  // the peers' staleness, or 1 with sync.scaleLrWithDelay false).
  double lrScale = 1;
  // dts auto: the slowest peer link's one-way time as measured from both
  // ends (skew cancelled; docs/architecture.md section 3), 0 before.
  double linkSeconds = 0;
  // The uplink's rate as measured, bytes per second (Base::wayRate): under
  // DTS the smaller of the rate the peers acknowledged while it held rounds
  // back and the lag reports' rate (UplinkPace::rate); where neither is
  // known, and under every other algorithm, what left the machine while
  // data waited on it (BusyUplinkRate, a bound from below); 0 before any.
  // The final average's way goes by it.
  double uplinkBytesPerSecond = 0;
  // dts: a step's time, waits for peers excluded (moving average), over
  // which the auto delay and period count the link in steps; 0 before.
  double stepSeconds = 0;
  uint64_t rounds = 0;          // rounds (dts), steps (allreduce), exchanges (swarm) completed
  uint64_t appliedUpdates = 0;  // peer contributions applied
  uint64_t missing = 0;         // contributions given up on (absent or late peers)
  double stalenessSum = 0;      // over applied updates, in steps
  int64_t stalenessMax = 0;
  // stalenessCounts[s]: applied updates with staleness s; the last entry
  // counts everything >= its index.
  std::vector<uint64_t> stalenessCounts = std::vector<uint64_t>(65, 0);
  uint64_t payloadBytes = 0;   // fp32 bytes of what was encoded for the WAN, per destination
  uint64_t encodedBytes = 0;   // the same after encoding (payloads only, no headers)
  double waitSeconds = 0;      // time blocked waiting for peers
  double codecSeconds = 0;     // time spent encoding and decoding
  double encodeSeconds = 0;    // of which encoding this worker's updates
  double roundSecondsSum = 0;  // send -> applied, summed over completed rounds
  uint64_t roundSecondsCount = 0;
  // Membership (worker/sync/membership.h).
  // (peer, live?) for the peers this worker synchronizes with: false while
  // suspected (silent longer than the peer time-out) or partitioned. Not
  // cumulative: the current list.
  std::vector<std::pair<uint32_t, bool>> peerUp;
  double degradedSeconds = 0;  // time with at least one peer suspected
  uint64_t rejoins = 0;        // joins of a running job by state transfer
  uint64_t peerRejoins = 0;    // state transfers served to restarted peers
  uint64_t stateTransferBytesSent = 0;
  uint64_t stateTransferBytesReceived = 0;
  double stateTransferSeconds = 0;  // receiving them
  uint64_t lateApplied = 0;         // contributions applied after their round completed
  // dts, D = auto: peers' contributions applied early that were decoded
  // beside the steps rather than on the training thread.
  uint64_t decodedBeside = 0;
  uint64_t lateDropped = 0;  // late contributions too old to apply
  // dts state parity (worker/sync/parity.h): peers' job-model fingerprints
  // compared with this worker's, those found to differ, and the repairs
  // this worker made of its own model from a peer's.
  uint64_t parityChecks = 0;
  uint64_t parityMismatches = 0;
  uint64_t parityRepairs = 0;
  // Contributions refused (treated as missing), by peer and reason: size,
  // malformed, non_finite, out_of_range.
  struct Rejected {
    uint32_t peer = 0;
    std::string reason;
    uint64_t count = 0;
  };
  std::vector<Rejected> rejected;
  uint64_t rejectedTotal() const {
    uint64_t n = 0;
    for (const auto& r : rejected) n += r.count;
    return n;
  }

  double stalenessMean() const {
    return appliedUpdates == 0 ? 0.0 : stalenessSum / static_cast<double>(appliedUpdates);
  }
};

}  // namespace geo::sync
