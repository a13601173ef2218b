#pragma once
// Reconciler: one level-based pass over one TrainingJob (docs/architecture.md
// section 6). It reads the object from the hub, then the state of every
// region's cluster, and writes only what differs from render.h's desired
// objects (server-side apply, field manager geotrain-controller, force) and
// status.h's status. It never acts on an event alone: any pass over any
// state converges, and a pass over a converged job writes nothing.
//
// A pass, in order (the stages of reconcile(), each its own function):
//   1. deleted (deletionTimestamp): cleanup() deletes the job's objects in
//      every region's cluster; when all are gone, it releases the finalizer
//      geotrain.io/cleanup. A region that cannot be reached keeps the
//      finalizer (RegionDegraded, CleanupBlocked) and the pass asks to be
//      retried, until options.cleanupTimeout after the deletion: then the
//      region is given up (CleanupAbandoned, a Warning Event) and the
//      finalizer released. A region of a cluster that is no member
//      (Clusters::known()) has nothing to delete.
//   2. addFinalizer(): the finalizer (ownerReferences cannot cross
//      clusters).
//   2b. finished(): a finished job (status.h: Succeeded or Failed recorded)
//      is left as it is: its regions are neither read nor written again, so
//      a region's Job that is deleted afterwards (ttlSecondsAfterFinished,
//      by hand) is never recreated and the workers never run again; only
//      observedGeneration follows spec edits. Deletion (1.) still cleans up
//      every region. With spec.ttlSecondsAfterFinished the TrainingJob is
//      deleted that long after its Succeeded or Failed condition became
//      True (the pass that finishes it asks to be run again then).
//   3. parseAndCheck() validates the spec (api::parseSpec,
//      render::checkNames, every region's cluster a known one:
//      unknownClusters()); invalidSpec() writes the errors into the
//      condition Created=False/InvalidSpec and a Warning Event; nothing is
//      written to the regions.
//   4. observeRegions(), every region at once: the headless and gateway
//      Services, then the gateway address; the CURVE keys of the region's
//      ranks from its Secret (generated with libsodium the first time; a
//      secret key is only ever written into its own region's cluster); the
//      region's Secret, claim, ConfigMap and Job as they are.
//   4b. rotateKeys(): a rotation of the job's keys asked for with the
//      annotation geotrain.io/rotate-keys (docs/security.md, "Rotating
//      keys"), in the phases of status.keyRotation: Admitting (every
//      rank's next keypair: its secret key in its region's Secret, its
//      public key in every region's ConfigMap as worker-<r>.next.pub),
//      Switching (every rank's new pair in place, its old public key as
//      worker-<r>.previous.pub), Retiring (the old keys gone), Done. A phase
//      begins once the previous one's files have been in every region for
//      options.keyRotationStep (the time the kubelet takes to update the
//      pods' files), and its files are written again on every pass until
//      every region has them (recordKeyRotation(): then phaseSince).
//   5. applyWorkloads(), when every gateway address and every region's keys
//      are known: per region the Secret, the checkpoint claim
//      (spec.checkpointVolume), the ConfigMap, then the Indexed Job.
//      spec.runPolicy.suspend suspends the Jobs (Kubernetes deletes their
//      pods; the claims stay), and unsetting it lets the pods start again
//      from the newest checkpoints. A Job's spec.suspend is written only at
//      creation and when that value changes (render.h, setJobSuspend()), so
//      that another manager (Kueue) may suspend and resume it; the status
//      says the job waits for it. A Job that refuses the change as invalid
//      (fields Kubernetes keeps as created: its pod template, failure
//      policy, per-worker retries) runs on as it is: an ApplyFailed Event,
//      and its status still counts. Once created, a Job retries each failed
//      worker by itself (render.h); the status reports it while it does
//      (status.h).
//   5b. reportWorkerProblems(): worker problems in the regions' clusters
//      (pod_problems.h: image pulls, OOM kills, crash loops, failed pods,
//      unschedulable pods, a failed Job) as Warning Events on the
//      TrainingJob naming the region, each once per job and at most a few
//      per region and pass; a region's pods are listed only while a worker
//      is not ready or one more failed.
//   6. readProgress(): progress (step, loss, accuracy) from rank 0's
//      /metrics through the first region's API server (pods proxy), while
//      its workers are active.
//   7. updateStatus(): the status from the regions' Jobs (written only when
//      it changed); with a waiting gateway a WaitingForGateway Event and
//      log line, once; and when to look again.
// A region whose cluster fails is skipped for this pass (RegionDegraded);
// the other regions go on.
//
// Threading: a Reconciler may be used from several threads for different
// jobs (the work queue never hands one key to two workers at once); within a
// pass it works on all regions at once, one thread per region. Between
// passes it keeps only when each job last had a full apply and which worker
// problems it reported. Time (time stamps, the TTL, the cleanup timeout, the
// full-apply period) is read from the Reconciler's Clock. Errors:
// reconcile() returns what to do next; only an unexpected failure of the
// hub itself is an error.

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/status.h"
#include "controller/kube/client.h"
#include "controller/kube/controller.h"
#include "controller/kube/events.h"
#include "controller/reconcile/cluster_cache.h"
#include "controller/reconcile/pod_problems.h"
#include "controller/reconcile/render.h"
#include "controller/reconcile/task_pool.h"

