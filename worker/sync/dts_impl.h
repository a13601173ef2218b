#pragma once
// DTS: delayed and temporally sparse updates (docs/architecture.md section 3).
//
// Round r covers steps rK+1 .. (r+1)K. At its end the worker sends
// q_i(r) = Q(acc_i + e_i), where acc_i is its own optimizer progress over the
// round (x at the round's start, plus corrections applied since, minus x
// now: corrections are not accumulated), keeps the residual e_i, and goes on.
// The residual has no storage of its own: the round's start is kept as
// x_start + e_i, so that start - x is acc_i + e_i, and a close sets it to
// x + (acc_i + e_i - q_i), the new residual computed in its storage. Error
// feedback then costs no model-sized tensor (docs/algorithms.md, "Memory").
// At step (r+1)K + D it needs q̄(r) = sum_j w_j q_j(r) and applies
// x <- x + q_i(r) - q̄(r). Rounds are completed in order; several may be in
// flight. With D = 0 and the identity codec it computes x <- x_start - q̄
// instead, which keeps all replicas bitwise equal.
//
// Membership (worker/sync/membership.h): a round is completed with the
// contributions of the peers expected in it -- not suspected (silent for the
// peer time-out), not rejoining, and joined at or before the round -- waited
// for up to the round time-out; the mean is taken over those that arrived,
// weights renormalized: q̄_S = sum_{j in S} w_j q_j / W_S. Every survivor
// applies the same rule to the same bytes, so survivors that saw the same
// set stay as consistent as without a fault. A contribution that arrives
// after its round completed without it (a peer suspected wrongly, or late
// through a partition's edge) is applied when it arrives, as if it had been
// in the mean: x <- x - w_j (q_j - q̄_S) / (W_S + w_j), for the last
// incomplete rounds, as many as the delay spans and at least kLateWindow
// (lateWindow()); older ones are counted as dropped and logged.
// A worker that starts while the others are ahead takes the model of the
// nearest live peer, the job's step and round, and contributes from the
// round that its first K-boundary closes; its own rounds in flight are void.
//
// `auto` delay: D only has to hide the links, not the skew between workers.
// A contribution's lag as its receiver sees it -- when it arrived (stamped by
// the transport) minus when the receiver sent its own part of the same round
// -- is the link's one-way time plus the skew between the two: if i runs s
// seconds ahead of j, lag_ij = L_ji + s and lag_ji = L_ij - s. Counting that
// skew as latency feeds on itself: a larger D lets the faster worker run
// further ahead, which the next measurement takes for a slower link. So after
// completing a round every worker sends its peers the lags it measured
// (Control::kLagReport), and each pair's one-way link time is
// (lag_ij + lag_ji) / 2, in which the skew cancels. The next rounds use the
// smallest D that covers the slowest link of the last few rounds, in steps of
// this worker's compute (waits excluded): D = ceil(max L / step time). A
// worker that runs ahead then waits at its due step, which brings the
// workers back together instead of raising everyone's D. Before the first
// reports it uses half the slowest ping round trip; a round closed before
// any ping came back is due once one does (D steps after its close), and at

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <future>
#include <limits>
#include <optional>
#include <string_view>
#include <thread>
#include <tuple>
#include <utility>

#include "common/logging.h"
#include "worker/sync/auto_rules.h"
#include "worker/sync/dts_state.h"
#include "worker/sync/early_beside.h"
#include "worker/sync/internal.h"
#include "worker/sync/link_ledger.h"
#include "worker/sync/parity.h"
#include "worker/sync/state_parity.h"
#include "worker/sync/uplink_pace.h"

namespace geo::sync::detail {

using transport::CodecId;
using transport::Message;
using transport::MessageKind;

constexpr size_t kLagWindow = 4;  // link samples per peer the auto delay looks back on
constexpr int64_t kMinStepsBetweenChanges = 32;
constexpr size_t kLateWindow = 4;  // incomplete rounds a late contribution may still join
constexpr auto kPoll = std::chrono::milliseconds(20);
// A round's completion, its early applications and the job model go through
// a CPU model this many values at a time (4 MB of fp32): a pass holds a few
// slices instead of a few models (docs/algorithms.md, "Memory"). A GPU
// model's pass is one slice: device memory is not what runs short there, and
// each operation costs a launch.
constexpr int64_t kSliceValues = int64_t{1} << 20;

// Model-sized scratch tensors reused from round to round. A large model
// makes each of them tens of megabytes, which the allocator maps fresh and
// the kernel page-faults in on every use: with a 20M-parameter mlp a
// quarter of a worker's CPU went to page faults (perf), most of it in the
// tensors a round decodes into and adds up. take() hands out a kept one of
// the same size and type or a new one (contents undefined); give() keeps a
// tensor no one else holds, at most kKept of them. Training thread only.
class ScratchTensors {
 public:
  torch::Tensor take(const torch::Tensor& like) {
    for (size_t i = 0; i < kept_.size(); ++i) {
      if (kept_[i].sizes() == like.sizes() && kept_[i].dtype() == like.dtype() &&
          kept_[i].device() == like.device()) {
        torch::Tensor t = std::move(kept_[i]);
        kept_.erase(kept_.begin() + static_cast<std::ptrdiff_t>(i));
        return t;
      }
    }
    return torch::empty_like(like);
  }
  void give(torch::Tensor t) {
    // A tensor whose storage someone else still holds (a view kept in a
    // Late entry, a clone's source) is not ours to reuse.
    if (!t.defined() || t.use_count() != 1 || t.storage().use_count() != 1) return;
    if (kept_.size() < kKept) kept_.push_back(std::move(t));
  }
  void clear() { kept_.clear(); }

 private:
  // What the paths that still work on whole models use at once: the exact
  // completion (K = 1, D = 0, identity: its own contribution and the
  // mean), the mean of a round completed without a peer and the late
  // contribution added to it, an early sum restored from a checkpoint. A
  // CPU worker's rounds otherwise complete slice by slice (sliceBuffer)
  // and take nothing from here (docs/algorithms.md, "Memory").
  static constexpr size_t kKept = 4;
  std::vector<torch::Tensor> kept_;
};

// Where afterStep()'s time goes, stage by stage, logged when the job ends:
// what limits a job whose time in the synchronizer is large (the summary
// splits it only into encoding, decoding, waiting and the rest; a wait at
// a due step counts here in completing rounds). A GPU worker's
// device work is queued, and counts where something first waits for it;
// with GEO_SYNC_STAGE_TIMES=device in the environment each stage waits for
// the device at its end, so that its work counts where it was queued (for
// measurements: it costs a synchronization per stage). Training thread
// only.
class StageTimes {
 public:
  enum Stage {
    kResend,
    kServe,
    kArrivals,
    kEarly,
    kLate,
    kParity,
    kClose,
    kLink,
    kComplete,
    kCount
  };

  void start(const torch::Tensor& like) {
    static const bool kWaitForDevice = [] {
      const char* v = std::getenv("GEO_SYNC_STAGE_TIMES");
      return v != nullptr && std::string_view(v) == "device";
    }();
    waitForDevice_ = kWaitForDevice && like.is_cuda();
    // A profile of this worker's own work: real time, whatever clock the
    // synchronizer waits on.
    at_ = std::chrono::steady_clock::now();
    ++calls_;
  }
  void lap(Stage s) {
    if (waitForDevice_) torch::cuda::synchronize();
    const auto now = std::chrono::steady_clock::now();
    seconds_[s] += std::chrono::duration<double>(now - at_).count();
    at_ = now;
  }
  // "13.14 ms per step: completing rounds 6.69, closing rounds 3.76, ...":
  // ms per call, the largest first, stages under 1% of the total left out.
  std::string describe() const {
    static constexpr std::array<const char*, kCount> kNames = {
        "resending",          "serving peers",      "taking arrivals",
        "early applications", "late contributions", "state parity",
        "closing rounds",     "measuring the link", "completing rounds"};
    double total = 0;
    for (double s : seconds_) total += s;
    if (calls_ == 0 || total <= 0) return "nothing measured";
    std::array<int, kCount> order{};
    for (int i = 0; i < kCount; ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](int a, int b) { return seconds_[a] > seconds_[b]; });
    std::string out;
    for (int i : order) {
      if (seconds_[i] < 0.01 * total) break;
      out += fmt::format("{}{} {:.2f}", out.empty() ? "" : ", ", kNames[i],
                         1e3 * seconds_[i] / static_cast<double>(calls_));
    }
    return fmt::format("{:.2f} ms per step: {}", 1e3 * total / static_cast<double>(calls_), out);
  }

