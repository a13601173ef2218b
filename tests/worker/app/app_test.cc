// The worker's wiring with LibTorch (worker/app): options from the
// configuration, progress events from the synchronizer's and the transport's
// totals, and the step hook without a synchronizer.

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>

#include "worker/app/progress.h"
#include "worker/app/setup.h"
#include "worker/app/worker_hook.h"

namespace geo::app {
namespace {

TEST(SyncOptionsFromConfig, CarryEverySyncKey) {
  WorkerConfig c;
  c.sync.algorithm = "swarm";
  c.sync.period = 3;
  c.sync.delay = std::nullopt;
  c.sync.swarmH = 6;
  c.sync.codec = "qsgd";
  c.sync.bits = 8;
  c.sync.bucket = 128;
  c.sync.lanCodec = "bf16";
  c.sync.errorFeedback = false;
  c.sync.hierarchical = false;
  c.sync.timeoutSeconds = 1.5;
  c.sync.peerTimeoutSeconds = 4;
  c.training.threads = 3;
  c.job.seed = 9;
  const sync::SyncOptions o = syncOptions(c);
  EXPECT_EQ(o.algorithm, "swarm");
  EXPECT_EQ(o.period, 3);
  EXPECT_FALSE(o.delay.has_value());
  EXPECT_EQ(o.swarmH, 6);
  EXPECT_EQ(o.codec.name, "qsgd");
  EXPECT_EQ(o.codec.bits, 8);
  EXPECT_EQ(o.codec.bucket, 128);
  EXPECT_EQ(o.codec.threads, 3);
  EXPECT_EQ(o.lanCodec, "bf16");
  EXPECT_FALSE(o.errorFeedback);
  EXPECT_FALSE(o.hierarchical);
  EXPECT_EQ(o.timeout, std::chrono::milliseconds(1500));
  EXPECT_EQ(o.peerTimeout, std::chrono::milliseconds(4000));
  EXPECT_EQ(o.seed, 9u);
  EXPECT_FALSE(o.autoPeriod);
  c.sync.period = std::nullopt;  // auto: starts from kAutoPeriodStart
  const sync::SyncOptions automatic = syncOptions(c);
  EXPECT_TRUE(automatic.autoPeriod);
  EXPECT_EQ(automatic.period, kAutoPeriodStart);
  // The delay's step scale is SGD's: Adam's step ignores the gradient's scale.
  EXPECT_TRUE(automatic.scaleLrWithDelay);
  c.training.optimizer = "adam";
  EXPECT_FALSE(syncOptions(c).scaleLrWithDelay);
  c.training.optimizer = "sgd";
  c.sync.scaleLrWithDelay = false;
  EXPECT_FALSE(syncOptions(c).scaleLrWithDelay);
}

TEST(TrainerOptionsFromConfig, EachWorkerHasItsOwnSeedAndLogIntervalZeroIsTheEnd) {
  WorkerConfig c;
  c.job.seed = 100;
  c.worker.rank = 3;
  c.training.steps = 77;
  c.training.logInterval = 0;
  const train::TrainerOptions o = trainerOptions(c, torch::kCPU);
  EXPECT_EQ(o.seed, 103u);
  EXPECT_EQ(o.logInterval, 77);
  EXPECT_EQ(o.steps, 77);
}

TEST(Totals, SplitBytesIntoLanAndWanAndCountPeersDown) {
  auto topology = sync::Topology::make({"london", "london", "tokyo"}, 0);
  ASSERT_TRUE(topology.ok());
  Totals t;
  t.peers.resize(2);
  t.peers[0].peer = 1;
  t.peers[0].bytesSent = 10;
  t.peers[0].bytesReceived = 20;
  t.peers[1].peer = 2;
  t.peers[1].bytesSent = 300;
  t.peers[1].bytesReceived = 400;
  t.sync.delay = 2;
  t.sync.stalenessMax = 5;
  t.sync.payloadBytes = 1000;
  t.sync.peerUp = {{1, true}, {2, false}};
  local::WorkerEvent e;
  addTotals(e, t, *topology);
  EXPECT_EQ(e.bytes.lanSent, 10u);
  EXPECT_EQ(e.bytes.lanReceived, 20u);
  EXPECT_EQ(e.bytes.wanSent, 300u);
  EXPECT_EQ(e.bytes.wanReceived, 400u);
  EXPECT_EQ(e.bytes.payload, 1000u);
  EXPECT_EQ(e.sync.peersDown, 1);
  // Whole numbers stay whole on the line.
  e.kind = local::EventKind::kProgress;
  const std::string line = local::formatWorkerEvent(e);
  EXPECT_NE(line.find(R"("sync":{"delay":2,"lrScale":1.0,"rounds":0,)"), std::string::npos) << line;
  EXPECT_NE(line.find(R"("stalenessMax":5,)"), std::string::npos) << line;
  EXPECT_NE(line.find(R"("bytes":{"wanSent":300,"wanReceived":400,"lanSent":10,"lanReceived":20,)"
                      R"("payload":1000})"),
            std::string::npos)
      << line;
}

TEST(ProgressOutput, WritesOneLineWithRankAndTimeOnlyForJsonl) {
  local::WorkerEvent e;
  e.kind = local::EventKind::kError;
  e.message = "no";
  ::testing::internal::CaptureStdout();
  Progress(false, 4).emit(e);
  EXPECT_EQ(::testing::internal::GetCapturedStdout(), "");
  ::testing::internal::CaptureStdout();
  Progress(true, 4).emit(e);
  const std::string out = ::testing::internal::GetCapturedStdout();
  EXPECT_TRUE(out.starts_with(R"({"event":"error","rank":4,"time":)")) << out;
  EXPECT_TRUE(out.ends_with(R"(,"message":"no"})"
                            "\n"))
      << out;
}

TEST(WorkerHookWithoutSync, JoinsAtItsOwnStepAndTimesSteps) {
  const Progress progress(false, 0);
  WorkerHook hook(nullptr, nullptr, nullptr, 32, progress);
  train::FlatParameters flat;
  auto joined = hook.join(5, flat);
  ASSERT_TRUE(joined.ok());
  EXPECT_EQ(joined->step, 5);
  EXPECT_FALSE(joined->jobFinished);
  EXPECT_TRUE(hook.afterStep(5, flat).ok());
  EXPECT_EQ(hook.longestStep(), 0);  // the first step is not counted
  std::this_thread::sleep_for(std::chrono::milliseconds(2));
  EXPECT_TRUE(hook.afterStep(6, flat).ok());
  EXPECT_GE(hook.longestStep(), 0.002);
}

TEST(ModelHash, IsFnv1aOfTheBytes) {
  // FNV-1a 64 of no bytes is the offset basis.
  EXPECT_EQ(modelHash(torch::zeros({0})), "cbf29ce484222325");
  EXPECT_EQ(modelHash(torch::ones({4})), modelHash(torch::ones({4})));
  EXPECT_NE(modelHash(torch::ones({4})), modelHash(torch::zeros({4})));
}

}  // namespace
}  // namespace geo::app
