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
// the latest maxAutoDelay steps after it.

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
namespace {

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
  Dts(const SyncOptions& o, const Topology& t, transport::Transport* tr, Group g)
      : Base(o, t, tr, std::move(g), o.period),
        auto_(!o.delay.has_value()),
        delay_(o.delay.value_or(o.period)),
        loggedDelay_(delay_),
        schedule_{0, 0, o.period, fixedExchange(o)},
        closeAt_(o.period) {
    stats_.setDelay(delay_);
    stats_.setPeriod(schedule_.k);
    stats_.setReduceScatter(sharded());
    membership_.setRoundOf([this](int64_t s) { return roundAt(s); });
    // A round stays open until it completes, D steps after it closes: a
    // worker that asks to join meanwhile may still contribute to it.
    membership_.setOpenRound(
        [this] { return pending_.empty() ? nextRound_ : pending_.front().round; });
    // A peer heard again after a partition says from which round it sends
    // (internal.h): its contributions delayed through the cut by TCP say
    // nothing of the rounds it completed without us meanwhile.
    membership_.setResumeAnnounced(true);
    flip_ = flipFromEnvironment();
  }

  std::string describe() const override {
    return fmt::format("dts among {} workers: period K = {}, delay D = {}, codec {}{}",
                       group_.size(),
                       options_.autoPeriod ? fmt::format("auto (from {})", schedule_.k)
                                           : std::to_string(schedule_.k),
                       auto_ ? std::string("auto") : std::to_string(delay_), options_.codec.name,
                       autoExchange_ ? ", exchange auto (from allgather)"
                       : sharded()   ? ", exchange reducescatter"
                                     : "");
  }

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
  Status afterBackward(int64_t step, train::FlatParameters& flat) override {
    (void)step;
    if (group_.size() <= 1) return {};
    // The last round's encoding, beside this step so far, ends before the
    // optimizer changes the parameters it was closed at.
    GEO_RETURN_IF_ERROR(settleEncoding());
    init(flat);
    const double scale = options_.scaleLrWithDelay ? delayLrScale(staleness_) : 1.0;
    if (scale != lrScale_) {
      logger()->log(scale != 1.0 && lrScale_ == 1.0 ? spdlog::level::info : spdlog::level::debug,
                    "dts: the gradient is scaled by {:.3g}: the peers' updates were {:.1f} steps "
                    "old when applied (D = {}; sync.scaleLrWithDelay)",
                    scale, staleness_, delay_);
      lrScale_ = scale;
      stats_.setLrScale(scale);
    }
    if (scale != 1.0) flat.grads.mul_(static_cast<float>(scale));
    return {};
  }

  Status afterStep(int64_t step, train::FlatParameters& flat) override {
    modified_ = false;
    if (group_.size() <= 1) return {};
    GEO_RETURN_IF_ERROR(std::exchange(settleError_, Status()));
    if (encoding_) {
      // The parameters have changed since the round closed: base_ cannot
      // become x + residual any more (the trainer calls afterBackward every
      // step; a caller that does not breaks the contract).
      return internalError(fmt::format(
          "dts: step {} ended while round {} was still being encoded: afterBackward must come "
          "between a step's backward pass and its optimizer step",
          step + 1, encoding_->round));
    }
    init(flat);
    const int64_t t = step + 1;
    const auto now = clock().now();
    if (lastStepAt_) {
      // From one step's end to the next: what passes per step while a round
      // is in flight, this synchronizer's own work (encoding, decoding,
      // applying) included. A wait for peers is not a longer step: the
      // waits are those of the previous call, inside this interval.
      const double seconds =
          std::max(0.0, std::chrono::duration<double>(now - *lastStepAt_).count() - waitedSince_);
      stepSeconds_ = stepSeconds_ <= 0 ? seconds : 0.9 * stepSeconds_ + 0.1 * seconds;
      stats_.setStepSeconds(stepSeconds_);
    }
    lastStepAt_ = now;
    waitedSince_ = 0;
    stages_.start(flat.values);
    if (resend_) GEO_RETURN_IF_ERROR(resendPending());
    stages_.lap(StageTimes::kResend);
    GEO_RETURN_IF_ERROR(serveAndResend(t, flat));
    stages_.lap(StageTimes::kServe);
    GEO_RETURN_IF_ERROR(pollArrivals());
    stages_.lap(StageTimes::kArrivals);
    applyEarly(t, flat);
    stages_.lap(StageTimes::kEarly);
    if (measuring()) takeLagReports(t);
    applyLate(t, flat);
    stages_.lap(StageTimes::kLate);
    GEO_RETURN_IF_ERROR(parity_.poll(flat));
    stages_.lap(StageTimes::kParity);
    if (t >= closeAt_) GEO_RETURN_IF_ERROR(closeRound(t, flat));
    stages_.lap(StageTimes::kClose);
    // Until the first lag reports measure the links, every step: a round
    // still crossing shows there (chooseDelay) long before they come.
    if (auto_ && !everyLinkMeasured()) learnTheLink();
    stages_.lap(StageTimes::kLink);
    // A round completes at the close's step (due now, or given its due
    // step since by learnTheLink): the round being encoded is taken up
    // first (a completion corrects base_, which holds base - x while the
    // round is encoded, and its parity check reads every round in flight).
    if (encoding_ && !pending_.empty() && pending_.front().dueStep <= t) {
      GEO_RETURN_IF_ERROR(settleEncoding());
    }
    while (!pending_.empty() && pending_.front().dueStep <= t) {
      bool deferred = false;
      GEO_RETURN_IF_ERROR(complete(pending_.front(), t, flat, &deferred));
      if (deferred) break;
      const uint64_t round = pending_.front().round;
      recycle(pending_.front());
      pending_.pop_front();
      stages_.lap(StageTimes::kComplete);
      GEO_RETURN_IF_ERROR(parity_.afterCompleted(round, finishing_));
      stages_.lap(StageTimes::kParity);
    }
    stages_.lap(StageTimes::kComplete);
    return {};
  }

  StatusOr<train::JoinResult> join(int64_t step, train::FlatParameters& flat) override {
    if (group_.size() <= 1) return train::JoinResult{step, false};
    GEO_RETURN_IF_ERROR(settleEncoding());
    init(flat);
    auto joined = membership_.join(step, schedule_.k, flat.values, &flat);
    if (!joined.ok()) return joined.status();
    if (joined->jobFinished) {
      return train::JoinResult{joined->finalModel ? joined->step : step, true, joined->finalModel};
    }
    if (joined->transferred) {
      // Our rounds in flight (from a checkpoint) are void: the peers have
      // completed them long ago. Start the next round from the new model.
      earlyWork_.reset();        // waits for its task (std::async's future)
      base_.copy_(flat.values);  // and no residual
      jobStep_ = joined->step;
      pending_.clear();
      late_.clear();
      sent_.clear();
      links_.forgetRounds();
      resend_ = false;
      if (scheduling()) awaitSchedule(joined->step);
      nextRound_ = roundAt(joined->step);
      closeAt_ = closeOf(nextRound_);
      parity_.reset(nextRound_);
    }
    // A worker resumed from its checkpoint sends its rounds in flight again,
    // and those it completed last (a peer with a larger D may still wait for
    // them): it contributes from the oldest of them.
    uint64_t first = pending_.empty() ? nextRound_ : pending_.front().round;
    if (!sent_.empty()) first = std::min(first, sent_.front().round);
    GEO_RETURN_IF_ERROR(membership_.announce(first, joined->step));
    return train::JoinResult{joined->step, false};
  }

  Status finish(int64_t steps, train::FlatParameters& flat) override {
    if (group_.size() <= 1) return {};
    GEO_RETURN_IF_ERROR(settleEncoding());
    init(flat);
    finishing_ = true;  // no more changes of period: no more rounds
    logger()->info("dts: time in the synchronizer after a step, {}", stages_.describe());
    if (encodedBeside_.rounds > 0) {
      logger()->info(
          "dts: {} rounds encoded beside the next step, {:.1f} ms each, of which the training "
          "thread waited {:.1f} ms",
          encodedBeside_.rounds, 1e3 * encodedBeside_.seconds / encodedBeside_.rounds,
          1e3 * encodedBeside_.waited / encodedBeside_.rounds);
    }
    if (decodedBeside_.rounds > 0 || completedAsApplied_ > 0) {
      logger()->info(
          "dts: {} early applications decoded beside the steps, {:.1f} ms each, of which the "
          "training thread waited {:.1f} ms; {} rounds completed with every contribution applied "
          "early (nothing decoded again)",
          decodedBeside_.rounds,
          1e3 * decodedBeside_.seconds / std::max<int64_t>(1, decodedBeside_.rounds),
          1e3 * decodedBeside_.waited / std::max<int64_t>(1, decodedBeside_.rounds),
          completedAsApplied_);
    }
    membership_.setFinishing();
    // Our peers may number their last rounds differently (a change of
    // period heard late, a round closed on the new grid): they must not
    // wait for a round of ours that will never come.
    GEO_RETURN_IF_ERROR(sendFinished(presentPeers()));
    while (!pending_.empty()) {
      GEO_RETURN_IF_ERROR(complete(pending_.front(), steps, flat));
      recycle(pending_.front());
      pending_.pop_front();
    }
    // The final average needs the memory more: with every round complete,
    // the round's start (and in it the residual: what quantization has yet
    // to send, which the average of the models supersedes), the means kept
    // for late contributions and the scratch are done with -- one or more
    // model-sized tensors at the end's peak (docs/algorithms.md, "Memory").
    // jobModel() and saveState() have nothing to give from here on: the
    // model is the job's once the average is in.
    scratch_.clear();
    slices_ = {};
    late_.clear();
    base_ = torch::Tensor();
    return averageModels(flat, steps);
  }

  // The model every worker agrees on as of the last round completed,
  // x0 - Σ q̄ over the completed rounds. It needs no state of its own: a
  // close moves base_ (the round's start plus the residual) by -own, a
  // completion by own - q̄, and an early application by w_j (own - q_j); so
  // base_ + each round in flight's own contribution less what of it was
  // corrected early, (1 - Σ_early w_j) own + Σ_early w_j q_j, is exactly it.
  // With an identity codec it is the mean of the workers' models at that
  // round's close (Dts.TheJobModelIsTheMeanAtTheLastCompletedRound).
  std::optional<train::JobModel> jobModel() override {
    settleOrKeep();
    if (group_.size() <= 1 || !base_.defined()) return std::nullopt;
    torch::NoGradGuard noGrad;
    torch::Tensor a = torch::empty_like(base_);
    const std::vector<int64_t> bounds = sliceBounds(a);
    for (size_t k = 0; k + 1 < bounds.size(); ++k) {
      torch::Tensor part = a.narrow(0, bounds[k], bounds[k + 1] - bounds[k]);
      jobModelInto(bounds[k], part);
    }
    return train::JobModel{jobStep_, std::move(a)};
  }

  // The job model's values [lo, lo + out.numel()) into `out`: the same
  // operations on each value as a whole jobModel() (which is made of
  // these), using slice buffers 0 and 1.
  void jobModelInto(int64_t lo, torch::Tensor& out) {
    const int64_t n = out.numel();
    out.copy_(base_.narrow(0, lo, n));
    for (const Pending& p : pending_) {
      codec_->decodeAccumulateRange(*p.bytes, static_cast<float>(1.0 - p.earlyWeight), lo, out);
      if (!p.anyEarly()) continue;
      torch::Tensor sum = sliceBuffer(0, n, out);
      torch::Tensor q = sliceBuffer(1, n, out);
      earlySumInto(p, lo, sum, q);
      out.add_(sum);
    }
  }

  // tensorFingerprint() of the job model, made a slice at a time on a CPU
  // worker: a parity check every kParityEvery rounds held a whole job model
  // (docs/algorithms.md, "Memory"). The same fingerprint to the bit.
  ParityFingerprint jobModelFingerprint(const torch::Tensor& like) {
    FingerprintSums sums;
    const std::vector<int64_t> bounds = sliceBounds(like);
    for (size_t k = 0; k + 1 < bounds.size(); ++k) {
      torch::Tensor part = sliceBuffer(2, bounds[k + 1] - bounds[k], like);
      jobModelInto(bounds[k], part);
      sums.add(part.data_ptr<float>(), static_cast<size_t>(part.numel()));
    }
    return sums.fingerprint();
  }