 private:
  std::array<double, kCount> seconds_{};
  std::chrono::steady_clock::time_point at_;
  int64_t calls_ = 0;
  bool waitForDevice_ = false;
};

class Dts final : public Base, private StateParity::Host {
 public:
  Dts(const SyncOptions& o, const Topology& t, transport::Transport* tr, Group g);

  std::string describe() const override;

  // The round's start is the model before the first optimizer step. When
  // the peers' contributions were more than kFullStepDelay steps old as they
  // were applied (the mean over the last round completed: D under a fixed
  // delay; less under an automatic one, where a near peer's is applied as
  // it arrives), the gradient is scaled by delayLrScale (auto_rules.h),
  // which for SGD is the step size: the own steps a worker's model holds in
  // place of the job's are taken out again when the average replaces them,
  // and that delayed feedback on the gap between the worker and the job
  // oscillates at the step size tuned for no delay.
  // Before gradient clipping and weight decay, which the trainer applies
  // after this hook; a hierarchical leader scales the region's gradient
  // before its members get it, so that the region's replicas stay equal.
  Status afterBackward(int64_t step, train::FlatParameters& flat) override;

  Status afterStep(int64_t step, train::FlatParameters& flat) override;

  StatusOr<train::JoinResult> join(int64_t step, train::FlatParameters& flat) override;

  Status finish(int64_t steps, train::FlatParameters& flat) override;

  // The model every worker agrees on as of the last round completed,
  // x0 - Σ q̄ over the completed rounds. It needs no state of its own: a
  // close moves base_ (the round's start plus the residual) by -own, a
  // completion by own - q̄, and an early application by w_j (own - q_j); so
  // base_ + each round in flight's own contribution less what of it was
  // corrected early, (1 - Σ_early w_j) own + Σ_early w_j q_j, is exactly it.
  // With an identity codec it is the mean of the workers' models at that
  // round's close (Dts.TheJobModelIsTheMeanAtTheLastCompletedRound).
  std::optional<train::JobModel> jobModel() override;

  // The job model's values [lo, lo + out.numel()) into `out`: the same
  // operations on each value as a whole jobModel() (which is made of
  // these), using slice buffers 0 and 1.
  void jobModelInto(int64_t lo, torch::Tensor& out);

  // tensorFingerprint() of the job model, made a slice at a time on a CPU
  // worker: a parity check every kParityEvery rounds held a whole job model
  // (docs/algorithms.md, "Memory"). The same fingerprint to the bit.
  ParityFingerprint jobModelFingerprint(const torch::Tensor& like);

  // The checkpoint's format is dts_state.h's; here what goes in and comes
  // out of it.
  void saveState(torch::serialize::OutputArchive& archive) override;

  Status loadState(torch::serialize::InputArchive& archive) override;

 private:
  // What a reduce-scatter round holds to answer a peer that lost one of
  // its owners (takeParts): this worker's contribution (null: none to
  // answer with), to whom its part of which shard went (by peer, then
  // shard: to every peer but the owner where this worker lost the owner;
  // to one that sent its own part, exchangeShards), the shards' means as
  // their owners sent them (kReduced) or as a peer relayed one that this
  // worker lacked (kRelayed), by shard, and to whom this worker relayed
  // which mean (by peer, then shard). A round in flight (Pending) is one;
  // the last kAnswerable completed here are kept as one (answerable_).
  struct Answerable {
    uint64_t round = 0;
    int64_t sendStep = 0;
    std::shared_ptr<const std::vector<std::byte>> bytes;
    std::vector<std::vector<bool>> partTo;
    std::vector<std::optional<Message>> reducedIn;
    std::vector<std::optional<Message>> relayedIn;
    std::vector<std::vector<bool>> meanTo;
  };
  // The mean of shard s that `a` holds: its owner's, else one relayed;
  // null if neither came.
  static const Message* heldMean(const Answerable& a, size_t s) {
    if (s < a.reducedIn.size() && a.reducedIn[s]) return &*a.reducedIn[s];
    if (s < a.relayedIn.size() && a.relayedIn[s]) return &*a.relayedIn[s];
    return nullptr;
  }

  struct Pending : Answerable {
    int64_t dueStep = 0;
    bool provisionalDue = false;  // closed before the links were known (closeRound)
    // This worker's contribution as the others see it, decode(q_i), is
    // decoded from `bytes` where it is needed (decodeOwn) rather than kept:
    // a model-sized tensor per round in flight.
    torch::Tensor start;  // D = 0 with the identity codec: x at the round's start
    std::vector<std::optional<Message>> got;  // by group index
    geo::Clock::TimePoint sentAt;             // when this worker sent its part
    // D = auto: contributions applied as they arrived (applyEarly), by group
    // index, and Σ w_j over them; those that did not decode are left to
    // complete(). Σ w_j q_j is decoded again from their bytes where it is
    // needed (earlySumInto) rather than kept: a model-sized tensor per round
    // in flight. After a resume the bytes of those applied before the
    // checkpoint are gone: their sum comes back as `earlySum`, and
    // `inEarlySum` says whose it holds.
    std::vector<bool> early;
    std::vector<bool> undecodable;
    torch::Tensor earlySum;
    std::vector<bool> inEarlySum;
    double earlyWeight = 0;
    bool appliedEarly(size_t i) const { return i < early.size() && early[i]; }
    bool summed(size_t i) const { return i < inEarlySum.size() && inEarlySum[i]; }
    bool anyEarly() const { return std::find(early.begin(), early.end(), true) != early.end(); }
    // The staleness (steps since sending) of the peers' contributions as
    // they were applied, early or at completion: the step scale's input.
    double stalenessSum = 0;
    int64_t appliedCount = 0;
    void applied(int64_t staleness) {
      stalenessSum += static_cast<double>(staleness);
      ++appliedCount;
    }
    // Peer i's contribution is in this round: arrived, or applied before a
    // restart from a checkpoint.
    bool has(size_t i) const { return got[i].has_value() || appliedEarly(i); }
    // Reduce-scatter (sync.exchange; docs/algorithms.md, "Reduce-scatter"):
    // the peers' parts of this worker's shard, by group index (a whole
    // contribution in `got` serves too); the shards' means (Answerable);
    // this worker's own shard's mean, once made (reduceOwn); whether this
    // worker's whole contribution went to every peer (its round closed
    // under all-gather: reexchange).
    bool sharded = false;
    // Its exchange changed to all-gather after its shards left
    // (reexchange): its whole contribution is still to go to every peer.
    bool owesWhole = false;
    std::vector<std::optional<Message>> shardIn;
    std::shared_ptr<const std::vector<std::byte>> ownReduced;
    bool sentWhole = false;
    // A lost owner's shard (lostShards): by sender, then shard, the
    // sender's part of it (MessageKind::kPart), empty until the first
    // part. And once this worker found an owner of the round lost: until
    // when it waits for the parts that stand in for that owner's mean
    // (shardReady; lostOwnerWait(p)).
    std::vector<std::vector<std::optional<Message>>> partIn;
    std::optional<geo::Clock::TimePoint> ownerLostUntil;
    // By group index: the bytes received from that peer when the wait
    // above was last set (holdLostOwnerWait).
    std::vector<uint64_t> receivedAtLostWait;
    // Whether peer j's part of shard s is here: its kPart, or its whole
    // contribution.
    bool hasPart(size_t j, size_t s) const {
      if (j < got.size() && got[j]) return true;
      return j < partIn.size() && s < partIn[j].size() && partIn[j][s].has_value();
    }
  };

  // A completed round's model-sized tensors go back to the scratch pool.
  void recycle(Pending& p) { scratch_.give(std::move(p.earlySum)); }

  // decode(q_i) of a round, into a scratch tensor (give it back after use):
  // exactly what the peers decode from the same bytes.
  torch::Tensor decodeOwn(const Pending& p, const torch::Tensor& like) {
    torch::Tensor own = scratch_.take(like).zero_();
    codec_->decodeAccumulate(*p.bytes, 1.0f, own);
    return own;
  }

