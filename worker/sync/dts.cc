// DTS (dts_impl.h has the algorithm and the class): the synchronizer's
// interface, rounds closed, applied early and late, completed, and the
// checkpointed state.

#include "worker/sync/dts_impl.h"

namespace geo::sync::detail {

Dts::Dts(const SyncOptions& o, const Topology& t, transport::Transport* tr, Group g)
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
  // A worker we send our state to is awaited once it says from which round
  // it contributes, as the others await it: it may catch up on rounds past
  // the one of the step we served it at (catchUp).
  membership_.setServedJoinerAnnounces(true);
  flip_ = flipFromEnvironment();
}

std::string Dts::describe() const {
  return fmt::format("dts among {} workers: period K = {}, delay D = {}, codec {}{}", group_.size(),
                     options_.autoPeriod ? fmt::format("auto (from {})", schedule_.k)
                                         : std::to_string(schedule_.k),
                     auto_ ? std::string("auto") : std::to_string(delay_), options_.codec.name,
                     autoExchange_ ? ", exchange auto (from allgather)"
                     : sharded()   ? ", exchange reducescatter"
                                   : "");
}

Status Dts::afterBackward(int64_t step, train::FlatParameters& flat) {
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

Status Dts::afterStep(int64_t step, train::FlatParameters& flat) {
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
  paceSteps_.push_back(
      {std::chrono::duration<double>(now.time_since_epoch()).count(), waitedSince_});
  while (paceSteps_.size() > paceWindow()) paceSteps_.pop_front();
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
    if (Pending& done = pending_.front(); done.sharded && done.bytes != nullptr) {
      answerable_.push_back(std::move(static_cast<Answerable&>(done)));
      while (answerable_.size() > kAnswerable) answerable_.pop_front();
    }
    recycle(pending_.front());
    pending_.pop_front();
    stages_.lap(StageTimes::kComplete);
    GEO_RETURN_IF_ERROR(parity_.afterCompleted(round, finishing_));
    stages_.lap(StageTimes::kParity);
  }
  stages_.lap(StageTimes::kComplete);
  return {};
}

StatusOr<train::JoinResult> Dts::join(int64_t step, train::FlatParameters& flat) {
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
    auto caughtUp = catchUp(joined->step, flat);
    if (!caughtUp.ok()) return caughtUp.status();
    joined->step = *caughtUp;
    // Every peer finished while the state crossed: their final average is
    // the job's model, made without us, and they linger for us (we are
    // joining) only a short while.
    if (everyPeerFinished(std::nullopt)) {
      auto taken = membership_.takeFinalModel(joined->step, flat.values, &flat);
      if (!taken.ok()) return taken.status();
      return train::JoinResult{taken->step, true, true};
    }
  }
  // A worker resumed from its checkpoint sends its rounds in flight again,
  // and those it completed last (a peer with a larger D may still wait for
  // them): it contributes from the oldest of them.
  uint64_t first = pending_.empty() ? nextRound_ : pending_.front().round;
  if (!sent_.empty()) first = std::min(first, sent_.front().round);
  GEO_RETURN_IF_ERROR(membership_.announce(first, joined->step));
  return train::JoinResult{joined->step, false};
}

Status Dts::finish(int64_t steps, train::FlatParameters& flat) {
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
  answerable_.clear();
  base_ = torch::Tensor();
  return averageModels(flat, steps);
}

