// Exec credential plugins: small shell scripts that print an ExecCredential,
// as aws, gke-gcloud-auth-plugin and kubelogin do, run by
// ExecCredentialSource and described by a kubeconfig's users[].user.exec.

#include "controller/kube/exec_credential.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "controller/kube/config.h"
#include "controller/kube/kube_time.h"

namespace geo::kube {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using std::chrono::system_clock;

constexpr const char* kV1 = "client.authentication.k8s.io/v1";
constexpr const char* kV1beta1 = "client.authentication.k8s.io/v1beta1";

class ExecCredentialTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           ("exec-cred-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // An executable shell script `name` with `body`.
  fs::path script(const std::string& name, const std::string& body) {
    const fs::path path = dir_ / name;
    std::ofstream(path) << "#!/bin/sh\n" << body;
    ::chmod(path.c_str(), 0755);
    return path;
  }

  // A plugin that prints an ExecCredential of `apiVersion` with `status`.
  ExecConfig plugin(const json& status, const std::string& apiVersion = kV1) {
    const json out = {{"apiVersion", apiVersion}, {"kind", "ExecCredential"}, {"status", status}};
    ExecConfig c;
    c.apiVersion = apiVersion;
    c.command = script("plugin", "cat <<'EOF'\n" + out.dump() + "\nEOF\n").string();
    return c;
  }

  std::string read(const std::string& name) {
    std::ifstream in(dir_ / name);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }

  fs::path dir_;
};

TEST_F(ExecCredentialTest, RunsThePluginWithItsArgsEnvAndExecInfo) {
  ExecConfig c;
  c.apiVersion = kV1beta1;
  // The token is made of the first argument and a variable, and the plugin
  // keeps what KUBERNETES_EXEC_INFO said.
  c.command =
      script("plugin", R"(printf '%s' "$KUBERNETES_EXEC_INFO" > ")" + (dir_ / "info").string() +
                           R"("
printf '{"apiVersion":"client.authentication.k8s.io/v1beta1","kind":"ExecCredential","status":{"token":"%s-%s"}}' "$1" "$REGION"
)")
          .string();
  c.args = {"eks", "--cluster-name", "tokyo"};
  c.env = {{"REGION", "ap-northeast-1"}};
  c.provideClusterInfo = true;
  c.server = "https://tokyo.example:6443";
  c.caPem = "CA-PEM";
  ExecCredentialSource source(c);
  auto got = source.credentials();
  ASSERT_TRUE(got.ok()) << got.status().toString();
  EXPECT_EQ(got->token, "eks-ap-northeast-1");
  EXPECT_FALSE(got->expiration);
  const json info = json::parse(read("info"));
  EXPECT_EQ(info["apiVersion"], kV1beta1);
  EXPECT_EQ(info["kind"], "ExecCredential");
  EXPECT_EQ(info["spec"]["interactive"], false);
  EXPECT_EQ(info["spec"]["cluster"]["server"], "https://tokyo.example:6443");
  EXPECT_EQ(info["spec"]["cluster"]["certificate-authority-data"], "Q0EtUEVN");  // base64
}

TEST_F(ExecCredentialTest, KeptUntilItExpiresThenRenewed) {
  const auto later = system_clock::now() + std::chrono::hours(1);
  ExecCredentialSource lasting(
      plugin({{"token", "t"}, {"expirationTimestamp", formatTime(later)}}));
  ASSERT_TRUE(lasting.credentials().ok());
  ASSERT_TRUE(lasting.credentials().ok());
  EXPECT_EQ(lasting.runs(), 1) << "a credential valid for an hour is reused";
  EXPECT_EQ(lasting.credentials()->expiration,
            system_clock::from_time_t(system_clock::to_time_t(later)));

  // Within kExpirySkew of its expiry a credential counts as expired.
  const auto soon = system_clock::now() + ExecCredentialSource::kExpirySkew / 2;
  ExecCredentialSource expiring(
      plugin({{"token", "t"}, {"expirationTimestamp", formatTime(soon)}}));
  ASSERT_TRUE(expiring.credentials().ok());
  ASSERT_TRUE(expiring.credentials().ok());
  EXPECT_EQ(expiring.runs(), 2);
}

