#include "controller/reconcile/render.h"

#include <gtest/gtest.h>
#include <sodium.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace geo::reconcile {
namespace {

using nlohmann::json;

const JobRef kJob{"world", "ml", "0b5c3d7e-1111-2222-3333-444455556666", {}, {}};

api::TrainingJobSpec spec2x2() {
  const json object = {
      {"spec",
       {{"sync", {{"algorithm", "dts"}, {"period", 4}}},
        {"regions",
         {{{"name", "london"},
           {"replicas", 2},
           {"resources", {{"limits", {{"nvidia.com/gpu", 1}}}}},
           {"nodeSelector", {{"gpu", "h100"}}},
           {"tolerations", {{{"key", "gpu"}, {"operator", "Exists"}}}}},
          {{"name", "tokyo"},
           {"replicas", 2},
           {"dataPath", "/data/tokyo"},
           {"gateway", {{"serviceType", "NodePort"}, {"endpoint", "tk.example.org:31000"}}}}}},
        {"runPolicy", {{"backoffLimit", 1}, {"activeDeadlineSeconds", 3600}}}}}};
  const api::ParsedSpec p = api::parseSpec(object);
  EXPECT_TRUE(p.errors.empty()) << api::joinErrors(p.errors);
  return p.spec;
}

std::vector<RankKeys> keysFor(int64_t n) {
  std::vector<RankKeys> keys;
  for (int64_t r = 0; r < n; ++r) {
    keys.push_back({std::string(40, static_cast<char>('A' + r)),
                    std::string(40, static_cast<char>('a' + r)), "", "", ""});
  }
  return keys;
}

const std::map<std::string, std::string> kEndpoints = {{"london", "203.0.113.7:7000"},
                                                       {"tokyo", "tk.example.org:31000"}};

std::string decode64(const std::string& text) {
  std::string out(text.size(), '\0');
  size_t len = 0;
  EXPECT_EQ(sodium_base642bin(reinterpret_cast<unsigned char*>(out.data()), out.size(), text.data(),
                              text.size(), nullptr, &len, nullptr, sodium_base64_VARIANT_ORIGINAL),
            0);
  out.resize(len);
  return out;
}

TEST(Render, RanksGoRegionByRegion) {
  const auto plan = planRanks(spec2x2());
  ASSERT_EQ(plan.size(), 2u);
  EXPECT_EQ(plan[0].firstRank, 0);
  EXPECT_EQ(plan[1].firstRank, 2);
  EXPECT_EQ(plan[1].replicas, 2);
}

TEST(Render, NamesAndTheirLimit) {
  EXPECT_EQ(workerJobName(kJob, "tokyo"), "world-tokyo");
  EXPECT_EQ(gatewayServiceName(kJob, "tokyo"), "world-tokyo-gateway");
  EXPECT_EQ(keysSecretName(kJob, "tokyo"), "world-tokyo-keys");
  EXPECT_EQ(configMapName(kJob, "tokyo"), "world-tokyo-config");
  EXPECT_TRUE(checkNames(kJob, spec2x2()).ok());
  const JobRef longName{std::string(50, 'j'), "ml", "uid", {}, {}};
  const Status s = checkNames(longName, spec2x2());
  EXPECT_NE(
      s.message().find("metadata.name: " + std::string(50, 'j') + " is too long for region london"),
      std::string::npos)
      << s.message();
}

TEST(Render, Services) {
  const api::TrainingJobSpec spec = spec2x2();
  const json headless = renderHeadlessService(kJob, spec, 0, {});
  EXPECT_EQ(headless["metadata"]["name"], "world-london");
  EXPECT_EQ(headless["metadata"]["namespace"], "ml");
  EXPECT_EQ(headless["spec"]["clusterIP"], "None");
  EXPECT_EQ(headless["spec"]["selector"]["geotrain.io/region"], "london");
  EXPECT_EQ(headless["metadata"]["labels"]["app.kubernetes.io/managed-by"], "geotrain-controller");

  const json lb = renderGatewayService(kJob, spec, 0);
  EXPECT_EQ(lb["spec"]["type"], "LoadBalancer");
  EXPECT_EQ(lb["spec"]["selector"]["batch.kubernetes.io/job-completion-index"], "0");
  EXPECT_EQ(lb["spec"]["ports"][0]["port"], 7000);
  EXPECT_FALSE(lb["spec"]["ports"][0].contains("nodePort"));
  const json np = renderGatewayService(kJob, spec, 1);
  EXPECT_EQ(np["spec"]["type"], "NodePort");
  EXPECT_EQ(np["spec"]["ports"][0]["nodePort"], 31000);
}

TEST(Render, GatewayEndpointFromOverrideStatusOrDns) {
  const api::TrainingJobSpec spec = spec2x2();
  const RenderSettings settings;
  EXPECT_EQ(gatewayEndpoint(kJob, spec.regions[1], json(), settings), "tk.example.org:31000");
  const api::Region& london = spec.regions[0];
  EXPECT_EQ(gatewayEndpoint(kJob, london, json(), settings), "");  // no load balancer yet
  json svc = {{"status", {{"loadBalancer", json::object()}}}};
  EXPECT_EQ(gatewayEndpoint(kJob, london, svc, settings), "");
  svc["status"]["loadBalancer"]["ingress"] = {{{"ip", "203.0.113.7"}}};
  EXPECT_EQ(gatewayEndpoint(kJob, london, svc, settings), "203.0.113.7:7000");
  svc["status"]["loadBalancer"]["ingress"] = {{{"hostname", "lb.example.com"}}};
  EXPECT_EQ(gatewayEndpoint(kJob, london, svc, settings), "lb.example.com:7000");
  svc["status"]["loadBalancer"]["ingress"] = {{{"ip", "2001:db8::7"}}};
  EXPECT_EQ(gatewayEndpoint(kJob, london, svc, settings), "[2001:db8::7]:7000");
  api::Region internal = london;
  internal.gateway.serviceType = "ClusterIP";
  EXPECT_EQ(gatewayEndpoint(kJob, internal, json(), settings),
            "world-london-gateway.ml.svc.cluster.local:7000");
}

TEST(Render, WorkerConfigOfARegion) {
  const api::TrainingJobSpec spec = spec2x2();
  auto c = renderWorkerConfig(kJob, spec, 1, kEndpoints, {});
  ASSERT_TRUE(c.ok()) << c.status().toString();
  EXPECT_EQ(c->job.id, "ml/world/0b5c3d7e-1111-2222-3333-444455556666");
  EXPECT_EQ(c->worker.worldSize, 4);
  EXPECT_EQ(c->worker.region, "tokyo");
  EXPECT_EQ(c->worker.rank, 2);
  EXPECT_EQ(c->dataset.path, "/data/tokyo");
  EXPECT_EQ(c->sync.period, 4);
  EXPECT_EQ(c->transport.listen, "tcp://*:7000");
  EXPECT_EQ(c->transport.peers, (std::vector<std::string>{
                                    "tcp://203.0.113.7:7000", "none",
                                    "tcp://world-tokyo-0.world-tokyo.ml.svc.cluster.local:7000",
                                    "tcp://world-tokyo-1.world-tokyo.ml.svc.cluster.local:7000"}));
  EXPECT_EQ(c->transport.regions, (std::vector<std::string>{"london", "london", "tokyo", "tokyo"}));
  EXPECT_EQ(c->transport.keyDir, "/etc/geotrain/keys");
  EXPECT_TRUE(c->transport.keyGroupReadable);
  EXPECT_EQ(c->metrics.listen, "0.0.0.0:9400");

  // The pod with completion index 1 is rank 3, and its config is valid.
  WorkerConfig pod = *parseWorkerConfig(toYaml(*c), "worker.yaml");
  ASSERT_TRUE(placeByCompletionIndex(pod, 1).ok());
  EXPECT_EQ(pod.worker.rank, 3);
  EXPECT_TRUE(validateWorkerConfig(pod).ok()) << validateWorkerConfig(pod).message();
  // tokyo keeps its own data (its dataPath): its two workers split it, the
  // second reads shard 1 of 2 of tokyo's copy, not shard 3 of 4.
  EXPECT_EQ(pod.dataset.sharding, "region");
  EXPECT_EQ(effectiveShardIndex(pod), 1);
  EXPECT_EQ(effectiveShardCount(pod), 2);
  // london reads the job's shared path: a split over the whole job.
  auto london = renderWorkerConfig(kJob, spec, 0, kEndpoints, {});
  ASSERT_TRUE(london.ok());
  EXPECT_EQ(london->dataset.sharding, "job");
  // An explicit choice wins over the derived one.
  api::TrainingJobSpec shared = spec;
  shared.worker.dataset.sharding = "job";
  auto tokyoShared = renderWorkerConfig(kJob, shared, 1, kEndpoints, {});
  ASSERT_TRUE(tokyoShared.ok());
  EXPECT_EQ(tokyoShared->dataset.sharding, "job");

  // Without the other region's gateway address there is no config yet.
  auto waiting = renderWorkerConfig(kJob, spec, 1, {{"tokyo", "tk.example.org:31000"}}, {});
  ASSERT_FALSE(waiting.ok());
  EXPECT_EQ(waiting.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(waiting.status().message().find("the gateway of region london has no address yet "
                                            "(Service world-london-gateway"),
            std::string::npos)
      << waiting.status().message();
}

// london's pods ask for nvidia.com/gpu, tokyo's for nothing: with the
// default training.device (auto) london's worker.yaml says cuda, so that a
// GPU pod without usable CUDA fails at start instead of training on its CPU.
TEST(Render, TrainingDeviceFollowsTheRegionsGpus) {
  api::TrainingJobSpec spec = spec2x2();
  ASSERT_EQ(spec.worker.training.device, "auto");
  auto london = renderConfigMap(kJob, spec, 0, kEndpoints, keysFor(4), {});
  auto tokyo = renderConfigMap(kJob, spec, 1, kEndpoints, keysFor(4), {});
  ASSERT_TRUE(london.ok() && tokyo.ok());
  auto deviceOf = [](const json& cm) {
    return parseWorkerConfig(cm["data"]["worker.yaml"].get<std::string>(), "worker.yaml")
        ->training.device;
  };
  EXPECT_EQ(deviceOf(*london), "cuda");
  EXPECT_EQ(deviceOf(*tokyo), "auto");
  // The user's cpu is kept on the GPU region too.
  spec.worker.training.device = "cpu";
  EXPECT_EQ(renderWorkerConfig(kJob, spec, 0, kEndpoints, {})->training.device, "cpu");
  EXPECT_EQ(renderWorkerConfig(kJob, spec, 1, kEndpoints, {})->training.device, "cpu");
}

TEST(Render, ConfigMapAndSecretHoldTheRightKeys) {
  const api::TrainingJobSpec spec = spec2x2();
  const auto keys = keysFor(4);
  auto cm = renderConfigMap(kJob, spec, 1, kEndpoints, keys, {});
  ASSERT_TRUE(cm.ok()) << cm.status().toString();
  EXPECT_EQ((*cm)["metadata"]["name"], "world-tokyo-config");
  const json& data = (*cm)["data"];
  EXPECT_EQ(data.size(), 5u);  // worker.yaml and four public keys
  EXPECT_EQ(data["worker-0.pub"], keys[0].publicKey + "\n");
  const std::string yaml = data["worker.yaml"];
  EXPECT_EQ(parseWorkerConfig(yaml, "worker.yaml", ConfigCheck::kFull)->worker.region, "tokyo");
  for (const auto& k : keys) {
    EXPECT_EQ(yaml.find(k.secretKey), std::string::npos) << "a secret key in the ConfigMap";
  }

  const json secret = renderKeysSecret(kJob, spec, 1, keys);
  EXPECT_EQ(secret["type"], "Opaque");
  ASSERT_EQ(secret["data"].size(), 2u);  // tokyo's ranks 2 and 3 only
  EXPECT_EQ(decode64(secret["data"]["worker-2.key"]), keys[2].secretKey + "\n");
  EXPECT_EQ(decode64(secret["data"]["worker-3.key"]), keys[3].secretKey + "\n");
  EXPECT_FALSE(secret["data"].contains("worker-0.key"));

  EXPECT_FALSE(renderConfigMap(kJob, spec, 1, kEndpoints, keysFor(3), {}).ok());
}

TEST(Render, IndexedJob) {
  const api::TrainingJobSpec spec = spec2x2();
  RenderSettings settings;
  settings.workerImage = "registry.example/worker:1";
  const json job = renderWorkerJob(kJob, spec, 0, settings);
  EXPECT_EQ(job["apiVersion"], "batch/v1");
  EXPECT_EQ(job["metadata"]["name"], "world-london");
  const json& s = job["spec"];
  EXPECT_EQ(s["completionMode"], "Indexed");
  EXPECT_EQ(s["completions"], 2);
  EXPECT_EQ(s["parallelism"], 2);
  EXPECT_EQ(s["backoffLimit"], 1);
  EXPECT_EQ(s["activeDeadlineSeconds"], 3600);
  EXPECT_FALSE(s.contains("ttlSecondsAfterFinished"));
  EXPECT_EQ(s["suspend"], false);
  const json& pod = s["template"]["spec"];
  EXPECT_EQ(pod["subdomain"], "world-london");
  EXPECT_EQ(pod["restartPolicy"], "Never");
  EXPECT_EQ(pod["nodeSelector"]["gpu"], "h100");
  EXPECT_EQ(pod["tolerations"][0]["key"], "gpu");
  EXPECT_EQ(pod["securityContext"]["fsGroup"], 65532);
  const json& c = pod["containers"][0];
  EXPECT_EQ(c["image"], "registry.example/worker:1");
  EXPECT_EQ(c["args"], json({"--config", "/etc/geotrain/config/worker.yaml", "--completion-index",
                             "$(JOB_COMPLETION_INDEX)"}));
  EXPECT_EQ(c["resources"]["limits"]["nvidia.com/gpu"], 1);
  EXPECT_EQ(c["securityContext"]["readOnlyRootFilesystem"], true);
  // keys/: all four public keys, and only london's two secret keys, 0440.
  const json& sources = pod["volumes"][1]["projected"]["sources"];
  EXPECT_EQ(sources[0]["configMap"]["items"].size(), 4u);
  // A key rotation's public keys, where the ConfigMap has them.
  EXPECT_EQ(sources[1]["configMap"]["items"].size(), 8u);
  EXPECT_EQ(sources[1]["configMap"]["items"][1]["path"], "worker-0.previous.pub");
  EXPECT_EQ(sources[1]["configMap"]["optional"], true);
  ASSERT_EQ(sources[2]["secret"]["items"].size(), 2u);
  EXPECT_EQ(sources[2]["secret"]["items"][1]["path"], "worker-1.key");
  EXPECT_EQ(sources[2]["secret"]["items"][1]["mode"], 0440);
  // The pods' labels match the Services' selectors.
  const json& podLabels = s["template"]["metadata"]["labels"];
  for (const auto& [k, v] :
       renderHeadlessService(kJob, spec, 0, settings)["spec"]["selector"].items()) {
    EXPECT_EQ(podLabels[k], v) << k;
  }
  // spec.image wins over the controller's default.
  api::TrainingJobSpec own = spec;
  own.image = "mine:2";
  EXPECT_EQ(
      renderWorkerJob(kJob, own, 0, settings)["spec"]["template"]["spec"]["containers"][0]["image"],
      "mine:2");
}

// A worker that fails is retried on its own (per completion index) and
// rejoins from its checkpoint; a configuration error fails at once; an
// eviction costs nothing.
TEST(Render, FailedWorkersAreRetriedOneByOneAndABadSpecFailsAtOnce) {
  api::TrainingJobSpec spec = spec2x2();
  spec.runPolicy.backoffLimit.reset();
  json s = renderWorkerJob(kJob, spec, 0, {})["spec"];
  EXPECT_EQ(s["backoffLimitPerIndex"], 6);
  EXPECT_EQ(s["maxFailedIndexes"], 0);  // a worker out of retries fails the region
  // No region-wide limit of its own: 2 workers * (6 + 1), which the
  // per-worker limit always reaches first.
  EXPECT_EQ(s["backoffLimit"], 14);
  EXPECT_EQ(s["template"]["spec"]["restartPolicy"], "Never");  // required by podFailurePolicy
  const json rules = s["podFailurePolicy"]["rules"];
  ASSERT_EQ(rules.size(), 3u);
  // First match wins: a disrupted pod is never counted, whatever its exit code.
  EXPECT_EQ(rules[0]["action"], "Ignore");
  EXPECT_EQ(rules[0]["onPodConditions"],
            json::parse(R"([{"type": "DisruptionTarget", "status": "True"}])"));
  // A member whose leader died (75) is replaced without counting a retry.
  EXPECT_EQ(rules[1]["action"], "Ignore");
  EXPECT_EQ(rules[1]["onExitCodes"],
            json::parse(R"({"containerName": "worker", "operator": "In", "values": [75]})"));
  EXPECT_EQ(rules[2]["action"], "FailJob");
  EXPECT_EQ(rules[2]["onExitCodes"],
            json::parse(R"({"containerName": "worker", "operator": "In", "values": [2]})"));
  for (size_t i : {1, 2}) {
    EXPECT_EQ(rules[i]["onExitCodes"]["containerName"],
              s["template"]["spec"]["containers"][0]["name"]);
  }

  // The spec's own limits.
  spec.runPolicy.backoffLimitPerIndex = 0;
  spec.runPolicy.backoffLimit = 5;
  s = renderWorkerJob(kJob, spec, 1, {})["spec"];
  EXPECT_EQ(s["backoffLimitPerIndex"], 0);
  EXPECT_EQ(s["backoffLimit"], 5);
  // The derived limit stays an int32.
  spec.runPolicy.backoffLimit.reset();
  spec.runPolicy.backoffLimitPerIndex = INT32_MAX;
  EXPECT_EQ(renderWorkerJob(kJob, spec, 1, {})["spec"]["backoffLimit"], INT32_MAX);
}

TEST(Render, CheckpointsGetAWritableVolume) {
  api::TrainingJobSpec spec = spec2x2();
  spec.worker.checkpoint.dir = "/ckpt";
  const json job = renderWorkerJob(kJob, spec, 0, {});
  const json& pod = job["spec"]["template"]["spec"];
  EXPECT_EQ(pod["volumes"].back()["name"], "checkpoints");
  EXPECT_EQ(pod["containers"][0]["volumeMounts"].back()["mountPath"], "/ckpt");
}

TEST(Render, CheckpointVolumeIsAClaimPerRegionAndAFolderPerWorker) {
  api::TrainingJobSpec spec = spec2x2();
  spec.worker.checkpoint.dir = "/ckpt";
  spec.regions[1].replicas = 1;
  spec.checkpointVolume = api::CheckpointVolume{"20Gi", "fast-ssd", ""};
  const json london = renderCheckpointClaim(kJob, spec, 0);
  EXPECT_EQ(london["kind"], "PersistentVolumeClaim");
  EXPECT_EQ(london["metadata"]["name"], "world-london-checkpoints");
  EXPECT_EQ(london["metadata"]["labels"]["geotrain.io/region"], "london");
  EXPECT_EQ(london["spec"], json({{"accessModes", {"ReadWriteMany"}},  // two pods, maybe two nodes
                                  {"resources", {{"requests", {{"storage", "20Gi"}}}}},
                                  {"storageClassName", "fast-ssd"}}));
  EXPECT_EQ(renderCheckpointClaim(kJob, spec, 1)["spec"]["accessModes"], json({"ReadWriteOnce"}));
  spec.checkpointVolume->storageClassName = "";
  EXPECT_FALSE(renderCheckpointClaim(kJob, spec, 1)["spec"].contains("storageClassName"));

  const json pod = renderWorkerJob(kJob, spec, 0, {})["spec"]["template"]["spec"];
  EXPECT_EQ(pod["volumes"].back(),
            json({{"name", "checkpoints"},
                  {"persistentVolumeClaim", {{"claimName", "world-london-checkpoints"}}}}));
  EXPECT_EQ(pod["containers"][0]["volumeMounts"].back(),
            json({{"name", "checkpoints"},
                  {"mountPath", "/ckpt"},
                  {"subPathExpr", "index-$(JOB_COMPLETION_INDEX)"}}));
}

// spec.transport.tcpInitialWindow: a root init container with NET_ADMIN
// alone writes the routes (the worker, non-root, could not), reading the
// same worker.yaml; the worker's own container keeps every capability
// dropped. Without the key there is no init container.
TEST(Render, TheInitialWindowIsSetByAPrivilegedInitContainer) {
  api::TrainingJobSpec spec = spec2x2();
  json pod = renderWorkerJob(kJob, spec, 0, {})["spec"]["template"]["spec"];
  EXPECT_FALSE(pod.contains("initContainers"));

  const json object = {{"spec",
                        {{"transport", {{"tcpInitialWindow", 100}}},
                         {"regions", {{{"name", "london"}}, {{"name", "tokyo"}}}}}}};
  const api::ParsedSpec p = api::parseSpec(object);
  ASSERT_TRUE(p.errors.empty()) << api::joinErrors(p.errors);
  EXPECT_EQ(p.spec.worker.transport.tcpInitialWindow, 100);
  EXPECT_EQ(renderWorkerConfig(kJob, p.spec, 0, kEndpoints, {})->transport.tcpInitialWindow, 100);
  pod = renderWorkerJob(kJob, p.spec, 0, {})["spec"]["template"]["spec"];
  ASSERT_EQ(pod["initContainers"].size(), 1u);
  const json& init = pod["initContainers"][0];
  EXPECT_EQ(init["name"], "tcp-initial-window");
  EXPECT_EQ(init["image"], pod["containers"][0]["image"]);
  EXPECT_EQ(init["args"],
            json({"--config", "/etc/geotrain/config/worker.yaml", "--completion-index",
                  "$(JOB_COMPLETION_INDEX)", "--tcp-initial-window-only"}));
  EXPECT_EQ(init["securityContext"]["runAsUser"], 0);
  EXPECT_EQ(init["securityContext"]["capabilities"],
            json({{"drop", {"ALL"}}, {"add", {"NET_ADMIN"}}}));
  EXPECT_EQ(
      init["volumeMounts"],
      json({{{"name", "config"}, {"mountPath", "/etc/geotrain/config"}, {"readOnly", true}}}));
  EXPECT_EQ(pod["containers"][0]["securityContext"]["capabilities"], json({{"drop", {"ALL"}}}));
}

TEST(Render, SameInputsSameObjects) {
  const api::TrainingJobSpec spec = spec2x2();
  const auto keys = keysFor(4);
  EXPECT_EQ(renderWorkerJob(kJob, spec, 1, {}), renderWorkerJob(kJob, spec, 1, {}));
  EXPECT_EQ(*renderConfigMap(kJob, spec, 0, kEndpoints, keys, {}),
            *renderConfigMap(kJob, spec, 0, kEndpoints, keys, {}));
}

// manifests/rbac/member.yaml lets the controller create, patch and delete
// every kind it renders (server-side apply is a PATCH).
TEST(Render, MemberRoleCoversEveryRenderedKind) {
  std::map<std::string, std::set<std::string>> allowed;  // "group/resource" -> verbs
  for (const YAML::Node& doc : YAML::LoadAllFromFile(GEO_MEMBER_RBAC)) {
    if (!doc["kind"] || doc["kind"].as<std::string>() != "ClusterRole") continue;
    for (const YAML::Node& rule : doc["rules"]) {
      for (const YAML::Node& group : rule["apiGroups"]) {
        for (const YAML::Node& resource : rule["resources"]) {
          for (const YAML::Node& verb : rule["verbs"]) {
            allowed[group.as<std::string>() + "/" + resource.as<std::string>()].insert(
                verb.as<std::string>());
          }
        }
      }
    }
  }
  ASSERT_FALSE(allowed.empty()) << GEO_MEMBER_RBAC;
  const api::TrainingJobSpec spec = spec2x2();
  api::TrainingJobSpec withVolume = spec;
  withVolume.worker.checkpoint.dir = "/ckpt";
  withVolume.checkpointVolume = api::CheckpointVolume{"1Gi", "", ""};
  const std::vector<json> objects = {renderHeadlessService(kJob, spec, 0, {}),
                                     renderGatewayService(kJob, spec, 0),
                                     *renderConfigMap(kJob, spec, 0, kEndpoints, keysFor(4), {}),
                                     renderKeysSecret(kJob, spec, 0, keysFor(4)),
                                     renderWorkerJob(kJob, spec, 0, {}),
                                     renderCheckpointClaim(kJob, withVolume, 0)};
  for (const json& o : objects) {
    const std::string apiVersion = o["apiVersion"];
    const std::string group =
        apiVersion.find('/') == std::string::npos ? "" : apiVersion.substr(0, apiVersion.find('/'));
    std::string resource = o["kind"].get<std::string>();
    std::transform(resource.begin(), resource.end(), resource.begin(), ::tolower);
    resource += "s";
    for (const char* verb : {"get", "create", "patch", "delete"}) {
      EXPECT_TRUE(allowed[group + "/" + resource].count(verb))
          << group << "/" << resource << " lacks " << verb;
    }
  }
  // Progress: rank 0's pod found by a list, its /metrics read through the proxy.
  EXPECT_TRUE(allowed["/pods"].count("list"));
  EXPECT_TRUE(allowed["/pods/proxy"].count("get"));
}

// The TrainingJob's labels and annotations reach the region's Job and its
// pods (Kueue reads kueue.x-k8s.io/queue-name on the Job), under the pod
// template's and the controller's; kubectl's and the controller's own keys
// stay behind.
TEST(Render, TheTrainingJobsLabelsAndAnnotationsReachTheJobAndItsPods) {
  const JobRef job = jobRefOf({{"metadata",
                                {{"name", "world"},
                                 {"namespace", "ml"},
                                 {"uid", "u1"},
                                 {"labels",
                                  {{"kueue.x-k8s.io/queue-name", "gpu"},
                                   {"team", "job"},
                                   {"geotrain.io/region", "nowhere"},
                                   {"app.kubernetes.io/name", "other"}}},
                                 {"annotations",
                                  {{"kubectl.kubernetes.io/last-applied-configuration", "{}"},
                                   {"kueue.x-k8s.io/pod-group", "g"},
                                   {"prometheus.io/port", "1"}}}}}});
  EXPECT_EQ(job.name, "world");
  EXPECT_EQ(job.uid, "u1");
  api::TrainingJobSpec spec = spec2x2();
  spec.podTemplate.labels = {{"team", "template"}};
  const json rendered = renderWorkerJob(job, spec, 1, RenderSettings{});
  const json& meta = rendered["metadata"];
  EXPECT_EQ(meta["labels"]["kueue.x-k8s.io/queue-name"], "gpu");
  EXPECT_EQ(meta["labels"]["team"], "job");
  EXPECT_EQ(meta["labels"]["geotrain.io/region"], "tokyo");
  EXPECT_EQ(meta["labels"]["app.kubernetes.io/name"], "geotrain");
  EXPECT_EQ(meta["annotations"], json({{"kueue.x-k8s.io/pod-group", "g"}}));
  const json& pod = rendered["spec"]["template"]["metadata"];
  EXPECT_EQ(pod["labels"]["kueue.x-k8s.io/queue-name"], "gpu");
  EXPECT_EQ(pod["labels"]["team"], "template");
  EXPECT_EQ(pod["labels"]["geotrain.io/region"], "tokyo");
  EXPECT_EQ(pod["annotations"]["kueue.x-k8s.io/pod-group"], "g");
  EXPECT_EQ(pod["annotations"]["prometheus.io/port"], "9400");
  EXPECT_FALSE(pod["annotations"].contains("kubectl.kubernetes.io/last-applied-configuration"));
  // The Services' selectors are the controller's labels alone.
  EXPECT_FALSE(renderHeadlessService(job, spec, 1, RenderSettings{})["spec"]["selector"].contains(
      "kueue.x-k8s.io/queue-name"));
}

// spec.suspend is written at creation and when spec.runPolicy.suspend
// changes; otherwise whoever suspended or resumed the Job last keeps it.
TEST(Render, JobSuspendIsWrittenOnlyWhenTheTrainingJobsSuspendChanges) {
  const api::TrainingJobSpec spec = spec2x2();
  auto applied = [&](bool runPolicySuspend, const json& live) {
    json desired = renderWorkerJob(kJob, spec, 0, RenderSettings{});
    setJobSuspend(desired, runPolicySuspend, live);
    return desired;
  };
  json created = applied(false, nullptr);
  EXPECT_EQ(created["spec"]["suspend"], false);
  EXPECT_EQ(created["metadata"]["annotations"]["geotrain.io/suspend"], "false");
  // Kueue suspends it: the controller keeps that.
  json live = created;
  live["spec"]["suspend"] = true;
  EXPECT_EQ(applied(false, live)["spec"]["suspend"], true);
  // The user suspends the TrainingJob: written; resumes it: written.
  json suspended = applied(true, live);
  EXPECT_EQ(suspended["spec"]["suspend"], true);
  EXPECT_EQ(suspended["metadata"]["annotations"]["geotrain.io/suspend"], "true");
  live = suspended;
  EXPECT_EQ(applied(false, live)["spec"]["suspend"], false);
  // Kueue admits a Job whose TrainingJob is not suspended: it stays admitted.
  live = applied(false, live);
  live["spec"]["suspend"] = false;
  EXPECT_EQ(applied(false, live)["spec"]["suspend"], false);
  // A Job written by a controller without the annotation gets the
  // TrainingJob's value once.
  live["metadata"]["annotations"].erase("geotrain.io/suspend");
  live["spec"]["suspend"] = true;
  EXPECT_EQ(applied(false, live)["spec"]["suspend"], false);
}

}  // namespace
}  // namespace geo::reconcile
