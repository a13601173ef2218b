// The test apiserver checked with real clients: kubectl and helm (installed by
// scripts/install-kube-tools.sh into .tools/bin; GEO_TOOLS_BIN overrides).

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <thread>

#include "tests/support/test_apiserver.h"

namespace geo::testapi {
namespace {

namespace fs = std::filesystem;

std::string toolsBin() {
  const char* env = std::getenv("GEO_TOOLS_BIN");
  return env != nullptr ? env : GEO_TOOLS_BIN;
}

struct CommandResult {
  int code = -1;
  std::string output;  // stdout and stderr together
};

CommandResult runCommand(const std::string& command) {
  CommandResult r;
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, pipe)) > 0) r.output.append(buf, n);
  const int status = pclose(pipe);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

class KubeClientsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* tool : {"kubectl", "helm"}) {
      if (!fs::exists(fs::path(toolsBin()) / tool)) {
        GTEST_SKIP() << tool << " is not installed in " << toolsBin()
                     << " (run scripts/install-kube-tools.sh)";
      }
    }
    ServerOptions options;
    options.tls = true;
    options.token = "kube-clients-test-token";
    server_ = std::make_unique<TestApiServer>(options);
    server_->start();
    dir_ = fs::path(::testing::TempDir()) /
           fmt::format("geo-kube-clients-{}-{}", ::getpid(), server_->port());
    fs::create_directories(dir_);
    kubeconfig_ = (dir_ / "kubeconfig").string();
    server_->writeKubeconfig(kubeconfig_);
  }

  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }

  CommandResult kubectl(const std::string& args) {
    return runCommand(fmt::format("{}/kubectl --kubeconfig {} --cache-dir {}/cache {}", toolsBin(),
                                  kubeconfig_, dir_.string(), args));
  }

  CommandResult helm(const std::string& args) {
    const std::string home = dir_.string();
    return runCommand(
        fmt::format("HELM_CACHE_HOME={0}/helm-cache HELM_CONFIG_HOME={0}/helm-config "
                    "HELM_DATA_HOME={0}/helm-data {1}/helm --kubeconfig {2} {3}",
                    home, toolsBin(), kubeconfig_, args));
  }

  std::string testdata(const std::string& name) const {
    return (fs::path(GEO_TESTDATA_DIR) / name).string();
  }

  Json getJson(const std::string& what) {
    CommandResult r = kubectl("get " + what + " -o json --show-managed-fields");
    EXPECT_EQ(r.code, 0) << r.output;
    Json out = Json::parse(r.output, nullptr, false);
    EXPECT_FALSE(out.is_discarded()) << r.output;
    return out;
  }

  std::unique_ptr<TestApiServer> server_;
  fs::path dir_;
  std::string kubeconfig_;
};

#define EXPECT_RUN_OK(r) EXPECT_EQ((r).code, 0) << (r).output
#define EXPECT_CONTAINS(text, part) EXPECT_NE((text).find(part), std::string::npos) << (text)

// The product's own manifests, as a user applies them: the TrainingJob CRD,
// the RBAC of hub and member, then the sample jobs; `kubectl get tj` with the
// CRD's printer columns (State, Regions, Step, Loss, Age); applying again
// changes nothing.
TEST_F(KubeClientsTest, ProductManifestsApplyAndList) {
  const std::string manifests = GEO_MANIFESTS_DIR;
  CommandResult r = kubectl("apply -f " + manifests + "/crd");
  EXPECT_RUN_OK(r);
  EXPECT_CONTAINS(r.output,
                  "customresourcedefinition.apiextensions.k8s.io/"
                  "trainingjobs.geotrain.io created");
  EXPECT_RUN_OK(
      kubectl("wait --for=condition=Established --timeout=20s "
              "crd/trainingjobs.geotrain.io"));
  r = kubectl("apply -f " + manifests + "/rbac");
  EXPECT_RUN_OK(r);
  EXPECT_CONTAINS(r.output, "clusterrole.rbac.authorization.k8s.io/geotrain-member created");
  EXPECT_CONTAINS(r.output, "role.rbac.authorization.k8s.io/geotrain-hub created");
  r = kubectl("apply -n default -f " + manifests + "/samples");
  EXPECT_RUN_OK(r);
  for (const char* name : {"quickstart", "world", "swarm", "torchscript", "pvc-data"}) {
    EXPECT_CONTAINS(r.output, fmt::format("trainingjob.geotrain.io/{} created", name));
  }
  // A status as the controller writes it, through the status subresource.
  EXPECT_RUN_OK(
      kubectl("patch tj world -n default --subresource=status --type=merge -p "
              "'{\"status\":{\"state\":\"Running\",\"regionsReady\":\"3/4\","
              "\"progress\":{\"step\":1200,\"loss\":0.31}}}'"));
  r = kubectl("get tj -n default");
  EXPECT_RUN_OK(r);
  EXPECT_TRUE(
      std::regex_search(r.output, std::regex(R"(NAME\s+STATE\s+REGIONS\s+STEP\s+LOSS\s+AGE)")))
      << r.output;
  EXPECT_TRUE(std::regex_search(r.output, std::regex(R"(world\s+Running\s+3/4\s+1200\s+0\.31)")))
      << r.output;
  // The short name and the `all` category work too.
  EXPECT_CONTAINS(kubectl("get all -n default").output, "trainingjob.geotrain.io/quickstart");
  r = kubectl("apply -n default -f " + manifests + "/samples");
  EXPECT_RUN_OK(r);
  EXPECT_CONTAINS(r.output, "trainingjob.geotrain.io/world unchanged");
}

