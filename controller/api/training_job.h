#pragma once
// TrainingJob (geotrain.io/v1alpha1, short name tj): the custom resource the
// controller reconciles (docs/architecture.md section 5).
//
// The spec is the worker.yaml schema of common/worker_config.h plus what only
// a cluster needs:
//   spec.image                       worker image (empty: the controller's default)
//   spec.seed                        job.seed of every worker
//   spec.model / dataset / training / sync / checkpoint / log
//                                    the worker.yaml sections of the same names,
//                                    key for key, with the same defaults, limits
//                                    and messages (one schema, two doors), except
//                                    that spec.sync.algorithm defaults to dts
//   spec.template                    metadata.labels/annotations and a subset of
//                                    the pod spec for every worker pod (PodOverrides)
//   spec.regions[]                   name, cluster, replicas, dataPath, gateway, and
//                                    the same pod fields for this region's pods
//   spec.runPolicy                   backoffLimitPerIndex, backoffLimit,
//                                    activeDeadlineSeconds, ttlSecondsAfterFinished,
//                                    suspend
//   spec.checkpointVolume            size, storageClassName, accessMode: a
//                                    PersistentVolumeClaim per region for
//                                    spec.checkpoint.dir
//   spec.ttlSecondsAfterFinished     delete the finished TrainingJob after this
// The worker.yaml sections that describe one worker's place and wiring
// (worker, transport, metrics, job.id, dataset.shardIndex/shardCount) are the
// controller's to render per pod and are not part of the spec.
//
// parseSpec() never throws and never stops at the first problem: like the
// Kubernetes API server it returns every FieldError it finds, each naming the
// JSON path of the field, the value and what is allowed, so a user fixes a
// manifest in one round. The same rules are in the CRD's OpenAPI schema
// (manifests/crd); the controller checks again because an API server without
// that schema (or an old CRD) can store anything.

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/names.h"
#include "common/worker_config.h"

namespace geo::api {

inline constexpr std::string_view kGroup = "geotrain.io";
inline constexpr std::string_view kVersion = "v1alpha1";
inline constexpr std::string_view kApiVersion = "geotrain.io/v1alpha1";
inline constexpr std::string_view kKind = "TrainingJob";
inline constexpr std::string_view kPlural = "trainingjobs";
inline constexpr std::string_view kFinalizer = "geotrain.io/cleanup";
inline constexpr std::string_view kLocalCluster = "local";  // the controller's own cluster

// One problem with one field, after Kubernetes' field.Error.
struct FieldError {
  enum class Type {
    kRequired,      // "Required value"
    kInvalid,       // "Invalid value: <value>: <detail>"
    kNotSupported,  // "Unsupported value: <value>: supported values: ..."
    kDuplicate,     // "Duplicate value: <value>"
    kUnknown,       // a field the schema does not have (strict decoding)
  };
  Type type = Type::kInvalid;
  std::string path;    // e.g. spec.regions[1].replicas
  std::string detail;  // what is wrong and what is allowed, without the path

  // "<path>: <detail>", e.g. "spec.sync.bits: 3 is not allowed (allowed: 2, 4, 8)".
  std::string toString() const;
  bool operator==(const FieldError&) const = default;
};

// The worker.yaml sections a spec has (spec.model, spec.dataset, ...), in
// the order the CRD lists them.
const std::vector<std::string>& workerSpecSections();
// Whether a key of those sections ("dataset.shardIndex") is the
// controller's to set (it derives the shards from each worker's place in
// the job, and every transport key but tcpInitialWindow and connections from the regions),
// and so not part of the spec.
bool isControllerOwned(std::string_view path);
// Why such a key is the controller's (for the field error that refuses it);
// nullopt for a key the spec may set.
std::optional<std::string_view> whyControllerOwned(std::string_view path);

// What region and member cluster names must be (common/names.h).
using ::geo::isDnsLabel;

// All errors joined with "; " (the message of an InvalidSpec condition and
// Event), or "" when there are none.
std::string joinErrors(const std::vector<FieldError>& errors);

// Where the region's gateway (completion index 0, the region leader) is
// reachable from the other regions.
struct Gateway {
  std::string serviceType = "LoadBalancer";  // ClusterIP|NodePort|LoadBalancer
  int64_t port = 7000;                       // 1..65535: Service port = worker listen port
  // "host:port" the other regions dial instead of what the Service reports
  // (a DNS name in front of a NodePort, a VPN address, ...). Empty: from the
  // Service status (load-balancer ingress) or, for ClusterIP, its DNS name.
  std::string endpoint;

