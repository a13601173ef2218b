#include "worker/app/memory_plan.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "worker/sync/early_beside.h"
#include "worker/sync/final_average.h"

namespace geo::app {

MemoryPlan planDtsMemory(const MemoryPlanInput& in) {
  MemoryPlan plan;
  const int64_t b = 4 * in.parameters;  // the model in fp32
  const int64_t n = std::max<int64_t>(1, in.peers);
  // Bytes of one encoded contribution: the codec's width (QSGD's scales
  // aside, a bucket's 4 bytes per 512 values).
  const double perValue = in.codec == "qsgd" ? in.bits / 8.0 : in.codec == "identity" ? 4.0 : 2.0;
  const auto encoded = static_cast<int64_t>(static_cast<double>(in.parameters) * perValue);
  plan.roundsExact = in.period.has_value() && in.delay.has_value();
  plan.roundsInFlight = plan.roundsExact ? *in.delay / std::max<int64_t>(1, *in.period) + 1 : 1;
  const int64_t r = plan.roundsInFlight;

  std::vector<std::pair<std::string, int64_t>> always = {
      {"parameters and gradients", 2 * b},
  };
  if (in.optimizer == "adam") {
    always.push_back({"optimizer state (Adam's two moments)", 2 * b});
  } else if (in.momentum > 0) {
    always.push_back({"optimizer state (momentum)", b});
  }
  if (in.datasetBytes > 0) always.push_back({"the data set", in.datasetBytes});
  plan.evaluationModels = in.evaluationModels;
  if (in.evaluationModels > 0) {
    always.push_back({fmt::format("the background evaluation: {} models (its own, the snapshot it "
                                  "evaluates, training.evalBacklog waiting)",
                                  in.evaluationModels),
                      in.evaluationModels * b});
  }

  plan.training = always;
  // Error feedback's residual lives in the round's start (dts.cc): no row.
  plan.training.push_back({"the round's start", b});
  // Autograd's gradient of a weight before it is added to the flat
  // gradients (backward); the job model at an evaluation or a peer's
  // question comes on top, and is not certain, so not counted.
  plan.training.push_back({"autograd's gradient of the largest tensor", 4 * in.largestTensor});
  plan.training.push_back(
      {fmt::format("{} round(s) in flight: {} encoded contributions each", r, n), r * n * encoded});
  if (in.reduceScatter) {
    plan.training.push_back(
        {"the last 4 rounds completed (reduce-scatter): its own encoded "
         "contribution and the shards' means each, to answer a peer that "
         "lost an owner",
         4 * 2 * encoded});
  }
  // A completion (and an early application) goes a slice at a time through
  // four buffers of a slice each (dts_impl.h, kSliceValues).
  const int64_t slice = std::min<int64_t>(in.parameters, int64_t{1} << 20);
  plan.training.push_back(
      {"a round's completion, a slice at a time: the correction, the mean, a peer's decoded "
       "contribution and the early sum",
       4 * 4 * slice});
  // Under D = auto a CPU worker decodes what it applies early beside the
  // steps, into a correction of the model's size (sync::decodesEarlyBeside;
  // a GPU worker does not, and its plan counts it anyway: a bound).
  if (!in.delay && sync::decodesEarlyBeside(in.parameters)) {
    plan.training.push_back(
        {"the peers' contributions applied early, decoded beside the steps: the correction", b});
  }

  // At the end every round is complete: the round's start (the residual in
  // it) is let go, and the final average streams: the coordinator sums in its
  // own model's storage, adding each peer's model where its message holds
  // it, and asks for no more of them at once than sync::finalModelsInFlight
  // allows; a member holds the average's message; the model leaves without
  // a copy. By reduce-scatter (sync::finalAverageWay, only where two
  // models fit in the same budget) a worker holds shards of the others'
  // models and of the average: at most (2n - 1) / n models.
  const auto atOnce = static_cast<int64_t>(sync::finalModelsInFlight(static_cast<uint64_t>(b)));
  const bool reduceScatter = 2 * b <= static_cast<int64_t>(sync::kFinalModelsInFlightBytes);
  plan.atEnd = always;
  plan.atEnd.push_back(
      {"the final average: the peers' models (by reduce-scatter, shards of them and of the "
       "average) it holds at once",
       std::max(std::max<int64_t>(1, std::min(n - 1, atOnce)) * b,
                reduceScatter ? (2 * n - 1) * b / n : 0)});

  const auto sum = [](const auto& rows) {
    int64_t total = 0;
    for (const auto& [what, bytes] : rows) total += bytes;
    return total;
  };
  plan.trainingBytes = sum(plan.training);
  plan.endBytes = sum(plan.atEnd);
  plan.peakBytes = std::max(plan.trainingBytes, plan.endBytes);
  return plan;
}

namespace {

std::optional<int64_t> readNumber(const std::string& path) {
  std::ifstream f(path);
  std::string text;
  if (!(f >> text) || text == "max") return std::nullopt;
  try {
    size_t used = 0;
    const long long v = std::stoll(text, &used);
    if (used != text.size() || v <= 0) return std::nullopt;
    return static_cast<int64_t>(v);
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

}  // namespace

std::optional<int64_t> readMemoryLimit(const std::string& root) {
  const std::string base = root.empty() || root.back() != '/' ? root + "/" : root;
  std::optional<int64_t> limit;
  // cgroup v2 ("0::/path") or v1 ("N:memory:/path" or a list with memory).
  std::ifstream groups(base + "proc/self/cgroup");
  for (std::string line; std::getline(groups, line);) {
    const size_t first = line.find(':');
    const size_t second = line.find(':', first + 1);
    if (first == std::string::npos || second == std::string::npos) continue;
    const std::string controllers = line.substr(first + 1, second - first - 1);
    const std::string path = line.substr(second + 1);
    std::optional<int64_t> v;
    if (controllers.empty()) {
      // v2 alone, or beside v1 ("hybrid": mounted at unified/).
      v = readNumber(base + "sys/fs/cgroup" + path + "/memory.max");
      if (!v) v = readNumber(base + "sys/fs/cgroup/unified" + path + "/memory.max");
    } else if (("," + controllers + ",").find(",memory,") != std::string::npos) {
      v = readNumber(base + "sys/fs/cgroup/memory" + path + "/memory.limit_in_bytes");
    }
    // v1 reports "no limit" as a number near 2^63.
    if (v && *v < (int64_t{1} << 60)) limit = limit ? std::min(*limit, *v) : *v;
  }
  std::ifstream info(base + "proc/meminfo");
  for (std::string key; info >> key;) {
    int64_t kib = 0;
    std::string unit;
    if (key == "MemTotal:" && info >> kib) {
      const int64_t total = kib * 1024;
      return limit ? std::min(*limit, total) : total;
    }
    std::getline(info, unit);
  }
  return limit;
}

std::string formatBytes(int64_t bytes) {
  const double v = static_cast<double>(bytes);
  if (v >= 1e9) return fmt::format("{:.1f} GB", v / 1e9);
  if (v >= 1e6) return fmt::format("{:.0f} MB", v / 1e6);
  return fmt::format("{:.0f} kB", v / 1e3);
}

Status checkMemoryPlan(const MemoryPlan& plan, int64_t limitBytes) {
  if (plan.peakBytes <= limitBytes) return {};
  const bool atEnd = plan.endBytes >= plan.trainingBytes;
  auto rows = atEnd ? plan.atEnd : plan.training;
  std::sort(rows.begin(), rows.end(),
            [](const auto& a, const auto& b) { return a.second > b.second; });
  std::vector<std::string> largest;
  for (size_t i = 0; i < rows.size() && i < 4; ++i) {
    largest.push_back(fmt::format("{} {}", rows[i].first, formatBytes(rows[i].second)));
  }
  return failedPrecondition(fmt::format(
      "this worker needs at least {} of memory {} ({}{}), more than the {} it may use "
      "(its cgroup's memory limit, or the machine's memory): give it more memory (the pod's "
      "resources.limits.memory), or train a smaller model{}{} (docs/algorithms.md, \"Memory\")",
      formatBytes(plan.peakBytes), atEnd ? "for the final average" : "while training",
      fmt::join(largest, ", "), rows.size() > 4 ? ", ..." : "", formatBytes(limitBytes),
      atEnd || !plan.roundsExact || plan.roundsInFlight <= 1
          ? ""
          : fmt::format(", or keep fewer rounds in flight ({} now: sync.delay / sync.period + 1)",
                        plan.roundsInFlight),
      plan.evaluationModels > 0
          ? ", or let fewer snapshots wait for evaluation (training.evalBacklog; "
            "training.evalInterval 0 evaluates at the end only)"
          : ""));
}

}  // namespace geo::app