TEST_F(KubeClientsTest, KubectlApplyGetEditServerSideWaitDelete) {
  // CRDs first, as on a real cluster: kubectl maps every object before it
  // applies any, so a CR cannot share an apply with its new CRD.
  CommandResult r = kubectl("apply -f " + testdata("manifests/00-crd.yaml"));
  EXPECT_RUN_OK(r);
  EXPECT_CONTAINS(r.output,
                  "customresourcedefinition.apiextensions.k8s.io/widgets.test.geotrain.io created");
  r = kubectl("wait --for=condition=Established --timeout=20s crd/widgets.test.geotrain.io");
  EXPECT_RUN_OK(r);

  r = kubectl("apply -f " + testdata("manifests"));
  EXPECT_RUN_OK(r);
  EXPECT_CONTAINS(r.output,
                  "clusterrolebinding.rbac.authorization.k8s.io/widget-controller created");
  EXPECT_CONTAINS(r.output, "deployment.apps/widget-controller created");
  EXPECT_CONTAINS(r.output, "widget.test.geotrain.io/sample created");

  // Server-side printing with the CRD's printer columns.
  r = kubectl("get widgets");
  EXPECT_RUN_OK(r);
  EXPECT_TRUE(std::regex_search(r.output, std::regex(R"(NAME\s+SIZE\s+COLOR\s+READY\s+AGE)")))
      << r.output;
  EXPECT_TRUE(std::regex_search(r.output, std::regex(R"(sample\s+3\s+blue\s+)"))) << r.output;
  r = kubectl("get wd sample -o jsonpath={.spec.size}");
  EXPECT_EQ(r.output, "3");

  // Applying the same files again changes nothing.
  const std::string rvBefore =
      getJson("deployment widget-controller")["metadata"]["resourceVersion"];
  r = kubectl("apply -f " + testdata("manifests"));
  EXPECT_RUN_OK(r);
  EXPECT_EQ(r.output.find("configured"), std::string::npos) << r.output;
  EXPECT_CONTAINS(r.output, "deployment.apps/widget-controller unchanged");
  EXPECT_EQ(getJson("deployment widget-controller")["metadata"]["resourceVersion"], rvBefore);

  // Edit + apply: the three-way merge drops what the old file had and the new
  // one does not (the sidecar), keeps what others added (a label).
  EXPECT_RUN_OK(kubectl("label deployment widget-controller added-by=someone-else"));
  std::ifstream in(testdata("manifests/20-app.yaml"));
  std::string app((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  app = std::regex_replace(app, std::regex("replicas: 1"), "replicas: 2");
  app = std::regex_replace(app, std::regex("value: info"), "value: debug");
  app = std::regex_replace(app, std::regex("size: 3"), "size: 5");
  app = app.substr(0, app.find("        - name: sidecar")) +
        app.substr(app.find("---\napiVersion: test"));
  const std::string edited = (dir_ / "app-edited.yaml").string();
  std::ofstream(edited) << app;
  r = kubectl("apply -f " + edited);
  EXPECT_RUN_OK(r);
  EXPECT_CONTAINS(r.output, "deployment.apps/widget-controller configured");
  EXPECT_CONTAINS(r.output, "widget.test.geotrain.io/sample configured");
  Json deploy = getJson("deployment widget-controller");
  EXPECT_EQ(deploy["spec"]["replicas"], 2);
  const Json containers = deploy["spec"]["template"]["spec"]["containers"];
  ASSERT_EQ(containers.size(), 1u) << containers.dump();
  EXPECT_EQ(containers[0]["env"][0]["value"], "debug");
  EXPECT_EQ(containers[0]["env"][1]["name"], "MODE");
  EXPECT_EQ(deploy["metadata"]["labels"]["added-by"], "someone-else");
  EXPECT_EQ(deploy["metadata"]["generation"], 2);
  EXPECT_EQ(getJson("widget sample")["spec"]["size"], 5);

  // Server-side apply takes the objects over from client-side apply.
  r = kubectl("apply --server-side -f " + edited);
  EXPECT_RUN_OK(r);
  EXPECT_CONTAINS(r.output, "deployment.apps/widget-controller serverside-applied");
  bool kubectlApplies = false;
  const Json managed = getJson("deployment widget-controller")["metadata"]["managedFields"];
  for (const auto& m : managed) {
    kubectlApplies = kubectlApplies || (m["manager"] == "kubectl" && m["operation"] == "Apply");
  }
  EXPECT_TRUE(kubectlApplies) << managed.dump();
  const std::string other = (dir_ / "other.yaml").string();
  std::ofstream(other) << "apiVersion: test.geotrain.io/v1alpha1\nkind: Widget\nmetadata:\n"
                          "  name: sample\n  namespace: default\nspec:\n  color: green\n";
  r = kubectl("apply --server-side --field-manager=other -f " + other);
  EXPECT_NE(r.code, 0);
  EXPECT_CONTAINS(r.output, "conflict");
  r = kubectl("apply --server-side --field-manager=other --force-conflicts -f " + other);
  EXPECT_RUN_OK(r);
  EXPECT_EQ(getJson("widget sample")["spec"]["color"], "green");

  // kubectl wait sees a condition the "controller" (this test) sets.
  CommandResult waited;
  std::thread waiter(
      [&] { waited = kubectl("wait --for=condition=Ready --timeout=30s widget/sample"); });
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  auto type = server_->registry().find("test.geotrain.io", "v1alpha1", "widgets");
  ASSERT_NE(type, nullptr);
  bool created = false;
  server_->store().modify(
      *type, "default", "sample", WriteContext{"test", "status", false},
      [](const Json* current) {
        Json o = *current;
        o["status"]["conditions"] = {{{"type", "Ready"},
                                      {"status", "True"},
                                      {"reason", "Test"},
                                      {"message", "set by the test"},
                                      {"lastTransitionTime", nowRfc3339()}}};
        return o;
      },
      false, &created);
  waiter.join();
  EXPECT_RUN_OK(waited);
  EXPECT_CONTAINS(waited.output, "condition met");
  EXPECT_TRUE(
      std::regex_search(kubectl("get widgets").output, std::regex(R"(sample\s+5\s+green\s+True)")));

  // Cascading deletion: a dependent of the deployment goes with it.
  const Json owner = getJson("deployment widget-controller");
  const std::string dependent = (dir_ / "dependent.yaml").string();
  std::ofstream(dependent) << fmt::format(
      "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: owned\n  namespace: default\n"
      "  ownerReferences:\n  - apiVersion: apps/v1\n    kind: Deployment\n    name: {}\n"
      "    uid: {}\n    blockOwnerDeletion: true\n",
      owner["metadata"]["name"].get<std::string>(), owner["metadata"]["uid"].get<std::string>());
  EXPECT_RUN_OK(kubectl("apply -f " + dependent));
  r = kubectl("delete deployment widget-controller --cascade=foreground --wait=true --timeout=20s");
  EXPECT_RUN_OK(r);
  EXPECT_NE(kubectl("get configmap owned").code, 0);

  r = kubectl("delete -f " + testdata("manifests") +
              " --ignore-not-found --wait=true --timeout=20s");
  EXPECT_RUN_OK(r);
  r = kubectl("get widgets");
  EXPECT_NE(r.code, 0);
  // With its discovery cache still listing widgets, kubectl gets the real
  // server's 404 for the vanished resource.
  EXPECT_TRUE(
      r.output.find("the server doesn't have a resource type \"widgets\"") != std::string::npos ||
      r.output.find("the server could not find the requested resource") != std::string::npos)
      << r.output;
}

TEST_F(KubeClientsTest, HelmInstallUpgradeUninstall) {
  // No --wait: nothing here runs controllers, so a Deployment never reports
  // ready replicas (kstatus would wait for them).
  CommandResult r = helm("install fixture " + testdata("chart"));
  EXPECT_RUN_OK(r);
  EXPECT_CONTAINS(r.output, "STATUS: deployed");
  r = kubectl("get configmap fixture-config -o jsonpath={.data.greeting}");
  EXPECT_EQ(r.output, "hello");

  r = helm("upgrade fixture " + testdata("chart") + " --set greeting=bye --set replicas=2");
  EXPECT_RUN_OK(r);
  EXPECT_CONTAINS(r.output, "REVISION: 2");
  EXPECT_EQ(kubectl("get configmap fixture-config -o jsonpath={.data.greeting}").output, "bye");
  EXPECT_EQ(kubectl("get deployment fixture-app -o jsonpath={.spec.replicas}").output, "2");
  r = helm("list");
  EXPECT_TRUE(std::regex_search(r.output, std::regex(R"(fixture\s+default\s+2\s)"))) << r.output;

  r = helm("uninstall fixture --wait --timeout 30s");
  EXPECT_RUN_OK(r);
  EXPECT_NE(kubectl("get configmap fixture-config").code, 0);
  EXPECT_EQ(kubectl("get secrets -l owner=helm -o name").output, "");
}

}  // namespace
}  // namespace geo::testapi