  // The checkpoint's format is dts_state.h's; here what goes in and comes
  // out of it.
  void saveState(torch::serialize::OutputArchive& archive) override {
    settleOrKeep();
    if (!base_.defined()) return;
    DtsState s;
    s.base = base_;
    s.jobStep = jobStep_;
    s.nextRound = nextRound_;
    s.delay = delay_;
    s.schedule = schedule_;
    s.nextSchedule = nextSchedule_;
    for (const Sent& x : sent_) s.sent.push_back({x.round, x.sendStep, x.bytes});
    for (const Pending& p : pending_) {
      DtsSavedRound r;
      r.round = p.round;
      r.sendStep = p.sendStep;
      r.dueStep = p.dueStep;
      r.bytes = p.bytes;
      r.provisionalDue = p.provisionalDue;
      r.start = p.start;
      if (p.anyEarly()) {
        r.early = p.early;
        r.early.resize(group_.size(), false);
        r.earlySum = earlySumOf(p, base_);
        r.earlyWeight = p.earlyWeight;
      }
      s.pending.push_back(std::move(r));
    }
    writeDtsState(archive, s);
  }

  Status loadState(torch::serialize::InputArchive& archive) override {
    std::optional<DtsState> s = readDtsState(archive, group_.size());
    if (!s) return {};  // saved before the first step
    base_ = std::move(s->base);
    jobStep_ = s->jobStep;
    nextRound_ = s->nextRound;
    delay_ = s->delay;
    if (s->schedule) schedule_ = *s->schedule;
    nextSchedule_ = s->nextSchedule;
    // A fixed exchange is the configuration's, whatever an older
    // checkpoint (no exchange in its schedule) reads as.
    if (!autoExchange_) {
      schedule_.exchange = fixedExchange(options_);
      if (nextSchedule_) nextSchedule_->exchange = schedule_.exchange;
    }
    closeAt_ = closeOf(nextRound_);
    stats_.setPeriod(schedule_.k);
    stats_.setReduceScatter(sharded());
    sent_.clear();
    for (DtsSentRound& x : s->sent) sent_.push_back({x.round, x.sendStep, std::move(x.bytes)});
    pending_.clear();
    for (DtsSavedRound& r : s->pending) {
      Pending p;
      p.round = r.round;
      p.sendStep = r.sendStep;
      p.dueStep = r.dueStep;
      p.bytes = std::move(r.bytes);
      // A round closed before the links were known stays due once they
      // are (learnTheLink), not maxAutoDelay steps after its close: every
      // round after it would wait behind it.
      p.provisionalDue = r.provisionalDue;
      p.start = std::move(r.start);
      p.got.resize(group_.size());
      // Contributions applied before the checkpoint stay applied: they count
      // as arrived, and one sent again is not applied twice.
      if (!r.early.empty()) {
        p.early = std::move(r.early);
        p.inEarlySum = p.early;
        p.earlySum = std::move(r.earlySum);
        p.earlyWeight = r.earlyWeight;
      }
      p.sentAt = clock().now();
      pending_.push_back(std::move(p));
    }
    // The peers lost what was in flight when the job stopped: send our part
    // of every pending round, and of those completed last, again once the
    // transport runs.
    resend_ = !pending_.empty() || !sent_.empty();
    stats_.setDelay(delay_);
    return {};
  }

 private:
  struct Pending {
    uint64_t round = 0;
    int64_t sendStep = 0;
    int64_t dueStep = 0;
    bool provisionalDue = false;  // closed before the links were known (closeRound)
    // This worker's contribution as the others see it, decode(q_i), is
    // decoded from `bytes` where it is needed (decodeOwn) rather than kept:
    // a model-sized tensor per round in flight.
    torch::Tensor start;  // D = 0 with the identity codec: x at the round's start
    std::shared_ptr<const std::vector<std::byte>> bytes;
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
    // contribution in `got` serves too); the shards' means as their owners
    // sent them, by shard; this worker's own shard's mean, once made
    // (reduceOwn); whether this worker's whole contribution went to every
    // peer because an owner was lost for the round (ownerLost).
    bool sharded = false;
    // Its exchange changed to all-gather after its shards left
    // (reexchange): its whole contribution is still to go to every peer.
    bool owesWhole = false;
    std::vector<std::optional<Message>> shardIn;
    std::vector<std::optional<Message>> reducedIn;
    std::shared_ptr<const std::vector<std::byte>> ownReduced;
    bool sentWhole = false;
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
  torch::Tensor sliceBuffer(size_t k, int64_t n, const torch::Tensor& values) {
    torch::Tensor& b = slices_[k];
    if (!b.defined() || b.numel() < n || b.device() != values.device()) {
      b = torch::empty({std::max<int64_t>(n, 1)}, values.options());
    }
    return b.narrow(0, 0, n);
  }
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
  void earlySumInto(const Pending& p, int64_t lo, torch::Tensor& out, torch::Tensor& q) {
    out.zero_();
    if (p.earlySum.defined()) out.add_(p.earlySum.narrow(0, lo, out.numel()));
    for (size_t j = 0; j < group_.size(); ++j) {
      if (!p.appliedEarly(j) || p.summed(j) || !p.got[j]) continue;
      q.zero_();
      codec_->decodeAccumulateRange(p.got[j]->payload.bytes(), 1.0f, lo, q);
      out.add_(q, static_cast<float>(group_.weights[j]));
    }
  }
  // The same over the whole model (a checkpoint's copy of it).
  torch::Tensor earlySumOf(const Pending& p, const torch::Tensor& values) {
    torch::Tensor sum = torch::empty_like(values);
    const std::vector<int64_t> bounds = sliceBounds(values);
    for (size_t k = 0; k + 1 < bounds.size(); ++k) {
      const int64_t n = bounds[k + 1] - bounds[k];
      torch::Tensor part = sum.narrow(0, bounds[k], n);
      torch::Tensor q = sliceBuffer(0, n, values);
      earlySumInto(p, bounds[k], part, q);
    }
    return sum;
  }

  bool exact() const { return !auto_ && delay_ == 0 && codec_->id() == CodecId::kFp32; }

  void init(const train::FlatParameters& flat) {
    // A checkpoint's tensors come back on the device they were saved from:
    // a job resumed on another kind of node (a CPU checkpoint on a GPU
    // worker, or back) moves its state to where the model now is.
    if (base_.defined() && base_.device() != flat.values.device()) placeOn(flat.values.device());
    if (!base_.defined() || !codec_) {
      ensureCodec(flat);
      if (!base_.defined()) base_ = flat.values.clone();
    }
    if (shards_.empty()) shards_ = codec_->shardBounds(group_.size());
  }

  // Whether a close keeps what quantization did not send (in base_).
  bool errorFeedback() const { return options_.errorFeedback && codec_->id() != CodecId::kFp32; }

  // Moves every model-sized tensor of this synchronizer's state to `device`.
  void placeOn(const torch::Device& device) {
    const auto to = [&](torch::Tensor& t) {
      if (t.defined()) t = t.to(device);
    };
    to(base_);
    for (Pending& p : pending_) {
      to(p.start);
      to(p.earlySum);
    }
    for (Late& l : late_) to(l.mean);
    scratch_.clear();
  }

  // Whom a round's contribution goes to: every peer not suspected. (A
  // rejoining one gets it too: it may already count on this round, and it
  // drops the rounds it does not need.)
  std::vector<uint32_t> presentPeers() const {
    std::vector<uint32_t> to;
    for (size_t i = 0; i < group_.size(); ++i) {
      const uint32_t r = group_.ranks[i];
      if (i != group_.self && !membership_.suspected(r)) to.push_back(r);
    }
    return to;
  }

  // Serves joins; a peer heard again, one that heard us again and asked
  // for our resume, or one our connection to was made anew, gets our
  // rounds still in flight: our resume says it gets every one of them (we
  // did not send them while it was suspected, and what a replaced
  // connection held was lost).
  Status serveAndResend(int64_t t, const train::FlatParameters& flat) {
    auto served = membership_.serve(t, flat.values, false, &flat);
    if (!served.ok()) return served.status();
    std::vector<uint32_t> to = served->heardAgain;
    to.insert(to.end(), served->resumeAsked.begin(), served->resumeAsked.end());
    std::sort(to.begin(), to.end());
    to.erase(std::unique(to.begin(), to.end()), to.end());
    // A connection to a peer made anew while it stayed expected (its
    // listener re-made by a key rotation, ours replaced): what the old one
    // held is lost, and the peer completes our rounds without it -- those
    // it completed since take it late, within their late window (sent_);
    // otherwise its model would differ from the others' for good. A
    // contribution it has already is ignored.
    std::vector<uint32_t> reconnected;
    for (const auto& c : transport_->peerCounters()) {
      const auto i = group_.indexOf(c.peer);
      if (!i) continue;
      if (reconnectsSeen_.size() < group_.size()) reconnectsSeen_.resize(group_.size(), 0);
      if (c.reconnects <= reconnectsSeen_[*i]) continue;
      reconnectsSeen_[*i] = c.reconnects;
      if (!membership_.suspected(c.peer) && !std::binary_search(to.begin(), to.end(), c.peer)) {
        reconnected.push_back(c.peer);
      }
    }
    for (uint32_t peer : reconnected) {
      for (const Sent& s : sent_)
        GEO_RETURN_IF_ERROR(sendUpdate({peer}, s.round, s.sendStep, s.bytes));
    }
    to.insert(to.end(), reconnected.begin(), reconnected.end());
    for (uint32_t peer : to) {
      for (const Pending& p : pending_) {
        if (p.bytes == nullptr) continue;  // being encoded: it leaves once it is
        GEO_RETURN_IF_ERROR(sendUpdate({peer}, p.round, p.sendStep, p.bytes));
        GEO_RETURN_IF_ERROR(sendOwnReduced(p, {peer}));
      }
      if (finishing_) GEO_RETURN_IF_ERROR(sendFinished({peer}));
    }
    takeFinished();
    return {};
  }

  // After the last step, to a peer heard again (during the final average):
  // it must not wait for rounds of ours that will never come.
  Status peerHeardAgain(uint32_t peer) override {
    return finishing_ ? sendFinished({peer}) : Status();
  }

  // Tells `to` how many rounds this worker closed (Control::kDtsFinished).
  Status sendFinished(const std::vector<uint32_t>& to) {
    auto bytes = std::make_shared<std::vector<std::byte>>(sizeof nextRound_);
    std::memcpy(bytes->data(), &nextRound_, sizeof nextRound_);
    return sendTo(to, Control::kDtsFinished, jobStep_, CodecId::kRaw, sizeof nextRound_,
                  std::move(bytes));
  }

  // Peers that have taken their last step: they send no contribution to a
  // round at or after the one they name (Control::kDtsFinished).
  void takeFinished() {
    for (size_t i = 0; i < group_.size(); ++i) {
      if (i == group_.self) continue;
      for (auto m = receiveControl(*transport_, Control::kDtsFinished, group_.ranks[i],
                                   std::chrono::milliseconds(0));
           m.ok(); m = receiveControl(*transport_, Control::kDtsFinished, group_.ranks[i],
                                      std::chrono::milliseconds(0))) {
        uint64_t rounds = 0;
        if (m->payload.size() != sizeof rounds) continue;
        std::memcpy(&rounds, m->payload.data(), sizeof rounds);
        finishedAt_[i] = rounds;
      }
    }
  }

