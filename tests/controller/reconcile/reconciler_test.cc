// The Reconciler against two test apiservers (tests/support; HTTPS with a
// token, through the controller's own libcurl client): a hub that holds the
// TrainingJob and is also region cluster "local", and a member cluster
// "tokyo". The test apiserver runs no controllers, so the test plays the
// Job controller and the cloud's load balancer by writing status itself.

#include "controller/reconcile/reconciler.h"
#include "controller/reconcile/clusters.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

#include "common/keys/keys.h"
#include "controller/kube/config.h"
#include "controller/kube/events.h"
#include "controller/reconcile/progress.h"
#include "tests/support/test_apiserver.h"
#include "tests/support/yaml_json.h"
#include "worker/metrics/worker_metrics.h"

namespace geo::reconcile {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;
namespace res = kube::resources;

// A cluster list for the test: "local" is the hub, "tokyo" the member.
class TestClusters : public Clusters {
 public:
  std::map<std::string, kube::KubeClient*> clients;
  StatusOr<kube::KubeClient*> client(const std::string& cluster) override {
    auto it = clients.find(cluster);
    if (it == clients.end() || it->second == nullptr) {
      return unavailable("cluster " + cluster + " is not reachable");
    }
    return it->second;
  }
  // Every name in `clients`, "local" first: a null client is a member that
  // cannot be reached, not an unknown one.
  std::optional<std::vector<std::string>> known() const override {
    std::vector<std::string> names = {"local"};
    for (const auto& [name, c] : clients) {
      if (name != "local") names.push_back(name);
    }
    return names;
  }
};

// What a real API server does and the test apiserver does not: refuse a
// change to a Job's immutable fields (its pod template, podFailurePolicy,
// backoffLimitPerIndex) with 422 Invalid. Everything else goes to `inner`.
class ImmutableJobsClient : public kube::KubeClient {
 public:
  explicit ImmutableJobsClient(kube::KubeClient& inner) : inner_(inner) {}
  std::atomic<bool> refuseJobChanges{false};

  kube::ApiResult<json> call(const kube::ApiRequest& request,
                             const kube::CancelToken* cancel) override {
    if (refuseJobChanges && request.method == "PATCH" &&
        request.path.rfind("/apis/batch/v1/namespaces/", 0) == 0 &&
        request.path.find("/jobs/") != std::string::npos) {
      const json status = {{"kind", "Status"},
                           {"apiVersion", "v1"},
                           {"status", "Failure"},
                           {"reason", "Invalid"},
                           {"code", 422},
                           {"message",
                            "Job.batch \"world-london\" is invalid: spec.backoffLimitPerIndex: "
                            "Invalid value: 3: field is immutable"}};
      return kube::decodeApiError(422, status.dump());
    }
    return inner_.call(request, cancel);
  }
  kube::ApiResult<std::monostate> stream(const kube::ApiRequest& request,
                                         const std::function<void(std::string_view)>& onChunk,
                                         std::chrono::milliseconds timeout,
                                         const kube::CancelToken& cancel) override {
    return inner_.stream(request, onChunk, timeout, cancel);
  }
  const std::string& defaultNamespace() const override { return inner_.defaultNamespace(); }
  const kube::ClientOptions& options() const override { return inner_.options(); }