namespace geo::reconcile {

inline const kube::ResourceRef kTrainingJobs{"geotrain.io", "v1alpha1", "trainingjobs", true};

// Whether an update of a TrainingJob seen by the informer asks for a pass:
// anything but status, resourceVersion and managedFields changed (spec,
// generation, labels, annotations, finalizers, deletionTimestamp). The
// controller's own status writes are thereby no reason for another pass,
// which matters once status carries scraped progress: a pass that writes
// status would otherwise cause the next pass, forever.
bool needsReconcile(const nlohmann::json& oldObject, const nlohmann::json& newObject);

// One error per region whose cluster is not in `known` (Clusters::known();
// nullopt: none), naming the field: spec.regions[2].cluster: "paris" is not
// a member cluster; known: local, tokyo (...).
std::vector<api::FieldError> unknownClusters(const api::TrainingJobSpec& spec,
                                             const std::optional<std::vector<std::string>>& known);

// The clients of the clusters TrainingJobs name in spec.regions[].cluster.
class Clusters {
 public:
  virtual ~Clusters() = default;
  // The client of `cluster` ("local": the hub's own), or an error saying why
  // there is none (unknown name, unreadable kubeconfig Secret). The pointer
  // stays valid while the Clusters lives.
  virtual StatusOr<kube::KubeClient*> client(const std::string& cluster) = 0;
  // Every cluster name a region may use ("local" first), or nullopt when
  // the list is not known (any name is tried). A spec naming another
  // cluster is invalid (InvalidSpec on spec.regions[i].cluster), and a
  // region of a cluster not in the list has nothing to clean up.
  virtual std::optional<std::vector<std::string>> known() const { return std::nullopt; }
  // The informer cache of `cluster` (cluster_cache.h), or null when there
  // is none (yet): the reconciler then GETs every object. Call client()
  // first; the pointer stays valid while the Clusters lives.
  virtual const ClusterCache* cache(const std::string& cluster) {
    (void)cluster;
    return nullptr;
  }
};

// What a pass saw, for metrics and tests; it never steers the work queue.
struct PassReport {
  std::string state;  // the job's status.state after the pass ("" when gone)
  // Region name -> whether its cluster answered this pass.
  std::map<std::string, bool> regionReachable;
};

// The outcome of a pass: what the work queue does with the key (control),
// and what the pass saw (report).
struct ReconcileResult {
  // retry: a region failed or a write conflicted (the queue's backoff).
  // after: look again then (waiting for a load balancer, polling the
  // regions' Jobs while the job runs, a finished job's TTL).
  kube::Requeue requeue;
  PassReport report;
};

struct ReconcilerOptions {
  RenderSettings render;
  std::chrono::milliseconds pollRunning{10000};  // while workers run
  std::chrono::milliseconds pollGateways{3000};  // while a gateway has no address
  // status.progress from rank 0's /metrics (progress.h) on every pass while
  // the first region's workers are active.
  bool scrapeProgress = true;
  std::chrono::milliseconds scrapeTimeout{3000};
  // Objects are written only when their rendered content changed (hash
  // annotation geotrain.io/applied-hash), except that a job's first pass in
  // this process and one pass per this period apply everything, which also
  // undoes changes made by hand to fields the controller owns.
  std::chrono::milliseconds fullApplyEvery{std::chrono::minutes(10)};
  // How long after a TrainingJob's deletion (its deletionTimestamp) the
  // cleanup of regions that still cannot be reached is given up: a Warning
  // Event and condition CleanupAbandoned name what may be left, and the
  // finalizer goes, so that `kubectl delete` always completes.
  std::chrono::milliseconds cleanupTimeout{std::chrono::minutes(10)};
  // Threads that work on the regions of passes alongside the pass's own
  // thread (0: one region after another).
  size_t regionThreads = 8;
  // How long each phase of a key rotation (annotation geotrain.io/rotate-keys)
  // lasts once every region's files are those of the phase: the kubelet
  // updates a mounted ConfigMap or Secret within its sync period plus its
  // cache's TTL (a minute each by default), and every worker must have
  // read them before the next phase.
  std::chrono::milliseconds keyRotationStep{std::chrono::seconds(150)};
};

class Reconciler {
 public:
  // `hub`, `clusters` and `clock` must outlive the Reconciler; `events` may
  // be null.
  Reconciler(kube::KubeClient& hub, Clusters& clusters, kube::EventRecorder* events,
             ReconcilerOptions options, const Clock& clock = systemClock());