  double uplinkBytesPerSecond() const override { return uplink_.bytesPerSecond(); }

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
  void applyLate(int64_t t, train::FlatParameters& flat) {
    for (Late& l : late_) {
      for (size_t i = 0; i < group_.size(); ++i) {
        if (i == group_.self || l.had[i]) continue;
        auto m = transport_->receive(MessageKind::kUpdate, l.round, group_.ranks[i],
                                     std::chrono::milliseconds(0));
        if (!m.ok()) continue;
        l.had[i] = true;
        membership_.delivered(group_.ranks[i], l.round);
        torch::Tensor q = scratch_.take(flat.values);
        std::string reason;
        if (const Status ok = codec_->decodeChecked(m->payload.bytes(), q, reason); !ok.ok()) {
          reject(group_.ranks[i], fmt::format("the late update for round {}", l.round), reason, ok);
          stats_.late(false);
          scratch_.give(std::move(q));
          continue;
        }
        const double w = group_.weights[i];
        // q becomes the correction in place: (q - mean) * -w / (W + w).
        torch::Tensor& correction = q.sub_(l.mean).mul_(static_cast<float>(-w / (l.weight + w)));
        flat.values.add_(correction);
        base_.add_(correction);
        l.mean.add_(correction, -1.0);  // the mean now includes it
        scratch_.give(std::move(q));
        l.weight += w;
        modified_ = true;
        stats_.late(true);
        stats_.applied(t - static_cast<int64_t>(m->header.step));
        logger()->info("dts: applied the late update of {} for round {} ({} steps after sending)",
                       topology_.describe(group_.ranks[i]), l.round,
                       t - static_cast<int64_t>(m->header.step));
      }
    }
  }

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
  void discardStale() {
    uint64_t keepFrom = nextRound_;
    if (!pending_.empty()) keepFrom = std::min(keepFrom, pending_.front().round);
    if (!late_.empty()) keepFrom = std::min(keepFrom, late_.front().round);
    if (keepFrom == 0) return;
    std::vector<uint32_t> senders;
    std::vector<uint64_t> rounds;
    const size_t n = transport_->discard([&](const transport::FrameHeader& h) {
      const bool roundData = h.kind == MessageKind::kUpdate || h.kind == MessageKind::kShard ||
                             h.kind == MessageKind::kReduced;
      if (!roundData || h.round >= keepFrom) return false;
      senders.push_back(h.sender);
      rounds.push_back(h.round);
      return true;
    });
    // A peer that delivers, however late, is taking part again: waiting for
    // it from now on is how the skew between us closes (see membership.md).
    for (size_t k = 0; k < senders.size(); ++k) {
      if (group_.indexOf(senders[k])) membership_.delivered(senders[k], rounds[k]);
    }
    for (size_t i = 0; i < n; ++i) stats_.late(false);
    if (n > 0) {
      logger()->info("dts: dropped {} update(s) for rounds before {} that arrived too late", n,
                     keepFrom);
    }
  }

  // This worker's part of `round`, closed at `sendStep`.
  Status sendUpdate(const std::vector<uint32_t>& to, uint64_t round, int64_t sendStep,
                    std::shared_ptr<const std::vector<std::byte>> bytes) {
    return sendTo(to, MessageKind::kUpdate, round, sendStep, codec_->id(),
                  static_cast<uint64_t>(codec_->numel()), std::move(bytes));
  }

  Status resendPending() {
    resend_ = false;
    const auto to = presentPeers();
    for (const Sent& s : sent_) GEO_RETURN_IF_ERROR(sendUpdate(to, s.round, s.sendStep, s.bytes));
    for (const Pending& p : pending_) {
      GEO_RETURN_IF_ERROR(sendUpdate(to, p.round, p.sendStep, p.bytes));
    }
    return {};
  }

  // Takes whatever contributions of pending rounds have arrived, without
  // waiting (each carries the time it arrived).
  // Under reduce-scatter also the peers' parts of this worker's shard and
  // the shards' means, and it does its part of the exchange (exchangeShards).
  Status pollArrivals() {
    const auto take = [&](MessageKind kind, uint64_t round, size_t i,
                          std::optional<Message>& into) {
      if (i == group_.self || into) return;
      auto m = transport_->receive(kind, round, group_.ranks[i], std::chrono::milliseconds(0));
      if (!m.ok()) return;
      into = std::move(*m);
      membership_.delivered(group_.ranks[i], round);
    };
    for (Pending& p : pending_) {
      for (size_t i = 0; i < group_.size(); ++i) {
        take(MessageKind::kUpdate, p.round, i, p.got[i]);
        if (!p.sharded) continue;
        take(MessageKind::kShard, p.round, i, p.shardIn[i]);
        take(MessageKind::kReduced, p.round, i, p.reducedIn[i]);
      }
    }
    return exchangeShards();
  }

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
  void applyEarly(int64_t t, train::FlatParameters& flat) {
    if (!auto_) return;
    if (earlyWork_) {
      if (earlyWork_->wait_for(std::chrono::seconds(0)) != std::future_status::ready) return;
      takeEarly(t, flat);
    }
    std::vector<EarlyRound> arrivals;
    for (Pending& p : pending_) {
      // A shard's mean replaces the round's contributions a shard at a time
      // (completeSharded): nothing of them is applied early.
      if (p.start.defined() || p.sharded) continue;
      p.early.resize(group_.size(), false);
      p.undecodable.resize(group_.size(), false);
      EarlyRound e;
      e.round = p.round;
      e.own = p.bytes;
      for (size_t i = 0; i < group_.size(); ++i) {
        if (i == group_.self || !p.got[i] || p.early[i] || p.undecodable[i]) continue;
        e.who.push_back(i);
        e.payloads.push_back(p.got[i]->payload);
        e.weights.push_back(static_cast<float>(group_.weights[i]));
      }
      if (!e.who.empty()) arrivals.push_back(std::move(e));
    }
    if (arrivals.empty()) return;
    if (decodeBeside_ && flat.values.is_cpu() && decodesEarlyBeside(flat.values.numel()) &&
        !finishing_) {
      launchEarly(std::move(arrivals), flat);
      return;
    }
    for (const EarlyRound& e : arrivals) {
      Pending& p = *pendingRound(e.round);
      const auto t0 = clock().now();
      std::vector<size_t> now;  // checked whole first: nothing of a refused one is applied
      for (size_t i : e.who) {
        std::string reason;
        if (!checkContribution(*p.got[i], flat.values, reason).ok()) {
          p.undecodable[i] = true;
          continue;
        }
        now.push_back(i);
      }
      if (now.empty()) continue;
      addEarly(p, now, flat);
      markEarly(p, now, t);
      stats_.coded(since(t0));
    }
  }

  // x += w_j (q_i - q_j) for each contribution j in `now` (checked), a
  // slice at a time, in rank order, on the training thread.
  void addEarly(const Pending& p, const std::vector<size_t>& now, train::FlatParameters& flat) {
    if (now.empty()) return;
    const std::vector<int64_t> bounds = sliceBounds(flat.values);
    for (size_t k = 0; k + 1 < bounds.size(); ++k) {
      const int64_t lo = bounds[k], n = bounds[k + 1] - lo;
      torch::Tensor own = sliceBuffer(0, n, flat.values).zero_();
      codec_->decodeAccumulateRange(*p.bytes, 1.0f, lo, own);
      torch::Tensor q = sliceBuffer(1, n, flat.values);
      for (size_t i : now) {
        q.zero_();
        codec_->decodeAccumulateRange(p.got[i]->payload.bytes(), 1.0f, lo, q);
        // q becomes the correction in place: (own - q) * w.
        torch::Tensor& correction = q.sub_(own).mul_(-static_cast<float>(group_.weights[i]));
        flat.values.narrow(0, lo, n).add_(correction);
        base_.narrow(0, lo, n).add_(correction);
      }
    }
  }

  // The round in flight numbered `round`, or null.
  Pending* pendingRound(uint64_t round) {
    for (Pending& p : pending_) {
      if (p.round == round) return &p;
    }
    return nullptr;
  }

  // Contributions `who` of `p` are applied early from now on.
  void markEarly(Pending& p, const std::vector<size_t>& who, int64_t t) {
    for (size_t i : who) {
      p.earlyWeight += group_.weights[i];
      p.early[i] = true;
      p.applied(t - static_cast<int64_t>(p.got[i]->header.step));
      stats_.applied(t - static_cast<int64_t>(p.got[i]->header.step));
    }
    if (!who.empty()) modified_ = true;
  }

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
  void launchEarly(std::vector<EarlyRound> rounds, const train::FlatParameters& flat) {
    earlyWork_ = std::async(std::launch::async, [codec = codec_.get(), rounds = std::move(rounds),
                                                 correction = scratch_.take(flat.values),
                                                 slice = sliceLength(flat.values)]() mutable {
      const auto start = std::chrono::steady_clock::now();
      EarlyResult r;
      bool any = false;  // some contribution passed: the correction is made
      try {
        torch::NoGradGuard noGrad;
        torch::Tensor own = torch::empty({slice}, correction.options());
        torch::Tensor q = torch::empty({slice}, correction.options());
        for (EarlyRound& e : rounds) {
          for (size_t k = 0; k < e.who.size(); ++k) {
            std::string reason;
            (codec->check(e.payloads[k].bytes(), q, reason).ok() ? e.passed : e.refused)
                .push_back(k);
          }
          any |= !e.passed.empty();
        }
        const std::vector<int64_t> bounds = codec->sliceBounds(slice);
        for (size_t b = 0; any && b + 1 < bounds.size(); ++b) {
          const int64_t lo = bounds[b], n = bounds[b + 1] - lo;
          torch::Tensor c = correction.narrow(0, lo, n).zero_();
          torch::Tensor o = own.narrow(0, 0, n);
          torch::Tensor part = q.narrow(0, 0, n);
          for (const EarlyRound& e : rounds) {
            if (e.passed.empty()) continue;
            o.zero_();
            codec->decodeAccumulateRange(*e.own, 1.0f, lo, o);
            for (size_t k : e.passed) {
              part.zero_();
              codec->decodeAccumulateRange(e.payloads[k].bytes(), 1.0f, lo, part);
              c.add_(part.sub_(o), -e.weights[k]);  // w_j (own - q_j)
            }
          }
        }
      } catch (const std::exception& e) {
        r.error = e.what();
      }
      for (EarlyRound& e : rounds) {
        // Positions in `who` become group indices; the bytes go.
        for (size_t& k : e.passed) k = e.who[k];
        for (size_t& k : e.refused) k = e.who[k];
        if (!r.error.empty()) e.passed.clear(), e.refused.clear();
        e.payloads.clear();
      }
      r.rounds = std::move(rounds);
      r.correction = std::move(correction);
      r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      return r;
    });
  }

  // Takes up the early application decoded beside the steps, waiting for it
  // if need be: the model and the round's start move by its correction.
  // Where the codec threw, nothing happens (complete() decodes those
  // contributions itself). Every round it decoded is still in flight:
  // complete() and a state transfer take it up first.
  void takeEarly(int64_t t, train::FlatParameters& flat) {
    const auto t0 = clock().now();
    EarlyResult r = earlyWork_->get();
    earlyWork_.reset();
    const double waited = since(t0);
    decodedBeside_.add(r.seconds, waited);
    if (!r.error.empty()) {
      logger()->warn(
          "dts: decoding early contributions beside the step failed: {}; they are decoded when "
          "their round completes",
          r.error);
    }
    // The correction holds what passed (nothing where the codec threw).
    if (std::any_of(r.rounds.begin(), r.rounds.end(),
                    [](const EarlyRound& e) { return !e.passed.empty(); })) {
      flat.values.add_(r.correction);
      base_.add_(r.correction);
    }
    for (const EarlyRound& e : r.rounds) {
      Pending* p = pendingRound(e.round);
      if (p == nullptr) continue;  // cannot be (see above); nothing to mark
      for (size_t i : e.refused) p->undecodable[i] = true;
      markEarly(*p, e.passed, t);
      stats_.decodedBeside(e.passed.size() + e.refused.size());
    }
    scratch_.give(std::move(r.correction));
    stats_.coded(since(t0));
  }

  // Rounds from `round` on start after step `step` and take `k` steps each.
  using Schedule = DtsSchedule;
  // Which of two schedules wins: the later change, then the larger K, then
  // reduce-scatter (two coordinators on both sides of a partition may each
  // have chosen one).
  static bool newer(const Schedule& a, const Schedule& b) {
    return std::tie(a.round, a.k, a.step, a.exchange) > std::tie(b.round, b.k, b.step, b.exchange);
  }

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
  uint64_t roundAt(int64_t s) const {
    if (s >= schedule_.step) {
      return schedule_.round + static_cast<uint64_t>((s - schedule_.step) / schedule_.k);
    }
    const auto back = static_cast<uint64_t>((schedule_.step - s + schedule_.k - 1) / schedule_.k);
    return schedule_.round > back ? schedule_.round - back : 0;
  }

