#pragma once
// DTS's uplink pacing, one of its seams (docs/architecture.md section 3): a
// round leaves only once the uplink has taken the previous one, and what the
// rounds' pace says of the link -- the length of a round as lived, whether
// the uplink held the last rounds back, the rate it carried them at. No
// LibTorch and no transport: dts.cc feeds it what it measures and the
// transport's per-peer counters, and it is unit-tested on exact inputs
// (uplink_pace_test).

#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <span>
#include <string>

#include "common/clock.h"

namespace geo::sync {

// What the transport reports of the data queued for one peer: the fields
// of transport::PeerCounters with the same names.
struct PeerQueue {
  uint64_t backlogBytes = 0;    // held back by the transport itself
  double minRttSeconds = -1;    // the smallest recent ping round trip; < 0: none yet
  double unackedSeconds = 0;    // age of the oldest data the peer has not acknowledged
  double sinceAckSeconds = -1;  // since the peer's latest acknowledgement; < 0: none yet
  uint64_t belowBytes = 0;  // handed on, not yet left this machine (Transport::queuedBelowBytes)
};

// Whether a whole round of `roundBytes` still waits for a peer ahead of the
// uplink, rounds lasting `roundSeconds` each. Either a round's bytes or
// more have not left this machine: held back by the transport itself (its
// emulated uplink, or what ZeroMQ has not yet taken) and, where the kernel
// says, in ZeroMQ's pipe and the kernel's send buffer behind what is on
// the path (on 2 Mbit/s uplinks the peers' acknowledgements, thin flows
// across their own saturated uplinks, came 2-5 s late: the rule below did
// not hold, rounds of K = 16 went out five times faster than the uplink
// carried them, and the queue they left read as a link of 9 s); or, below
// the transport (a socket buffer that took the bytes
// at once, a real uplink's queue), the oldest data the peer has not
// acknowledged left more than a round trip and two rounds ago (one for the
// acknowledgement's own way back, behind the peer's uplink) while
// acknowledgements keep coming. When they stop (their own packets lost at a
// full queue, TCP backing off), their silence says nothing of the data's
// queue: holding on it stalled every worker for 5-6 s at a saturated uplink.
bool roundStillQueued(const PeerQueue& queue, uint64_t roundBytes, double roundSeconds);

// Whether this worker's uplink holds its next round back: a round still
// queued (roundStillQueued) for more than half of `queues`, the peers its
// rounds go to. A shared uplink that cannot keep up queues the rounds for
// every peer alike; a round queued for a few peers only is their links' (a
// link cut while the rest of the WAN carries on, a slow path), which the
// rounds' completion waits for and suspicion cuts out. Held for those, a
// worker kept its next round from every other peer until the one cut off
// was suspected: on world16's links, with only the link between tokyo and
// sydney cut, one of the two held a round 2.2 s, and the fourteen others
// waited for it (docs/benchmarks.md).
bool uplinkHoldsRound(std::span<const PeerQueue> queues, uint64_t roundBytes, double roundSeconds);

// The uplink's rate from what left this machine while it held data back,
// for every algorithm and every K: what the final average chooses its way
// by where no round measured the rate (UplinkPace needs two rounds held
// back in a row, or six rounds of lag reports at one K). Without it a
// worker read a 2 Mbit/s uplink as not measured and took the final average
// whole at the 1 Gbit/s assumed: 32-45 s where reduce-scatter takes about
// 10 (docs/benchmarks.md).
//
// Sampled now and then (sample()): the bytes that have left this machine
// towards its peers in all, and the bytes still queued on it (in the
// transport, ZeroMQ's pipe, the kernel's send buffer). Over an interval
// that began with at least kBusyBytes queued, the path -- not this
// worker's own pace -- decided how fast the bytes left, or they all left
// within it: either way their count is at most what the path carries in
// that time, and one queue's worth below the kernel's count (a router's or
// an emulated link's: what TCP's window put there counts as left) once
// per busy spell. So the rate is all but a bound from below: the uplink's
// where it is the limit, less where a window, a slow start or a queue that
// ran dry within the interval is, which errs toward the ways of the final average
// that save bytes (a hop or two of cost) where the opposite error cost
// tens of seconds. Not a rate to pace by: too low, it would hold copies
// back that a fast uplink carries at once. Intervals longer than
// kLongestGap are not counted. The rate is the bytes over the busy time of
// the whole job, so that a burst or a slow start weighs by its share of it.
class BusyUplinkRate {
 public:
  // Bytes queued at an interval's start for it to count.
  static constexpr uint64_t kBusyBytes = 16 * 1024;
  // The longest interval between samples that counts, seconds.
  static constexpr double kLongestGap = 1.0;
  // Busy time and bytes before a rate is given: less says more of a
  // round trip's or a burst's timing than of the uplink.
  static constexpr double kMinBusySeconds = 1.0;
  static constexpr uint64_t kMinBusyBytes = 64 * 1024;

  // A sample at `at`: `leftBytes` have left this machine in all
  // (PeerCounters::bytesSent less Transport::queuedBelowBytes, summed over
  // the peers), `queuedBytes` have not (backlogBytes plus queuedBelowBytes,
  // summed). A counter that went back (a transport replaced) restarts the
  // count from this sample.
  void sample(geo::Clock::TimePoint at, uint64_t leftBytes, uint64_t queuedBytes);
  // Bytes per second over the busy time; 0 until kMinBusySeconds and
  // kMinBusyBytes of it.
  double bytesPerSecond() const;
  double busySeconds() const { return busySeconds_; }