  bool operator==(const Gateway&) const = default;
};

// What a user may shape of the worker pods, job-wide (spec.template:
// metadata.labels/annotations, the rest under spec) and per region (the same
// fields directly in spec.regions[i]). The lists and objects are core/v1 as
// given; parseSpec() checks what the controller relies on (names, types, and
// that nothing takes the place of the worker's own env, volumes, mounts,
// labels and annotations) and leaves the rest to the API server.
//
// Merge (mergedPod()): the region's value overrides the job-wide one.
//   serviceAccountName, priorityClassName, affinity, resources: the region's
//     replaces the job's when set (non-empty).
//   labels, annotations, nodeSelector: merged by key, the region's wins.
//   env, volumes, imagePullSecrets: merged by name, volumeMounts by
//     mountPath; a region's entry replaces the job's entry of the same key,
//     in the job's place; new entries follow in the region's order.
//   tolerations: the job's, then the region's.
struct PodOverrides {
  std::map<std::string, std::string> labels;
  std::map<std::string, std::string> annotations;
  nlohmann::json env = nlohmann::json::array();           // core/v1 EnvVar list (worker container)
  nlohmann::json volumes = nlohmann::json::array();       // core/v1 Volume list
  nlohmann::json volumeMounts = nlohmann::json::array();  // core/v1 VolumeMount list (worker)
  nlohmann::json imagePullSecrets = nlohmann::json::array();  // LocalObjectReference list
  std::string serviceAccountName;
  nlohmann::json affinity = nlohmann::json::object();    // core/v1 Affinity
  nlohmann::json tolerations = nlohmann::json::array();  // core/v1 Toleration list
  std::map<std::string, std::string> nodeSelector;
  std::string priorityClassName;
  nlohmann::json resources = nlohmann::json::object();  // core/v1 ResourceRequirements (worker)
  // core/v1 Sysctl list ({name, value}, both strings), set in the pod's
  // securityContext: the kernel settings of the pod's own network namespace,
  // e.g. net.ipv4.tcp_rmem / tcp_wmem for links of a large bandwidth-delay
  // product (docs/kubernetes.md; Kubernetes 1.32 and later take those two
  // without a kubelet allowlist).
  nlohmann::json sysctls = nlohmann::json::array();

  bool operator==(const PodOverrides&) const = default;
};

// `job` with `region` merged over it (the rules above).
PodOverrides mergedPod(const PodOverrides& job, const PodOverrides& region);

// The resources of NVIDIA's device plugin that give a container a GPU:
// whole GPUs, GPUs shared by time-slicing under their renamed resource, and
// MIG slices (every name with the prefix, e.g. nvidia.com/mig-1g.10gb).
inline constexpr std::string_view kGpuResources[] = {"nvidia.com/gpu", "nvidia.com/gpu.shared"};
inline constexpr std::string_view kGpuResourcePrefix = "nvidia.com/mig-";
bool isGpuResource(std::string_view name);
// Whether `resources` (core/v1 ResourceRequirements) ask for a GPU: a limit
// or a request above 0 of a GPU resource (parseSpec() checks that their
// values are whole numbers: JSON integers, or strings such as "1").
bool asksForGpu(const nlohmann::json& resources);

// What the worker's pod keeps for itself; parseSpec() rejects a spec that
// sets any of them (kReservedMountPaths: also spec.checkpoint.dir).
inline constexpr std::string_view kReservedEnv[] = {"JOB_COMPLETION_INDEX"};
inline constexpr std::string_view kReservedVolumes[] = {"config", "keys", "tmp", "checkpoints"};
inline constexpr std::string_view kReservedMountPaths[] = {"/etc/geotrain/config",
                                                           "/etc/geotrain/keys", "/tmp"};
// Label keys the controller sets itself (besides the prefixes below).
inline constexpr std::string_view kReservedLabels[] = {
    "app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/component",
    "app.kubernetes.io/managed-by", "app.kubernetes.io/part-of"};
// Label and annotation key prefixes of the controller and the Job controller.
inline constexpr std::string_view kReservedPrefixes[] = {"geotrain.io/", "batch.kubernetes.io/"};
inline constexpr std::string_view kReservedAnnotations[] = {"prometheus.io/scrape",
                                                            "prometheus.io/port"};
bool isReservedLabel(std::string_view key);
bool isReservedAnnotation(std::string_view key);

struct Region {
  std::string name;                    // lowercase DNS label, unique in the job
  std::string cluster{kLocalCluster};  // member cluster name of the controller's config
  int64_t replicas = 1;                // workers in this region, >= 1
  PodOverrides pod;                    // this region's pod fields, over spec.template
  std::string dataPath;                // overrides spec.dataset.path in this region
  Gateway gateway;

