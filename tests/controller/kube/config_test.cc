#include "controller/kube/config.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

namespace geo::kube {
namespace {

namespace fs = std::filesystem;

// base64 of "CA-PEM", "CERT-PEM", "KEY-PEM".
constexpr const char* kCaData = "Q0EtUEVN";
constexpr const char* kCertData = "Q0VSVC1QRU0=";
constexpr const char* kKeyData = "S0VZLVBFTQ==";

class KubeconfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           ("kubeconfig-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  fs::path write(const std::string& name, const std::string& text) {
    const fs::path path = dir_ / name;
    std::ofstream(path) << text;
    return path;
  }

  // A kubeconfig with two contexts; `user` is the YAML of the user entry.
  fs::path kubeconfig(const std::string& user, const std::string& cluster = "") {
    return write("config", R"(apiVersion: v1
kind: Config
current-context: hub
clusters:
- name: hub-cluster
  cluster:
    server: https://hub.example:6443/
    certificate-authority-data: )" +
                               std::string(kCaData) + "\n" + cluster + R"(
- name: member-cluster
  cluster:
    server: https://member.example:6443
    insecure-skip-tls-verify: true
contexts:
- name: hub
  context: {cluster: hub-cluster, user: hub-user, namespace: training}
- name: member
  context: {cluster: member-cluster, user: hub-user}
users:
- name: hub-user
  user:
)" + user);
  }

  fs::path dir_;
};

TEST_F(KubeconfigTest, CurrentContextWithTokenAndCaData) {
  const auto config = loadKubeconfig(kubeconfig("    token: abc123\n"));
  ASSERT_TRUE(config.ok()) << config.status().toString();
  EXPECT_EQ(config->name, "hub");
  EXPECT_EQ(config->server, "https://hub.example:6443");  // trailing slash dropped
  EXPECT_EQ(config->caPem, "CA-PEM");
  EXPECT_FALSE(config->insecureSkipTlsVerify);
  EXPECT_EQ(config->defaultNamespace, "training");
  ASSERT_TRUE(config->token);
  EXPECT_EQ(config->token->token(), "abc123");
  EXPECT_TRUE(config->clientCertPem.empty());
}

TEST_F(KubeconfigTest, NamedContext) {
  const auto config = loadKubeconfig(kubeconfig("    token: abc123\n"), "member");
  ASSERT_TRUE(config.ok()) << config.status().toString();
  EXPECT_EQ(config->server, "https://member.example:6443");
  EXPECT_TRUE(config->insecureSkipTlsVerify);
  EXPECT_TRUE(config->caPem.empty());
  EXPECT_EQ(config->defaultNamespace, "default");
}

TEST_F(KubeconfigTest, ClientCertificateData) {
  const auto config =
      loadKubeconfig(kubeconfig(std::string("    client-certificate-data: ") + kCertData +
                                "\n    client-key-data: " + kKeyData + "\n"));
  ASSERT_TRUE(config.ok()) << config.status().toString();
  EXPECT_EQ(config->clientCertPem, "CERT-PEM");
  EXPECT_EQ(config->clientKeyPem, "KEY-PEM");
  EXPECT_FALSE(config->token);
}

TEST_F(KubeconfigTest, FilesAreRelativeToTheKubeconfig) {
  write("cert.pem", "CERT FILE");
  write("key.pem", "KEY FILE");
  write("ca.pem", "CA FILE");
  write("token", "file-token\n");
  const auto config =
      loadKubeconfig(kubeconfig("    client-certificate: cert.pem\n    client-key: " +
                                    (dir_ / "key.pem").string() + "\n    tokenFile: token\n",
                                "- name: files\n  cluster:\n    server: http://127.0.0.1:8080\n"
                                "    certificate-authority: ca.pem\n"),
                     "");
  ASSERT_TRUE(config.ok()) << config.status().toString();
  EXPECT_EQ(config->clientCertPem, "CERT FILE");
  EXPECT_EQ(config->clientKeyPem, "KEY FILE");
  EXPECT_EQ(config->token->token(), "file-token");
  // A context using the cluster that reads its CA from a file.
  const auto files = parseKubeconfig(R"(
clusters:
- name: files
  cluster: {server: "http://127.0.0.1:8080", certificate-authority: ca.pem}
contexts:
- name: c
  context: {cluster: files}
current-context: c
)",
                                     dir_ / "inline");
  ASSERT_TRUE(files.ok()) << files.status().toString();
  EXPECT_EQ(files->caPem, "CA FILE");
  EXPECT_FALSE(files->token);
}