  // The values of a slice of a model like `values` (the whole of a GPU
  // model), and where the slice-wise passes cut it.
  int64_t sliceLength(const torch::Tensor& values) const {
    if (values.is_cuda()) return std::max<int64_t>(1, values.numel());
    return options_.sliceValues > 0 ? options_.sliceValues : kSliceValues;
  }
  std::vector<int64_t> sliceBounds(const torch::Tensor& values) const {
    return codec_->sliceBounds(sliceLength(values));
  }
  // Slice buffer k (0..3) of the slice-wise passes, n values long, on
  // `values`' device; contents undefined. Kept between rounds (fresh ones,
  // page-faulted in each time, cost a large model's worker CPU).
  torch::Tensor sliceBuffer(size_t k, int64_t n, const torch::Tensor& values);
  // Whether a peer's contribution may be used: decoded and checked a slice
  // at a time (FlatCodec::check), before any of it is.
  Status checkContribution(const Message& m, const torch::Tensor& values, std::string& reason) {
    torch::Tensor scratch =
        sliceBuffer(0, std::min(sliceLength(values), std::max<int64_t>(1, values.numel())), values);
    return codec_->check(m.payload.bytes(), scratch, reason);
  }
  // Σ w_j q_j over the contributions of `p` applied early, at values [lo, lo
  // + out.numel()), into `out` (overwritten); `q` is a buffer as long. In
  // rank order, decoded from their bytes (or taken from the sum restored
  // with a checkpoint).
  void earlySumInto(const Pending& p, int64_t lo, torch::Tensor& out, torch::Tensor& q);
  // The same over the whole model (a checkpoint's copy of it).
  torch::Tensor earlySumOf(const Pending& p, const torch::Tensor& values);

  bool exact() const { return !auto_ && delay_ == 0 && codec_->id() == CodecId::kFp32; }

  void init(const train::FlatParameters& flat);

  // Whether a close keeps what quantization did not send (in base_).
  bool errorFeedback() const { return options_.errorFeedback && codec_->id() != CodecId::kFp32; }

  // Moves every model-sized tensor of this synchronizer's state to `device`.
  void placeOn(const torch::Device& device);

  // Whom a round's contribution goes to: every peer not suspected. (A
  // rejoining one gets it too: it may already count on this round, and it
  // drops the rounds it does not need.)
  std::vector<uint32_t> presentPeers() const;

  // Serves joins; a peer heard again, one that heard us again and asked
  // for our resume, or one our connection to was made anew, gets our
  // rounds still in flight: our resume says it gets every one of them (we
  // did not send them while it was suspected, and what a replaced
  // connection held was lost).
  Status serveAndResend(int64_t t, const train::FlatParameters& flat);
  // The peers whose connection was made anew while they stayed expected
  // (connections_), given what this call of serve() reported and the
  // peers `to` (sorted) already getting our rounds in flight: they are
  // sent sent_ again as well.
  std::vector<uint32_t> madeAnew(const Membership::Served& served, const std::vector<uint32_t>& to);

  // After the last step, to a peer heard again (during the final average):
  // it must not wait for rounds of ours that will never come.
  Status peerHeardAgain(uint32_t peer) override {
    return finishing_ ? sendFinished({peer}) : Status();
  }

  // Tells `to` how many rounds this worker closed (Control::kDtsFinished).
  Status sendFinished(const std::vector<uint32_t>& to);

  // Peers that have taken their last step: they send no contribution to a
  // round at or after the one they name (Control::kDtsFinished).
  void takeFinished();

  double uplinkBytesPerSecond() const override { return uplink_.rate(); }
  std::string uplinkRateSource() const override { return uplink_.rateSource(); }

  bool peerFinished(size_t index) override {
    takeFinished();
    return finishedAt_[index].has_value();
  }

  // Whether peer i's contribution to `round` is to be waited for.
  bool awaited(size_t i, uint64_t round) const {
    if (finishedAt_[i] && round >= *finishedAt_[i]) return false;  // it closed no such round
    return membership_.expected(group_.ranks[i], round);
  }

  // A contribution that came after `p` completed without it.
  void applyLate(int64_t t, train::FlatParameters& flat);

  // After a state transfer that left this worker at `step` (join): applies
  // the rounds the job completed without it while the state crossed, as
  // the peers completed them, and returns the step to go on from (`step`
  // where there was none to catch up on). See dts.cc.
  StatusOr<int64_t> catchUp(int64_t step, train::FlatParameters& flat);
  // catchUp's round `r` under reduce-scatter (dts_reduce_scatter.cc): takes
  // off the model, shard by shard, the mean the peers applied -- the
  // owner's where `reduced[s]` (its kReduced is in the inbox), else the
  // mean of the parts of the peers in `from` (whose contributions are in:
  // their kShard of this worker's shard, their kPart of another lost
  // owner's, or their whole kUpdate), as shardMean makes it. False where
  // every part was refused (nothing applied).
  StatusOr<bool> catchUpSharded(uint64_t r, train::FlatParameters& flat,
                                const std::vector<bool>& from, const std::vector<bool>& reduced);

  // How many steps past `closedAt` (the close of the last round a joiner
  // caught up on) its peers are now, by their last lag reports (a peer
  // reports a round's completion about its lead() past the round's close,
  // and has since gone on at the pace it reported), at most to the step
  // before the next round's close: the joiner goes on from there, not
  // from `closedAt`, or every peer would wait that far for its first
  // contribution. 0 where no awaited peer has reported a completion.
  int64_t peersAheadOf(int64_t closedAt);
  // Whether every peer we hear (at least one) has taken its last step
  // (Control::kDtsFinished, taken here first), and, given a round, closed
  // it before.
  bool everyPeerFinished(std::optional<uint64_t> afterClosing);

  // How many incomplete rounds a late contribution may still join: those a
  // delay spans, and at least kLateWindow. A contribution is late by up to
  // its link's time past the due step, which a D chosen before the link was
  // measured (at a start or a resume) can fall short of by the whole link;
  // with steps of ~10 ms and K = 2, a 150 ms link is 7 rounds, and a window
  // of 4 dropped such contributions. Each entry holds one model-sized mean.
  size_t lateWindow() const {
    const auto k = static_cast<size_t>(std::max<int64_t>(schedule_.k, 1));
    return std::max(kLateWindow,
                    (static_cast<size_t>(std::max<int64_t>(delay_, 0)) + k - 1) / k + 1);
  }

  // Updates of rounds that no one will ask for any more (completed, and past
  // the late window) are dropped from the inbox: a restarted peer's queue, a
  // straggler far behind. A dropped one that had not been applied is counted.
  void discardStale();

  // This worker's part of `round`, closed at `sendStep`.
  Status sendUpdate(const std::vector<uint32_t>& to, uint64_t round, int64_t sendStep,
                    std::shared_ptr<const std::vector<std::byte>> bytes) {
    return sendTo(to, MessageKind::kUpdate, round, sendStep, codec_->id(),
                  static_cast<uint64_t>(codec_->numel()), std::move(bytes));
  }

  Status resendPending();

  // Takes whatever contributions of pending rounds have arrived, without
  // waiting (each carries the time it arrived).
  // Under reduce-scatter also the peers' parts of this worker's shard and
  // the shards' means, and it does its part of the exchange (exchangeShards).
  Status pollArrivals();

  // D = auto: a peer's contribution to a round in flight is applied as soon
  // as it arrives, x ← x + w_j (q_i − q_j). Summed over the round's peers
  // these pieces are x + q_i − q̄ (complete() applies the rest, and
  // renormalizes when a peer stays missing), so every rule above holds once
  // the round completes; meanwhile a near peer's progress reaches the model
  // after its own link's time, not the slowest link's. One that does not
  // decode is left to complete(), which refuses it. Not with a fixed D:
  // when a contribution arrives varies, and a fixed D is deterministic.
  //
  // A CPU worker with a model of more than a slice and at most 64M
  // parameters (decodesEarlyBeside) decodes them beside the steps
  // (launchEarly): the training thread only adds the finished correction to
  // the model and the round's start (takeEarly), at the first step after
  // the decoding ends -- a step later than on the training thread, for a
  // large model's decoding that took tens of milliseconds of every step.
  // One such decoding at a time, of every round's arrivals so far; the next
  // starts once the last is taken up.
  void applyEarly(int64_t t, train::FlatParameters& flat);

