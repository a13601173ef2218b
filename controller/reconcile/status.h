#pragma once
// A TrainingJob's status from what the reconciler observed in its regions:
// a pure function, so the rules below are tested without clusters, and a
// reconcile that observes nothing new computes the status it already has (the
// reconciler then writes nothing).
//
// Conditions (metav1.Condition, observedGeneration = metadata.generation):
//   Created         True once every region's workload exists; False with
//                   InvalidSpec (the spec's errors), WaitingForGateway (a
//                   region's gateway has no address yet) or Creating.
//   Running         True while every region has all its workers ready;
//                   False with Pending (not all ready yet), Suspended,
//                   Finished (succeeded or failed).
//   Succeeded       True once every region's Job is Complete.
//   Failed          True once any region's Job has Failed (its reason and
//                   message are quoted); the other regions are not stopped
//                   by this function (that is the reconciler's decision).
//   Suspended       True while spec.runPolicy.suspend.
//   RegionDegraded  True while a region's cluster cannot be reached; the
//                   message names them. Its counts keep their last values.
// state (printer column): Invalid, Failed, Succeeded, Suspended, Running,
// Pending, in that precedence. regionsReady: "<ready>/<regions>".
// startTime: first time any worker was active; completionTime: when
// Succeeded became True. Both are kept once set.

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <vector>

#include "controller/api/training_job.h"

namespace geo::reconcile {

struct RegionObservation {
  std::string name;
  int64_t replicas = 1;
  bool reachable = true;          // the region's cluster answered this reconcile
  std::string unreachableReason;  // why not, when !reachable
  // The region's batch/v1 Job as read (null: none yet).
  nlohmann::json job;
  std::string endpoint;  // its gateway's address, "" while unknown
};

struct Observation {
  int64_t generation = 0;
  std::vector<api::FieldError> specErrors;  // non-empty: invalid spec, nothing was created
  bool suspended = false;
  std::vector<RegionObservation> regions;
  // The region whose gateway address is missing (the workloads wait for it).
  std::string waitingForGateway;
  std::optional<api::Progress> progress;  // scraped from rank 0, when reachable
  std::string now;                        // RFC 3339
};

api::TrainingJobStatus aggregateStatus(const api::TrainingJobStatus& previous,
                                       const Observation& observed);

}  // namespace geo::reconcile
