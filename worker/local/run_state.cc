#include "worker/local/run_state.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>

#include <nlohmann/json.hpp>

#include "common/enforce.h"

namespace geo::local {

namespace {

template <typename T>
void keep(std::optional<T>& into, const std::optional<T>& value) {
  if (value) into = value;
}

// The larger of the two where both are known, else whichever is.
void keepLargest(std::optional<double>& into, const std::optional<double>& value) {
  if (value) into = std::max(into.value_or(*value), *value);
}

void merge(SyncStats& into, const SyncStats& s) {
  keep(into.delay, s.delay);
  keep(into.appliedUpdates, s.appliedUpdates);
  keep(into.stalenessMean, s.stalenessMean);
  keep(into.stalenessMax, s.stalenessMax);
  keep(into.missing, s.missing);
  keep(into.waitSeconds, s.waitSeconds);
  keep(into.peersDown, s.peersDown);
  keep(into.degradedSeconds, s.degradedSeconds);
  keep(into.rejoins, s.rejoins);
  keep(into.stateTransferBytes, s.stateTransferBytes);
}

void merge(StepTime& into, const StepTime& t) {
  keep(into.steps, t.steps);
  keep(into.computeSeconds, t.computeSeconds);
  keep(into.syncSeconds, t.syncSeconds);
  keep(into.codecSeconds, t.codecSeconds);
  keep(into.encodeSeconds, t.encodeSeconds);
  keep(into.waitSeconds, t.waitSeconds);
}

void merge(ByteCounts& into, const ByteCounts& b) {
  keep(into.wanSent, b.wanSent);
  keep(into.wanReceived, b.wanReceived);
  keep(into.lanSent, b.lanSent);
  keep(into.lanReceived, b.lanReceived);
  keep(into.payload, b.payload);
}

// Mean of the ranks' staleness means, weighted by applied updates when any
// rank reports them.
std::optional<double> stalenessMean(const std::vector<const RankProgress*>& ranks) {
  double weighted = 0;
  double weights = 0;
  double plain = 0;
  int plainCount = 0;
  bool anyWeights = false;
  for (const RankProgress* r : ranks) {
    if (!r->sync.stalenessMean) continue;
    plain += *r->sync.stalenessMean;
    ++plainCount;
    if (r->sync.appliedUpdates) {
      anyWeights = true;
      weighted += *r->sync.stalenessMean * static_cast<double>(*r->sync.appliedUpdates);
      weights += static_cast<double>(*r->sync.appliedUpdates);
    }
  }
  if (plainCount == 0) return std::nullopt;
  if (anyWeights && weights > 0) return weighted / weights;
  return plain / plainCount;
}

nlohmann::ordered_json orNull(const std::optional<double>& v) {
  return v ? nlohmann::ordered_json(*v) : nlohmann::ordered_json(nullptr);
}

nlohmann::ordered_json groupJson(const GroupSummary& g) {
  return {
      {"wallSeconds", g.wallSeconds},
      {"testAccuracy", orNull(g.testAccuracy)},
      {"testLoss", orNull(g.testLoss)},
      {"steps", g.steps},
      {"stepsPerSecond", orNull(g.stepsPerSecond)},
      {"wanBytes", g.wanBytes()},
      {"wanSentBytes", g.wanSentBytes},
      {"wanReceivedBytes", g.wanReceivedBytes},
      {"lanBytes", g.lanBytes()},
      {"payloadBytes", g.payloadBytes},
      {"compressionRatio", orNull(g.compressionRatio)},
      {"stalenessMean", orNull(g.stalenessMean)},
      {"stalenessMax", orNull(g.stalenessMax)},
      {"missing", g.missing},
      {"waitSeconds", orNull(g.waitSeconds)},
      {"perStepMilliseconds", g.perStep ? nlohmann::ordered_json{{"compute", g.perStep->computeMs},
                                                                 {"sync", g.perStep->syncMs},
                                                                 {"codec", g.perStep->codecMs},
                                                                 {"encode", g.perStep->encodeMs},
                                                                 {"wait", g.perStep->waitMs}}
                                        : nlohmann::ordered_json(nullptr)},
      {"maxRssBytes",
       g.maxRssBytes ? nlohmann::ordered_json(*g.maxRssBytes) : nlohmann::ordered_json(nullptr)},
      {"longestStepSeconds", orNull(g.longestStepSeconds)},
  };
}

}  // namespace

RunState::RunState(Topology topology, int64_t totalSteps)
    : topology_(std::move(topology)), totalSteps_(totalSteps) {
  const int64_t world = topology_.worldSize();
  ranks_.resize(static_cast<size_t>(world));
  for (int64_t r = 0; r < world; ++r) {
    const RankPlace place = placeOf(topology_, r);
    RankProgress& p = ranks_[static_cast<size_t>(r)];
    p.rank = r;
    p.regionIndex = place.regionIndex;
    p.localIndex = place.localIndex;
    p.region = topology_.regions[static_cast<size_t>(place.regionIndex)];
  }
}

const RankProgress& RunState::rank(int64_t r) const {
  GEO_ENFORCE(r >= 0 && r < static_cast<int64_t>(ranks_.size()), "rank {} out of range", r);
  return ranks_[static_cast<size_t>(r)];
}

void RunState::record(int64_t rank, double wallSeconds, const WorkerEvent& e) {
  GEO_ENFORCE(rank >= 0 && rank < static_cast<int64_t>(ranks_.size()), "rank {} out of range",
              rank);
  RankProgress& p = ranks_[static_cast<size_t>(rank)];
  // The worker's time at its latest step, for its steps/s: what comes after
  // the last step (evaluations of waiting snapshots, the final evaluation,
  // "done") is not training time. A progress event is sent after the
  // evaluation it reports (at the last step, the final one, a few hundred
  // milliseconds for the mlp); stepEndedAt says when its step ended.
  if (!p.workerTime || (e.step && *e.step > p.step)) {
    keep(p.workerTime, e.stepEndedAt ? e.stepEndedAt : e.time);
  }
  switch (e.kind) {
    case EventKind::kStart:
      p.started = true;
      ++p.starts;
      break;
    case EventKind::kJoined:
      p.joinedWallSeconds = wallSeconds;
      keep(p.joinedStep, e.step);
      if (e.step) p.step = std::max(p.step, *e.step);
      p.joinTransferred = e.transferred.value_or(false);
      keep(p.stateTransferSeconds, e.stateTransferSeconds);
      break;
    case EventKind::kProgress:
    case EventKind::kDone:
      p.started = true;
      if (e.step) p.step = std::max(p.step, *e.step);
      keep(p.loss, e.loss);
      keep(p.samplesPerSecond, e.samplesPerSecond);
      if (e.evalLoss) p.evalLoss = e.evalLoss;
      if (e.evalAccuracy) {
        p.evalAccuracy = e.evalAccuracy;
        p.evals.push_back({std::max(0.0, wallSeconds - e.evalAgeSeconds.value_or(0)),
                           *e.evalAccuracy, e.evalStep ? e.evalStep : e.step});
      }
      merge(p.sync, e.sync);
      merge(p.bytes, e.bytes);
      merge(p.stepTime, e.stepTime);
      keep(p.stepSecondsMax, e.stepSecondsMax);
      keep(p.maxRssBytes, e.maxRssBytes);
      if (!e.modelHash.empty()) p.modelHash = e.modelHash;
      if (e.kind == EventKind::kDone) {
        p.done = true;
        p.doneWallSeconds = wallSeconds;
        keep(p.testAccuracy, e.testAccuracy);
        keep(p.testLoss, e.testLoss);
      }
      break;
    case EventKind::kError:
      p.errorMessage = e.message.empty() ? std::string("(no message)") : e.message;
      break;
    case EventKind::kOther: break;
  }
}

RegionSnapshot RunState::regionSnapshot(size_t regionIndex) const {
  RegionSnapshot s;
  s.step = std::numeric_limits<int64_t>::max();
  double lossSum = 0;
  int lossCount = 0;
  bool allDone = true;
  std::vector<const RankProgress*> members;
  for (const RankProgress& p : ranks_) {
    if (p.regionIndex != static_cast<int64_t>(regionIndex)) continue;
    members.push_back(&p);
    s.step = std::min(s.step, p.step);
    if (p.loss) {
      lossSum += *p.loss;
      ++lossCount;
    }
    s.samplesPerSecond += p.done ? 0 : p.samplesPerSecond.value_or(0);
    s.wanSentBytes += p.bytes.wanSent.value_or(0);
    allDone = allDone && p.done;
    // The leader (local index 0) comes first: its values win.
    if (!s.delay) s.delay = p.sync.delay;
    if (!s.evalAccuracy) s.evalAccuracy = p.evalAccuracy;
    if (!s.evalLoss) s.evalLoss = p.evalLoss;
  }
  if (members.empty()) s.step = 0;
  if (lossCount > 0) s.loss = lossSum / lossCount;
  s.stalenessMean = stalenessMean(members);
  s.done = !members.empty() && allDone;
  return s;
}

GroupSummary RunState::summarizeRanks(const std::vector<const RankProgress*>& ranks,
                                      double wallSeconds) const {
  GroupSummary g;
  g.wallSeconds = wallSeconds;
  double accuracySum = 0, lossSum = 0;
  int accuracyCount = 0, lossCount = 0;
  std::optional<double> lastDone;
  bool allDone = !ranks.empty();
  g.steps = ranks.empty() ? 0 : std::numeric_limits<int64_t>::max();
  // Steps and seconds, summed over the workers that reported stepTime.
  int64_t timedSteps = 0;
  double compute = 0, sync = 0, codec = 0, encode = 0, wait = 0;
  for (const RankProgress* p : ranks) {
    if (p->maxRssBytes) g.maxRssBytes = std::max(g.maxRssBytes.value_or(0), *p->maxRssBytes);
    keepLargest(g.longestStepSeconds, p->stepSecondsMax);
    if (p->stepTime.steps && *p->stepTime.steps > 0) {
      timedSteps += *p->stepTime.steps;
      compute += p->stepTime.computeSeconds.value_or(0);
      sync += p->stepTime.syncSeconds.value_or(0);
      codec += p->stepTime.codecSeconds.value_or(0);
      encode += p->stepTime.encodeSeconds.value_or(0);
      wait += p->stepTime.waitSeconds.value_or(0);
    }
    if (p->testAccuracy) {
      accuracySum += *p->testAccuracy;
      ++accuracyCount;
    }
    if (p->testLoss) {
      lossSum += *p->testLoss;
      ++lossCount;
    }
    if (p->doneWallSeconds) {
      lastDone = std::max(lastDone.value_or(0), *p->doneWallSeconds);
    } else {
      allDone = false;
    }
    g.steps = std::min(g.steps, p->step);
    if (p->workerTime && *p->workerTime > 0 && p->step > 0) {
      const double rate = static_cast<double>(p->step) / *p->workerTime;
      g.stepsPerSecond = std::min(g.stepsPerSecond.value_or(rate), rate);
    }
    g.wanSentBytes += p->bytes.wanSent.value_or(0);
    g.wanReceivedBytes += p->bytes.wanReceived.value_or(0);
    g.lanSentBytes += p->bytes.lanSent.value_or(0);
    g.lanReceivedBytes += p->bytes.lanReceived.value_or(0);
    g.payloadBytes += p->bytes.payload.value_or(0);
    keepLargest(g.stalenessMax, p->sync.stalenessMax);
    g.missing += p->sync.missing.value_or(0);
    keepLargest(g.waitSeconds, p->sync.waitSeconds);
  }
  if (accuracyCount > 0) g.testAccuracy = accuracySum / accuracyCount;
  if (lossCount > 0) g.testLoss = lossSum / lossCount;
  if (allDone && lastDone) g.wallSeconds = std::min(wallSeconds, *lastDone);
  if (g.wanSentBytes > 0) {
    g.compressionRatio = static_cast<double>(g.payloadBytes) / static_cast<double>(g.wanSentBytes);
  }
  g.stalenessMean = stalenessMean(ranks);
  if (timedSteps > 0) {
    const double ms = 1e3 / static_cast<double>(timedSteps);
    g.perStep = StepBreakdown{compute * ms, sync * ms, codec * ms, encode * ms, wait * ms};
  }
  return g;
}

RunSummary RunState::summarize(double wallSeconds) const {
  RunSummary s;
  std::vector<const RankProgress*> all;
  for (const RankProgress& p : ranks_) all.push_back(&p);
  s.overall = summarizeRanks(all, wallSeconds);
  s.overall.wallSeconds = wallSeconds;
  for (size_t i = 0; i < topology_.regions.size(); ++i) {
    std::vector<const RankProgress*> members;
    for (const RankProgress& p : ranks_) {
      if (p.regionIndex == static_cast<int64_t>(i)) members.push_back(&p);
    }
    s.regions.emplace_back(topology_.regions[i], summarizeRanks(members, wallSeconds));
  }
  const std::vector<double> thresholds(kAccuracyThresholds.begin(), kAccuracyThresholds.end());
  s.timeToAccuracy =
      timeToAccuracy(ranks_.empty() ? std::vector<EvalPoint>{} : ranks_[0].evals, thresholds);
  std::vector<std::string> hashes;
  for (const RankProgress& p : ranks_) {
    if (!p.modelHash.empty()) hashes.push_back(p.modelHash);
  }
  if (hashes.size() >= 2) {
    s.modelsAgree = std::all_of(hashes.begin(), hashes.end(),
                                [&](const std::string& h) { return h == hashes.front(); });
  }
  return s;
}

std::vector<std::pair<double, std::optional<double>>> timeToAccuracy(
    const std::vector<EvalPoint>& evals, const std::vector<double>& thresholds) {
  std::vector<std::pair<double, std::optional<double>>> result;
  for (const double threshold : thresholds) {
    std::optional<double> when;
    for (const EvalPoint& e : evals) {
      if (e.accuracy >= threshold) {
        when = e.wallSeconds;
        break;
      }
    }
    result.emplace_back(threshold, when);
  }
  return result;
}

std::string summaryJson(const RunSummary& summary) {
  nlohmann::ordered_json j = {{"outcome", summary.outcome}};
  j.update(groupJson(summary.overall));
  nlohmann::ordered_json regions = nlohmann::ordered_json::object();
  for (const auto& [name, group] : summary.regions) regions[name] = groupJson(group);
  j["regions"] = std::move(regions);
  nlohmann::ordered_json tta = nlohmann::ordered_json::object();
  for (const auto& [threshold, seconds] : summary.timeToAccuracy) {
    tta[fmt::format("{:.2f}", threshold)] = orNull(seconds);
  }
  j["timeToAccuracy"] = std::move(tta);
  j["modelsAgree"] = summary.modelsAgree ? nlohmann::ordered_json(*summary.modelsAgree)
                                         : nlohmann::ordered_json(nullptr);
  nlohmann::ordered_json faults = nlohmann::ordered_json::array();
  for (const FaultSummary& f : summary.faults) {
    faults.push_back({{"kind", f.kind},
                      {"what", f.what},
                      {"atSeconds", f.atSeconds},
                      {"endSeconds", orNull(f.endSeconds)},
                      {"downSeconds", orNull(f.downSeconds)},
                      {"rejoinSeconds", orNull(f.rejoinSeconds)},
                      {"rejoinStep", f.rejoinStep ? nlohmann::ordered_json(*f.rejoinStep)
                                                  : nlohmann::ordered_json(nullptr)},
                      {"othersStallSeconds", orNull(f.othersStallSeconds)},
                      {"finishSkewSeconds", orNull(f.finishSkewSeconds)}});
  }
  j["faults"] = std::move(faults);
  return j.dump(2) + "\n";
}

}  // namespace geo::local
