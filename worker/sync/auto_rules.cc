#include "worker/sync/auto_rules.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace geo::sync {
std::optional<int64_t> autoDelaySteps(double slowestLinkSeconds, double stepSeconds,
                                      int64_t maxDelay) {
  if (!(stepSeconds > 0) || !(slowestLinkSeconds >= 0)) return std::nullopt;
  // The epsilon keeps an exact multiple (a 100 ms link over 20 ms steps)
  // from rounding up to one step more.
  const double steps = std::ceil(slowestLinkSeconds / stepSeconds - 1e-9);
  return std::clamp<int64_t>(static_cast<int64_t>(std::min(steps, 1e15)), 0, maxDelay);
}

std::optional<double> linkBeforeReports(std::span<const double> minRttSeconds,
                                        double crossingSeconds) {
  if (minRttSeconds.empty()) return std::nullopt;
  double link = crossingSeconds > 0 ? crossingSeconds : 0;
  for (const double rtt : minRttSeconds) {
    if (!(rtt > 0)) return std::nullopt;
    link = std::max(link, rtt / 2);
  }
  return link;
}

std::optional<double> jobPaceSeconds(std::span<const PaceStep> steps, double waitCap) {
  if (steps.size() < 2) return std::nullopt;
  double beyond = 0;  // the waits' seconds over the cap: left out
  for (const PaceStep& s : steps.subspan(1)) {
    beyond += std::max(0.0, s.waitSeconds - std::max(0.0, waitCap));
  }
  const double lived = steps.back().endSeconds - steps.front().endSeconds - beyond;
  return std::max(0.0, lived) / static_cast<double>(steps.size() - 1);
}

std::optional<double> peerPaceSeconds(std::span<const PeerStamp> stamps) {
  std::vector<double> perStep;
  for (size_t k = 1; k < stamps.size(); ++k) {
    const int64_t steps = stamps[k].step - stamps[k - 1].step;
    if (steps <= 0) continue;
    perStep.push_back(std::max(0.0, stamps[k].arrivedSeconds - stamps[k - 1].arrivedSeconds) /
                      static_cast<double>(steps));
  }
  if (perStep.size() < kPeerPaceIntervals) return std::nullopt;
  const auto mid = perStep.begin() + static_cast<std::ptrdiff_t>(perStep.size() / 2);
  std::nth_element(perStep.begin(), mid, perStep.end());
  if (perStep.size() % 2 == 1) return *mid;
  return 0.5 * (*mid + *std::max_element(perStep.begin(), mid));
}

std::optional<size_t> medianPace(std::span<const double> paces) {
  std::vector<size_t> known;
  for (size_t i = 0; i < paces.size(); ++i) {
    if (paces[i] > 0) known.push_back(i);
  }
  if (known.empty()) return std::nullopt;
  const auto mid = known.begin() + static_cast<std::ptrdiff_t>(known.size() / 2);
  std::nth_element(known.begin(), mid, known.end(),
                   [&](size_t a, size_t b) { return paces[a] < paces[b]; });
  return *mid;
}

int64_t dueStepOnNewDelay(int64_t sendStep, int64_t dueStep, int64_t delay, bool provisional,
                          bool linksMeasured) {
  if (provisional || linksMeasured) return std::min(dueStep, sendStep + delay);
  return sendStep + delay;
}

std::optional<SlowestLink> slowestLink(std::span<const PeerLink> peers, double crossingSeconds) {
  std::optional<SlowestLink> slowest;
  std::vector<double> unmeasured;  // their round trips
  size_t farthest = 0;             // the unmeasured peer of the longest round trip
  for (size_t i = 0; i < peers.size(); ++i) {
    const PeerLink& p = peers[i];
    if (!p.measuredSeconds) {
      if (unmeasured.empty() || p.minRttSeconds > peers[farthest].minRttSeconds) farthest = i;
      unmeasured.push_back(p.minRttSeconds);
    } else if (!slowest || *p.measuredSeconds > slowest->seconds) {
      slowest = SlowestLink{*p.measuredSeconds, i, false};
    }
  }
  const std::optional<double> before = linkBeforeReports(unmeasured, crossingSeconds);
  if (before && (!slowest || *before > slowest->seconds)) {
    slowest = SlowestLink{*before, farthest, true};
  }
  return slowest;
}

