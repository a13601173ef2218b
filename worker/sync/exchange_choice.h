#pragma once
// How a DTS round's contributions meet (sync.exchange), as a cost model
// that both `geotrain plan` and the workers' own choice at run time
// (sync.exchange: auto) use: one set of formulas, so that what the planner
// predicts for a job is what its coordinator decides on. Pure functions of
// what is known or measured (no clock, no transport, no LibTorch), unit-
// tested on exact inputs (exchange_choice_test).
//
// All-gather: every worker's whole contribution to every peer, one hop,
// N - 1 payloads up each uplink a round, every contribution decoded.
// Reduce-scatter: each worker's shard s to the worker that owns it, and the
// owner's mean of its shard to every peer, 2 (N - 1) / N payloads over two
// hops, about four payloads of codec work whatever N is
// (docs/algorithms.md, "Reduce-scatter").

#include <cstdint>
#include <optional>
#include <string_view>
#include <tuple>
#include <vector>

namespace geo::sync {

enum class Exchange : uint8_t { kAllGather = 0, kReduceScatter = 1 };

// "allgather" or "reducescatter": the sync.exchange values.
std::string_view exchangeName(Exchange e);

// What a round involves for one worker of the group that runs DTS
// together (every worker, or the region leaders under hierarchical sync).
struct ExchangeInputs {
  double group = 0;                 // G: the workers of the DTS group, this one included
  double peersOut = 0;              // the peers each payload crosses the WAN to (G - 1 at most)
  double payloadBytes = 0;          // one contribution, encoded, with its frames
  double uplinkBytesPerSecond = 0;  // <= 0: unknown, or not what limits
  double latencySeconds = 0;        // the slowest link, one way
  double codecPayloadSeconds = 0;   // one payload encoded or decoded, on this worker's cores
  // Payloads decoded a round besides the group's (a hierarchical leader's
  // region members).
  double lanDecodes = 0;
  bool wan = true;  // false: one region, no WAN crossing at all
};

// A round's cost under one exchange.
struct RoundShape {
  double roundUplink = 0;    // the round's bytes through the uplink, seconds
  double roundLink = 0;      // until its last byte has arrived where it is needed
  double bytesPerRound = 0;  // up this worker's uplink
  double codecRound = 0;     // encoding and decoding, seconds of this worker's cores
  double group = 0;  // G: the models a round averages (what its staleness costs grows with G)
};

// All-gather: the uplink carries peersOut payloads; the last byte arrives
// a latency after they have left; 1 + (G - 1) + lanDecodes payloads of
// codec work. Reduce-scatter: 2 peersOut / G payloads; two latencies (the
// slowest part's trip to its owner and the mean's trip on); 4 + lanDecodes
// payloads of codec work.
RoundShape roundShape(Exchange e, const ExchangeInputs& in);

// DTS at period K and delay D over a round of `shape`, for a worker whose
// step computes for `computeSeconds` (its synchronous work included; the
// codec's and the uplink's shares are added here).
struct DtsCost {
  int64_t period = 1;
  int64_t delay = 0;
  double uplinkStep = 0;   // the uplink's share of a step: roundUplink / K
  double codecStep = 0;    // the codec's: codecRound / K
  double waitStep = 0;     // what a round still needs at its due step, a step's share
  double stepSeconds = 0;  // max(compute + codec, uplink) + wait
  double stepsFactor = 1;  // steps to a target against allreduce fp32 (dtsStepsFactor at G)
  bool extrapolated = false;
  // The time one of the reference run's steps to the target costs here.
  double secondsPerReferenceStep() const { return stepSeconds * stepsFactor; }
};

// `delay`: D fixed, or nullopt for the automatic D (autoDelaySteps of the
// round's link, in steps of the compute or the uplink's share, within
// maxAutoDelay).
DtsCost dtsCost(const RoundShape& shape, double computeSeconds, int64_t period,
                std::optional<int64_t> delay, int64_t maxAutoDelay);

// The K the automatic period settles on for rounds of `shape`: its rules
// (autoPeriod for a link that carries a round in time, with the codec's
// work a round at most kCodecShare of a step; periodForHeldUplink where it
// cannot) applied from `start` until they keep K.
int64_t settledPeriod(const RoundShape& shape, double computeSeconds, int64_t start,
                      int64_t maxAutoPeriod);

// Steps to the target relative to allreduce fp32 (of as many workers) at
// a staleness of `staleness` steps among `group` workers averaged, from
// two measured curves (docs/benchmarks.md, the mlp to 85%): four workers'
// (the ten-seed batch) and sixteen workers' (a fixed D at K = 16, two
// seeds). A step of staleness costs more where more workers average: the
// allreduce it is held against moves further a step. Linear in the
// staleness between a curve's points and on along its last slope beyond
// them; between four and sixteen workers, the two curves weighted by
// log2(G / 4) / 2; under four, four workers' curve; over sixteen,
// sixteen's. `extrapolated` is set beyond a curve's last point or over
// sixteen workers.
double dtsStepsFactor(double staleness, double group, bool* extrapolated = nullptr);

// How DTS's period and delay are set for the comparison.
struct DtsPolicy {
  bool autoPeriod = true;
  int64_t period = 16;  // the fixed K, or where the automatic one starts
  std::optional<int64_t> delay;
  int64_t maxAutoPeriod = 1024;
  int64_t maxAutoDelay = 1024;
};

// Both exchanges costed for the same job, and which one to run.
struct ExchangeVerdict {
  DtsCost allGather;
  DtsCost reduceScatter;
  Exchange choice = Exchange::kAllGather;
};

// A change of exchange costs a round of mixed traffic and the measurements
// of the old one: the other must promise at least this much less time to
// the target (a fifth) before the workers move.
inline constexpr double kExchangeMargin = 0.8;

// Both exchanges' costs, and the one whose time to the target is shorter
// by kExchangeMargin than `current`'s (else `current`). Fewer than three
// in the group: all-gather (two workers send each other the same bytes
// either way, and reduce-scatter takes a hop more).
ExchangeVerdict chooseExchange(const ExchangeInputs& in, double computeSeconds,
                               const DtsPolicy& policy, Exchange current);

namespace detail {

// The period and exchange in force from a round on: round `round` closes at
// step `step`, and every K steps after it. How its rounds' contributions
// meet (sync.exchange; a fixed exchange throughout, or under `auto` whichever
// the workers last agreed on).
struct DtsSchedule {
  uint64_t round = 0;
  int64_t step = 0;
  int64_t k = 1;
  Exchange exchange = Exchange::kAllGather;
};

// Which of two schedules wins: the later change, then the larger K, then
// reduce-scatter (two coordinators on both sides of a suspicion may each
// have chosen one).
inline bool newerSchedule(const DtsSchedule& a, const DtsSchedule& b) {
  const auto key = [](const DtsSchedule& x) {
    return std::tuple(x.round, x.k, x.step, static_cast<uint8_t>(x.exchange));
  };
  return key(a) > key(b);
}

// What a worker does with a change of schedule it hears of (from the
// coordinator's lag reports): kIgnore where the schedule in force, or the
// one it waits for, wins over it (newerSchedule); kAwait where the change's
// first round is still ahead of `nextRound` (the first round this worker
// has not opened): it waits in place of any older one; kAdoptNow where this
// worker has opened that round already, and realigns at once. So every
// worker ends on the later of two coordinators' changes in whatever order
// they arrive: before, a worker that held the later one and heard the
// earlier one after opening its round took the earlier one at once -- and
// exchanged four rounds by reduce-scatter that the others exchanged by
// all-gather, waiting the 60 s round time-out for each (two coordinators
// either side of a suspicion, a 2 Mbit/s uplink; docs/benchmarks.md).
enum class ScheduleAction { kIgnore, kAwait, kAdoptNow };
inline ScheduleAction scheduleAction(const DtsSchedule& heard, const DtsSchedule& current,
                                     const std::optional<DtsSchedule>& awaited,
                                     uint64_t nextRound) {
  if (!newerSchedule(heard, current)) return ScheduleAction::kIgnore;
  if (awaited && !newerSchedule(heard, *awaited)) return ScheduleAction::kIgnore;
  return heard.round > nextRound ? ScheduleAction::kAwait : ScheduleAction::kAdoptNow;
}

// A lag report carries two schedules: the one in force at its sender
// (`sendersCurrent`) and the sender's next change (`sendersNext`; none
// announced: nullopt). The second continues the first: a worker that does
// not have the first in force yet must take it before the second, or it
// numbers the rounds between them on the old grid. A worker restarted
// while the job had K = 32 from round 5 heard, before its state came,
// K = 32 from round 5 (awaited: it was at round 0), then K = 64 from round
// 13 (newer, so it replaced the awaited one), and once the state of step
// 183 came it could no longer take K = 32 (older than the awaited one):
// it closed its rounds every 16 steps where the others did every 32, and
// its catching up, its first contributions and its peers' waits for them
// were all a grid apart (the others' longest step 10.1 s on the namespace
// network). `inForce` and `awaited` are the worker's; `nextRound` the first
// round it has not opened. dropAwaited: the awaited change is the sender's
// next, and goes until the sender's current one is in force; takeNext:
// hand the sender's next to scheduleAction after its current one (not
// while the current one is still to come: the reports repeat it). Two
// coordinators' changes either side of a suspicion each come as a next
// over the schedule they both had in force, and scheduleAction still picks
// the later.
struct ReportedSchedules {
  bool dropAwaited = false;
  bool takeNext = true;
};
inline bool sameSchedule(const DtsSchedule& a, const DtsSchedule& b) {
  return a.round == b.round && a.step == b.step && a.k == b.k && a.exchange == b.exchange;
}
inline ReportedSchedules reportedSchedules(const DtsSchedule& sendersCurrent,
                                           const std::optional<DtsSchedule>& sendersNext,
                                           const DtsSchedule& inForce,
                                           const std::optional<DtsSchedule>& awaited,
                                           uint64_t nextRound) {
  ReportedSchedules out;
  const bool currentAhead = newerSchedule(sendersCurrent, inForce);
  out.dropAwaited = currentAhead && sendersNext && awaited && sameSchedule(*awaited, *sendersNext);
  const bool awaitsCurrent = !out.dropAwaited && awaited && sameSchedule(*awaited, sendersCurrent);
  const bool currentToCome = currentAhead && (sendersCurrent.round > nextRound || awaitsCurrent);
  out.takeNext = sendersNext.has_value() && !currentToCome;
  return out;
}

// Whether the worker at group index `self` decides the job's schedule (the
// automatic period and exchange), `heard[i]` saying whether it hears
// member i (not suspected; its own entry is ignored): the lowest-ranked
// member it hears, and only where it hears more than half of the group,
// itself included. A worker cut off from most of the job decided alone
// before: a tokyo whose uplink was throttled to 32 kbit/s for 8 s, still
// heard by oregon, raised K from 16 to 256 from its own held rounds. Its
// change, the latest, won wherever it was heard (newerSchedule): oregon
// renumbered its rounds at once, and london and ohio, which learned of it
// only from oregon's next report, waited 16-34 s for oregon's rounds under
// the old numbering (the namespace network, docs/benchmarks.md). Among two
// or four workers a cut into halves leaves the schedule as it is until
// they hear each other.
inline bool decidesSchedule(const std::vector<bool>& heard, size_t self) {
  size_t count = 1;
  for (size_t i = 0; i < heard.size(); ++i) {
    if (i == self || !heard[i]) continue;
    if (i < self) return false;  // a lower-ranked member decides
    ++count;
  }
  return 2 * count > heard.size();
}

}  // namespace detail

}  // namespace geo::sync