std::optional<train::JobModel> Dts::jobModel() {
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

void Dts::jobModelInto(int64_t lo, torch::Tensor& out) {
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

ParityFingerprint Dts::jobModelFingerprint(const torch::Tensor& like) {
  FingerprintSums sums;
  const std::vector<int64_t> bounds = sliceBounds(like);
  for (size_t k = 0; k + 1 < bounds.size(); ++k) {
    torch::Tensor part = sliceBuffer(2, bounds[k + 1] - bounds[k], like);
    jobModelInto(bounds[k], part);
    sums.add(part.data_ptr<float>(), static_cast<size_t>(part.numel()));
  }
  return sums.fingerprint();
}

void Dts::saveState(torch::serialize::OutputArchive& archive) {
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

Status Dts::loadState(torch::serialize::InputArchive& archive) {
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

torch::Tensor Dts::sliceBuffer(size_t k, int64_t n, const torch::Tensor& values) {
  torch::Tensor& b = slices_[k];
  if (!b.defined() || b.numel() < n || b.device() != values.device()) {
    b = torch::empty({std::max<int64_t>(n, 1)}, values.options());
  }
  return b.narrow(0, 0, n);
}

void Dts::earlySumInto(const Pending& p, int64_t lo, torch::Tensor& out, torch::Tensor& q) {
  out.zero_();
  if (p.earlySum.defined()) out.add_(p.earlySum.narrow(0, lo, out.numel()));
  for (size_t j = 0; j < group_.size(); ++j) {
    if (!p.appliedEarly(j) || p.summed(j) || !p.got[j]) continue;
    q.zero_();
    codec_->decodeAccumulateRange(p.got[j]->payload.bytes(), 1.0f, lo, q);
    out.add_(q, static_cast<float>(group_.weights[j]));
  }
}

torch::Tensor Dts::earlySumOf(const Pending& p, const torch::Tensor& values) {
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

void Dts::init(const train::FlatParameters& flat) {
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

void Dts::placeOn(const torch::Device& device) {
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

std::vector<uint32_t> Dts::presentPeers() const {
  std::vector<uint32_t> to;
  for (size_t i = 0; i < group_.size(); ++i) {
    const uint32_t r = group_.ranks[i];
    if (i != group_.self && !membership_.suspected(r)) to.push_back(r);
  }
  return to;
}

Status Dts::serveAndResend(int64_t t, const train::FlatParameters& flat) {
  sampleUplink();  // every step, and in every wait
  auto served = membership_.serve(t, flat.values, false, &flat);
  if (!served.ok()) return served.status();
  const auto sortUnique = [](std::vector<uint32_t>& v) {
    std::sort(v.begin(), v.end());
    v.erase(std::unique(v.begin(), v.end()), v.end());
  };
  std::vector<uint32_t> to = served->heardAgain;
  to.insert(to.end(), served->resumeAsked.begin(), served->resumeAsked.end());
  sortUnique(to);
  const std::vector<uint32_t> reconnected = madeAnew(*served, to);
  for (uint32_t peer : reconnected) {
    for (const Sent& s : sent_)
      GEO_RETURN_IF_ERROR(sendUpdate({peer}, s.round, s.sendStep, s.bytes));
    if (!sent_.empty() || !pending_.empty()) {
      logger()->info(
          "dts: our connection to {} was made anew while it stayed expected: sending it our "
          "contributions to rounds {}-{} again",
          topology_.describe(peer), sent_.empty() ? pending_.front().round : sent_.front().round,
          pending_.empty() ? sent_.back().round : pending_.back().round);
    }
  }
  to.insert(to.end(), reconnected.begin(), reconnected.end());
  sortUnique(to);
  if (!to.empty() || !served->suspected.empty() || !served->queried.empty()) disturbed();
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

// A connection to a peer made anew while it stayed expected (its listener
// re-made by a key rotation, ours replaced): what the old one held is
// lost, and the peer completes our rounds without it -- those it completed
// since take it late, within their late window (sent_); otherwise its
// model would differ from the others' for good. A contribution it has
// already is ignored.
//
// A peer that comes back is connected to anew too, and on a real network
// our new connection is made after it is heard again: ZeroMQ retries it up
// to 2 s apart, then TCP's and CURVE's handshakes take their round trips.
// A restarted process (it asks to join: queried) takes a peer's state,
// which holds our closed rounds: sent to it, a 20M-parameter model's
// recent rounds were 10 MB each, 7-18 of them dropped at its end while
// they slowed its state's crossing. A peer back from a partition gets
// them, as before. Until the peer says which it is (awaitingResume), the
// resend waits (Connection::resendOnResume); a restart answered before its
// new connection came absorbs that connection's resend
// (Connection::absorbNext).
std::vector<uint32_t> Dts::madeAnew(const Membership::Served& served,
                                    const std::vector<uint32_t>& to) {
  for (uint32_t peer : served.suspected) {
    if (const auto i = group_.indexOf(peer)) {
      Connection& c = connections_[*i];
      c.madeAnewSince = c.resendOnResume = c.absorbNext = false;
    }
  }
  for (uint32_t peer : served.queried) {
    const auto i = group_.indexOf(peer);
    if (!i) continue;
    Connection& c = connections_[*i];
    if (c.madeAnewSince) {
      logger()->debug(
          "dts: {} restarted: its new connection came first; our rounds are not sent to it "
          "again (the state it takes holds them)",
          topology_.describe(peer));
    }
    c.resendOnResume = false;
    c.absorbNext = !c.madeAnewSince;
    c.madeAnewSince = false;
  }
  std::vector<uint32_t> out;
  for (const auto& counters : transport_->peerCounters()) {
    const uint32_t peer = counters.peer;
    const auto i = group_.indexOf(peer);
    if (!i || counters.reconnects <= connections_[*i].reconnectsSeen) continue;
    Connection& c = connections_[*i];
    c.reconnectsSeen = counters.reconnects;
    c.madeAnewSince = true;
    if (c.absorbNext) {
      c.absorbNext = false;
      logger()->debug(
          "dts: {} restarted: our rounds are not sent again over its new connection (the state "
          "it takes holds them)",
          topology_.describe(peer));
    } else if (!membership_.suspected(peer) && !membership_.joining(peer) &&
               !std::binary_search(to.begin(), to.end(), peer)) {
      if (membership_.awaitingResume(peer)) {
        c.resendOnResume = true;
      } else {
        out.push_back(peer);
      }
    }
  }
  for (size_t i = 0; i < group_.size(); ++i) {
    Connection& c = connections_[i];
    const uint32_t peer = group_.ranks[i];
    if (!c.resendOnResume || membership_.awaitingResume(peer)) continue;
    c.resendOnResume = false;
    if (!membership_.suspected(peer) && !membership_.joining(peer)) out.push_back(peer);
  }
  return out;
}

Status Dts::sendFinished(const std::vector<uint32_t>& to) {
  auto bytes = std::make_shared<std::vector<std::byte>>(sizeof nextRound_);
  std::memcpy(bytes->data(), &nextRound_, sizeof nextRound_);
  return sendTo(to, Control::kDtsFinished, jobStep_, CodecId::kRaw, sizeof nextRound_,
                std::move(bytes));
}

void Dts::takeFinished() {
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

void Dts::applyLate(int64_t t, train::FlatParameters& flat) {
  for (Late& l : late_) {
    for (size_t i = 0; i < group_.size(); ++i) {
      if (i == group_.self || l.had[i]) continue;
      auto m = transport_->receive(MessageKind::kUpdate, l.round, group_.ranks[i],
                                   std::chrono::milliseconds(0));
      if (!m.ok()) continue;
      notePeerRound(i, *m);
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
      disturbed();
      stats_.late(true);
      stats_.applied(t - static_cast<int64_t>(m->header.step));
      logger()->info("dts: applied the late update of {} for round {} ({} steps after sending)",
                     topology_.describe(group_.ranks[i]), l.round,
                     t - static_cast<int64_t>(m->header.step));
    }
  }
}

// A large model's state takes seconds to cross (159 MB at 100 Mbit/s:
// 18 s), and the peers train on meanwhile. A joiner that trained on from
// the state's step was that far behind when it announced itself, and the
// peers waited for each of its contributions as it caught up: the others'
// longest step was 17 s on the namespace network (docs/benchmarks.md). So
// the rounds the peers have closed -- any of them has sent us its
// contribution, or a later one; not the live edge, which none has closed
// yet -- are applied here once every peer's contribution is in, as the
// peers completed them without us (the mean of their
// contributions, Σ w_j q_j / Σ w_j in rank order), and we go on from the
// step the last of them closed at, contributing from the round after it;
// the steps in between are not trained here. The peers expect us from
// the round our announcement names (Membership::setServedJoinerAnnounces),
// so none waits for a round we skipped. A peer's contribution to such a
// round is waited for up to the round time-out (it may be a round behind
// the others), and one that does not come ends the catching up there.
// A round of reduce-scatter is replayed by shard (catchUpSharded): each
// live owner's mean of its shard, as the peers applied it, is waited for
// as the contributions are. A change of period or exchange agreed for a
// round is adopted as the round comes up. Only rounds on our schedule's
// grid are replayed: a contribution closed at another step than closeOf
// says (a change of period we have not heard of), or the bitwise-exact
// path ends it where it is. Where the state
// came quickly, a round is caught up on only if a peer a little ahead has
// closed it already (the joiner waits for the others to close it too, a
// few steps). Where every peer has finished, the rounds they closed are
// all past: we catch up to their last, and join() then takes their final
// average from one of them.
StatusOr<int64_t> Dts::catchUp(int64_t step, train::FlatParameters& flat) {
  if (exact()) return step;
  const int64_t from = step;
  const uint64_t firstRound = nextRound_;
  const auto t0 = clock().now();
  // What the inbox holds, read without taking anything: every peer's
  // contributions by round, and the step each closed at.
  struct Seen {
    uint64_t latest = 0;
    bool any = false;
    std::vector<std::optional<uint64_t>> closedAt;  // [peer index]: round r's step
    std::vector<bool> reduced;                      // [owner index]: its shard's mean of r
  };
  const auto look = [&](uint64_t r) {
    Seen seen;
    seen.closedAt.resize(group_.size());
    seen.reduced.assign(group_.size(), false);
    transport_->discard([&](const transport::FrameHeader& h) {
      // A peer's contribution comes whole (kUpdate) or, under
      // reduce-scatter, as its part of this worker's shard (kShard: this
      // worker was joining, so it owns none) and of another lost owner's
      // (kPart); each carries the step the peer closed the round at.
      const bool data = h.kind == MessageKind::kUpdate || h.kind == MessageKind::kShard ||
                        h.kind == MessageKind::kPart || h.kind == MessageKind::kReduced;
      const auto i = data ? group_.indexOf(h.sender) : std::nullopt;
      if (!i || *i == group_.self) return false;
      seen.latest = std::max(seen.latest, h.round);
      seen.any = true;
      if (h.round != r) return false;
      if (h.kind == MessageKind::kReduced) {
        seen.reduced[*i] = true;
      } else {
        seen.closedAt[*i] = h.step;
      }
      return false;
    });
    return seen;
  };
  // Under reduce-scatter, whether the peers applied owner s's mean of its
  // shard of round r (it takes part in r), not one each made from the whole
  // contributions that came (ours, the joiner's, always: we were joining).
  const auto ownerMean = [&](size_t s, uint64_t r) { return s != group_.self && owns(s, r); };
  // The peers whose contributions made round r: those we await, and any
  // other we hear whose contribution to r is here. What this worker
  // expects of a peer follows its resumes, and a restarted worker takes
  // in a burst, after its state, the resumes its peers sent it meanwhile,
  // each naming their open round as they sent it: it expected them only
  // from the last of those, and took 19 rounds they had sent it for caught
  // up on with nothing applied (its model then differed from the job's,
  // 0.033 of its norm, until state parity repaired it).
  const auto madeOf = [&](size_t i, uint64_t r, const Seen& seen) {
    if (i == group_.self) return false;
    if (awaited(i, r)) return true;
    const uint32_t peer = group_.ranks[i];
    return seen.closedAt[i].has_value() && !membership_.suspected(peer) &&
           !membership_.joining(peer) && !(finishedAt_[i] && r >= *finishedAt_[i]);
  };
  while (true) {
    const uint64_t r = nextRound_;
    // A change of period or exchange agreed from round r on is in force
    // for it, as closeRound adopts it when the round before closes: taken
    // as merely agreed, a period doubled from r put r's close at the old
    // grid's step and ended the catching up there (the namespace network:
    // rounds 13-14 left to a joiner of reduce-scatter, whose peers then
    // waited 10 s for its contributions to them).
    takeLagReports(step);
    if (nextSchedule_ && nextSchedule_->round <= r) {
      adopt(*std::exchange(nextSchedule_, std::nullopt), step);
    }
    const int64_t closesAt = closeOf(r);
    Seen seen = look(r);
    // No peer has closed r yet: it is the live edge. A peer has closed it
    // where its contribution (or a later one) is here, or where its last
    // lag report names a later round as its next: the contributions cross
    // behind the state's last parts and the peers' other rounds, and a
    // joiner that took the inbox alone for the edge stopped a round short
    // (the namespace network: rounds 8-8 caught up on, the peers 45 steps
    // on, and they waited 6-8 s for its next contribution).
    const bool reported = std::any_of(paces_.begin(), paces_.end(), [&](const auto& pace) {
      return pace && pace->nextRound > r;
    });
    const bool closed = reported || std::any_of(seen.closedAt.begin(), seen.closedAt.end(),
                                                [](const auto& at) { return at.has_value(); });
    // Where every peer has taken its last step after closing r, r is past
    // though no later round will come: a joiner whose state crossed as the
    // job ended trained on from the live edge instead, 36 steps the others
    // had finished, and they had gone when it reached its final average.
    if (!closed && (!seen.any || seen.latest <= r) && !everyPeerFinished(r)) break;
    // Every awaited peer's contribution to r, on our grid; under
    // reduce-scatter also every live owner's mean of its shard.
    const bool shardedRound = sharded();
    const auto deadline = clock().now() + options_.timeout;
    bool whole = false, offGrid = false;
    while (true) {
      GEO_RETURN_IF_ERROR(serveMembership(step, flat, false));
      takeFinished();  // awaited() reads what the peers closed
      bool missing = false, anyPeer = false;
      for (size_t i = 0; i < group_.size(); ++i) {
        if (!madeOf(i, r, seen)) continue;
        anyPeer = true;
        if (!seen.closedAt[i]) {
          missing = true;
        } else if (static_cast<int64_t>(*seen.closedAt[i]) != closesAt) {
          offGrid = true;
        }
      }
      for (size_t s = 0; shardedRound && s < group_.size(); ++s) {
        const auto [lo, hi] = shard(s);
        if (lo < hi && !seen.reduced[s] && ownerMean(s, r)) missing = true;
      }
      whole = anyPeer && !missing && !offGrid;
      if (whole || offGrid || clock().now() >= deadline) break;
      clock().sleepFor(kPoll);
      seen = look(r);
    }
    if (!whole) break;
    if (shardedRound) {
      std::vector<bool> made(group_.size(), false);
      for (size_t i = 0; i < group_.size(); ++i) made[i] = madeOf(i, r, seen);
      auto applied = catchUpSharded(r, flat, made, seen.reduced);
      if (!applied.ok()) return applied.status();
      if (!*applied) break;  // every contribution refused: not caught up on
      step = closesAt;
      jobStep_ = step;
      nextRound_ = r + 1;
      closeAt_ = closeOf(nextRound_);
      continue;
    }
    // Σ w_j q_j / Σ w_j over the peers' contributions (a refused one is
    // left out, as a completion leaves it out), taken off the model: we
    // made no step of this round.
    torch::Tensor mean = scratch_.take(flat.values).zero_();
    torch::Tensor q = scratch_.take(flat.values);
    double total = 0;
    for (size_t i = 0; i < group_.size(); ++i) {
      if (!madeOf(i, r, seen)) continue;
      auto m = transport_->receive(MessageKind::kUpdate, r, group_.ranks[i],
                                   std::chrono::milliseconds(0));
      if (!m.ok()) continue;  // taken meanwhile: impossible on this thread
      membership_.delivered(group_.ranks[i], r);
      std::string reason;
      if (const Status ok = codec_->decodeChecked(m->payload.bytes(), q, reason); !ok.ok()) {
        reject(group_.ranks[i], fmt::format("the update for round {}", r), reason, ok);
        continue;
      }
      mean.add_(q, static_cast<float>(group_.weights[i]));
      total += group_.weights[i];
    }
    if (total > 0) {
      mean.mul_(static_cast<float>(1.0 / total));
      flat.values.sub_(mean);
      base_.sub_(mean);
      modified_ = true;
      disturbed();
    }
    scratch_.give(std::move(q));
    scratch_.give(std::move(mean));
    if (total == 0) break;  // every contribution refused: not caught up on
    step = closesAt;
    jobStep_ = step;
    nextRound_ = r + 1;
    closeAt_ = closeOf(nextRound_);
  }
  if (nextRound_ > firstRound) {
    parity_.reset(nextRound_);
    discardStale();
    // The last round's contributions came here as its due step came to
    // the peers: they are about their lead past its close, and a
    // contribution of ours to the next round, made from its close, would
    // keep them waiting that long (a 20M-parameter mlp on the namespace
    // network: 5.9 s for 32 steps, the peers 20 ahead). The steps in
    // between are not trained here, as the rounds caught up on were not.
    const int64_t ahead = everyPeerFinished(std::nullopt) ? 0 : peersAheadOf(step);
    logger()->info(
        "dts: caught up on rounds {}-{}, which the job completed while our state crossed: "
        "applied as the peers completed them ({:.2f} s); going on from step {} (the state's "
        "was {}){}",
        firstRound, nextRound_ - 1, since(t0), step + ahead, from,
        ahead > 0 ? fmt::format(", {} steps past the last round's close, where the peers' "
                                "reports put them",
                                ahead)
                  : std::string());
    step += ahead;
  }
  return step;
}

int64_t Dts::peersAheadOf(int64_t closedAt) {
  takeLagReports(closedAt);
  const auto now = clock().now();
  double furthest = static_cast<double>(closedAt);
  for (size_t i = 0; i < group_.size(); ++i) {
    if (i == group_.self || !awaited(i, nextRound_) || !paces_[i] ||
        paces_[i]->completed == kNoRound) {
      continue;
    }
    const Pace& p = *paces_[i];
    // The pace reported is the shortest its rounds may last: the peer is
    // placed as far on as it may be. A joiner placed too far waits for
    // the peers itself; one placed short is waited for by every one.
    const double stepSeconds = p.roundSeconds / static_cast<double>(schedule_.k);
    const double since = std::chrono::duration<double>(now - p.at).count();
    const double ran = stepSeconds > 0 ? std::min(since / stepSeconds, 1e9) : 0;
    furthest = std::max(furthest, static_cast<double>(closeOf(p.completed) + p.lead) + ran);
  }
  const int64_t room = closeOf(nextRound_) - 1 - closedAt;
  return std::clamp<int64_t>(static_cast<int64_t>(furthest) - closedAt, 0,
                             std::max<int64_t>(room, 0));
}

bool Dts::everyPeerFinished(std::optional<uint64_t> afterClosing) {
  takeFinished();
  bool any = false;
  for (size_t i = 0; i < group_.size(); ++i) {
    if (i == group_.self || membership_.suspected(group_.ranks[i])) continue;
    if (!finishedAt_[i] || (afterClosing && *afterClosing >= *finishedAt_[i])) return false;
    any = true;
  }
  return any;
}

void Dts::discardStale() {
  uint64_t keepFrom = nextRound_;
  if (!pending_.empty()) keepFrom = std::min(keepFrom, pending_.front().round);
  if (!late_.empty()) keepFrom = std::min(keepFrom, late_.front().round);
  if (keepFrom == 0) return;
  std::vector<uint32_t> senders;
  std::vector<uint64_t> rounds;
  const size_t n = transport_->discard([&](const transport::FrameHeader& h) {
    const bool roundData = h.kind == MessageKind::kUpdate || h.kind == MessageKind::kShard ||
                           h.kind == MessageKind::kPart || h.kind == MessageKind::kReduced ||
                           h.kind == MessageKind::kRelayed;
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

Status Dts::resendPending() {
  resend_ = false;
  const auto to = presentPeers();
  for (const Sent& s : sent_) GEO_RETURN_IF_ERROR(sendUpdate(to, s.round, s.sendStep, s.bytes));
  for (const Pending& p : pending_) {
    GEO_RETURN_IF_ERROR(sendUpdate(to, p.round, p.sendStep, p.bytes));
  }
  return {};
}

Status Dts::pollArrivals() {
  const auto take = [&](MessageKind kind, uint64_t round, size_t i, std::optional<Message>& into) {
    if (i == group_.self || into) return;
    auto m = transport_->receive(kind, round, group_.ranks[i], std::chrono::milliseconds(0));
    if (!m.ok()) return;
    if (kind == MessageKind::kUpdate || kind == MessageKind::kShard) notePeerRound(i, *m);
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

void Dts::applyEarly(int64_t t, train::FlatParameters& flat) {
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

void Dts::addEarly(const Pending& p, const std::vector<size_t>& now, train::FlatParameters& flat) {
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

Dts::Pending* Dts::pendingRound(uint64_t round) {
  for (Pending& p : pending_) {
    if (p.round == round) return &p;
  }
  return nullptr;
}

void Dts::markEarly(Pending& p, const std::vector<size_t>& who, int64_t t) {
  for (size_t i : who) {
    p.earlyWeight += group_.weights[i];
    p.early[i] = true;
    p.applied(t - static_cast<int64_t>(p.got[i]->header.step));
    stats_.applied(t - static_cast<int64_t>(p.got[i]->header.step));
  }
  if (!who.empty()) modified_ = true;
}

void Dts::launchEarly(std::vector<EarlyRound> rounds, const train::FlatParameters& flat) {
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
          (codec->check(e.payloads[k].bytes(), q, reason).ok() ? e.passed : e.refused).push_back(k);
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

void Dts::takeEarly(int64_t t, train::FlatParameters& flat) {
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

Status Dts::closeRound(int64_t t, train::FlatParameters& flat) {
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
    p.relayedIn.resize(group_.size());
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

Dts::EncodeResult Dts::encodeRound(uint64_t round, const torch::Tensor& x) {
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

Status Dts::settleEncoding() {
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

Status Dts::sendEncoded(EncodeResult r) {
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
  uint64_t acked = 0;  // by every peer: the uplink carries them all
  for (const auto& c : transport_->peerCounters()) acked += c.ackedBytes;
  uplink_.sent(p.sentAt, acked);
  if (!firstRoundSentAt_) firstRoundSentAt_ = p.sentAt;
  lastRoundSentAt_ = p.sentAt;
  stats_.setDelay(delay_);
  if (scheduling() && !finishing_ && uplink_.held()) return choosePeriod(true);
  return {};
}

torch::Tensor Dts::exactMean(Pending& p, int64_t t, const train::FlatParameters& flat,
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

Status Dts::complete(Pending& p, int64_t t, train::FlatParameters& flat, bool* deferred) {
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
    notePeerRound(*i, *m);
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

Status Dts::completed(Pending& p, std::vector<double> lags) {
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
  // measurement; nor is a round sent before a disturbance (the peers
  // learn it from the NaN reported).
  if (!links_.measures(p.round)) lags.assign(lags.size(), std::numeric_limits<double>::quiet_NaN());
  if (measuring() && p.round > 0) {
    GEO_RETURN_IF_ERROR(reportLags(p.round, lags));
    links_.ownLags(p.round, std::move(lags));
  }
  if (auto_) learnTheLink();
  if (scheduling() && !finishing_) GEO_RETURN_IF_ERROR(choosePeriod(false));
  if (!scheduling() && measuring() && !finishing_ && p.round > 0) measureUplinkAtFixedPeriod();
  return {};
}

void Dts::disturbed() {
  if (nextRound_ > 0) links_.disturbed(nextRound_ - 1);
}

bool Dts::deferUntilDue(const Pending& p, int64_t t, geo::Clock::TimePoint t0, bool* deferred) {
  if (deferred == nullptr || !auto_ || everyLinkMeasured()) return false;
  learnTheLink();
  if (p.dueStep <= t) return false;
  noteWait(since(t0));
  *deferred = true;
  return true;
}

uint64_t Dts::parityLateRounds(uint64_t round) const {
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

void Dts::parityRepair(const torch::Tensor& delta, train::FlatParameters& flat) {
  const torch::Tensor d = delta.view_as(flat.values).to(flat.values.device());
  flat.values.add_(d);
  base_.add_(d);
  modified_ = true;
}

std::optional<Dts::Flip> Dts::flipFromEnvironment() {
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

void Dts::injectFlip(int64_t t, train::FlatParameters& flat) {
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

std::unique_ptr<Base> makeDts(const SyncOptions& o, const Topology& t, transport::Transport* tr,
                              Group g) {
  return std::make_unique<Dts>(o, t, tr, std::move(g));
}

}  // namespace geo::sync::detail