TEST_F(ExecCredentialTest, InvalidateRunsItAgainOncePerStaleCredential) {
  ExecConfig c;
  c.apiVersion = kV1;
  // Each run prints the next token: t1, t2, ...
  const std::string count = (dir_ / "count").string();
  c.command = script("plugin",
                     "n=$(( $(cat " + count + " 2>/dev/null || echo 0) + 1 ))\necho $n > " + count +
                         "\nprintf '{\"apiVersion\":\"client.authentication.k8s.io/"
                         "v1\",\"kind\":\"ExecCredential\",\"status\":{\"token\":\"t%s\"}}' $n\n")
                  .string();
  ExecCredentialSource source(c);
  const ExecCredential first = *source.credentials();
  EXPECT_EQ(first.token, "t1");
  source.invalidate(first);
  const ExecCredential second = *source.credentials();
  EXPECT_EQ(second.token, "t2");
  // A second 401 for t1, from a request sent before the renewal, changes
  // nothing.
  source.invalidate(first);
  EXPECT_EQ(source.credentials()->token, "t2");
  EXPECT_EQ(source.runs(), 2);
}

TEST_F(ExecCredentialTest, ClientCertificateAndKey) {
  ExecCredentialSource source(
      plugin({{"clientCertificateData", "CERT-PEM"}, {"clientKeyData", "KEY-PEM"}}, kV1beta1));
  auto got = source.credentials();
  ASSERT_TRUE(got.ok()) << got.status().toString();
  EXPECT_EQ(got->token, "");
  EXPECT_EQ(got->clientCertPem, "CERT-PEM");
  EXPECT_EQ(got->clientKeyPem, "KEY-PEM");
}

TEST_F(ExecCredentialTest, FailuresSayWhatWentWrong) {
  struct Case {
    ExecConfig config;
    std::string message;
  };
  ExecConfig missing;
  missing.apiVersion = kV1;
  missing.command = "geo-no-such-credential-plugin";
  missing.installHint = "install it with: apt-get install geo-plugin\n";
  ExecConfig failing;
  failing.apiVersion = kV1;
  failing.command = script("failing", "echo 'token expired: run login' >&2\nexit 3\n").string();
  ExecConfig slow;
  slow.apiVersion = kV1;
  slow.command = script("slow", "exec sleep 5\n").string();
  slow.timeout = std::chrono::milliseconds(200);
  ExecConfig garbage;
  garbage.apiVersion = kV1;
  garbage.command = script("garbage", "echo hello\n").string();
  ExecConfig otherVersion = plugin({{"token", "t"}}, kV1beta1);
  otherVersion.apiVersion = kV1;
  const std::vector<Case> cases = {
      {missing,
       "exec credential plugin geo-no-such-credential-plugin: cannot run it: No such file or "
       "directory (install it with: apt-get install geo-plugin)"},
      {failing,
       "exec credential plugin " + failing.command + ": exited 3: token expired: run login"},
      {slow, "exec credential plugin " + slow.command + ": no answer within 0.2 s (killed)"},
      {garbage,
       "exec credential plugin " + garbage.command + ": its output is not a JSON ExecCredential"},
      {otherVersion,
       "exec credential plugin " + (dir_ / "plugin").string() +
           ": its output has apiVersion \"client.authentication.k8s.io/v1beta1\", the kubeconfig "
           "asks for client.authentication.k8s.io/v1"},
  };
  for (const Case& c : cases) {
    ExecCredentialSource source(c.config);
    auto got = source.credentials();
    ASSERT_FALSE(got.ok()) << c.message;
    EXPECT_EQ(got.status().code(), StatusCode::kUnauthenticated) << c.message;
    EXPECT_EQ(got.status().message(), c.message);
  }
}

TEST(ParseExecCredential, RefusesIncompleteCredentials) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"apiVersion":"client.authentication.k8s.io/v1","kind":"Config","status":{}})",
       "its output has kind \"Config\", not ExecCredential"},
      {R"({"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential"})",
       "its ExecCredential has no status"},
      {R"({"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{}})",
       "its ExecCredential has neither status.token nor status.clientCertificateData and "
       "status.clientKeyData"},
      {R"({"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential",)"
       R"("status":{"clientCertificateData":"C"}})",
       "its ExecCredential has status.clientCertificateData but not status.clientKeyData (a "
       "client certificate needs both)"},
      {R"({"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential",)"
       R"("status":{"token":"t","expirationTimestamp":"tomorrow"}})",
       "its ExecCredential's status.expirationTimestamp \"tomorrow\" is not an RFC 3339 time"},
  };
  for (const auto& [output, message] : cases) {
    auto got = parseExecCredential(output, kV1);
    ASSERT_FALSE(got.ok()) << output;
    EXPECT_EQ(got.status().message(), message);
  }
  auto ok = parseExecCredential(
      R"({"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential",)"
      R"("status":{"token":"t","expirationTimestamp":"2030-01-02T03:04:05Z"}})",
      kV1);
  ASSERT_TRUE(ok.ok()) << ok.status().toString();
  EXPECT_EQ(formatTime(*ok->expiration), "2030-01-02T03:04:05Z");
}