  // Takes a schedule heard of (a peer's, or this worker's own decision). A
  // change for a later round waits for it; one for a round this worker has
  // opened already (it heard late) is in force now, and the open round
  // closes on the new grid, or at the next step if that is behind it.
  void adopt(const Schedule& e, int64_t t) {
    if (!newer(e, schedule_)) return;
    if (e.round > nextRound_) {
      if (!nextSchedule_ || newer(e, *nextSchedule_)) nextSchedule_ = e;
      return;
    }
    if (e.k != schedule_.k) {
      logger()->info("dts: period K = {} steps (was {}) from round {} (after step {})", e.k,
                     schedule_.k, e.round, e.step);
    }
    if (e.exchange != schedule_.exchange) {
      logger()->info("dts: exchange {} (was {}) from round {}", exchangeName(e.exchange),
                     exchangeName(schedule_.exchange), e.round);
      reexchange(e);
    }
    schedule_ = e;
    roundsSinceChange_ = 0;
    uplink_.periodChanged();
    closeAt_ = std::max(closeOf(nextRound_), t + 1);
    stats_.setPeriod(schedule_.k);
    stats_.setReduceScatter(sharded());
  }

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
  Status reportLags(uint64_t round, const std::vector<double>& lags) {
    const Schedule next = nextSchedule_.value_or(Schedule{0, 0, 0});
    const int64_t schedules[kScheduleValues] = {static_cast<int64_t>(schedule_.round),
                                                schedule_.step,
                                                schedule_.k,
                                                static_cast<int64_t>(next.round),
                                                next.step,
                                                next.k,
                                                static_cast<int64_t>(nextRound_),
                                                static_cast<int64_t>(fastestRoundSeconds() * 1e9),
                                                lead(),
                                                static_cast<int64_t>(schedule_.exchange),
                                                static_cast<int64_t>(next.exchange)};
    for (size_t i = 0; i < group_.size(); ++i) {
      const uint32_t r = group_.ranks[i];
      if (i == group_.self || membership_.suspected(r)) continue;
      auto bytes = std::make_shared<std::vector<std::byte>>(kLagReportBytes);
      std::memcpy(bytes->data(), &lags[i], sizeof(double));
      std::memcpy(bytes->data() + sizeof(double), schedules, sizeof schedules);
      GEO_RETURN_IF_ERROR(sendTo({r}, Control::kLagReport, round, CodecId::kRaw, kLagReportBytes,
                                 std::move(bytes)));
    }
    return {};
  }

