#include "controller/api/training_job.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

namespace geo::api {
namespace {

using nlohmann::json;

json object(const json& spec) {
  return {{"apiVersion", "geotrain.io/v1alpha1"},
          {"kind", "TrainingJob"},
          {"metadata", {{"name", "world"}, {"namespace", "default"}}},
          {"spec", spec}};
}

json minimal() {
  return {{"regions", {{{"name", "london"}}}}};
}

std::vector<std::string> messages(const ParsedSpec& p) {
  std::vector<std::string> out;
  for (const auto& e : p.errors) out.push_back(e.toString());
  return out;
}

TEST(TrainingJobSpec, MinimalSpecTakesEveryDefault) {
  const ParsedSpec p = parseSpec(object(minimal()));
  ASSERT_TRUE(p.errors.empty()) << joinErrors(p.errors);
  ASSERT_EQ(p.spec.regions.size(), 1u);
  const Region& r = p.spec.regions[0];
  EXPECT_EQ(r.name, "london");
  EXPECT_EQ(r.cluster, "local");
  EXPECT_EQ(r.replicas, 1);
  EXPECT_EQ(r.gateway.serviceType, "LoadBalancer");
  EXPECT_EQ(r.gateway.port, 7000);
  EXPECT_EQ(p.spec.runPolicy.backoffLimitPerIndex, 6);
  EXPECT_FALSE(p.spec.runPolicy.backoffLimit.has_value());  // only the per-worker limit
  EXPECT_FALSE(p.spec.runPolicy.suspend);
  // The worker sections are worker.yaml's defaults, except the algorithm.
  WorkerConfig expected;
  expected.sync.algorithm = "dts";
  EXPECT_EQ(p.spec.worker, expected);
  EXPECT_EQ(p.spec.dataPath(r), expected.dataset.path);
}

json world() {
  return {{"image", "registry.example/geotrain-worker:0.1"},
          {"seed", 7},
          {"model", {{"builtin", "cnn"}}},
          {"dataset", {{"name", "fashion-mnist"}, {"path", "/data/fmnist"}}},
          {"training", {{"steps", 5000}, {"batchSize", 128}, {"lr", 0.1}, {"weightDecay", 0.0005}}},
          {"sync",
           {{"algorithm", "dts"},
            {"period", 8},
            {"delay", "auto"},
            {"codec", "qsgd"},
            {"bits", 4},
            {"timeoutSeconds", 2.5}}},
          {"checkpoint", {{"dir", "/ckpt"}, {"interval", 250}}},
          {"regions",
           {{{"name", "london"},
             {"cluster", "eu-cluster"},
             {"replicas", 2},
             {"resources", {{"limits", {{"nvidia.com/gpu", 1}}}}},
             {"nodeSelector", {{"gpu", "h100"}}},
             {"tolerations", {{{"key", "gpu"}, {"operator", "Exists"}}}},
             {"gateway", {{"serviceType", "NodePort"}, {"endpoint", "london.example.org:31000"}}}},
            {{"name", "tokyo"}, {"replicas", 2}, {"dataPath", "/mnt/tokyo"}}}},
          {"runPolicy",
           {{"backoffLimitPerIndex", 2},
            {"backoffLimit", 1},
            {"activeDeadlineSeconds", 7200},
            {"ttlSecondsAfterFinished", 0}}}};
}

TEST(TrainingJobSpec, FullSpecIsReadFieldByField) {
  const ParsedSpec p = parseSpec(object(world()));
  ASSERT_TRUE(p.errors.empty()) << joinErrors(p.errors);
  const TrainingJobSpec& s = p.spec;
  EXPECT_EQ(s.image, "registry.example/geotrain-worker:0.1");
  EXPECT_EQ(s.worker.job.seed, 7u);
  EXPECT_EQ(s.worker.model.builtin, "cnn");
  EXPECT_EQ(s.worker.training.steps, 5000);
  EXPECT_EQ(s.worker.training.batchSize, 128);
  EXPECT_DOUBLE_EQ(s.worker.training.weightDecay, 0.0005);
  EXPECT_FALSE(s.worker.sync.delay.has_value());  // auto
  EXPECT_DOUBLE_EQ(s.worker.sync.timeoutSeconds, 2.5);
  EXPECT_EQ(s.worker.checkpoint.dir, "/ckpt");
  ASSERT_EQ(s.regions.size(), 2u);
  EXPECT_EQ(s.regions[0].cluster, "eu-cluster");
  EXPECT_EQ(s.regions[0].pod.resources["limits"]["nvidia.com/gpu"], 1);
  EXPECT_EQ(s.regions[0].pod.nodeSelector.at("gpu"), "h100");
  EXPECT_EQ(s.regions[0].pod.tolerations.size(), 1u);
  EXPECT_EQ(s.regions[0].gateway.serviceType, "NodePort");
  EXPECT_EQ(s.regions[0].gateway.endpoint, "london.example.org:31000");
  EXPECT_EQ(s.dataPath(s.regions[0]), "/data/fmnist");
  EXPECT_EQ(s.dataPath(s.regions[1]), "/mnt/tokyo");
  EXPECT_EQ(s.totalReplicas(), 4);
  EXPECT_EQ(s.runPolicy.backoffLimitPerIndex, 2);
  EXPECT_EQ(s.runPolicy.backoffLimit, 1);
  EXPECT_EQ(s.runPolicy.activeDeadlineSeconds, 7200);
  EXPECT_EQ(s.runPolicy.ttlSecondsAfterFinished, 0);
}

TEST(TrainingJobSpec, CheckpointVolume) {
  json spec = minimal();
  spec["checkpoint"] = {{"dir", "/ckpt"}};
  spec["checkpointVolume"] = {{"size", "1.5Ti"}, {"storageClassName", "fast.example.com"}};
  const ParsedSpec p = parseSpec(object(spec));
  ASSERT_TRUE(p.errors.empty()) << joinErrors(p.errors);
  ASSERT_TRUE(p.spec.checkpointVolume.has_value());
  EXPECT_EQ(p.spec.checkpointVolume->size, "1.5Ti");
  EXPECT_EQ(p.spec.checkpointVolume->accessModeFor(1), "ReadWriteOnce");
  EXPECT_EQ(p.spec.checkpointVolume->accessModeFor(2), "ReadWriteMany");
  CheckpointVolume pinned = *p.spec.checkpointVolume;
  pinned.accessMode = "ReadWriteOncePod";
  EXPECT_EQ(pinned.accessModeFor(2), "ReadWriteOncePod");
  EXPECT_EQ(specToJson(p.spec)["checkpointVolume"],
            json({{"size", "1.5Ti"}, {"storageClassName", "fast.example.com"}}));
  EXPECT_EQ(parseSpec(object(specToJson(p.spec))).spec, p.spec);
  EXPECT_FALSE(parseSpec(object(minimal())).spec.checkpointVolume.has_value());
  EXPECT_FALSE(specToJson(parseSpec(object(minimal())).spec).contains("checkpointVolume"));
}

TEST(TrainingJobSpec, DefaultsWrittenOutReadBackTheSame) {
  for (const json& spec : {minimal(), world()}) {
    const ParsedSpec p = parseSpec(object(spec));
    ASSERT_TRUE(p.errors.empty()) << joinErrors(p.errors);
    const json written = specToJson(p.spec);
    EXPECT_EQ(written["sync"]["algorithm"], "dts");
    EXPECT_TRUE(written["training"]["lr"].is_number());
    // As worker.yaml writes them: a number without a fraction as an integer.
    EXPECT_EQ(written["sync"]["timeoutSeconds"].dump(), spec == world() ? "2.5" : "60");
    EXPECT_EQ(written["training"]["lr"].dump(), spec == world() ? "0.1" : "0.05");
    EXPECT_EQ(written["sync"]["delay"], "auto");
    EXPECT_TRUE(written["sync"]["errorFeedback"].is_boolean());
    EXPECT_FALSE(written["dataset"].contains("shardIndex"));  // the controller's
    EXPECT_EQ(written["transport"], json({{"tcpInitialWindow", 0}, {"connections", 1}}));
    const ParsedSpec again = parseSpec(object(written));
    ASSERT_TRUE(again.errors.empty()) << joinErrors(again.errors) << "\n" << written.dump(2);
    EXPECT_EQ(again.spec, p.spec) << written.dump(2);
  }
}

// A number key takes any finite number; a large one is read and written back
// as a number (it fits no integer).
TEST(TrainingJobSpec, LargeNumbersStayNumbers) {
  json spec = minimal();
  spec["training"] = {{"lr", 1e300}, {"steps", 3.0}};
  const ParsedSpec p = parseSpec(object(spec));
  ASSERT_TRUE(p.errors.empty()) << joinErrors(p.errors);
  EXPECT_EQ(p.spec.worker.training.lr, 1e300);
  EXPECT_EQ(p.spec.worker.training.steps, 3);
  const json written = specToJson(p.spec);
  EXPECT_EQ(written["training"]["lr"].get<double>(), 1e300);
  EXPECT_EQ(written["training"]["steps"].dump(), "3");
}

struct BadCase {
  json patch;  // merged into the minimal spec
  std::string expected;
};

class TrainingJobSpecError : public ::testing::TestWithParam<BadCase> {};

TEST_P(TrainingJobSpecError, NamesPathValueAndAllowed) {
  json spec = minimal();
  spec.merge_patch(GetParam().patch);
  const ParsedSpec p = parseSpec(object(spec));
  const std::string all = joinErrors(p.errors);
  EXPECT_NE(all.find(GetParam().expected), std::string::npos)
      << "errors: " << all << "\nexpected to contain: " << GetParam().expected;
}

INSTANTIATE_TEST_SUITE_P(
    Cases, TrainingJobSpecError,
    ::testing::Values(
        BadCase{{{"sync", {{"bits", 3}}}}, "spec.sync.bits: 3 is not allowed (allowed: 2, 4, 8)"},
        // The QSGD kernels' limit (kernels/qsgd_limits.h), not only >= 1.
        BadCase{{{"sync", {{"bucket", 2147483648LL}}}},
                "spec.sync.bucket: 2147483648 is not allowed (allowed: an integer "
                "1..1073741824)"},
        BadCase{{{"sync", {{"bucket", 0}}}},
                "spec.sync.bucket: 0 is not allowed (allowed: an integer 1..1073741824)"},
        BadCase{{{"sync", {{"algorithm", "ring"}}}}, "spec.sync.algorithm: ring is not allowed"},
        BadCase{{{"sync", {{"delay", -1}}}}, "spec.sync.delay: -1 is not allowed"},
        BadCase{{{"sync", {{"delay", "soon"}}}},
                "spec.sync.delay: \"soon\" is not allowed (allowed: an integer, or auto)"},
        BadCase{{{"sync", {{"period", 0}}}}, "spec.sync.period: 0 is not allowed"},
        BadCase{{{"training", {{"lr", "fast"}}}},
                "spec.training.lr: \"fast\" is not allowed (allowed: a number)"},
        BadCase{{{"training", {{"steps", 1.5}}}},
                "spec.training.steps: 1.5 is not allowed (allowed: an integer)"},
        BadCase{{{"training", {{"lrr", 0.1}}}},
                "spec.training.lrr: unknown key (allowed: steps, batchSize, optimizer, lr, "},
        BadCase{{{"training", {{"lrr", 0.1}}}}, "; did you mean 'lr'?"},
        // Unknown whatever its value is.
        BadCase{{{"training", {{"lrr", {{"a", 1}}}}}}, "spec.training.lrr: unknown key"},
        // Too large for any integer: refused, not cast.
        BadCase{{{"training", {{"steps", 1e300}}}},
                "spec.training.steps: 1e+300 is not allowed (allowed: an integer)"},
        BadCase{{{"sync", {{"bits", json::array({4})}}}},
                "spec.sync.bits: [4] is not allowed (allowed: an integer)"},
        // Between keys, named by the key the worker's schema names.
        BadCase{{{"dataset", {{"name", "tokens"}, {"path", "/data"}}}},
                "spec.training.loss: cross-entropy is not allowed with dataset.name: tokens "
                "(allowed: next-token)"},
        BadCase{{{"dataset", {{"shardIndex", 1}}}}, "spec.dataset.shardIndex: unknown field"},
        // Of transport, only the initial window and the connections are the spec's.
        BadCase{{{"transport", {{"peers", json::array({"tcp://a:7000"})}}}},
                "spec.transport.peers: unknown field (the controller sets the workers' "
                "endpoints, regions and keys; of transport, a TrainingJob sets "
                "tcpInitialWindow and connections)"},
        BadCase{{{"transport", {{"tcpInitialWindow", 5000}}}},
                "spec.transport.tcpInitialWindow: 5000"},
        BadCase{{{"transport", {{"connections", 17}}}}, "spec.transport.connections: 17"},
        BadCase{{{"dataset", {{"name", "npy"}, {"path", ""}}}},
                "spec.regions[0].dataPath: Required value"},
        BadCase{{{"model", {{"builtin", "mlp"}, {"torchscript", "/m.pt"}}}},
                "spec.model: both builtin and torchscript are set"},
        BadCase{{{"worker", {{"rank", 1}}}}, "spec.worker: unknown field (allowed: image, seed"},
        BadCase{{{"seed", -1}}, "spec.seed: -1 is not allowed (allowed: an integer >= 0)"},
        BadCase{{{"regions", json::array()}}, "spec.regions: Required value"},
        BadCase{{{"regions", {{{"replicas", 2}}}}}, "spec.regions[0].name: Required value"},
        BadCase{{{"regions", {{{"name", "London"}}}}},
                "spec.regions[0].name: \"London\" is not allowed (allowed: a DNS label: lowercase "
                "letters, digits and '-'"},
        BadCase{{{"regions", {{{"name", "a"}}, {{"name", "a"}}}}},
                "spec.regions[1].name: Duplicate value: \"a\""},
        BadCase{{{"regions", {{{"name", "a"}, {"replicas", 0}}}}},
                "spec.regions[0].replicas: 0 is not allowed (allowed: an integer 1..4096)"},
        BadCase{{{"regions", {{{"name", "a"}, {"gateway", {{"serviceType", "Ingress"}}}}}}},
                "spec.regions[0].gateway.serviceType: \"Ingress\" is not allowed (allowed: "
                "ClusterIP, NodePort, LoadBalancer)"},
        BadCase{{{"regions", {{{"name", "a"}, {"gateway", {{"endpoint", "host"}}}}}}},
                "spec.regions[0].gateway.endpoint: \"host\" is not allowed"},
        BadCase{{{"regions", {{{"name", "a"}, {"gateway", {{"port", 70000}}}}}}},
                "spec.regions[0].gateway.port: 70000 is not allowed (allowed: an integer "
                "1..65535)"},
        BadCase{{{"regions", {{{"name", "a"}, {"nodeSelector", {{"gpu", 1}}}}}}},
                "spec.regions[0].nodeSelector: must be an object of string values"},
        BadCase{{{"regions", {{{"name", "a"}, {"zone", "x"}}}}},
                "spec.regions[0].zone: unknown field"},
        BadCase{{{"regions", {{{"name", "a"}, {"gateway", {{"serviceType", "NodePort"}}}}}}},
                "spec.regions[0].gateway.endpoint: Required value (a NodePort gateway"},
        BadCase{{{"regions",
                  {{{"name", "a"},
                    {"gateway", {{"serviceType", "NodePort"}, {"endpoint", "n1.example:7000"}}}}}}},
                "spec.regions[0].gateway.endpoint: port 7000 is not allowed for a NodePort "
                "gateway (allowed: 30000..32767"},
        BadCase{{{"sync", {{"hierarchical", false}}},
                 {"regions", {{{"name", "a"}, {"replicas", 2}}, {{"name", "b"}}}}},
                "spec.sync.hierarchical: false is not allowed when a region has several "
                "replicas"},
        BadCase{{{"runPolicy", {{"backoffLimit", -1}}}},
                "spec.runPolicy.backoffLimit: -1 is not allowed (allowed: an integer "
                "0..2147483647)"},
        BadCase{{{"runPolicy", {{"backoffLimit", 2147483648LL}}}},
                "spec.runPolicy.backoffLimit: 2147483648 is not allowed (allowed: an integer "
                "0..2147483647)"},
        BadCase{{{"runPolicy", {{"backoffLimitPerIndex", -1}}}},
                "spec.runPolicy.backoffLimitPerIndex: -1 is not allowed (allowed: an integer "
                "0..2147483647)"},
        BadCase{{{"runPolicy", {{"backoffLimitPerIndex", 2147483648LL}}}},
                "spec.runPolicy.backoffLimitPerIndex: 2147483648 is not allowed"},
        BadCase{{{"runPolicy", {{"backoffLimitPerIndex", "6"}}}},
                "spec.runPolicy.backoffLimitPerIndex: \"6\" is not allowed (allowed: an "
                "integer)"},
        BadCase{{{"runPolicy", {{"maxFailedIndexes", 1}}}},
                "spec.runPolicy.maxFailedIndexes: unknown field"},
        BadCase{{{"runPolicy", {{"activeDeadlineSeconds", 0}}}},
                "spec.runPolicy.activeDeadlineSeconds: 0 is not allowed"},
        BadCase{{{"ttlSecondsAfterFinished", -1}},
                "spec.ttlSecondsAfterFinished: -1 is not allowed (allowed: an integer >= 0)"},
        BadCase{{{"runPolicy", {{"suspend", "yes"}}}},
                "spec.runPolicy.suspend: \"yes\" is not allowed (allowed: true, false)"},
        BadCase{{{"checkpointVolume", {{"size", "20Gi"}}}},
                "spec.checkpoint.dir: Required value (spec.checkpointVolume is mounted there"},
        BadCase{{{"checkpoint", {{"dir", "/c"}}}, {"checkpointVolume", json::object()}},
                "spec.checkpointVolume.size: Required value (a quantity of storage, e.g. 20Gi)"},
        BadCase{{{"checkpoint", {{"dir", "/c"}}}, {"checkpointVolume", {{"size", "20GB"}}}},
                "spec.checkpointVolume.size: \"20GB\" is not allowed (allowed: a quantity of "
                "storage, e.g. 20Gi or 500M)"},
        BadCase{{{"checkpoint", {{"dir", "/c"}}}, {"checkpointVolume", {{"size", "0"}}}},
                "spec.checkpointVolume.size: \"0\" is not allowed"},
        BadCase{{{"checkpoint", {{"dir", "/c"}}},
                 {"checkpointVolume", {{"size", "1Gi"}, {"accessMode", "RWX"}}}},
                "spec.checkpointVolume.accessMode: \"RWX\" is not allowed (allowed: "
                "ReadWriteOnce, ReadWriteMany, ReadWriteOncePod"},
        BadCase{{{"checkpoint", {{"dir", "/c"}}},
                 {"checkpointVolume", {{"size", "1Gi"}, {"storageClassName", "Fast_SSD"}}}},
                "spec.checkpointVolume.storageClassName: \"Fast_SSD\" is not allowed"},
        BadCase{{{"checkpoint", {{"dir", "/c"}}},
                 {"checkpointVolume", {{"size", "1Gi"}, {"class", "x"}}}},
                "spec.checkpointVolume.class: unknown field"},
        // The pod fields: nothing of the worker's own may be overridden.
        BadCase{{{"template", {{"spec", {{"env", {{{"name", "JOB_COMPLETION_INDEX"}}}}}}}}},
                "spec.template.spec.env[0].name: \"JOB_COMPLETION_INDEX\" is not allowed (the "
                "worker container has it already)"},
        BadCase{{{"template",
                  {{"spec", {{"env", {{{"name", "A"}, {"value", "1"}}, {{"name", "A"}}}}}}}}},
                "spec.template.spec.env[1].name: Duplicate value: \"A\""},
        BadCase{{{"template", {{"spec", {{"env", {{{"value", "1"}}}}}}}}},
                "spec.template.spec.env[0].name: Required value"},
        BadCase{
            {{"regions",
              {{{"name", "a"}, {"volumes", {{{"name", "keys"}, {"emptyDir", json::object()}}}}}}}},
            "spec.regions[0].volumes[0].name: \"keys\" is not allowed (the worker container "
            "has it already)"},
        BadCase{{{"regions", {{{"name", "a"}, {"volumes", {{{"name", "Data"}}}}}}}},
                "spec.regions[0].volumes[0].name: \"Data\" is not allowed (allowed: a DNS label: "
                "lowercase letters"},
        BadCase{{{"template",
                  {{"spec",
                    {{"volumes", {{{"name", "d"}, {"emptyDir", json::object()}}}},
                     {"volumeMounts", {{{"name", "d"}, {"mountPath", "/tmp"}}}}}}}}},
                "spec.template.spec.volumeMounts[0].mountPath: \"/tmp\" is not allowed (the "
                "worker container has it already)"},
        BadCase{
            {{"template", {{"spec", {{"volumeMounts", {{{"name", "d"}, {"mountPath", "x"}}}}}}}}},
            "spec.template.spec.volumeMounts[0].mountPath: \"x\" is not allowed (allowed: an "
            "absolute path of at most 1024 characters)"},
        BadCase{{{"checkpoint", {{"dir", "/ckpt"}}},
                 {"template",
                  {{"spec",
                    {{"volumes", {{{"name", "d"}, {"emptyDir", json::object()}}}},
                     {"volumeMounts", {{{"name", "d"}, {"mountPath", "/ckpt"}}}}}}}}},
                "spec.template.spec.volumeMounts[0].mountPath: \"/ckpt\" is not allowed "
                "(spec.checkpoint.dir"},
        BadCase{
            {{"template", {{"spec", {{"volumeMounts", {{{"name", "d"}, {"mountPath", "/d"}}}}}}}}},
            "spec.template.spec.volumeMounts[0].name: \"d\" is not allowed (region london has "
            "no such volume"},
        BadCase{{{"template", {{"metadata", {{"labels", {{"geotrain.io/job", "x"}}}}}}}},
                "spec.template.metadata.labels.geotrain.io/job: \"geotrain.io/job\" is not allowed "
                "(a label key of the controller"},
        BadCase{{{"regions", {{{"name", "a"}, {"annotations", {{"prometheus.io/port", "1"}}}}}}},
                "spec.regions[0].annotations.prometheus.io/port: \"prometheus.io/port\" is not "
                "allowed"},
        BadCase{{{"template", {{"spec", {{"serviceAccountName", "Trainer"}}}}}},
                "spec.template.spec.serviceAccountName: \"Trainer\" is not allowed"},
        BadCase{{{"template", {{"spec", {{"containers", json::array()}}}}}},
                "spec.template.spec.containers: unknown field"},
        BadCase{{{"regions", {{{"name", "a"}, {"affinity", json::array()}}}}},
                "spec.regions[0].affinity: a list is not allowed"},
        BadCase{{{"template",
                  {{"spec", {{"sysctls", {{{"name", "net.ipv4..tcp_rmem"}, {"value", "1"}}}}}}}}},
                "spec.template.spec.sysctls[0].name: \"net.ipv4..tcp_rmem\" is not allowed "
                "(allowed: a sysctl name"},
        BadCase{{{"regions", {{{"name", "a"}, {"sysctls", {{{"name", "net.core.somaxconn"}}}}}}}},
                "spec.regions[0].sysctls[0].value: Required value (a string"},
        BadCase{{{"regions",
                  {{{"name", "a"},
                    {"sysctls",
                     {{{"name", "net.ipv4.tcp_rmem"}, {"value", "1"}},
                      {{"name", "net.ipv4.tcp_rmem"}, {"value", "2"}}}}}}}},
                "spec.regions[0].sysctls[1].name: Duplicate value: \"net.ipv4.tcp_rmem\""},
        // training.device and the GPUs the pods ask for.
        BadCase{{{"training", {{"device", "cuda"}}}},
                "spec.training.device: cuda is not allowed: the pods of london (spec.regions[0]) "
                "ask for no GPU (allowed: auto, which is cuda in the regions whose resources ask "
                "for nvidia.com/gpu and the CPU in the others; cpu; or cuda with "
                "resources.limits nvidia.com/gpu: 1 in spec.template.spec or in every region)"},
        BadCase{{{"regions",
                  {{{"name", "a"}, {"resources", {{"limits", {{"nvidia.com/gpu", "one"}}}}}}}}},
                "spec.regions[0].resources.limits.nvidia.com/gpu: \"one\" is not allowed "
                "(allowed: a whole number of GPUs, e.g. 1)"},
        BadCase{{{"template",
                  {{"spec", {{"resources", {{"requests", {{"nvidia.com/mig-1g.10gb", -1}}}}}}}}}},
                "spec.template.spec.resources.requests.nvidia.com/mig-1g.10gb: -1 is not allowed "
                "(allowed: a whole number of GPUs, e.g. 1)"},
        BadCase{{{"regions",
                  {{{"name", "a"}, {"resources", {{"limits", {{"nvidia.com/gpu", 0.5}}}}}}}}},
                "spec.regions[0].resources.limits.nvidia.com/gpu: 0.5 is not allowed"}));

// training.device of each region's workers: cuda where its pods ask for a
// GPU and the spec says auto; the spec's cpu or cuda everywhere else.
TEST(TrainingJobSpec, DeviceFollowsTheGpuRequest) {
  const json gpu = {{"limits", {{"nvidia.com/gpu", 1}}}};
  json spec = minimal();
  spec["regions"] = {
      {{"name", "whole"}, {"resources", gpu}},
      {{"name", "cpu"}, {"resources", {{"limits", {{"cpu", "4"}}}}}},
      {{"name", "requested"}, {"resources", {{"requests", {{"nvidia.com/gpu", "2"}}}}}},
      {{"name", "mig"}, {"resources", {{"limits", {{"nvidia.com/mig-3g.40gb", 1}}}}}},
      {{"name", "shared"}, {"resources", {{"limits", {{"nvidia.com/gpu.shared", 1}}}}}},
      {{"name", "zero"}, {"resources", {{"limits", {{"nvidia.com/gpu", 0}}}}}},
      {{"name", "other"}, {"resources", {{"limits", {{"example.com/gpu", 1}}}}}},
      {{"name", "none"}}};
  ParsedSpec p = parseSpec(object(spec));
  ASSERT_TRUE(p.errors.empty()) << joinErrors(p.errors);
  std::map<std::string, std::string> devices;
  for (const Region& r : p.spec.regions) devices[r.name] = p.spec.deviceFor(r);
  EXPECT_EQ(devices, (std::map<std::string, std::string>{{"whole", "cuda"},
                                                         {"cpu", "auto"},
                                                         {"requested", "cuda"},
                                                         {"mig", "cuda"},
                                                         {"shared", "cuda"},
                                                         {"zero", "auto"},
                                                         {"other", "auto"},
                                                         {"none", "auto"}}));

  // The user's cpu stays cpu, on GPUs too.
  spec["training"] = {{"device", "cpu"}};
  p = parseSpec(object(spec));
  ASSERT_TRUE(p.errors.empty()) << joinErrors(p.errors);
  for (const Region& r : p.spec.regions) EXPECT_EQ(p.spec.deviceFor(r), "cpu") << r.name;

  // cuda: one error on spec.training.device naming every region without a GPU.
  spec["training"] = {{"device", "cuda"}};
  p = parseSpec(object(spec));
  ASSERT_EQ(p.errors.size(), 1u) << joinErrors(p.errors);
  EXPECT_EQ(p.errors[0].path, "spec.training.device");
  EXPECT_NE(p.errors[0].detail.find("the pods of cpu (spec.regions[1]), zero (spec.regions[5]), "
                                    "other (spec.regions[6]), none (spec.regions[7]) ask for no "
                                    "GPU"),
            std::string::npos)
      << p.errors[0].detail;

  // The template's GPU reaches every region, except one whose resources
  // replace the template's.
  spec["template"] = {{"spec", {{"resources", gpu}}}};
  spec["regions"] = {{{"name", "a"}}, {{"name", "b"}, {"resources", {{"limits", {{"cpu", "4"}}}}}}};
  p = parseSpec(object(spec));
  ASSERT_EQ(p.errors.size(), 1u) << joinErrors(p.errors);
  EXPECT_NE(p.errors[0].detail.find("the pods of b (spec.regions[1]) ask for no GPU"),
            std::string::npos)
      << p.errors[0].detail;
  spec["regions"][1]["resources"]["limits"]["nvidia.com/gpu"] = "1";
  p = parseSpec(object(spec));
  ASSERT_TRUE(p.errors.empty()) << joinErrors(p.errors);
  for (const Region& r : p.spec.regions) EXPECT_EQ(p.spec.deviceFor(r), "cuda") << r.name;
}

// spec.template and a region's fields merge as training_job.h says.
TEST(TrainingJobSpec, PodFieldsMergeRegionOverJob) {
  json spec = minimal();
  spec["template"] = {
      {"metadata", {{"labels", {{"team", "ml"}, {"tier", "a"}}}, {"annotations", {{"x", "1"}}}}},
      {"spec",
       {{"env", {{{"name", "A"}, {"value", "job"}}, {{"name", "B"}, {"value", "job"}}}},
        {"volumes", {{{"name", "data"}, {"persistentVolumeClaim", {{"claimName", "d"}}}}}},
        {"volumeMounts", {{{"name", "data"}, {"mountPath", "/data"}, {"readOnly", true}}}},
        {"imagePullSecrets", {{{"name", "regcred"}}}},
        {"serviceAccountName", "trainer"},
        {"priorityClassName", "batch"},
        {"nodeSelector", {{"pool", "gpu"}, {"zone", "a"}}},
        {"tolerations", {{{"key", "gpu"}, {"operator", "Exists"}}}},
        {"resources", {{"limits", {{"cpu", "1"}}}}},
        {"sysctls",
         {{{"name", "net.ipv4.tcp_rmem"}, {"value", "4096 131072 33554432"}},
          {{"name", "net.ipv4.tcp_wmem"}, {"value", "4096 16384 33554432"}}}}}}};
  spec["regions"] = {
      {{"name", "london"},
       {"sysctls", {{{"name", "net.ipv4.tcp_rmem"}, {"value", "4096 131072 67108864"}}}},
       {"labels", {{"tier", "b"}}},
       {"env", {{{"name", "B"}, {"value", "region"}}, {{"name", "C"}}}},
       {"volumes", {{{"name", "data"}, {"hostPath", {{"path", "/d"}}}}}},
       {"nodeSelector", {{"zone", "b"}}},
       {"tolerations", {{{"key", "spot"}, {"operator", "Exists"}}}},
       {"serviceAccountName", "london-trainer"},
       {"resources", {{"limits", {{"nvidia.com/gpu", 1}}}}}}};
  const ParsedSpec p = parseSpec(object(spec));
  ASSERT_TRUE(p.errors.empty()) << joinErrors(p.errors);
  const PodOverrides pod = p.spec.podFor(p.spec.regions[0]);
  EXPECT_EQ(pod.labels, (std::map<std::string, std::string>{{"team", "ml"}, {"tier", "b"}}));
  EXPECT_EQ(pod.annotations.at("x"), "1");
  EXPECT_EQ(pod.env, json({{{"name", "A"}, {"value", "job"}},
                           {{"name", "B"}, {"value", "region"}},
                           {{"name", "C"}}}));
  EXPECT_EQ(pod.volumes, json({{{"name", "data"}, {"hostPath", {{"path", "/d"}}}}}));
  EXPECT_EQ(pod.volumeMounts.size(), 1u);
  EXPECT_EQ(pod.imagePullSecrets, json({{{"name", "regcred"}}}));
  EXPECT_EQ(pod.serviceAccountName, "london-trainer");
  EXPECT_EQ(pod.priorityClassName, "batch");
  EXPECT_EQ(pod.nodeSelector, (std::map<std::string, std::string>{{"pool", "gpu"}, {"zone", "b"}}));
  EXPECT_EQ(pod.tolerations.size(), 2u);
  EXPECT_EQ(pod.resources, json({{"limits", {{"nvidia.com/gpu", 1}}}}));
  EXPECT_EQ(pod.sysctls, json({{{"name", "net.ipv4.tcp_rmem"}, {"value", "4096 131072 67108864"}},
                               {{"name", "net.ipv4.tcp_wmem"}, {"value", "4096 16384 33554432"}}}));
  // specToJson writes it back so that it parses to the same spec.
  EXPECT_EQ(parseSpec(object(specToJson(p.spec))).spec, p.spec);
}

TEST(TrainingJobSpec, EveryErrorIsReportedAtOnce) {
  json spec = minimal();
  spec["sync"] = {{"bits", 3}};
  spec["regions"] = {{{"name", "a"}, {"replicas", 0}}, {{"name", "a"}}};
  const ParsedSpec p = parseSpec(object(spec));
  EXPECT_EQ(p.errors.size(), 3u) << joinErrors(p.errors);
}

TEST(TrainingJobSpec, MissingOrMistypedSpec) {
  EXPECT_EQ(messages(parseSpec(json{{"kind", "TrainingJob"}})),
            std::vector<std::string>{"spec: Required value"});
  EXPECT_EQ(messages(parseSpec(object(json::array()))),
            std::vector<std::string>{"spec: a list is not allowed (allowed: an object)"});
}

TEST(TrainingJobStatus, SetConditionKeepsTransitionTimeUnlessStatusChanges) {
  std::vector<Condition> conditions;
  EXPECT_TRUE(setCondition(conditions, {"Running", "False", 1, "", "Pending", "waiting"}, "t1"));
  ASSERT_EQ(conditions.size(), 1u);
  EXPECT_EQ(conditions[0].lastTransitionTime, "t1");
  // Same status, new message: updated, time kept.
  EXPECT_TRUE(setCondition(conditions, {"Running", "False", 2, "", "Pending", "2 of 4"}, "t2"));
  EXPECT_EQ(conditions[0].lastTransitionTime, "t1");
  EXPECT_EQ(conditions[0].observedGeneration, 2);
  // Nothing new: no change reported (the reconciler then writes nothing).
  EXPECT_FALSE(setCondition(conditions, {"Running", "False", 2, "", "Pending", "2 of 4"}, "t3"));
  // Status flips: new time.
  EXPECT_TRUE(setCondition(conditions, {"Running", "True", 2, "", "AllRegionsRunning", ""}, "t4"));
  EXPECT_EQ(conditions[0].lastTransitionTime, "t4");
  EXPECT_TRUE(setCondition(conditions, {"Created", "True", 2, "", "Created", ""}, "t5"));
  EXPECT_EQ(conditions.size(), 2u);
  ASSERT_NE(findCondition(conditions, "Created"), nullptr);
  EXPECT_EQ(findCondition(conditions, "Failed"), nullptr);
}

TEST(TrainingJobStatus, JsonRoundTripAndLenientRead) {
  TrainingJobStatus s;
  s.state = "Running";
  s.regionsReady = "1/2";
  s.observedGeneration = 3;
  s.conditions.push_back({"Running", "True", 3, "2026-11-22T08:00:00Z", "Running", "ok"});
  s.regions.push_back({"london", 2, 2, 0, 0, "10.0.0.1:7000", true, true});
  s.regions.push_back({"tokyo", 0, 0, 0, 0, "", false, false});
  s.progress = {1200, 0.31, 0.86, 0.42};
  s.startTime = "2026-11-22T07:59:00Z";
  EXPECT_EQ(statusFromJson(statusToJson(s)), s);
  const json odd = {{"observedGeneration", "x"},
                    {"conditions", {{{"status", "True"}}, 5}},
                    {"regions", {{{"name", "a"}, {"ready", "2"}}}},
                    {"surprise", true}};
  const TrainingJobStatus read = statusFromJson(odd);
  EXPECT_EQ(read.observedGeneration, 0);
  EXPECT_TRUE(read.conditions.empty());
  ASSERT_EQ(read.regions.size(), 1u);
  EXPECT_EQ(read.regions[0].ready, 0);
  EXPECT_TRUE(read.regions[0].reachable);
  // A status written before `started` existed: not started, so a region is
  // not reported degraded until its workers have all been ready again.
  EXPECT_FALSE(read.regions[0].started);
  EXPECT_FALSE(statusFromJson({{"regions", {{{"name", "a"}, {"ready", 2}, {"active", 2}}}}})
                   .regions[0]
                   .started);
}

TEST(TrainingJobStatus, Rfc3339Now) {
  const std::string now = rfc3339Now();
  ASSERT_EQ(now.size(), 20u) << now;
  EXPECT_EQ(now[4], '-');
  EXPECT_EQ(now[10], 'T');
  EXPECT_EQ(now.back(), 'Z');
}

}  // namespace
}  // namespace geo::api