double roundTransferSeconds(std::span<const double> linkSeconds, double latencySeconds,
                            double roundSeconds) {
  if (linkSeconds.empty()) return -1;
  const double excess =
      std::max(0.0, *std::max_element(linkSeconds.begin(), linkSeconds.end()) - latencySeconds);
  if (excess <= roundSeconds || linkSeconds.size() < 2) return excess;
  const double slope =
      (linkSeconds.back() - linkSeconds.front()) / static_cast<double>(linkSeconds.size() - 1);
  return std::clamp(roundSeconds + slope, 0.0, excess);
}

std::optional<int64_t> autoPeriod(double transferSeconds, double stepSeconds, int64_t current,
                                  int64_t maxPeriod, double codecRoundSeconds) {
  if (!(stepSeconds > 0) || !(transferSeconds >= 0) || maxPeriod < 1) return std::nullopt;
  const double codec = codecRoundSeconds > 0 ? codecRoundSeconds : 0.0;  // NaN too
  const double want =
      std::max(transferSeconds / (kLinkShare * stepSeconds), codec / (kCodecShare * stepSeconds));
  int64_t k = 1;
  while (static_cast<double>(k) < want && k < maxPeriod) k *= 2;
  k = std::min(k, maxPeriod);
  if (k == current || (k < current && want > 0.5 * static_cast<double>(k))) return std::nullopt;
  return k;
}

bool codecBoundsPeriod(double transferSeconds, double codecRoundSeconds) {
  return codecRoundSeconds / kCodecShare > transferSeconds / kLinkShare;
}

std::optional<int64_t> periodFromCrossing(double crossingSeconds, double latencySeconds,
                                          double stepSeconds, int64_t current, int64_t maxPeriod) {
  const double transfer = crossingSeconds - std::max(0.0, latencySeconds);
  if (!(transfer > 0)) return std::nullopt;
  const std::optional<int64_t> k = autoPeriod(transfer, stepSeconds, current, maxPeriod);
  if (!k || *k <= current) return std::nullopt;
  return k;
}

double crossingWithinUplink(double crossingSeconds, double latencySeconds, double roundBytes,
                            double uplinkBytesPerSecond) {
  if (!(uplinkBytesPerSecond > 0) || !(roundBytes > 0)) return crossingSeconds;
  return std::min(crossingSeconds,
                  std::max(0.0, latencySeconds) + roundBytes / uplinkBytesPerSecond);
}

std::optional<int64_t> periodForHeldUplink(double uplinkRoundSeconds, double stepSeconds,
                                           int64_t current, int64_t maxPeriod) {
  if (!(stepSeconds > 0) || !(uplinkRoundSeconds >= 0) || maxPeriod < 1) return std::nullopt;
  const double want = uplinkRoundSeconds / stepSeconds;
  int64_t k = 1;
  while (static_cast<double>(k) < want && k < maxPeriod) k *= 2;
  k = std::min(k, maxPeriod);
  if (k <= current) return std::nullopt;
  return k;
}

double delayLrScale(double stalenessSteps) {
  if (!(stalenessSteps > static_cast<double>(kFullStepDelay))) return 1.0;  // NaN too
  return std::max(kMinDelayLrScale, static_cast<double>(kFullStepDelay) / stalenessSteps);
}

int64_t periodAnnouncementSteps(int64_t current, double latencySeconds, double stepSeconds) {
  const int64_t latencySteps =
      stepSeconds > 0 ? static_cast<int64_t>(std::ceil(std::max(0.0, latencySeconds) / stepSeconds))
                      : 0;
  return 2 * current + latencySteps;
}

}  // namespace geo::sync