  // Takes the peers' reports: their schedules (auto period), and their lags
  // paired with this worker's own lags of the same round: (lag_ij + lag_ji)
  // / 2 is the link's one-way time, skew cancelled. A report of the wrong
  // size or with values out of range is ignored (a peer can at worst make D
  // wrong, within maxAutoDelay, or K, within maxAutoPeriod). Returns whether
  // any report came.
  bool takeLagReports(int64_t t) {
    bool any = false;
    for (size_t i = 0; i < group_.size(); ++i) {
      if (i == group_.self) continue;
      for (auto m = receiveControl(*transport_, Control::kLagReport, group_.ranks[i],
                                   std::chrono::milliseconds(0));
           m.ok(); m = receiveControl(*transport_, Control::kLagReport, group_.ranks[i],
                                      std::chrono::milliseconds(0))) {
        if (m->payload.size() != kLagReportBytes) continue;
        any = true;
        if (scheduling()) {
          int64_t e[kScheduleValues];
          std::memcpy(e, m->payload.data() + sizeof(double), sizeof e);
          // A peer runs at most its D (<= maxAutoDelay steps, a round each
          // at worst) ahead: a larger figure is not believed.
          if (e[6] >= 0 &&
              static_cast<uint64_t>(e[6]) <=
                  nextRound_ + static_cast<uint64_t>(options_.maxAutoDelay) + 2 &&
              e[7] > 0 && e[7] < int64_t{60'000'000'000} && e[8] >= 0 &&
              e[8] <= options_.maxAutoDelay) {
            paces_[i] = Pace{static_cast<uint64_t>(e[6]), static_cast<double>(e[7]) * 1e-9, e[8],
                             m->received};
          }
          for (int j : {0, 3}) {
            const int64_t exchange = e[9 + j / 3];
            if (e[j] >= 0 && e[j + 1] >= 0 && e[j + 2] >= 1 && e[j + 2] <= options_.maxAutoPeriod &&
                (exchange == 0 || exchange == 1)) {
              // A fixed exchange is every worker's (the hello agreed on it).
              const Exchange x = !autoExchange_  ? schedule_.exchange
                                 : exchange == 1 ? Exchange::kReduceScatter
                                                 : Exchange::kAllGather;
              // A fixed period likewise (the schedule then changes the exchange only).
              const int64_t k = options_.autoPeriod ? e[j + 2] : schedule_.k;
              adopt({static_cast<uint64_t>(e[j]), e[j + 1], k, x}, t);
            }
          }
        }
        double theirs = 0;
        std::memcpy(&theirs, m->payload.data(), sizeof theirs);
        const uint64_t round = m->header.step;
        if (round != kNoRound) links_.theirLag(round, i, theirs);
      }
    }
    return any;
  }

  // A worker that took a peer's state under an automatic period learns the
  // job's schedule from the peers' next reports (every worker sends one per
  // round) before it numbers its rounds.
  void awaitSchedule(int64_t step) {
    const auto deadline = clock().now() + options_.timeout;
    while (!takeLagReports(step)) {
      if (clock().now() >= deadline) {
        logger()->warn(
            "dts: no peer reported the job's period within {:.3g} s; numbering rounds with K = {}",
            std::chrono::duration<double>(options_.timeout).count(), schedule_.k);
        return;
      }
      clock().sleepFor(kPoll);
    }
    if (nextSchedule_ && nextSchedule_->round <= roundAt(step)) {
      schedule_ = *std::exchange(nextSchedule_, std::nullopt);
      stats_.setPeriod(schedule_.k);
      stats_.setReduceScatter(sharded());
    }
  }

  // Auto period (the coordinator only: the lowest-ranked member not
  // suspected). A round's updates leave through one uplink; what the
  // slowest link takes beyond its latency (one-way time less half the
  // smallest recent ping round trip) is the round's transfer time, from
  // which autoPeriod() (auto_rules.h) chooses K. A change takes effect from
  // a round two rounds and the links' latency ahead, and travels in
  // the reports. Called at each round's completion, and at a round's close
  // (`atClose`) for the uplink's part alone: a completion comes D steps
  // after its close, and where steps are short D is long (50-200 steps of
  // 1-3 ms on the world links), while two rounds held back by the uplink
  // are known as soon as they leave.
  Status choosePeriod(bool atClose) {
    if (!atClose) ++roundsSinceChange_;
    // The links' latency without queueing: pings share the uplink's queue
    // with the updates, so a busy link inflates them; the smallest of the
    // recent ones is the path's.
    for (const auto& c : transport_->peerCounters()) {
      const auto i = group_.indexOf(c.peer);
      if (!i || c.minRttSeconds < 0) continue;
      links_.addRtt(*i, c.minRttSeconds);
    }
    // Decide on measurements of the K in force only: the last four link
    // times are of it six rounds after a change. Sooner where this worker's
    // own uplink held back each of its last two rounds: a round's transfer
    // then takes at least as long as those rounds lasted, known without
    // anyone's report (the links' come a round's completion, D steps, and a
    // report's trip later), and K may grow at once.
    const bool measured = !atClose && roundsSinceChange_ >= kLagWindow + 2;
    const std::optional<double> heldRound = uplink_.heldRoundSeconds();
    const bool heldBack = heldRound.has_value();
    // Before the first lag reports, at a round's completion: one of our
    // rounds seen crossing longer than the links' latency (chooseDelay
    // records it until then) bounds a round's transfer from below, and
    // raises K at once where the K in force cannot carry it
    // (periodFromCrossing). Not after: the longest crossing seen is kept,
    // and would raise again a K the measurements had lowered.
    const bool crossed =
        !atClose && !measured && links_.crossingSeconds() > 0 && !everyLinkMeasured();
    if (nextSchedule_ || stepSeconds_ <= 0 || !(measured || heldBack || crossed)) return {};
    for (size_t i = 0; i < group_.self; ++i) {
      if (!membership_.suspected(group_.ranks[i])) return {};  // not the coordinator
    }
    double transfer = -1, latency = 0;
    for (size_t i = 0; i < group_.size(); ++i) {
      const std::optional<double> smallest = links_.smallestRtt(i);
      if (i == group_.self || !smallest) continue;
      const double rtt = *smallest;
      latency = std::max(latency, rtt / 2);
      if (!measured || !links_.measured(i)) continue;
      const std::vector<double> samples(links_.samples(i).begin(), links_.samples(i).end());
      transfer = std::max(transfer, roundTransferSeconds(samples, rtt / 2, roundSeconds()));
    }
    // A round's copies leave for every peer at once, so the slowest link's
    // transfer is the uplink's for all of them (or a bound under it where
    // the uplink is not the limit): what the final average paces its copies
    // by. Under reduce-scatter the lags are the parts' arrivals at their
    // owners: (G - 1) / G of a payload in all.
    const double peers = static_cast<double>(group_.size() - 1);
    uplink_.measuredTransfer(transfer,
                             sharded() ? peers / static_cast<double>(group_.size()) : peers);
    int64_t chosen = 0;  // the K to change to; 0: K stays
    const char* why = "a round's transfer takes";
    if (!options_.autoPeriod) {
      // The exchange alone is chosen at run time.
    } else if (transfer >= 0) {
      chosen = autoPeriod(transfer, stepSeconds_, schedule_.k, options_.maxAutoPeriod,
                          codecRoundSeconds_)
                   .value_or(0);
      if (codecBoundsPeriod(transfer, codecRoundSeconds_)) {
        transfer = codecRoundSeconds_;
        why = "encoding and decoding a round take";
      }
    }
    if (crossed && options_.autoPeriod) {
      const std::optional<int64_t> up = periodFromCrossing(
          links_.crossingSeconds(), latency, stepSeconds_, schedule_.k, options_.maxAutoPeriod);
      if (up && *up > chosen) {
        chosen = *up, transfer = links_.crossingSeconds() - latency;
        why = "a round seen crossing, before the lag reports, takes at least";
      }
    }
    // A larger K at once: the uplink is what every round waits for. A
    // smaller one not more often than every kMinStepsBetweenChanges steps
    // (measurements are noisy), and never while the uplink holds rounds back.
    if (chosen != 0 && chosen < schedule_.k &&
        (heldBack ||
         static_cast<int64_t>(roundsSinceChange_) * schedule_.k < kMinStepsBetweenChanges)) {
      chosen = 0;
    }
    if (heldBack && options_.autoPeriod) {
      // The longer of the two (UplinkPace::heldRoundSeconds): their mean went
      // to K = 32 of 12 ms steps for a 450 ms transfer.
      const double uplink = *heldRound;
      const auto up =
          periodForHeldUplink(uplink, stepSeconds_, schedule_.k, options_.maxAutoPeriod);
      if (up && *up > chosen) {
        chosen = *up, transfer = uplink;
        why = "the uplink held back our last rounds: a round through it takes";
      }
    }
    // The exchange (sync.exchange: auto): on the same measurements, or as
    // soon as the uplink holds rounds back (its rate is then known without
    // the lag reports, which at K = 64 take six rounds, 384 steps). A
    // change of exchange brings the K that exchange settles on, in place
    // of any change of K decided above.
    Exchange exchange = schedule_.exchange;
    if (autoExchange_ && (measured || heldBack) &&
        static_cast<int64_t>(roundsSinceChange_) * schedule_.k >= kMinStepsBetweenChanges) {
      const ExchangeInputs in = exchangeInputs(latency);
      const ExchangeVerdict v = exchangeVerdict(in);
      if (v.choice != schedule_.exchange) {
        exchange = v.choice;
        const DtsCost& now = sharded() ? v.reduceScatter : v.allGather;
        const DtsCost& then = sharded() ? v.allGather : v.reduceScatter;
        // The new exchange's rounds start at the K its rule settles on.
        if (options_.autoPeriod) chosen = then.period;
        logger()->info(
            "dts: exchange {} planned at {:.1f} ms a step (K = {}, D = {}) against {:.1f} ms "
            "(K = {}, D = {}) for {}, and {:.2f}x as many steps to the target: uplink {:.3g} MB/s, "
            "links {:.0f} ms one way, {:.0f} KB a payload, codec {:.1f} ms a payload",
            exchangeName(exchange), then.stepSeconds * 1e3, then.period, then.delay,
            now.stepSeconds * 1e3, now.period, now.delay, exchangeName(schedule_.exchange),
            then.stepsFactor / now.stepsFactor, in.uplinkBytesPerSecond / 1e6, latency * 1e3,
            in.payloadBytes / 1e3, in.codecPayloadSeconds * 1e3);
      }
    }
    if (chosen == 0) {
      if (exchange == schedule_.exchange) return {};
      chosen = schedule_.k;  // the exchange alone changes
    }
    const int64_t k = chosen;
    // Far enough ahead for the announcement to cross the links' latency,
    // in steps as they are lived (a round held back for the uplink
    // lasts longer than its compute); behind a queue it comes later, and a
    // worker that hears of it after its round closes realigns (adopt()).
    const int64_t ahead = periodAnnouncementSteps(
        schedule_.k, latency, roundSeconds() / static_cast<double>(schedule_.k));
    // And past the furthest round any peer may have opened by the time the
    // announcement reaches it: a peer may run up to its D ahead of the
    // coordinator (which also evaluates), and a change for a round it had
    // sent already numbered its rounds apart from ours until we caught up
    // -- every worker then waited, round by round, for the coordinator's
    // (about a second of 800 steps on the world links).
    // A change of exchange two rounds further: a worker that closed a
    // round before it heard sends that round again as the others exchange
    // it, which it cannot once it has applied a contribution early
    // (reexchange).
    const uint64_t margin = exchange != schedule_.exchange ? 2 : 0;
    const uint64_t from =
        exchange != schedule_.exchange && options_.exchangeAnnouncedLate
            ? nextRound_ + 1
            : std::max(nextRound_ + static_cast<uint64_t>((ahead + schedule_.k - 1) / schedule_.k),
                       furthestPeerRound() + 1) +
                  margin;
    const Schedule next{from, closeOf(from - 1), k, exchange};
    if (exchange != schedule_.exchange) {
      logger()->info(
          "dts: exchange {} with K = {} from round {} (after step {}), was {} with K = {}",
          exchangeName(exchange), k, next.round, next.step, exchangeName(schedule_.exchange),
          schedule_.k);
    } else {
      logger()->info(
          "dts: period K = {} from round {} (after step {}), was {}: {} {:.0f} ms, step time "
          "{:.1f} ms",
          k, next.round, next.step, schedule_.k, why, transfer * 1e3, stepSeconds_ * 1e3);
    }
    nextSchedule_ = next;
    return reportLags(kNoRound,
                      std::vector<double>(group_.size(), std::numeric_limits<double>::quiet_NaN()));
  }

  // One payload encoded or decoded, from the codec's work a round as
  // measured (noteCodecRound): a round under all-gather is this worker's
  // payload encoded and G - 1 decoded, under reduce-scatter about four
  // payloads' worth (exchange_choice.h).
  double codecPayloadSeconds() const {
    const double payloads = sharded() ? 4.0 : static_cast<double>(group_.size());
    return std::max(0.0, codecRoundSeconds_) / payloads;
  }

  // What this worker measured, as exchange_choice.h (the model `geotrain
  // plan` uses) costs an exchange on: the uplink's rate, the slowest link
  // (`latency`, one way), the payload and the codec's time.
  ExchangeInputs exchangeInputs(double latency) const {
    ExchangeInputs in;
    in.group = static_cast<double>(group_.size());
    in.peersOut = in.group - 1;
    in.payloadBytes = static_cast<double>(uplink_.lastRoundBytes());
    in.uplinkBytesPerSecond = uplink_.bytesPerSecond();
    // Where the uplink held the last rounds back, a round's bytes took
    // as long as those rounds lasted: the rate itself, where the slowest
    // link's transfer only bounds it from above (1.87 MB/s read on an
    // uplink of 1 MB/s).
    if (const std::optional<double> held = uplink_.heldRoundSeconds(); held && *held > 0) {
      const double g = in.group;
      const double roundBytes = in.payloadBytes * (sharded() ? 2 * (g - 1) / g : g - 1);
      const double rate = roundBytes / *held;
      if (rate > 0 && (in.uplinkBytesPerSecond <= 0 || rate < in.uplinkBytesPerSecond)) {
        in.uplinkBytesPerSecond = rate;
      }
    }
    in.latencySeconds = latency;
    in.codecPayloadSeconds = codecPayloadSeconds();
    return in;
  }

  // Both exchanges costed on `in` and this worker's step time, as the
  // automatic period and delay would run each.
  ExchangeVerdict exchangeVerdict(const ExchangeInputs& in) const {
    DtsPolicy policy;
    policy.autoPeriod = options_.autoPeriod;
    policy.period = options_.autoPeriod ? options_.period : schedule_.k;
    policy.delay = options_.delay;
    policy.maxAutoPeriod = options_.maxAutoPeriod;
    policy.maxAutoDelay = options_.maxAutoDelay;
    return chooseExchange(in, stepSeconds_, policy, schedule_.exchange);
  }

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
  uint64_t furthestPeerRound() const {
    uint64_t furthest = nextRound_;
    const auto now = clock().now();
    for (size_t i = 0; i < group_.size(); ++i) {
      const std::optional<double> rtt = links_.smallestRtt(i);
      if (!paces_[i] || !rtt || membership_.suspected(group_.ranks[i])) continue;
      const Pace& p = *paces_[i];
      const double seconds = *rtt + std::chrono::duration<double>(now - p.at).count();
      const double rounds = seconds / p.roundSeconds;
      const uint64_t paced = p.nextRound + static_cast<uint64_t>(std::ceil(std::min(rounds, 1e6)));
      const uint64_t waits = roundAt(closeOf(nextRound_) + p.lead);
      furthest = std::max(furthest, std::min(paced, waits));
    }
    return furthest;
  }

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
  Status awaitUplink(int64_t t, train::FlatParameters& flat) {
    if (uplink_.lastRoundBytes() == 0) return {};
    const auto t0 = clock().now();
    const double round = roundSeconds();
    const auto backlogged = [&] {
      for (const auto& c : transport_->peerCounters()) {
        if (!group_.indexOf(c.peer) || membership_.suspected(c.peer)) continue;
        const PeerQueue queue{c.backlogBytes, c.minRttSeconds, c.unackedSeconds, c.sinceAckSeconds};
        if (roundStillQueued(queue, uplink_.lastRoundBytes(), round)) return true;
      }
      return false;
    };
    uplink_.setHeld(false);
    while (backlogged() && clock().now() < t0 + options_.timeout) {
      uplink_.setHeld(true);
      GEO_RETURN_IF_ERROR(serveAndResend(t, flat));
      GEO_RETURN_IF_ERROR(pollArrivals());
      clock().sleepFor(std::chrono::milliseconds(2));
    }
    if (const double waited = since(t0); waited >= 0.05) {
      logger()->debug("dts: the uplink held round {} back for {:.0f} ms", nextRound_, waited * 1e3);
    }
    noteWait(since(t0));
    return {};
  }

  // A wait for peers or the link: counted, and not part of the step time.
  void noteWait(double seconds) {
    stats_.waited(seconds);
    waitedSince_ += seconds;
  }

  // What the codec took on the training thread since the last close, and
  // the early applications' decoding beside the steps (the same work, on a
  // core the step may need: a worker given one core shares it): a round's
  // worth (closeRound, before this round's encode).
  void noteCodecRound() {
    const double total = stats_.codecSeconds() + decodedBeside_.seconds - decodedBeside_.waited;
    if (codecAtClose_ >= 0) {
      const double round = std::max(0.0, total - codecAtClose_);
      codecRoundSeconds_ = codecRoundSeconds_ <= 0 ? round : 0.7 * codecRoundSeconds_ + 0.3 * round;
    }
    codecAtClose_ = total;
  }

  Status closeRound(int64_t t, train::FlatParameters& flat) {
    GEO_RETURN_IF_ERROR(awaitUplink(t, flat));
    noteCodecRound();
    Pending p;
    p.round = nextRound_++;
    // The exchange of the schedule this round was opened under (a change
    // adopted just below is for the next round on).
    const bool shardedAtClose = sharded();
    if (nextSchedule_ && nextSchedule_->round <= nextRound_) {
      const Schedule next = *std::exchange(nextSchedule_, std::nullopt);
      adopt(next, t);
    }
    closeAt_ = std::max(closeOf(nextRound_), t + 1);
    p.sendStep = t;
    // Under D = auto with nothing known of the links yet (no ping has come
    // back, no lags reported), D is not K or any other guess: a round
    // closed now is due when the first ping says how long the links are
    // (learnTheLink), and at the latest maxAutoDelay steps on. A guess of K
    // made every worker wait, at the first due step, for the slowest link
    // and its connection set-up: 0.6 s on links of 345 ms one way, a fifth
    // of the time to 85% there. (The contributions are applied as they
    // arrive meanwhile.)
    p.provisionalDue = auto_ && !linkKnown_;
    p.dueStep = t + (p.provisionalDue ? options_.maxAutoDelay : delay_);
    const auto t0 = clock().now();
    if (exact()) p.start = base_.clone();
    p.got.resize(group_.size());
    p.sharded = shardedAtClose;
    if (p.sharded) {
      p.shardIn.resize(group_.size());
      p.reducedIn.resize(group_.size());
    }
    const uint64_t round = p.round;
    // Beside the next step where this round is not due now and the
    // bitwise-exact path does not need its order; a round completing at
    // this step takes it up first (afterStep). A GPU worker's encoding is
    // the device's work already.
    const bool beside =
        p.dueStep > t && !exact() && !finishing_ && flat.values.is_cpu() && encodeBeside_;
    pending_.push_back(std::move(p));
    encoding_.emplace(Encoding{round, t, &flat, since(t0), {}});
    if (!beside) {
      const auto t1 = clock().now();
      EncodeResult r = encodeRound(round, flat.values);
      encoding_->onThreadSeconds += since(t1);
      return sendEncoded(std::move(r));
    }
    // The whole close's work on the model runs beside the next step's
    // forward and backward passes, which read the parameters and write
    // neither them nor base_; settleEncoding() takes it up before the
    // optimizer changes the parameters (afterBackward) or before anything
    // reads this synchronizer's state.
    encoding_->result = std::async(std::launch::async, [this, round, x = flat.values] {
      const auto start = std::chrono::steady_clock::now();
      EncodeResult r = encodeRound(round, x);
      r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      return r;
    });
    return {};
  }

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
  EncodeResult encodeRound(uint64_t round, const torch::Tensor& x) {
    EncodeResult r;
    torch::Tensor& acc = base_;
    try {
      torch::NoGradGuard noGrad;
      acc.sub_(x);
      // Our own state must be sound before it reaches anyone: a diverged
      // worker stops (and is excluded) instead of spreading it.
      std::string label;
      if (Status ok = checkValues(acc, std::numeric_limits<float>::max(), label); !ok.ok()) {
        r.diverged = ok.message();
        acc.add_(x);
        return r;
      }
      r.bytes = std::make_shared<const std::vector<std::byte>>(
          codec_->encode(acc, options_.seed, mixStream(2, topology_.rank(), round), nullptr));
      if (errorFeedback()) {
        // The new residual, acc - q (what the codec's own error feedback
        // computes: the same decode), and the next round's start x + it.
        codec_->decodeAccumulate(*r.bytes, -1.0f, acc);
        acc.add_(x);
      } else {
        acc.copy_(x);
      }
    } catch (const std::exception& e) {
      r.bytes.reset();
      r.error = e.what();
    }
    return r;
  }

  // Takes up the round being encoded beside a step, waiting for it if need
  // be, and sends it (sendEncoded); first returns a failure settleOrKeep()
  // kept. Does nothing without a round being encoded; on the training
  // thread only.
  Status settleEncoding() {
    GEO_RETURN_IF_ERROR(std::exchange(settleError_, Status()));
    if (!encoding_) return {};
    if (!encoding_->result.valid()) return internalError("dts: an encoding without its result");
    const auto t0 = clock().now();
    EncodeResult r = encoding_->result.get();
    const double waited = since(t0);
    encodedBeside_.add(r.seconds, waited);
    encoding_->onThreadSeconds += waited;
    return sendEncoded(std::move(r));
  }

  // The round closed last, once encoded, leaves for every peer present.
  // What the training thread spent on it (the close's own part, and any
  // wait for the encoding) counts as encoding.
  Status sendEncoded(EncodeResult r) {
    const Encoding e = std::move(*encoding_);
    encoding_.reset();
    const auto t0 = clock().now();
    if (r.bytes == nullptr) {
      // The round never leaves: nothing in flight may lack its bytes.
      if (!pending_.empty() && pending_.back().round == e.round) pending_.pop_back();
      if (!r.diverged.empty()) {
        return failedPrecondition(fmt::format(
            "dts: this worker's own update for round {} is not finite (training diverged at step "
            "{}; {}); stopping so that it does not reach the other workers",
            e.round, e.t, r.diverged));
      }
      return internalError(fmt::format("dts: encoding this worker's update for round {} failed: {}",
                                       e.round, r.error));
    }
    if (pending_.empty() || pending_.back().round != e.round) {
      return internalError(fmt::format("dts: round {} encoded but no longer in flight", e.round));
    }
    Pending& p = pending_.back();
    train::FlatParameters& flat = *e.flat;
    p.bytes = std::move(r.bytes);
    uplink_.encoded(p.bytes->size());
    stats_.coded(e.onThreadSeconds + since(t0), StatsRecorder::CodecWork::kEncode);
    GEO_RETURN_IF_ERROR(sendContribution(p, presentPeers(), true));
    if (flip_ && e.t >= flip_->step) injectFlip(e.t, flat);
    p.sentAt = clock().now();
    uplink_.sent(p.sentAt);
    stats_.setDelay(delay_);
    if (scheduling() && !finishing_ && uplink_.held()) return choosePeriod(true);
    return {};
  }

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
                          std::vector<double>& lags, double& total) {
    std::vector<torch::Tensor> decoded(group_.size());
    for (size_t i = 0; i < group_.size(); ++i) {
      if (i == group_.self || p.appliedEarly(i)) continue;
      if (p.got[i]) {
        decoded[i] = torch::empty_like(flat.values);
        std::string reason;
        const Status ok = codec_->decodeChecked(p.got[i]->payload.bytes(), decoded[i], reason);
        if (!ok.ok()) {
          reject(group_.ranks[i], fmt::format("the update for round {}", p.round), reason, ok);
          p.got[i].reset();
        }
      }
      if (!p.got[i]) stats_.missed();
    }
    for (size_t i = 0; i < group_.size(); ++i) {
      if (i == group_.self || p.has(i)) total += group_.weights[i];
    }
    torch::Tensor mean = torch::zeros_like(flat.values);
    torch::Tensor own = decodeOwn(p, flat.values);
    for (size_t i = 0; i < group_.size(); ++i) {
      const auto alpha = static_cast<float>(group_.weights[i] / total);
      if (i == group_.self) {
        mean.add_(own, alpha);
        continue;
      }
      if (!p.got[i]) continue;
      lags[i] = std::chrono::duration<double>(p.got[i]->received - p.sentAt).count();
      if (p.appliedEarly(i)) continue;  // in earlySum
      mean.add_(decoded[i], alpha);
      p.applied(t - static_cast<int64_t>(p.got[i]->header.step));
      stats_.applied(t - static_cast<int64_t>(p.got[i]->header.step));
    }
    scratch_.give(std::move(own));
    if (p.earlySum.defined()) mean.add_(p.earlySum, static_cast<float>(1.0 / total));
    return mean;
  }