  bool operator==(const Region&) const = default;
};

struct RunPolicy {
  // Failures of one worker (one completion index of its region's Job: a
  // crash, a signal, an OOM kill; not an eviction or preemption) that are
  // retried, each time on a new pod that resumes from the worker's newest
  // checkpoint; the next failure fails the region's Job, and so the job.
  // 0..2^31-1. The default of 6 rides out a transient cause (a peer region
  // restarting, a node's memory pressure) with Kubernetes' back-off between
  // retries (10 s doubling, at most 6 min: about 10 minutes for all six),
  // while a worker that crashes every time fails the job within minutes
  // instead of holding its accelerators. The count of a worker never resets:
  // a run of days with sporadic crashes may need more.
  int64_t backoffLimitPerIndex = 6;
  // Failures of all the workers of one region together, when set (0..2^31-1).
  // Unset: no limit of its own (the region's Job gets replicas *
  // (backoffLimitPerIndex + 1), which backoffLimitPerIndex always reaches
  // first). A limit below that fails a region of sporadic crashes sooner.
  std::optional<int64_t> backoffLimit;
  std::optional<int64_t> activeDeadlineSeconds;    // >= 1 when set
  std::optional<int64_t> ttlSecondsAfterFinished;  // >= 0 when set
  bool suspend = false;  // true: delete the workers; false again: resume from checkpoints

  bool operator==(const RunPolicy&) const = default;
};

// spec.checkpointVolume: one PersistentVolumeClaim per region, mounted at
// spec.checkpoint.dir, each worker in a folder of its own (index-<completion
// index>), so checkpoints outlive the pods: suspend and resume, evictions,
// node loss. Without it checkpoints live in an emptyDir and die with the pod.
struct CheckpointVolume {
  std::string size;              // a Kubernetes quantity, e.g. 20Gi (required)
  std::string storageClassName;  // "": the cluster's default StorageClass
  // ReadWriteOnce, ReadWriteMany or ReadWriteOncePod; "": ReadWriteOnce for a
  // region of one replica, ReadWriteMany otherwise (its pods share the claim
  // and may run on different nodes).
  std::string accessMode;

  // The access mode a region of `replicas` workers gets.
  std::string accessModeFor(int64_t replicas) const;
  bool operator==(const CheckpointVolume&) const = default;
};

struct TrainingJobSpec {
  std::string image;  // empty: the controller's --worker-image
  // model, dataset (name, path, syntheticSamples), training, sync,
  // checkpoint, log and job.seed as given (or defaulted); the other fields
  // keep WorkerConfig's defaults until the controller renders a pod's config.
  WorkerConfig worker = defaultWorkerConfig();
  PodOverrides podTemplate;  // spec.template
  std::vector<Region> regions;
  RunPolicy runPolicy;
  std::optional<CheckpointVolume> checkpointVolume;
  // spec.ttlSecondsAfterFinished (>= 0 when set): the TrainingJob itself is
  // deleted this long after it finished (Succeeded or Failed), like a
  // batch/v1 Job with the same field; its regions' objects go with it (the
  // finalizer). Unset: kept. Unlike runPolicy.ttlSecondsAfterFinished, which
  // the region Jobs get (their pods go, the TrainingJob stays finished).
  std::optional<int64_t> ttlSecondsAfterFinished;

  int64_t totalReplicas() const;
  // The data path of a region: its dataPath, else spec.dataset.path.
  std::string dataPath(const Region& region) const;
  // The pod fields of a region: spec.template with the region's merged over it.
  PodOverrides podFor(const Region& region) const;
  // training.device of a region's workers: cuda where spec.training.device
  // is auto (the default) and the region's pods ask for a GPU (asksForGpu()
  // of podFor(region).resources), so that a GPU pod fails at start rather
  // than train on its CPU when its image or node has no usable CUDA; else
  // spec.training.device. parseSpec() refuses cuda for a job with a region
  // whose pods ask for no GPU.
  std::string deviceFor(const Region& region) const;

  // A TrainingJob's WorkerConfig before the controller places a worker:
  // WorkerConfig's defaults except sync.algorithm = dts.
  static WorkerConfig defaultWorkerConfig();

