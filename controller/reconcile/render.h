#pragma once
// The objects a TrainingJob needs in each region's cluster (docs/architecture.md
// section 6), as pure functions of the job, its keys and the gateway
// endpoints known so far: the reconciler applies what these return with
// server-side apply, so rendering the same inputs twice gives the same
// objects (no timestamps, no random names) and a second apply changes nothing.
//
// Per region r of job j in namespace ns (names: base = "<j>-<r>"):
//   Secret     <base>-keys     the CURVE secret keys of the region's ranks only
//   ConfigMap  <base>-config   worker.yaml (shared by the region's pods) and
//                              every rank's public key
//   Service    <base>          headless: stable pod names <base>-<i>.<base>
//   Service    <base>-gateway  the region's leader (completion index 0), as
//                              reached from the other regions
//   Job        <base>          Indexed, one pod per worker; the pod passes its
//                              $(JOB_COMPLETION_INDEX) to --completion-index;
//                              a failed worker is retried on a new pod of its
//                              index (spec.runPolicy.backoffLimitPerIndex),
//                              a configuration error (exit 2) fails the Job
//   PersistentVolumeClaim <base>-checkpoints   with spec.checkpointVolume:
//                              spec.checkpoint.dir of every pod of the region,
//                              a folder index-<completion index> each
// Every object carries app.kubernetes.io/{name,instance,component,managed-by,
// part-of} and geotrain.io/{job,region}.
//
// Ranks go region by region in spec order; a region's leader is its first
// rank. The workers of a region reach each other by pod DNS names; across
// regions a worker reaches only the other leaders (through their gateways),
// so another region's members are `none` in transport.peers (which is why a
// job with several regions and several workers in one needs hierarchical
// sync; parseSpec() enforces it).

#include <nlohmann/json.hpp>

#include <map>
#include <string>
#include <vector>

#include "common/status.h"
#include "controller/api/training_job.h"

