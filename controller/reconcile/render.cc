#include "controller/reconcile/render.h"

#include <fmt/format.h>
#include <sodium.h>

#include <algorithm>
#include <cstdint>

#include "common/enforce.h"
#include "common/exit_codes.h"

namespace geo::reconcile {

namespace {

using nlohmann::json;

constexpr std::string_view kConfigDir = "/etc/geotrain/config";
constexpr std::string_view kKeyDir = "/etc/geotrain/keys";
constexpr size_t kMaxBaseName = 55;  // + "-gateway" = 63; pod host names <base>-<index>

std::string base64(const std::string& bytes) {
  std::string out(sodium_base64_ENCODED_LEN(bytes.size(), sodium_base64_VARIANT_ORIGINAL), '\0');
  sodium_bin2base64(out.data(), out.size(), reinterpret_cast<const unsigned char*>(bytes.data()),
                    bytes.size(), sodium_base64_VARIANT_ORIGINAL);
  out.resize(out.size() - 1);  // the terminating NUL
  return out;
}

json metadata(const JobRef& job, const std::string& name, const std::string& region,
              const std::string& component) {
  return {{"name", name}, {"namespace", job.ns}, {"labels", labels(job, region, component)}};
}

const api::Region& regionAt(const api::TrainingJobSpec& spec, size_t index) {
  return spec.regions.at(index);
}

// The labels that pick a region's worker pods (a subset of labels(), stable
// across controller versions: selectors of existing Services and Jobs
// cannot change).
json podSelector(const JobRef& job, const std::string& region) {
  return {{"geotrain.io/job", job.name},
          {"geotrain.io/region", region},
          {"app.kubernetes.io/component", "worker"}};
}

}  // namespace

JobRef jobRefOf(const json& object) {
  JobRef job;
  const json meta = object.value("metadata", json::object());
  if (!meta.is_object()) return job;
  job.name = meta.value("name", "");
  job.ns = meta.value("namespace", "");
  job.uid = meta.value("uid", "");
  for (const char* key : {"labels", "annotations"}) {
    const json m = meta.value(key, json::object());
    if (!m.is_object()) continue;
    auto& out = std::string_view(key) == "labels" ? job.labels : job.annotations;
    for (const auto& [k, v] : m.items()) {
      if (v.is_string()) out[k] = v.get<std::string>();
    }
  }
  return job;
}

namespace {
bool isKubectls(std::string_view key) {
  return key.substr(0, std::string_view("kubectl.kubernetes.io/").size()) ==
         "kubectl.kubernetes.io/";
}
}  // namespace

std::map<std::string, std::string> propagatedLabels(const JobRef& job) {
  std::map<std::string, std::string> out;
  for (const auto& [k, v] : job.labels) {
    if (!api::isReservedLabel(k) && !isKubectls(k)) out[k] = v;
  }
  return out;
}

std::map<std::string, std::string> propagatedAnnotations(const JobRef& job) {
  std::map<std::string, std::string> out;
  for (const auto& [k, v] : job.annotations) {
    if (!api::isReservedAnnotation(k) && !isKubectls(k)) out[k] = v;
  }
  return out;
}

void setJobSuspend(json& desired, bool runPolicySuspend, const json& live) {
  const std::string wanted = runPolicySuspend ? "true" : "false";
  desired["metadata"]["annotations"][std::string(kSuspendAnnotation)] = wanted;
  desired["spec"]["suspend"] = runPolicySuspend;
  if (!live.is_object()) return;  // created now: the TrainingJob's value
  const json meta = live.value("metadata", json::object());
  const json annotations = meta.is_object() ? meta.value("annotations", json::object()) : json();
  const bool unchanged =
      annotations.is_object() && annotations.value(std::string(kSuspendAnnotation), "") == wanted;
  const json spec = live.value("spec", json::object());
  if (unchanged && spec.is_object() && spec.contains("suspend") && spec["suspend"].is_boolean()) {
    desired["spec"]["suspend"] = spec["suspend"];  // whoever set it last keeps it
  }
}

std::vector<RegionPlan> planRanks(const api::TrainingJobSpec& spec) {
  std::vector<RegionPlan> plan;
  int64_t next = 0;
  for (const auto& r : spec.regions) {
    plan.push_back({r.name, next, r.replicas});
    next += r.replicas;
  }
  return plan;
}

std::string baseName(const JobRef& job, const std::string& region) {
  return job.name + "-" + region;
}
std::string keysSecretName(const JobRef& job, const std::string& region) {
  return baseName(job, region) + "-keys";
}
std::string configMapName(const JobRef& job, const std::string& region) {
  return baseName(job, region) + "-config";
}
std::string headlessServiceName(const JobRef& job, const std::string& region) {
  return baseName(job, region);
}
std::string gatewayServiceName(const JobRef& job, const std::string& region) {
  return baseName(job, region) + "-gateway";
}
std::string workerJobName(const JobRef& job, const std::string& region) {
  return baseName(job, region);
}
std::string checkpointClaimName(const JobRef& job, const std::string& region) {
  return baseName(job, region) + "-checkpoints";
}

Status checkNames(const JobRef& job, const api::TrainingJobSpec& spec) {
  std::string longest;
  for (const auto& r : spec.regions) {
    if (r.name.size() > longest.size()) longest = r.name;
  }
  const size_t length = baseName(job, longest).size();
  if (length > kMaxBaseName) {
    return invalidArgument(fmt::format(
        "metadata.name: {} is too long for region {} (allowed: name and region name together "
        "at most {} characters, so that {}-gateway and the pod names are DNS labels)",
        job.name, longest, kMaxBaseName - 1, baseName(job, longest)));
  }
  return {};
}

json labels(const JobRef& job, const std::string& region, const std::string& component) {
  return {{"app.kubernetes.io/name", "geotrain"},
          {"app.kubernetes.io/instance", job.name},
          {"app.kubernetes.io/component", component},
          {"app.kubernetes.io/managed-by", std::string(kManager)},
          {"app.kubernetes.io/part-of", "geotrain"},
          {"geotrain.io/job", job.name},
          {"geotrain.io/region", region}};
}

json renderHeadlessService(const JobRef& job, const api::TrainingJobSpec& spec, size_t index,
                           const RenderSettings& settings) {
  const api::Region& r = regionAt(spec, index);
  return {{"apiVersion", "v1"},
          {"kind", "Service"},
          {"metadata", metadata(job, headlessServiceName(job, r.name), r.name, "worker")},
          {"spec",
           {{"clusterIP", "None"},
            // Workers find each other before they are ready (they are ready
            // only once training runs).
            {"publishNotReadyAddresses", true},
            {"selector", podSelector(job, r.name)},
            {"ports",
             {{{"name", "transport"}, {"port", r.gateway.port}, {"protocol", "TCP"}},
              {{"name", "metrics"}, {"port", settings.metricsPort}, {"protocol", "TCP"}}}}}}};
}

json renderGatewayService(const JobRef& job, const api::TrainingJobSpec& spec, size_t index) {
  const api::Region& r = regionAt(spec, index);
  json selector = podSelector(job, r.name);
  selector["batch.kubernetes.io/job-completion-index"] = "0";
  json port = {{"name", "transport"},
               {"port", r.gateway.port},
               {"targetPort", r.gateway.port},
               {"protocol", "TCP"}};
  if (r.gateway.serviceType == "NodePort") {
    port["nodePort"] = std::stoi(r.gateway.endpoint.substr(r.gateway.endpoint.rfind(':') + 1));
  }
  return {{"apiVersion", "v1"},
          {"kind", "Service"},
          {"metadata", metadata(job, gatewayServiceName(job, r.name), r.name, "gateway")},
          {"spec",
           {{"type", r.gateway.serviceType},
            {"publishNotReadyAddresses", true},
            {"selector", selector},
            {"ports", json::array({port})}}}};
}

std::string gatewayEndpoint(const JobRef& job, const api::Region& region,
                            const json& gatewayService, const RenderSettings& settings) {
  if (!region.gateway.endpoint.empty()) return region.gateway.endpoint;
  const std::string port = std::to_string(region.gateway.port);
  if (region.gateway.serviceType == "ClusterIP") {
    return fmt::format("{}.{}.svc.{}:{}", gatewayServiceName(job, region.name), job.ns,
                       settings.clusterDomain, port);
  }
  const json* ingress = nullptr;
  if (gatewayService.is_object()) {
    const json status = gatewayService.value("status", json::object());
    const json lb = status.is_object() ? status.value("loadBalancer", json::object()) : json();
    if (lb.is_object() && lb.contains("ingress") && lb["ingress"].is_array() &&
        !lb["ingress"].empty()) {
      ingress = &gatewayService["status"]["loadBalancer"]["ingress"][0];
    }
  }
  if (ingress == nullptr || !ingress->is_object()) return "";
  for (const char* key : {"ip", "hostname"}) {
    if (ingress->contains(key) && (*ingress)[key].is_string() &&
        !(*ingress)[key].get<std::string>().empty()) {
      const std::string host = (*ingress)[key].get<std::string>();
      // An IPv6 address needs brackets in an endpoint.
      const bool v6 = host.find(':') != std::string::npos;
      return (v6 ? "[" + host + "]" : host) + ":" + port;
    }
  }
  return "";
}

StatusOr<WorkerConfig> renderWorkerConfig(const JobRef& job, const api::TrainingJobSpec& spec,
                                          size_t index,
                                          const std::map<std::string, std::string>& endpoints,
                                          const RenderSettings& settings) {
  const std::vector<RegionPlan> plan = planRanks(spec);
  const api::Region& own = regionAt(spec, index);
  WorkerConfig c = spec.worker;
  // One job id per incarnation of the object: frames of a deleted and
  // re-created job with the same name are refused.
  c.job.id = fmt::format("{}/{}/{}", job.ns, job.name, job.uid);
  c.worker.worldSize = spec.totalReplicas();
  c.worker.region = own.name;
  c.worker.regionSize = own.replicas;
  c.worker.rank = plan[index].firstRank;  // each pod: --completion-index
  c.worker.localRank = 0;
  c.dataset.path = spec.dataPath(own);
  // A region with a data path of its own keeps its own samples: its workers
  // split them among themselves (shard localRank of regionSize), so that
  // the region's data is read whole. One shared path is one copy of the
  // job's data, split over every worker. An explicit job or region wins.
  if (c.dataset.sharding == "auto") c.dataset.sharding = own.dataPath.empty() ? "job" : "region";
  c.dataset.shardIndex.reset();
  c.dataset.shardCount.reset();
  // cuda in a region whose pods ask for a GPU, unless the spec says cpu.
  c.training.device = spec.deviceFor(own);
  c.transport.listen = fmt::format("tcp://*:{}", own.gateway.port);
  c.transport.peers.clear();
  c.transport.regions.clear();
  c.transport.links.clear();
  c.transport.uplink.clear();
  c.transport.keyDir = std::string(kKeyDir);
  c.transport.keyGroupReadable = true;
  for (size_t j = 0; j < plan.size(); ++j) {
    const api::Region& other = regionAt(spec, j);
    for (int64_t k = 0; k < plan[j].replicas; ++k) {
      c.transport.regions.push_back(other.name);
      if (j == index) {
        // <base>-<index>.<headless service>.<ns>.svc.<domain>
        c.transport.peers.push_back(fmt::format(
            "tcp://{}-{}.{}.{}.svc.{}:{}", workerJobName(job, own.name), k,
            headlessServiceName(job, own.name), job.ns, settings.clusterDomain, own.gateway.port));
      } else if (k == 0) {
        auto it = endpoints.find(other.name);
        if (it == endpoints.end() || it->second.empty()) {
          return failedPrecondition(fmt::format(
              "the gateway of region {} has no address yet (Service {}: waiting for its load "
              "balancer, or set spec.regions[{}].gateway.endpoint)",
              other.name, gatewayServiceName(job, other.name), j));
        }
        c.transport.peers.push_back("tcp://" + it->second);
      } else {
        c.transport.peers.push_back("none");  // another region's member: via its leader
      }
    }
  }
  c.metrics.enabled = true;
  c.metrics.listen = fmt::format("0.0.0.0:{}", settings.metricsPort);
  c.metrics.lingerSeconds = settings.metricsLingerSeconds;
  if (Status s = validateWorkerConfig(c); !s.ok()) {
    return s.withContext(fmt::format("worker.yaml of region {}", own.name));
  }
  return c;
}

StatusOr<json> renderConfigMap(const JobRef& job, const api::TrainingJobSpec& spec, size_t index,
                               const std::map<std::string, std::string>& endpoints,
                               const std::vector<RankKeys>& keys, const RenderSettings& settings) {
  if (static_cast<int64_t>(keys.size()) != spec.totalReplicas()) {
    return invalidArgument(
        fmt::format("{} keypairs for {} workers", keys.size(), spec.totalReplicas()));
  }
  auto config = renderWorkerConfig(job, spec, index, endpoints, settings);
  if (!config.ok()) return config.status();
  const api::Region& own = regionAt(spec, index);
  json data = {{"worker.yaml", toYaml(*config)}};
  for (size_t r = 0; r < keys.size(); ++r) {
    data[fmt::format("worker-{}.pub", r)] = keys[r].publicKey + "\n";
    if (!keys[r].nextPublicKey.empty()) {
      data[fmt::format("worker-{}.next.pub", r)] = keys[r].nextPublicKey + "\n";
    }
    if (!keys[r].previousPublicKey.empty()) {
      data[fmt::format("worker-{}.previous.pub", r)] = keys[r].previousPublicKey + "\n";
    }
  }
  return json{{"apiVersion", "v1"},
              {"kind", "ConfigMap"},
              {"metadata", metadata(job, configMapName(job, own.name), own.name, "config")},
              {"data", std::move(data)}};
}

json renderKeysSecret(const JobRef& job, const api::TrainingJobSpec& spec, size_t index,
                      const std::vector<RankKeys>& keys) {
  const RegionPlan p = planRanks(spec)[index];
  json data = json::object();
  for (int64_t r = p.firstRank; r < p.firstRank + p.replicas; ++r) {
    const RankKeys& k = keys.at(static_cast<size_t>(r));
    data[fmt::format("worker-{}.key", r)] = base64(k.secretKey + "\n");
    // Kept here between a rotation's phases; never mounted into a pod.
    if (!k.nextSecretKey.empty()) {
      data[fmt::format("worker-{}.next.key", r)] = base64(k.nextSecretKey + "\n");
    }
    if (!k.previousPublicKey.empty()) {
      data[fmt::format("worker-{}.previous.pub", r)] = base64(k.previousPublicKey + "\n");
    }
  }
  return {{"apiVersion", "v1"},
          {"kind", "Secret"},
          {"metadata", metadata(job, keysSecretName(job, p.name), p.name, "keys")},
          {"type", "Opaque"},
          {"data", std::move(data)}};
}

json renderCheckpointClaim(const JobRef& job, const api::TrainingJobSpec& spec, size_t index) {
  const api::Region& r = regionAt(spec, index);
  GEO_ENFORCE(spec.checkpointVolume.has_value(), "renderCheckpointClaim: no spec.checkpointVolume");
  const api::CheckpointVolume& v = *spec.checkpointVolume;
  json claimSpec = {{"accessModes", {v.accessModeFor(r.replicas)}},
                    {"resources", {{"requests", {{"storage", v.size}}}}}};
  if (!v.storageClassName.empty()) claimSpec["storageClassName"] = v.storageClassName;
  return {{"apiVersion", "v1"},
          {"kind", "PersistentVolumeClaim"},
          {"metadata", metadata(job, checkpointClaimName(job, r.name), r.name, "checkpoints")},
          {"spec", std::move(claimSpec)}};
}

json renderWorkerJob(const JobRef& job, const api::TrainingJobSpec& spec, size_t index,
                     const RenderSettings& settings) {
  const api::Region& r = regionAt(spec, index);
  const RegionPlan p = planRanks(spec)[index];
  const std::string image = spec.image.empty() ? settings.workerImage : spec.image;
  // spec.template with the region's fields over it; parseSpec() made sure
  // that none of it takes the place of the worker's own env, volumes,
  // mounts, labels or annotations, so it is added after them.
  const api::PodOverrides pod = spec.podFor(r);

  // keys/: every public key (ConfigMap) and this region's secret keys
  // (Secret, group-readable for the pod's fsGroup: transport.keyGroupReadable).
  json pubItems = json::array();
  // A key rotation's other public keys, where the ConfigMap has them
  // (optional: the kubelet projects those present, and swaps the volume's
  // files as they come and go).
  json rotationItems = json::array();
  for (int64_t k = 0; k < spec.totalReplicas(); ++k) {
    const std::string file = fmt::format("worker-{}.pub", k);
    pubItems.push_back({{"key", file}, {"path", file}, {"mode", 0444}});
    for (const char* which : {"next", "previous"}) {
      const std::string other = fmt::format("worker-{}.{}.pub", k, which);
      rotationItems.push_back({{"key", other}, {"path", other}, {"mode", 0444}});
    }
  }
  json keyItems = json::array();
  for (int64_t k = p.firstRank; k < p.firstRank + p.replicas; ++k) {
    const std::string file = fmt::format("worker-{}.key", k);
    keyItems.push_back({{"key", file}, {"path", file}, {"mode", 0440}});
  }
  json container = {
      {"name", "worker"},
      {"image", image},
      {"args",
       {"--config", std::string(kConfigDir) + "/worker.yaml", "--completion-index",
        "$(JOB_COMPLETION_INDEX)"}},
      {"ports",
       {{{"name", "transport"}, {"containerPort", r.gateway.port}, {"protocol", "TCP"}},
        {{"name", "metrics"}, {"containerPort", settings.metricsPort}, {"protocol", "TCP"}}}},
      {"resources", pod.resources},
      {"volumeMounts",
       {{{"name", "config"}, {"mountPath", std::string(kConfigDir)}, {"readOnly", true}},
        {{"name", "keys"}, {"mountPath", std::string(kKeyDir)}, {"readOnly", true}},
        {{"name", "tmp"}, {"mountPath", "/tmp"}}}},
      // Ready once /metrics answers: the worker has loaded its data, model
      // and keys and joined the job.
      {"readinessProbe",
       {{"httpGet", {{"path", "/metrics"}, {"port", "metrics"}}},
        {"periodSeconds", 10},
        {"failureThreshold", 3}}},
      {"securityContext",
       {{"allowPrivilegeEscalation", false},
        {"readOnlyRootFilesystem", true},
        {"runAsNonRoot", true},
        {"capabilities", {{"drop", {"ALL"}}}}}}};
  json podSpec = {
      {"subdomain", headlessServiceName(job, r.name)},
      {"restartPolicy", "Never"},
      {"enableServiceLinks", false},
      // Workers never call the Kubernetes API: no token in the pod.
      {"automountServiceAccountToken", false},
      {"securityContext",
       {{"runAsUser", settings.runAsUser},
        {"runAsGroup", settings.runAsUser},
        {"fsGroup", settings.runAsUser},
        {"seccompProfile", {{"type", "RuntimeDefault"}}}}},
      {"containers", json::array({container})},
      {"volumes",
       {{{"name", "config"},
         {"configMap",
          {{"name", configMapName(job, r.name)},
           {"items", {{{"key", "worker.yaml"}, {"path", "worker.yaml"}}}}}}},
        {{"name", "keys"},
         {"projected",
          {{"sources",
            {{{"configMap", {{"name", configMapName(job, r.name)}, {"items", pubItems}}}},
             {{"configMap",
               {{"name", configMapName(job, r.name)},
                {"items", rotationItems},
                {"optional", true}}}},
             {{"secret", {{"name", keysSecretName(job, r.name)}, {"items", keyItems}}}}}}}}},
        {{"name", "tmp"}, {"emptyDir", json::object()}}}}};
  if (!spec.worker.checkpoint.dir.empty()) {
    // The root file system is read-only: checkpoints need a volume. An
    // emptyDir ends with its pod, so a worker retried on a new pod starts
    // over; the region's claim keeps them across pods, each worker in its
    // own folder (the Job controller sets JOB_COMPLETION_INDEX in every
    // container), so the retried worker resumes where it left off.
    if (spec.checkpointVolume) {
      podSpec["volumes"].push_back(
          {{"name", "checkpoints"},
           {"persistentVolumeClaim", {{"claimName", checkpointClaimName(job, r.name)}}}});
      podSpec["containers"][0]["volumeMounts"].push_back(
          {{"name", "checkpoints"},
           {"mountPath", spec.worker.checkpoint.dir},
           {"subPathExpr", "index-$(JOB_COMPLETION_INDEX)"}});
    } else {
      podSpec["volumes"].push_back({{"name", "checkpoints"}, {"emptyDir", json::object()}});
      podSpec["containers"][0]["volumeMounts"].push_back(
          {{"name", "checkpoints"}, {"mountPath", spec.worker.checkpoint.dir}});
    }
  }
  if (spec.worker.transport.tcpInitialWindow > 0) {
    // The initial TCP windows toward the WAN peers (transport.tcpInitialWindow)
    // are host routes in the pod's network namespace, which takes
    // CAP_NET_ADMIN to write. The worker runs as a non-root user, and a
    // capability added to a non-root container never reaches its process's
    // effective set (Kubernetes sets no ambient capabilities): a container
    // of its own writes them first, as root with NET_ADMIN alone, reading
    // the same worker.yaml; the worker then finds them set. Its namespace
    // needs the Pod Security Standard that allows NET_ADMIN (privileged).
    podSpec["initContainers"] = json::array(
        {{{"name", "tcp-initial-window"},
          {"image", image},
          {"args",
           {"--config", std::string(kConfigDir) + "/worker.yaml", "--completion-index",
            "$(JOB_COMPLETION_INDEX)", "--tcp-initial-window-only"}},
          {"volumeMounts",
           {{{"name", "config"}, {"mountPath", std::string(kConfigDir)}, {"readOnly", true}}}},
          {"securityContext",
           {{"runAsUser", 0},
            {"runAsNonRoot", false},
            {"allowPrivilegeEscalation", false},
            {"readOnlyRootFilesystem", true},
            {"capabilities", {{"drop", {"ALL"}}, {"add", {"NET_ADMIN"}}}}}}}});
  }
  json& worker = podSpec["containers"][0];
  if (!pod.env.empty()) worker["env"] = pod.env;
  for (const json& m : pod.volumeMounts) worker["volumeMounts"].push_back(m);
  for (const json& v : pod.volumes) podSpec["volumes"].push_back(v);
  if (!pod.imagePullSecrets.empty()) podSpec["imagePullSecrets"] = pod.imagePullSecrets;
  if (!pod.serviceAccountName.empty()) podSpec["serviceAccountName"] = pod.serviceAccountName;
  if (!pod.priorityClassName.empty()) podSpec["priorityClassName"] = pod.priorityClassName;
  if (!pod.sysctls.empty()) podSpec["securityContext"]["sysctls"] = pod.sysctls;
  if (!pod.affinity.empty()) podSpec["affinity"] = pod.affinity;
  if (!pod.nodeSelector.empty()) podSpec["nodeSelector"] = pod.nodeSelector;
  if (!pod.tolerations.empty()) podSpec["tolerations"] = pod.tolerations;
  // The user's labels and annotations first, the controller's over them
  // (parseSpec() refuses the controller's keys, so none is lost).
  json podLabels = propagatedLabels(job);
  podLabels.update(json(pod.labels));
  podLabels.update(labels(job, r.name, "worker"));
  json podAnnotations = propagatedAnnotations(job);
  podAnnotations.update(json(pod.annotations));
  podAnnotations.update({{"prometheus.io/scrape", "true"},
                         {"prometheus.io/port", std::to_string(settings.metricsPort)}});

  // Failures are counted per worker (completion index): a worker that
  // crashes is retried on a new pod of the same index, which mounts the same
  // checkpoint folder and rejoins the job from its newest checkpoint, and
  // only a worker out of retries fails the region. The region-wide limit,
  // unless the spec sets one, is what the per-worker limits add up to plus
  // one per worker, so the per-worker limit always decides first. It is
  // written out, not left to Kubernetes' default (2^31-1 next to
  // backoffLimitPerIndex), so that failures stay bounded where an API server
  // drops backoffLimitPerIndex (before 1.29, or with the
  // JobBackoffLimitPerIndex gate off): there the workers share that many.
  const int64_t perWorker = spec.runPolicy.backoffLimitPerIndex;
  const int64_t regionLimit = spec.runPolicy.backoffLimit.value_or(
      std::min<int64_t>(INT32_MAX, r.replicas * (perWorker + 1)));
  json jobSpec = {
      {"completionMode", "Indexed"},
      {"completions", r.replicas},
      {"parallelism", r.replicas},
      {"backoffLimitPerIndex", perWorker},
      // A worker out of retries fails the region's Job at once: left to
      // Kubernetes' default, the Job would run on without that worker until
      // the others finished (allreduce waits for it forever; DTS and swarm
      // train without its data shard) and fail only then.
      {"maxFailedIndexes", 0},
      {"backoffLimit", regionLimit},
      {"suspend", spec.runPolicy.suspend},
      // Rules apply in order, the first match decides; restartPolicy must be
      // Never for them (and so a failed pod is replaced only once it has
      // stopped: podReplacementPolicy is Failed with a podFailurePolicy, so
      // two pods of one worker never share its name or checkpoint folder).
      //  1. A pod the cluster took away (eviction, preemption, node drain:
      //     condition DisruptionTarget) is replaced without counting against
      //     any limit, whatever its exit code: it is never the spec's fault.
      //  2. A worker that lost what it depends on through no fault of its
      //     own (exit 75: a region member whose leader died) is replaced
      //     without counting against any limit: started again it rejoins.
      //     It fails each time its leader does, and over a long job its
      //     leader's failures would use up its own retries (a 30-minute
      //     churn soak stopped that way); a leader out of retries fails
      //     the region's Job (maxFailedIndexes 0), which ends its members.
      //  3. A usage or configuration error (the worker exits 2 for exactly
      //     that) fails the region's Job at once: retrying the same
      //     worker.yaml cannot help. FailJob, not FailIndex (which
      //     maxFailedIndexes 0 would turn into the same outcome), for the
      //     Job's message naming the container, exit code and index.
      // Anything else (exit 1, a signal, an OOM kill) counts against the
      // worker's backoffLimitPerIndex and is retried.
      {"podFailurePolicy",
       {{"rules",
         {{{"action", "Ignore"},
           {"onPodConditions", {{{"type", "DisruptionTarget"}, {"status", "True"}}}}},
          {{"action", "Ignore"},
           {"onExitCodes",
            {{"containerName", "worker"}, {"operator", "In"}, {"values", {kWorkerExitRejoin}}}}},
          {{"action", "FailJob"},
           {"onExitCodes",
            {{"containerName", "worker"}, {"operator", "In"}, {"values", {kWorkerExitUsage}}}}}}}}},
      {"template",
       {{"metadata", {{"labels", podLabels}, {"annotations", podAnnotations}}},
        {"spec", podSpec}}}};
  if (spec.runPolicy.activeDeadlineSeconds) {
    jobSpec["activeDeadlineSeconds"] = *spec.runPolicy.activeDeadlineSeconds;
  }
  if (spec.runPolicy.ttlSecondsAfterFinished) {
    jobSpec["ttlSecondsAfterFinished"] = *spec.runPolicy.ttlSecondsAfterFinished;
  }
  json meta = metadata(job, workerJobName(job, r.name), r.name, "worker");
  json jobLabels = propagatedLabels(job);
  jobLabels.update(meta["labels"]);
  meta["labels"] = std::move(jobLabels);
  if (const auto annotations = propagatedAnnotations(job); !annotations.empty()) {
    meta["annotations"] = annotations;
  }
  return {{"apiVersion", "batch/v1"},
          {"kind", "Job"},
          {"metadata", std::move(meta)},
          {"spec", std::move(jobSpec)}};
}

}  // namespace geo::reconcile
