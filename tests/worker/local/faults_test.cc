// geotrain local's fault injection: the flags' grammar and errors, and how
// joined events and final model hashes reach the summary.

#include "worker/local/faults.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <functional>
#include <string>

#include "worker/local/run_state.h"
#include "worker/local/topology.h"
#include "worker/local/worker_event.h"

namespace geo::local {
namespace {

Topology world(int64_t perRegion = 1) {
  TopologyOptions o;
  o.workersPerRegion = perRegion;
  return *makeTopology(o);  // london, tokyo, oregon, ohio
}

TEST(LocalFaults, ParsesEveryFlag) {
  FaultOptions o;
  o.kill = {"tokyo@20s", "ohio:1@1500ms"};
  o.restartAfter = "10s";
  o.partition = {"oregon@5s+30s"};
  o.slow = {"london=3x"};
  o.throttle = {"tokyo@4s=5mbit", "ohio@1s=none"};
  auto plan = makeFaultPlan(o, world(2));
  ASSERT_TRUE(plan.ok()) << plan.status().toString();
  ASSERT_EQ(plan->kills.size(), 2u);
  EXPECT_EQ(plan->kills[0].rank, 2);  // tokyo's leader: region 1, index 0
  EXPECT_DOUBLE_EQ(plan->kills[0].atSeconds, 20);
  EXPECT_EQ(plan->kills[1].rank, 7);  // ohio:1
  EXPECT_DOUBLE_EQ(plan->kills[1].atSeconds, 1.5);
  EXPECT_EQ(plan->kills[1].what, "ohio:1");
  EXPECT_DOUBLE_EQ(*plan->restartAfterSeconds, 10);
  ASSERT_EQ(plan->partitions.size(), 1u);
  EXPECT_EQ(plan->partitions[0].regionIndex, 2);
  EXPECT_DOUBLE_EQ(plan->partitions[0].forSeconds, 30);
  EXPECT_FALSE(plan->partitions[0].otherRegionIndex);
  o.partition = {"tokyo/ohio@1s+2s"};
  plan = makeFaultPlan(o, world(2));
  ASSERT_TRUE(plan.ok()) << plan.status().toString();
  ASSERT_EQ(plan->partitions.size(), 1u);
  EXPECT_EQ(plan->partitions[0].regionIndex, 1);
  EXPECT_EQ(plan->partitions[0].otherRegionIndex, 3);
  EXPECT_DOUBLE_EQ(plan->partitions[0].atSeconds, 1);
  EXPECT_DOUBLE_EQ(plan->partitions[0].forSeconds, 2);
  EXPECT_DOUBLE_EQ(plan->slowdown[0], 3);
  EXPECT_DOUBLE_EQ(plan->slowdown[1], 3);
  EXPECT_DOUBLE_EQ(plan->slowdown[2], 1);
  ASSERT_EQ(plan->throttles.size(), 2u);
  EXPECT_EQ(plan->throttles[0].regionIndex, 1);
  EXPECT_DOUBLE_EQ(plan->throttles[0].atSeconds, 4);
  EXPECT_EQ(plan->throttles[0].kbitPerSecond, 5000);
  EXPECT_EQ(plan->throttles[1].kbitPerSecond, 0);  // unlimited
  EXPECT_TRUE(plan->any());
  EXPECT_FALSE(makeFaultPlan({}, world())->any());
}

TEST(LocalFaults, ErrorsNameTheFlagAndWhatIsAllowed) {
  const auto error = [](const std::function<void(FaultOptions&)>& set) {
    FaultOptions o;
    set(o);
    auto plan = makeFaultPlan(o, world());
    EXPECT_FALSE(plan.ok());
    return plan.ok() ? std::string() : plan.status().message();
  };
  EXPECT_NE(error([](FaultOptions& o) {
              o.kill = {"paris@2s"};
            }).find("'paris' is not a region of this job"),
            std::string::npos);
  EXPECT_NE(error([](FaultOptions& o) { o.kill = {"tokyo"}; }).find("expected REGION[:INDEX]@TIME"),
            std::string::npos);
  EXPECT_NE(error([](FaultOptions& o) { o.kill = {"tokyo:1@2s"}; }).find("allowed: 0..0"),
            std::string::npos);
  EXPECT_NE(error([](FaultOptions& o) { o.kill = {"tokyo@2"}; }).find("needs a unit"),
            std::string::npos);
  EXPECT_NE(error([](FaultOptions& o) { o.kill = {"tokyo@-2s"}; }).find("not a duration"),
            std::string::npos);
  EXPECT_NE(error([](FaultOptions& o) { o.restartAfter = "5s"; }).find("needs a --kill"),
            std::string::npos);
  EXPECT_NE(error([](FaultOptions& o) { o.partition = {"tokyo@5s"}; }).find("REGION@TIME+DURATION"),
            std::string::npos);
  EXPECT_NE(error([](FaultOptions& o) {
              o.partition = {"tokyo/tokyo@5s+1s"};
            }).find("two different regions"),
            std::string::npos);
  EXPECT_NE(error([](FaultOptions& o) {
              o.partition = {"tokyo/paris@5s+1s"};
            }).find("'paris' is not a region of this job"),
            std::string::npos);
  EXPECT_NE(error([](FaultOptions& o) { o.slow = {"tokyo=0.5x"}; }).find("from 1 to 100"),
            std::string::npos);
  EXPECT_NE(error([](FaultOptions& o) { o.slow = {"tokyo=3"}; }).find("REGION=FACTORx"),
            std::string::npos);
  EXPECT_NE(error([](FaultOptions& o) { o.throttle = {"tokyo=5mbit"}; }).find("REGION@TIME=RATE"),
            std::string::npos);
  EXPECT_NE(error([](FaultOptions& o) {
              o.throttle = {"tokyo@2s=fast"};
            }).find("fast is not a rate (allowed: a number with unit bit"),
            std::string::npos);
  EXPECT_NE(error([](FaultOptions& o) {
              o.throttle = {"paris@2s=5mbit"};
            }).find("'paris' is not a region of this job"),
            std::string::npos);
}

WorkerEvent event(const std::string& json) {
  auto e = parseWorkerEvent(json);
  EXPECT_TRUE(e.ok()) << json;
  return e.ok() ? *e : WorkerEvent{};
}

TEST(LocalFaults, JoinedEventsAndModelHashesReachTheSummary) {
  RunState state(world(), 100);
  const auto joined =
      event(R"({"event":"joined","rank":1,"step":40,"fromStep":0,"transferred":true,)"
            R"("jobFinished":false,"stateTransferSeconds":0.05,"time":1.2})");
  EXPECT_EQ(joined.kind, EventKind::kJoined);
  EXPECT_EQ(joined.transferred, true);
  state.record(1, 12.5, joined);
  EXPECT_EQ(state.rank(1).joinedStep, 40);
  EXPECT_EQ(state.rank(1).joinedWallSeconds, 12.5);
  EXPECT_TRUE(state.rank(1).joinTransferred);
  for (int64_t r = 0; r < 4; ++r) {
    state.record(r, 20 + r,
                 event(R"({"event":"done","step":100,"stepSecondsMax":0.5,"modelHash":"ab"})"));
  }
  EXPECT_EQ(state.summarize(30).modelsAgree, true);
  state.record(3, 24, event(R"({"event":"done","step":100,"modelHash":"cd"})"));
  RunSummary summary = state.summarize(30);
  EXPECT_EQ(summary.modelsAgree, false);
  summary.faults.push_back({"kill", "tokyo:0 (rank 1)", 5, 15, 10, 0.4, 40, 2.5, -0.1});
  const auto j = nlohmann::json::parse(summaryJson(summary));
  EXPECT_EQ(j["modelsAgree"], false);
  ASSERT_EQ(j["faults"].size(), 1u);
  EXPECT_EQ(j["faults"][0]["rejoinStep"], 40);
  EXPECT_EQ(j["faults"][0]["othersStallSeconds"], 2.5);
}

}  // namespace
}  // namespace geo::local