  StatusOr<ReconcileResult> reconcile(const std::string& ns, const std::string& name);

 private:
  struct Pass;  // the state one pass carries from stage to stage

  // The stages, numbered as in the list above.
  StatusOr<ReconcileResult> cleanup(const nlohmann::json& object, const JobRef& job);  // 1
  // Deletes the job's objects in every region; what failed, per region.
  std::vector<std::string> deleteInRegions(const nlohmann::json& object, const JobRef& job);
  // Records a blocked cleanup (condition, log, Event); true when the
  // cleanup timeout is up and the failed regions are given up.
  bool cleanupGivesUp(const nlohmann::json& object, const JobRef& job,
                      const std::vector<std::string>& failures);
  kube::ApiResult<nlohmann::json> addFinalizer(const nlohmann::json& object);      // 2
  StatusOr<ReconcileResult> finished(Pass& pass);                                  // 2b
  api::ParsedSpec parseAndCheck(const nlohmann::json& object, const JobRef& job);  // 3
  StatusOr<ReconcileResult> invalidSpec(Pass& pass, std::vector<api::FieldError> errors);
  void observeRegions(Pass& pass);  // 4
  void observeRegion(Pass& pass, size_t i);
  void rotateKeys(Pass& pass);         // 4b
  void recordKeyRotation(Pass& pass);  // after 5
  Status applyWorkloads(Pass& pass);   // 5
  // Applies region i's Job; true when it created it.
  bool applyJob(Pass& pass, size_t i);
  // Marks region i failed by a write of applyWorkloads(); thread-safe.
  void failRegion(Pass& pass, size_t i, const std::string& what, const kube::ApiError& e);
  void reportWorkerProblems(Pass& pass);  // 5b
  std::vector<Problem> regionProblems(const Pass& pass, size_t i);
  void readProgress(Pass& pass);  // 6
  void updateStatus(Pass& pass);  // 7
  void announceWaitingForGateway(const Pass& pass, const api::TrainingJobStatus& status);

  // Now, in RFC 3339 (condition times).
  std::string stamp() const;
  void event(const nlohmann::json& object, bool warning, std::string_view reason,
             const std::string& message);
  Status writeStatus(const nlohmann::json& object, const api::TrainingJobStatus& previous,
                     const api::TrainingJobStatus& status);
  // Whether this pass of job `key` applies every object (and, if so, notes
  // the time); forgetFullApply makes the next pass a full one.
  bool dueForFullApply(const std::string& key);
  void forgetFullApply(const std::string& key);

  // Whether worker problem `key` (pod_problems.h) of job `job` ("ns/name",
  // incarnation `uid`) is new, remembering it; forgetProblems drops a job's.
  bool firstSighting(const std::string& job, const std::string& uid, const std::string& key);
  void forgetProblems(const std::string& job);

  kube::KubeClient& hub_;
  Clusters& clusters_;
  kube::EventRecorder* events_;
  ReconcilerOptions options_;
  const Clock& clock_;
  // The regions of a pass at once: a pass takes as long as its slowest
  // region, not the sum of all (each is another cluster, often on another
  // continent).
  TaskPool pool_;
  std::mutex fullApplyMu_;
  std::map<std::string, Clock::TimePoint> lastFullApply_;
  static constexpr size_t kMaxRememberedProblems = 1024;
  struct Sightings {
    std::string uid;
    std::set<std::string> keys;
  };
  std::mutex problemsMu_;
  std::map<std::string, Sightings> reportedProblems_;  // by "ns/name"
};

}  // namespace geo::reconcile
