#pragma once
// The decisions of DTS's automatic delay and period (sync.delay: auto,
// sync.period: auto; docs/architecture.md section 3), as pure functions of
// what the synchronizer measured: no clock, no transport, no LibTorch, so
// that each rule is unit-tested on exact inputs. dts.cc measures (lags from
// both ends of each link, ping round trips, compute time per step) and
// applies what these return.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

namespace geo::sync {

// Auto delay: the smallest D, in steps of this worker's compute or of the
// job's pace where that is slower (jobPaceSeconds), that covers the
// slowest link's one-way time: ceil(link / step), within
// [0, maxDelay]. nullopt when there is nothing to go by (no step time yet, or
// no link measured).
std::optional<int64_t> autoDelaySteps(double slowestLinkSeconds, double stepSeconds,
                                      int64_t maxDelay);

// Auto delay before the first lag reports: the slowest link's one-way time
// from ping round trips -- half the smallest recent round trip of each peer
// expected (`minRttSeconds`, one per peer not suspected; <= 0: none yet) --
// or the longest a round was seen crossing (`crossingSeconds`, 0: none seen),
// whichever is longer. nullopt while any peer expected has not answered a
// ping, or when there is none: D from the nearer peers alone made every
// worker wait at the first due step for the farthest one, and "no round
// trip" read as a link of 0 ms made round 0 a barrier across the world.
std::optional<double> linkBeforeReports(std::span<const double> minRttSeconds,
                                        double crossingSeconds);

// One peer expected, as the auto delay sees it: the longest of its recent
// link samples (from both ends' lag reports; nullopt before its first) and
// its smallest recent ping round trip (<= 0: none yet).
struct PeerLink {
  std::optional<double> measuredSeconds;
  double minRttSeconds = -1;
};

// The slowest link D must cover, and whose it is (an index into `peers`).
// `estimated`: the link is linkBeforeReports' over the peers without
// samples yet, and `peer` the one of them with the longest round trip.
struct SlowestLink {
  double seconds = 0;
  size_t peer = 0;
  bool estimated = false;
};

// The slowest of the peers' links: each measured peer by its samples, the
// peers not measured yet together by linkBeforeReports over their round
// trips and `crossingSeconds`. The first reports come from the nearest
// peers: D from them alone (a link of 40 ms where the far peer's rounds
// took 400 ms) made the worker wait at its next due steps for the far
// peer's rounds, 360 ms at a step on the world links. nullopt when nothing
// is known: no peer measured and linkBeforeReports knows nothing. (A peer
// that has not answered a ping yet while others are measured leaves the
// measured ones to stand.)
std::optional<SlowestLink> slowestLink(std::span<const PeerLink> peers, double crossingSeconds);

// The job's pace, in which the auto delay counts its steps: the seconds a
// step takes as this worker lives it over a window of its latest steps,
// its waits for peers included, each step's up to `waitCap` (the link the
// round's D covers). A worker that waits for a slower peer every round (a
// straggler, or on shared cores the workers its core went to) gains
// nothing by running further ahead: the job moves at that peer's pace, and
// a D counted in its own faster steps only makes every contribution older
// when applied. Where no peer is slower the waits are the link's own, D
// grows back to cover it (each wait lengthens the pace by less than the
// steps it shortens D by), and without waits the pace is the step. A wait
// over `waitCap` is not the link's nor the pace's (a suspicion, a
// partition) and counts only up to it, so that one fault does not hold D
// down for the window after it. `steps`: the window's, oldest first; the
// first one's wait is not read. nullopt for fewer than two steps.
struct PaceStep {
  double endSeconds = 0;   // when the step ended (any origin, ascending)
  double waitSeconds = 0;  // what the worker waited since the step before
};
std::optional<double> jobPaceSeconds(std::span<const PaceStep> steps, double waitCap);

// One of a peer's rounds as it reached this worker: when its data had
// arrived (seconds on the clock, any origin) and the step the peer closed
// the round at.
struct PeerStamp {
  double arrivedSeconds = 0;
  int64_t step = 0;
};

// A peer's pace as its rounds reach this worker: the median, over
// consecutive stamps (oldest first, steps ascending), of the seconds between
// their arrivals per step of the peer's between their closes; nullopt for
// fewer than kPeerPaceIntervals intervals. Its own waits are in it, as in
// jobPaceSeconds. The median, not the span: one long gap (a partition, the
// peer's restart) or a burst of rounds that queued behind each other moves
// it by one interval, not by the window.
inline constexpr size_t kPeerPaceIntervals = 3;
std::optional<double> peerPaceSeconds(std::span<const PeerStamp> stamps);

// The peer whose pace (peerPaceSeconds; <= 0: not known) is the median of
// those known -- the upper one of an even count -- as an index into
// `paces`; nullopt when none is known. The auto delay counts in it where
// it is slower than this worker's own pace: a worker whose rounds were not
// due yet never waited, so on shared cores it took the core while the
// others waited, its own steps stayed short (1-3 ms against the job's 30)
// and D counted in them ran up: above 60 steps (up to 131 and 174) for
// 110-130 steps, in two of nine runs of world16 on two cores, and to its
// cap of 256 in an earlier one; every round it closed waited that long to
// be applied. The median, not the slowest peer: a
// worker that waits for a slower peer counts that in its own pace already
// (jobPaceSeconds), and D in the slowest one's steps, below what covers
// the link at the job's pace, made every worker wait more (16.0-16.3
// steps/s against 16.2-17.6 in the same hour, three seeds).
std::optional<size_t> medianPace(std::span<const double> paces);

// A round's transfer time over one link, from the last few one-way link
// times measured at the period in force (oldest first, one per round),
// the link's latency (half its smallest recent ping round trip) and the
// round's length in seconds as the rounds are lived (the time between one
// round leaving and the next, waits included). What a link time holds beyond
// the latency is the round's own transfer plus any queue ahead of it, and
// counting that queue as transfer made K overshoot (a queue built at a
// small K read as a link 30 times too slow). While a queue exists it
// changes by (transfer - round) per round, so then transfer = round +
// that slope; a link time that fits in a round needs no queue to explain
// it and is the transfer itself. Returns -1 without samples.
double roundTransferSeconds(std::span<const double> linkSeconds, double latencySeconds,
                            double roundSeconds);

// The share of a round the uplink may be busy (autoPeriod): at most half,
// so that no queue builds and D covers the latency only.
inline constexpr double kLinkShare = 0.5;
// The share of a step the codec's work may take on the training thread
// (autoPeriod): decoding the round's contributions (and encoding this
// worker's own where that cannot run beside the next step), once a round
// whatever K is, so that its share of a step falls as 1/K. A fifth: the
// 19.9M-parameter mlp (0.4-0.5 s of codec a round on 2 cores, about 220 ms
// steps) reached 85% on the world links at 1 Gbit/s in 40.1 s at K = 8
// (29% of a step in the codec), 26.5 s at 16 (12%) and 28.9 s at 32 (6%);
// on a LAN the link rule alone had gone to K = 1 for it, where the codec
// took 60% of a step.
inline constexpr double kCodecShare = 0.2;

// Auto period: the K a round's transfer time and the codec's work a round
// (`codecRoundSeconds`, on the training thread; 0: not counted) call for,
// or nullopt to keep `current`. K is the smallest power of two whose rounds
// last at least the transfer over kLinkShare and whose codec work a step,
// codecRoundSeconds / K, is at most kCodecShare of the step, at most
// maxPeriod. It grows at once; it shrinks only once what the bounds ask is
// at most half the smaller K (the transfer would fill at most a quarter of
// its rounds; measurements are noisy: no flapping) -- which, the smaller K
// being the smallest that fits, holds only for K = 1: K shrinks to 1 or
// not at all. `stepSeconds` is the step as the worker lives it, its
// synchronizer's work included.
std::optional<int64_t> autoPeriod(double transferSeconds, double stepSeconds, int64_t current,
                                  int64_t maxPeriod, double codecRoundSeconds = 0);

// Which of autoPeriod's two bounds asks more: the codec's work a round
// (true) or the round's transfer.
bool codecBoundsPeriod(double transferSeconds, double codecRoundSeconds);

// Auto period before the lag reports: a round of this worker's seen
// crossing for `crossingSeconds` one way (LinkLedger::crossingSeconds: its
// oldest unacknowledged byte's age less half the ping) took at least that
// less the links' latency (`latencySeconds`: the largest half ping round
// trip) to leave, a lower bound on its transfer. Returns the K autoPeriod()
// takes for that transfer when it is larger than `current`, else nullopt:
// it only raises K (a bound from below says nothing of a smaller K). The
// measured rule needs six rounds of the K in force and a report's trip
// (about 150 steps, 40 s, of a 20M-parameter mlp on the world links at
// 100 Mbit/s), and until then every round of a K too small waits on the
// uplink: the job reached 85% in 57.6 s at the start's K = 16 against
// 43.8 s at K = 32 from the first step.
std::optional<int64_t> periodFromCrossing(double crossingSeconds, double latencySeconds,
                                          double stepSeconds, int64_t current, int64_t maxPeriod);

// A round seen crossing for `crossingSeconds` (periodFromCrossing's), less
// what of it was queue: no longer than the links' latency plus the round's
// `roundBytes` through an uplink known to carry at least
// `uplinkBytesPerSecond` (a bound from below on its rate, so the round's
// transfer is at most that long). `crossingSeconds` itself where the rate
// or the bytes are not known (<= 0). Under reduce-scatter on 2 Mbit/s
// uplinks rounds were seen crossing for 2.4-9.2 s behind the queue the
// earlier ones left, where one takes about 0.6 s, and K went from 16 to
// 512 or 1024 (docs/benchmarks.md).
double crossingWithinUplink(double crossingSeconds, double latencySeconds, double roundBytes,
                            double uplinkBytesPerSecond);

// Auto period for a worker whose uplink held back its last rounds (each
// waited for the previous one to leave): those rounds lasted what the
// uplink needs for one, all peers' updates, `uplinkRoundSeconds`. K is the
// smallest power of two whose rounds of compute last that long, at most
// maxPeriod; nullopt when that is not more than `current`. The uplink may
// then be busy all the time, unlike autoPeriod's half: this is the whole
// round through the uplink, measured directly, and the pacing keeps a
// round from queueing behind more than the one before it. (At twice, K
// went to 64 on a 10 Mbit/s uplink, and 85% came later than at 16 or 32.)
std::optional<int64_t> periodForHeldUplink(double uplinkRoundSeconds, double stepSeconds,
                                           int64_t current, int64_t maxPeriod);

// The factor on the step size when the peers' contributions are
// `stalenessSteps` old as they are applied (DTS with sync.scaleLrWithDelay;
// docs/architecture.md section 3): 1 up to kFullStepDelay steps, then
// kFullStepDelay / staleness, and never below kMinDelayLrScale. A worker's
// model holds its own last D..D+K steps in place of the job's, and each of
// them is taken out again D steps later, when the average replaces it: a
// delayed feedback on the gap between the worker and the job, which a step
// size tuned for no delay drives into oscillation (in a linear model with
// momentum 0.9 the gap grows for curvatures h with lr h above about 0.1 at
// D = 8 and 0.016 at D = 32). Measured (mlp, Fashion-MNIST, 4 regions on the
// emulated world links, staleness ~34, lr 0.05, momentum 0.9, eight seeds):
// half the step reached 85% in 398 steps against 692. At a staleness of 3.4
// (25 ms steps) a step of 0.7-0.8 made no difference five to eight seeds
// could see: the rule leaves the tuned step alone up to 4.
inline constexpr int64_t kFullStepDelay = 4;
inline constexpr double kMinDelayLrScale = 0.5;
double delayLrScale(double stalenessSteps);

// Where a round in flight, sent at `sendStep` and due at `dueStep`, is due
// once the automatic D is `delay`. A round closed before the first D was
// known (`provisional`: due at the cap) is due D after it was sent, or where
// it was if that is sooner. Until every link is measured
// (`linksMeasured`), every round in flight follows D both ways: a D raised
// by a round seen crossing covers them too (they cross the same way), and
// a D that falls as the steps lengthen brings them nearer (the same link
// in longer steps). Raised only, they kept the largest D any step's time
// gave: on shared cores a worker's first steps run on an idle core (1 ms,
// against 10-30 ms once the others compute), and one of sixteen regions
// had its first round due at step 247 (D = 231 at the start, 20 soon
// after): it trained alone for 250 steps and then applied its peers'
// rounds 184 steps old. Once the links are measured a round comes due
// sooner with a smaller D, never later (a larger D is for the rounds sent
// with it): a worker that ran ahead on an idle core, its D counted in its
// own fast steps up to 249, kept its rounds in flight due 249 steps on, so
// it never waited, its steps stayed fast and D stayed up; it ran up to 8 s
// ahead of the job for 190 steps.
int64_t dueStepOnNewDelay(int64_t sendStep, int64_t dueStep, int64_t delay, bool provisional,
                          bool linksMeasured);

// How many steps ahead a change of period is announced: two rounds of the
// period in force plus the links' latency in steps, so that the
// announcement crosses the slowest link before the round it names. The
// two rounds cover a report queued behind a round on a held uplink; a
// worker that hears of a change late closes its round on the new grid
// (dts_schedule.cc, adopt()), so a margin beyond that costs more than it saves:
// with twice the latency, a start at K = 4 on links of 350 ms one way
// held every round back for 130 steps instead of 76.
int64_t periodAnnouncementSteps(int64_t current, double latencySeconds, double stepSeconds);

}  // namespace geo::sync
