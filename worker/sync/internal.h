#pragma once
// Pieces shared by the synchronizers (not a public interface): the group of
// ranks an algorithm runs among, the encoding of a whole flat parameter
// buffer (flat_codec.h), statistics, bounded receives and the final model
// average.

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "worker/sync/control.h"
#include "worker/sync/final_average.h"
#include "worker/sync/flat_codec.h"
#include "worker/sync/membership.h"
#include "worker/sync/parity.h"
#include "worker/sync/synchronizer.h"
#include "worker/sync/uplink_pace.h"

namespace geo::sync::detail {

// The ranks a WAN algorithm runs among (all ranks, or the region leaders),
// ascending, with the weight of each in an average (they sum to 1: uniform,
// or region size / world size for leaders).
struct Group {
  std::vector<uint32_t> ranks;
  std::vector<double> weights;
  size_t self = 0;  // index of this rank in `ranks`

  size_t size() const { return ranks.size(); }
  uint32_t selfRank() const { return ranks[self]; }
  // The index of `rank` in `ranks`, or nullopt when it is not a member.
  std::optional<size_t> indexOf(uint32_t rank) const {
    const auto it = std::find(ranks.begin(), ranks.end(), rank);
    if (it == ranks.end()) return std::nullopt;
    return static_cast<size_t>(it - ranks.begin());
  }
};

// Sends one buffer to each rank in `to` without copying it per peer; an
// error names the peer and the message.
Status sendBuffer(transport::Transport& transport, const Topology& topology,
                  const std::vector<uint32_t>& to, transport::MessageKind kind,
                  const transport::SendMeta& meta,
                  std::shared_ptr<const std::vector<std::byte>> bytes,
                  std::chrono::milliseconds timeout);

// Seconds on `clock` since `t0`.
double secondsSince(const geo::Clock& clock, geo::Clock::TimePoint t0);

class StatsRecorder;
// A bounded receive that records the time waited in `stats`; on failure the
// Status (DeadlineExceeded on timeout) names the peer, what was awaited and
// the timeout.
StatusOr<transport::Message> receiveBounded(transport::Transport& transport,
                                            const Topology& topology, uint32_t peer,
                                            transport::MessageKind kind, uint64_t round,
                                            std::chrono::milliseconds timeout,
                                            const std::string& what, StatsRecorder& stats,
                                            const geo::Clock& clock);

// Thread-safe statistics with the recording helpers every algorithm uses.
class StatsRecorder {
 public:
  void applied(int64_t staleness);
  void missed(uint64_t n = 1);
  void waited(double seconds);
  // Encoding and decoding time; what encoding this worker's own update
  // took is also counted apart (a GPU worker's figure to watch).
  enum class CodecWork { kDecode, kEncode };
  void coded(double seconds, CodecWork work = CodecWork::kDecode);
  void encoded(uint64_t payloadBytes, uint64_t encodedBytes, uint64_t destinations);
  void roundDone(double seconds);
  void setDelay(int64_t delay);
  void setLink(double seconds);
  void setUplinkRate(double bytesPerSecond);
  void setStepSeconds(double seconds);
  void setPeriod(int64_t period);
  void setReduceScatter(bool on);
  void reexchanged();
  void relayedMean();
  void setLrScale(double scale);
  void late(bool applied);
  void decodedBeside(uint64_t contributions);
  void parity(uint64_t checks, uint64_t mismatches);
  void repaired();
  // A peer's contribution refused (`reason`: a metric label).
  void rejected(uint32_t peer, const std::string& reason);
  SyncStats snapshot() const;
  double codecSeconds() const;         // snapshot().codecSeconds without the copy
  void merge(const SyncStats& inner);  // adds another recorder's snapshot

