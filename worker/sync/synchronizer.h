#pragma once
// Synchronizer: how the workers of one job combine their training -- the
// rules of docs/architecture.md section 3, plugged into the trainer as a StepHook.
//
//   allreduce  synchronous data-parallel SGD: every step, all-gather each
//              worker's encoded gradient and average it (the baseline);
//   dts        delayed and temporally sparse updates: local steps, every K
//              steps send Q(acc + e) without blocking, D steps later replace
//              the own contribution by the average: x <- x + q_i - mean_j q_j;
//   swarm      decentralized gossip: every H steps average pairwise with a
//              random peer, exchanging quantized differences to the last copy
//              exchanged with that peer;
//   hierarchical (a wrapper around any of them): inside a region, gradients
//              are averaged at the region leader over the LAN every step, so
//              a region's replicas stay bitwise identical; only leaders run
//              the WAN algorithm, and push its result back to their members.
//
// Threading: a Synchronizer is driven by its trainer's thread (the StepHook
// calls and finish()); stats() may be called from any thread at any time.
// The Transport must outlive the Synchronizer and is shared with nobody who
// receives the same message kinds.
//
// Errors: nothing throws across the StepHook boundary; failures come back as
// Status naming the peer (rank and region), the round or step and how long
// was waited. allreduce fails fast: a synchronous step cannot go on without
// a gradient, so a missing one ends the worker after SyncOptions::timeout,
// naming the peer.
//
// Membership (dts, swarm, and the hierarchical LAN): a peer silent for
// SyncOptions::peerTimeout (a few seconds) is suspected and nobody waits for
// it; the round time-out is only the last resort for a peer that is heard
// (pings answered) but does not deliver -- a straggler, which is waited for.
// dts completes a round with the contributions of the peers expected in it
// (weights renormalized over them) and applies a late one when it arrives;
// swarm picks another partner; a region leader steps on without a silent
// member. A worker that starts while its peers are ahead (restarted, or from
// an older checkpoint) takes the model and step of the nearest live peer and
// contributes from the next round; the final model is agreed among the
// workers alive at the end. docs/membership.md tells the whole story.

#include <torch/torch.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/status.h"
#include "worker/codec/codec.h"
#include "worker/sync/final_average.h"
#include "worker/sync/stats.h"
#include "worker/train/trainer.h"
#include "worker/transport/transport.h"

namespace geo::sync {

// Who is where in the job: the region of every rank. The first rank of each
// region is its leader.
class Topology {
 public:
  // regions[r] is rank r's region name (non-empty); rank < regions.size().
  static StatusOr<Topology> make(std::vector<std::string> regions, uint32_t rank);

  uint32_t rank() const { return rank_; }
  uint32_t worldSize() const { return static_cast<uint32_t>(regions_.size()); }
  const std::string& regionOf(uint32_t r) const { return regions_.at(r); }
  bool sameRegion(uint32_t a, uint32_t b) const { return regions_.at(a) == regions_.at(b); }
  uint32_t leaderOf(uint32_t r) const;
  bool isLeader() const { return leaderOf(rank_) == rank_; }
  // Ranks of r's region, ascending (the leader first).
  std::vector<uint32_t> regionMembers(uint32_t r) const;
  // The leader of every region, ascending.
  std::vector<uint32_t> leaders() const;
  // "rank 3 (tokyo)", for messages.
  std::string describe(uint32_t r) const;
  // "rank 1 (tokyo), rank 3 (ohio)": each of `ranks`, in its order.
  std::string describe(const std::vector<uint32_t>& ranks) const;

