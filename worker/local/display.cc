#include "worker/local/display.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <string_view>
#include <vector>

#include "common/sync_algorithms.h"

namespace geo::local {

namespace {

size_t nameWidth(const std::vector<std::string>& names, size_t atLeast) {
  size_t width = atLeast;
  for (const std::string& n : names) width = std::max(width, n.size());
  return width;
}

std::string percent(const std::optional<double>& v) {
  return v ? fmt::format("{:.1f}%", *v * 100) : std::string("-");
}

std::string number(const std::optional<double>& v, int decimals) {
  return v ? fmt::format("{:.{}f}", *v, decimals) : std::string("-");
}

std::string megabytes(uint64_t bytes) {
  return fmt::format("{:.2f}", static_cast<double>(bytes) / 1e6);
}

std::string uplinkText(const std::string& uplink, bool perRegion) {
  if (uplink.empty()) return "unlimited";
  constexpr std::string_view kRate = "rate=";
  std::string_view rate = uplink;
  if (rate.substr(0, kRate.size()) == kRate) rate.remove_prefix(kRate.size());
  return fmt::format("{}/s per {}", rate, perRegion ? "region" : "worker");
}

std::string syncText(const WorkerConfig& c) {
  const auto& s = c.sync;
  const std::string codec =
      s.codec == "qsgd" ? fmt::format("qsgd-{}", s.bits) : std::string(s.codec);
  if (s.algorithm == "none") return "none (independent workers)";
  // The algorithm's own keys: " (period K=16, delay D=auto)".
  std::vector<std::string> own;
  for (const SyncKeyValue& k : ownSyncKeyValues(c))
    own.push_back(fmt::format("{}={}", k.label, k.value));
  const std::string params = own.empty() ? "" : fmt::format(" ({})", fmt::join(own, ", "));
  return fmt::format("{}{}, codec {}{}", s.algorithm, params, codec,
                     s.hierarchical ? ", hierarchical" : "");
}

std::string rankRange(const Topology& t, size_t regionIndex) {
  const int64_t first = rankOf(t, static_cast<int64_t>(regionIndex), 0);
  if (t.workersPerRegion == 1) return fmt::format("rank {}", first);
  return fmt::format("ranks {}-{}", first, first + t.workersPerRegion - 1);
}

}  // namespace

std::string renderRttMatrix(const Topology& t) {
  const size_t width = nameWidth(t.regions, 6) + 2;
  std::string out = fmt::format("{:<{}}", "", width);
  for (const std::string& r : t.regions) out += fmt::format("{:>{}}", r, width);
  out += "\n";
  for (size_t i = 0; i < t.regions.size(); ++i) {
    out += fmt::format("{:<{}}", t.regions[i], width);
    for (size_t j = 0; j < t.regions.size(); ++j) {
      const std::string cell =
          i == j ? std::string("-")
                 : fmt::format("{:g}", static_cast<double>(t.rtt[i][j].count()) / 1000.0);
      out += fmt::format("{:>{}}", cell, width);
    }
    out += "\n";
  }
  return out;
}

std::string renderHeader(const Topology& t, const WorkerConfig& config, const RunPaths& paths,
                         bool uplinkPerRegion) {
  std::string out;
  out +=
      fmt::format("geotrain local: {} region{} x {} worker{} = {} worker{}\n", t.regions.size(),
                  t.regions.size() == 1 ? "" : "s", t.workersPerRegion,
                  t.workersPerRegion == 1 ? "" : "s", t.worldSize(), t.worldSize() == 1 ? "" : "s");
  out += fmt::format("  run folder  {}\n", paths.outDir.string());
  const auto& tr = config.training;
  out += fmt::format(
      "  training    {} steps of {} on {}, batch {}, lr {}, {}, {} thread{} per worker\n", tr.steps,
      config.model.torchscript.empty() ? config.model.builtin : config.model.torchscript,
      config.dataset.name, tr.batchSize, tr.lr,
      tr.evalInterval > 0 ? fmt::format("eval every {} steps", tr.evalInterval)
                          : std::string("eval at the end"),
      tr.threads, tr.threads == 1 ? "" : "s");
  out += fmt::format("  sync        {}\n", syncText(config));
  std::string regions;
  for (size_t i = 0; i < t.regions.size(); ++i) {
    regions += fmt::format("{}{} ({})", i == 0 ? "" : ", ", t.regions[i], rankRange(t, i));
  }
  out += fmt::format("  regions     {}\n", regions);
  out += fmt::format("  network     preset {}; WAN uplink {}; LAN inside a region unshaped\n",
                     presetName(t.preset), uplinkText(t.uplink, uplinkPerRegion));
  if (t.regions.size() > 1) {
    out += "  round-trip times (ms):\n";
    const std::string matrix = renderRttMatrix(t);
    size_t start = 0;
    while (start < matrix.size()) {
      const size_t nl = matrix.find('\n', start);
      out += "    " + matrix.substr(start, nl - start) + "\n";
      start = nl + 1;
    }
  }
  out += fmt::format("  logs        {}/worker-<rank>.log, launcher {}\n", paths.logsDir.string(),
                     paths.runLog.string());
  out += fmt::format("  progress    {}\n", paths.csv.string());
  return out;
}

std::vector<std::string> renderRegionLines(const RunState& state,
                                           const std::vector<uint64_t>& wanSentBefore,
                                           double secondsSince) {
  const Topology& t = state.topology();
  const size_t width = nameWidth(t.regions, 6);
  const int stepWidth = static_cast<int>(std::to_string(state.totalSteps()).size());
  std::vector<std::string> lines;
  for (size_t i = 0; i < t.regions.size(); ++i) {
    const RegionSnapshot s = state.regionSnapshot(i);
    const uint64_t before = i < wanSentBefore.size() ? wanSentBefore[i] : 0;
    const double rate = secondsSince > 0 && s.wanSentBytes >= before
                            ? static_cast<double>(s.wanSentBytes - before) / 1e6 / secondsSince
                            : 0.0;
    lines.push_back(fmt::format(
        "{:<{}}  step {:>{}}/{}  loss {:>6}  {:>7.0f} samples/s  WAN {:>6.2f} MB/s  staleness "
        "{:>4}  delay {:>3}  eval {:>6}{}",
        t.regions[i], width, s.step, stepWidth, state.totalSteps(), number(s.loss, 4),
        s.samplesPerSecond, rate, number(s.stalenessMean, 1), number(s.delay, 0),
        s.evalAccuracy || !s.evalLoss ? percent(s.evalAccuracy) : number(s.evalLoss, 3),
        s.done ? "  done" : ""));
  }
  return lines;
}

void LiveProgress::update(const RunState& state, double wallSeconds, bool force) {
  const double interval = tty_ ? kTtyRefreshSeconds : kPlainRefreshSeconds;
  if (!force && wallSeconds - lastDraw_ < interval) return;
  const double since = wallSeconds - (drawn_ ? lastDraw_ : 0.0);
  std::vector<std::string> lines = renderRegionLines(state, wanAtLastDraw_, since);
  lines.insert(lines.begin(), fmt::format("[{:7.1f} s]", wallSeconds));

  std::string text;
  if (tty_ && linesOnScreen_ > 0) text += fmt::format("\x1b[{}F", linesOnScreen_);
  for (const std::string& line : lines) text += (tty_ ? "\x1b[2K" : "") + line + "\n";
  out_ << text << std::flush;
  linesOnScreen_ = lines.size();

  wanAtLastDraw_.clear();
  for (size_t i = 0; i < state.topology().regions.size(); ++i) {
    wanAtLastDraw_.push_back(state.regionSnapshot(i).wanSentBytes);
  }
  lastDraw_ = wallSeconds;
  drawn_ = true;
}

std::string renderSummary(const RunSummary& summary, const RunPaths& paths) {
  std::vector<std::string> names;
  for (const auto& [name, group] : summary.regions) names.push_back(name);
  names.emplace_back("overall");
  const size_t width = nameWidth(names, 6);

  std::string out =
      fmt::format("summary ({}, {:.1f} s)\n", summary.outcome, summary.overall.wallSeconds);
  // A regression or a language model has a loss and no accuracy.
  const bool lossOnly = !summary.overall.testAccuracy && summary.overall.testLoss;
  out += fmt::format(
      "  {:<{}}  {:>8}  {:>8}  {:>7}  {:>9}  {:>9}  {:>11}  {:>9}  {:>9}  {:>7}  {:>6}\n", "region",
      width, lossOnly ? "test loss" : "test acc", "wall s", "steps/s", "WAN MB", "LAN MB",
      "compression", "stale avg", "stale max", "missing", "wait s");
  auto row = [&](const std::string& name, const GroupSummary& g) {
    out += fmt::format(
        "  {:<{}}  {:>8}  {:>8.1f}  {:>7}  {:>9}  {:>9}  {:>11}  {:>9}  {:>9}  {:>7}  {:>6}\n",
        name, width, lossOnly ? number(g.testLoss, 4) : percent(g.testAccuracy), g.wallSeconds,
        number(g.stepsPerSecond, 2), megabytes(g.wanBytes()), megabytes(g.lanBytes()),
        g.compressionRatio ? fmt::format("{:.1f}x", *g.compressionRatio) : std::string("-"),
        number(g.stalenessMean, 2), number(g.stalenessMax, 0), g.missing, number(g.waitSeconds, 1));
  };
  for (const auto& [name, group] : summary.regions) row(name, group);
  row("overall", summary.overall);
  out +=
      "  (WAN/LAN MB: bytes sent + received; compression: payload / WAN bytes sent; wait s: the "
      "longest time a worker waited for peers or its uplink)\n";
  if (summary.overall.perStep) {
    out += fmt::format("  {:<{}}  {:>8}  {:>8}  {:>8}  {:>8}  {:>8}  {:>9}\n", "ms/step", width,
                       "compute", "sync", "codec", "encode", "waiting", "peak RSS");
    auto perStep = [&](const std::string& name, const GroupSummary& g) {
      if (!g.perStep) return;
      out += fmt::format(
          "  {:<{}}  {:>8.1f}  {:>8.1f}  {:>8.1f}  {:>8.1f}  {:>8.1f}  {:>9}\n", name, width,
          g.perStep->computeMs, g.perStep->syncMs, g.perStep->codecMs, g.perStep->encodeMs,
          g.perStep->waitMs,
          g.maxRssBytes ? fmt::format("{:.0f} MB", *g.maxRssBytes / 1e6) : std::string("-"));
    };
    for (const auto& [name, group] : summary.regions) perStep(name, group);
    perStep("overall", summary.overall);
    out +=
        "  (the training thread's time per step: computing, and in the synchronizer, of which "
        "encoding and decoding (codec; of that, encoding its own updates: encode), and waiting "
        "for peers or the uplink; the largest peak resident memory of one worker)\n";
  }

  std::string tta;
  for (const auto& [threshold, seconds] : summary.timeToAccuracy) {
    tta += fmt::format("{}{:.0f}%: {}", tta.empty() ? "" : ", ", threshold * 100,
                       seconds ? fmt::format("{:.1f} s", *seconds) : std::string("not reached"));
  }
  if (!lossOnly) out += fmt::format("  time to accuracy (rank 0)  {}\n", tta);
  if (summary.modelsAgree) {
    out += fmt::format("  final models   {}\n", *summary.modelsAgree
                                                    ? "identical on every worker that finished"
                                                    : "DIFFER between workers");
  }
  const auto sec = [](const std::optional<double>& v) {
    return v ? fmt::format("{:.1f} s", *v) : std::string("-");
  };
  for (const FaultSummary& f : summary.faults) {
    if (f.kind == "kill") {
      out += fmt::format(
          "  fault kill {} at {:.1f} s: down {}, rejoined {} after restart{}; others' longest "
          "step {}; finished {} after the others\n",
          f.what, f.atSeconds, sec(f.downSeconds), sec(f.rejoinSeconds),
          f.rejoinStep ? fmt::format(" (at step {})", *f.rejoinStep) : std::string(),
          sec(f.othersStallSeconds), sec(f.finishSkewSeconds));
    } else if (f.kind == "throttle") {
      out += fmt::format(
          "  fault throttle {} from {:.1f} s: others' longest step {}; finished {} after the "
          "others\n",
          f.what, f.atSeconds, sec(f.othersStallSeconds), sec(f.finishSkewSeconds));
    } else {
      out += fmt::format(
          "  fault partition {} {:.1f}-{} s: others' longest step {}; finished {} after the "
          "others\n",
          f.what, f.atSeconds, f.endSeconds ? fmt::format("{:.1f}", *f.endSeconds) : "?",
          sec(f.othersStallSeconds), sec(f.finishSkewSeconds));
    }
  }
  out += fmt::format("  progress CSV   {}\n", paths.csv.string());
  out += fmt::format("  summary JSON   {}\n", paths.summaryJson.string());
  out += fmt::format("  worker logs    {}/worker-<rank>.log\n", paths.logsDir.string());
  out += fmt::format("  launcher log   {}\n", paths.runLog.string());
  if (!paths.plot.empty()) out += fmt::format("  plot           {}\n", paths.plot.string());
  return out;
}

}  // namespace geo::local