 private:
  mutable std::mutex mu_;
  SyncStats stats_;
};

// Common state and helpers of an algorithm running among `group` ranks.
class Base : public Synchronizer {
 public:
  // `stepsPerRound`: the steps of one of the algorithm's rounds (DTS: its
  // period K; 1 for an exchange every step), which membership numbers
  // rounds by until the algorithm says otherwise (Membership::setRoundOf).
  Base(SyncOptions options, Topology topology, transport::Transport* transport, Group group,
       int64_t stepsPerRound = 1);
  SyncStats stats() const override;

  // Whether the last afterStep() changed the parameters (the hierarchical
  // wrapper forwards them to the region's members only then).
  bool modifiedParameters() const { return modified_; }

 protected:
  // Where the time is read and waits go (SyncOptions::clock).
  const geo::Clock& clock() const { return clockOf(options_); }
  double since(geo::Clock::TimePoint t0) const { return secondsSince(clock(), t0); }
  // Builds the codecs for `flat` on first use.
  void ensureCodec(const train::FlatParameters& flat);

  // Sends one buffer to each rank in `to` without copying it per peer.
  Status sendTo(const std::vector<uint32_t>& to, transport::MessageKind kind, uint64_t round,
                int64_t step, transport::CodecId codec, uint64_t elements,
                std::shared_ptr<const std::vector<std::byte>> bytes);
  // The same for a control message (MessageKind::kControl).
  Status sendTo(const std::vector<uint32_t>& to, Control control, int64_t step,
                transport::CodecId codec, uint64_t elements,
                std::shared_ptr<const std::vector<std::byte>> bytes) {
    return sendTo(to, transport::MessageKind::kControl, roundOf(control), step, codec, elements,
                  std::move(bytes));
  }
  // sendTo() for a payload already made (modelPayload: a tensor's own
  // storage, without a copy).
  Status sendPayload(const std::vector<uint32_t>& to, transport::MessageKind kind, uint64_t round,
                     int64_t step, transport::CodecId codec, uint64_t elements,
                     const transport::Payload& payload);
  Status sendPayload(const std::vector<uint32_t>& to, Control control, int64_t step,
                     transport::CodecId codec, uint64_t elements,
                     const transport::Payload& payload) {
    return sendPayload(to, transport::MessageKind::kControl, roundOf(control), step, codec,
                       elements, payload);
  }
  // Every message of `kind` and `round` from `peer` already in the inbox, in
  // the order they arrived (a poll: no wait).
  std::vector<transport::Message> takeArrived(transport::MessageKind kind, uint64_t round,
                                              uint32_t peer);
  std::vector<transport::Message> takeArrived(Control control, uint32_t peer) {
    return takeArrived(transport::MessageKind::kControl, roundOf(control), peer);
  }
  // A bounded receive that records the wait; DeadlineExceeded names the
  // peer, what was awaited and the timeout.
  StatusOr<transport::Message> receiveFrom(uint32_t peer, transport::MessageKind kind,
                                           uint64_t round, std::chrono::milliseconds timeout,
                                           const std::string& what);
  StatusOr<transport::Message> receiveFrom(uint32_t peer, Control control,
                                           std::chrono::milliseconds timeout,
                                           const std::string& what) {
    return receiveFrom(peer, transport::MessageKind::kControl, roundOf(control), timeout, what);
  }
  // Agrees on the final model among the group members alive at the end:
  // the coordinator (the lowest rank no one suspects) asks every member it
  // does not suspect for its fp32 model, at most finalModelsInFlight() of
  // them at a time, averages what arrived (weights renormalized, rank
  // order) in its own model's storage and sends that one buffer back, so
  // every survivor ends with the same bytes. A member
  // that gets no average from its coordinator (or must refuse it), and a
  // worker left alone at the end after its peers finished without it, fail
  // (Unavailable, DataLoss) saying that their model is not the job's.
  Status averageModels(train::FlatParameters& flat, int64_t steps);
  // Its two sides, from the model's whole storage `whole` and the time it
  // began (`t0`, for the log): the coordinator's, and a member's of
  // coordinator `c` (`request`: its request, where a switch to it came with
  // one). Either fails with final_->to set where this worker learns of a
  // coordinator below the one it follows while its model is untouched
  // (serveFinalCoordinators); averageModels then follows that one.
  Status coordinateFinal(train::FlatParameters& flat, int64_t steps, torch::Tensor& whole,
                         geo::Clock::TimePoint t0);
  Status followFinal(uint32_t c, std::optional<transport::Message> request,
                     train::FlatParameters& flat, int64_t steps, torch::Tensor& whole,
                     geo::Clock::TimePoint t0);
  // Where the final average stands on who coordinates it (group indices).
  struct FinalCoordination {
    size_t following = 0;      // the coordinator this worker follows (self: it coordinates)
    bool switchable = true;    // its model untouched: it may still follow another
    std::optional<size_t> to;  // a coordinator below `following` this worker learnt of
    std::optional<transport::Message> request;  // `to`'s request, where that is how
    std::vector<uint32_t> asked;                // the ranks this worker asked, as coordinator
    // A member left out of its coordinator's average takes the job's model
    // from a fellow: a worker that said it follows the same coordinator
    // (askFellowForFinal, finalFromFellow).
    std::vector<std::optional<size_t>> says;  // by group index: whom that worker said it follows
    bool requested = false;            // `following`'s request taken: this worker is counted in
    std::vector<size_t> fellowsAsked;  // every fellow asked for the job's final model, in turn
    std::optional<transport::Message> model;  // the job's final model, from fellow()
    std::optional<size_t> leftOutBy;          // the coordinator that counted it out (kFinalLeftOut)
    bool fromFellow = false;                  // finalFromFellow waits: no Aborted for the two above
    // The fellow asked last: the one whose answer is awaited.
    std::optional<size_t> fellow() const {
      return fellowsAsked.empty() ? std::nullopt : std::optional<size_t>(fellowsAsked.back());
    }
  };
  // Called by serveMembership during the final average: answers a request
  // from a coordinator above the one followed with Control::kFinalFollows
  // (naming it), and notes one below it (its request, or a worker's
  // kFinalFollows naming it) in final_->to. Fails (Aborted) once one is
  // noted while the model is untouched, so that every wait of the final
  // average ends and averageModels switches.
  // It also takes a coordinator's Control::kFinalLeftOut (the workers it
  // names are fellows; one below the one followed is followed) and a
  // fellow's answer (final_->model), and while this worker suspects the
  // coordinator it follows, or was counted out by it, asks a fellow for
  // the job's model. Once counted out, or once the answer is in before the
  // coordinator's request, it fails (Aborted) as well: the average is made
  // without this worker, and followFinal takes the fellow's.
  Status serveFinalCoordinators(int64_t step);
  // Asks the nearest fellow of this worker (one that said it follows the
  // same coordinator) that is not suspected and was not asked before for
  // the job's final model (Membership::askForFinalModel); the coordinator
  // itself where it counted this worker out and no fellow is left. False
  // where none is.
  StatusOr<bool> askFellowForFinal(int64_t step);
  // A member whose wait for its coordinator `c` failed: the job's model
  // from a fellow, into `whole`. Waits for the fellow's answer up to the
  // round time-out, and asks the next fellow once the one asked is
  // suspected. NotFound (saying why) where no fellow sends it; Aborted
  // where a coordinator below `c` turns up meanwhile (final_->to); DataLoss
  // where the model is refused.
  Status finalFromFellow(uint32_t c, const train::FlatParameters& flat, int64_t steps,
                         torch::Tensor& whole);
  // Why coordinator `c` counts as gone for a member of the final average
  // (empty: it does not): rejoining (it restarted), or suspected and silent
  // for the round time-out. Not merely suspected: on full uplinks the
  // average's own bytes hold a live coordinator's pings back for longer
  // than the peer time-out (26 s seen at 2 Mbit/s), and a member that gave
  // up on it ended without the job's model.
  std::string finalCoordinatorGone(uint32_t c) const;
  // A member's wait for `control` from its coordinator `c`, while serving
  // membership, until `timeout` or finalCoordinatorGone(c).
  StatusOr<transport::Message> awaitCoordinator(uint32_t c, Control control, int64_t steps,
                                                const train::FlatParameters& flat,
                                                const std::string& what,
                                                std::chrono::milliseconds timeout) {
    return awaitFrom(c, transport::MessageKind::kControl, roundOf(control), steps, flat, true, what,
                     timeout, Patience::kCoordinator);
  }
  // The coordinator's half of it: the average (`whole`) to each of `to`,
  // paced by uplinkBytesPerSecond() where it is known (one copy per
  // model's time at that rate, the farthest peer first), else to all at
  // once.
  Status sendAverage(std::vector<uint32_t> to, int64_t steps, const train::FlatParameters& flat,
                     const torch::Tensor& whole);
  // The coordinator's half for a large model (final_average.h
  // shardFinalAverage): the members' order to each of `to`, then shard i of
  // the average to member i (paced as sendAverage's copies), which forwards
  // it to the others; waits for every member's acknowledgement (not for a
  // member suspected), and sends the whole average (sendAverage) to those
  // without one after three times what the shards should take on the
  // uplinks as measured (the round time-out without a rate), or once a
  // member is suspected, after what they should take from then.
  Status sendAverageInShards(const std::vector<uint32_t>& to, int64_t steps,
                             const train::FlatParameters& flat, const torch::Tensor& whole);
  // A member's wait for coordinator `c`'s average: the whole average's
  // message (not yet copied; empty: made without this member), or nullopt
  // once its shards have all been copied into `whole` (this member's own
  // forwarded to the others on the way; `order` then holds the members).
  // Unavailable once `c` is suspected; DataLoss for a refused shard or a
  // malformed order. After a failure `whole` may hold some shards of the
  // average beside its own values: the member fails then either way, its
  // model not the job's (no checkpoint is written after a failed end).
  StatusOr<std::optional<transport::Message>> awaitFinalAverage(uint32_t c, int64_t steps,
                                                                const train::FlatParameters& flat,
                                                                torch::Tensor& whole,
                                                                std::vector<uint32_t>& order);
  // The final average by reduce-scatter (final_average.h
  // FinalAverageWay::kReduceScatter; control.h says its messages), attempt
  // `attempt` among `order` (ranks, coordinator `c` first, this worker
  // among them), for the coordinator and its members alike: each worker
  // sends shard q of `whole` to order[q], paced at the rate its uplink was
  // seen to carry the rounds, averages the shard it owns from every
  // worker's (weights, sum order and arithmetic those of the whole
  // average: the same bytes), and sends the average to the others. `whole`
  // is untouched until the coordinator says every worker holds every
  // shard (then each copies them in: true). The coordinator starts over
  // (false) once a worker is suspected or refused a shard, or three times
  // what the shards should take has passed (the round time-out without a
  // rate); a member returns false with the coordinator's new request in
  // `next`. Unavailable once `c` is suspected; DataLoss for a refused
  // shard of the average at the end.
  StatusOr<bool> reduceScatterFinal(uint32_t c, uint32_t attempt,
                                    const std::vector<uint32_t>& order, int64_t steps,
                                    const train::FlatParameters& flat, torch::Tensor& whole,
                                    std::optional<transport::Message>& next);
  // The way the coordinator takes the final average among itself and
  // `to` (SyncOptions::finalWay, else GEO_SYNC_FINAL in the environment:
  // whole, shards or reduce-scatter, for measurements; else
  // finalAverageWay on this worker's uplink rate, 1 Gbit/s where none was
  // measured), never by reduce-scatter unless `reduceScatter`. With
  // `explain`, logs the way and what it was reckoned from (the rate, whether
  // measured, the latency, each way's seconds).
  FinalAverageWay finalWay(const std::vector<uint32_t>& to, uint64_t modelBytes, bool reduceScatter,
                           bool explain = false) const;
  // The coordinator's wait for each of `to` to acknowledge the final
  // average (a send is only queued: leaving before it has gone would drop
  // it), up to the round time-out each, not for one suspected; a member
  // without one is warned of, not failed.
  void awaitFinalAcks(const std::vector<uint32_t>& to, int64_t steps,
                      const train::FlatParameters& flat);
  // A member's copy of the coordinator's average, or of `what` of it (a
  // shard), into `into`, under checkedCopy()'s rules; a refusal is counted
  // and fails the member (DataLoss): its model is not the job's.
  Status takeFinal(const transport::Message& m, torch::Tensor& into, uint32_t from,
                   const std::string& what);
  // Waits `seconds` while serving joins.
  Status pauseServing(double seconds, int64_t steps, const train::FlatParameters& flat);
  // Half the largest of the smallest recent ping round trips to `peers`
  // (0 where none is measured).
  double farthestOneWaySeconds(const std::vector<uint32_t>& peers) const;
  // After the final average: while a restarted peer is in the middle of
  // joining (it asked while we were finishing), keep answering it -- with
  // "finished", or the final model at the last step -- for up to two peer
  // time-outs, so it learns that the job is over instead of training alone.
  Status lingerForJoiners(const train::FlatParameters& flat, int64_t steps);
  // How long a wait holds on to a silent peer: until the membership
  // suspects it, or (a member for its final average's coordinator) until
  // finalCoordinatorGone says so.
  enum class Patience : uint8_t { kUntilSuspected, kCoordinator };
  // Waits for `what` while serving joins; gives up on a peer once it is
  // suspected (or as `patience` says), or after `timeout` (then it is
  // counted absent).
  StatusOr<transport::Message> awaitFrom(uint32_t peer, transport::MessageKind kind, uint64_t round,
                                         int64_t step, const train::FlatParameters& flat,
                                         bool finished, const std::string& what,
                                         std::chrono::milliseconds timeout,
                                         Patience patience = Patience::kUntilSuspected);
  StatusOr<transport::Message> awaitFrom(uint32_t peer, Control control, int64_t step,
                                         const train::FlatParameters& flat, bool finished,
                                         const std::string& what,
                                         std::chrono::milliseconds timeout) {
    return awaitFrom(peer, transport::MessageKind::kControl, roundOf(control), step, flat, finished,
                     what, timeout);
  }
  // Counts a refused contribution and logs it, rate-limited per peer (the
  // first three, then every 100th): nothing a peer sends may flood the log.
  void reject(uint32_t peer, const std::string& what, const std::string& reason, const Status& why);
  // Serves joins; the algorithm hears of membership's events through the
  // three hooks below, in this order within one call: peers newly
  // suspected, peers that (re)started, peers heard again.
  Status serveMembership(int64_t step, const train::FlatParameters& flat, bool finished);
  // A peer Membership has just found silent for its peer time-out. What is
  // waited for from it is given up through Membership's queries
  // (suspected(), expected()) where the wait is; this is for what an
  // algorithm holds open with one peer (swarm's exchange in flight).
  virtual void peerSuspected(uint32_t peer) { (void)peer; }
  virtual void peerRestarted(uint32_t peer) { (void)peer; }
  // A suspected peer heard again, or one that asked for our resume, while
  // Base serves membership (the final average, the linger for joiners).
  virtual Status peerHeardAgain(uint32_t peer) {
    (void)peer;
    return {};
  }
  // Whether group member `index` has said that it took its last step (DTS
  // announces it); false where the algorithm does not tell. The final
  // average reads it: a worker that ends alone after its peers finished and
  // went ends on a model that is not the job's.
  virtual bool peerFinished(size_t index) {
    (void)index;
    return false;
  }
  // The rate, in bytes per second, at which this worker's uplink was seen to
  // carry its rounds to all its peers (DTS measures it from the rounds'
  // crossings); 0 where the algorithm does not measure it. The final
  // average paces its copies by it (averageModels).
  virtual double uplinkBytesPerSecond() const { return 0; }
  // What uplinkBytesPerSecond() was measured from, for log lines.
  virtual std::string uplinkRateSource() const { return "nothing"; }
  // The rate the final average's way is chosen by (finalWay):
  // uplinkBytesPerSecond() where known, else what left this machine while
  // it held data back (BusyUplinkRate, a bound from below: not one to pace
  // by), else 0. `source` (may be null) says which.
  double wayRate(std::string* source = nullptr) const;
  // Samples what has left this machine towards the group's peers and what
  // still waits on it (BusyUplinkRate), at most every kUplinkSampleEvery
  // (two system calls per peer where the transport asks the kernel:
  // Transport::queuedBelowBytes), and hands the stats wayRate(). DTS calls
  // it every step and in every wait (serveAndResend), swarm every step,
  // allreduce while it waits for the gradients.
  void sampleUplink();
  static constexpr auto kUplinkSampleEvery = std::chrono::milliseconds(50);
  // Before the final average, for a worker that hears none of its peers
  // (it is cut off, most likely, rather than every other worker dead):
  // waits while a peer is suspected that fell silent less than the round
  // time-out ago -- a partition may heal, and a worker that finished alone
  // on its side would end with a model of its own -- serving membership
  // meanwhile; a peer silent for longer is gone. Once the first of them is
  // heard again (the partition heals), the others get up to one peer
  // time-out more (5 s at least) to be heard too, so that the coordinator is chosen among
  // all that come back, as they choose it. A worker that hears some peers
  // when it finishes does not wait: a silent one is then dead more often
  // than cut off, and waiting cost every survivor of a dead peer the round
  // time-out.
  Status awaitSuspectedPeers(const train::FlatParameters& flat, int64_t steps);