// Each bad kubeconfig and the exact message that names file and field.
TEST_F(KubeconfigTest, ErrorsNameTheFileAndTheField) {
  const fs::path origin = dir_ / "bad";
  const std::string prefix = "kubeconfig " + origin.string() + ": ";
  struct Case {
    std::string yaml;
    std::string context;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"clusters: []\n", "", "current-context: not set and no context given"},
      {"current-context: x\ncontexts:\n- name: a\n  context: {cluster: c}\n- name: b\n  context: "
       "{cluster: c}\n",
       "", "contexts: no entry named \"x\" (have: a, b)"},
      {"contexts:\n- name: a\n  context: {user: u}\n", "a",
       "contexts[name=\"a\"].context.cluster: missing"},
      {"contexts:\n- name: a\n  context: {cluster: c}\n", "a",
       "clusters: no entry named \"c\" (have: none)"},
      {"contexts:\n- name: a\n  context: {cluster: c}\nclusters:\n- name: c\n  cluster: {}\n", "a",
       "clusters[name=\"c\"].cluster.server: missing"},
      {"contexts:\n- name: a\n  context: {cluster: c}\nclusters:\n- name: c\n  cluster: {server: "
       "example.com}\n",
       "a",
       "clusters[name=\"c\"].cluster.server: \"example.com\" must start with https:// or http://"},
      {"contexts:\n- name: a\n  context: {cluster: c}\nclusters:\n- name: c\n  cluster: {server: "
       "https://x, certificate-authority-data: \"!!notbase64\"}\n",
       "a", "clusters[name=\"c\"].cluster.certificate-authority-data: not valid base64"},
      {"contexts:\n- name: a\n  context: {cluster: c}\nclusters:\n- name: c\n  cluster: {server: "
       "https://x, certificate-authority: missing.pem}\n",
       "a",
       "clusters[name=\"c\"].cluster.certificate-authority: file " +
           (dir_ / "missing.pem").string() + ": cannot open"},
      {"contexts:\n- name: a\n  context: {cluster: c}\nclusters:\n- name: c\n  cluster: {server: "
       "https://x, insecure-skip-tls-verify: maybe}\n",
       "a", "clusters[name=\"c\"].cluster.insecure-skip-tls-verify: must be true or false"},
      {"contexts:\n- name: a\n  context: {cluster: c, user: u}\nclusters:\n- name: c\n  cluster: "
       "{server: https://x}\nusers:\n- name: u\n  user: {client-certificate-data: Q0E=}\n",
       "a",
       "users[name=\"u\"].user.client-key: missing (a client certificate needs both certificate "
       "and key)"},
      {"contexts:\n- name: a\n  context: {cluster: c, user: u}\nclusters:\n- name: c\n  cluster: "
       "{server: https://x}\nusers:\n- name: u\n  user: {auth-provider: {name: gcp}}\n",
       "a",
       "users[name=\"u\"].user.auth-provider: not supported (use token, tokenFile, a client "
       "certificate or exec)"},
      {"contexts:\n- name: a\n  context: {cluster: c, user: u}\nclusters:\n- name: c\n  cluster: "
       "{server: https://x}\nusers:\n- name: u\n  user: {tokenFile: nope}\n",
       "a",
       "users[name=\"u\"].user.tokenFile: token file " + (dir_ / "nope").string() + ": " +
           std::make_error_code(std::errc::no_such_file_or_directory).message()},
      {"contexts: 5\n", "a", "contexts: must be a list"},
      {"[1, 2]\n", "a", "(document): not a YAML map"},
  };
  for (const Case& c : cases) {
    const auto config = parseKubeconfig(c.yaml, origin, c.context);
    ASSERT_FALSE(config.ok()) << c.yaml;
    EXPECT_EQ(config.status().code(), StatusCode::kInvalidArgument) << c.yaml;
    EXPECT_EQ(config.status().message(), prefix + c.message) << c.yaml;
  }
}

