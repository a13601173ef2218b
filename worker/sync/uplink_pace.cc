#include "worker/sync/uplink_pace.h"

#include <algorithm>
#include <chrono>

#include <fmt/format.h>

namespace geo::sync {

bool roundStillQueued(const PeerQueue& q, uint64_t roundBytes, double roundSeconds) {
  if (roundBytes == 0) return false;
  if (q.backlogBytes + q.belowBytes >= roundBytes) return true;
  const double limit = q.minRttSeconds + 2 * roundSeconds;
  return q.sinceAckSeconds >= 0 && q.minRttSeconds > 0 && q.unackedSeconds > limit &&
         q.sinceAckSeconds < limit;
}

bool uplinkHoldsRound(std::span<const PeerQueue> queues, uint64_t roundBytes, double roundSeconds) {
  size_t queued = 0;
  for (const PeerQueue& q : queues) queued += roundStillQueued(q, roundBytes, roundSeconds) ? 1 : 0;
  return 2 * queued > queues.size();
}

void UplinkPace::sent(geo::Clock::TimePoint at, uint64_t ackedBytes) {
  if (lastSentAt_) {
    // A counter that went back (a transport that does not count) gives 0.
    const uint64_t acked = ackedBytes >= lastAcked_ ? ackedBytes - lastAcked_ : 0;
    intervals_.push_back({std::chrono::duration<double>(at - *lastSentAt_).count(), held_, acked});
    if (intervals_.size() > window_) intervals_.pop_front();
  }
  lastSentAt_ = at;
  lastAcked_ = ackedBytes;
  if (const std::optional<double> rate = heldBytesPerSecond()) heldRate_ = *rate;
}

void BusyUplinkRate::sample(geo::Clock::TimePoint at, uint64_t leftBytes, uint64_t queuedBytes) {
  // The queue at the interval's start only: a queue that drained within it
  // drained at the path's rate or faster, and the bytes that left are a
  // bound from below either way (an emulated uplink lets a message go whole
  // once its time is up: counting only intervals queued at both ends left
  // out every message's bytes).
  if (last_ && leftBytes >= last_->left && at > last_->at) {
    const double gap = std::chrono::duration<double>(at - last_->at).count();
    if (gap <= kLongestGap && last_->queued >= kBusyBytes) {
      busySeconds_ += gap;
      busyBytes_ += leftBytes - last_->left;
    }
  }
  last_ = Sample{at, leftBytes, queuedBytes};
}

double BusyUplinkRate::bytesPerSecond() const {
  // (A sum of intervals: within rounding of the bound is at it.)
  if (busySeconds_ < kMinBusySeconds - 1e-9 || busyBytes_ < kMinBusyBytes) return 0;
  return static_cast<double>(busyBytes_) / busySeconds_;
}

double UplinkPace::roundSeconds(int64_t k, double stepSeconds) const {
  if (intervals_.empty()) return static_cast<double>(k) * stepSeconds;
  double sum = 0;
  for (const Interval& r : intervals_) sum += r.seconds;
  return sum / static_cast<double>(intervals_.size());
}

std::optional<double> UplinkPace::heldRoundSeconds() const {
  if (intervals_.size() < 2) return std::nullopt;
  const Interval& last = intervals_.end()[-1];
  const Interval& before = intervals_.end()[-2];
  if (!last.held || !before.held) return std::nullopt;
  return std::max(last.seconds, before.seconds);
}

std::optional<double> UplinkPace::heldBytesPerSecond() const {
  if (!heldRoundSeconds()) return std::nullopt;
  const Interval& last = intervals_.end()[-1];
  const Interval& before = intervals_.end()[-2];
  const double seconds = last.seconds + before.seconds;
  const uint64_t bytes = last.acked + before.acked;
  // Less than one round's payload acknowledged over two rounds the uplink
  // held back is the acknowledgements' lag, not the uplink's rate (they
  // travel with the peers' own traffic and pings): with steps of 1 ms on
  // loopback's emulated WAN, two short held rounds read as 1.4 KB/s against
  // 24 MB/s reported, and the final average, paced at that, was reckoned at
  // 15 minutes.
  if (!(seconds > 0) || bytes == 0 || bytes < lastRoundBytes_) return std::nullopt;
  return static_cast<double>(bytes) / seconds;
}

void UplinkPace::measuredTransfer(double transferSeconds, size_t peers) {
  if (!(transferSeconds > 0) || lastRoundBytes_ == 0 || peers == 0) return;
  bytesPerSecond_ =
      static_cast<double>(lastRoundBytes_) * static_cast<double>(peers) / transferSeconds;
}

double UplinkPace::rate() const {
  if (heldRate_ > 0 && bytesPerSecond_ > 0) return std::min(heldRate_, bytesPerSecond_);
  return heldRate_ > 0 ? heldRate_ : bytesPerSecond_;
}

std::string UplinkPace::rateSource() const {
  if (heldRate_ > 0 && bytesPerSecond_ > 0) {
    return fmt::format(
        "the smaller of rounds held back ({:.3g} MB/s) and the lag reports ({:.3g} MB/s)",
        heldRate_ / 1e6, bytesPerSecond_ / 1e6);
  }
  if (heldRate_ > 0) return "rounds the uplink held back";
  return bytesPerSecond_ > 0 ? "the lag reports" : "nothing";
}

}  // namespace geo::sync