  // x += w_j (q_i - q_j) for each contribution j in `now` (checked), a
  // slice at a time, in rank order, on the training thread.
  void addEarly(const Pending& p, const std::vector<size_t>& now, train::FlatParameters& flat);

  // The round in flight numbered `round`, or null.
  Pending* pendingRound(uint64_t round);

  // Contributions `who` of `p` are applied early from now on.
  void markEarly(Pending& p, const std::vector<size_t>& who, int64_t t);

  // A round's contributions to apply early: whose (group indices, rank
  // order), their payloads (copies: they hold the bytes) and weights, and
  // this worker's own bytes. After the decoding, which passed their check
  // (whole, before anything of them was used) and which did not.
  struct EarlyRound {
    uint64_t round = 0;
    std::shared_ptr<const std::vector<std::byte>> own;
    std::vector<size_t> who;
    std::vector<transport::Payload> payloads;
    std::vector<float> weights;
    std::vector<size_t> passed, refused;
  };
  // An early application decoded beside the steps (launchEarly): the rounds
  // and Σ over them of Σ_j w_j (q_i - q_j) over the contributions that
  // passed, each round's in rank order.
  struct EarlyResult {
    std::vector<EarlyRound> rounds;
    torch::Tensor correction;
    std::string error;  // the codec's exception, if it threw
    double seconds = 0;
  };

  // Starts decoding `rounds`' arrivals beside the steps. The task reads
  // only what it is given and the codec, whose decodes are const: the
  // training thread may complete other rounds, close and encode meanwhile.
  // Its correction tensor comes from the scratch pool and goes back there
  // (takeEarly).
  void launchEarly(std::vector<EarlyRound> rounds, const train::FlatParameters& flat);

  // Takes up the early application decoded beside the steps, waiting for it
  // if need be: the model and the round's start move by its correction.
  // Where the codec threw, nothing happens (complete() decodes those
  // contributions itself). Every round it decoded is still in flight:
  // complete() and a state transfer take it up first.
  void takeEarly(int64_t t, train::FlatParameters& flat);

  // ---- The agreed schedule: the automatic K, D and exchange, the lag
  // reports, the uplink's pace (dts_schedule.cc) ----

  // Rounds from `round` on start after step `step` and take `k` steps each.
  using Schedule = DtsSchedule;

  // The exchange a job keeps throughout (sync.exchange), all-gather where
  // it is chosen at run time: where an automatic one starts.
  static Exchange fixedExchange(const SyncOptions& o) {
    return o.exchange == "reducescatter" ? Exchange::kReduceScatter : Exchange::kAllGather;
  }
  // Whether the rounds of the schedule in force are exchanged by
  // reduce-scatter.
  bool sharded() const { return schedule_.exchange == Exchange::kReduceScatter; }

  // Whether the workers agree on a schedule at run time (an automatic
  // period or exchange), which the coordinator decides (choosePeriod) and
  // the lag reports carry.
  bool scheduling() const { return options_.autoPeriod || autoExchange_; }

  // Whether rounds are measured and reported (lags, and the schedule).
  bool measuring() const { return auto_ || scheduling(); }

  // The step at which round n closes (before the schedule's change: as if
  // its K had always been in force).
  int64_t closeOf(uint64_t n) const {
    return schedule_.step +
           (static_cast<int64_t>(n) - static_cast<int64_t>(schedule_.round) + 1) * schedule_.k;
  }
  // The round that step s + 1 belongs to (before the schedule's change: as
  // if its K had always been in force).
  uint64_t roundAt(int64_t s) const;

  // Takes a schedule heard of (a peer's, or this worker's own decision). A
  // change for a later round waits for it; one for a round this worker has
  // opened already (it heard late) is in force now, and the open round
  // closes on the new grid, or at the next step if that is behind it.
  void adopt(const Schedule& e, int64_t t);

  // Report layout (Control::kLagReport, header.step = the round reported on, or
  // kNoRound for a schedule only): one little-endian IEEE double, the lag
  // (seconds) of the receiver's own contribution, NaN where none came (each
  // peer is told only its own: the report's size does not grow with the
  // job's, docs/membership.md "What liveness costs at scale"); then the
  // schedule in force and the next one (k = 0: none), three int64 each;
  // then the round the sender closes next, the shortest its rounds may last
  // (fastestRoundSeconds(), in nanoseconds) and its lead() (int64 each),
  // which tell the coordinator how far ahead of it a peer may run
  // (choosePeriod); then the two schedules' exchanges (0: all-gather, 1:
  // reduce-scatter), int64 each.
  static constexpr uint64_t kNoRound = ~uint64_t{0};
  static constexpr size_t kScheduleValues = 11;
  static constexpr size_t kScheduleBytes = kScheduleValues * sizeof(int64_t);
  static constexpr size_t kLagReportBytes = sizeof(double) + kScheduleBytes;

  // `lags` by group index.
  Status reportLags(uint64_t round, const std::vector<double>& lags);
  // The rounds sent so far measure a disturbance, not the links
  // (LinkLedger::disturbed): a peer suspected, heard again, restarted or
  // reconnected, or an update applied after its round.
  void disturbed();

  // Takes the peers' reports: their schedules (auto period), and their lags
  // paired with this worker's own lags of the same round: (lag_ij + lag_ji)
  // / 2 is the link's one-way time, skew cancelled. A report of the wrong
  // size or with values out of range is ignored (a peer can at worst make D
  // wrong, within maxAutoDelay, or K, within maxAutoPeriod). Returns whether
  // any report came.
  bool takeLagReports(int64_t t);

  // A worker that took a peer's state under an automatic period learns the
  // job's schedule from the peers' next reports (every worker sends one per
  // round) before it numbers its rounds.
  void awaitSchedule(int64_t step);

  // Auto period (the coordinator only: the lowest-ranked member not
  // suspected, where it hears most of the group; decidesSchedule). A
  // round's updates leave through one uplink; what the slowest link takes
  // beyond its latency (one-way time less half the smallest recent ping
  // round trip) is the round's transfer time, from which autoPeriod()
  // (auto_rules.h) chooses K. A change takes effect from a round two rounds
  // and the links' latency ahead, and travels in the reports. Called at
  // each round's completion, and at a round's close
  // (`atClose`) for the uplink's part alone: a completion comes D steps
  // after its close, and where steps are short D is long (50-200 steps of
  // 1-3 ms on the world links), while two rounds held back by the uplink
  // are known as soon as they leave.
  Status choosePeriod(bool atClose);

  // The peers' smallest recent ping round trips into the link ledger
  // (LinkLedger::addRtt): the links' latency without queueing.
  void noteRoundTrips();

  // The latest rounds' transfer over the slowest link (roundTransferSeconds
  // of each link measured, where `measured`: six rounds of the K in force),
  // -1 where none is, recorded as the uplink's rate
  // (UplinkPace::measuredTransfer); `latency`: the links' largest half
  // ping round trip. choosePeriod's measurement; and, where neither K nor
  // the exchange is chosen at run time (no choosePeriod) but D is,
  // measureUplinkAtFixedPeriod's at each round's completion: the final
  // average's way and pacing go by the rate. Without it a fixed K = 128 on
  // 2 Mbit/s uplinks read as not measured, and the average went whole in
  // 17.2-17.9 s where reduce-scatter takes about 9.
  double measureUplink(bool measured, double& latency);
  void measureUplinkAtFixedPeriod();
  // Whether the link samples are all of the K in force: its sixth round
  // since the latest change (or the start) has completed.
  bool periodMeasured() const { return roundsSinceChange_ >= kLagWindow + 2; }

  // One payload encoded or decoded, from the codec's work a round as
  // measured (noteCodecRound): a round under all-gather is this worker's
  // payload encoded and G - 1 decoded, under reduce-scatter about four
  // payloads' worth (exchange_choice.h).
  double codecPayloadSeconds() const {
    const double payloads = sharded() ? 4.0 : static_cast<double>(group_.size());
    return std::max(0.0, codecRoundSeconds_) / payloads;
  }