TEST_F(KubeconfigTest, MissingFileAndBrokenYaml) {
  const auto missing = loadKubeconfig(dir_ / "nothing");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(missing.status().message(),
            "kubeconfig " + (dir_ / "nothing").string() + ": cannot open");
  const auto broken = loadKubeconfig(write("broken", "clusters: [\n"));
  EXPECT_EQ(broken.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(broken.status().message().find("broken: (document): "), std::string::npos)
      << broken.status().message();
}

TEST_F(KubeconfigTest, TokenFileIsReReadWhenItChanges) {
  const fs::path token = write("token", "first\n");
  auto source = TokenSource::fromFile(token);
  ASSERT_TRUE(source.ok()) << source.status().toString();
  EXPECT_EQ((*source)->token(), "first");
  // Rotate as the kubelet does: write a new file and rename it over the old.
  write("token.new", "second-token\n");
  fs::rename(dir_ / "token.new", token);
  fs::last_write_time(token, fs::last_write_time(token) + std::chrono::seconds(1));
  EXPECT_EQ((*source)->token(), "second-token");
  // Mid-rotation (gone): the last good token is kept.
  fs::remove(token);
  EXPECT_EQ((*source)->token(), "second-token");
  EXPECT_EQ(TokenSource::fromFile(write("empty", "\n")).status().message(),
            "token file " + (dir_ / "empty").string() + ": empty");
}

TEST_F(KubeconfigTest, InCluster) {
  InClusterPaths paths{dir_ / "token", dir_ / "ca.crt", dir_ / "namespace"};
  ::unsetenv("KUBERNETES_SERVICE_HOST");
  ::unsetenv("KUBERNETES_SERVICE_PORT");
  EXPECT_EQ(loadInClusterConfig(paths).status().code(), StatusCode::kFailedPrecondition);
  ::setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1", 1);
  ::setenv("KUBERNETES_SERVICE_PORT", "443", 1);
  const auto noToken = loadInClusterConfig(paths);
  EXPECT_EQ(noToken.status().code(), StatusCode::kNotFound);
  EXPECT_NE(noToken.status().message().find("in-cluster config: token file"), std::string::npos);
  write("token", "sa-token");
  write("ca.crt", "CLUSTER CA");
  auto config = loadInClusterConfig(paths);
  ASSERT_TRUE(config.ok()) << config.status().toString();
  EXPECT_EQ(config->server, "https://10.96.0.1:443");
  EXPECT_EQ(config->caPem, "CLUSTER CA");
  EXPECT_EQ(config->defaultNamespace, "default");
  EXPECT_EQ(config->token->token(), "sa-token");
  write("namespace", "geotrain-system\n");
  ::setenv("KUBERNETES_SERVICE_HOST", "fd00::1", 1);
  config = loadInClusterConfig(paths);
  ASSERT_TRUE(config.ok()) << config.status().toString();
  EXPECT_EQ(config->server, "https://[fd00::1]:443");
  EXPECT_EQ(config->defaultNamespace, "geotrain-system");
  ::unsetenv("KUBERNETES_SERVICE_HOST");
  ::unsetenv("KUBERNETES_SERVICE_PORT");
}

TEST(Base64Test, DecodesStandardBase64) {
  EXPECT_EQ(decodeBase64("aGVsbG8="), "hello");
  EXPECT_EQ(decodeBase64("aGVs\nbG8="), "hello");
  EXPECT_EQ(decodeBase64(""), "");
  EXPECT_FALSE(decodeBase64("aGVsbG8"));  // unpadded
  EXPECT_FALSE(decodeBase64("a-_b"));     // URL-safe alphabet
}

}  // namespace
}  // namespace geo::kube