  // `deferred` (null: the round must complete now, as at the end): set, and
  // nothing completed, when the wait shows the round is not due yet after
  // all -- before the first lag reports, a round seen crossing while we wait
  // raises D (learnTheLink), and the first rounds of a job cross a fresh
  // connection in TCP's slow start (several round trips; 0.5-0.8 s on the
  // world links, which every worker spent waiting at its first due step).
  Status complete(Pending& p, int64_t t, train::FlatParameters& flat, bool* deferred = nullptr) {
    if (p.sharded) return completeSharded(p, t, flat, deferred);
    // Contributions being decoded beside the steps are applied early first:
    // the round completes with them as such.
    if (earlyWork_) takeEarly(t, flat);
    // Wait (bounded) for the contributions expected in this round, serving
    // joins meanwhile; a peer suspected while we wait is not waited for.
    const auto t0 = clock().now();
    const auto deadline = t0 + options_.timeout;
    std::vector<size_t> waitedFor;  // for the debug log: whom the wait was for
    while (true) {
      GEO_RETURN_IF_ERROR(serveAndResend(t, flat));
      GEO_RETURN_IF_ERROR(pollArrivals());
      std::vector<size_t> waiting;
      for (size_t i = 0; i < group_.size(); ++i) {
        if (i != group_.self && !p.has(i) && awaited(i, p.round)) {
          waiting.push_back(i);
        }
      }
      if (waitedFor.empty()) waitedFor = waiting;
      if (waiting.empty()) break;
      if (deferUntilDue(p, t, t0, deferred)) return {};
      if (clock().now() >= deadline) {
        for (size_t i : waiting) {
          membership_.giveUp(group_.ranks[i]);
          logger()->warn(
              "dts: no update for round {} from {} within {:.3g} s although it is heard (a "
              "straggler?); going on without it (its contributions count as missing until it "
              "delivers again)",
              p.round, topology_.describe(group_.ranks[i]),
              std::chrono::duration<double>(options_.timeout).count());
        }
        break;
      }
      auto m = transport_->receive(MessageKind::kUpdate, p.round, transport::kAnyPeer, kPoll);
      if (!m.ok()) continue;
      const auto i = group_.indexOf(m->header.sender);
      if (!i || *i == group_.self || p.got[*i]) continue;  // a duplicate
      p.got[*i] = std::move(*m);
      membership_.delivered(group_.ranks[*i], p.round);
    }
    if (const double waited = since(t0); waited >= 0.05) {
      std::string whom;
      for (size_t i : waitedFor) {
        whom += fmt::format("{}{}", whom.empty() ? "" : ", ", topology_.describe(group_.ranks[i]));
      }
      logger()->debug(
          "dts: waited {:.0f} ms at step {} for round {} (sent at step {}, D = {}, step time "
          "{:.1f} "
          "ms) from {}",
          waited * 1e3, t, p.round, p.sendStep, delay_, stepSeconds_ * 1e3, whom);
    }
    noteWait(since(t0));
    // Every contribution is decoded and checked before it is used: nothing a
    // peer sends may end this worker or poison its model. A refused one
    // counts as a missing one.
    const auto tDecode = clock().now();
    std::vector<double> lags(group_.size(), std::numeric_limits<double>::quiet_NaN());
    double total = 0;
    torch::Tensor mean;
    if (p.start.defined()) {
      mean = exactMean(p, t, flat, lags, total);
      flat.values.copy_(p.start - mean);
      base_.copy_(flat.values);
    } else {
      // q̄ = (Σ w_i q_i) / W in rank order from the same bytes on every
      // worker. Every contribution is checked whole first (a refused one
      // counts as missing and nothing of it is used); then the round
      // completes a slice of the model at a time: this worker's own
      // contribution (decoded from its bytes, as the peers decode it), the
      // mean and one peer's decoded contribution, a slice each, and the
      // early sum decoded again from the bytes of those applied early. It
      // held four model-sized tensors (docs/algorithms.md, "Memory"). Each
      // value sees the same operations in the same order as it did.
      std::vector<bool> fresh(group_.size(), false);  // added here, not applied early
      for (size_t i = 0; i < group_.size(); ++i) {
        if (i == group_.self) {
          total += group_.weights[i];
          continue;
        }
        if (p.appliedEarly(i)) {  // in the early sum (got is empty after a resume)
          if (p.got[i]) {
            lags[i] = std::chrono::duration<double>(p.got[i]->received - p.sentAt).count();
          }
          total += group_.weights[i];
          continue;
        }
        if (p.got[i]) {
          std::string reason;
          const Status ok = checkContribution(*p.got[i], flat.values, reason);
          if (ok.ok()) {
            p.applied(t - static_cast<int64_t>(p.got[i]->header.step));
            stats_.applied(t - static_cast<int64_t>(p.got[i]->header.step));
          } else {
            reject(group_.ranks[i], fmt::format("the update for round {}", p.round), reason, ok);
            p.got[i].reset();
          }
        }
        if (!p.got[i]) {
          stats_.missed();
          continue;
        }
        fresh[i] = true;
        lags[i] = std::chrono::duration<double>(p.got[i]->received - p.sentAt).count();
        total += group_.weights[i];
      }
      const bool early = p.anyEarly();
      // Under D = auto with no contribution missing (W = 1, the usual
      // round): the correction below, (1 - Σ_early w_j) q_i - q̄ + Σ_early
      // w_j q_j, is Σ_fresh w_j (q_i - q_j) in exact arithmetic -- what
      // applying the fresh ones early does -- and zero where every one was
      // applied as it arrived. So only the fresh ones are decoded (addEarly),
      // and nothing is where there are none: the completion used to decode
      // every contribution of the round again, the early ones too, on the
      // training thread. The two differ by a few units of rounding, which
      // the job model the parity check compares moves by too, far inside
      // its tolerance. (A fixed D keeps the operations below: its rounds
      // complete the same way on every run.)
      const bool byEarlyApplication = auto_ && total >= 1.0 - 1e-9;
      if (byEarlyApplication) {
        std::vector<size_t> now;
        for (size_t i = 0; i < group_.size(); ++i) {
          if (fresh[i]) now.push_back(i);
        }
        if (now.empty()) ++completedAsApplied_;
        addEarly(p, now, flat);
      }
      // A round completed without someone keeps its whole mean for a late
      // contribution (Late): the slices' means are written into it.
      if (total < 1.0 - 1e-9) mean = scratch_.take(flat.values);
      const std::vector<int64_t> bounds =
          byEarlyApplication ? std::vector<int64_t>{} : sliceBounds(flat.values);
      for (size_t k = 0; k + 1 < bounds.size(); ++k) {
        const int64_t lo = bounds[k], n = bounds[k + 1] - lo;
        torch::Tensor correction = sliceBuffer(0, n, flat.values).zero_();
        codec_->decodeAccumulateRange(*p.bytes, 1.0f, lo, correction);
        torch::Tensor m = mean.defined() ? mean.narrow(0, lo, n) : sliceBuffer(1, n, flat.values);
        m.zero_();
        torch::Tensor q = sliceBuffer(2, n, flat.values);
        for (size_t i = 0; i < group_.size(); ++i) {
          const auto w = static_cast<float>(group_.weights[i]);
          if (i == group_.self) {
            m.add_(correction, w);
          } else if (fresh[i]) {
            q.zero_();
            codec_->decodeAccumulateRange(p.got[i]->payload.bytes(), 1.0f, lo, q);
            m.add_(q, w);
          }
        }
        torch::Tensor earlySum;
        if (early) {
          earlySum = sliceBuffer(3, n, flat.values);
          earlySumInto(p, lo, earlySum, q);
          m.add_(earlySum);
        }
        m.mul_(static_cast<float>(1.0 / total));
        // own - q̄, less what applyEarly applied already, Σ w_j (q_i − q_j):
        // (1 - Σ w_j) q_i - q̄ + Σ w_j q_j.
        if (early) {
          correction.mul_(static_cast<float>(1.0 - p.earlyWeight)).sub_(m).add_(earlySum);
        } else {
          correction.sub_(m);
        }
        flat.values.narrow(0, lo, n).add_(correction);
        base_.narrow(0, lo, n).add_(correction);
      }
      scratch_.give(std::move(p.earlySum));
    }
    stats_.coded(since(tDecode));
    if (total < 1.0 - 1e-9) {
      Late l{p.round, mean, total, std::vector<bool>(group_.size(), false)};
      for (size_t i = 0; i < group_.size(); ++i) l.had[i] = i == group_.self || p.has(i);
      late_.push_back(std::move(l));
      while (late_.size() > lateWindow()) late_.pop_front();
    } else {
      scratch_.give(std::move(mean));
    }
    return completed(p, std::move(lags));
  }

  // What every completion ends with, once the model holds the round: the
  // round's figures, its bytes kept for a peer that may still need them,
  // the inbox's stale rounds dropped, the lags reported and the schedule
  // reconsidered.
  Status completed(Pending& p, std::vector<double> lags) {
    stats_.roundDone(since(p.sentAt));
    if (p.appliedCount > 0) staleness_ = p.stalenessSum / static_cast<double>(p.appliedCount);
    jobStep_ = p.sendStep;
    modified_ = true;
    if (auto_) {
      sent_.push_back({p.round, p.sendStep, p.bytes});
      while (sent_.size() > lateWindow()) sent_.pop_front();
    }
    discardStale();
    // Round 0 includes connection set-up (CURVE handshakes): not a link
    // measurement.
    if (measuring() && p.round > 0) {
      GEO_RETURN_IF_ERROR(reportLags(p.round, lags));
      links_.ownLags(p.round, std::move(lags));
    }
    if (auto_) learnTheLink();
    if (scheduling() && !finishing_) GEO_RETURN_IF_ERROR(choosePeriod(false));
    return {};
  }

