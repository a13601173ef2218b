#pragma once
// What goes wrong with a region's workers inside its cluster, for Events on
// the TrainingJob: the hub's users look at `kubectl describe tj`, not at the
// pods of clusters on other continents. Pure functions of the objects as
// read, so the rules are tested without clusters; the reconciler lists a
// region's pods only while one of its workers is not ready or one more has
// failed (reconciler.h), and reports each problem once (Problem::key).
//
// From a worker pod (labels geotrain.io/job and geotrain.io/region):
//   WorkerImagePullFailed   a container waits with ErrImagePull,
//                           ImagePullBackOff, InvalidImageName or
//                           ErrImageNeverPull (one key for the pod: the
//                           first two alternate)
//   WorkerContainerError    waits with CreateContainerConfigError (a
//                           missing Secret or ConfigMap key),
//                           CreateContainerError or RunContainerError
//   WorkerCrashLoopBackOff  waits with CrashLoopBackOff
//   WorkerOOMKilled         a container terminated (now or last) OOMKilled
//   WorkerFailed            the pod failed otherwise: a container's exit
//                           code and reason, or the pod's reason (Evicted, ...)
//   WorkerUnschedulable     Pending with PodScheduled False, Unschedulable
// From the region's Job:
//   RegionJobFailed         condition Failed (or FailureTarget) True
// Every message starts with "region <name>: " and names the pod or Job.

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace geo::reconcile {

struct Problem {
  std::string key;     // what makes two sightings the same problem (pod uid + kind)
  std::string reason;  // Event reason, e.g. WorkerOOMKilled
  std::string message;
};

// The problems of `pods` (core/v1 Pod objects, e.g. a list's items) of
// region `region`, pod by pod in the given order.
std::vector<Problem> podProblems(const std::string& region, const nlohmann::json& pods);

// RegionJobFailed for the region's batch/v1 Job, or nothing.
std::vector<Problem> jobProblems(const std::string& region, const nlohmann::json& job);

}  // namespace geo::reconcile