// users[].user.exec in a kubeconfig.
TEST_F(ExecCredentialTest, FromAKubeconfig) {
  const std::string head = R"(current-context: c
contexts:
- name: c
  context: {cluster: k, user: u}
clusters:
- name: k
  cluster: {server: "https://k.example:443", certificate-authority-data: Q0EtUEVN}
users:
- name: u
  user:
)";
  auto config = parseKubeconfig(head + R"(    exec:
      apiVersion: client.authentication.k8s.io/v1beta1
      command: aws
      args: [eks, get-token, --cluster-name, tokyo, --output, json]
      env:
      - name: AWS_PROFILE
        value: ml
      - name: EMPTY
      installHint: aws is the AWS CLI
      provideClusterInfo: true
      interactiveMode: Never
)",
                                dir_ / "config");
  ASSERT_TRUE(config.ok()) << config.status().toString();
  ASSERT_TRUE(config->exec);
  EXPECT_FALSE(config->token);
  const ExecConfig& e = config->exec->config();
  EXPECT_EQ(e.apiVersion, kV1beta1);
  EXPECT_EQ(e.command, "aws");
  EXPECT_EQ(e.args, (std::vector<std::string>{"eks", "get-token", "--cluster-name", "tokyo",
                                              "--output", "json"}));
  EXPECT_EQ(e.env, (std::vector<std::pair<std::string, std::string>>{{"AWS_PROFILE", "ml"},
                                                                     {"EMPTY", ""}}));
  EXPECT_EQ(e.installHint, "aws is the AWS CLI");
  EXPECT_TRUE(e.provideClusterInfo);
  EXPECT_EQ(e.server, "https://k.example:443");
  EXPECT_EQ(e.caPem, "CA-PEM");
  EXPECT_EQ(e.dir, dir_);

  const std::string prefix = "kubeconfig " + (dir_ / "config").string() + ": ";
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"    exec: {apiVersion: client.authentication.k8s.io/v1}\n",
       "users[name=\"u\"].user.exec.command: missing"},
      {"    exec: {command: aws}\n",
       "users[name=\"u\"].user.exec.apiVersion: \"\" is not supported (supported: "
       "client.authentication.k8s.io/v1, client.authentication.k8s.io/v1beta1)"},
      {"    exec: {apiVersion: client.authentication.k8s.io/v1alpha1, command: aws}\n",
       "users[name=\"u\"].user.exec.apiVersion: \"client.authentication.k8s.io/v1alpha1\" is not "
       "supported (supported: client.authentication.k8s.io/v1, "
       "client.authentication.k8s.io/v1beta1)"},
      {"    exec: {apiVersion: client.authentication.k8s.io/v1, command: kubelogin, "
       "interactiveMode: Always}\n",
       "users[name=\"u\"].user.exec.interactiveMode: Always is not supported: the controller has "
       "no terminal for the plugin (use a plugin mode that needs no user, e.g. a service account "
       "or workload identity)"},
      {"    exec: {apiVersion: client.authentication.k8s.io/v1, command: aws, args: a}\n",
       "users[name=\"u\"].user.exec.args: must be a list of strings"},
      {"    exec: {apiVersion: client.authentication.k8s.io/v1, command: aws, env: [{value: x}]}\n",
       "users[name=\"u\"].user.exec.env[0]: must be {name, value} with a name"},
      {"    token: abc\n    exec: {apiVersion: client.authentication.k8s.io/v1, command: aws}\n",
       "users[name=\"u\"].user.token: cannot be combined with exec (the plugin supplies the "
       "credentials)"},
  };
  for (const auto& [user, message] : bad) {
    auto got = parseKubeconfig(head + user, dir_ / "config");
    ASSERT_FALSE(got.ok()) << user;
    EXPECT_EQ(got.status().message(), prefix + message) << user;
  }
}

}  // namespace
}  // namespace geo::kube