  // ---- Reduce-scatter (sync.exchange; docs/algorithms.md, "Reduce-scatter") ----
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
  // that sees one sends its whole contribution to every peer, as
  // all-gather does (ownerLost).

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
  void reexchange(const Schedule& e) {
    const bool toShards = e.exchange == Exchange::kReduceScatter;
    for (Pending& p : pending_) {
      if (p.round < e.round || p.sharded == toShards) continue;
      if (!toShards) {
        p.sharded = false;
        p.owesWhole = p.bytes != nullptr && !p.sentWhole;
        stats_.reexchanged();
        continue;
      }
      if (p.anyEarly() || earlyWork_) {
        logger()->warn(
            "dts: round {} was closed before the exchange {} from round {} was heard, and a "
            "contribution to it applied early: it completes as all-gather here, and the peers "
            "wait for this worker's shard until the round's time-out",
            p.round, exchangeName(e.exchange), e.round);
        continue;
      }
      p.sharded = true;
      p.shardIn.assign(group_.size(), std::nullopt);
      p.reducedIn.assign(group_.size(), std::nullopt);
      p.sentWhole = p.bytes != nullptr;
      stats_.reexchanged();
    }
  }

  // The values [lo, hi) of shard s.
  std::pair<int64_t, int64_t> shard(size_t s) const { return {shards_[s], shards_[s + 1]}; }

  // Whether member s owns its shard of `round`: it takes part in the round
  // (Membership::takesPart) and has not finished before it.
  bool owns(size_t s, uint64_t round) const {
    if (finishedAt_[s] && round >= *finishedAt_[s]) return false;
    return membership_.takesPart(group_.ranks[s], round);
  }

  // Whether an owner of a shard with values is lost for `p`'s round.
  bool ownerLost(const Pending& p) const {
    for (size_t s = 0; s < group_.size(); ++s) {
      const auto [lo, hi] = shard(s);
      if (s != group_.self && lo < hi && !p.reducedIn[s] && !owns(s, p.round)) return true;
    }
    return false;
  }

  // `p`'s contribution to `to`: whole (all-gather, or an owner lost), or
  // each peer's shard of it. `count`: the round's first sending (the
  // byte counters count it).
  Status sendContribution(Pending& p, const std::vector<uint32_t>& to, bool count) {
    const auto payload = static_cast<uint64_t>(codec_->numel()) * 4;
    if (!p.sharded || ownerLost(p)) {
      if (count) stats_.encoded(payload, p.bytes->size(), to.size());
      p.sentWhole = p.sharded;
      return sendUpdate(to, p.round, p.sendStep, p.bytes);
    }
    for (uint32_t r : to) {
      const auto s = group_.indexOf(r);
      if (!s) continue;
      const auto [lo, hi] = shard(*s);
      if (lo == hi) continue;
      auto bytes =
          std::make_shared<const std::vector<std::byte>>(codec_->rangeEncoding(*p.bytes, lo, hi));
      if (count) stats_.encoded(static_cast<uint64_t>(hi - lo) * 4, bytes->size(), 1);
      GEO_RETURN_IF_ERROR(sendTo({r}, MessageKind::kShard, p.round, p.sendStep, codec_->id(),
                                 static_cast<uint64_t>(hi - lo), std::move(bytes)));
    }
    return {};
  }

  // This worker's shard's mean of `p` to `to`, once made.
  Status sendOwnReduced(const Pending& p, const std::vector<uint32_t>& to) {
    if (!p.sharded || p.ownReduced == nullptr || p.ownReduced->empty() || to.empty()) return {};
    const auto [lo, hi] = shard(group_.self);
    return sendTo(to, MessageKind::kReduced, p.round, p.sendStep, codec_->id(),
                  static_cast<uint64_t>(hi - lo), p.ownReduced);
  }

  // This worker's part of the exchange of every round in flight: its
  // shard's mean once every contribution to it awaited is in, and its
  // whole contribution to every peer where an owner is lost.
  Status exchangeShards() {
    for (Pending& p : pending_) {
      if (!p.sharded && p.owesWhole && p.bytes != nullptr) {
        p.owesWhole = false;
        GEO_RETURN_IF_ERROR(sendUpdate(presentPeers(), p.round, p.sendStep, p.bytes));
      }
      if (!p.sharded || p.bytes == nullptr) continue;
      GEO_RETURN_IF_ERROR(reduceOwn(p));
      if (!p.sentWhole && ownerLost(p)) {
        logger()->info(
            "dts: an owner of a shard of round {} is gone (suspected, finished or rejoining): this "
            "worker's contribution goes whole to every peer, and that shard is averaged by each",
            p.round);
        GEO_RETURN_IF_ERROR(sendContribution(p, presentPeers(), false));
      }
    }
    return {};
  }

  // A peer's part of shard [lo, hi) of `p`, decoded into `out` and checked:
  // its shard, or the shard cut from its whole contribution.
  Status peerShard(const Pending& p, size_t j, int64_t lo, torch::Tensor& out,
                   std::string& reason) {
    const int64_t hi = lo + out.numel();
    if (p.sharded && p.shardIn[j] && shard(group_.self) == std::pair{lo, hi}) {
      return codec_->decodeRangeChecked(p.shardIn[j]->payload.bytes(), lo, out, reason);
    }
    std::vector<std::byte> part;
    try {
      part = codec_->rangeEncoding(p.got[j]->payload.bytes(), lo, hi);
    } catch (const std::exception& e) {
      reason = "size";
      return dataLoss(e.what());
    }
    return codec_->decodeRangeChecked(part, lo, out, reason);
  }

  // The mean of values [lo, hi) of `p` over this worker's contribution and
  // the peers' in `from` (group indices whose part is in), into `mean`:
  // Σ (w_j / W) q_j in rank order from zero, every part decoded and checked
  // first (a refused one is left out) -- exactMean()'s operations. Returns
  // which were used.
  std::vector<bool> shardMean(const Pending& p, const std::vector<size_t>& from, int64_t lo,
                              torch::Tensor& mean, const char* what) {
    const int64_t n = mean.numel();
    std::vector<torch::Tensor> q(group_.size());
    std::vector<bool> used(group_.size(), false);
    double total = 0;
    for (size_t j = 0; j < group_.size(); ++j) {
      const bool self = j == group_.self;
      if (!self && std::find(from.begin(), from.end(), j) == from.end()) continue;
      q[j] = torch::zeros({n}, mean.options());
      if (self) {
        codec_->decodeAccumulateRange(*p.bytes, 1.0f, lo, q[j]);
      } else {
        std::string reason;
        if (const Status ok = peerShard(p, j, lo, q[j], reason); !ok.ok()) {
          reject(group_.ranks[j], fmt::format("{} for round {}", what, p.round), reason, ok);
          q[j] = torch::Tensor();
          continue;
        }
      }
      used[j] = true;
      total += group_.weights[j];
    }
    mean.zero_();
    for (size_t j = 0; j < group_.size(); ++j) {
      if (used[j]) mean.add_(q[j], static_cast<float>(group_.weights[j] / total));
    }
    return used;
  }

  // This worker's shard's mean of `p`, once every contribution awaited is
  // in: made (shardMean), encoded in the round's codec with a stream of its
  // own, kept, and sent to every peer present. A part that comes after is
  // dropped with the round's stale data.
  Status reduceOwn(Pending& p) {
    if (p.ownReduced != nullptr) return {};
    const size_t self = group_.self;
    std::vector<size_t> from;
    for (size_t j = 0; j < group_.size(); ++j) {
      if (j == self) continue;
      if (p.shardIn[j] || p.got[j]) {
        from.push_back(j);
      } else if (awaited(j, p.round)) {
        return {};  // not yet
      }
    }
    const auto [lo, hi] = shard(self);
    if (lo == hi) {
      p.ownReduced = std::make_shared<const std::vector<std::byte>>();
      return {};
    }
    const auto t0 = clock().now();
    torch::Tensor mean = torch::empty({hi - lo}, base_.options());
    const std::vector<bool> used = shardMean(p, from, lo, mean, "its part of the shard");
    // A contribution missing from this worker's shard counts as missing,
    // once a round, as complete() counts one under all-gather.
    for (size_t j = 0; j < group_.size(); ++j) {
      if (j != self && !used[j]) stats_.missed();
    }
    p.ownReduced = std::make_shared<const std::vector<std::byte>>(
        codec_->encodeRange(mean, lo, options_.seed, mixStream(3, topology_.rank(), p.round)));
    const auto to = presentPeers();
    stats_.encoded(static_cast<uint64_t>(hi - lo) * 4, p.ownReduced->size(), to.size());
    stats_.coded(since(t0));
    return sendOwnReduced(p, to);
  }

  // Whether shard s of `p` can be applied: its mean came from its owner
  // (this worker's: made), or its owner is lost and every contribution
  // awaited came whole.
  bool shardReady(const Pending& p, size_t s) const {
    const auto [lo, hi] = shard(s);
    if (lo == hi) return true;
    if (s == group_.self) return p.ownReduced != nullptr;
    if (p.reducedIn[s]) return true;
    if (owns(s, p.round)) return false;
    for (size_t j = 0; j < group_.size(); ++j) {
      if (j != group_.self && !p.got[j] && awaited(j, p.round)) return false;
    }
    return true;
  }

  // complete() of a round exchanged by reduce-scatter: waits (bounded, as
  // complete() does) until every shard can be applied, then replaces this
  // worker's contribution by each shard's mean: x += q_i[s] - q̄[s] (K = 1,
  // D = 0 with the identity codec: x[s] = start[s] - q̄[s], as exactMean()).
  // A peer silent past the time-out is given up (as complete() does): an
  // owner's shard is then averaged here from the whole contributions that
  // came, this worker's own at least.
  Status completeSharded(Pending& p, int64_t t, train::FlatParameters& flat, bool* deferred) {
    const auto t0 = clock().now();
    const auto deadline = t0 + options_.timeout;
    const auto allReady = [&] {
      for (size_t s = 0; s < group_.size(); ++s) {
        if (!shardReady(p, s)) return false;
      }
      return true;
    };
    while (true) {
      GEO_RETURN_IF_ERROR(serveAndResend(t, flat));
      GEO_RETURN_IF_ERROR(pollArrivals());
      if (allReady()) break;
      if (deferUntilDue(p, t, t0, deferred)) return {};
      if (clock().now() >= deadline) {
        for (size_t j = 0; j < group_.size(); ++j) {
          if (j == group_.self) continue;
          const auto [lo, hi] = shard(j);
          const bool owes =
              (lo < hi && !p.reducedIn[j] && owns(j, p.round)) ||
              (p.ownReduced == nullptr && !p.shardIn[j] && !p.got[j] && awaited(j, p.round));
          if (!owes) continue;
          membership_.giveUp(group_.ranks[j]);
          logger()->warn(
              "dts: round {} still lacks the part or the shard's mean of {} after {:.3g} s "
              "although it is heard (a straggler?); going on without it",
              p.round, topology_.describe(group_.ranks[j]),
              std::chrono::duration<double>(options_.timeout).count());
        }
        GEO_RETURN_IF_ERROR(pollArrivals());
        break;
      }
      auto m = transport_->receive(MessageKind::kReduced, p.round, transport::kAnyPeer,
                                   std::chrono::milliseconds(2));
      if (!m.ok()) continue;
      const auto i = group_.indexOf(m->header.sender);
      if (!i || *i == group_.self || p.reducedIn[*i]) continue;  // a duplicate
      membership_.delivered(m->header.sender, p.round);
      p.reducedIn[*i] = std::move(*m);
    }
    if (const double waited = since(t0); waited >= 0.05) {
      logger()->debug(
          "dts: waited {:.0f} ms at step {} for the shards of round {} (sent at step "
          "{}, D = {})",
          waited * 1e3, t, p.round, p.sendStep, delay_);
    }
    noteWait(since(t0));
    const auto tDecode = clock().now();
    std::vector<double> lags(group_.size(), std::numeric_limits<double>::quiet_NaN());
    for (size_t s = 0; s < group_.size(); ++s) {
      const auto [lo, hi] = shard(s);
      const int64_t n = hi - lo;
      if (n == 0) continue;
      torch::Tensor mean = sliceBuffer(1, n, flat.values);
      bool have = false;
      if (s == group_.self && p.ownReduced != nullptr) {
        std::string reason;
        have = codec_->decodeRangeChecked(*p.ownReduced, lo, mean, reason).ok();
      } else if (s != group_.self && p.reducedIn[s]) {
        const Message& m = *p.reducedIn[s];
        std::string reason;
        const Status ok = codec_->decodeRangeChecked(m.payload.bytes(), lo, mean, reason);
        if (ok.ok()) {
          have = true;
          // The owner's close: how old the round is as it is applied here.
          p.applied(t - static_cast<int64_t>(m.header.step));
          stats_.applied(t - static_cast<int64_t>(m.header.step));
        } else {
          reject(group_.ranks[s], fmt::format("its shard's mean for round {}", p.round), reason,
                 ok);
        }
      }
      if (!have) {
        // Averaged here from the whole contributions that came.
        std::vector<size_t> from;
        for (size_t j = 0; j < group_.size(); ++j) {
          if (j != group_.self && p.got[j]) from.push_back(j);
        }
        shardMean(p, from, lo, mean, "the update");
      }
      torch::Tensor x = flat.values.narrow(0, lo, n);
      if (p.start.defined()) {
        x.copy_(p.start.narrow(0, lo, n) - mean);
        base_.narrow(0, lo, n).copy_(x);
      } else {
        torch::Tensor correction = sliceBuffer(0, n, flat.values).zero_();
        codec_->decodeAccumulateRange(*p.bytes, 1.0f, lo, correction);
        correction.sub_(mean);
        x.add_(correction);
        base_.narrow(0, lo, n).add_(correction);
      }
    }
    // The lags reported are each peer's part of this worker's shard (or
    // its whole contribution): one hop, as under all-gather, so that both
    // ends' lags of a pair measure its link (LinkLedger); chooseDelay()
    // covers the two hops a round takes.
    for (size_t j = 0; j < group_.size(); ++j) {
      if (j == group_.self) continue;
      const std::optional<Message>& m = p.shardIn[j] ? p.shardIn[j] : p.got[j];
      if (m) lags[j] = std::chrono::duration<double>(m->received - p.sentAt).count();
    }
    stats_.coded(since(tDecode));
    return completed(p, std::move(lags));
  }