  // The bytes one round puts on this worker's uplink: a payload for each
  // peer under all-gather; (G - 1) / G of one as parts and as much again as
  // the shard's mean under reduce-scatter.
  double roundUplinkBytes() const {
    const double g = static_cast<double>(group_.size());
    return static_cast<double>(uplink_.lastRoundBytes()) * (sharded() ? 2 * (g - 1) / g : g - 1);
  }

  // Where the uplink held the last two rounds back: how long one round
  // takes through it, the smaller of the held rounds' length
  // (UplinkPace::heldRoundSeconds) and its bytes at the rate the peers
  // acknowledged them (heldBytesPerSecond: the length also holds the
  // draining of a queue left by a smaller K). nullopt where not held.
  std::optional<double> heldRoundTransfer() const;

  // What this worker measured, as exchange_choice.h (the model `geotrain
  // plan` uses) costs an exchange on: the uplink's rate, the slowest link
  // (`latency`, one way), the payload and the codec's time.
  ExchangeInputs exchangeInputs(double latency) const;

  // Both exchanges costed on `in` and this worker's step time, as the
  // automatic period and delay would run each.
  ExchangeVerdict exchangeVerdict(const ExchangeInputs& in) const;

  // The most steps this worker may run past a round's close before it
  // waits for the round: its D, or more for a round in flight closed under a
  // larger D (or before the links were known: due at maxAutoDelay).
  int64_t lead() const {
    int64_t most = delay_;
    for (const Pending& p : pending_) most = std::max(most, p.dueStep - p.sendStep);
    return std::clamp<int64_t>(most, 0, options_.maxAutoDelay);
  }

  // The furthest round a peer may have opened once an announcement sent
  // now reaches it: the round its last report named, plus the rounds it
  // may close at the pace it reported (the fastest it can go) while that
  // report came here and the announcement goes back (the links' smallest
  // round trip), and since the report arrived.
  // At most the round of the step where its lead() makes it wait for our
  // next round: the announcement travels ahead of that round on the same
  // connection, so it cannot pass that step without it (a pace reported
  // before a slower uplink overstated the lead by tens of rounds).
  // nextRound_ when no peer has reported.
  uint64_t furthestPeerRound() const;

  // A round's length as it is lived (UplinkPace::roundSeconds).
  double roundSeconds() const { return uplink_.roundSeconds(schedule_.k, stepSeconds_); }

  // The shortest this worker's rounds may last from now on, as its reports
  // tell the coordinator (furthestPeerRound): K steps of compute, waits
  // excluded, or as lived while its uplink holds them back (they cannot
  // leave faster). Not as lived otherwise: a worker faster than the
  // coordinator waits for the coordinator's rounds, and its rounds as lived
  // are the coordinator's; between two waits it runs as fast as it
  // computes, up to its lead(). Reported as lived, its pace put a change of
  // K at a round it had opened already, 3 to 4 steps before the
  // announcement reached it (Dts.AutoPeriodChangesOnTheSameStepWhereAPeerRunsAhead,
  // about one run in five), and it changed K that much later than the rest.
  double fastestRoundSeconds() const {
    const double lived = roundSeconds();
    if (stepSeconds_ <= 0 || uplink_.heldRoundSeconds()) return lived;
    return std::min(lived, static_cast<double>(schedule_.k) * stepSeconds_);
  }

  // A round leaves only once the uplink has taken the previous one: while
  // a whole round's bytes are still queued for a peer not suspected
  // (roundStillQueued), the worker waits (serving joins), at most the round
  // time-out. A worker whose uplink cannot carry a round per round so slows
  // its rounds to the link. Without it the queue grew without end (4 Mbit/s
  // for K = 2 rounds: 30 s of queue within seconds): every lag with it, D to
  // its cap, and the lag reports the period decides on came behind the same
  // queue.
  Status awaitUplink(int64_t t, train::FlatParameters& flat);

  // A wait for peers or the link: counted, and not part of the step time.
  void noteWait(double seconds) {
    stats_.waited(seconds);
    waitedSince_ += seconds;
  }

  // What the codec took on the training thread since the last close, and
  // the early applications' decoding beside the steps (the same work, on a
  // core the step may need: a worker given one core shares it): a round's
  // worth (closeRound, before this round's encode).
  void noteCodecRound();

  // ---- Closing and completing rounds (dts.cc) ----

  Status closeRound(int64_t t, train::FlatParameters& flat);

  // A round's own update, base - x, and the next round's start. The update
  // plus the residual is computed in base_'s own storage (a model-sized
  // tensor less at every close), checked, encoded, and base_ becomes x
  // plus the new residual (x without error feedback). Reads `x` and the
  // codec, writes base_ only: safe beside the training thread's forward and
  // backward passes. On failure base_ is as it was, as far as it can be.
  struct EncodeResult {
    std::shared_ptr<const std::vector<std::byte>> bytes;
    std::string diverged;  // this worker's own update is not finite: why
    std::string error;     // the codec's exception, if it threw
    double seconds = 0;    // its time, when run beside a step
  };
  EncodeResult encodeRound(uint64_t round, const torch::Tensor& x);

  // Takes up the round being encoded beside a step, waiting for it if need
  // be, and sends it (sendEncoded); first returns a failure settleOrKeep()
  // kept. Does nothing without a round being encoded; on the training
  // thread only.
  Status settleEncoding();

  // The round closed last, once encoded, leaves for every peer present.
  // What the training thread spent on it (the close's own part, and any
  // wait for the encoding) counts as encoding.
  Status sendEncoded(EncodeResult r);

  // settleEncoding() where no Status can be returned (jobModel(),
  // saveState()): a failure is kept for the next step to return.
  void settleOrKeep() {
    if (Status s = settleEncoding(); !s.ok() && settleError_.ok()) settleError_ = std::move(s);
  }

  // K = 1, D = 0 with the identity codec (exact()): q̄ = Σ (w_i / W) q_i in
  // rank order, every contribution decoded before the sum, as allreduce
  // averages: the two agree bit for bit
  // (Dts.K1D0IdentityEqualsAllreduceBitwiseReplicas). Sets lags and the
  // total weight W of the contributions used, as complete() does.
  torch::Tensor exactMean(Pending& p, int64_t t, const train::FlatParameters& flat,
                          std::vector<double>& lags, double& total);

  // `deferred` (null: the round must complete now, as at the end): set, and
  // nothing completed, when the wait shows the round is not due yet after
  // all -- before the first lag reports, a round seen crossing while we wait
  // raises D (learnTheLink), and the first rounds of a job cross a fresh
  // connection in TCP's slow start (several round trips; 0.5-0.8 s on the
  // world links, which every worker spent waiting at its first due step).
  Status complete(Pending& p, int64_t t, train::FlatParameters& flat, bool* deferred = nullptr);

  // What every completion ends with, once the model holds the round: the
  // round's figures, its bytes kept for a peer that may still need them,
  // the inbox's stale rounds dropped, the lags reported and the schedule
  // reconsidered.
  Status completed(Pending& p, std::vector<double> lags);

  // While a round waited for at its due step (since t0) shows the links
  // longer than D assumed (learnTheLink), the round is due later: the
  // wait ends, counted, with *deferred set (null: it must complete now).
  bool deferUntilDue(const Pending& p, int64_t t, geo::Clock::TimePoint t0, bool* deferred);

  // ---- Reduce-scatter (sync.exchange; docs/algorithms.md, "Reduce-scatter";
  // dts_reduce_scatter.cc) ----
  //
  // The model is cut in N shards (FlatCodec::shardBounds), shard s owned by
  // the group's member s. A round's contribution leaves as N - 1 shards,
  // each to its owner, cut from the round's one encoding (so each value is
  // quantized exactly as under all-gather); an owner averages its shard
  // over the round's contributions (reduceOwn) and sends the mean, encoded
  // again, to every other worker; each worker replaces its own
  // contribution by the means a shard at a time (completeSharded). Each
  // uplink carries 2 (N - 1) / N payloads a round instead of N - 1, over
  // two hops instead of one. Every worker applies the same bytes of each
  // shard's mean, so the replicas stay equal even where an owner left a
  // contribution out (that worker's progress of the round is lost: its own
  // contribution is replaced by a mean without it, as everyone's is).
  // An owner lost for a round (suspected, finished, or not expected in it:
  // rejoining) has its shard averaged by every worker itself: a worker
  // that sees one sends its part of that shard to every peer but the
  // owner (lostShards, sendParts), and its other parts to their owners as
  // before. Each uplink then carries about 3 (N - 2) / N payloads a round
  // where whole contributions to every peer took N - 1 (15 at sixteen
  // regions, for as long as a joiner's state takes to cross), and no
  // worker need be chosen to stand in for the owner.

