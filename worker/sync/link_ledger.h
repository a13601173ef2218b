#pragma once
// DTS's measurements of its links, one of its seams (docs/architecture.md
// section 3): each peer's one-way link time from both ends' lags of the same
// round, so that the skew between their clocks cancels; the recent ping
// round trips; the longest a round was seen crossing before any lag report.
// The automatic delay and period decide on them (auto_rules.h). No
// LibTorch and no transport: dts.cc records what it measures and what the
// peers report, and this is unit-tested on exact inputs (link_ledger_test).
// Peers are group indices (0 .. groupSize - 1, this worker's own included and
// never measured). Not thread-safe (the training thread's).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <vector>

namespace geo::sync {

class LinkLedger {
 public:
  struct Limits {
    size_t samples = 4;          // link samples per peer kept: the latest ones
    size_t ownRounds = 64;       // rounds whose own lags await the peers' reports
    double maxLagSeconds = 600;  // a lag beyond this (or a forged one) is no sample
    size_t rtts = 64;            // ping round trips per peer kept (one or two a round)
  };
  LinkLedger(size_t groupSize, Limits limits);

  // This worker's lags of a round it completed, by group index (how long
  // after its own contribution each peer's came; NaN: none came). Pairs
  // them with the peers' reports of that round that came first; reports of
  // rounds more than Limits::ownRounds older are forgotten. A round that
  // does not measure the links (disturbed()) pairs nothing.
  void ownLags(uint64_t round, std::vector<double> lags);

  // Peer `peer`'s report of its lag of this worker's contribution to
  // `round`: a sample with this worker's own lag of the same round,
  // (mine + theirs) / 2 (at least 0), now or once ownLags() has it. Neither
  // may be beyond Limits::maxLagSeconds or not finite. A report of a round
  // not completed here yet waits (the peer completed it first: its D is
  // smaller, or it runs ahead); dropping it left the worker with the larger
  // D without samples for as long as it stayed the later one. At most
  // Limits::ownRounds per peer of the group wait.
  void theirLag(uint64_t round, size_t peer, double lag);

  // The rounds' lags are forgotten (a state transfer: the rounds this
  // worker numbers start again), and so is a disturbance; the samples
  // stay, the links being the same.
  void forgetRounds();

  // Something other than the links held up the rounds up to `round` (the
  // latest this worker has sent): a peer suspected, heard again or
  // restarted, a connection made anew, an update applied after its round.
  // Their lags measure that: on the kernel's TCP a round sent into an 8 s
  // partition arrives when it heals, 8 s "late", and as a link sample it
  // read a 2 Mbit/s (0.25 MB/s) uplink as 0.065-0.104 MB/s in five runs of
  // six, which paced the final average at 17-28 s where 7-15 s did
  // (docs/benchmarks.md). ownLags() of such a round keeps no lag
  // (the report of it to the peers must be NaN too, measures()). Later
  // calls only move the bound up.
  void disturbed(uint64_t round);
  // Whether the lags of `round` measure the links: it was sent after the
  // latest disturbance.
  bool measures(uint64_t round) const { return !disturbedThrough_ || round > *disturbedThrough_; }

  // The latest one-way samples of `peer`'s link, oldest first.
  const std::deque<double>& samples(size_t peer) const { return links_.at(peer); }
  bool measured(size_t peer) const { return !links_.at(peer).empty(); }
  // The longest of them; nullopt before the first.
  std::optional<double> longestSample(size_t peer) const;

  // A ping round trip of `peer` (the transport's smallest recent one): the
  // path's latency without queueing is the smallest of those kept.
  void addRtt(size_t peer, double seconds);
  std::optional<double> smallestRtt(size_t peer) const;

  // A round of this worker's seen crossing for `seconds` one way (its oldest
  // byte unacknowledged that long, less the acknowledgement's way back):
  // the longest seen counts as a link until the reports come.
  void sawCrossing(double seconds);
  // The longest seen; 0 before (none seen: no link of 0 ms).
  double crossingSeconds() const { return crossingSeconds_; }
  // A round of this worker's seen crossing for `seconds` while part of
  // what it sent still waited in its own queue (the time since it was
  // sent, less the acknowledgement's way back). A link for D until the
  // reports come, as sawCrossing's; not for the period, whose rule takes
  // the uplink's rate from the rounds it held back instead (a queue a
  // round long read as a round's crossing in part, and K rose in small
  // steps where it should have gone at once to what the uplink needs).
  void sawQueuedCrossing(double seconds);
  // The longest of either kind seen; 0 before.
  double delayCrossingSeconds() const { return std::max(crossingSeconds_, queuedCrossingSeconds_); }

 private:
  void addSample(size_t peer, double mine, double theirs);
  bool lagOk(double lag) const;

  struct OwnLags {
    uint64_t round = 0;
    std::vector<double> lags;
  };
  struct TheirLag {
    uint64_t round = 0;
    size_t peer = 0;
    double lag = 0;
  };
  Limits limits_;
  std::vector<std::deque<double>> links_;
  std::vector<std::deque<double>> rtts_;
  std::deque<OwnLags> own_;
  std::deque<TheirLag> theirs_;
  double crossingSeconds_ = 0;
  double queuedCrossingSeconds_ = 0;
  std::optional<uint64_t> disturbedThrough_;
};

}  // namespace geo::sync
