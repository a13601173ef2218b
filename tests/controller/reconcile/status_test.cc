#include "controller/reconcile/status.h"

#include <gtest/gtest.h>

namespace geo::reconcile {
namespace {

using nlohmann::json;

json job(int64_t active, int64_t ready, int64_t succeeded, int64_t failed,
         const json& conditions = json::array()) {
  return {{"status",
           {{"active", active},
            {"ready", ready},
            {"succeeded", succeeded},
            {"failed", failed},
            {"conditions", conditions}}}};
}

Observation twoRegions(const json& london, const json& tokyo, const std::string& now) {
  Observation o;
  o.generation = 3;
  o.now = now;
  o.regions = {{"london", 2, true, "", london, "203.0.113.7:7000"},
               {"tokyo", 2, true, "", tokyo, "tk.example.org:31000"}};
  return o;
}

const api::Condition& condition(const api::TrainingJobStatus& s, std::string_view type) {
  const api::Condition* c = api::findCondition(s.conditions, type);
  EXPECT_NE(c, nullptr) << type;
  static const api::Condition none;
  return c != nullptr ? *c : none;
}

TEST(Status, InvalidSpecSaysWhyAndCreatesNothing) {
  Observation o;
  o.generation = 2;
  o.now = "t1";
  o.specErrors = {{api::FieldError::Type::kInvalid, "spec.sync.bits", "3 is not allowed"}};
  const auto s = aggregateStatus({}, o);
  EXPECT_EQ(s.state, "Invalid");
  EXPECT_EQ(s.observedGeneration, 2);
  const auto& created = condition(s, "Created");
  EXPECT_EQ(created.status, "False");
  EXPECT_EQ(created.reason, "InvalidSpec");
  EXPECT_EQ(created.message, "spec.sync.bits: 3 is not allowed");
  EXPECT_EQ(created.observedGeneration, 2);
}

TEST(Status, FromWaitingToRunningToSucceeded) {
  Observation waiting = twoRegions(json(), json(), "t1");
  waiting.waitingForGateway = "london";
  auto s = aggregateStatus({}, waiting);
  EXPECT_EQ(s.state, "Pending");
  EXPECT_EQ(condition(s, "Created").reason, "WaitingForGateway");
  EXPECT_EQ(s.regionsReady, "0/2");
  EXPECT_TRUE(s.startTime.empty());

  s = aggregateStatus(s, twoRegions(job(2, 1, 0, 0), job(2, 2, 0, 0), "t2"));
  EXPECT_EQ(condition(s, "Created").status, "True");
  EXPECT_EQ(condition(s, "Created").lastTransitionTime, "t2");
  EXPECT_EQ(condition(s, "Running").reason, "Pending");
  EXPECT_EQ(s.regionsReady, "1/2");
  EXPECT_EQ(s.startTime, "t2");
  EXPECT_EQ(s.regions[0].active, 2);
  EXPECT_EQ(s.regions[1].endpoint, "tk.example.org:31000");

  s = aggregateStatus(s, twoRegions(job(2, 2, 0, 0), job(2, 2, 0, 0), "t3"));
  EXPECT_EQ(s.state, "Running");
  EXPECT_EQ(condition(s, "Running").status, "True");
  EXPECT_EQ(condition(s, "Created").lastTransitionTime, "t2");  // unchanged status
  EXPECT_EQ(s.startTime, "t2");

  // Nothing new: the same status, so the reconciler writes nothing.
  EXPECT_EQ(aggregateStatus(s, twoRegions(job(2, 2, 0, 0), job(2, 2, 0, 0), "t4")), s);

  const json complete = {{{"type", "Complete"}, {"status", "True"}}};
  s = aggregateStatus(s, twoRegions(job(0, 0, 2, 0, complete), job(0, 0, 2, 0, complete), "t5"));
  EXPECT_EQ(s.state, "Succeeded");
  EXPECT_EQ(condition(s, "Succeeded").status, "True");
  EXPECT_EQ(condition(s, "Running").reason, "Finished");
  EXPECT_EQ(s.completionTime, "t5");
  EXPECT_EQ(s.regionsReady, "2/2");
}

TEST(Status, OneFailedRegionFailsTheJob) {
  const json failed = {{{"type", "Failed"},
                        {"status", "True"},
                        {"reason", "BackoffLimitExceeded"},
                        {"message", "Job has reached the specified backoff limit"}}};
  const auto s = aggregateStatus({}, twoRegions(job(2, 2, 0, 0), job(0, 0, 0, 2, failed), "t1"));
  EXPECT_EQ(s.state, "Failed");
  const auto& c = condition(s, "Failed");
  EXPECT_EQ(c.status, "True");
  EXPECT_EQ(c.reason, "RegionFailed");
  EXPECT_EQ(c.message,
            "region tokyo: BackoffLimitExceeded: Job has reached the specified backoff limit");
  EXPECT_EQ(s.regions[1].failed, 2);
}

TEST(Status, UnreachableRegionDegradesAndKeepsItsLastCounts) {
  auto s = aggregateStatus({}, twoRegions(job(2, 2, 0, 0), job(2, 2, 0, 0), "t1"));
  Observation o = twoRegions(job(2, 2, 0, 0), json(), "t2");
  o.regions[1].reachable = false;
  o.regions[1].unreachableReason = "connection refused";
  s = aggregateStatus(s, o);
  const auto& c = condition(s, "RegionDegraded");
  EXPECT_EQ(c.status, "True");
  EXPECT_EQ(c.message, "cannot reach: tokyo (connection refused)");
  EXPECT_FALSE(s.regions[1].reachable);
  EXPECT_EQ(s.regions[1].ready, 2);  // last seen
  EXPECT_EQ(s.state, "Running");     // the others go on
  s = aggregateStatus(s, twoRegions(job(2, 2, 0, 0), job(2, 2, 0, 0), "t3"));
  EXPECT_EQ(condition(s, "RegionDegraded").status, "False");
  EXPECT_EQ(condition(s, "RegionDegraded").lastTransitionTime, "t3");
}

TEST(Status, SuspendedAndProgress) {
  Observation o = twoRegions(job(0, 0, 0, 0), job(0, 0, 0, 0), "t1");
  o.suspended = true;
  o.progress = api::Progress{1200, 0.31, 0.86};
  const auto s = aggregateStatus({}, o);
  EXPECT_EQ(s.state, "Suspended");
  EXPECT_EQ(condition(s, "Suspended").status, "True");
  EXPECT_EQ(condition(s, "Running").reason, "Suspended");
  EXPECT_EQ(s.progress.step, 1200);
}

}  // namespace
}  // namespace geo::reconcile
