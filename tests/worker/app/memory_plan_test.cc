// What a DTS worker must hold, and the limit it is held to
// (worker/app/memory_plan.h).

#include "worker/app/memory_plan.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace geo::app {
namespace {

namespace fs = std::filesystem;

// The 101.3M-parameter mlp measured in docs/algorithms.md ("Memory"): two
// workers, K = 32, D = auto, qsgd-4, SGD with momentum; peak RSS 2.96 GB
// (4.49 GB before a round completed slice by slice and the step's
// transients were made in place).
MemoryPlanInput measuredMlp() {
  MemoryPlanInput in;
  in.parameters = 101'300'000;
  in.largestTensor = 0;  // its layers add their weights' gradients in place
  in.peers = 2;
  in.period = 32;
  in.delay = std::nullopt;
  return in;
}

TEST(MemoryPlan, IsALowerBoundOfWhatWasMeasured) {
  const MemoryPlan plan = planDtsMemory(measuredMlp());
  const int64_t b = 4 * 101'300'000;
  EXPECT_FALSE(plan.roundsExact);
  EXPECT_EQ(plan.roundsInFlight, 1);
  // At least the design's floor (parameters, gradients, momentum, the
  // round's start, error feedback's residual in it), at most what was
  // measured; the end lets the round's start go, and the coordinator sums
  // in its own model: parameters, gradients, momentum and one peer's model.
  EXPECT_GE(plan.trainingBytes, 4 * b);
  EXPECT_GE(plan.endBytes, 4 * b);
  EXPECT_LT(plan.endBytes, plan.trainingBytes);
  EXPECT_LE(plan.peakBytes, 2'870'000'000);
  EXPECT_EQ(plan.peakBytes, std::max(plan.trainingBytes, plan.endBytes));
}

TEST(MemoryPlan, CountsTheRoundsInFlightOfAFixedPeriodAndDelay) {
  MemoryPlanInput in = measuredMlp();
  in.period = 4;
  in.delay = 12;
  const MemoryPlan fixed = planDtsMemory(in);
  EXPECT_TRUE(fixed.roundsExact);
  EXPECT_EQ(fixed.roundsInFlight, 4);
  in.delay = 0;
  const MemoryPlan one = planDtsMemory(in);
  EXPECT_EQ(one.roundsInFlight, 1);
  // Three more rounds of two encoded contributions (2 x P / 2 bytes at 4
  // bits): a round keeps its own contribution encoded only, and a fixed
  // delay applies nothing early.
  const int64_t b = 4 * in.parameters;
  EXPECT_EQ(fixed.trainingBytes - one.trainingBytes, 3 * in.parameters);
  // Adam's two moments instead of momentum's one.
  in.optimizer = "adam";
  EXPECT_EQ(planDtsMemory(in).endBytes - one.endBytes, b);
  // Reduce-scatter keeps its last four completed rounds to answer a peer
  // that lost an owner: two encoded payloads each (P / 2 bytes at 4 bits).
  in.optimizer = "sgd";
  in.delay = 0;
  in.reduceScatter = true;
  EXPECT_EQ(planDtsMemory(in).trainingBytes - one.trainingBytes, 4 * 2 * in.parameters / 2);
}

// Under D = auto a CPU worker of a model between 1M and 64M parameters
// decodes the contributions it applies early beside the steps, into a
// correction of the model's size (sync::decodesEarlyBeside); a fixed D
// applies nothing early, and the 100M-parameter mlp decodes them on the
// training thread (the extra model would take it past its memory design).
TEST(MemoryPlan, CountsTheCorrectionDecodedBesideTheSteps) {
  MemoryPlanInput in = measuredMlp();
  in.parameters = 19'900'000;
  const MemoryPlan automatic = planDtsMemory(in);
  in.delay = 8;  // with K = 32: one round in flight, as under auto
  const MemoryPlan fixed = planDtsMemory(in);
  EXPECT_EQ(automatic.trainingBytes - fixed.trainingBytes, 4 * in.parameters);
  EXPECT_EQ(automatic.endBytes, fixed.endBytes);
  in = measuredMlp();
  const MemoryPlan large = planDtsMemory(in);
  in.delay = 8;
  EXPECT_EQ(large.trainingBytes, planDtsMemory(in).trainingBytes);
}

// The final average streams the peers' models through the coordinator's
// own model: a large model's does not grow with them (it held every peer's
// model at once), a small model's asks up to 256 MiB of them at once.
TEST(MemoryPlan, TheFinalAverageDoesNotGrowWithThePeers) {
  MemoryPlanInput in = measuredMlp();
  const MemoryPlan two = planDtsMemory(in);
  in.peers = 16;
  const MemoryPlan sixteen = planDtsMemory(in);
  EXPECT_EQ(sixteen.endBytes, two.endBytes);
  EXPECT_GT(sixteen.trainingBytes, sixteen.endBytes);  // training is the peak
  // One peer's model (B) on top of what is held always, no separate sum.
  EXPECT_EQ(sixteen.atEnd.back().second, 4 * in.parameters);

  in.parameters = 10'000'000;  // 40 MB: six of them at once
  const int64_t b = 4 * in.parameters;
  EXPECT_EQ(planDtsMemory(in).atEnd.back().second, 6 * b);
  in.peers = 4;
  EXPECT_EQ(planDtsMemory(in).atEnd.back().second, 3 * b);
}

// Periodic evaluation holds a model of its own and the snapshots it takes:
// a benchmark that let 33 of the 19.9M-parameter mlp wait peaked at 3.4 GB.
TEST(MemoryPlan, CountsTheBackgroundEvaluationsModels) {
  MemoryPlanInput in = measuredMlp();
  const MemoryPlan none = planDtsMemory(in);
  in.evaluationModels = 2 + 33;
  const MemoryPlan backlog = planDtsMemory(in);
  EXPECT_EQ(backlog.trainingBytes - none.trainingBytes, 35 * 4 * in.parameters);
  EXPECT_EQ(backlog.endBytes - none.endBytes, 35 * 4 * in.parameters);
  const std::string m(checkMemoryPlan(backlog, 4'000'000'000).message());
  EXPECT_NE(m.find("the background evaluation: 35 models"), std::string::npos) << m;
  EXPECT_NE(m.find("let fewer snapshots wait for evaluation (training.evalBacklog"),
            std::string::npos)
      << m;
  EXPECT_EQ(std::string(checkMemoryPlan(none, 1'000'000'000).message()).find("evalBacklog"),
            std::string::npos);
}

TEST(MemoryPlan, RefusalNamesTheFigureTheLimitAndWhatToChange) {
  MemoryPlanInput in = measuredMlp();
  in.peers = 16;
  const MemoryPlan plan = planDtsMemory(in);
  EXPECT_TRUE(checkMemoryPlan(plan, plan.peakBytes).ok());
  const Status refused = checkMemoryPlan(plan, 2'000'000'000);
  ASSERT_EQ(refused.code(), StatusCode::kFailedPrecondition);
  const std::string m(refused.message());
  EXPECT_NE(m.find("needs at least " + formatBytes(plan.peakBytes)), std::string::npos) << m;
  EXPECT_NE(m.find("while training"), std::string::npos) << m;
  EXPECT_NE(m.find("parameters and gradients"), std::string::npos) << m;
  EXPECT_NE(m.find("more than the 2.0 GB it may use"), std::string::npos) << m;
  EXPECT_NE(m.find("resources.limits.memory"), std::string::npos) << m;

  in.peers = 2;
  in.period = 1;
  in.delay = 40;  // 41 rounds in flight: training is the peak
  const MemoryPlan rounds = planDtsMemory(in);
  const std::string r(checkMemoryPlan(rounds, 5'000'000'000).message());
  EXPECT_NE(r.find("while training"), std::string::npos) << r;
  EXPECT_NE(r.find("keep fewer rounds in flight (41 now"), std::string::npos) << r;
}

// A folder laid out like / with the files the reader looks at.
class FakeRoot {
 public:
  FakeRoot() : root_(fs::temp_directory_path() / ("geo-memroot-" + std::to_string(::getpid()))) {
    fs::remove_all(root_);
  }
  ~FakeRoot() { fs::remove_all(root_); }
  void write(const std::string& path, const std::string& text) {
    fs::create_directories((root_ / path).parent_path());
    std::ofstream(root_ / path) << text;
  }
  std::string path() const { return root_.string(); }

 private:
  fs::path root_;
};

TEST(MemoryLimit, CgroupV2LimitOrTheMachinesMemory) {
  FakeRoot root;
  root.write("proc/meminfo", "MemTotal:       16000000 kB\nMemFree:  1000 kB\n");
  root.write("proc/self/cgroup", "0::/kubepods/pod1/c1\n");
  root.write("sys/fs/cgroup/kubepods/pod1/c1/memory.max", "2147483648\n");
  EXPECT_EQ(readMemoryLimit(root.path()), 2147483648);
  root.write("sys/fs/cgroup/kubepods/pod1/c1/memory.max", "max\n");
  EXPECT_EQ(readMemoryLimit(root.path()), int64_t{16000000} * 1024);
}

TEST(MemoryLimit, CgroupV1AndHybridHosts) {
  FakeRoot root;
  root.write("proc/meminfo", "MemTotal:       16000000 kB\n");
  root.write("proc/self/cgroup", "4:memory:/docker/abc\n0::/\n");
  // v1's "no limit" is a number near 2^63.
  root.write("sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes", "9223372036854771712\n");
  EXPECT_EQ(readMemoryLimit(root.path()), int64_t{16000000} * 1024);
  root.write("sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes", "1000000000\n");
  EXPECT_EQ(readMemoryLimit(root.path()), 1000000000);
  root.write("sys/fs/cgroup/unified/memory.max", "500000000\n");
  EXPECT_EQ(readMemoryLimit(root.path()), 500000000);
}

TEST(MemoryLimit, NothingReadableIsUnknown) {
  FakeRoot root;
  root.write("proc/self/cgroup", "garbage\n");
  EXPECT_EQ(readMemoryLimit(root.path()), std::nullopt);
}

}  // namespace
}  // namespace geo::app
