// DTS's agreed schedule (dts_impl.h): the automatic period K, delay D and
// exchange, the lag reports they are chosen from, and the uplink's pace.

#include "worker/sync/dts_impl.h"

namespace geo::sync::detail {
namespace {

// More of our data for a peer than one WAN chunk (ZmqTransportConfig's
// wanChunkBytes) still in our own queue: a round's, not a control
// message's (chooseDelay).
constexpr uint64_t kCrossingBacklogBytes = uint64_t{64} << 10;

}  // namespace

uint64_t Dts::roundAt(int64_t s) const {
  if (s >= schedule_.step) {
    return schedule_.round + static_cast<uint64_t>((s - schedule_.step) / schedule_.k);
  }
  const auto back = static_cast<uint64_t>((schedule_.step - s + schedule_.k - 1) / schedule_.k);
  return schedule_.round > back ? schedule_.round - back : 0;
}

void Dts::adopt(const Schedule& e, int64_t t) {
  switch (scheduleAction(e, schedule_, nextSchedule_, nextRound_)) {
    case ScheduleAction::kIgnore: return;
    case ScheduleAction::kAwait: nextSchedule_ = e; return;
    case ScheduleAction::kAdoptNow: break;
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

Status Dts::reportLags(uint64_t round, const std::vector<double>& lags) {
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
    GEO_RETURN_IF_ERROR(
        sendTo({r}, Control::kLagReport, round, CodecId::kRaw, kLagReportBytes, std::move(bytes)));
  }
  return {};
}

bool Dts::takeLagReports(int64_t t) {
  bool any = false;
  for (size_t i = 0; i < group_.size(); ++i) {
    if (i == group_.self) continue;
    for (auto m = receiveControl(*transport_, Control::kLagReport, group_.ranks[i],
                                 std::chrono::milliseconds(0));
         m.ok(); m = receiveControl(*transport_, Control::kLagReport, group_.ranks[i],
                                    std::chrono::milliseconds(0))) {
      if (m->payload.size() != kLagReportBytes) continue;
      any = true;
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
                         m->received, m->header.step};
      }
      if (scheduling()) {
        // The sender's schedule in force (j = 0) and its next (j = 3).
        std::optional<Schedule> reported[2];
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
            reported[j / 3] = Schedule{static_cast<uint64_t>(e[j]), e[j + 1], k, x};
          }
        }
        if (reported[0]) {
          const ReportedSchedules order =
              reportedSchedules(*reported[0], reported[1], schedule_, nextSchedule_, nextRound_);
          if (order.dropAwaited) nextSchedule_.reset();
          adopt(*reported[0], t);
          if (reported[1] && order.takeNext) adopt(*reported[1], t);
        } else if (reported[1]) {
          adopt(*reported[1], t);
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

void Dts::awaitSchedule(int64_t step) {
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

void Dts::noteRoundTrips() {
  // The links' latency without queueing: pings share the uplink's queue
  // with the updates, so a busy link inflates them; the smallest of the
  // recent ones is the path's.
  for (const auto& c : transport_->peerCounters()) {
    const auto i = group_.indexOf(c.peer);
    if (!i || c.minRttSeconds < 0) continue;
    links_.addRtt(*i, c.minRttSeconds);
  }
}

Status Dts::choosePeriod(bool atClose) {
  if (!atClose) ++roundsSinceChange_;
  noteRoundTrips();
  // Decide on measurements of the K in force only: the last four link
  // times are of it six rounds after a change. Sooner where this worker's
  // own uplink held back each of its last two rounds: a round's transfer
  // then takes at least as long as those rounds lasted, known without
  // anyone's report (the links' come a round's completion, D steps, and a
  // report's trip later), and K may grow at once.
  const bool measured = !atClose && periodMeasured();
  const std::optional<double> heldRound = heldRoundTransfer();
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
  std::vector<bool> heard(group_.size());
  for (size_t i = 0; i < group_.size(); ++i) heard[i] = !membership_.suspected(group_.ranks[i]);
  if (!decidesSchedule(heard, group_.self)) return {};  // not the coordinator
  double latency = 0;
  double transfer = measureUplink(measured, latency);
  // Where the uplink's rate is known from rounds it held back, no link
  // needs longer for its copy than the uplink for the whole round: a link
  // measured slower shared the uplink unevenly (TCP's flows to peers at
  // different round trips, one of them after a loss) or waited behind a
  // queue left from before, and a larger K does not make the uplink
  // faster. At K = 128 the copy to oregon read as 4.3 s where the uplink
  // carried a round in 1.0 s, and K went to 1024: 28.2 s to 85% against
  // 17.0 s at K = 128 fixed.
  if (transfer >= 0 && uplink_.heldRate() > 0 && roundUplinkBytes() > 0) {
    transfer = std::min(transfer, roundUplinkBytes() / uplink_.heldRate());
  }
  int64_t chosen = 0;  // the K to change to; 0: K stays
  const char* why = "a round's transfer takes";
  if (!options_.autoPeriod) {
    // The exchange alone is chosen at run time.
  } else if (transfer >= 0) {
    chosen =
        autoPeriod(transfer, stepSeconds_, schedule_.k, options_.maxAutoPeriod, codecRoundSeconds_)
            .value_or(0);
    if (codecBoundsPeriod(transfer, codecRoundSeconds_)) {
      transfer = codecRoundSeconds_;
      why = "encoding and decoding a round take";
    }
  }
  // Not once the uplink's rate is known from rounds it held back: a round
  // seen crossing then waited behind the queue those rounds left, which
  // the pacing holds at about a round, and its time is no bound on a
  // round's transfer (2.5 s read where a round took 1.3 s through the
  // uplink at K = 128, and K went to 512); the held rule above has the
  // transfer itself.
  if (crossed && options_.autoPeriod && !(uplink_.heldRate() > 0)) {
    // Nor for longer than a round's bytes take at the rate the uplink is
    // known to carry at the least (wayRate: what left this machine while
    // it held data back, where no round measured it): the rest waited
    // behind rounds queued before it (crossingWithinUplink).
    const double seen = links_.crossingSeconds();
    const double rate = wayRate();
    const double crossing = crossingWithinUplink(seen, latency, roundUplinkBytes(), rate);
    const bool bounded = crossing < seen;
    const std::optional<int64_t> up =
        periodFromCrossing(crossing, latency, stepSeconds_, schedule_.k, options_.maxAutoPeriod);
    if (bounded && !crossingBoundLogged_) {
      // Once a job, at debug: where the bound kept K from what the crossing
      // alone asked.
      const std::optional<int64_t> unbounded =
          periodFromCrossing(seen, latency, stepSeconds_, schedule_.k, options_.maxAutoPeriod);
      if (unbounded && (!up || *unbounded > *up)) {
        crossingBoundLogged_ = true;
        logger()->debug(
            "dts: a round seen crossing for {:.0f} ms asks K = {}; its {:.0f} KB through the "
            "uplink at the {:.3g} MB/s it carries at the least ({}) take {:.0f} ms: K = {}",
            seen * 1e3, *unbounded, roundUplinkBytes() / 1e3, rate / 1e6,
            uplink_.rate() > 0 ? "measured from the rounds" : "what left while data waited",
            (crossing - latency) * 1e3, up ? *up : schedule_.k);
      }
    }
    if (up && *up > chosen) {
      chosen = *up, transfer = crossing - latency;
      why = bounded ? "a round seen crossing, before the lag reports, bounded by the uplink's "
                      "rate, takes at least"
                    : "a round seen crossing, before the lag reports, takes at least";
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
    // heldRoundTransfer: the longer of the two held rounds (their mean went
    // to K = 32 of 12 ms steps for a 450 ms transfer), or less where the
    // rate the peers acknowledged says the uplink carries a round faster.
    const double uplink = *heldRound;
    const auto up = periodForHeldUplink(uplink, stepSeconds_, schedule_.k, options_.maxAutoPeriod);
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
  const int64_t ahead = periodAnnouncementSteps(schedule_.k, latency,
                                                roundSeconds() / static_cast<double>(schedule_.k));
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
    logger()->info("dts: exchange {} with K = {} from round {} (after step {}), was {} with K = {}",
                   exchangeName(exchange), k, next.round, next.step,
                   exchangeName(schedule_.exchange), schedule_.k);
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

double Dts::measureUplink(bool measured, double& latency) {
  double transfer = -1;
  latency = 0;
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
  return transfer;
}

void Dts::measureUplinkAtFixedPeriod() {
  // A fixed K (and exchange) never changes: its rounds are measured from
  // the sixth on, as choosePeriod measures the K in force.
  ++roundsSinceChange_;
  noteRoundTrips();
  if (!periodMeasured()) return;
  double latency = 0;
  measureUplink(true, latency);
}

std::optional<double> Dts::heldRoundTransfer() const {
  const std::optional<double> held = uplink_.heldRoundSeconds();
  if (!held) return std::nullopt;
  const std::optional<double> rate = uplink_.heldBytesPerSecond();
  const double bytes = roundUplinkBytes();
  if (!rate || !(bytes > 0)) return held;
  return std::min(*held, bytes / *rate);
}

ExchangeInputs Dts::exchangeInputs(double latency) const {
  ExchangeInputs in;
  in.group = static_cast<double>(group_.size());
  in.peersOut = in.group - 1;
  in.payloadBytes = static_cast<double>(uplink_.lastRoundBytes());
  in.uplinkBytesPerSecond = uplink_.bytesPerSecond();
  // Where the uplink held the last rounds back, a round's bytes took
  // as long as heldRoundTransfer says: the rate itself, where the slowest
  // link's transfer only bounds it from above (1.87 MB/s read on an
  // uplink of 1 MB/s).
  if (const std::optional<double> held = heldRoundTransfer(); held && *held > 0) {
    const double rate = roundUplinkBytes() / *held;
    if (rate > 0 && (in.uplinkBytesPerSecond <= 0 || rate < in.uplinkBytesPerSecond)) {
      in.uplinkBytesPerSecond = rate;
    }
  }
  in.latencySeconds = latency;
  in.codecPayloadSeconds = codecPayloadSeconds();
  return in;
}

ExchangeVerdict Dts::exchangeVerdict(const ExchangeInputs& in) const {
  DtsPolicy policy;
  policy.autoPeriod = options_.autoPeriod;
  policy.period = options_.autoPeriod ? options_.period : schedule_.k;
  policy.delay = options_.delay;
  policy.maxAutoPeriod = options_.maxAutoPeriod;
  policy.maxAutoDelay = options_.maxAutoDelay;
  return chooseExchange(in, stepSeconds_, policy, schedule_.exchange);
}

uint64_t Dts::furthestPeerRound() const {
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

Status Dts::awaitUplink(int64_t t, train::FlatParameters& flat) {
  if (uplink_.lastRoundBytes() == 0) return {};
  const auto t0 = clock().now();
  const double round = roundSeconds();
  std::vector<PeerQueue> queues;
  const auto backlogged = [&] {
    queues.clear();
    for (const auto& c : transport_->peerCounters()) {
      // Not for a peer whose resume we await: it does not count on our
      // rounds until then, and gets them again from the one our resume
      // names. A tokyo throttled to 32 kbit/s, told by every peer that it
      // was suspected, held its training thread up to 10.9 s for rounds
      // nobody waited for; it resumed that far behind, and the others
      // waited as long for its rounds to catch up.
      if (!group_.indexOf(c.peer) || membership_.suspected(c.peer) ||
          membership_.awaitingResume(c.peer)) {
        continue;
      }
      queues.push_back({c.backlogBytes, c.minRttSeconds, c.unackedSeconds, c.sinceAckSeconds,
                        transport_->queuedBelowBytes(c.peer)});
    }
    return uplinkHoldsRound(queues, uplink_.lastRoundBytes(), round);
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

void Dts::noteCodecRound() {
  const double total = stats_.codecSeconds() + decodedBeside_.seconds - decodedBeside_.waited;
  if (codecAtClose_ >= 0) {
    const double round = std::max(0.0, total - codecAtClose_);
    codecRoundSeconds_ = codecRoundSeconds_ <= 0 ? round : 0.7 * codecRoundSeconds_ + 0.3 * round;
  }
  codecAtClose_ = total;
}

void Dts::learnTheLink() {
  const int64_t before = delay_;
  if (!chooseDelay()) return;
  // (Each worker completes a round when its own D says; the corrections
  // still sum to zero.)
  const bool measured = everyLinkMeasured();
  for (Pending& p : pending_) {
    if (!p.provisionalDue && delay_ == before) continue;
    p.dueStep = dueStepOnNewDelay(p.sendStep, p.dueStep, delay_, p.provisionalDue, measured);
    p.provisionalDue = false;
  }
}

bool Dts::everyLinkMeasured() const {
  for (size_t i = 0; i < group_.size(); ++i) {
    if (i == group_.self || links_.measured(i)) continue;
    if (!membership_.suspected(group_.ranks[i])) return false;
  }
  return true;
}

double Dts::paceSeconds() const {
  if (paceSteps_.size() < kPaceMinSteps) return 0;
  const std::vector<PaceStep> steps(paceSteps_.begin(), paceSteps_.end());
  return jobPaceSeconds(steps, coveredLinkSeconds_).value_or(0);
}

void Dts::notePeerRound(size_t peer, const Message& m) {
  if (peerStamps_.size() < group_.size()) peerStamps_.resize(group_.size());
  std::deque<PeerStamp>& stamps = peerStamps_[peer];
  const auto step = static_cast<int64_t>(m.header.step);
  // A round that closed before the latest one taken (a resent or reordered
  // round, a restarted peer's first ones) says nothing of the pace since.
  if (!stamps.empty() && step <= stamps.back().step) return;
  stamps.push_back({std::chrono::duration<double>(m.received.time_since_epoch()).count(), step});
  while (stamps.front().step < step - static_cast<int64_t>(paceWindow())) stamps.pop_front();
}

std::pair<double, size_t> Dts::peersPaceSeconds() const {
  std::vector<double> paces(peerStamps_.size(), 0);
  for (size_t i = 0; i < peerStamps_.size(); ++i) {
    if (i == group_.self || membership_.suspected(group_.ranks[i])) continue;
    const std::vector<PeerStamp> stamps(peerStamps_[i].begin(), peerStamps_[i].end());
    paces[i] = peerPaceSeconds(stamps).value_or(0);
  }
  const std::optional<size_t> median = medianPace(paces);
  if (!median) return {0, group_.self};
  return {paces[*median], *median};
}

bool Dts::chooseDelay() {
  // Each expected peer's link: from the pairs' measurements where it has
  // some, else from its ping round trip and the rounds seen crossing
  // (slowestLink).
  std::vector<PeerLink> peers;
  std::vector<size_t> indices;  // their group indices
  for (const auto& c : transport_->peerCounters()) {
    const auto i = group_.indexOf(c.peer);
    if (!i || *i == group_.self) continue;
    if (membership_.suspected(c.peer)) {
      if (*i < peerStamps_.size()) peerStamps_[*i].clear();
      continue;
    }
    PeerLink l;
    l.minRttSeconds = c.minRttSeconds;
    if (links_.measured(*i)) {
      l.measuredSeconds = links_.longestSample(*i);
    } else if (c.minRttSeconds > 0 && c.sinceAckSeconds >= 0 &&
               c.sinceAckSeconds < c.minRttSeconds + 1.0 && firstRoundSentAt_) {
      // A round still crossing to a peer not measured yet: its oldest
      // byte not yet acknowledged left unackedSeconds ago, so the way
      // there takes at least that less the acknowledgement's way back. A
      // 10 MB round over 100 Mbit/s took 2.3 s where the ping said
      // 115 ms, and the first lag reports came 26 s into the run: every
      // round until then was waited for. Only while acknowledgements keep
      // coming (the data moves; a cut link's silence says nothing of its
      // length), and only data sent since our first round left: the start's
      // control messages wait for peers still starting (on two cores, the
      // last of four loads its libraries seconds after the first), and
      // read as a round crossing for 2.1 s before any round had left, D
      // went to 138 steps at 15 ms. The longest seen holds until the
      // reports come: the next round crosses the same way. (The minimum
      // round trip: the first pings of a job wait behind connection set-up
      // and slow start.)
      if (c.unackedSeconds > c.minRttSeconds && c.unackedSeconds <= since(*firstRoundSentAt_)) {
        links_.sawCrossing(c.unackedSeconds - c.minRttSeconds / 2);
      }
      // What has not even been handed on yet: a round's chunks leave our
      // queue only as ZeroMQ's pipe (64 of them) and the kernel's socket
      // buffer, small on a young connection, take them, so the oldest
      // byte handed on is younger than the round, and the rounds of a
      // 20M-parameter mlp (10 MB to each of three peers over 100 Mbit/s,
      // namespace network) read 2.5 s crossing where the reports then
      // measured 3.5-4.4: its first four rounds were waited for, up to 4.2
      // s each. While more than a chunk of ours for the peer still waits
      // here, the latest round's last byte has not left (the queue is in
      // order), so that round has been crossing at least since it was
      // sent. Not for a joiner, whose queue holds our state, sent after
      // the round. For D only (LinkLedger::sawQueuedCrossing).
      if (c.backlogBytes > kCrossingBacklogBytes && lastRoundSentAt_ &&
          !membership_.joining(c.peer) && since(*lastRoundSentAt_) > c.minRttSeconds) {
        links_.sawQueuedCrossing(since(*lastRoundSentAt_) - c.minRttSeconds / 2);
      }
    }
    peers.push_back(l);
    indices.push_back(*i);
  }
  const std::optional<SlowestLink> slowest = slowestLink(peers, links_.delayCrossingSeconds());
  const double link = slowest ? slowest->seconds : -1;
  if (slowest && !slowest->estimated) stats_.setLink(link);
  // Under reduce-scatter a round takes two hops, a part to its owner and
  // the owner's mean on: D covers twice the slowest link (the slowest
  // pair's round trip, for links alike both ways).
  const double covered = sharded() && link > 0 ? 2 * link : link;
  if (covered > 0) coveredLinkSeconds_ = covered;
  // D counts in steps of the job's pace where this worker waits for slower
  // peers (jobPaceSeconds), or of the peers' median pace where that is
  // slower still (medianPace: this worker runs ahead of the job without
  // waiting yet), else in its own.
  const double pace = paceSeconds();
  const auto [peersPace, pacePeer] = peersPaceSeconds();
  const double step = std::max({stepSeconds_, pace, peersPace});
  const std::optional<int64_t> chosen = autoDelaySteps(covered, step, options_.maxAutoDelay);
  if (chosen) linkKnown_ = true;
  const int64_t next = chosen.value_or(std::clamp<int64_t>(delay_, 0, options_.maxAutoDelay));
  if (next != delay_) {
    // Small moves (jitter) go to the debug log; real changes to info.
    const std::string whose =
        slowest ? topology_.describe(group_.ranks[indices[slowest->peer]]) : std::string();
    const bool notable = std::abs(next - loggedDelay_) >= std::max<int64_t>(2, loggedDelay_ / 4);
    logger()->log(notable ? spdlog::level::info : spdlog::level::debug,
                  "dts: delay D = {} steps (was {}): slowest link {:.0f} ms one way ({}){}, step "
                  "time {:.1f} ms{}",
                  next, delay_, link * 1e3,
                  !slowest              ? std::string("nothing known of the links")
                  : !slowest->estimated ? fmt::format("to {}", whose)
                  : link == links_.delayCrossingSeconds()
                      ? fmt::format("a round seen crossing, before {}'s first reports", whose)
                      : fmt::format("half the ping round trip, before {}'s first reports", whose),
                  sharded() ? ", twice over (reduce-scatter)" : "", step * 1e3,
                  peersPace > std::max(stepSeconds_, pace)
                      ? fmt::format(" ({}'s pace as its rounds arrive; {:.1f} ms between ours)",
                                    topology_.describe(group_.ranks[pacePeer]),
                                    std::max(stepSeconds_, pace) * 1e3)
                  : pace > stepSeconds_
                      ? fmt::format(" (the job's pace, waits for slower peers included; {:.1f} "
                                    "ms between them)",
                                    stepSeconds_ * 1e3)
                      : std::string());
    if (notable) loggedDelay_ = next;
    delay_ = next;
  }
  stats_.setDelay(delay_);
  return linkKnown_;
}

}  // namespace geo::sync::detail