  // A change of exchange `e` heard after this worker closed rounds it
  // names (sync.exchange: auto; the coordinator announces it two rounds
  // further ahead than a change of K, so this is rare): each such round
  // goes the way the others exchange it. To all-gather: its whole
  // contribution to every peer as well (the shards already sent are
  // dropped with the round's stale data). To reduce-scatter: it counts as
  // sent whole (an owner takes its part from the whole), and this worker
  // owns its shard -- unless a contribution of it was applied early (or
  // is being decoded for that): the round then completes as all-gather
  // here, and its owners wait for this worker's mean until the round's
  // time-out (logged; state parity repairs what differs).
  void reexchange(const Schedule& e);

  // The values [lo, hi) of shard s.
  std::pair<int64_t, int64_t> shard(size_t s) const { return {shards_[s], shards_[s + 1]}; }

  // Whether member s owns its shard of `round`: it takes part in the round
  // (Membership::takesPart) and has not finished before it.
  bool owns(size_t s, uint64_t round) const {
    if (finishedAt_[s] && round >= *finishedAt_[s]) return false;
    return membership_.takesPart(group_.ranks[s], round);
  }

  // How long a worker that lost an owner waits for the peers' parts of
  // its shard it asked for with its own (exchangeShards): two of the
  // longest ping round trips measured (its part's way there, theirs back,
  // with room for a busy peer), the two parts' time through uplinks that
  // carry one to every other peer (at the rate the uplink was measured
  // at: uplink_.rate()), and 250 ms; at most the longest peer time-out
  // (Membership::peerTimeout), which is also the wait before any round
  // trip is measured. Its model differs from the others' on that shard
  // whatever it waits for, and while it waits every worker waits for its
  // next round: with the peer time-out, a cut between tokyo and sydney
  // cost each worker 5.3 s where this costs them 2.7-2.9 s. Without the
  // parts' time, a 20M-parameter mlp's survivor that lost the owner first
  // gave up 0.43 s later, before the others' answers (2.5 MB each way at
  // 100 Mbit/s) came, and its model was repaired at the next check.
  std::chrono::milliseconds lostOwnerWait(const Pending& p) const;
  // Starts `p`'s wait for the lost owners' parts (lostOwnerWait from now),
  // and once it is over, starts it again while a peer whose part is
  // missing is still delivering (at least a 64th of a part since the wait
  // was set): a large model's contribution takes seconds to cross (10 MB of
  // a 20M-parameter mlp, two of them whole up each 100 Mbit/s uplink: 1.6
  // s), and the workers that gave up on one after 0.5-0.7 s each averaged the
  // lost owner's shard from a different set of contributions -- the
  // replicas 0.015-0.02 of their norm apart, and state parity's repairs
  // (the whole model, to each) then held the job 8-17 s on the namespace
  // network. Never past `deadline` (the round's time-out).
  void holdLostOwnerWait(Pending& p, geo::Clock::TimePoint deadline);

  // The shards of `p`'s round whose owners are lost here: another
  // member's shard with values whose mean has not come and whose owner
  // does not own it (owns(): suspected, finished or joining).
  std::vector<size_t> lostShards(const Pending& p) const;
  bool ownerLost(const Pending& p) const { return !lostShards(p).empty(); }

  // `p`'s contribution to `to`: whole (all-gather), or each peer's shard
  // of it and, to every peer but the owner, its part of each shard whose
  // owner is lost (sendParts). `count`: the round's first sending (the
  // byte counters count it).
  Status sendContribution(Pending& p, const std::vector<uint32_t>& to, bool count);

  // This worker's shard's mean of `p` to `to`, once made.
  Status sendOwnReduced(const Pending& p, const std::vector<uint32_t>& to);

  // This worker's part of the exchange of every round in flight: its
  // shard's mean once every contribution to it awaited is in, its part of
  // a lost owner's shard to every peer but that owner, and to each peer
  // that sent it its part of a shard, the same part of this worker's
  // (takeParts). A peer sends its part where it lost an owner that this
  // worker still has (a link cut between the two alone, a partial
  // partition): it needs this worker's part of that owner's shard, which
  // went to the owner only.
  // Without the answer it waited for it until this worker's later rounds
  // moved its expectations on, and those never came where this worker
  // waited for the peer's next round: all sixteen workers of world16
  // stalled until an 8 s cut between tokyo and sydney healed.
  Status exchangeShards();

  // A peer's part of shard [lo, hi) of `p`, decoded into `out` and checked:
  // its shard (this worker's), its part of a lost owner's shard, or the
  // shard cut from its whole contribution.
  Status peerShard(const Pending& p, size_t j, int64_t lo, torch::Tensor& out, std::string& reason);
  // Values [lo, lo + out.numel()) cut from a whole contribution's bytes,
  // decoded into `out` and checked (a size that does not fit: "size").
  Status wholeRange(std::span<const std::byte> whole, int64_t lo, torch::Tensor& out,
                    std::string& reason);
  // mean = Σ (w_j / W) q_j over the parts defined in `q` (by group index),
  // in rank order from zero: the arithmetic every replica of a shard's
  // mean shares (shardMean, catchUpSharded), so the same parts give the
  // same bits. False, `mean` untouched, where none is defined.
  bool weightedMean(const std::vector<torch::Tensor>& q, torch::Tensor& mean) const;

  // The mean of values [lo, hi) of `p` over this worker's contribution and
  // the peers' in `from` (group indices whose part is in), into `mean`:
  // Σ (w_j / W) q_j in rank order from zero, every part decoded and checked
  // first (a refused one is left out) -- exactMean()'s operations. Returns
  // which were used.
  std::vector<bool> shardMean(const Pending& p, const std::vector<size_t>& from, int64_t lo,
                              torch::Tensor& mean, const char* what);

  // This worker's shard's mean of `p`, once every contribution awaited is
  // in: made (shardMean), encoded in the round's codec with a stream of its
  // own, kept, and sent to every peer present. A part that comes after is
  // dropped with the round's stale data.
  Status reduceOwn(Pending& p);

  // Whether shard s of `p` can be applied: its mean came from its owner
  // (this worker's: made) or relayed, or its owner is lost and the part of
  // it of every peer that takes part in the round came (Pending::hasPart),
  // or lostOwnerWait(p) has passed since the owner was found lost (the
  // shard is then averaged from those that came; state parity repairs the
  // difference). Takes part (owns), not awaited(): a peer sends its part
  // of a round's lost shard when it loses the owner, after its
  // contributions to later rounds, whose arrival moves what is awaited of
  // it past this round. Judged by awaited(), the first survivor to lose
  // sixteen regions' dead owner averaged its shard of the round in flight
  // 9 ms later from 2 of 14 parts, and 13 of the 15 survivors, each from
  // another set, were repaired by state parity.
  bool shardReady(const Pending& p, size_t s) const;

  // complete() of a round exchanged by reduce-scatter: waits (bounded, as
  // complete() does) until every shard can be applied, then replaces this
  // worker's contribution by each shard's mean: x += q_i[s] - q̄[s] (K = 1,
  // D = 0 with the identity codec: x[s] = start[s] - q̄[s], as exactMean()).
  // A peer silent past the time-out is given up (as complete() does): an
  // owner's shard is then averaged here from the whole contributions that
  // came, this worker's own at least.
  Status completeSharded(Pending& p, int64_t t, train::FlatParameters& flat, bool* deferred);

  // ---- The automatic delay (dts_schedule.cc) ----

  // D = auto before anything is known of the links: the first ping round
  // trips, once every peer expected has answered one, give D (chooseDelay,
  // linkBeforeReports), and the rounds closed meanwhile become due D
  // steps after they closed (or at once, where that has passed).
  void learnTheLink();

  // Whether the lag reports have measured the link to every peer expected
  // (LinkLedger; a suspected peer is not expected). Until then a round seen
  // crossing can raise D (learnTheLink, every step).
  bool everyLinkMeasured() const;

  // Returns whether anything is known of the links (linkKnown_).
  bool chooseDelay();

