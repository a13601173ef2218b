#include "controller/reconcile/pod_problems.h"

#include <gtest/gtest.h>

namespace geo::reconcile {
namespace {

using nlohmann::json;

json pod(const std::string& name, const json& status) {
  return {{"metadata", {{"name", name}, {"uid", "uid-" + name}}}, {"status", status}};
}

json waiting(const std::string& reason, const std::string& message) {
  return {{"phase", "Pending"},
          {"containerStatuses",
           {{{"name", "worker"},
             {"state", {{"waiting", {{"reason", reason}, {"message", message}}}}}}}}};
}

TEST(PodProblems, EachKindIsNamedWithItsRegionAndPod) {
  const json oom = {
      {"phase", "Running"},
      {"containerStatuses",
       {{{"name", "worker"},
         {"state", {{"running", json::object()}}},
         {"lastState", {{"terminated", {{"exitCode", 137}, {"reason", "OOMKilled"}}}}}}}}};
  const json failed = {
      {"phase", "Failed"},
      {"containerStatuses",
       {{{"name", "worker"},
         {"state",
          {{"terminated",
            {{"exitCode", 1}, {"reason", "Error"}, {"message", "no such file: /data/x"}}}}}}}}};
  const json evicted = {
      {"phase", "Failed"}, {"reason", "Evicted"}, {"message", "The node was low on memory."}};
  const json unschedulable = {
      {"phase", "Pending"},
      {"conditions",
       {{{"type", "PodScheduled"},
         {"status", "False"},
         {"reason", "Unschedulable"},
         {"message", "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."}}}}};
  const json healthy = {
      {"phase", "Running"},
      {"containerStatuses", {{{"name", "worker"}, {"state", {{"running", json::object()}}}}}}};
  const std::vector<Problem> p = podProblems(
      "tokyo",
      json::array({pod("w-0", waiting("ImagePullBackOff", "Back-off pulling image \"x:1\"")),
                   pod("w-1", oom), pod("w-2", failed), pod("w-3", evicted),
                   pod("w-4", unschedulable), pod("w-5", healthy),
                   pod("w-6", waiting("CreateContainerConfigError", "secret \"s\" not found")),
                   pod("w-7", waiting("CrashLoopBackOff", "back-off 5m0s"))}));
  ASSERT_EQ(p.size(), 7u);
  EXPECT_EQ(p[0].reason, "WorkerImagePullFailed");
  EXPECT_EQ(p[0].message,
            "region tokyo: pod w-0: container worker: ImagePullBackOff: Back-off pulling image "
            "\"x:1\"");
  EXPECT_EQ(p[1].reason, "WorkerOOMKilled");
  EXPECT_EQ(p[1].message,
            "region tokyo: pod w-1: container worker was killed for using more memory than its "
            "limit (exited 137 (OOMKilled))");
  EXPECT_EQ(p[2].reason, "WorkerFailed");
  EXPECT_EQ(p[2].message,
            "region tokyo: pod w-2: container worker exited 1 (Error): no such file: /data/x");
  EXPECT_EQ(p[3].reason, "WorkerFailed");
  EXPECT_EQ(p[3].message, "region tokyo: pod w-3: failed (Evicted): The node was low on memory.");
  EXPECT_EQ(p[4].reason, "WorkerUnschedulable");
  EXPECT_EQ(p[4].message,
            "region tokyo: pod w-4: cannot be scheduled: 0/3 nodes are available: 3 Insufficient "
            "nvidia.com/gpu.");
  EXPECT_EQ(p[5].reason, "WorkerContainerError");
  EXPECT_EQ(p[6].reason, "WorkerCrashLoopBackOff");
}

// ErrImagePull and ImagePullBackOff alternate on the same pod: one problem.
TEST(PodProblems, OneKeyPerPodAndKind) {
  const auto a = podProblems("tokyo", json::array({pod("w-0", waiting("ErrImagePull", "x"))}));
  const auto b =
      podProblems("tokyo", json::array({pod("w-0", waiting("ImagePullBackOff", "back-off"))}));
  ASSERT_EQ(a.size(), 1u);
  ASSERT_EQ(b.size(), 1u);
  EXPECT_EQ(a[0].key, b[0].key);
  EXPECT_TRUE(podProblems("tokyo", json::object()).empty());
  EXPECT_TRUE(podProblems("tokyo", json::array({json(5), json::object()})).empty());
}

TEST(PodProblems, AFailedJobNamesItsRegion) {
  const json job = {{"metadata", {{"name", "world-tokyo"}, {"uid", "j1"}}},
                    {"status",
                     {{"conditions",
                       {{{"type", "Failed"},
                         {"status", "True"},
                         {"reason", "BackoffLimitExceeded"},
                         {"message", "Job has reached the specified backoff limit"}}}}}}};
  const auto p = jobProblems("tokyo", job);
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(p[0].reason, "RegionJobFailed");
  EXPECT_EQ(p[0].message,
            "region tokyo: Job world-tokyo failed: BackoffLimitExceeded: Job has reached the "
            "specified backoff limit");
  EXPECT_TRUE(jobProblems("tokyo", {{"status", {{"active", 1}}}}).empty());
}

}  // namespace
}  // namespace geo::reconcile