 private:
  std::vector<std::string> regions_;
  uint32_t rank_ = 0;
};

// The synchronizer's typed options: durations, a codec spec and settings
// worker.yaml does not have (seed, small-tensor threshold, auto-delay cap).
// The worker fills them from worker.yaml's sync section, whose schema
// (common/worker_config.h) holds the names, ranges and user messages.
struct SyncOptions {
  std::string algorithm = "dts";  // allreduce | dts | swarm
  int64_t period = 8;             // dts: K, steps per round (>= 1); the first K when auto
  // dts: choose K at run time (the period the workers agree on; see dts.cc).
  bool autoPeriod = false;
  std::optional<int64_t> delay = 0;  // dts: D in steps (>= 0); nullopt = auto
  // dts: how a round's contributions meet (docs/algorithms.md, "Reduce-
  // scatter"): allgather, each worker's whole contribution to every other
  // (one hop, N - 1 payloads up each uplink); reducescatter, each worker's
  // shard s to the worker that owns it, which sends the shard's mean to
  // every other (two hops, 2 (N - 1) / N payloads); auto, all-gather at the
  // start and then whichever the coordinator's measurements favour
  // (exchange_choice.h), agreed from a later round as an automatic K is.
  std::string exchange = "allgather";
  int64_t swarmH = 4;      // swarm: local steps between exchanges (>= 1)
  codec::CodecSpec codec;  // what crosses the WAN
  // qsgd only: parameter tensors with fewer values travel as fp32 (QSGD's
  // practice: small tensors such as biases gain little and lose most).
  int64_t smallTensorThreshold = 10000;
  std::string lanCodec = "identity";  // identity | bf16: member gradients to the leader
  bool errorFeedback = true;          // keep the quantization residual (allreduce, dts)
  bool hierarchical = true;           // LAN reduce inside regions, WAN among leaders
  // dts: scale the gradient by delayLrScale of the peers' staleness
  // (auto_rules.h) before the optimizer steps; false: the published rule,
  // the step as configured.
  bool scaleLrWithDelay = true;
  std::chrono::milliseconds timeout{60000};
  // How long a peer may be silent (no frame, pings included) before it is
  // suspected and nobody waits for it; 0: auto, max(3 s, 4 x RTT + 2 s).
  std::chrono::milliseconds peerTimeout{0};
  uint64_t seed = 42;            // QSGD's stochastic rounding and swarm's choice of peers
  int64_t maxAutoDelay = 256;    // dts auto: the largest D it may choose
  int64_t maxAutoPeriod = 1024;  // dts auto period: the largest K it may choose
  // dts: values per slice where a CPU model's round completes slice by
  // slice (docs/algorithms.md, "Memory"); 0: 2^20 (4 MB). Not a worker.yaml
  // key: the tests' knob, to cut a small model into many slices.
  int64_t sliceValues = 0;
  // The bytes of members' final models the final average's coordinator
  // asks for at once (sync::finalModelsInFlight); 0: 256 MiB. Not a
  // worker.yaml key: the tests' knob, to take a small model's one at a time.
  uint64_t finalModelsInFlightBytes = 0;
  // How the final average reaches every worker (final_average.h
  // FinalAverageWay; nullopt: as finalAverageWay says), and members that
  // never send their part of it (the shard they forward; under
  // reduce-scatter, their model's shards: members that died in the
  // middle). Not worker.yaml keys: the tests' knobs, to take a small
  // model's average each way and to see the coordinator fall back where a
  // part is missing.
  std::optional<FinalAverageWay> finalWay;
  bool finalMembersSilent = false;
  // A worker that fails (Cancelled) right after the first of its shards
  // has left under reduce-scatter: one that died in the middle (the
  // tests' knob; the test closes its transport then).
  bool finalDiesMidway = false;
  // A change of exchange (sync.exchange: auto) announced for the round
  // after the coordinator's open one, without the margin for the peers that
  // run ahead of it: they hear of it after closing rounds it names (the
  // tests' knob for DTS's reexchange).
  bool exchangeAnnouncedLate = false;
  // Where the synchronizer and its membership read the time and wait (not
  // a worker.yaml key): null, the system clock; a test's FakeClock, with
  // the in-memory transport on the same clock, runs a job's time-outs,
  // suspicion and rejoins in simulated time. Must outlive the synchronizer.
  const geo::Clock* clock = nullptr;
};

// options.clock, or the system clock.
inline const geo::Clock& clockOf(const SyncOptions& options) {
  return options.clock != nullptr ? *options.clock : geo::systemClock();
}

// The synchronizer's own preconditions, which makeSynchronizer() checks
// first: an algorithm it implements, an exchange it knows, period and swarmH >= 1 (steps are
// counted modulo them), delay >= 0 or auto, a positive timeout, maxAutoDelay
// >= 0, and codec and lanCodec specs that codec::makeCodec() builds (the
// codec checks its own spec). Which values users may choose (lanCodec only
// identity or bf16, for one) is the worker.yaml schema's rule, checked with
// the keys' names before a worker gets here; so a failure here means its
// caller skipped the schema. InvalidArgument naming the SyncOptions field,
// the value and what is allowed.
Status validateSyncOptions(const SyncOptions& options);

class Synchronizer : public train::StepHook {
 public:
  virtual std::string describe() const = 0;
  virtual SyncStats stats() const = 0;
};

// `transport` may be null only when the topology has a single rank (every
// round is then the identity). The synchronizer keeps a reference to it.
StatusOr<std::unique_ptr<Synchronizer>> makeSynchronizer(const SyncOptions& options,
                                                         const Topology& topology,
                                                         transport::Transport* transport);

}  // namespace geo::sync