  // ---- State parity (state_parity.h; docs/membership.md, "State parity") ----
  //
  // Every kParityEvery rounds each worker sends its peers a fingerprint of
  // its job model (jobModel(): x0 - Σ q̄, the part of every worker's model
  // that the rounds make common) as of that round. A worker whose
  // fingerprint differs from the job's (parityVerdict: the model most
  // workers agree on) names itself in the log and repairs: it asks one of
  // the others for its job model as of a round it has not completed yet,
  // and when it has completed that round too adds the difference,
  // theirs - ours, to its model and its round start. What it trained
  // since (its own progress, its error feedback, its rounds in flight)
  // stays: only the common part is replaced. No restart, no pause.
  // StateParity runs the protocol; what it needs of this worker:

  std::optional<train::JobModel> parityJobModel() override { return jobModel(); }
  // A CPU worker's fingerprint goes a slice at a time (jobModelFingerprint).
  std::optional<ParityFingerprint> parityFingerprint() override {
    if (!base_.device().is_cpu()) return std::nullopt;
    return jobModelFingerprint(base_);
  }
  bool parityHasState() const override { return base_.defined(); }
  // The rounds of the last kLateWindow completed without someone, by round
  // and who was in (every worker keeps at least those in late_), hashed.
  // Two workers that differ there hold job models that differ by
  // contributions that may still arrive -- not a fault yet; a later round
  // compares them.
  uint64_t parityLateRounds(uint64_t round) const override;
  // It trains, it is heard and not joining (Membership::expected's other
  // conditions; its round condition follows the rounds the peer
  // delivered, later ones), and it has not finished before the round.
  bool parityReports(size_t i, uint64_t round) const override {
    return !(finishedAt_[i] && round >= *finishedAt_[i]) &&
           membership_.expected(group_.ranks[i], ~uint64_t{0});
  }
  uint64_t parityNextRound() const override { return nextRound_; }
  void parityRepair(const torch::Tensor& delta, train::FlatParameters& flat) override;
  Status paritySend(const std::vector<uint32_t>& to, Control control, int64_t step,
                    std::shared_ptr<const std::vector<std::byte>> bytes) override {
    const uint64_t size = bytes->size();
    return sendTo(to, control, step, CodecId::kRaw, size, std::move(bytes));
  }
  Status paritySendModel(uint32_t peer, uint64_t round,
                         std::shared_ptr<const std::vector<std::byte>> bytes) override {
    if (!Membership::goesInParts(bytes->size())) {
      return paritySend({peer}, Control::kParityState, static_cast<int64_t>(round),
                        std::move(bytes));
    }
    membership_.sendInParts(peer, Control::kParityStatePart, static_cast<int64_t>(round),
                            std::move(bytes), fmt::format("our job model as of round {}", round));
    return {};
  }
  std::vector<transport::Message> parityTake(Control control, uint32_t peer) override {
    return takeArrived(control, peer);
  }
  std::vector<uint32_t> parityPeers() const override { return presentPeers(); }
  bool paritySuspected(uint32_t rank) const override { return membership_.suspected(rank); }
  std::vector<transport::PeerCounters> parityPeerCounters() const override {
    return transport_->peerCounters();
  }
  void parityReject(uint32_t peer, const std::string& what, const std::string& reason,
                    const Status& why) override {
    reject(peer, what, reason, why);
  }

  // A test's fault (GEO_TEST_FLIP_BIT=RANK:STEP:INDEX:BIT): flips bit BIT
  // of parameter INDEX of worker RANK's model at the first round boundary
  // at or after STEP, as memory that went bad would, and moves the round's
  // start by as much, so that it is not taken for progress of the round.
  // (Not set to the same value: under error feedback the start holds the
  // residual too, which setting it dropped, and the job model then moved by
  // the flip less the residual.)
  struct Flip {
    uint32_t rank = 0;
    int64_t step = 0;
    int64_t index = 0;
    int bit = 0;
  };
  static std::optional<Flip> flipFromEnvironment();
  std::optional<Flip> flip_;
  void injectFlip(int64_t t, train::FlatParameters& flat);

  // A round completed without some contributions: its mean and the weight
  // it covers, for contributions that arrive later.
  struct Late {
    uint64_t round = 0;
    torch::Tensor mean;
    double weight = 0;
    std::vector<bool> had;  // by group index: in the mean already
  };

  bool auto_;
  int64_t delay_;
  int64_t loggedDelay_;
  std::deque<Late> late_;
  // By group index: the rounds a peer that has finished training closed
  // (it sends no contribution to a later one); nullopt while it trains.
  std::vector<std::optional<uint64_t>> finishedAt_ =
      std::vector<std::optional<uint64_t>>(group_.size());
  // D = auto: this worker's part of the rounds it completed last (at most
  // lateWindow()). The workers' delays differ, so a round this worker has
  // completed may still be due at a peer; a checkpoint keeps these, and a
  // resume sends them again with the rounds in flight.
  struct Sent {
    uint64_t round = 0;
    int64_t sendStep = 0;
    std::shared_ptr<const std::vector<std::byte>> bytes;
  };
  std::deque<Sent> sent_;
  // The last kAnswerable reduce-scatter rounds completed here: a peer that
  // lost an owner this worker still had may ask for its part of that
  // owner's shard, or the owner's mean, (by sending its own part) after
  // the round completed here (exchangeShards). Not checkpointed. Each
  // holds this worker's contribution and the shards' means: two encoded
  // payloads (docs/algorithms.md, "Memory").
  static constexpr size_t kAnswerable = 4;
  std::deque<Answerable> answerable_;
  // This worker's part of shard s of round (round, sendStep), cut from
  // its contribution's `bytes`, to each peer of `to` it has not gone to
  // (partTo, updated), the owner s and this worker left out: one
  // MessageKind::kPart, counted in the byte statistics.
  Status sendParts(uint64_t round, int64_t sendStep, const std::vector<std::byte>& bytes,
                   std::vector<std::vector<bool>>& partTo, size_t s,
                   const std::vector<uint32_t>& to);
  // A part (MessageKind::kPart) or a relayed mean (kRelayed) from group
  // member j to `round`: which shard it is of; nullopt (refused as `what`,
  // logged, counted) where its bounds are no shard here but the sender's
  // and this worker's, or it is too short to hold them. Only those read
  // so are kept (takeParts, takeRelayed).
  std::optional<size_t> readBounds(size_t j, uint64_t round, const Message& m, const char* what);
  // A kept part's or relayed mean's values in the round's codec (after
  // its bounds).
  static std::span<const std::byte> partValues(const Message& m);
  // A held mean's values (heldMean): the owner's payload, or a relayed
  // one's after its bounds.
  static std::span<const std::byte> meanValues(const Message& m);
  // The mean of shard s that `a` holds (heldMean) to group member j, once
  // (Answerable::meanTo), as MessageKind::kRelayed: j lost the owner
  // before its mean came, and sent its part of the shard (takeParts).
  Status relayMean(Answerable& a, size_t s, size_t j);
  // Takes every mean that group member j relayed for `p`'s round from the
  // inbox, and keeps each of a shard whose mean is not here yet
  // (Answerable::relayedIn): shardReady() then takes it as the owner's.
  void takeRelayed(size_t j, Pending& p);
  // Whether this worker's part of shard s went to peer j (partTo as
  // sendParts keeps it).
  static bool partSent(const std::vector<std::vector<bool>>& partTo, size_t j, size_t s) {
    return j < partTo.size() && s < partTo[j].size() && partTo[j][s];
  }
  // Marks shard s as gone to peer j in `to` (Answerable::partTo or
  // meanTo, by peer then shard): false where it had gone already.
  bool markSent(std::vector<std::vector<bool>>& to, size_t j, size_t s) const {
    if (partSent(to, j, s)) return false;
    to.resize(std::max(to.size(), group_.size()));
    to[j].resize(std::max(to[j].size(), group_.size()), false);
    to[j][s] = true;
    return true;
  }
  // Takes every part (MessageKind::kPart) of `a`'s round that group
  // member j sent from the inbox, and answers each once: with the owner's
  // mean of that shard where this worker holds it (relayMean), else with
  // this worker's own part of it (sendParts; a.bytes null: no answer).
  // The peer lost that owner; the parts it needs went to the owner only,
  // and where the owner's mean reached this worker before its death, the
  // peer applies those bytes as this worker does instead of a mean of the
  // parts that differs from them (and that state parity would repair).
  // Kept in `into` ([sender][shard]) where given.
  Status takeParts(size_t j, Answerable& a, std::vector<std::vector<std::optional<Message>>>* into);
  // sync.exchange: auto (the schedule says which exchange is in force;
  // sharded()), and the reduce-scatter shards' bounds (group member s owns
  // [shards_[s], shards_[s + 1])).
  const bool autoExchange_ = options_.exchange == "auto";
  std::vector<int64_t> shards_;

