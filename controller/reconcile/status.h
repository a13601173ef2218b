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
//   Running         True while every region has all its workers ready
//                   (AllWorkersReady), or once started has fewer while they
//                   are restarted (WorkersRestarting: the job runs on);
//                   False with Pending (not all ready yet), Suspended,
//                   WaitingForAdmission (spec.runPolicy.suspend is false
//                   but a region's Job is suspended: another manager such
//                   as Kueue holds it back until it admits it; the message
//                   names the regions; state Pending), Finished (succeeded
//                   or failed).
//   Succeeded       True once every region's Job is Complete.
//   Failed          True once any region's Job has Failed, or is failing
//                   (FailureTarget) (its reason and message are quoted); the
//                   other regions are not stopped by this function (that is
//                   the reconciler's decision).
//   Suspended       True while spec.runPolicy.suspend.
//   RegionDegraded  True while a region's cluster cannot be reached
//                   (RegionUnreachable; its counts keep their last values),
//                   or answers that the job's namespace does not exist there
//                   (NamespaceMissing: "namespace ml does not exist in
//                   cluster tokyo (region tokyo): create it there"),
//                   or while a region that had started has fewer workers
//                   ready than its replicas (WorkersRestarting); the message
//                   names each region, e.g. "cannot reach: ohio (...)" or
//                   "tokyo: 1/2 workers ready (a worker failed and is being
//                   restarted)". False (AllRegionsHealthy) otherwise.
// state (printer column): Invalid, Failed, Succeeded, Suspended, Running,
// Pending, in that precedence (a job with restarting workers is Running).
// regionsReady: "<regions with every worker ready or done>/<regions>".
//
// A region's workers, from its batch/v1 Job's status:
//   up       ready + succeeded >= replicas: every worker answers its
//            readiness probe (it loaded its data, model and keys and joined
//            the job) or has finished.
//   started  RegionStatus.started: the region has been up since its Job was
//            last created or resumed. Set by the first pass that sees it
//            up; cleared while the Job is absent, suspended
//            (spec.runPolicy.suspend, or its own spec.suspend) or finishing (condition Complete,
//            Failed, SuccessCriteriaMet or FailureTarget: Kubernetes is
//            deleting its pods); kept while the cluster cannot be reached.
//   degraded started and not up, while not suspended or finishing: a
//            worker's pod failed (a crash, an OOM kill, an eviction) and the
//            Job is replacing it, or its replacement is not ready yet.
// So the first start-up of a Job, and the one after a resume, is Pending
// and never degraded, however long its pods take to schedule or load data.
// Only `ready` says that a worker is working now: `active` counts pods still
// starting; `failed` only grows over the Job's life (and leaves out
// evictions and preemptions, which the pod failure policy ignores);
// `failedIndexes` and `uncountedTerminatedPods` name workers out of retries
// (the Job then fails: Failed) or pods the Job controller is still
// counting. A Job status without `ready` (Kubernetes before 1.24) never
// starts, so it is never reported degraded.
// startTime: first time any worker was active; completionTime: when
// Succeeded became True. Both are kept once set.
//
// Finished jobs: Succeeded=True and Failed=True are terminal. Once either is
// in `previous`, the status is never recomputed from Jobs that are missing,
// unreachable, recreated or changed: the TTL controller deletes a finished
// Job after ttlSecondsAfterFinished, and a job that is over must not go back
// to Pending (nor look like it should run again). An observation may only
// add detail to the same outcome while every region's Job is still there
// (the Failed message replacing FailureTarget's, the last counts); anything
// else, an invalid spec or an observation of no regions included (the
// reconciler does not look at a finished job's regions, reconciler.h),
// keeps the previous status, with only observedGeneration advanced.

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
  // The cluster answered, but the job's namespace does not exist there
  // (then also !reachable: nothing of the region can be written or read).
  std::string missingNamespace;
};

struct Observation {
  int64_t generation = 0;
  std::vector<api::FieldError> specErrors;  // non-empty: invalid spec, nothing was created
  bool suspended = false;
  std::vector<RegionObservation> regions;
  // The region whose gateway address is missing (the workloads wait for it).
  std::string waitingForGateway;
  std::optional<api::Progress> progress;  // scraped from rank 0, when reachable
  // spec.output.path: where each region's first worker writes the job's
  // model; named in the status once the job has succeeded.
  std::string outputPath;
  // The key rotation as this pass left it (absent: as it was).
  std::optional<api::KeyRotationStatus> keyRotation;
  std::string now;  // RFC 3339
};

// Whether the status records a finished job (Succeeded or Failed True).
bool isFinished(const api::TrainingJobStatus& status);

api::TrainingJobStatus aggregateStatus(const api::TrainingJobStatus& previous,
                                       const Observation& observed);

}  // namespace geo::reconcile
