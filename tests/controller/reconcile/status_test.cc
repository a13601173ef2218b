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
  o.regions = {{"london", 2, true, "", london, "203.0.113.7:7000", ""},
               {"tokyo", 2, true, "", tokyo, "tk.example.org:31000", ""}};
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
  EXPECT_EQ(s.outputPath, "");  // the spec writes no model
}

// Where the model went is named once the job has succeeded, not before.
TEST(Status, ASucceededJobNamesWhereItsModelWent) {
  Observation running = twoRegions(job(2, 2, 0, 0), job(2, 2, 0, 0), "t1");
  running.outputPath = "/models/run-7";
  const api::TrainingJobStatus s = aggregateStatus({}, running);
  EXPECT_EQ(s.outputPath, "");
  const json complete = {{{"type", "Complete"}, {"status", "True"}}};
  Observation done = twoRegions(job(0, 0, 2, 0, complete), job(0, 0, 2, 0, complete), "t2");
  done.outputPath = "/models/run-7";
  const api::TrainingJobStatus finished = aggregateStatus(s, done);
  EXPECT_EQ(finished.state, "Succeeded");
  EXPECT_EQ(finished.outputPath, "/models/run-7");
  // It survives the status's trip through JSON (what the API server stores).
  EXPECT_EQ(api::statusFromJson(api::statusToJson(finished)).outputPath, "/models/run-7");
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

// The rule of status.h: a region that has been up and then has fewer
// workers ready is degraded until they are back; the job runs on.
TEST(Status, AWorkerLostAfterTheStartDegradesItsRegionUntilItIsBack) {
  auto s = aggregateStatus({}, twoRegions(job(2, 2, 0, 0), job(2, 2, 0, 0), "t1"));
  EXPECT_EQ(s.state, "Running");
  EXPECT_TRUE(s.regions[0].started);
  EXPECT_TRUE(s.regions[1].started);
  EXPECT_EQ(condition(s, "RegionDegraded").status, "False");
  EXPECT_EQ(condition(s, "RegionDegraded").reason, "AllRegionsHealthy");

  // tokyo's worker 1 crashes: its pod failed, the Job waits out its back-off.
  s = aggregateStatus(s, twoRegions(job(2, 2, 0, 0), job(1, 1, 0, 1), "t2"));
  const auto& degraded = condition(s, "RegionDegraded");
  EXPECT_EQ(degraded.status, "True");
  EXPECT_EQ(degraded.reason, "WorkersRestarting");
  EXPECT_EQ(degraded.message, "tokyo: 1/2 workers ready (a worker failed and is being restarted)");
  EXPECT_EQ(degraded.lastTransitionTime, "t2");
  EXPECT_EQ(degraded.observedGeneration, 3);
  EXPECT_EQ(s.state, "Running");  // the job runs on
  EXPECT_EQ(condition(s, "Running").status, "True");
  EXPECT_EQ(condition(s, "Running").reason, "WorkersRestarting");
  EXPECT_EQ(condition(s, "Failed").status, "False");
  EXPECT_EQ(s.regionsReady, "1/2");
  EXPECT_EQ(s.regions[1].failed, 1);
  EXPECT_TRUE(s.regions[1].started);

  // The replacement pod runs but is not ready yet (loading its checkpoint):
  // still degraded, every condition as it was; only the counts move.
  const auto replacing = aggregateStatus(s, twoRegions(job(2, 2, 0, 0), job(2, 1, 0, 1), "t3"));
  EXPECT_EQ(condition(replacing, "RegionDegraded").status, "True");
  EXPECT_EQ(condition(replacing, "RegionDegraded").lastTransitionTime, "t2");
  EXPECT_EQ(replacing.conditions, s.conditions);
  EXPECT_EQ(replacing.regions[1].active, 2);

  // Back: healthy again, Running as before.
  s = aggregateStatus(replacing, twoRegions(job(2, 2, 0, 0), job(2, 2, 0, 1), "t4"));
  EXPECT_EQ(condition(s, "RegionDegraded").status, "False");
  EXPECT_EQ(condition(s, "RegionDegraded").reason, "AllRegionsHealthy");
  EXPECT_EQ(condition(s, "RegionDegraded").message, "");
  EXPECT_EQ(condition(s, "RegionDegraded").lastTransitionTime, "t4");
  EXPECT_EQ(condition(s, "Running").reason, "AllWorkersReady");
  EXPECT_EQ(s.regionsReady, "2/2");
  EXPECT_EQ(s.state, "Running");

  // Both of a region's workers lost at once (their node went away).
  s = aggregateStatus(s, twoRegions(job(2, 2, 0, 0), job(0, 0, 0, 3), "t5"));
  EXPECT_EQ(condition(s, "RegionDegraded").message,
            "tokyo: 0/2 workers ready (2 workers failed and are being restarted)");
  s = aggregateStatus(s, twoRegions(job(2, 2, 0, 0), job(2, 2, 0, 3), "t6"));
  EXPECT_EQ(condition(s, "RegionDegraded").status, "False");

  // A cluster out of reach and a worker lost elsewhere: both named.
  Observation o = twoRegions(job(1, 1, 0, 1), json(), "t7");
  o.regions[1].reachable = false;
  o.regions[1].unreachableReason = "connection refused";
  s = aggregateStatus(s, o);
  EXPECT_EQ(condition(s, "RegionDegraded").reason, "RegionUnreachable");
  EXPECT_EQ(condition(s, "RegionDegraded").message,
            "cannot reach: tokyo (connection refused); london: 1/2 workers ready (a worker "
            "failed and is being restarted)");
}

TEST(Status, TheStartUpIsPendingNeverDegraded) {
  // Pods being scheduled, pulling images, loading data: however long it
  // takes, and even when one crashes on the way, the job is Pending.
  auto s = aggregateStatus({}, twoRegions(job(0, 0, 0, 0), job(0, 0, 0, 0), "t1"));
  for (const json& tokyo : {job(2, 0, 0, 0), job(2, 1, 0, 0), job(1, 1, 0, 1), job(2, 1, 0, 1)}) {
    s = aggregateStatus(s, twoRegions(job(2, 2, 0, 0), tokyo, "t2"));
    EXPECT_EQ(condition(s, "RegionDegraded").status, "False") << tokyo.dump();
    EXPECT_EQ(s.state, "Pending") << tokyo.dump();
    EXPECT_EQ(condition(s, "Running").reason, "Pending");
    EXPECT_FALSE(s.regions[1].started);
    EXPECT_TRUE(s.regions[0].started);
  }
  // A Job without status.ready (Kubernetes before 1.24) never starts.
  s = aggregateStatus(
      {}, twoRegions(json{{"status", {{"active", 2}}}}, json{{"status", {{"active", 2}}}}, "t3"));
  EXPECT_FALSE(s.regions[0].started);
  EXPECT_EQ(condition(s, "RegionDegraded").status, "False");
}

TEST(Status, SuspendAndResumeStartAfresh) {
  auto s = aggregateStatus({}, twoRegions(job(2, 2, 0, 0), job(2, 2, 0, 0), "t1"));
  // Suspended: Kubernetes deletes the pods; that is no loss.
  Observation suspended = twoRegions(job(1, 0, 0, 0), job(0, 0, 0, 0), "t2");
  suspended.suspended = true;
  s = aggregateStatus(s, suspended);
  EXPECT_EQ(condition(s, "RegionDegraded").status, "False");
  EXPECT_EQ(s.state, "Suspended");
  EXPECT_FALSE(s.regions[0].started);
  EXPECT_FALSE(s.regions[1].started);
  // Resumed: a start-up like the first.
  s = aggregateStatus(s, twoRegions(job(2, 1, 0, 0), job(2, 0, 0, 0), "t3"));
  EXPECT_EQ(condition(s, "RegionDegraded").status, "False");
  EXPECT_EQ(s.state, "Pending");
  s = aggregateStatus(s, twoRegions(job(2, 2, 0, 0), job(2, 2, 0, 0), "t4"));
  EXPECT_EQ(s.state, "Running");
  EXPECT_TRUE(s.regions[1].started);
  // A Job that is gone (deleted by hand) starts afresh when it is back.
  s = aggregateStatus(s, twoRegions(job(2, 2, 0, 0), json(), "t5"));
  EXPECT_FALSE(s.regions[1].started);
  EXPECT_EQ(condition(s, "RegionDegraded").status, "False");
}

TEST(Status, WorkersThatFinishOrAJobThatEndsAreNoDegradation) {
  auto s = aggregateStatus({}, twoRegions(job(2, 2, 0, 0), job(2, 2, 0, 0), "t1"));
  // One worker of tokyo done, the other still at it: every worker accounted for.
  s = aggregateStatus(s, twoRegions(job(2, 2, 0, 0), job(1, 1, 1, 0), "t2"));
  EXPECT_EQ(condition(s, "RegionDegraded").status, "False");
  EXPECT_EQ(s.regionsReady, "2/2");
  EXPECT_EQ(s.state, "Running");
  // A worker out of retries: the Job controller marks the Job
  // (FailureTarget) and deletes its pods, then fails it.
  const json failureTarget = {
      {{"type", "FailureTarget"}, {"status", "True"}, {"reason", "MaxFailedIndexesExceeded"}}};
  s = aggregateStatus(s, twoRegions(job(2, 2, 0, 0), job(1, 0, 0, 7, failureTarget), "t3"));
  EXPECT_EQ(condition(s, "RegionDegraded").status, "False");
  EXPECT_FALSE(s.regions[1].started);
  EXPECT_EQ(s.state, "Failed");  // decided: no detour through Pending
  EXPECT_EQ(condition(s, "Failed").message, "region tokyo: MaxFailedIndexesExceeded: ");
  const json failed = {{{"type", "Failed"},
                        {"status", "True"},
                        {"reason", "MaxFailedIndexesExceeded"},
                        {"message",
                         "Job has exceeded the specified maximal number of failed "
                         "indexes"}}};
  s = aggregateStatus(s, twoRegions(job(2, 2, 0, 0), job(0, 0, 0, 7, failed), "t4"));
  EXPECT_EQ(s.state, "Failed");
  EXPECT_EQ(condition(s, "Failed").message,
            "region tokyo: MaxFailedIndexesExceeded: Job has exceeded the specified maximal "
            "number of failed indexes");
  EXPECT_EQ(condition(s, "RegionDegraded").status, "False");
}

// Finished is terminal (status.h): the TTL controller deleting a region's
// Job, or that Job recreated and starting again, never brings a job back.
TEST(Status, SucceededStaysSucceededWhenARegionsJobIsGone) {
  const json complete = {{{"type", "Complete"}, {"status", "True"}}};
  const auto done =
      aggregateStatus({}, twoRegions(job(0, 0, 2, 0, complete), job(0, 0, 2, 0, complete), "t1"));
  ASSERT_EQ(done.state, "Succeeded");
  ASSERT_EQ(done.completionTime, "t1");

  auto s = aggregateStatus(done, twoRegions(job(0, 0, 2, 0, complete), json(), "t2"));
  EXPECT_EQ(s, done);
  EXPECT_EQ(s.state, "Succeeded");
  EXPECT_EQ(condition(s, "Succeeded").status, "True");
  EXPECT_EQ(s.regionsReady, "2/2");
  EXPECT_EQ(s.completionTime, "t1");

  // Recreated and running again: still the finished job's status.
  s = aggregateStatus(done, twoRegions(job(0, 0, 2, 0, complete), job(2, 0, 0, 0), "t3"));
  EXPECT_EQ(s, done);
  // Neither Jobs, nor a region reached, nor an invalid spec change it;
  // observedGeneration follows the spec.
  Observation none;
  none.generation = 4;
  none.now = "t4";
  s = aggregateStatus(done, none);
  EXPECT_EQ(s.state, "Succeeded");
  EXPECT_EQ(s.observedGeneration, 4);
  EXPECT_EQ(s.conditions, done.conditions);
  none.specErrors = {{api::FieldError::Type::kInvalid, "spec.sync.bits", "3 is not allowed"}};
  EXPECT_EQ(aggregateStatus(done, none).state, "Succeeded");
}

TEST(Status, FailedStaysFailedWhenARegionsJobIsGone) {
  const json failed = {{{"type", "Failed"},
                        {"status", "True"},
                        {"reason", "BackoffLimitExceeded"},
                        {"message", "Job has reached the specified backoff limit"}}};
  const auto done = aggregateStatus({}, twoRegions(job(2, 2, 0, 0), job(0, 0, 0, 2, failed), "t1"));
  ASSERT_EQ(done.state, "Failed");

  for (const Observation& o :
       {twoRegions(job(2, 2, 0, 0), json(), "t2"), twoRegions(json(), json(), "t3"),
        twoRegions(job(2, 2, 0, 0), job(2, 0, 0, 0), "t4")}) {
    const auto s = aggregateStatus(done, o);
    EXPECT_EQ(s, done);
    EXPECT_EQ(s.state, "Failed");
    EXPECT_EQ(condition(s, "Failed").status, "True");
    EXPECT_EQ(condition(s, "Failed").message,
              "region tokyo: BackoffLimitExceeded: Job has reached the specified backoff limit");
    EXPECT_EQ(condition(s, "Running").reason, "Finished");
  }
}

// A region's Job suspended by another manager (Kueue) while the TrainingJob
// is not: the job waits, saying for which regions, and starts once admitted.
TEST(Status, AJobHeldBackByAnotherManagerWaitsForAdmission) {
  json held = job(0, 0, 0, 0);
  held["spec"]["suspend"] = true;
  json admitted = job(2, 2, 0, 0);
  admitted["spec"]["suspend"] = false;
  auto s = aggregateStatus({}, twoRegions(admitted, held, "t1"));
  EXPECT_EQ(s.state, "Pending");
  const auto& running = condition(s, "Running");
  EXPECT_EQ(running.status, "False");
  EXPECT_EQ(running.reason, "WaitingForAdmission");
  EXPECT_NE(running.message.find("tokyo is suspended by another manager"), std::string::npos)
      << running.message;
  EXPECT_EQ(condition(s, "Suspended").status, "False");
  EXPECT_EQ(condition(s, "RegionDegraded").status, "False");
  held["spec"]["suspend"] = false;
  held["status"] = admitted["status"];
  s = aggregateStatus(s, twoRegions(admitted, held, "t2"));
  EXPECT_EQ(s.state, "Running");
  EXPECT_EQ(condition(s, "Running").reason, "AllWorkersReady");
}

TEST(Status, SuspendedAndProgress) {
  Observation o = twoRegions(job(0, 0, 0, 0), job(0, 0, 0, 0), "t1");
  o.suspended = true;
  o.progress = api::Progress{1200, 0.31, 0.86, 0.42};
  const auto s = aggregateStatus({}, o);
  EXPECT_EQ(s.state, "Suspended");
  EXPECT_EQ(condition(s, "Suspended").status, "True");
  EXPECT_EQ(condition(s, "Running").reason, "Suspended");
  EXPECT_EQ(s.progress.step, 1200);
}

}  // namespace
}  // namespace geo::reconcile