  SyncOptions options_;
  Topology topology_;
  transport::Transport* transport_;
  Group group_;
  StatsRecorder stats_;
  std::unique_ptr<FlatCodec> codec_;
  bool modified_ = false;
  std::optional<FinalCoordination> final_;  // while averageModels runs
  Membership membership_;
  std::map<uint32_t, uint64_t> rejectedBy_;  // for the log's rate limit
  BusyUplinkRate busyUplink_;
  std::optional<geo::Clock::TimePoint> lastUplinkSample_;
};

std::unique_ptr<Base> makeAllreduce(const SyncOptions& o, const Topology& t,
                                    transport::Transport* tr, Group g);
std::unique_ptr<Base> makeDts(const SyncOptions& o, const Topology& t, transport::Transport* tr,
                              Group g);
std::unique_ptr<Base> makeSwarm(const SyncOptions& o, const Topology& t, transport::Transport* tr,
                                Group g);
// Hierarchical sync around `inner`, the WAN algorithm among the region
// leaders (null on a member, which runs none).
std::unique_ptr<Synchronizer> makeHierarchical(const SyncOptions& o, const Topology& t,
                                               transport::Transport* tr,
                                               std::unique_ptr<Base> inner);

// A contiguous fp32 CPU tensor's bytes (what a peer's checkedCopy() takes).
std::shared_ptr<std::vector<std::byte>> tensorBytes(const torch::Tensor& t);
// The same bytes as a payload that shares the tensor's storage (no copy):
// the tensor must not be written until the transport has sent them (for
// the final average: until the peer's answer shows it has them all). A
// device tensor is copied to the host (tensorBytes).
transport::Payload modelPayload(const torch::Tensor& t);

// The parity fingerprint (parity.h) of a tensor of any device and float
// type: on the CPU fingerprintOf(); on a GPU computed there, chunk by
// chunk with tensor ops (the index's class, the class sums, Σ v²), so that
// only 17 doubles cross to the host. Copying a model to the host and
// fingerprinting it there took 88 ms a step for resnet18 with a round
// every step on an H100's host. `onDevice` forces the tensor-op path on
// the CPU too (for tests: both give the same fingerprint up to rounding).
ParityFingerprint tensorFingerprint(const torch::Tensor& t, bool onDevice = false);

}  // namespace geo::sync::detail
