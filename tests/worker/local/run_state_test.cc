// What `geotrain local` makes of the workers' events: parsing, the CSV
// rows, the summary (table and summary.json) and the live progress lines.
// No processes: events are built from JSON text.

#include <gtest/gtest.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <sstream>
#include <string>
#include <vector>

#include "worker/local/display.h"
#include "worker/local/progress_csv.h"
#include "worker/local/run_state.h"
#include "worker/local/worker_event.h"

namespace geo::local {
namespace {

WorkerEvent event(const std::string& json) {
  auto e = parseWorkerEvent(json);
  EXPECT_TRUE(e.ok()) << json << ": " << e.status().toString();
  return e.ok() ? *e : WorkerEvent{};
}

std::string progress(int64_t rank, int64_t step, double time, const std::string& extra) {
  return "{\"event\":\"progress\",\"rank\":" + std::to_string(rank) +
         ",\"step\":" + std::to_string(step) + ",\"time\":" + std::to_string(time) + extra + "}";
}

Topology twoByTwo() {
  TopologyOptions o;
  o.regions = "london,tokyo";
  o.workersPerRegion = 2;
  return *makeTopology(o);
}

TEST(LocalWorkerEvent, ParsesTheDocumentedLines) {
  WorkerEvent s = event(
      R"({"event":"start","rank":0,"region":"london","localRank":0,"worldSize":4,"model":"mlp",)"
      R"("parameters":203530,"shardSamples":15000,"steps":1000,"algorithm":"dts","time":0.01})");
  EXPECT_EQ(s.kind, EventKind::kStart);
  EXPECT_EQ(s.region, "london");
  EXPECT_EQ(s.worldSize, 4);
  EXPECT_EQ(s.parameters, 203530);
  EXPECT_EQ(s.steps, 1000);
  EXPECT_EQ(s.algorithm, "dts");
  EXPECT_DOUBLE_EQ(*s.time, 0.01);

  WorkerEvent p = event(
      R"({"event":"progress","rank":0,"step":50,"time":3.2,"loss":0.61,"lr":0.05,)"
      R"("samplesPerSecond":1200.5,"evalAccuracy":0.81,"sync":{"delay":4,"appliedUpdates":12,)"
      R"("stalenessMean":4.0,"stalenessMax":4,"missing":0,"waitSeconds":0.2},"bytes":)"
      R"({"wanSent":123456,"wanReceived":120000,"lanSent":0,"lanReceived":0,"payload":900000}})");
  EXPECT_EQ(p.kind, EventKind::kProgress);
  EXPECT_EQ(p.step, 50);
  EXPECT_DOUBLE_EQ(*p.loss, 0.61);
  EXPECT_DOUBLE_EQ(*p.samplesPerSecond, 1200.5);
  EXPECT_DOUBLE_EQ(*p.evalAccuracy, 0.81);
  EXPECT_DOUBLE_EQ(*p.sync.delay, 4);
  EXPECT_EQ(p.sync.appliedUpdates, 12);
  EXPECT_DOUBLE_EQ(*p.sync.stalenessMax, 4);
  EXPECT_EQ(p.sync.missing, 0);
  EXPECT_EQ(p.bytes.wanSent, 123456u);
  EXPECT_EQ(p.bytes.payload, 900000u);

  WorkerEvent d =
      event(R"({"event":"done","rank":0,"step":1000,"time":61.2,"testAccuracy":0.874})");
  EXPECT_EQ(d.kind, EventKind::kDone);
  EXPECT_DOUBLE_EQ(*d.testAccuracy, 0.874);

  WorkerEvent e =
      event(R"({"event":"error","rank":3,"message":"allreduce: rank 3 sent no gradient"})");
  EXPECT_EQ(e.kind, EventKind::kError);
  EXPECT_EQ(e.message, "allreduce: rank 3 sent no gradient");
}

TEST(LocalWorkerEvent, LenientOnContentStrictOnForm) {
  // Unknown keys and events are ignored; wrong types count as absent.
  WorkerEvent e = event(R"({"event":"progress","step":"ten","loss":null,"new":{"a":[1]},"sync":7,)"
                        R"("bytes":{"wanSent":-5,"payload":1e3},"evalAccuracy":0.5})");
  EXPECT_FALSE(e.step.has_value());
  EXPECT_FALSE(e.loss.has_value());
  EXPECT_FALSE(e.rank.has_value());
  EXPECT_FALSE(e.sync.delay.has_value());
  EXPECT_FALSE(e.bytes.wanSent.has_value());
  EXPECT_EQ(e.bytes.payload, 1000u);
  EXPECT_DOUBLE_EQ(*e.evalAccuracy, 0.5);
  EXPECT_EQ(event(R"({"event":"heartbeat"})").kind, EventKind::kOther);

  for (const char* bad : {"", "hello", "[1,2]", "{\"step\":1}", "{\"event\":5}",
                          "{\"event\":", "42", "{\"event\":\"progress\"} trailing"}) {
    EXPECT_FALSE(parseWorkerEvent(bad).ok()) << bad;
  }
}

TEST(LocalCsv, HeaderAndRows) {
  EXPECT_EQ(
      csvHeader(),
      "wall_seconds,rank,region,step,loss,samples_per_second,eval_accuracy,eval_step,"
      "eval_loss,wan_sent_bytes,wan_received_bytes,lan_sent_bytes,lan_received_bytes,payload_bytes,"
      "staleness_mean,"
      "staleness_max,delay,applied_updates,missing,event\n");
  const WorkerEvent full = event(
      progress(2, 50, 3.2,
               R"(,"loss":0.61,"samplesPerSecond":1200.5,"evalAccuracy":0.81,"sync":{"delay":4,)"
               R"("stalenessMean":3.5,"stalenessMax":4,"appliedUpdates":12,"missing":1},)"
               R"("bytes":{"wanSent":10,"wanReceived":20,)"
               R"("lanSent":30,"lanReceived":40,"payload":80})"));
  EXPECT_EQ(csvRow(1.23456, 2, "tokyo", full),
            "1.235,2,tokyo,50,0.61,1200.5,0.81,50,,10,20,30,40,80,3.5,4,4,12,1,progress\n");
  // Absent values are empty cells: no evaluation on this step.
  const WorkerEvent sparse = event(progress(0, 60, 4.0, R"(,"loss":0.5)"));
  EXPECT_EQ(csvRow(2, 0, "london", sparse), "2.000,0,london,60,0.5,,,,,,,,,,,,,,,progress\n");
  // A background evaluation: the step it measured, earlier than the line's.
  const WorkerEvent late = event(progress(
      0, 70, 5.0, R"(,"loss":0.4,"evalAccuracy":0.83,"evalStep":50,"evalAgeSeconds":1.5)"));
  EXPECT_EQ(late.evalStep, 50);
  EXPECT_EQ(late.evalAgeSeconds, 1.5);
  EXPECT_EQ(csvRow(3, 0, "london", late), "3.000,0,london,70,0.4,,0.83,50,,,,,,,,,,,,progress\n");
  // A regression job's evaluation: a loss, no accuracy.
  const WorkerEvent mse = event(progress(0, 80, 6.0, R"(,"loss":0.3,"evalLoss":0.0125)"));
  EXPECT_EQ(mse.evalLoss, 0.0125);
  EXPECT_EQ(csvRow(4, 0, "london", mse), "4.000,0,london,80,0.3,,,80,0.0125,,,,,,,,,,,progress\n");
}

TEST(LocalTimeToAccuracy, FirstEvaluationAtOrAboveEachThreshold) {
  const std::vector<EvalPoint> evals = {
      {1, 0.5, {}}, {2, 0.8, {}}, {3, 0.79, {}}, {4, 0.86, {}}, {5, 0.9, {}}};
  const auto tta = timeToAccuracy(evals, {0.80, 0.85, 0.88, 0.95});
  ASSERT_EQ(tta.size(), 4u);
  EXPECT_EQ(tta[0].second, 2.0);  // "at or above"
  EXPECT_EQ(tta[1].second, 4.0);
  EXPECT_EQ(tta[2].second, 5.0);
  EXPECT_FALSE(tta[3].second.has_value());
  EXPECT_FALSE(timeToAccuracy({}, {0.8})[0].second.has_value());
}

// Two regions of two workers; rank r sends four progress events, then "done".
RunState finishedRun() {
  RunState state(twoByTwo(), 100);
  for (int64_t r = 0; r < 4; ++r) {
    state.record(r, 0.1, event(R"({"event":"start","time":0})"));
    for (int64_t k = 1; k <= 4; ++k) {
      const std::string eval =
          r == 0 ? fmt::format(R"(,"evalAccuracy":{:.2f})", 0.7 + 0.05 * static_cast<double>(k))
                 : std::string();
      const std::string fields = fmt::format(
          R"(,"loss":{},"samplesPerSecond":100{},"sync":{{"delay":{},"appliedUpdates":{},)"
          R"("stalenessMean":{},"stalenessMax":{},"missing":{},"waitSeconds":{}}},)"
          R"("bytes":{{"wanSent":{},"wanReceived":{},"lanSent":10,"lanReceived":20,"payload":{}}})",
          1.0 / static_cast<double>(k), eval, 2 + r, r + 1, r, 2 * r, r == 3 ? 2 : 0,
          0.25 * static_cast<double>(k * (3 - r)), 1000 * k * (r + 1), 500 * k, 4000 * k * (r + 1));
      state.record(r, static_cast<double>(k) + 0.01 * static_cast<double>(r),
                   event(progress(r, 25 * k, 0.5 * static_cast<double>(k * (r + 1)), fields)));
    }
    state.record(r, 5.0 + static_cast<double>(r),
                 event(fmt::format(R"({{"event":"done","step":100,"testAccuracy":{}}})",
                                   0.8 + 0.02 * static_cast<double>(r))));
  }
  return state;
}

// Steps/s is training's: events after the last step (evaluations of
// snapshots that waited for the background evaluation, the final one) do
// not stretch the worker's time.
TEST(LocalRunSummary, StepsPerSecondEndsAtTheLastStep) {
  RunState state = finishedRun();
  state.record(3, 9.0, event(progress(3, 100, 30.0, R"(,"evalAccuracy":0.9,"evalStep":75)")));
  EXPECT_DOUBLE_EQ(*state.summarize(10.0).overall.stepsPerSecond, 100.0 / 8.0);
}

// The last step's event comes after the final evaluation it reports: its
// stepEndedAt, not its time, ends the worker's training.
TEST(LocalRunSummary, StepsPerSecondEndsWhenTheLastStepEndedNotAfterItsEvaluation) {
  RunState state(twoByTwo(), 100);
  for (int64_t r = 0; r < 4; ++r) {
    state.record(r, 0.1, event(R"({"event":"start","time":0})"));
    state.record(r, 2.0, event(progress(r, 50, 4.0, "")));
    const std::string ended = r == 2 ? R"(,"stepEndedAt":9.5)" : R"(,"stepEndedAt":8.0)";
    state.record(r, 6.0, event(progress(r, 100, 10.0, ended + R"(,"evalAccuracy":0.9)")));
  }
  EXPECT_DOUBLE_EQ(*state.summarize(10.0).overall.stepsPerSecond, 100.0 / 9.5);
  // Without stepEndedAt (an older worker), the event's time.
  RunState old(twoByTwo(), 100);
  for (int64_t r = 0; r < 4; ++r) old.record(r, 6.0, event(progress(r, 100, 10.0, "")));
  EXPECT_DOUBLE_EQ(*old.summarize(10.0).overall.stepsPerSecond, 100.0 / 10.0);
}

TEST(LocalRunSummary, NumbersFromEvents) {
  const RunState state = finishedRun();
  const RunSummary s = state.summarize(10.0);
  const GroupSummary& all = s.overall;
  EXPECT_DOUBLE_EQ(all.wallSeconds, 10.0);
  EXPECT_NEAR(*all.testAccuracy, 0.83, 1e-12);  // mean of 0.80, 0.82, 0.84, 0.86
  EXPECT_EQ(all.steps, 100);
  // Worker time at the last event with one: 0.5 * 4 * (r + 1); slowest is rank 3 (8 s).
  EXPECT_DOUBLE_EQ(*all.stepsPerSecond, 100.0 / 8.0);
  EXPECT_EQ(all.wanSentBytes, 4000u * (1 + 2 + 3 + 4));
  EXPECT_EQ(all.wanReceivedBytes, 4u * 2000);
  EXPECT_EQ(all.wanBytes(), 40000u + 8000u);
  EXPECT_EQ(all.lanBytes(), 4u * 30);
  EXPECT_EQ(all.payloadBytes, 160000u);
  EXPECT_DOUBLE_EQ(*all.compressionRatio, 4.0);
  // Weighted by applied updates (1..4): (0*1 + 1*2 + 2*3 + 3*4) / 10.
  EXPECT_DOUBLE_EQ(*all.stalenessMean, 2.0);
  EXPECT_DOUBLE_EQ(*all.stalenessMax, 6.0);
  EXPECT_EQ(all.missing, 2);
  // The longest wait, each worker's last cumulative figure: rank 0's 0.25 * 4 * 3.
  EXPECT_DOUBLE_EQ(*all.waitSeconds, 3.0);

  ASSERT_EQ(s.regions.size(), 2u);
  EXPECT_EQ(s.regions[0].first, "london");
  const GroupSummary& london = s.regions[0].second;
  EXPECT_NEAR(*london.testAccuracy, 0.81, 1e-12);
  EXPECT_DOUBLE_EQ(london.wallSeconds, 6.0);  // its last "done"
  EXPECT_EQ(london.wanSentBytes, 4000u * 3);
  EXPECT_DOUBLE_EQ(*london.stalenessMean, 2.0 / 3.0);
  EXPECT_EQ(london.missing, 0);
  EXPECT_EQ(s.regions[1].second.missing, 2);
  EXPECT_DOUBLE_EQ(*s.regions[1].second.waitSeconds, 1.0);  // rank 2: 0.25 * 4 * 1
  EXPECT_DOUBLE_EQ(*s.regions[1].second.stepsPerSecond, 100.0 / 8.0);

  // Rank 0 evaluates 0.75, 0.80, 0.85, 0.90 at wall 1, 2, 3, 4.
  ASSERT_EQ(s.timeToAccuracy.size(), 3u);
  EXPECT_DOUBLE_EQ(*s.timeToAccuracy[0].second, 2.0);
  EXPECT_DOUBLE_EQ(*s.timeToAccuracy[1].second, 3.0);
  EXPECT_DOUBLE_EQ(*s.timeToAccuracy[2].second, 4.0);
}

// Each group's longest step is the longest of its workers' (a stall shows
// there), and absent where none reported one.
TEST(LocalRunSummary, LongestStepIsTheLongestOfAnyWorker) {
  RunState state(twoByTwo(), 100);
  state.record(0, 1.0, event(progress(0, 100, 1.0, R"(,"stepSecondsMax":0.25)")));
  state.record(1, 1.0, event(progress(1, 100, 1.0, R"(,"stepSecondsMax":1.5)")));
  state.record(2, 1.0, event(progress(2, 100, 1.0, "")));
  const RunSummary s = state.summarize(2.0);
  EXPECT_DOUBLE_EQ(*s.regions[0].second.longestStepSeconds, 1.5);
  EXPECT_FALSE(s.regions[1].second.longestStepSeconds.has_value());
  EXPECT_DOUBLE_EQ(*s.overall.longestStepSeconds, 1.5);
  const auto j = nlohmann::json::parse(summaryJson(s));
  EXPECT_DOUBLE_EQ(j["longestStepSeconds"].get<double>(), 1.5);
  EXPECT_TRUE(j["regions"]["tokyo"]["longestStepSeconds"].is_null());
}

// Each group's milliseconds per step: its workers' seconds summed over
// their steps summed; workers without stepTime are left out.
TEST(LocalRunSummary, TimePerStepFromTheWorkersStepTime) {
  RunState state(twoByTwo(), 100);
  const auto timed = [](double compute, double sync, double codec, double wait) {
    return fmt::format(
        R"(,"stepTime":{{"steps":100,"computeSeconds":{},"syncSeconds":{},"codecSeconds":{},)"
        R"("encodeSeconds":{},"waitSeconds":{}}})",
        compute, sync, codec, codec / 5, wait);
  };
  state.record(0, 1.0, event(progress(0, 100, 1.0, timed(0.5, 0.3, 0.1, 0.2))));
  state.record(1, 1.0, event(progress(1, 100, 1.0, timed(0.7, 0.1, 0.05, 0.0))));
  state.record(2, 1.0, event(progress(2, 100, 1.0, timed(1.0, 2.0, 0.5, 1.25))));
  state.record(3, 1.0, event(progress(3, 100, 1.0, R"(,"maxRssBytes":123456789)")));
  const RunSummary s = state.summarize(2.0);
  EXPECT_EQ(s.regions[1].second.maxRssBytes, 123456789u);
  EXPECT_FALSE(s.regions[0].second.maxRssBytes.has_value());
  EXPECT_EQ(s.overall.maxRssBytes, 123456789u);
  ASSERT_TRUE(s.regions[0].second.perStep.has_value());
  const StepBreakdown& london = *s.regions[0].second.perStep;
  EXPECT_DOUBLE_EQ(london.computeMs, 1.2 / 200 * 1e3);
  EXPECT_DOUBLE_EQ(london.syncMs, 0.4 / 200 * 1e3);
  EXPECT_DOUBLE_EQ(london.codecMs, 0.15 / 200 * 1e3);
  EXPECT_DOUBLE_EQ(london.encodeMs, 0.03 / 200 * 1e3);
  EXPECT_DOUBLE_EQ(london.waitMs, 0.2 / 200 * 1e3);
  // tokyo: rank 2 alone (rank 3 sent none).
  EXPECT_DOUBLE_EQ(s.regions[1].second.perStep->syncMs, 20.0);
  EXPECT_DOUBLE_EQ(s.overall.perStep->computeMs, 2.2 / 300 * 1e3);
  const auto j = nlohmann::json::parse(summaryJson(s));
  EXPECT_DOUBLE_EQ(j["regions"]["tokyo"]["perStepMilliseconds"]["wait"].get<double>(), 12.5);
  EXPECT_DOUBLE_EQ(j["regions"]["tokyo"]["perStepMilliseconds"]["encode"].get<double>(), 1.0);
  // A run whose workers report no stepTime has none.
  RunState bare(twoByTwo(), 100);
  bare.record(0, 1.0, event(progress(0, 10, 1.0, "")));
  EXPECT_FALSE(bare.summarize(2.0).overall.perStep.has_value());
  EXPECT_TRUE(
      nlohmann::json::parse(summaryJson(bare.summarize(2.0)))["perStepMilliseconds"].is_null());
}

TEST(LocalRunSummary, SummaryJsonHasTheDocumentedKeys) {
  RunSummary s = finishedRun().summarize(10.0);
  s.outcome = "succeeded";
  const auto j = nlohmann::json::parse(summaryJson(s));
  EXPECT_EQ(j["outcome"], "succeeded");
  for (const char* key : {"wallSeconds", "testAccuracy", "steps", "stepsPerSecond", "wanBytes",
                          "lanBytes", "payloadBytes", "compressionRatio", "stalenessMean",
                          "stalenessMax", "missing", "waitSeconds"}) {
    EXPECT_TRUE(j.contains(key)) << key;
    EXPECT_TRUE(j["regions"]["tokyo"].contains(key)) << key;
  }
  EXPECT_EQ(j["wanBytes"], 48000);
  EXPECT_DOUBLE_EQ(j["compressionRatio"].get<double>(), 4.0);
  EXPECT_EQ(j["timeToAccuracy"].size(), 3u);
  EXPECT_DOUBLE_EQ(j["timeToAccuracy"]["0.80"].get<double>(), 2.0);
  EXPECT_DOUBLE_EQ(j["timeToAccuracy"]["0.88"].get<double>(), 4.0);
}

TEST(LocalRunSummary, UnknownValuesAreNullNotZero) {
  RunState state(twoByTwo(), 100);
  state.record(0, 1.0, event(progress(0, 10, 1.0, R"(,"loss":2.0)")));
  RunSummary s = state.summarize(3.0);
  EXPECT_FALSE(s.overall.testAccuracy.has_value());
  EXPECT_EQ(s.overall.steps, 0);  // ranks 1-3 never reported a step
  EXPECT_FALSE(s.overall.compressionRatio.has_value());
  EXPECT_FALSE(s.overall.stalenessMean.has_value());
  s.outcome = "interrupted";
  const auto j = nlohmann::json::parse(summaryJson(s));
  EXPECT_TRUE(j["testAccuracy"].is_null());
  EXPECT_TRUE(j["compressionRatio"].is_null());
  EXPECT_TRUE(j["timeToAccuracy"]["0.85"].is_null());
  EXPECT_DOUBLE_EQ(j["regions"]["london"]["wallSeconds"].get<double>(), 3.0);
}

TEST(LocalRunState, FieldsMissingFromAnEventKeepTheirLastValue) {
  RunState state(twoByTwo(), 100);
  state.record(
      1, 1.0,
      event(progress(1, 10, 1.0,
                     R"(,"evalAccuracy":0.7,"bytes":{"wanSent":100},"sync":{"delay":3})")));
  state.record(1, 2.0, event(progress(1, 20, 2.0, R"(,"bytes":{"wanReceived":5})")));
  state.record(1, 2.5, event(R"({"event":"error","message":"boom"})"));
  const RankProgress& p = state.rank(1);
  EXPECT_EQ(p.step, 20);
  EXPECT_EQ(p.bytes.wanSent, 100u);
  EXPECT_EQ(p.bytes.wanReceived, 5u);
  EXPECT_DOUBLE_EQ(*p.sync.delay, 3);
  EXPECT_DOUBLE_EQ(*p.evalAccuracy, 0.7);
  EXPECT_EQ(p.evals.size(), 1u);
  EXPECT_EQ(p.errorMessage, "boom");
  EXPECT_EQ(p.region, "london");
  EXPECT_EQ(p.localIndex, 1);
  EXPECT_THROW(state.record(4, 0, WorkerEvent{}), geo::Error);
}

TEST(LocalDisplay, RegionLinesShowTheSlowestStepAndSums) {
  RunState state(twoByTwo(), 1000);
  state.record(
      0, 1,
      event(progress(
          0, 300, 1,
          R"(,"loss":0.5,"samplesPerSecond":100,"evalAccuracy":0.8,"sync":{"delay":4,"stalenessMean":2},"bytes":{"wanSent":3000000})")));
  state.record(
      1, 1,
      event(progress(
          1, 250, 1,
          R"(,"loss":0.7,"samplesPerSecond":50,"sync":{"delay":6},"bytes":{"wanSent":1000000})")));
  const auto lines = renderRegionLines(state, {2000000, 0}, 2.0);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_NE(lines[0].find("london"), std::string::npos);
  EXPECT_NE(lines[0].find("step  250/1000"), std::string::npos) << lines[0];
  EXPECT_NE(lines[0].find("loss 0.6000"), std::string::npos) << lines[0];
  EXPECT_NE(lines[0].find("150 samples/s"), std::string::npos) << lines[0];
  EXPECT_NE(lines[0].find("WAN   1.00 MB/s"), std::string::npos) << lines[0];  // (4 - 2) MB / 2 s
  EXPECT_NE(lines[0].find("delay   4"), std::string::npos) << lines[0];        // the leader's
  EXPECT_NE(lines[0].find("eval  80.0%"), std::string::npos) << lines[0];
  EXPECT_NE(lines[1].find("tokyo   step    0/1000  loss      -"), std::string::npos) << lines[1];
}

TEST(LocalDisplay, LiveProgressRedrawsInPlaceOnlyOnATerminal) {
  RunState state(twoByTwo(), 100);
  std::ostringstream tty;
  LiveProgress live(tty, true);
  live.update(state, 0.5);  // not due yet: 1 s
  EXPECT_EQ(tty.str(), "");
  live.update(state, 1.0);
  live.update(state, 1.5);  // not due
  live.update(state, 2.1);
  // The first draw prints the block; the second moves up over it (3 lines:
  // time + 2 regions) and erases each line before rewriting it.
  const std::string text = tty.str();
  EXPECT_EQ(text.find("\x1b[3F"), text.rfind("\x1b[3F"));
  EXPECT_GT(text.find("\x1b[3F"), text.find("[    1.0 s]"));
  EXPECT_LT(text.find("\x1b[3F"), text.find("[    2.1 s]"));
  size_t erases = 0;
  for (size_t at = text.find("\x1b[2K"); at != std::string::npos;
       at = text.find("\x1b[2K", at + 1)) {
    ++erases;
  }
  EXPECT_EQ(erases, 6u);

  std::ostringstream plain;
  LiveProgress ci(plain, false);
  ci.update(state, 1.0);
  ci.update(state, 9.0);
  EXPECT_EQ(plain.str(), "");
  ci.update(state, 10.0);
  ci.update(state, 12.0, /*force=*/true);
  EXPECT_EQ(plain.str().find('\x1b'), std::string::npos);
  EXPECT_NE(plain.str().find("[   10.0 s]\nlondon"), std::string::npos) << plain.str();
  EXPECT_NE(plain.str().find("[   12.0 s]\nlondon"), std::string::npos) << plain.str();
}

TEST(LocalDisplay, HeaderAndSummaryNameThePaths) {
  const Topology t = twoByTwo();
  RunPaths paths;
  paths.outDir = "/runs/x";
  paths.logsDir = "/runs/x/logs";
  paths.runLog = "/runs/x/logs/launcher.log";
  paths.csv = "/runs/x/progress.csv";
  paths.summaryJson = "/runs/x/summary.json";
  WorkerConfig base;
  base.sync.algorithm = "dts";
  base.sync.delay.reset();
  const std::string header = renderHeader(t, base, paths);
  EXPECT_NE(header.find("2 regions x 2 workers = 4 workers"), std::string::npos) << header;
  EXPECT_NE(header.find("/runs/x"), std::string::npos);
  EXPECT_NE(header.find("london (ranks 0-1), tokyo (ranks 2-3)"), std::string::npos) << header;
  EXPECT_NE(header.find("delay D=auto"), std::string::npos) << header;
  EXPECT_NE(header.find("100mbit/s per worker"), std::string::npos) << header;
  EXPECT_NE(header.find("230"), std::string::npos);
  EXPECT_NE(header.find("/runs/x/logs/worker-<rank>.log"), std::string::npos);

  RunSummary s = finishedRun().summarize(10.0);
  s.outcome = "succeeded";
  paths.plot = "/tmp/acc.png";
  const std::string table = renderSummary(s, paths);
  EXPECT_NE(table.find("summary (succeeded, 10.0 s)"), std::string::npos) << table;
  EXPECT_NE(table.find("overall"), std::string::npos);
  EXPECT_NE(table.find("4.0x"), std::string::npos) << table;
  EXPECT_NE(table.find("80%: 2.0 s, 85%: 3.0 s, 88%: 4.0 s"), std::string::npos) << table;
  EXPECT_NE(table.find("/runs/x/progress.csv"), std::string::npos);
  EXPECT_NE(table.find("/tmp/acc.png"), std::string::npos);
}

}  // namespace
}  // namespace geo::local