  // While a round waited for at its due step (since t0) shows the links
  // longer than D assumed (learnTheLink), the round is due later: the
  // wait ends, counted, with *deferred set (null: it must complete now).
  bool deferUntilDue(const Pending& p, int64_t t, geo::Clock::TimePoint t0, bool* deferred) {
    if (deferred == nullptr || !auto_ || everyLinkMeasured()) return false;
    learnTheLink();
    if (p.dueStep <= t) return false;
    noteWait(since(t0));
    *deferred = true;
    return true;
  }

  // D = auto before anything is known of the links: the first ping round
  // trips, once every peer expected has answered one, give D (chooseDelay,
  // linkBeforeReports), and the rounds closed meanwhile become due D
  // steps after they closed (or at once, where that has passed).
  void learnTheLink() {
    const int64_t before = delay_;
    if (!chooseDelay()) return;
    for (Pending& p : pending_) {
      if (p.provisionalDue) {
        p.dueStep = std::min(p.dueStep, p.sendStep + delay_);
        p.provisionalDue = false;
      } else if (delay_ > before && !everyLinkMeasured()) {
        // Before a peer's first lag reports, a D raised by a round seen
        // crossing covers the rounds already in flight too: they cross the
        // same way.
        // (Each worker completes a round when its own D says; the
        // corrections still sum to zero.)
        p.dueStep = std::max(p.dueStep, p.sendStep + delay_);
      }
    }
  }

  // Whether the lag reports have measured the link to every peer expected
  // (LinkLedger; a suspected peer is not expected). Until then a round seen
  // crossing can raise D (learnTheLink, every step).
  bool everyLinkMeasured() const {
    for (size_t i = 0; i < group_.size(); ++i) {
      if (i == group_.self || links_.measured(i)) continue;
      if (!membership_.suspected(group_.ranks[i])) return false;
    }
    return true;
  }

  // Returns whether anything is known of the links (linkKnown_).
  bool chooseDelay() {
    // Each expected peer's link: from the pairs' measurements where it has
    // some, else from its ping round trip and the rounds seen crossing
    // (slowestLink).
    std::vector<PeerLink> peers;
    std::vector<size_t> indices;  // their group indices
    for (const auto& c : transport_->peerCounters()) {
      const auto i = group_.indexOf(c.peer);
      if (!i || *i == group_.self || membership_.suspected(c.peer)) continue;
      PeerLink l;
      l.minRttSeconds = c.minRttSeconds;
      if (links_.measured(*i)) {
        l.measuredSeconds = links_.longestSample(*i);
      } else if (c.minRttSeconds > 0 && c.unackedSeconds > c.minRttSeconds &&
                 c.sinceAckSeconds >= 0 && c.sinceAckSeconds < c.minRttSeconds + 1.0) {
        // A round still crossing to a peer not measured yet: its oldest
        // byte not yet acknowledged left unackedSeconds ago, so the way
        // there takes at least that less the acknowledgement's way back. A
        // 10 MB round over 100 Mbit/s took 2.3 s where the ping said
        // 115 ms, and the first lag reports came 26 s into the run: every
        // round until then was waited for. Only while acknowledgements keep
        // coming (the data moves; a cut link's silence says nothing of its
        // length). The longest seen holds until the reports come: the next
        // round crosses the same way. (The minimum round trip: the first
        // pings of a job wait behind connection set-up and slow start.)
        links_.sawCrossing(c.unackedSeconds - c.minRttSeconds / 2);
      }
      peers.push_back(l);
      indices.push_back(*i);
    }
    const std::optional<SlowestLink> slowest = slowestLink(peers, links_.crossingSeconds());
    const double link = slowest ? slowest->seconds : -1;
    if (slowest && !slowest->estimated) stats_.setLink(link);
    // Under reduce-scatter a round takes two hops, a part to its owner and
    // the owner's mean on: D covers twice the slowest link (the slowest
    // pair's round trip, for links alike both ways).
    const std::optional<int64_t> chosen = autoDelaySteps(sharded() && link > 0 ? 2 * link : link,
                                                         stepSeconds_, options_.maxAutoDelay);
    if (chosen) linkKnown_ = true;
    const int64_t next = chosen.value_or(std::clamp<int64_t>(delay_, 0, options_.maxAutoDelay));
    if (next != delay_) {
      // Small moves (jitter) go to the debug log; real changes to info.
      const std::string whose =
          slowest ? topology_.describe(group_.ranks[indices[slowest->peer]]) : std::string();
      const bool notable = std::abs(next - loggedDelay_) >= std::max<int64_t>(2, loggedDelay_ / 4);
      logger()->log(notable ? spdlog::level::info : spdlog::level::debug,
                    "dts: delay D = {} steps (was {}): slowest link {:.0f} ms one way ({}){}, step "
                    "time {:.1f} ms",
                    next, delay_, link * 1e3,
                    !slowest              ? std::string("nothing known of the links")
                    : !slowest->estimated ? fmt::format("to {}", whose)
                    : link == links_.crossingSeconds()
                        ? fmt::format("a round seen crossing, before {}'s first reports", whose)
                        : fmt::format("half the ping round trip, before {}'s first reports", whose),
                    sharded() ? ", twice over (reduce-scatter)" : "", stepSeconds_ * 1e3);
      if (notable) loggedDelay_ = next;
      delay_ = next;
    }
    stats_.setDelay(delay_);
    return linkKnown_;
  }

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
  uint64_t parityLateRounds(uint64_t round) const override {
    uint64_t h = 0;
    for (const Late& l : late_) {
      if (l.round + kLateWindow <= round) continue;
      if (std::all_of(l.had.begin(), l.had.end(), [](bool b) { return b; })) continue;
      h = mixStream(h, l.round, 0);
      for (size_t i = 0; i < l.had.size(); ++i) {
        if (l.had[i]) h = mixStream(h, l.round, i + 1);
      }
    }
    return h;
  }
  // It trains, it is heard and not joining (Membership::expected's other
  // conditions; its round condition follows the rounds the peer
  // delivered, later ones), and it has not finished before the round.
  bool parityReports(size_t i, uint64_t round) const override {
    return !(finishedAt_[i] && round >= *finishedAt_[i]) &&
           membership_.expected(group_.ranks[i], ~uint64_t{0});
  }
  uint64_t parityNextRound() const override { return nextRound_; }
  void parityRepair(const torch::Tensor& delta, train::FlatParameters& flat) override {
    const torch::Tensor d = delta.view_as(flat.values).to(flat.values.device());
    flat.values.add_(d);
    base_.add_(d);
    modified_ = true;
  }
  Status paritySend(const std::vector<uint32_t>& to, Control control, int64_t step,
                    std::shared_ptr<const std::vector<std::byte>> bytes) override {
    const uint64_t size = bytes->size();
    return sendTo(to, control, step, CodecId::kRaw, size, std::move(bytes));
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
  static std::optional<Flip> flipFromEnvironment() {
    const char* spec = std::getenv("GEO_TEST_FLIP_BIT");
    if (spec == nullptr || *spec == '\0') return std::nullopt;
    Flip f;
    long long rank = 0, step = 0, index = 0;
    int bit = 0;
    if (std::sscanf(spec, "%lld:%lld:%lld:%d", &rank, &step, &index, &bit) != 4 || rank < 0 ||
        step < 0 || index < 0 || bit < 0 || bit > 31) {
      logger()->warn("GEO_TEST_FLIP_BIT={}: not RANK:STEP:INDEX:BIT (BIT 0-31); ignored", spec);
      return std::nullopt;
    }
    f.rank = static_cast<uint32_t>(rank);
    f.step = step;
    f.index = index;
    f.bit = bit;
    return f;
  }
  std::optional<Flip> flip_;
  void injectFlip(int64_t t, train::FlatParameters& flat) {
    const Flip f = *std::exchange(flip_, std::nullopt);
    if (f.rank != topology_.rank() || f.index >= flat.values.numel()) return;
    const float before = flat.values[f.index].item<float>();
    uint32_t bits = 0;
    std::memcpy(&bits, &before, sizeof bits);
    bits ^= uint32_t{1} << f.bit;
    float after = 0;
    std::memcpy(&after, &bits, sizeof after);
    flat.values[f.index].fill_(after);
    base_[f.index].add_(static_cast<double>(after) - static_cast<double>(before));
    logger()->warn(
        "GEO_TEST_FLIP_BIT: flipped bit {} of parameter {} at step {} (the start of round {}): "
        "{:.6g} -> {:.6g}",
        f.bit, f.index, t, nextRound_, before, after);
  }

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
  // Each peer's PeerCounters::reconnects when last looked at.
  std::vector<uint64_t> reconnectsSeen_;
  Schedule schedule_;                     // the period in force
  std::optional<Schedule> nextSchedule_;  // agreed, from a later round
  int64_t closeAt_;                       // the step at which the open round closes
  uint64_t roundsSinceChange_ = 0;
  bool finishing_ = false;
  // Auto delay and period: each peer's link, from both ends' lags of the
  // same rounds, its ping round trips, and the rounds seen crossing.
  LinkLedger links_{group_.size(), {.samples = kLagWindow}};
  // Auto period: each peer's pace as of its latest report (the round it
  // closes next, the shortest its rounds may last, its lead(), when the
  // report arrived).
  struct Pace {
    uint64_t nextRound = 0;
    double roundSeconds = 0;  // the shortest its rounds may last (fastestRoundSeconds)
    int64_t lead = 0;
    geo::Clock::TimePoint at;
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
  double waitedSince_ = 0;                           // seconds waited for peers since the last step
  std::optional<geo::Clock::TimePoint> lastStepAt_;  // the latest afterStep's start
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
  ScratchTensors scratch_;
  std::array<torch::Tensor, 4> slices_;  // sliceBuffer()'s
  StageTimes stages_;
  // State parity's protocol (state_parity.h), on this worker's job model.
  StateParity parity_{*this, group_, topology_, stats_};
};

}  // namespace

std::unique_ptr<Base> makeDts(const SyncOptions& o, const Topology& t, transport::Transport* tr,
                              Group g) {
  return std::make_unique<Dts>(o, t, tr, std::move(g));
}

}  // namespace geo::sync::detail
