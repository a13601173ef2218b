#include "worker/sync/link_ledger.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

namespace geo::sync {

LinkLedger::LinkLedger(size_t groupSize, Limits limits)
    : limits_(limits), links_(groupSize), rtts_(groupSize) {}

bool LinkLedger::lagOk(double lag) const {
  return std::isfinite(lag) && std::abs(lag) <= limits_.maxLagSeconds;
}

void LinkLedger::addSample(size_t peer, double mine, double theirs) {
  if (peer >= links_.size() || !lagOk(mine) || !lagOk(theirs)) return;
  auto& samples = links_[peer];
  samples.push_back(std::max(0.0, (mine + theirs) / 2));
  if (samples.size() > limits_.samples) samples.pop_front();
}

void LinkLedger::ownLags(uint64_t round, std::vector<double> lags) {
  if (!measures(round)) lags.assign(lags.size(), std::numeric_limits<double>::quiet_NaN());
  std::erase_if(theirs_, [&](const TheirLag& l) {
    if (l.round != round) return l.round < round && round - l.round > limits_.ownRounds;
    if (l.peer < lags.size()) addSample(l.peer, lags[l.peer], l.lag);
    return true;
  });
  own_.push_back({round, std::move(lags)});
  if (own_.size() > limits_.ownRounds) own_.pop_front();
}

void LinkLedger::theirLag(uint64_t round, size_t peer, double lag) {
  if (peer >= links_.size() || !lagOk(lag)) return;
  const auto own =
      std::find_if(own_.begin(), own_.end(), [&](const OwnLags& o) { return o.round == round; });
  if (own != own_.end()) {
    if (peer < own->lags.size()) addSample(peer, own->lags[peer], lag);
    return;
  }
  theirs_.push_back({round, peer, lag});
  if (theirs_.size() > limits_.ownRounds * links_.size()) theirs_.pop_front();
}

void LinkLedger::forgetRounds() {
  own_.clear();
  theirs_.clear();
  disturbedThrough_.reset();
}

void LinkLedger::disturbed(uint64_t round) {
  disturbedThrough_ = std::max(disturbedThrough_.value_or(round), round);
}

std::optional<double> LinkLedger::longestSample(size_t peer) const {
  const auto& samples = links_.at(peer);
  if (samples.empty()) return std::nullopt;
  return *std::max_element(samples.begin(), samples.end());
}

void LinkLedger::addRtt(size_t peer, double seconds) {
  if (peer >= links_.size() || !(seconds >= 0)) return;
  auto& rtts = rtts_[peer];
  rtts.push_back(seconds);
  if (rtts.size() > limits_.rtts) rtts.pop_front();
}

std::optional<double> LinkLedger::smallestRtt(size_t peer) const {
  const auto& rtts = rtts_.at(peer);
  if (rtts.empty()) return std::nullopt;
  return *std::min_element(rtts.begin(), rtts.end());
}

void LinkLedger::sawCrossing(double seconds) {
  crossingSeconds_ = std::max(crossingSeconds_, seconds);
}

void LinkLedger::sawQueuedCrossing(double seconds) {
  queuedCrossingSeconds_ = std::max(queuedCrossingSeconds_, seconds);
}

}  // namespace geo::sync
