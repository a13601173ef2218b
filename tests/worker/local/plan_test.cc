// The job planner (worker/local/plan.h) on exact inputs: the payload's
// bytes as the worker's codec lays them out, each algorithm's step from
// compute, latency and uplink, the auto rules' K and D, the steps factor
// and its interpolation, the recommendation, the flags and their errors.

#include "worker/local/plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <string>
#include <vector>

#include "worker/local/cli.h"
#include "worker/sync/auto_rules.h"

namespace geo::local {
namespace {

// Two regions `rtt` apart, one worker each, a model of one tensor.
PlanInput twoRegions(double rtt, double uplink, int64_t values, double step) {
  PlanInput in;
  in.regions = {"a", "b"};
  in.rttSeconds = {{0, rtt}, {rtt, 0}};
  in.uplinkBytesPerSecond = uplink;
  in.tensorSizes = {values};
  in.codec = "identity";
  in.stepSeconds = step;
  in.codecSecondsPerValue = 0;  // the codec's and the synchronizer's terms
  in.syncSecondsPerStep = 0;    // have a test of their own
  return in;
}

const PlanRow& row(const Plan& p, const std::string& name) {
  const auto it = std::find_if(p.rows.begin(), p.rows.end(),
                               [&](const PlanRow& r) { return r.algorithm == name; });
  if (it == p.rows.end()) throw std::runtime_error("no row " + name);
  return *it;
}

TEST(Plan, PayloadIsTheWorkersEncodingPlusFrameHeaders) {
  PlanInput in = twoRegions(0, 0, 1, 0.01);
  in.tensorSizes = mlpTensorSizes(256);
  EXPECT_EQ(in.tensorSizes, (std::vector<int64_t>{200704, 256, 2560, 10}));
  in.codec = "qsgd";
  // 200704 values at 4 bits in buckets of 512: 392 scales and 100352 bytes
  // of codes; the three small tensors as fp32 (11304 bytes); two chunks of
  // 64 KiB, each with a 64-byte header and CURVE's 40.
  EXPECT_DOUBLE_EQ(planPayloadBytes(in, "qsgd"), 392 * 4 + 100352 + 11304 + 2 * 104);
  EXPECT_DOUBLE_EQ(planPayloadBytes(in, "identity"), 203530 * 4 + 13 * 104);
  EXPECT_DOUBLE_EQ(planPayloadBytes(in, "bf16"), 203530 * 2 + 7 * 104);
}

TEST(Plan, AllreduceWaitsForTheFarthestPeerAndTheUplinkEveryStep) {
  // 250000 values in fp32: 1 MB in 16 chunks; 1 MB/s up; 200 ms round trip.
  const auto p = plan(twoRegions(0.2, 1e6, 250000, 0.05));
  ASSERT_TRUE(p.ok()) << p.status().toString();
  const PlanRow& r = row(*p, "allreduce fp32");
  const double payload = 1e6 + 16 * 104;
  EXPECT_DOUBLE_EQ(r.stepSeconds, 0.05 + 0.1 + payload / 1e6);
  EXPECT_DOUBLE_EQ(r.wanBytesPerStep, payload);
  EXPECT_EQ(r.limit, "uplink");
  EXPECT_DOUBLE_EQ(r.stepsToTarget, 205);
  EXPECT_DOUBLE_EQ(r.secondsToTarget, 205 * r.stepSeconds);
  // The end: by reduce-scatter, each worker's uplink carrying half a model
  // out and half a model of average back, and four hops of 100 ms (a
  // model to the coordinator and the average back would take 2 * 0.1 + 2
  // * payload / 1e6: a second more).
  EXPECT_EQ(p->finalAverageWay, sync::FinalAverageWay::kReduceScatter);
  EXPECT_DOUBLE_EQ(p->finalAverageSeconds, 4 * 0.1 + payload / 1e6);
  // identity sends fp32 already: no second allreduce row.
  EXPECT_EQ(std::count_if(p->rows.begin(), p->rows.end(),
                          [](const PlanRow& x) { return x.algorithm.starts_with("allreduce"); }),
            1);
}

// A large model among four regions: the final average by reduce-scatter,
// each worker's uplink carrying 3/4 of a model out and 3/4 back, four hops;
// among two, half of one each way. A model two of which do not fit in the
// final average's budget (sync::kFinalModelsInFlightBytes) goes to the
// coordinator whole and comes back in shards each member forwards: the
// coordinator's uplink carrying one model's worth and each member's the
// rest of the others' shards, a hop more than whole; a small one whole.
TEST(Plan, TheFinalAverageOfALargeModelIsTakenByReduceScatterOrInShards) {
  using sync::FinalAverageWay;
  const auto fourRegions = [](int64_t values) {
    PlanInput in = twoRegions(0.2, 12.5e6, values, 0.2);
    in.regions = {"a", "b", "c", "d"};
    in.rttSeconds.assign(4, std::vector<double>(4, 0.2));
    for (size_t i = 0; i < 4; ++i) in.rttSeconds[i][i] = 0;
    return in;
  };
  const auto p = plan(fourRegions(20'000'000));
  ASSERT_TRUE(p.ok()) << p.status().toString();
  const double model = p->fp32PayloadBytes / 12.5e6;
  EXPECT_EQ(p->finalAverageWay, FinalAverageWay::kReduceScatter);
  EXPECT_EQ(p->finalAverageShards, 3u);
  EXPECT_DOUBLE_EQ(p->finalAverageSeconds, 4 * 0.1 + 1.5 * model);
  const auto two = plan(twoRegions(0.2, 12.5e6, 20'000'000, 0.2));
  ASSERT_TRUE(two.ok()) << two.status().toString();
  EXPECT_EQ(two->finalAverageWay, FinalAverageWay::kReduceScatter);
  EXPECT_DOUBLE_EQ(two->finalAverageSeconds, 4 * 0.1 + two->fp32PayloadBytes / 12.5e6);
  const auto large = plan(fourRegions(100'000'000));
  ASSERT_TRUE(large.ok()) << large.status().toString();
  const double largeModel = large->fp32PayloadBytes / 12.5e6;
  EXPECT_EQ(large->finalAverageWay, FinalAverageWay::kShards);
  EXPECT_DOUBLE_EQ(large->finalAverageSeconds, 3 * 0.1 + largeModel + (2 - 1.0 / 3) * largeModel);
  const auto small = plan(fourRegions(200'000));
  ASSERT_TRUE(small.ok()) << small.status().toString();
  EXPECT_EQ(small->finalAverageWay, FinalAverageWay::kWhole);
  EXPECT_EQ(small->finalAverageShards, 0u);
  EXPECT_DOUBLE_EQ(small->finalAverageSeconds, 2 * 0.1 + 4 * small->fp32PayloadBytes / 12.5e6);
}

TEST(Plan, DtsWaitsAtItsDueStepOnlyForWhatTheDelayDoesNotCover) {
  PlanInput in = twoRegions(0.2, 0, 1000, 0.1);  // unlimited uplink: a round takes 100 ms
  in.period = 4;
  in.delay = 2;  // 200 ms of steps: covers it
  auto p = plan(in);
  ASSERT_TRUE(p.ok());
  const PlanRow& covered = row(*p, "dts K=4 D=2");
  EXPECT_DOUBLE_EQ(covered.stepSeconds, 0.1);
  EXPECT_EQ(covered.limit, "compute");
  EXPECT_DOUBLE_EQ(covered.staleness, 2);
  in.delay = 0;  // due at once: 100 ms waited once every 4 steps
  p = plan(in);
  ASSERT_TRUE(p.ok());
  const PlanRow& waits = row(*p, "dts K=4 D=0");
  EXPECT_DOUBLE_EQ(waits.stepSeconds, 0.1 + 0.1 / 4);
  EXPECT_EQ(waits.limit, "compute");  // the larger part of the step
  in.period = 1;  // a round each step, each waited for: the latency is most of it
  in.stepSeconds = 0.05;
  p = plan(in);
  ASSERT_TRUE(p.ok());
  const PlanRow& everyStep = row(*p, "dts K=1 D=0");
  EXPECT_DOUBLE_EQ(everyStep.stepSeconds, 0.05 + 0.1);
  EXPECT_EQ(everyStep.limit, "latency");
}

TEST(Plan, DtsAutoChoosesTheWorkersOwnKAndD) {
  // 1 MB a round at 1 MB/s: a 1 s transfer over 100 ms steps wants K >= 20
  // (the uplink busy at most half a round): 32 from the start of 16. The
  // round arrives after 100 ms + 1.0017 s (its frame headers too): D = 12.
  auto p = plan(twoRegions(0.2, 1e6, 250000, 0.1));
  ASSERT_TRUE(p.ok());
  const PlanRow& a = row(*p, "dts K=auto D=auto");
  EXPECT_EQ(a.period, 32);
  EXPECT_EQ(a.delay, 12);
  EXPECT_DOUBLE_EQ(a.stepSeconds, 0.1);
  // A 10 s transfer is more than a round of 16 steps: the held-uplink rule
  // takes K to a cap of 64, and the uplink still sets the step.
  PlanInput capped = twoRegions(0.2, 1e5, 250000, 0.1);
  capped.maxAutoPeriod = 64;
  p = plan(capped);
  ASSERT_TRUE(p.ok());
  const PlanRow& held = row(*p, "dts K=auto D=auto");
  EXPECT_EQ(held.period, 64);
  EXPECT_EQ(held.limit, "uplink");
  EXPECT_NEAR(held.stepSeconds, (1e6 + 16 * 104) / 1e5 / 64, 1e-12);
  // Under the worker's own cap (1024), far enough for the rounds to carry
  // the transfer with the uplink busy at most half of each: K = 256, 25.6 s
  // of compute for 10 s through the uplink, and the step is the compute's.
  p = plan(twoRegions(0.2, 1e5, 250000, 0.1));
  ASSERT_TRUE(p.ok());
  const PlanRow& free = row(*p, "dts K=auto D=auto");
  EXPECT_EQ(free.period, 256);
  EXPECT_EQ(free.limit, "compute");
  EXPECT_DOUBLE_EQ(free.stepSeconds, 0.1);
}

// Reduce-scatter among 16 regions: each uplink carries 2 x 15/16 payloads
// a round instead of 15, over two hops (the slowest round trip, which D
// covers), and the codec's work is four payloads a round instead of
// sixteen. Between two regions it saves nothing: no row.
TEST(Plan, ReduceScatterSendsTwoPayloadsARoundOverTwoHops) {
  PlanInput in = twoRegions(0.2, 0, 250000, 0.1);  // unlimited uplink: latency alone
  in.maxAutoPeriod = 64;  // where all-gather's rounds cannot carry the uplink's
  in.regions.clear();
  for (int r = 0; r < 16; ++r) in.regions.push_back("r" + std::to_string(r));
  in.rttSeconds.assign(16, std::vector<double>(16, 0.2));
  for (size_t i = 0; i < 16; ++i) in.rttSeconds[i][i] = 0;
  in.codecSecondsPerValue = 1e-9;
  auto p = plan(in);
  ASSERT_TRUE(p.ok()) << p.status().toString();
  const PlanRow& g = row(*p, "dts K=auto D=auto");
  const PlanRow& s = row(*p, "dts K=auto D=auto reducescatter");
  const double payload = 1e6 + 16 * 104;
  EXPECT_DOUBLE_EQ(g.wanBytesPerStep * static_cast<double>(g.period), 15 * payload);
  EXPECT_DOUBLE_EQ(s.wanBytesPerStep * static_cast<double>(s.period), 2 * 15.0 / 16 * payload);
  EXPECT_EQ(g.delay, sync::autoDelaySteps(0.1, 0.1, in.maxAutoDelay).value_or(-1));
  EXPECT_EQ(s.delay, sync::autoDelaySteps(0.2, 0.1, in.maxAutoDelay).value_or(-1));
  EXPECT_GT(s.delay, g.delay);
  // 0.25 ms a payload on a core: 16 of them a round all-gathered, 4 scattered.
  EXPECT_NEAR(g.codecSeconds * static_cast<double>(g.period), 16 * 0.00025, 1e-12);
  EXPECT_NEAR(s.codecSeconds * static_cast<double>(s.period), 4 * 0.00025, 1e-12);
  // The uplink at 1 MB/s: all-gather's 15 MB a round hold the step, the
  // scattered 1.9 MB far less.
  in.uplinkBytesPerSecond = 1e6;
  p = plan(in);
  ASSERT_TRUE(p.ok());
  EXPECT_GT(row(*p, "dts K=auto D=auto reducescatter").stepsPerSecond,
            2 * row(*p, "dts K=auto D=auto").stepsPerSecond);
  // And sync.exchange auto moves there: far less time to the target.
  EXPECT_LT(row(*p, "dts K=auto D=auto reducescatter").secondsToTarget,
            sync::kExchangeMargin * row(*p, "dts K=auto D=auto").secondsToTarget);
  EXPECT_EQ(p->autoExchange, sync::Exchange::kReduceScatter);
  EXPECT_NE(formatPlan(in, *p).find("sync.exchange auto: would move to reducescatter"),
            std::string::npos);
  p = plan(twoRegions(0.2, 1e6, 250000, 0.1));
  ASSERT_TRUE(p.ok());
  EXPECT_THROW(row(*p, "dts K=auto D=auto reducescatter"), std::runtime_error);
  EXPECT_EQ(p->autoExchange, sync::Exchange::kAllGather);  // two workers
}

TEST(Plan, TheCodecsWorkIsOneEncodeAndADecodePerPeerEachExchange) {
  PlanInput in = twoRegions(0, 0, 1000000, 0.01);
  in.regions = {"a", "b", "c", "d"};
  in.rttSeconds.assign(4, std::vector<double>(4, 0.0));
  in.codecSecondsPerValue = 2e-9;
  in.syncSecondsPerStep = 1e-3;
  in.coresPerWorker = 0.5;  // 4 ns a value, 2 ms of synchronizer a step
  in.period = 8;
  const auto p = plan(in);
  ASSERT_TRUE(p.ok());
  // A million values: 4 ms a payload; one encode and three decodes.
  EXPECT_NEAR(row(*p, "allreduce fp32").codecSeconds, 0.016, 1e-12);
  EXPECT_NEAR(row(*p, "allreduce fp32").stepSeconds, 0.01 + 0.002 + 0.016, 1e-12);
  EXPECT_NEAR(row(*p, "dts K=8 D=auto").codecSeconds, 0.016 / 8, 1e-12);
  EXPECT_NEAR(row(*p, "dts K=8 D=auto").stepSeconds, 0.01 + 0.002 + 0.002, 1e-12);
  EXPECT_NEAR(row(*p, "swarm H=4").codecSeconds, 4 * 0.004 / 4, 1e-12);
}

TEST(Plan, HierarchicalLeadersSendToTheOtherLeadersOnly) {
  PlanInput in = twoRegions(0.1, 0, 1000, 0.01);
  in.regions = {"a", "b", "c"};
  in.rttSeconds = {{0, 0.1, 0.1}, {0.1, 0, 0.1}, {0.1, 0.1, 0}};
  in.workersPerRegion = 4;
  const double payload = 4000 + 104;
  auto p = plan(in);
  ASSERT_TRUE(p.ok());
  EXPECT_DOUBLE_EQ(row(*p, "allreduce fp32").wanBytesPerStep, 2 * payload);
  // The LAN is not counted, and the table says so.
  EXPECT_NE(formatPlan(in, *p).find("LAN reduce"), std::string::npos);
  in.hierarchical = false;  // every rank of the two other regions
  p = plan(in);
  ASSERT_TRUE(p.ok());
  EXPECT_DOUBLE_EQ(row(*p, "allreduce fp32").wanBytesPerStep, 8 * payload);
  EXPECT_EQ(formatPlan(in, *p).find("LAN reduce"), std::string::npos);
}

TEST(Plan, HierarchicalStepsHoldTheLeadersCipherWorkOnTheLan) {
  PlanInput in = twoRegions(0.1, 0, 1000, 0.01);
  in.regions = {"a", "b", "c"};
  in.rttSeconds = {{0, 0.1, 0.1}, {0.1, 0, 0.1}, {0.1, 0.1, 0}};
  in.workersPerRegion = 4;
  in.coresPerWorker = 0.5;
  in.cipherSecondsPerByte = 0;
  const auto without = plan(in);
  in.cipherSecondsPerByte = 1e-9;
  const auto fp32 = plan(in);
  in.lanCodec = "bf16";
  const auto bf16 = plan(in);
  ASSERT_TRUE(without.ok() && fp32.ok() && bf16.ok());
  // Three members' updates in and the result out to each: six payloads of
  // 1000 values (4000 bytes, and a chunk's header) through the leader's
  // cipher, on half a core.
  const double fp32Lan = 6 * (4000 + 104) * 1e-9 / 0.5;
  const double bf16Lan = 6 * (2000 + 104) * 1e-9 / 0.5;
  EXPECT_DOUBLE_EQ(fp32->lanSecondsPerStep, fp32Lan);
  EXPECT_DOUBLE_EQ(bf16->lanSecondsPerStep, bf16Lan);
  EXPECT_DOUBLE_EQ(without->lanSecondsPerStep, 0.0);
  // In every algorithm's step.
  for (const std::string name : {"allreduce fp32", "dts K=8 D=auto", "swarm H=4"}) {
    EXPECT_NEAR(row(*fp32, name).stepSeconds - row(*without, name).stepSeconds, fp32Lan, 1e-12)
        << name;
  }
  EXPECT_NE(formatPlan(in, *bf16).find("LAN reduce: 0.03 ms"), std::string::npos)
      << formatPlan(in, *bf16);
  // One worker a region, or no hierarchy: no LAN reduce.
  in.hierarchical = false;
  auto flat = plan(in);
  ASSERT_TRUE(flat.ok());
  EXPECT_DOUBLE_EQ(flat->lanSecondsPerStep, 0.0);
  // A LAN codec the workers do not have is refused, naming it.
  in.lanCodec = "qsgd";
  const auto bad = plan(in);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("--lan-codec qsgd (allowed: identity, bf16)"),
            std::string::npos)
      << bad.status().message();
}

TEST(Plan, SwarmSendsTwoPayloadsEveryHStepsAndNeverWaits) {
  PlanInput in = twoRegions(0.2, 1e6, 250000, 0.05);
  in.swarmH = 8;
  const auto p = plan(in);
  ASSERT_TRUE(p.ok());
  const PlanRow& s = row(*p, "swarm H=8");
  const double payload = 1e6 + 16 * 104;
  EXPECT_DOUBLE_EQ(s.wanBytesPerStep, 2 * payload / 8);
  EXPECT_DOUBLE_EQ(s.stepSeconds, 2 * payload / 1e6 / 8);  // the uplink, not the 50 ms
  EXPECT_TRUE(s.extrapolated);                             // only H = 4 was measured
}

TEST(Plan, RecommendsTheShortestTimeToTheTarget) {
  const auto p = plan(twoRegions(0.2, 1e6, 250000, 0.05));
  ASSERT_TRUE(p.ok());
  for (const PlanRow& r : p->rows) {
    EXPECT_GE(r.secondsToTarget, p->rows[p->recommended].secondsToTarget) << r.algorithm;
  }
  EXPECT_NE(formatPlan(twoRegions(0.2, 1e6, 250000, 0.05), *p).find("<- recommended"),
            std::string::npos);
}

TEST(Plan, BadInputNamesTheFieldAndWhatIsAllowed) {
  PlanInput in = twoRegions(0.2, 0, 10, 0);
  EXPECT_NE(plan(in).status().message().find("--step-time"), std::string::npos);
  in.stepSeconds = 0.01;
  in.codec = "zstd";
  EXPECT_NE(plan(in).status().message().find("allowed: identity, fp16, bf16, qsgd"),
            std::string::npos);
  in.codec = "qsgd";
  in.bits = 3;
  EXPECT_NE(plan(in).status().message().find("--bits 3 (allowed: 2, 4, 8)"), std::string::npos);
  in.bits = 4;
  in.rttSeconds = {{0, 0.2}, {0.1, 0}};
  EXPECT_NE(plan(in).status().message().find("the same both ways"), std::string::npos);
  in.regions = {"a"};  // one worker: nothing to plan
  in.rttSeconds = {{0}};
  EXPECT_NE(plan(in).status().message().find("one worker exchanges nothing"), std::string::npos);
  in.workersPerRegion = 2;  // two in one region: a LAN job
  EXPECT_TRUE(plan(in).ok());
}

TEST(Plan, FlagsBuildTheInputFromAPresetAsGeotrainLocalDoes) {
  CLI::App app("test", "geotrain");
  PlanOptions o;
  bool ran = false;
  addPlanCommand(app, o, [&] { ran = true; });
  std::vector<std::string> args = {"plan",  "--preset", "world16", "--step-time", "25ms", "--width",
                                   "25000", "--uplink", "1gbit",   "--delay",     "3"};
  std::reverse(args.begin(), args.end());
  app.parse(args);
  EXPECT_TRUE(ran);
  auto in = makePlanInput(o);
  ASSERT_TRUE(in.ok()) << in.status().toString();
  EXPECT_EQ(in->regions.size(), 16u);
  EXPECT_DOUBLE_EQ(in->stepSeconds, 0.025);
  EXPECT_DOUBLE_EQ(in->uplinkBytesPerSecond, 125e6);
  EXPECT_EQ(in->tensorSizes, mlpTensorSizes(25000));
  ASSERT_TRUE(in->delay.has_value());
  EXPECT_EQ(*in->delay, 3);

  PlanOptions bad;
  EXPECT_NE(makePlanInput(bad).status().message().find("--step-time is required"),
            std::string::npos);
  bad.stepTime = "10ms";
  bad.model = "gpt";
  EXPECT_NE(makePlanInput(bad).status().message().find("--parameters"), std::string::npos);
  bad.parameters = 1'000'000;  // any model by its count
  EXPECT_TRUE(makePlanInput(bad).ok());
  bad.parameters = 0;
  bad.model = "resnet18";  // known by its count
  ASSERT_TRUE(makePlanInput(bad).ok());
  EXPECT_EQ(makePlanInput(bad)->tensorSizes, std::vector<int64_t>{kResnet18Parameters});
  // Many regions: the preset's own pairs keep their times, the rest take
  // --default-rtt.
  PlanOptions many;
  many.stepTime = "25ms";
  many.topology.preset = "world16";
  many.topology.regions = "london,tokyo,r1,r2";
  many.topology.defaultRtt = "150ms";
  auto m = makePlanInput(many);
  ASSERT_TRUE(m.ok()) << m.status().toString();
  EXPECT_DOUBLE_EQ(m->rttSeconds[2][3], 0.15);
  EXPECT_DOUBLE_EQ(m->rttSeconds[0][2], 0.15);
  EXPECT_GT(m->rttSeconds[0][1], 0.2);  // london-tokyo from world16's table
  many.topology.defaultRtt = "soon";
  EXPECT_NE(makePlanInput(many).status().message().find("--default-rtt soon"), std::string::npos);
  many.topology.defaultRtt.reset();
  EXPECT_NE(makePlanInput(many).status().message().find("--rtt"), std::string::npos);

  bad.topology.preset = "mars";
  EXPECT_NE(makePlanInput(bad).status().message().find("--preset"), std::string::npos);
}

#if defined(GEO_SAMPLES_DIR)
// A TrainingJob manifest gives the regions, workers, model and sync
// settings, checked as the controller checks them; the links stay the
// flags'.
TEST(Plan, AJobManifestGivesTheRegionsTheModelAndTheSyncSettings) {
  PlanOptions o;
  o.jobFile = std::string(GEO_SAMPLES_DIR) + "/world.yaml";  // cnn, 4 x 2, K = 8, D = auto
  o.stepTime = "30ms";
  auto in = makePlanInput(o);
  ASSERT_TRUE(in.ok()) << in.status().toString();
  EXPECT_EQ(in->regions, (std::vector<std::string>{"london", "tokyo", "oregon", "ohio"}));
  EXPECT_EQ(in->workersPerRegion, 2);
  EXPECT_EQ(in->tensorSizes, cnnTensorSizes());
  EXPECT_EQ(in->period, 8);
  EXPECT_FALSE(in->delay.has_value());
  EXPECT_TRUE(in->hierarchical);
  EXPECT_GT(in->rttSeconds[0][1], 0.2);  // london-tokyo from the world preset
  int64_t cnn = 0;
  for (int64_t n : cnnTensorSizes()) cnn += n;
  EXPECT_EQ(cnn, 215370);

  const std::string bad = ::testing::TempDir() + "/plan-bad-job.yaml";
  {
    std::ofstream f(bad);
    f << "apiVersion: geotrain.io/v1alpha1\nkind: TrainingJob\nmetadata:\n  name: x\n"
         "spec:\n  sync:\n    bits: 3\n  regions:\n    - name: a\n      replicas: \"2\"\n";
  }
  o.jobFile = bad;
  const std::string m(makePlanInput(o).status().message());
  EXPECT_NE(m.find("--job " + bad + ": not a valid TrainingJob"), std::string::npos) << m;
  EXPECT_NE(m.find("spec.regions[0].replicas"), std::string::npos) << m;  // a string, not a count
  o.jobFile = ::testing::TempDir() + "/no-such-job.yaml";
  EXPECT_NE(makePlanInput(o).status().message().find("cannot be read"), std::string::npos);
}
#endif

}  // namespace
}  // namespace geo::local