namespace geo::reconcile {

// The field manager of every write, and the value of the label
// app.kubernetes.io/managed-by on every object the controller renders.
inline constexpr std::string_view kManager = "geotrain-controller";

// Identity of the TrainingJob object, and what of its metadata reaches the
// region Jobs.
struct JobRef {
  std::string name;
  std::string ns;
  std::string uid;
  // The TrainingJob's metadata.labels and annotations: every region's Job
  // and its pods carry them (propagatedLabels()), so that a manager in a
  // region cluster sees what the user put on the job, e.g. Kueue's
  // kueue.x-k8s.io/queue-name.
  std::map<std::string, std::string> labels;
  std::map<std::string, std::string> annotations;
};

// The JobRef of a TrainingJob object as the API server returns it.
JobRef jobRefOf(const nlohmann::json& object);

// What of JobRef's labels and annotations the region Jobs and pods get: all
// but the controller's own keys (api::isReservedLabel/Annotation) and
// kubectl's (kubectl.kubernetes.io/, e.g. last-applied-configuration, which
// holds the whole manifest). Under the pod template's and the controller's.
std::map<std::string, std::string> propagatedLabels(const JobRef& job);
std::map<std::string, std::string> propagatedAnnotations(const JobRef& job);

// The annotation on a region's Job that records the spec.runPolicy.suspend
// the controller last wrote into its spec.suspend.
inline constexpr std::string_view kSuspendAnnotation = "geotrain.io/suspend";

// Sets spec.suspend of `desired` (a rendered Job, see renderWorkerJob) as
// the reconciler applies it, given the Job in the cluster (`live`, null when
// there is none): spec.runPolicy.suspend when the Job is new or that value
// changed since the controller last wrote it (kSuspendAnnotation), else the
// live Job's own value. So spec.suspend is written only when the
// TrainingJob's suspend changes (or at creation), and a manager that
// suspends and resumes Jobs by itself (Kueue, field manager kueue) keeps
// them as it left them, across passes and controller restarts.
void setJobSuspend(nlohmann::json& desired, bool runPolicySuspend, const nlohmann::json& live);

// Settings of the controller, the same for every job.
struct RenderSettings {
  std::string workerImage = "ghcr.io/geotrain/worker:0.1.0";  // when spec.image is empty
  int64_t metricsPort = 9400;
  std::string clusterDomain = "cluster.local";
  int64_t runAsUser = 65532;  // the worker image's non-root user; also the pod's fsGroup
  double metricsLingerSeconds = 30;
};

// One CURVE keypair per rank (Z85), generated once per job; during a key
// rotation (docs/security.md, "Rotating keys") also its next pair (until it
// switches) and its previous public key (after it switched, until the old
// keys retire). Empty: none.
struct RankKeys {
  std::string publicKey;
  std::string secretKey;
  std::string nextPublicKey;
  std::string nextSecretKey;
  std::string previousPublicKey;
};

// The annotation on a TrainingJob that asks for a rotation of its keys: a
// value other than the one status.keyRotation.request answers starts one
// (once the last one is Done).
inline constexpr std::string_view kRotateKeysAnnotation = "geotrain.io/rotate-keys";

// Where a region's ranks sit in the job.
struct RegionPlan {
  std::string name;
  int64_t firstRank = 0;
  int64_t replicas = 0;
};
std::vector<RegionPlan> planRanks(const api::TrainingJobSpec& spec);

// Object names; every name is a DNS label of at most 63 characters.
std::string baseName(const JobRef& job, const std::string& region);
std::string keysSecretName(const JobRef& job, const std::string& region);
std::string configMapName(const JobRef& job, const std::string& region);
std::string headlessServiceName(const JobRef& job, const std::string& region);
std::string gatewayServiceName(const JobRef& job, const std::string& region);
std::string workerJobName(const JobRef& job, const std::string& region);
std::string checkpointClaimName(const JobRef& job, const std::string& region);

// Whether the names derived from the job and its regions fit Kubernetes'
// limits (pod host names <base>-<index> and <base>-gateway are DNS labels).
// The error names metadata.name and the longest region.
Status checkNames(const JobRef& job, const api::TrainingJobSpec& spec);

// The labels every object of the job's region carries (also the selector of
// its pods); `component` is worker, gateway, config or keys.
nlohmann::json labels(const JobRef& job, const std::string& region, const std::string& component);

// The Services of region `index`: they come first, because the other regions'
// configs need the gateway's address.
nlohmann::json renderHeadlessService(const JobRef& job, const api::TrainingJobSpec& spec,
                                     size_t index, const RenderSettings& settings);
nlohmann::json renderGatewayService(const JobRef& job, const api::TrainingJobSpec& spec,
                                    size_t index);

// host:port of a region's gateway as the other regions dial it, from the
// spec's override or the gateway Service's status (first load-balancer
// ingress IP or host name); a ClusterIP gateway is its cluster DNS name
// (reachable only from regions in the same cluster). Empty while not known
// (a load balancer not provisioned yet).
std::string gatewayEndpoint(const JobRef& job, const api::Region& region,
                            const nlohmann::json& gatewayService, const RenderSettings& settings);

// worker.yaml of region `index`: the spec's worker sections (training.device
// as spec.deviceFor() the region: cuda where its pods ask for a GPU) plus the
// job's shape, transport (peers: own region by pod DNS name, other leaders by
// gateway endpoint, other members none), keys and metrics. `endpoints` maps
// every other region to its gateway endpoint; a missing one is
// FailedPrecondition naming it (wait for its load balancer).
StatusOr<WorkerConfig> renderWorkerConfig(const JobRef& job, const api::TrainingJobSpec& spec,
                                          size_t index,
                                          const std::map<std::string, std::string>& endpoints,
                                          const RenderSettings& settings);

// The ConfigMap (worker.yaml + every public key) and the Secret (this
// region's secret keys) of region `index`. `keys` has one entry per rank.
StatusOr<nlohmann::json> renderConfigMap(const JobRef& job, const api::TrainingJobSpec& spec,
                                         size_t index,
                                         const std::map<std::string, std::string>& endpoints,
                                         const std::vector<RankKeys>& keys,
                                         const RenderSettings& settings);
nlohmann::json renderKeysSecret(const JobRef& job, const api::TrainingJobSpec& spec, size_t index,
                                const std::vector<RankKeys>& keys);

// The checkpoint claim of region `index`; spec.checkpointVolume must be set.
// Kept across suspend and resume (only deleting the TrainingJob removes it).
nlohmann::json renderCheckpointClaim(const JobRef& job, const api::TrainingJobSpec& spec,
                                     size_t index);

// The Indexed Job of region `index`. Its pod template is immutable once the
// Job exists (batch/v1): the reconciler creates the Job only when every
// gateway endpoint is known, so the pods start with a complete worker.yaml.
// spec.suspend is spec.runPolicy.suspend (setJobSuspend() decides what is
// applied); labels and annotations: the controller's over the pod
// template's over the TrainingJob's (propagatedLabels()).
nlohmann::json renderWorkerJob(const JobRef& job, const api::TrainingJobSpec& spec, size_t index,
                               const RenderSettings& settings);

}  // namespace geo::reconcile