 private:
  struct Sample {
    geo::Clock::TimePoint at;
    uint64_t left = 0, queued = 0;
  };
  std::optional<Sample> last_;
  double busySeconds_ = 0;
  uint64_t busyBytes_ = 0;
};

// The rounds' pace as this worker lives it. Not thread-safe (the training
// thread's).
class UplinkPace {
 public:
  // `window`: the recent round intervals kept (at the period in force).
  explicit UplinkPace(size_t window) : window_(window) {}

  // The latest round's encoded bytes (0 before the first round).
  void encoded(uint64_t bytes) { lastRoundBytes_ = bytes; }
  uint64_t lastRoundBytes() const { return lastRoundBytes_; }

  // Whether the wait before the latest round (for roundStillQueued) held it.
  void setHeld(bool held) { held_ = held; }
  bool held() const { return held_; }

  // A round left at `at`, when the peers had acknowledged `ackedBytes` of
  // this worker's data in all (PeerCounters::ackedBytes summed; 0 where the
  // transport does not say): the interval since the previous one joins the
  // window, marked with held(), with the bytes acknowledged during it.
  void sent(geo::Clock::TimePoint at, uint64_t ackedBytes = 0);

  // The period changed: the intervals of the old one say nothing of it.
  void periodChanged() { intervals_.clear(); }

  // A round's length as it is lived: the mean of the recent intervals
  // between rounds sent, waits for the uplink and for peers included; `k`
  // steps of `stepSeconds` before there are any. The queue ahead of a round
  // grows by its transfer less this, not less K compute steps: under pacing
  // the rounds stretch to the uplink and the queue stays put, which K x step
  // time read as a transfer of one round's compute (71 ms for the 280 ms
  // that 10 Mbit/s takes), K then a quarter of what the link needs.
  double roundSeconds(int64_t k, double stepSeconds) const;

  // Whether each of the last two rounds waited for the uplink: a round's
  // transfer then takes at least as long as they lasted, known without any
  // peer's report. heldRoundSeconds() is the longer of the two (the queue
  // reaches its steady state only in the second round held back; the
  // first is shorter by up to a round's compute); nullopt unless both were.
  std::optional<double> heldRoundSeconds() const;

  // The uplink's rate while it held the last two rounds back: the bytes the
  // peers acknowledged over those two intervals, per second. The uplink was
  // busy throughout them (each ended with a round still queued), so this is
  // what it carries, whatever it had queued before: the intervals
  // themselves (heldRoundSeconds) also hold the draining of a queue left by
  // an earlier, smaller K -- rounds of 4.4 s read through an uplink that
  // needed 1.4 s, and K overshot from 64 to 1024 (docs/benchmarks.md).
  // nullopt unless both rounds were held and at least one round's payload
  // (lastRoundBytes) was acknowledged over them: fewer is the
  // acknowledgements' lag, not the uplink's rate.
  std::optional<double> heldBytesPerSecond() const;
  // The latest heldBytesPerSecond measured at a round's sending, kept
  // through changes of period (the uplink's rate does not depend on K);
  // 0 before the first.
  double heldRate() const { return heldRate_; }

  // The slowest link took `transferSeconds` for the latest round: its copies
  // leave for all `peers` at once, so that is the uplink's time for all of
  // them (or a bound under it where the uplink is not the limit).
  // Ignored without a transfer, a round or a peer.
  void measuredTransfer(double transferSeconds, size_t peers);
  // The rate so measured, bytes per second; 0 before.
  double bytesPerSecond() const { return bytesPerSecond_; }

  // The uplink's rate as best known, bytes per second: the smaller of
  // heldRate() and bytesPerSecond() where both are known, else the one
  // that is, else 0. What the final average's way and pacing go by. The
  // lag reports' rate alone is known only six rounds after the latest
  // change of K, which a short job under auto K may never reach; the held
  // rate is kept through changes and measured from the start's first held
  // rounds. Without either, a 2 Mbit/s uplink read as not measured
  // (kUnmeasuredUplinkBytesPerSecond, 1 Gbit/s): the final average went
  // whole, 17.4 s for a 0.2M-parameter mlp among four regions where
  // reduce-scatter took 8.6-12.3 s (docs/benchmarks.md).
  double rate() const;
  // Where rate() comes from, for log lines: "rounds the uplink held back",
  // "the lag reports", "the smaller of rounds held back (R MB/s) and the
  // lag reports (R MB/s)", or "nothing" (0).
  std::string rateSource() const;

 private:
  struct Interval {
    double seconds = 0;
    bool held = false;   // the round that ended it waited for the uplink
    uint64_t acked = 0;  // bytes the peers acknowledged during it
  };
  size_t window_;
  uint64_t lastRoundBytes_ = 0;
  bool held_ = false;
  std::optional<geo::Clock::TimePoint> lastSentAt_;
  uint64_t lastAcked_ = 0;  // ackedBytes at lastSentAt_
  std::deque<Interval> intervals_;
  double bytesPerSecond_ = 0;
  double heldRate_ = 0;
};

}  // namespace geo::sync