 private:
  kube::KubeClient& inner_;
};

std::unique_ptr<kube::KubeClient> clientFor(const testapi::TestApiServer& server,
                                            const fs::path& dir, const std::string& name) {
  const fs::path path = dir / (name + ".kubeconfig");
  server.writeKubeconfig(path.string());
  auto config = kube::loadKubeconfig(path);
  EXPECT_TRUE(config.ok()) << config.status().toString();
  kube::ClientOptions options;
  options.maxRetries = 0;
  auto client = kube::makeKubeClient(*config, options);
  EXPECT_TRUE(client.ok()) << client.status().toString();
  return std::move(*client);
}

class ReconcilerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testapi::ServerOptions o;
    o.tls = true;
    o.token = "reconciler-test";
    hub_ = std::make_unique<testapi::TestApiServer>(o);
    member_ = std::make_unique<testapi::TestApiServer>(o);
    hub_->start();
    member_->start();
    dir_ = fs::path(::testing::TempDir()) / ("geo-reconciler-" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    hubClient_ = clientFor(*hub_, dir_, "hub");
    memberClient_ = clientFor(*member_, dir_, "tokyo");
    clusters_.clients = {{"local", hubClient_.get()}, {"tokyo", memberClient_.get()}};
    const json crd = testapi::yamlNodeToJson(YAML::LoadFile(GEO_CRD_FILE));
    const kube::ResourceRef crds{"apiextensions.k8s.io", "v1", "customresourcedefinitions", false};
    auto created = hubClient_->create(crds, "", crd);
    ASSERT_TRUE(created.ok()) << created.status().toString();
    for (auto* c : {hubClient_.get(), memberClient_.get()}) {
      auto ns =
          c->create(res::kNamespaces, "",
                    {{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", "ml"}}}});
      ASSERT_TRUE(ns.ok()) << ns.status().toString();
    }
    ReconcilerOptions options;
    options.render.workerImage = "registry.example/worker:1";
    reconciler_ = std::make_unique<Reconciler>(*hubClient_, clusters_, nullptr, options, clock_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  json job(const json& spec) {
    return {{"apiVersion", "geotrain.io/v1alpha1"},
            {"kind", "TrainingJob"},
            {"metadata", {{"name", "world"}, {"namespace", "ml"}}},
            {"spec", spec}};
  }
  json twoRegions() {
    return {{"sync", {{"algorithm", "dts"}, {"period", 4}}},
            {"regions",
             {{{"name", "london"}, {"replicas", 2}},
              {{"name", "tokyo"},
               {"cluster", "tokyo"},
               {"gateway", {{"serviceType", "NodePort"}, {"endpoint", "tk.example.org:31000"}}}}}}};
  }
  // twoRegions() with london's gateway a ClusterIP: every address is known
  // at once, so the first pass creates the workloads.
  json twoRegionsClusterIp() {
    json spec = twoRegions();
    spec["regions"][0]["gateway"] = {{"serviceType", "ClusterIP"}};
    return spec;
  }
  json get(kube::KubeClient& c, const kube::ResourceRef& r, const std::string& name) {
    auto g = c.get(r, "ml", name);
    return g.ok() ? *g : json();
  }
  json trainingJob() { return get(*hubClient_, kTrainingJobs, "world"); }
  std::string condition(const json& tj, const std::string& type, const char* field = "status") {
    for (const json& c : tj["status"]["conditions"]) {
      if (c["type"] == type) return c[field];
    }
    return "<none>";
  }
  ReconcileResult pass() {
    auto r = reconciler_->reconcile("ml", "world");
    EXPECT_TRUE(r.ok()) << r.status().toString();
    return r.ok() ? *r : ReconcileResult{};
  }
  // What a cluster's own controllers do (the test apiserver runs none):
  // `manager` changes object `name` of `resource` through the status path.
  // `subresource` "" changes the object itself (spec, metadata).
  void writeAsController(testapi::TestApiServer& server, const kube::ResourceRef& resource,
                         const std::string& name, const std::string& manager,
                         const std::function<void(testapi::Json&)>& change,
                         const std::string& subresource = "status") {
    auto type = server.registry().find(resource.group, resource.version, resource.resource);
    bool created = false;
    server.store().modify(
        *type, "ml", name, testapi::WriteContext{manager, subresource, false},
        [&](const testapi::Json* current) {
          testapi::Json o = *current;
          change(o);
          return o;
        },
        false, &created);
  }
  // The cloud: give london's LoadBalancer gateway an address.
  void provisionLoadBalancer() {
    writeAsController(*hub_, res::kServices, "world-london-gateway", "cloud", [](testapi::Json& o) {
      o["status"]["loadBalancer"]["ingress"] = {{{"ip", "203.0.113.7"}}};
    });
  }
  // The Job controller: set a region Job's status.
  void setJobStatus(testapi::TestApiServer& server, const std::string& name, const json& status) {
    writeAsController(server, res::kJobs, name, "job-controller",
                      [&](testapi::Json& o) { o["status"] = status; });
  }

  std::unique_ptr<testapi::TestApiServer> hub_, member_;
  fs::path dir_;
  std::unique_ptr<kube::KubeClient> hubClient_, memberClient_;
  TestClusters clusters_;
  // The reconciler's time: it stands still unless a test moves it; on the
  // wall it starts now, as the API servers' time stamps do.
  FakeClock clock_{std::chrono::system_clock::now()};
  std::unique_ptr<Reconciler> reconciler_;
};

TEST_F(ReconcilerTest, CreatesEveryRegionRunsSucceedsAndCleansUp) {
  ASSERT_TRUE(hubClient_->create(kTrainingJobs, "ml", job(twoRegions())).ok());

  // Pass 1: finalizer, Services in both clusters; london's load balancer
  // has no address yet, so no workload anywhere.
  ReconcileResult r = pass();
  EXPECT_EQ(r.requeue.after, std::chrono::milliseconds(3000));
  json tj = trainingJob();
  EXPECT_EQ(tj["metadata"]["finalizers"], json({"geotrain.io/cleanup"}));
  EXPECT_EQ(condition(tj, "Created", "reason"), "WaitingForGateway");
  EXPECT_FALSE(get(*hubClient_, res::kServices, "world-london-gateway").is_null());
  EXPECT_EQ(
      get(*memberClient_, res::kServices, "world-tokyo-gateway")["spec"]["ports"][0]["nodePort"],
      31000);
  EXPECT_TRUE(get(*hubClient_, res::kJobs, "world-london").is_null());

  // Pass 2: the address is there; Secrets, ConfigMaps and Jobs appear.
  provisionLoadBalancer();
  r = pass();
  tj = trainingJob();
  EXPECT_EQ(condition(tj, "Created"), "True") << tj["status"].dump();
  EXPECT_EQ(tj["status"]["state"], "Pending");
  const json londonJob = get(*hubClient_, res::kJobs, "world-london");
  ASSERT_FALSE(londonJob.is_null());
  EXPECT_EQ(londonJob["spec"]["completions"], 2);
  EXPECT_EQ(londonJob["spec"]["template"]["spec"]["containers"][0]["image"],
            "registry.example/worker:1");
  const json tokyoConfig = get(*memberClient_, res::kConfigMaps, "world-tokyo-config");
  const std::string yaml = tokyoConfig["data"]["worker.yaml"];
  EXPECT_NE(yaml.find("tcp://203.0.113.7:7000"), std::string::npos) << yaml;  // london's gateway
  EXPECT_NE(yaml.find("- none"), std::string::npos) << yaml;                  // london's member
  // Each region's Secret holds only its own ranks' secret keys.
  const json londonKeys = get(*hubClient_, res::kSecrets, "world-london-keys");
  const json tokyoKeys = get(*memberClient_, res::kSecrets, "world-tokyo-keys");
  EXPECT_EQ(londonKeys["data"].size(), 2u);
  EXPECT_TRUE(londonKeys["data"].contains("worker-1.key"));
  EXPECT_EQ(tokyoKeys["data"].size(), 1u);
  EXPECT_TRUE(tokyoKeys["data"].contains("worker-2.key"));
  EXPECT_TRUE(tokyoConfig["data"].contains("worker-0.pub"));

  // Pass 3 with nothing new writes nothing: every resourceVersion stays.
  const std::vector<std::pair<kube::KubeClient*, std::pair<kube::ResourceRef, std::string>>> all = {
      {hubClient_.get(), {kTrainingJobs, "world"}},
      {hubClient_.get(), {res::kJobs, "world-london"}},
      {hubClient_.get(), {res::kSecrets, "world-london-keys"}},
      {hubClient_.get(), {res::kConfigMaps, "world-london-config"}},
      {memberClient_.get(), {res::kConfigMaps, "world-tokyo-config"}},
      {memberClient_.get(), {res::kServices, "world-tokyo-gateway"}},
      {memberClient_.get(), {res::kJobs, "world-tokyo"}}};
  std::vector<std::string> versions;
  for (const auto& [c, ref] : all)
    versions.push_back(get(*c, ref.first, ref.second)["metadata"]["resourceVersion"]);
  pass();
  for (size_t i = 0; i < all.size(); ++i) {
    EXPECT_EQ(get(*all[i].first, all[i].second.first,
                  all[i].second.second)["metadata"]["resourceVersion"],
              versions[i])
        << all[i].second.second << " was written again";
  }

  // The workers run, then finish.
  setJobStatus(*hub_, "world-london", {{"active", 2}, {"ready", 2}});
  setJobStatus(*member_, "world-tokyo", {{"active", 1}, {"ready", 1}});
  r = pass();
  tj = trainingJob();
  EXPECT_EQ(tj["status"]["state"], "Running");
  EXPECT_EQ(tj["status"]["regionsReady"], "2/2");
  EXPECT_EQ(r.requeue.after, std::chrono::milliseconds(10000));
  const json complete = {{"succeeded", 2},
                         {"conditions", {{{"type", "Complete"}, {"status", "True"}}}}};
  setJobStatus(*hub_, "world-london", complete);
  setJobStatus(*member_, "world-tokyo", complete);
  r = pass();
  tj = trainingJob();
  EXPECT_EQ(tj["status"]["state"], "Succeeded");
  EXPECT_FALSE(r.requeue.after.has_value());
  EXPECT_TRUE(tj["status"].contains("completionTime"));

  // Delete: the finalizer holds the object until both clusters are clean.
  ASSERT_TRUE(hubClient_->remove(kTrainingJobs, "ml", "world").ok());
  r = pass();
  EXPECT_TRUE(trainingJob().is_null());
  for (auto* c : {hubClient_.get(), memberClient_.get()}) {
    kube::ListOptions selector;
    selector.labelSelector = "geotrain.io/job=world";
    auto left = c->list(res::kConfigMaps, "ml", selector);
    ASSERT_TRUE(left.ok());
    EXPECT_TRUE(left->items.empty()) << left->items.size() << " ConfigMaps left";
  }
  EXPECT_TRUE(get(*memberClient_, res::kJobs, "world-tokyo").is_null());
  EXPECT_TRUE(get(*memberClient_, res::kSecrets, "world-tokyo-keys").is_null());
}

// A finished job never runs again (reconciler.h): the TTL controller
// deleting a region's Job after ttlSecondsAfterFinished does not make the
// controller recreate it, the status stays Succeeded, and deleting the
// TrainingJob still cleans up every region.
TEST_F(ReconcilerTest, AFinishedJobWhoseJobIsDeletedIsNotRecreated) {
  ASSERT_TRUE(hubClient_->create(kTrainingJobs, "ml", job(twoRegionsClusterIp())).ok());
  pass();
  ASSERT_FALSE(get(*memberClient_, res::kJobs, "world-tokyo").is_null());
  const json complete = {{"succeeded", 2},
                         {"conditions", {{{"type", "Complete"}, {"status", "True"}}}}};
  setJobStatus(*hub_, "world-london", complete);
  setJobStatus(*member_, "world-tokyo", complete);
  pass();
  const json done = trainingJob();
  ASSERT_EQ(done["status"]["state"], "Succeeded") << done["status"].dump();
  const std::string completionTime = done["status"]["completionTime"];

  // The TTL controller deletes tokyo's Job.
  ASSERT_TRUE(memberClient_->remove(res::kJobs, "ml", "world-tokyo").ok());
  ASSERT_TRUE(get(*memberClient_, res::kJobs, "world-tokyo").is_null());
  for (int i = 0; i < 3; ++i) {
    const ReconcileResult r = pass();
    EXPECT_EQ(r.report.state, "Succeeded");
    EXPECT_FALSE(r.requeue.retry);
    EXPECT_FALSE(r.requeue.after.has_value());
  }
  EXPECT_TRUE(get(*memberClient_, res::kJobs, "world-tokyo").is_null()) << "recreated";
  json tj = trainingJob();
  EXPECT_EQ(tj["status"]["state"], "Succeeded") << tj["status"].dump();
  EXPECT_EQ(condition(tj, "Succeeded"), "True");
  EXPECT_EQ(tj["status"]["regionsReady"], "2/2");
  EXPECT_EQ(tj["status"]["completionTime"], completionTime);
  EXPECT_EQ(tj["metadata"]["resourceVersion"], done["metadata"]["resourceVersion"])
      << "a finished job's status was written again";

  // A spec edit does not bring it back either.
  tj["spec"]["training"] = {{"lr", 0.2}, {"steps", 3000}};
  ASSERT_TRUE(hubClient_->update(kTrainingJobs, "ml", tj).ok());
  pass();
  tj = trainingJob();
  EXPECT_EQ(tj["status"]["state"], "Succeeded");
  EXPECT_EQ(tj["status"]["observedGeneration"], tj["metadata"]["generation"]);
  EXPECT_TRUE(get(*memberClient_, res::kJobs, "world-tokyo").is_null()) << "recreated";

  // Deletion still cleans up every region, and releases the finalizer.
  ASSERT_TRUE(hubClient_->remove(kTrainingJobs, "ml", "world").ok());
  pass();
  EXPECT_TRUE(trainingJob().is_null());
  EXPECT_TRUE(get(*hubClient_, res::kJobs, "world-london").is_null());
  EXPECT_TRUE(get(*hubClient_, res::kConfigMaps, "world-london-config").is_null());
  EXPECT_TRUE(get(*memberClient_, res::kConfigMaps, "world-tokyo-config").is_null());
  EXPECT_TRUE(get(*memberClient_, res::kSecrets, "world-tokyo-keys").is_null());
  EXPECT_TRUE(get(*memberClient_, res::kServices, "world-tokyo-gateway").is_null());
}

// Progress comes from rank 0's /metrics, served by the worker's own
// exporter (geo::metrics::WorkerMetrics) on loopback and read through the
// region cluster's API server (pods proxy), as the hub reaches a member's pod.
TEST_F(ReconcilerTest, ProgressComesFromRankZerosMetricsThroughTheApiServer) {
  auto metrics = metrics::WorkerMetrics::start("127.0.0.1:0", {"world", "london", 0}, {});
  ASSERT_TRUE(metrics.ok()) << metrics.status().toString();
  ReconcilerOptions options;
  options.render.workerImage = "registry.example/worker:1";
  options.render.metricsPort = (*metrics)->port();
  reconciler_ = std::make_unique<Reconciler>(*hubClient_, clusters_, nullptr, options, clock_);
  json spec = twoRegionsClusterIp();
  ASSERT_TRUE(hubClient_->create(kTrainingJobs, "ml", job(spec)).ok());
  pass();
  setJobStatus(*hub_, "world-london", {{"active", 2}, {"ready", 2}});
  setJobStatus(*member_, "world-tokyo", {{"active", 1}, {"ready", 1}});

  // No pod yet (the test apiserver runs no Job controller): no progress.
  pass();
  EXPECT_EQ(trainingJob()["status"]["progress"], json::object()) << trainingJob()["status"].dump();

  // The Job controller's pods: index 1 and an old index-0 pod that failed,
  // then the running index-0 pod on 127.0.0.1.
  auto addPod = [&](const std::string& podName, const std::string& index, const std::string& phase,
                    const std::string& created) {
    json pod = {{"apiVersion", "v1"},
                {"kind", "Pod"},
                {"metadata",
                 {{"name", podName},
                  {"namespace", "ml"},
                  {"labels",
                   {{"geotrain.io/job", "world"},
                    {"geotrain.io/region", "london"},
                    {"batch.kubernetes.io/job-completion-index", index}}}}},
                {"spec", {{"containers", {{{"name", "worker"}, {"image", "w"}}}}}}};
    ASSERT_TRUE(hubClient_->create(res::kPods, "ml", pod).ok());
    writeAsController(*hub_, res::kPods, podName, "kubelet", [&](testapi::Json& o) {
      o["metadata"]["creationTimestamp"] = created;
      o["status"] = {{"phase", phase}, {"podIP", "127.0.0.1"}};
    });
  };
  addPod("world-london-1-abcde", "1", "Running", "2026-11-23T10:00:00Z");
  addPod("world-london-0-old00", "0", "Failed", "2026-11-23T09:00:00Z");
  auto leader = leaderPod(*hubClient_, "ml", "world", "london");
  ASSERT_TRUE(leader.ok()) << leader.status().toString();
  EXPECT_EQ(*leader, "");
  addPod("world-london-0-fghij", "0", "Running", "2026-11-23T10:00:01Z");
  leader = leaderPod(*hubClient_, "ml", "world", "london");
  ASSERT_TRUE(leader.ok());
  EXPECT_EQ(*leader, "world-london-0-fghij");

  (*metrics)->recordStep(0.05, 0.4375, 64);
  (*metrics)->setStep(120);
  (*metrics)->setEvalAccuracy(0.8125);
  (*metrics)->setEvalLoss(0.625);
  pass();
  json progress = trainingJob()["status"]["progress"];
  EXPECT_EQ(progress,
            json({{"step", 120}, {"loss", 0.4375}, {"accuracy", 0.8125}, {"evalLoss", 0.625}}));

  (*metrics)->setStep(130);
  pass();
  EXPECT_EQ(trainingJob()["status"]["progress"]["step"], 130);

  // The worker goes away: the last progress stays.
  metrics->reset();
  pass();
  EXPECT_EQ(trainingJob()["status"]["progress"]["step"], 130);
}

// Suspend stops the workers and keeps their checkpoints; resume starts them
// on the same claims; delete removes the claims with everything else.
TEST_F(ReconcilerTest, SuspendKeepsTheCheckpointClaimsAndResumeUsesThem) {
  json spec = twoRegionsClusterIp();
  spec["checkpoint"] = {{"dir", "/checkpoints"}, {"interval", 100}};
  spec["checkpointVolume"] = {{"size", "5Gi"}};
  ASSERT_TRUE(hubClient_->create(kTrainingJobs, "ml", job(spec)).ok());
  pass();
  const json londonClaim =
      get(*hubClient_, res::kPersistentVolumeClaims, "world-london-checkpoints");
  const json tokyoClaim =
      get(*memberClient_, res::kPersistentVolumeClaims, "world-tokyo-checkpoints");
  ASSERT_FALSE(londonClaim.is_null());
  ASSERT_FALSE(tokyoClaim.is_null());
  EXPECT_EQ(londonClaim["spec"]["accessModes"], json({"ReadWriteMany"}));  // 2 replicas
  EXPECT_EQ(tokyoClaim["spec"]["accessModes"], json({"ReadWriteOnce"}));
  EXPECT_EQ(get(*memberClient_, res::kJobs, "world-tokyo")["spec"]["template"]["spec"]["volumes"]
                .back()["persistentVolumeClaim"]["claimName"],
            "world-tokyo-checkpoints");
  setJobStatus(*member_, "world-tokyo", {{"active", 1}, {"ready", 1}});

  auto setSuspend = [&](bool suspend) {
    json tj = trainingJob();
    tj["spec"]["runPolicy"]["suspend"] = suspend;
    auto u = hubClient_->update(kTrainingJobs, "ml", tj);
    ASSERT_TRUE(u.ok()) << u.status().toString();
  };
  setSuspend(true);
  pass();
  EXPECT_EQ(get(*memberClient_, res::kJobs, "world-tokyo")["spec"]["suspend"], true);
  EXPECT_EQ(get(*hubClient_, res::kJobs, "world-london")["spec"]["suspend"], true);
  setJobStatus(*member_, "world-tokyo", {{"active", 0}});  // Kubernetes deleted the pods
  pass();
  json tj = trainingJob();
  EXPECT_EQ(tj["status"]["state"], "Suspended");
  EXPECT_EQ(condition(tj, "Suspended"), "True");
  // The claims are the same objects: the checkpoints are still there.
  EXPECT_EQ(get(*memberClient_, res::kPersistentVolumeClaims,
                "world-tokyo-checkpoints")["metadata"]["uid"],
            tokyoClaim["metadata"]["uid"]);

  setSuspend(false);
  pass();
  EXPECT_EQ(get(*memberClient_, res::kJobs, "world-tokyo")["spec"]["suspend"], false);
  EXPECT_EQ(get(*memberClient_, res::kPersistentVolumeClaims,
                "world-tokyo-checkpoints")["metadata"]["uid"],
            tokyoClaim["metadata"]["uid"]);
  EXPECT_EQ(condition(trainingJob(), "Suspended"), "False");

  ASSERT_TRUE(hubClient_->remove(kTrainingJobs, "ml", "world").ok());
  pass();
  EXPECT_TRUE(trainingJob().is_null());
  EXPECT_TRUE(
      get(*memberClient_, res::kPersistentVolumeClaims, "world-tokyo-checkpoints").is_null());
  EXPECT_TRUE(get(*hubClient_, res::kPersistentVolumeClaims, "world-london-checkpoints").is_null());
}

// manifests/samples/pvc-data.yaml as a user applies it: the data set and the
// TorchScript model come from claims mounted through spec.template, and
// tokyo's own claim name, node pool and priority override the job's.
TEST_F(ReconcilerTest, ThePodTemplateSampleRendersIntoEveryRegionsJob) {
  json sample = testapi::yamlNodeToJson(YAML::LoadFile(GEO_SAMPLES_DIR "/pvc-data.yaml"));
  sample["metadata"]["namespace"] = "ml";
  const std::string name = sample["metadata"]["name"];
  ASSERT_TRUE(hubClient_->create(kTrainingJobs, "ml", sample).ok());
  auto passOf = [&] {
    auto r = reconciler_->reconcile("ml", name);
    EXPECT_TRUE(r.ok()) << r.status().toString();
  };
  passOf();
  // Both gateways are load balancers: the cloud gives them addresses.
  for (auto [server, region] :
       {std::pair{hub_.get(), "london"}, std::pair{member_.get(), "tokyo"}}) {
    writeAsController(*server, res::kServices, name + "-" + region + "-gateway", "cloud",
                      [](testapi::Json& o) {
                        o["status"]["loadBalancer"]["ingress"] = {{{"ip", "203.0.113.9"}}};
                      });
  }
  passOf();
  const json tj = get(*hubClient_, kTrainingJobs, name);
  EXPECT_EQ(condition(tj, "Created"), "True") << tj["status"].dump();
  std::map<std::string, json> pods;
  pods["london"] = get(*hubClient_, res::kJobs, name + "-london")["spec"]["template"];
  pods["tokyo"] = get(*memberClient_, res::kJobs, name + "-tokyo")["spec"]["template"];
  auto volume = [](const json& pod, const std::string& volumeName) {
    for (const json& v : pod["spec"]["volumes"]) {
      if (v["name"] == volumeName) return v;
    }
    return json();
  };
  for (const auto& [region, pod] : pods) {
    SCOPED_TRACE(region);
    ASSERT_TRUE(pod.is_object());
    const json& worker = pod["spec"]["containers"][0];
    EXPECT_EQ(pod["metadata"]["labels"]["team"], "vision");
    EXPECT_EQ(pod["metadata"]["labels"]["geotrain.io/region"], region);
    EXPECT_EQ(pod["metadata"]["annotations"]["example.com/owner"], "vision@example.com");
    EXPECT_EQ(worker["env"], json({{{"name", "OMP_NUM_THREADS"}, {"value", "4"}}}));
    EXPECT_EQ(volume(pod, "models")["persistentVolumeClaim"]["claimName"], "geotrain-models");
    EXPECT_FALSE(volume(pod, "config").is_null()) << "the worker's own volumes stay";
    EXPECT_EQ(worker["volumeMounts"].size(), 5u) << worker["volumeMounts"].dump();
    EXPECT_EQ(worker["resources"]["limits"]["nvidia.com/gpu"], 1);
    EXPECT_EQ(pod["spec"]["imagePullSecrets"], json({{{"name", "regcred"}}}));
  }
  EXPECT_EQ(volume(pods["london"], "dataset")["persistentVolumeClaim"]["claimName"], "cifar10");
  EXPECT_EQ(volume(pods["tokyo"], "dataset")["persistentVolumeClaim"]["claimName"],
            "cifar10-tokyo");
  EXPECT_EQ(pods["london"]["spec"]["priorityClassName"], "training");
  EXPECT_EQ(pods["tokyo"]["spec"]["priorityClassName"], "training-spot");
  EXPECT_FALSE(pods["london"]["spec"].contains("nodeSelector"));
  EXPECT_EQ(pods["tokyo"]["spec"]["nodeSelector"]["cloud.example.com/pool"], "gpu-a100");
  // The workers read the data set where the claim is mounted.
  const std::string yaml =
      get(*memberClient_, res::kConfigMaps, name + "-tokyo-config")["data"]["worker.yaml"];
  EXPECT_NE(yaml.find("/data/cifar10"), std::string::npos) << yaml;
  EXPECT_NE(yaml.find("/models/net.pt"), std::string::npos) << yaml;
}

// Kueue in a region cluster: the TrainingJob's queue-name label reaches the
// region Jobs, a Job that field manager kueue suspends stays suspended
// across passes and a controller restart (whose first pass applies
// everything), the job says it waits for admission, and only a change of
// spec.runPolicy.suspend is written into the Jobs.
TEST_F(ReconcilerTest, AJobSuspendedByKueueStaysSuspendedAcrossARestart) {
  json tj = job(twoRegionsClusterIp());
  tj["metadata"]["labels"] = {{"kueue.x-k8s.io/queue-name", "gpu-queue"}};
  ASSERT_TRUE(hubClient_->create(kTrainingJobs, "ml", tj).ok());
  pass();
  for (auto* c : {hubClient_.get(), memberClient_.get()}) {
    const std::string name = c == hubClient_.get() ? "world-london" : "world-tokyo";
    const json j = get(*c, res::kJobs, name);
    ASSERT_FALSE(j.is_null()) << name;
    EXPECT_EQ(j["metadata"]["labels"]["kueue.x-k8s.io/queue-name"], "gpu-queue") << name;
    EXPECT_EQ(j["spec"]["template"]["metadata"]["labels"]["kueue.x-k8s.io/queue-name"], "gpu-queue")
        << name;
    EXPECT_EQ(j["spec"]["suspend"], false);
  }
  // Kueue's webhook and controller hold tokyo's Job back (no quota yet).
  auto kueueSets = [&](bool suspend) {
    writeAsController(
        *member_, res::kJobs, "world-tokyo", "kueue",
        [&](testapi::Json& o) { o["spec"]["suspend"] = suspend; }, "");
  };
  kueueSets(true);
  pass();
  EXPECT_EQ(get(*memberClient_, res::kJobs, "world-tokyo")["spec"]["suspend"], true);
  EXPECT_EQ(condition(trainingJob(), "Running", "reason"), "WaitingForAdmission");
  // A restart: a new controller applies everything on its first pass.
  ReconcilerOptions options;
  options.render.workerImage = "registry.example/worker:1";
  reconciler_ = std::make_unique<Reconciler>(*hubClient_, clusters_, nullptr, options, clock_);
  pass();
  pass();
  EXPECT_EQ(get(*memberClient_, res::kJobs, "world-tokyo")["spec"]["suspend"], true)
      << "the controller took the Job back from kueue";
  json now = trainingJob();
  EXPECT_EQ(now["status"]["state"], "Pending");
  EXPECT_EQ(condition(now, "Running", "reason"), "WaitingForAdmission");
  EXPECT_NE(condition(now, "Running", "message").find("tokyo"), std::string::npos);
  // Kueue admits it; the workers start.
  kueueSets(false);
  setJobStatus(*hub_, "world-london", {{"active", 2}, {"ready", 2}});
  setJobStatus(*member_, "world-tokyo", {{"active", 1}, {"ready", 1}});
  pass();
  EXPECT_EQ(get(*memberClient_, res::kJobs, "world-tokyo")["spec"]["suspend"], false);
  EXPECT_EQ(trainingJob()["status"]["state"], "Running");
  // The user's own suspend still reaches every region, and so does resuming.
  auto setSuspend = [&](bool suspend) {
    json t = trainingJob();
    t["spec"]["runPolicy"]["suspend"] = suspend;
    ASSERT_TRUE(hubClient_->update(kTrainingJobs, "ml", t).ok());
  };
  setSuspend(true);
  pass();
  EXPECT_EQ(get(*memberClient_, res::kJobs, "world-tokyo")["spec"]["suspend"], true);
  EXPECT_EQ(get(*hubClient_, res::kJobs, "world-london")["spec"]["suspend"], true);
  EXPECT_EQ(trainingJob()["status"]["state"], "Suspended");
  setSuspend(false);
  pass();
  EXPECT_EQ(get(*memberClient_, res::kJobs, "world-tokyo")["spec"]["suspend"], false);
}

// Between full applies a pass writes only objects whose rendered content
// changed or that are gone; a full apply (every fullApplyEvery) also undoes
// edits made by hand.
TEST_F(ReconcilerTest, WritesOnlyWhatChangedAndAFullApplyUndoesHandEdits) {
  json spec = twoRegionsClusterIp();
  ASSERT_TRUE(hubClient_->create(kTrainingJobs, "ml", job(spec)).ok());
  pass();
  const json config = get(*memberClient_, res::kConfigMaps, "world-tokyo-config");
  ASSERT_FALSE(config.is_null());
  EXPECT_FALSE(config["metadata"]["annotations"]["geotrain.io/applied-hash"].is_null());

  // Gone objects come back on the next pass.
  ASSERT_TRUE(memberClient_->remove(res::kServices, "ml", "world-tokyo-gateway").ok());
  ASSERT_TRUE(memberClient_->remove(res::kConfigMaps, "ml", "world-tokyo-config").ok());
  pass();
  EXPECT_FALSE(get(*memberClient_, res::kServices, "world-tokyo-gateway").is_null());
  EXPECT_EQ(get(*memberClient_, res::kConfigMaps, "world-tokyo-config")["data"], config["data"]);

  // A hand edit stays until the next full apply...
  json edited = get(*memberClient_, res::kConfigMaps, "world-tokyo-config");
  edited["data"]["worker.yaml"] = "edited by hand";
  ASSERT_TRUE(memberClient_->update(res::kConfigMaps, "ml", edited).ok());
  pass();
  EXPECT_EQ(get(*memberClient_, res::kConfigMaps, "world-tokyo-config")["data"]["worker.yaml"],
            "edited by hand");
  // ...which is a job's first pass in a process, and every pass with
  // fullApplyEvery 0.
  ReconcilerOptions options;
  options.render.workerImage = "registry.example/worker:1";
  options.fullApplyEvery = std::chrono::milliseconds(0);
  reconciler_ = std::make_unique<Reconciler>(*hubClient_, clusters_, nullptr, options, clock_);
  pass();
  EXPECT_EQ(get(*memberClient_, res::kConfigMaps, "world-tokyo-config")["data"], config["data"]);
  edited = get(*memberClient_, res::kConfigMaps, "world-tokyo-config");
  edited["data"]["worker.yaml"] = "edited by hand again";
  ASSERT_TRUE(memberClient_->update(res::kConfigMaps, "ml", edited).ok());
  pass();
  EXPECT_EQ(get(*memberClient_, res::kConfigMaps, "world-tokyo-config")["data"], config["data"]);
}

// With the clusters' informer caches: a converged pass reads from memory
// and writes nothing, and a change in a region's cluster (a Job's status, a
// deleted object) is reported for its TrainingJob at once.
TEST_F(ReconcilerTest, ClusterCachesServeReadsAndReportChanges) {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::string> changes;
  auto onChange = [&](const std::string& ns, const std::string& job) {
    std::lock_guard lock(mu);
    changes.push_back(ns + "/" + job);
    cv.notify_all();
  };
  ClusterCache hubCache(*hubClient_, onChange), memberCache(*memberClient_, onChange);
  struct CachedClusters : TestClusters {
    std::map<std::string, const ClusterCache*> caches;
    const ClusterCache* cache(const std::string& cluster) override { return caches[cluster]; }
  } clusters;
  clusters.clients = clusters_.clients;
  clusters.caches = {{"local", &hubCache}, {"tokyo", &memberCache}};
  reconciler_ =
      std::make_unique<Reconciler>(*hubClient_, clusters, nullptr, ReconcilerOptions{}, clock_);
  auto waitFor = [&](const std::function<bool()>& done) {
    for (int i = 0; i < 200 && !done(); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    return done();
  };
  ASSERT_TRUE(waitFor([&] { return hubCache.synced() && memberCache.synced(); }));

  json spec = twoRegionsClusterIp();
  ASSERT_TRUE(hubClient_->create(kTrainingJobs, "ml", job(spec)).ok());
  pass();
  ASSERT_TRUE(waitFor([&] {
    return memberCache.get(res::kJobs, "ml", "world-tokyo") != nullptr &&
           hubCache.get(res::kJobs, "ml", "world-london") != nullptr;
  }));
  // What the cache keeps: no managedFields, no pod template; of the spec only
  // suspend, which another manager may own (setJobSuspend()).
  const kube::ObjectPtr cached = memberCache.get(res::kJobs, "ml", "world-tokyo");
  EXPECT_EQ((*cached)["spec"], json({{"suspend", false}}));
  EXPECT_EQ((*cached)["metadata"]["annotations"]["geotrain.io/suspend"], "false");
  EXPECT_FALSE((*cached)["metadata"].contains("managedFields"));
  EXPECT_TRUE((*cached)["metadata"]["annotations"].contains("geotrain.io/applied-hash"));

  // A converged pass changes nothing anywhere.
  const std::string tokyoJob =
      get(*memberClient_, res::kJobs, "world-tokyo")["metadata"]["resourceVersion"];
  const std::string tokyoConfig =
      get(*memberClient_, res::kConfigMaps, "world-tokyo-config")["metadata"]["resourceVersion"];
  pass();
  EXPECT_EQ(get(*memberClient_, res::kJobs, "world-tokyo")["metadata"]["resourceVersion"],
            tokyoJob);
  EXPECT_EQ(
      get(*memberClient_, res::kConfigMaps, "world-tokyo-config")["metadata"]["resourceVersion"],
      tokyoConfig);

  // The Job controller updates tokyo's Job: the job hears of it.
  {
    std::lock_guard lock(mu);
    changes.clear();
  }
  setJobStatus(*member_, "world-tokyo", {{"active", 1}, {"ready", 1}});
  {
    std::unique_lock lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(5), [&] { return !changes.empty(); }));
    EXPECT_EQ(changes.front(), "ml/world");
  }
  ASSERT_TRUE(waitFor([&] {
    auto j = memberCache.get(res::kJobs, "ml", "world-tokyo");
    return j && (*j)["status"].value("ready", 0) == 1;
  }));
  pass();
  EXPECT_EQ(trainingJob()["status"]["regions"][1]["ready"], 1);

  // Someone deletes tokyo's ConfigMap: reported, and the next pass puts it back.
  {
    std::lock_guard lock(mu);
    changes.clear();
  }
  ASSERT_TRUE(memberClient_->remove(res::kConfigMaps, "ml", "world-tokyo-config").ok());
  {
    std::unique_lock lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(5), [&] { return !changes.empty(); }));
  }
  ASSERT_TRUE(waitFor(
      [&] { return memberCache.get(res::kConfigMaps, "ml", "world-tokyo-config") == nullptr; }));
  pass();
  EXPECT_FALSE(get(*memberClient_, res::kConfigMaps, "world-tokyo-config").is_null());
}

TEST(ProgressTest, ReadsTheFourSeriesOfAnExposition) {
  const std::string text =
      "# HELP geotrain_train_step Training steps completed\n"
      "# TYPE geotrain_train_step gauge\n"
      "geotrain_train_steps_other 9\n"
      "geotrain_train_step{job=\"a}b\",region=\"x\",rank=\"0\"} 250\n"
      "geotrain_train_loss{job=\"a\"} 3.5e-01\n"
      "geotrain_eval_accuracy 0.875 1700000000000\n"
      "geotrain_eval_loss 0.375\n";
  const api::Progress p = progressFromExposition(text);
  EXPECT_EQ(p.step, 250);
  EXPECT_EQ(p.loss, 0.35);
  EXPECT_EQ(p.accuracy, 0.875);
  EXPECT_EQ(p.evalLoss, 0.375);
  // Before the first step nothing is reported; an accuracy of 0 is "not yet
  // evaluated"; garbage is skipped.
  EXPECT_EQ(progressFromExposition("geotrain_train_step 0\ngeotrain_train_loss 0\n"),
            api::Progress{});
  const api::Progress q = progressFromExposition(
      "geotrain_train_step 3\ngeotrain_eval_accuracy 0\ngeotrain_train_loss NaN\n"
      "geotrain_eval_loss 0\ngeotrain_train_loss{ 1\n\x01\xff garbage\n");
  EXPECT_EQ(q.step, 3);
  EXPECT_FALSE(q.accuracy.has_value());
  EXPECT_FALSE(q.evalLoss.has_value());
  EXPECT_FALSE(q.loss.has_value());
}

TEST(NeedsReconcileTest, StatusAndBookkeepingAloneAreNoReason) {
  const json before = {{"metadata", {{"name", "a"}, {"generation", 1}, {"resourceVersion", "5"}}},
                       {"spec", {{"x", 1}}},
                       {"status", {{"state", "Running"}}}};
  json after = before;
  after["metadata"]["resourceVersion"] = "6";
  after["metadata"]["managedFields"] = json::array({{{"manager", "m"}}});
  after["status"]["progress"] = {{"step", 5}};
  EXPECT_FALSE(needsReconcile(before, after));
  for (auto change : std::vector<std::function<void(json&)>>{
           [](json& o) { o["spec"]["x"] = 2; }, [](json& o) { o["metadata"]["generation"] = 2; },
           [](json& o) { o["metadata"]["deletionTimestamp"] = "t"; },
           [](json& o) { o["metadata"]["finalizers"] = {"f"}; },
           [](json& o) {
             o["metadata"]["labels"] = {{"a", "b"}};
           }}) {
    json changed = after;
    change(changed);
    EXPECT_TRUE(needsReconcile(before, changed)) << changed.dump();
  }
}

TEST_F(ReconcilerTest, KeysSurviveAPassAndAreNeverCopiedAcrossRegions) {
  json spec = twoRegionsClusterIp();
  ASSERT_TRUE(hubClient_->create(kTrainingJobs, "ml", job(spec)).ok());
  pass();
  const json first = get(*memberClient_, res::kSecrets, "world-tokyo-keys");
  ASSERT_FALSE(first.is_null());
  pass();
  EXPECT_EQ(get(*memberClient_, res::kSecrets, "world-tokyo-keys")["data"], first["data"]);
  // No secret key of tokyo anywhere in the hub cluster.
  auto secrets = hubClient_->list(res::kSecrets, "ml");
  ASSERT_TRUE(secrets.ok());
  for (const json& s : secrets->items) {
    EXPECT_FALSE(s["data"].contains("worker-2.key")) << s["metadata"]["name"];
  }
}

TEST_F(ReconcilerTest, InvalidSpecIsReportedAndNothingIsCreated) {
  json spec = twoRegions();
  spec["sync"]["bits"] = 3;
  ASSERT_TRUE(hubClient_->create(kTrainingJobs, "ml", job(spec)).ok());
  const ReconcileResult r = pass();
  EXPECT_EQ(r.report.state, "Invalid");
  const json tj = trainingJob();
  EXPECT_EQ(condition(tj, "Created"), "False");
  EXPECT_EQ(condition(tj, "Created", "reason"), "InvalidSpec");
  EXPECT_NE(condition(tj, "Created", "message").find("spec.sync.bits: 3 is not allowed"),
            std::string::npos);
  EXPECT_TRUE(get(*hubClient_, res::kServices, "world-london").is_null());
}

TEST_F(ReconcilerTest, UnreachableRegionDegradesWithoutStoppingTheOthers) {
  clusters_.clients["tokyo"] = nullptr;
  ASSERT_TRUE(hubClient_->create(kTrainingJobs, "ml", job(twoRegions())).ok());
  const ReconcileResult r = pass();
  EXPECT_TRUE(r.requeue.retry);
  EXPECT_EQ(r.report.regionReachable,
            (std::map<std::string, bool>{{"london", true}, {"tokyo", false}}));
  const json tj = trainingJob();
  EXPECT_EQ(condition(tj, "RegionDegraded"), "True");
  EXPECT_NE(condition(tj, "RegionDegraded", "message").find("tokyo"), std::string::npos);
  // london's Services were written all the same; no workload anywhere yet.
  EXPECT_FALSE(get(*hubClient_, res::kServices, "world-london").is_null());
  EXPECT_TRUE(get(*hubClient_, res::kJobs, "world-london").is_null());
  // Deleting while tokyo is away keeps the finalizer; it goes once tokyo is back.
  ASSERT_TRUE(hubClient_->remove(kTrainingJobs, "ml", "world").ok());
  EXPECT_TRUE(pass().requeue.retry);
  EXPECT_FALSE(trainingJob().is_null());
  clusters_.clients["tokyo"] = memberClient_.get();
  pass();
  EXPECT_TRUE(trainingJob().is_null());
}

// spec.ttlSecondsAfterFinished: a finished TrainingJob is deleted after the
// TTL like a Job, and its objects in every region with it; the pass that
// finishes it asks to be run again when the TTL is up.
TEST_F(ReconcilerTest, AFinishedJobIsDeletedAfterItsTtl) {
  reconciler_ =
      std::make_unique<Reconciler>(*hubClient_, clusters_, nullptr, ReconcilerOptions{}, clock_);
  json spec = twoRegionsClusterIp();
  spec["ttlSecondsAfterFinished"] = 2;
  ASSERT_TRUE(hubClient_->create(kTrainingJobs, "ml", job(spec)).ok());
  pass();
  const json complete = {{"succeeded", 2},
                         {"conditions", {{{"type", "Complete"}, {"status", "True"}}}}};
  setJobStatus(*hub_, "world-london", complete);
  setJobStatus(*member_, "world-tokyo", complete);
  ReconcileResult r = pass();
  EXPECT_EQ(r.report.state, "Succeeded");
  ASSERT_TRUE(r.requeue.after.has_value());
  EXPECT_GT(*r.requeue.after, std::chrono::milliseconds(0));
  EXPECT_LE(*r.requeue.after, std::chrono::milliseconds(2000));
  r = pass();  // before the TTL: kept, and asked to look again
  EXPECT_FALSE(trainingJob().is_null());
  ASSERT_TRUE(r.requeue.after.has_value());
  clock_.advance(*r.requeue.after);
  pass();  // deletes it; the finalizer holds it until every region is clean
  pass();
  EXPECT_TRUE(trainingJob().is_null());
  EXPECT_TRUE(get(*memberClient_, res::kJobs, "world-tokyo").is_null());
  EXPECT_TRUE(get(*hubClient_, res::kConfigMaps, "world-london-config").is_null());
}

// A region in a cluster the controller does not know is an invalid spec that
// names the field (not a network problem), nothing is written anywhere,
// and deleting the job completes at once.
TEST_F(ReconcilerTest, AnUnknownClusterIsAnInvalidSpecAndDeletionCompletes) {
  json spec = twoRegionsClusterIp();
  spec["regions"].push_back({{"name", "paris"}, {"cluster", "paris"}});
  ASSERT_TRUE(hubClient_->create(kTrainingJobs, "ml", job(spec)).ok());
  const ReconcileResult r = pass();
  EXPECT_EQ(r.report.state, "Invalid");
  EXPECT_FALSE(r.requeue.retry);
  const json tj = trainingJob();
  EXPECT_EQ(condition(tj, "Created", "reason"), "InvalidSpec");
  EXPECT_EQ(condition(tj, "Created", "message"),
            "spec.regions[2].cluster: \"paris\" is not a member cluster; known: local, tokyo "
            "(members are listed in the hub chart's values, members[].name)");
  EXPECT_EQ(condition(tj, "RegionDegraded"), "<none>");
  EXPECT_TRUE(get(*hubClient_, res::kServices, "world-london").is_null());
  EXPECT_TRUE(get(*memberClient_, res::kServices, "world-tokyo").is_null());
  ASSERT_TRUE(hubClient_->remove(kTrainingJobs, "ml", "world").ok());
  EXPECT_FALSE(pass().requeue.retry);
  EXPECT_TRUE(trainingJob().is_null());
}

// A member cluster without the job's namespace says so, rather than that
// it cannot be reached.
TEST_F(ReconcilerTest, AMissingNamespaceInAMemberIsReportedAsSuch) {
  ASSERT_TRUE(memberClient_->remove(res::kNamespaces, "", "ml").ok());
  ASSERT_TRUE(hubClient_->create(kTrainingJobs, "ml", job(twoRegionsClusterIp())).ok());
  const ReconcileResult r = pass();
  EXPECT_TRUE(r.requeue.retry);
  EXPECT_EQ(r.report.regionReachable.at("tokyo"), true);  // it answered
  const json tj = trainingJob();
  EXPECT_EQ(condition(tj, "RegionDegraded", "reason"), "NamespaceMissing") << tj["status"].dump();
  EXPECT_EQ(condition(tj, "RegionDegraded", "message"),
            "namespace ml does not exist in cluster tokyo (region tokyo): create it there");
  EXPECT_EQ(condition(tj, "Created"), "False");
  EXPECT_TRUE(get(*hubClient_, res::kJobs, "world-london").is_null());
  // Created there, the job goes on.
  ASSERT_TRUE(
      memberClient_
          ->create(res::kNamespaces, "",
                   {{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", "ml"}}}})
          .ok());
  pass();
  EXPECT_EQ(condition(trainingJob(), "Created"), "True");
  EXPECT_EQ(condition(trainingJob(), "RegionDegraded"), "False");
}

// A region that stays unreachable holds the deletion only until
// cleanupTimeout after it: then it is given up with an Event and the
// condition, and the TrainingJob goes.
TEST_F(ReconcilerTest, CleanupOfAnUnreachableRegionGivesUpAfterTheTimeout) {
  kube::EventRecorder events(*hubClient_, "geotrain-controller", "reconciler-test");
  ReconcilerOptions options;
  options.render.workerImage = "registry.example/worker:1";
  options.cleanupTimeout = std::chrono::seconds(2);
  reconciler_ = std::make_unique<Reconciler>(*hubClient_, clusters_, &events, options, clock_);
  ASSERT_TRUE(hubClient_->create(kTrainingJobs, "ml", job(twoRegionsClusterIp())).ok());
  pass();
  ASSERT_FALSE(get(*memberClient_, res::kJobs, "world-tokyo").is_null());
  clusters_.clients["tokyo"] = nullptr;  // tokyo goes away for good
  ASSERT_TRUE(hubClient_->remove(kTrainingJobs, "ml", "world").ok());
  EXPECT_TRUE(pass().requeue.retry);
  json tj = trainingJob();
  ASSERT_FALSE(tj.is_null());
  EXPECT_EQ(condition(tj, "RegionDegraded", "reason"), "CleanupBlocked");
  EXPECT_NE(condition(tj, "RegionDegraded", "message").find("giving up 2 s after the deletion"),
            std::string::npos)
      << condition(tj, "RegionDegraded", "message");
  // london's objects are gone already.
  EXPECT_TRUE(get(*hubClient_, res::kJobs, "world-london").is_null());
  // Past the timeout (on the wall, counted from the API server's
  // deletionTimestamp).
  clock_.advance(std::chrono::seconds(10));
  EXPECT_FALSE(pass().requeue.retry);
  EXPECT_TRUE(trainingJob().is_null());
  events.flush();
  auto listed = hubClient_->list(res::kEvents, "ml");
  ASSERT_TRUE(listed.ok()) << listed.status().toString();
  std::map<std::string, json> byReason;
  for (const json& e : listed->items) byReason[e["reason"]] = e;
  ASSERT_TRUE(byReason.count("CleanupAbandoned")) << json(listed->items).dump();
  EXPECT_EQ(byReason["CleanupAbandoned"]["type"], "Warning");
  const std::string message = byReason["CleanupAbandoned"]["message"];
  EXPECT_NE(message.find("gave up deleting after"), std::string::npos) << message;
  EXPECT_NE(message.find("tokyo"), std::string::npos) << message;
  EXPECT_NE(message.find("geotrain.io/job=world"), std::string::npos) << message;
  // tokyo's objects are still there (to delete by hand).
  EXPECT_FALSE(get(*memberClient_, res::kJobs, "world-tokyo").is_null());
}

// What goes wrong in a member cluster reaches the TrainingJob's Events with
// the region in the message, each problem once: the wait for a load
// balancer, a worker's image that cannot be pulled, an OOM kill, and the
// region's Job failing.
TEST_F(ReconcilerTest, MemberSideProblemsAndTheGatewayWaitBecomeEvents) {
  kube::EventRecorder events(*hubClient_, "geotrain-controller", "reconciler-test");
  ReconcilerOptions options;
  options.render.workerImage = "registry.example/worker:1";
  reconciler_ = std::make_unique<Reconciler>(*hubClient_, clusters_, &events, options, clock_);
  ASSERT_TRUE(hubClient_->create(kTrainingJobs, "ml", job(twoRegions())).ok());
  pass();
  pass();  // still waiting: said once
  provisionLoadBalancer();
  pass();
  ASSERT_FALSE(get(*memberClient_, res::kJobs, "world-tokyo").is_null());

  // tokyo's worker pod: its image cannot be pulled, then (another pod) it
  // was OOM-killed. The Job controller counts one failure, none ready.
  auto workerPod = [&](const std::string& podName, const json& status) {
    const json object = {
        {"apiVersion", "v1"},
        {"kind", "Pod"},
        {"metadata",
         {{"name", podName},
          {"namespace", "ml"},
          {"labels", {{"geotrain.io/job", "world"}, {"geotrain.io/region", "tokyo"}}}}},
        {"spec", {{"containers", {{{"name", "worker"}, {"image", "x"}}}}}}};
    ASSERT_TRUE(memberClient_->create(res::kPods, "ml", object).ok());
    writeAsController(*member_, res::kPods, podName, "kubelet",
                      [&](testapi::Json& o) { o["status"] = status; });
  };
  workerPod("world-tokyo-0-abcde",
            {{"phase", "Pending"},
             {"containerStatuses",
              {{{"name", "worker"},
                {"state",
                 {{"waiting",
                   {{"reason", "ImagePullBackOff"},
                    {"message", "Back-off pulling image \"registry.example/worker:1\""}}}}}}}}});
  workerPod("world-tokyo-0-fghij",
            {{"phase", "Failed"},
             {"containerStatuses",
              {{{"name", "worker"},
                {"state", {{"terminated", {{"exitCode", 137}, {"reason", "OOMKilled"}}}}}}}}});
  setJobStatus(*member_, "world-tokyo", {{"active", 1}, {"ready", 0}, {"failed", 1}});
  setJobStatus(*hub_, "world-london", {{"active", 2}, {"ready", 2}});
  pass();
  pass();  // the same problems again: no new Events
  setJobStatus(*member_, "world-tokyo",
               {{"failed", 7},
                {"conditions",
                 {{{"type", "Failed"},
                   {"status", "True"},
                   {"reason", "BackoffLimitExceeded"},
                   {"message", "Job has reached the specified backoff limit"}}}}});
  pass();
  events.flush();
  auto listed = hubClient_->list(res::kEvents, "ml");
  ASSERT_TRUE(listed.ok()) << listed.status().toString();
  std::map<std::string, json> byReason;
  for (const json& e : listed->items) byReason[e["reason"]] = e;
  const std::string all = json(listed->items).dump();
  for (const char* reason :
       {"WaitingForGateway", "WorkerImagePullFailed", "WorkerOOMKilled", "RegionJobFailed"}) {
    SCOPED_TRACE(reason);
    ASSERT_TRUE(byReason.count(reason)) << all;
    EXPECT_EQ(byReason[reason]["count"], 1) << byReason[reason].dump();
    EXPECT_EQ(byReason[reason]["involvedObject"]["name"], "world");
  }
  EXPECT_EQ(byReason["WaitingForGateway"]["type"], "Normal");
  EXPECT_EQ(byReason["WaitingForGateway"]["message"],
            "waiting for the load balancer of region london: Service world-london-gateway in "
            "cluster local has no ingress address yet (without a load-balancer controller there, "
            "set spec.regions[0].gateway.serviceType NodePort with an endpoint, or "
            "gateway.endpoint)");
  EXPECT_EQ(byReason["WorkerImagePullFailed"]["type"], "Warning");
  EXPECT_EQ(byReason["WorkerImagePullFailed"]["message"],
            "region tokyo: pod world-tokyo-0-abcde: container worker: ImagePullBackOff: Back-off "
            "pulling image \"registry.example/worker:1\"");
  EXPECT_NE(byReason["WorkerOOMKilled"]["message"].get<std::string>().find(
                "region tokyo: pod world-tokyo-0-fghij: container worker was killed"),
            std::string::npos);
  EXPECT_EQ(byReason["RegionJobFailed"]["message"],
            "region tokyo: Job world-tokyo failed: BackoffLimitExceeded: Job has reached the "
            "specified backoff limit");
}

// A worker's pod fails after the job had started. The region's Job retries
// that worker on its own (per completion index) and its status goes from
// all ready, to one ready less and one more failed pod, to the replacement
// starting, to all ready again: the TrainingJob is RegionDegraded, naming the
// region, until then, with an Event each way, and never Failed.
TEST_F(ReconcilerTest, AFailedWorkerDegradesItsRegionUntilItIsBack) {
  kube::EventRecorder events(*hubClient_, "geotrain-controller", "reconciler-test");
  ReconcilerOptions options;
  options.render.workerImage = "registry.example/worker:1";
  reconciler_ = std::make_unique<Reconciler>(*hubClient_, clusters_, &events, options, clock_);
  ASSERT_TRUE(hubClient_->create(kTrainingJobs, "ml", job(twoRegionsClusterIp())).ok());
  pass();
  const json londonJob = get(*hubClient_, res::kJobs, "world-london");
  ASSERT_FALSE(londonJob.is_null());
  EXPECT_EQ(londonJob["spec"]["backoffLimitPerIndex"], 6);
  EXPECT_EQ(londonJob["spec"]["maxFailedIndexes"], 0);
  EXPECT_EQ(londonJob["spec"]["backoffLimit"], 14);  // 2 workers * (6 + 1)

  auto expectNotFailed = [&](const json& tj) {
    EXPECT_EQ(condition(tj, "Failed"), "False") << tj["status"].dump();
    EXPECT_NE(tj["status"]["state"], "Failed");
  };
  // Start-up: the pods are scheduled but none is ready yet. Pending, not degraded.
  setJobStatus(*hub_, "world-london", {{"active", 2}, {"ready", 0}});
  setJobStatus(*member_, "world-tokyo", {{"active", 1}, {"ready", 0}});
  pass();
  json tj = trainingJob();
  EXPECT_EQ(tj["status"]["state"], "Pending");
  EXPECT_EQ(condition(tj, "RegionDegraded"), "False") << tj["status"].dump();

  // Every worker ready.
  setJobStatus(*hub_, "world-london", {{"active", 2}, {"ready", 2}});
  setJobStatus(*member_, "world-tokyo", {{"active", 1}, {"ready", 1}});
  pass();
  tj = trainingJob();
  EXPECT_EQ(tj["status"]["state"], "Running");
  EXPECT_EQ(condition(tj, "RegionDegraded"), "False");
  EXPECT_EQ(tj["status"]["regions"][0]["started"], true);

  // london's worker 1 crashes (exit 1): its pod failed, Kubernetes waits out
  // the back-off before it creates the replacement.
  setJobStatus(*hub_, "world-london",
               {{"active", 1}, {"ready", 1}, {"failed", 1}, {"failedIndexes", ""}});
  ReconcileResult r = pass();
  tj = trainingJob();
  EXPECT_EQ(condition(tj, "RegionDegraded"), "True") << tj["status"].dump();
  EXPECT_EQ(condition(tj, "RegionDegraded", "reason"), "WorkersRestarting");
  EXPECT_EQ(condition(tj, "RegionDegraded", "message"),
            "london: 1/2 workers ready (a worker failed and is being restarted)");
  EXPECT_EQ(tj["status"]["state"], "Running");  // the job runs on
  EXPECT_EQ(tj["status"]["regionsReady"], "1/2");
  EXPECT_EQ(tj["status"]["regions"][0]["failed"], 1);
  EXPECT_EQ(r.requeue.after, std::chrono::milliseconds(10000));  // still watched
  expectNotFailed(tj);
  const std::string since = condition(tj, "RegionDegraded", "lastTransitionTime");

  // The replacement pod runs, loading its checkpoint: not ready yet.
  setJobStatus(*hub_, "world-london", {{"active", 2}, {"ready", 1}, {"failed", 1}});
  pass();
  tj = trainingJob();
  EXPECT_EQ(condition(tj, "RegionDegraded"), "True");
  EXPECT_EQ(condition(tj, "RegionDegraded", "lastTransitionTime"), since);
  expectNotFailed(tj);

  // It rejoined: every worker ready again.
  setJobStatus(*hub_, "world-london", {{"active", 2}, {"ready", 2}, {"failed", 1}});
  pass();
  tj = trainingJob();
  EXPECT_EQ(condition(tj, "RegionDegraded"), "False") << tj["status"].dump();
  EXPECT_EQ(condition(tj, "RegionDegraded", "reason"), "AllRegionsHealthy");
  EXPECT_EQ(tj["status"]["state"], "Running");
  EXPECT_EQ(tj["status"]["regionsReady"], "2/2");
  expectNotFailed(tj);

  // kubectl describe: when the region degraded, naming it, and when it recovered.
  events.flush();
  auto listed = hubClient_->list(res::kEvents, "ml");
  ASSERT_TRUE(listed.ok()) << listed.status().toString();
  std::map<std::string, json> byReason;
  for (const json& e : listed->items) byReason[e["reason"]] = e;
  ASSERT_TRUE(byReason.count("RegionDegraded")) << json(listed->items).dump();
  EXPECT_EQ(byReason["RegionDegraded"]["type"], "Warning");
  EXPECT_EQ(byReason["RegionDegraded"]["message"],
            "london: 1/2 workers ready (a worker failed and is being restarted)");
  EXPECT_EQ(byReason["RegionDegraded"]["count"], 1);
  EXPECT_EQ(byReason["RegionDegraded"]["involvedObject"]["name"], "world");
  ASSERT_TRUE(byReason.count("RegionRecovered"));
  EXPECT_EQ(byReason["RegionRecovered"]["type"], "Normal");
  EXPECT_NE(byReason["RegionRecovered"]["message"].get<std::string>().find("london: 1/2"),
            std::string::npos);
  EXPECT_FALSE(byReason.count("Failed"));
  reconciler_.reset();  // it holds `events`
}

// A region's Job that refuses what the spec renders now (its failure
// policy changed, or an earlier controller version created it) runs on as it
// is: the region stays reachable, its status counts to the end, and the
// refusal is an ApplyFailed Event.
TEST_F(ReconcilerTest, AJobThatRefusesANewSpecRunsOnAndStillCounts) {
  ImmutableJobsClient hub(*hubClient_);
  clusters_.clients["local"] = &hub;
  kube::EventRecorder events(*hubClient_, "geotrain-controller", "reconciler-test");
  ReconcilerOptions options;
  options.render.workerImage = "registry.example/worker:1";
  reconciler_ = std::make_unique<Reconciler>(*hubClient_, clusters_, &events, options, clock_);
  ASSERT_TRUE(hubClient_->create(kTrainingJobs, "ml", job(twoRegionsClusterIp())).ok());
  pass();
  ASSERT_EQ(get(*hubClient_, res::kJobs, "world-london")["spec"]["backoffLimitPerIndex"], 6);

  hub.refuseJobChanges = true;
  json tj = trainingJob();
  tj["spec"]["runPolicy"]["backoffLimitPerIndex"] = 3;
  ASSERT_TRUE(hubClient_->update(kTrainingJobs, "ml", tj).ok());
  setJobStatus(*hub_, "world-london", {{"active", 2}, {"ready", 2}});
  setJobStatus(*member_, "world-tokyo", {{"active", 1}, {"ready", 1}});
  ReconcileResult r = pass();
  EXPECT_FALSE(r.requeue.retry);
  EXPECT_EQ(r.report.regionReachable,
            (std::map<std::string, bool>{{"london", true}, {"tokyo", true}}));
  tj = trainingJob();
  EXPECT_EQ(tj["status"]["state"], "Running") << tj["status"].dump();
  EXPECT_EQ(condition(tj, "RegionDegraded"), "False");
  EXPECT_EQ(tj["status"]["regions"][0]["ready"], 2);
  EXPECT_EQ(get(*hubClient_, res::kJobs, "world-london")["spec"]["backoffLimitPerIndex"], 6);

  const json complete = {{"succeeded", 2},
                         {"conditions", {{{"type", "Complete"}, {"status", "True"}}}}};
  setJobStatus(*hub_, "world-london", complete);
  setJobStatus(*member_, "world-tokyo", complete);
  pass();
  EXPECT_EQ(trainingJob()["status"]["state"], "Succeeded");

  events.flush();
  auto listed = hubClient_->list(res::kEvents, "ml");
  ASSERT_TRUE(listed.ok()) << listed.status().toString();
  std::string applyFailed;
  for (const json& e : listed->items) {
    if (e["reason"] == "ApplyFailed") applyFailed = e["message"];
  }
  EXPECT_NE(applyFailed.find("region london: the Job keeps its current spec"), std::string::npos)
      << applyFailed;
  EXPECT_NE(applyFailed.find("field is immutable"), std::string::npos) << applyFailed;
  reconciler_.reset();  // it holds `events`
  clusters_.clients["local"] = hubClient_.get();
}

TEST_F(ReconcilerTest, SpecChangesReachTheRegionsAndObservedGenerationAdvances) {
  json spec = twoRegionsClusterIp();
  ASSERT_TRUE(hubClient_->create(kTrainingJobs, "ml", job(spec)).ok());
  pass();
  json tj = trainingJob();
  EXPECT_EQ(tj["status"]["observedGeneration"], tj["metadata"]["generation"]);
  const int64_t generation = tj["metadata"]["generation"];
  std::string yaml =
      get(*memberClient_, res::kConfigMaps, "world-tokyo-config")["data"]["worker.yaml"];
  EXPECT_NE(yaml.find("lr: 0.05"), std::string::npos);

  tj["spec"]["training"] = {{"lr", 0.2}, {"steps", 3000}};
  ASSERT_TRUE(hubClient_->update(kTrainingJobs, "ml", tj).ok());
  pass();
  tj = trainingJob();
  EXPECT_GT(tj["metadata"]["generation"].get<int64_t>(), generation);
  EXPECT_EQ(tj["status"]["observedGeneration"], tj["metadata"]["generation"]);
  for (const char* c : {"Created", "Running"}) {
    for (const json& cond : tj["status"]["conditions"]) {
      if (cond["type"] == c) {
        EXPECT_EQ(cond["observedGeneration"], tj["metadata"]["generation"]);
      }
    }
  }
  yaml = get(*memberClient_, res::kConfigMaps, "world-tokyo-config")["data"]["worker.yaml"];
  EXPECT_NE(yaml.find("lr: 0.2"), std::string::npos) << yaml;
  EXPECT_NE(yaml.find("steps: 3000"), std::string::npos) << yaml;
}

// Three clusters (the hub and two members) under API faults: 500s and 429s
// on reads, a 409 storm on the job's writes, and dropped watches. Passes
// that fail ask to be retried; the job converges all the same.
TEST_F(ReconcilerTest, ConvergesThroughApiFaultsAcrossThreeClusters) {
  testapi::ServerOptions o;
  o.tls = true;
  o.token = "reconciler-test";
  testapi::TestApiServer oregon(o);
  oregon.start();
  auto oregonClient = clientFor(oregon, dir_, "oregon");
  ASSERT_TRUE(
      oregonClient
          ->create(res::kNamespaces, "",
                   {{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", "ml"}}}})
          .ok());
  clusters_.clients["oregon"] = oregonClient.get();
  json spec = twoRegionsClusterIp();
  spec["regions"].push_back(
      {{"name", "oregon"}, {"cluster", "oregon"}, {"gateway", {{"serviceType", "ClusterIP"}}}});
  ASSERT_TRUE(hubClient_->create(kTrainingJobs, "ml", job(spec)).ok());

  hub_->faults().failNext(2, 500, "GET", "/trainingjobs");
  hub_->faults().conflictNextWrites("trainingjobs", "ml", "world", 3);
  member_->faults().failNext(2, 429, "", "", 1);
  oregon.faults().failNext(3, 500, "PATCH", "/services");
  oregon.faults().dropWatches();
  int passes = 0, failed = 0;
  std::string state;
  while (passes < 20 && state != "Pending") {
    ++passes;
    auto r = reconciler_->reconcile("ml", "world");
    if (!r.ok() || r->requeue.retry) {
      ++failed;
      continue;
    }
    state = r->report.state;
  }
  EXPECT_EQ(state, "Pending") << "after " << passes << " passes";
  EXPECT_GT(failed, 0) << "the faults were never hit";
  const json tj = trainingJob();
  EXPECT_EQ(condition(tj, "Created"), "True") << tj["status"].dump();
  EXPECT_EQ(condition(tj, "RegionDegraded"), "False") << tj["status"].dump();
  for (auto* c : {hubClient_.get(), memberClient_.get(), oregonClient.get()}) {
    kube::ListOptions selector;
    selector.labelSelector = "geotrain.io/job=world,app.kubernetes.io/component=worker";
    auto jobs = c->list(res::kJobs, "ml", selector);
    ASSERT_TRUE(jobs.ok());
    EXPECT_EQ(jobs->items.size(), 1u);
  }
  // Every region's config lists all four ranks; oregon is rank 3.
  const std::string yaml =
      get(*oregonClient, res::kConfigMaps, "world-oregon-config")["data"]["worker.yaml"];
  EXPECT_NE(yaml.find("rank: 3"), std::string::npos) << yaml;
  clusters_.clients.erase("oregon");
}

TEST(MemberFlag, ParsesAndRefuses) {
  auto m = parseMemberFlag("tokyo=geotrain-member-tokyo");
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->first, "tokyo");
  EXPECT_EQ(m->second.secret, "geotrain-member-tokyo");
  EXPECT_EQ(m->second.key, "kubeconfig");
  m = parseMemberFlag("ohio=s:config");
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->second.key, "config");
  for (const char* bad : {"tokyo", "=s", "tokyo=", "local=s", "Tokyo=s", "a=s:"}) {
    auto r = parseMemberFlag(bad);
    EXPECT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("NAME=SECRET"), std::string::npos) << bad;
  }
}

TEST_F(ReconcilerTest, SecretClustersReadsMemberKubeconfigsFromSecrets) {
  SecretClusters clusters(*hubClient_, "ml", {{"tokyo", {"member-tokyo", "kubeconfig"}}}, {},
                          std::chrono::milliseconds(0));
  EXPECT_EQ(*clusters.client("local"), hubClient_.get());
  auto unknown = clusters.client("ohio");
  EXPECT_NE(unknown.status().message().find("cluster ohio is not a member"), std::string::npos)
      << unknown.status().message();
  EXPECT_EQ(unknown.status().message().find("--member"), std::string::npos);
  EXPECT_EQ(clusters.known(), (std::vector<std::string>{"local", "tokyo"}));
  auto missing = clusters.client("tokyo");
  EXPECT_NE(missing.status().message().find("member tokyo: Secret ml/member-tokyo"),
            std::string::npos)
      << missing.status().message();
  const fs::path path = dir_ / "tokyo.kubeconfig";
  std::ifstream in(path);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_TRUE(hubClient_
                  ->create(res::kSecrets, "ml",
                           {{"apiVersion", "v1"},
                            {"kind", "Secret"},
                            {"metadata", {{"name", "member-tokyo"}}},
                            {"stringData", {{"kubeconfig", text}}}})
                  .ok());
  // As on a real server, stringData is stored as base64 data.
  const json stored = get(*hubClient_, res::kSecrets, "member-tokyo");
  EXPECT_FALSE(stored.contains("stringData"));
  EXPECT_TRUE(stored["data"].contains("kubeconfig"));
  auto tokyo = clusters.client("tokyo");
  ASSERT_TRUE(tokyo.ok()) << tokyo.status().toString();
  EXPECT_TRUE((*tokyo)->get(res::kNamespaces, "", "ml").ok());  // the member answers
}

// A key rotation (annotation geotrain.io/rotate-keys; docs/security.md,
// "Rotating keys") goes through its phases, each once every region has
// its files and keyRotationStep has passed: the next keys in every region
// (each secret key in its own region only), then every rank's new pair
// with its old public key as previous, then the old keys gone; the status
// says where it is and since when, and the pod template projects the
// rotation's files where they exist.
TEST_F(ReconcilerTest, KeyRotationGoesThroughItsPhasesAndSaysWhenDone) {
  ASSERT_TRUE(hubClient_->create(kTrainingJobs, "ml", job(twoRegionsClusterIp())).ok());
  pass();
  const auto secretOf = [&](kube::KubeClient& c, const std::string& region, const std::string& f) {
    const json s = get(c, res::kSecrets, "world-" + region + "-keys");
    if (!s["data"].contains(f)) return std::string();
    std::string text = *kube::decodeBase64(s["data"][f].get<std::string>());
    return text.substr(0, text.find('\n'));
  };
  const auto publicIn = [&](kube::KubeClient& c, const std::string& region, const std::string& f) {
    const json cm = get(c, res::kConfigMaps, "world-" + region + "-config");
    if (!cm["data"].contains(f)) return std::string();
    const std::string text = cm["data"][f];
    return text.substr(0, text.find('\n'));
  };
  const std::string oldSecret = secretOf(*memberClient_, "tokyo", "worker-2.key");
  const std::string oldPublic = publicIn(*hubClient_, "london", "worker-2.pub");
  ASSERT_EQ(*keys::publicKeyOf(oldSecret), oldPublic);
  // The pod template projects the rotation's public keys, optionally.
  const json tokyoJob = get(*memberClient_, res::kJobs, "world-tokyo");
  const json sources = tokyoJob["spec"]["template"]["spec"]["volumes"][1]["projected"]["sources"];
  ASSERT_EQ(sources.size(), 3u);
  EXPECT_EQ(sources[1]["configMap"]["optional"], true);
  EXPECT_EQ(sources[1]["configMap"]["items"][0]["key"], "worker-0.next.pub");

  json tj = trainingJob();
  tj["metadata"]["annotations"]["geotrain.io/rotate-keys"] = "2026-11-27";
  ASSERT_TRUE(hubClient_->update(kTrainingJobs, "ml", tj).ok());
  const auto rotation = [&] { return trainingJob()["status"]["keyRotation"]; };

  // Admitting: every rank's next public key in every region, its next
  // secret key in its own region's Secret only.
  ReconcileResult r = pass();
  EXPECT_EQ(rotation()["phase"], "Admitting");
  EXPECT_EQ(rotation()["request"], "2026-11-27");
  EXPECT_FALSE(rotation()["phaseSince"].get<std::string>().empty());
  const std::string nextSecret = secretOf(*memberClient_, "tokyo", "worker-2.next.key");
  ASSERT_FALSE(nextSecret.empty());
  const std::string nextPublic = *keys::publicKeyOf(nextSecret);
  EXPECT_EQ(publicIn(*hubClient_, "london", "worker-2.next.pub"), nextPublic);
  EXPECT_EQ(publicIn(*memberClient_, "tokyo", "worker-2.next.pub"), nextPublic);
  EXPECT_EQ(secretOf(*hubClient_, "london", "worker-2.next.key"), "");
  EXPECT_EQ(secretOf(*memberClient_, "tokyo", "worker-2.key"), oldSecret);
  ASSERT_TRUE(r.requeue.after.has_value());
  EXPECT_LE(*r.requeue.after, std::chrono::seconds(150));
  // Nothing moves before the step is up.
  clock_.advance(std::chrono::seconds(100));
  pass();
  EXPECT_EQ(rotation()["phase"], "Admitting");
  EXPECT_EQ(secretOf(*memberClient_, "tokyo", "worker-2.next.key"), nextSecret);

  // Switching: the new pair in place, the old public key as previous.
  clock_.advance(std::chrono::seconds(60));
  pass();
  EXPECT_EQ(rotation()["phase"], "Switching");
  EXPECT_EQ(secretOf(*memberClient_, "tokyo", "worker-2.key"), nextSecret);
  EXPECT_EQ(secretOf(*memberClient_, "tokyo", "worker-2.next.key"), "");
  EXPECT_EQ(publicIn(*hubClient_, "london", "worker-2.pub"), nextPublic);
  EXPECT_EQ(publicIn(*hubClient_, "london", "worker-2.previous.pub"), oldPublic);
  EXPECT_EQ(publicIn(*hubClient_, "london", "worker-2.next.pub"), "");
  // London's ranks switched too, each to its own new key.
  EXPECT_NE(publicIn(*memberClient_, "tokyo", "worker-0.pub"),
            publicIn(*memberClient_, "tokyo", "worker-0.previous.pub"));

  // Retiring, then Done: the old keys gone everywhere.
  clock_.advance(std::chrono::seconds(150));
  pass();
  EXPECT_EQ(rotation()["phase"], "Retiring");
  EXPECT_EQ(publicIn(*hubClient_, "london", "worker-2.previous.pub"), "");
  EXPECT_EQ(publicIn(*memberClient_, "tokyo", "worker-2.previous.pub"), "");
  EXPECT_EQ(secretOf(*memberClient_, "tokyo", "worker-2.previous.pub"), "");
  clock_.advance(std::chrono::seconds(150));
  pass();
  EXPECT_EQ(rotation()["phase"], "Done");
  EXPECT_EQ(publicIn(*hubClient_, "london", "worker-2.pub"), nextPublic);
  EXPECT_EQ(secretOf(*memberClient_, "tokyo", "worker-2.key"), nextSecret);
  // Done stays done; the same request again starts nothing.
  clock_.advance(std::chrono::seconds(150));
  pass();
  EXPECT_EQ(rotation()["phase"], "Done");
  EXPECT_EQ(secretOf(*memberClient_, "tokyo", "worker-2.key"), nextSecret);
}

// A phase waits while a region cannot be reached: its files are written
// on the pass that reaches it, and only then does the phase's time start.
TEST_F(ReconcilerTest, KeyRotationWaitsForEveryRegion) {
  ASSERT_TRUE(hubClient_->create(kTrainingJobs, "ml", job(twoRegionsClusterIp())).ok());
  pass();
  json tj = trainingJob();
  tj["metadata"]["annotations"]["geotrain.io/rotate-keys"] = "first";
  ASSERT_TRUE(hubClient_->update(kTrainingJobs, "ml", tj).ok());
  clusters_.clients["tokyo"] = nullptr;
  pass();
  const auto rotation = [&] { return trainingJob()["status"]["keyRotation"]; };
  EXPECT_EQ(rotation()["phase"], "Admitting");
  EXPECT_FALSE(rotation().contains("phaseSince"));
  clock_.advance(std::chrono::seconds(600));
  pass();
  EXPECT_EQ(rotation()["phase"], "Admitting") << "a phase went on without tokyo";
  clusters_.clients["tokyo"] = memberClient_.get();
  pass();
  EXPECT_EQ(rotation()["phase"], "Admitting");
  EXPECT_TRUE(rotation().contains("phaseSince"));
  const json cm = get(*memberClient_, res::kConfigMaps, "world-tokyo-config");
  EXPECT_TRUE(cm["data"].contains("worker-0.next.pub"));
}

}  // namespace
}  // namespace geo::reconcile