  // x at the round's start plus the corrections applied since, plus (error
  // feedback) what quantization has yet to send
  torch::Tensor base_;
  std::deque<Pending> pending_;
  uint64_t nextRound_ = 0;
  bool resend_ = false;
  // By group index, what serveAndResend knows of our connections to each
  // peer (madeAnew).
  struct Connection {
    uint64_t reconnectsSeen = 0;  // PeerCounters::reconnects when last looked at
    // Made anew since the peer was last suspected or asked to join.
    bool madeAnewSince = false;
    // Made anew while we waited to hear the peer resume
    // (Membership::awaitingResume): our rounds of sent_ go once it
    // resumes (the same process, back from a partition), not if it asks
    // to join (a restarted process, whose state holds them).
    bool resendOnResume = false;
    // A restart answered before its new connection was seen: that
    // connection, when it comes, is sent nothing again.
    bool absorbNext = false;
  };
  std::vector<Connection> connections_ = std::vector<Connection>(group_.size());
  Schedule schedule_;                     // the period in force
  std::optional<Schedule> nextSchedule_;  // agreed, from a later round
  int64_t closeAt_;                       // the step at which the open round closes
  uint64_t roundsSinceChange_ = 0;
  bool finishing_ = false;
  // Auto delay and period: each peer's link, from both ends' lags of the
  // same rounds, its ping round trips, and the rounds seen crossing.
  LinkLedger links_{group_.size(), {.samples = kLagWindow}};
  // Each peer's pace as of its latest lag report (the round it closes
  // next, the shortest its rounds may last, its lead(), when the report
  // arrived, the round it reported complete): recorded whatever the
  // schedule, for the automatic period and for a joiner's catchUp, which
  // reads from them where its peers are.
  struct Pace {
    uint64_t nextRound = 0;
    double roundSeconds = 0;  // the shortest its rounds may last (fastestRoundSeconds)
    int64_t lead = 0;
    geo::Clock::TimePoint at;
    // The round whose completion it reported (kNoRound: a schedule only).
    uint64_t completed = kNoRound;
  };
  std::vector<std::optional<Pace>> paces_ = std::vector<std::optional<Pace>>(group_.size());
  double stepSeconds_ = 0;  // a step's time, waits for peers excluded (moving average)
  // The round closed last while its encoding runs beside the next step
  // (closeRound, settleEncoding): the result comes from `result` (invalid
  // while it is encoded on the training thread).
  struct Encoding {
    uint64_t round = 0;
    int64_t t = 0;                          // its close's step
    train::FlatParameters* flat = nullptr;  // the trainer's, unchanged until afterBackward
    double onThreadSeconds = 0;             // the training thread's part so far
    std::future<EncodeResult> result;
  };
  std::optional<Encoding> encoding_;
  // GEO_SYNC_ENCODE_BESIDE=0 in the environment encodes every round on the
  // training thread (for measurements: what the overlap saves).
  const bool encodeBeside_ = [] {
    const char* v = std::getenv("GEO_SYNC_ENCODE_BESIDE");
    return v == nullptr || std::string_view(v) != "0";
  }();
  // The early application being decoded beside the steps (applyEarly), and
  // GEO_SYNC_DECODE_BESIDE=0, which decodes it on the training thread (for
  // measurements, as above).
  std::optional<std::future<EarlyResult>> earlyWork_;
  const bool decodeBeside_ = [] {
    const char* v = std::getenv("GEO_SYNC_DECODE_BESIDE");
    return v == nullptr || std::string_view(v) != "0";
  }();
  Status settleError_;  // a settleEncoding() failure where none could be returned
  // The encodings run beside a step: their time, and the training
  // thread's waits for them (logged at the end).
  struct BesideTimes {
    double seconds = 0, waited = 0;
    int64_t rounds = 0;
    void add(double s, double w) { seconds += s, waited += w, ++rounds; }
  } encodedBeside_, decodedBeside_;
  int64_t completedAsApplied_ = 0;  // rounds whose completion had nothing to decode (complete())
  // The codec's work on the training thread a round (moving average over
  // the intervals between closes: the decodes of the round's contributions,
  // and the close itself where it cannot run beside a step), which the
  // auto period keeps at most kCodecShare of a step; and the codec's total
  // at the last close (-1: none yet).
  double codecRoundSeconds_ = 0;
  double codecAtClose_ = -1;
  bool crossingBoundLogged_ = false;                 // choosePeriod's debug line, once a job
  double waitedSince_ = 0;                           // seconds waited for peers since the last step
  std::optional<geo::Clock::TimePoint> lastStepAt_;  // the latest afterStep's start
  // The latest steps as lived, for the job's pace that the auto delay
  // counts in (jobPaceSeconds): when each ended (afterStep's start, seconds
  // on the clock) and what was waited since the one before; at most
  // paceWindow() of them.
  std::deque<PaceStep> paceSteps_;
  // The link the auto delay last covered (twice the slowest under
  // reduce-scatter; 0 before): a step's wait counts in the pace up to it.
  double coveredLinkSeconds_ = 0;
  // Four rounds of steps, at least 64 and at most 512: a round's wait at
  // its due step is one of the window's several, so the pace does not
  // swing as it comes and goes.
  size_t paceWindow() const {
    return static_cast<size_t>(std::clamp<int64_t>(4 * schedule_.k, 64, 512));
  }
  // The job's pace over the window (jobPaceSeconds), or 0 while it holds
  // fewer than kPaceMinSteps: from the first steps on, where a D counted in
  // the start's short steps (54 at 4 ms, world16 on two cores) made the
  // first rounds' contributions the oldest of the job.
  static constexpr size_t kPaceMinSteps = 8;
  double paceSeconds() const;
  // Each peer's latest rounds as they reached this worker (by group index;
  // kUpdate or kShard, wherever the round's is taken), over a window of
  // paceWindow() of its steps: its pace (peerPaceSeconds), which bounds
  // the steps D counts in (chooseDelay). A suspected peer's are cleared:
  // its pace after a rejoin starts afresh.
  std::vector<std::deque<PeerStamp>> peerStamps_;
  void notePeerRound(size_t peer, const Message& m);
  // The median pace among the expected peers not suspected (medianPace),
  // and whose it is (a group index); 0 while none has enough stamps.
  std::pair<double, size_t> peersPaceSeconds() const;
  int64_t jobStep_ = 0;  // the close of the last round completed: jobModel()'s step
  double lrScale_ = 1;   // the latest factor on the gradient (afterBackward)
  // The mean staleness of the peers' contributions to the last round
  // completed, in steps (0 before): what the step scale follows.
  double staleness_ = 0;
  // D = auto: a ping round trip or a link's lags have been measured, so
  // rounds are due D steps after they close (closeRound, learnTheLink).
  bool linkKnown_ = false;
  // The rounds' pace and the uplink's (awaitUplink, roundSeconds(), the
  // rate the final average paces its copies by): the latest round's bytes,
  // the intervals between recent rounds at the period in force.
  UplinkPace uplink_{kLagWindow};
  // When this worker's first round left (a round seen crossing is one
  // that left since: chooseDelay).
  std::optional<geo::Clock::TimePoint> firstRoundSentAt_;
  // When the latest round of this worker's went to the transport: while
  // part of what we sent a peer still waits in our own queue, that round
  // has been crossing at least since (chooseDelay).
  std::optional<geo::Clock::TimePoint> lastRoundSentAt_;
  ScratchTensors scratch_;
  std::array<torch::Tensor, 4> slices_;  // sliceBuffer()'s
  StageTimes stages_;
  // State parity's protocol (state_parity.h), on this worker's job model.
  StateParity parity_{*this, group_, topology_, stats_};
};

}  // namespace geo::sync::detail