  bool operator==(const TrainingJobSpec&) const = default;
};

struct ParsedSpec {
  TrainingJobSpec spec;            // defaults filled in; meaningful only without errors
  std::vector<FieldError> errors;  // empty: the spec is valid
};

// Reads and validates the `spec` member of a TrainingJob object (the whole
// object, as the API server returns it). Absent and null fields take their
// defaults. Checks every field's type and range (the worker.yaml rules for
// the worker sections), unknown fields, and across fields: at least one
// region; unique region names; a data path for every region unless the data
// set is synthetic; what validateWorkerConfig() checks for the job as a whole
// (one worker per rank of the total replicas); the pod fields (PodOverrides):
// unique names, nothing of the worker's own overridden, and every
// volumeMount of a region naming a volume the region's pods have; a GPU
// resource's value a whole number, and training.device cuda only when
// every region's pods ask for a GPU. It decodes first (every field on its
// own, all errors found) and checks the relations between fields only when
// decoding found none, so that a relation is never reported of a field that
// is itself wrong.
ParsedSpec parseSpec(const nlohmann::json& object);

// The spec written back as JSON with every default explicit (what a CRD's
// defaults make the API server store); parseSpec(toJson(s)) == s.
nlohmann::json specToJson(const TrainingJobSpec& spec);

// --- status ------------------------------------------------------------

// metav1.Condition.
struct Condition {
  std::string type;    // Created, Running, Succeeded, Failed, Suspended, RegionDegraded
  std::string status;  // True, False, Unknown
  int64_t observedGeneration = 0;
  std::string lastTransitionTime;  // RFC 3339, UTC, seconds
  std::string reason;              // CamelCase
  std::string message;

  bool operator==(const Condition&) const = default;
};

inline constexpr std::string_view kConditionCreated = "Created";
inline constexpr std::string_view kConditionRunning = "Running";
inline constexpr std::string_view kConditionSucceeded = "Succeeded";
inline constexpr std::string_view kConditionFailed = "Failed";
inline constexpr std::string_view kConditionSuspended = "Suspended";
inline constexpr std::string_view kConditionRegionDegraded = "RegionDegraded";

// Sets `c` in `conditions` (keyed by type) like apimachinery's
// meta.SetStatusCondition: lastTransitionTime changes only when the status
// changes (or the condition is new: then `now`); reason, message and
// observedGeneration are always updated. Returns whether anything changed.
bool setCondition(std::vector<Condition>& conditions, Condition c, const std::string& now);
const Condition* findCondition(const std::vector<Condition>& conditions, std::string_view type);

struct RegionStatus {
  std::string name;
  int64_t ready = 0;  // worker pods ready
  int64_t active = 0;
  int64_t succeeded = 0;
  int64_t failed = 0;
  std::string endpoint;   // host:port of the gateway, once known
  bool reachable = true;  // the member cluster answered the last reconcile
  // Every worker of the region's current run has been ready (or done) at the
  // same time: from then on, fewer is a worker lost and being restarted
  // (RegionDegraded), not a start-up. False again while the region's Job is
  // absent, suspended or finished (reconcile/status.h).
  bool started = false;

  bool operator==(const RegionStatus&) const = default;
};

struct Progress {
  std::optional<int64_t> step;
  std::optional<double> loss;
  std::optional<double> accuracy;  // 0..1
  // The latest evaluation's test loss (cross-entropy, mean squared error, or
  // nats per token): a regression or the gpt has no accuracy.
  std::optional<double> evalLoss;

  bool operator==(const Progress&) const = default;
};

// A rotation of the job's CURVE keys, asked for with the annotation
// geotrain.io/rotate-keys (docs/security.md, "Rotating keys"): which
// request it answers, its phase (Admitting: every worker admits the next
// keys; Switching: every worker takes its new keypair; Retiring: the old
// keys are refused; Done) and since when every region's key files have
// been those of the phase (RFC 3339; empty until they are).
struct KeyRotationStatus {
  std::string request;
  std::string phase;
  std::string phaseSince;

  bool operator==(const KeyRotationStatus&) const = default;
};

struct TrainingJobStatus {
  // One-word summary of the conditions for `kubectl get` (printer column
  // State): Pending, Running, Succeeded, Failed, Suspended or Invalid.
  std::string state;
  std::string regionsReady;  // "<regions with every worker ready>/<regions>", e.g. 3/4
  int64_t observedGeneration = 0;
  std::vector<Condition> conditions;
  std::vector<RegionStatus> regions;
  Progress progress;
  std::string startTime;       // RFC 3339, empty until the workers started
  std::string completionTime;  // RFC 3339, empty until Succeeded
  // Where the job's model went (spec.output.path in each region's volume);
  // empty until Succeeded, or when the spec writes none.
  std::string outputPath;
  std::optional<KeyRotationStatus> keyRotation;  // since the first rotation asked for

  bool operator==(const TrainingJobStatus&) const = default;
};

nlohmann::json statusToJson(const TrainingJobStatus& status);
// Lenient: a status written by an older controller (or by hand) is read as
// far as it makes sense; unknown members are dropped.
TrainingJobStatus statusFromJson(const nlohmann::json& status);

// RFC 3339 UTC time with second precision ("2026-11-22T08:15:00Z").
std::string rfc3339Now();
// `time` in the same form, to the second.
std::string rfc3339(std::chrono::system_clock::time_point time);

}  // namespace geo::api
