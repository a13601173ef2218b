#pragma once
// ExecCredentialSource: credentials from a kubeconfig's `exec` plugin, the
// way kubectl gets them on EKS (`aws eks get-token`), GKE
// (`gke-gcloud-auth-plugin`) and AKS (`kubelogin`): the
// client.authentication.k8s.io v1 and v1beta1 ExecCredential protocol.
//
// The plugin runs with its args, its env added to the controller's own, stdin
// from /dev/null, and KUBERNETES_EXEC_INFO: an ExecCredential whose spec says
// the session is not interactive and, with provideClusterInfo, carries the
// cluster (server, certificate-authority-data, insecure-skip-tls-verify). It
// must print an ExecCredential of the same apiVersion whose status holds a
// bearer token or a PEM client certificate and key, and may say when they
// expire (expirationTimestamp). The result is kept until then, less
// kExpirySkew so that a token never expires while a request is in flight, or
// until invalidate(); then the next credentials() runs the plugin again.
//
// Errors: kUnauthenticated, naming the command and what went wrong: it is
// not installed (with the kubeconfig's installHint), it exited non-zero (with
// the end of its stderr), it ran longer than the time-out, or its output is
// not a usable ExecCredential. A failed run is not kept: the next call tries
// again (the client's callers retry with backoff).
// Threading: thread-safe; one run at a time, concurrent callers wait for it
// and share its result.

#include <chrono>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"

namespace geo::kube {

// What a kubeconfig's users[].user.exec says.
struct ExecConfig {
  // client.authentication.k8s.io/v1 or client.authentication.k8s.io/v1beta1.
  std::string apiVersion;
  // A program name looked up in PATH, or a path; a relative path with a '/'
  // is relative to `dir`, as client-go resolves it.
  std::string command;
  std::vector<std::string> args;
  std::vector<std::pair<std::string, std::string>> env;
  std::string installHint;
  bool provideClusterInfo = false;
  // The kubeconfig's directory.
  std::filesystem::path dir;
  // The cluster, for KUBERNETES_EXEC_INFO with provideClusterInfo.
  std::string server;
  std::string caPem;
  bool insecureSkipTlsVerify = false;
  // A plugin that has not finished by then is killed.
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};
};

// One result of the plugin: a token, or a client certificate and key.
struct ExecCredential {
  std::string token;
  std::string clientCertPem;
  std::string clientKeyPem;
  // Unset: valid until invalidate().
  std::optional<std::chrono::system_clock::time_point> expiration;

  friend bool operator==(const ExecCredential&, const ExecCredential&) = default;
};

class ExecCredentialSource {
 public:
  // Credentials are renewed this long before their expirationTimestamp.
  static constexpr std::chrono::seconds kExpirySkew{10};

  explicit ExecCredentialSource(ExecConfig config);

  // The current credentials, running the plugin when there are none, they
  // expire within kExpirySkew, or invalidate() dropped them.
  StatusOr<ExecCredential> credentials();
  // The server refused `stale` (401): the next credentials() runs the plugin
  // again. Does nothing when the credentials have changed since (another
  // request already renewed them), so a burst of 401s runs it once.
  void invalidate(const ExecCredential& stale);
  // How often the plugin has run (for tests and logs).
  int runs() const;

  const ExecConfig& config() const { return config_; }

 private:
  StatusOr<ExecCredential> run() const;

  const ExecConfig config_;
  mutable std::mutex mu_;
  std::optional<ExecCredential> current_;  // guarded by mu_
  int runs_ = 0;                           // guarded by mu_
};

// Parses a plugin's stdout: an ExecCredential of `apiVersion` with a token or
// a certificate and key. Errors say what is missing or wrong.
StatusOr<ExecCredential> parseExecCredential(const std::string& output,
                                             const std::string& apiVersion);

}  // namespace geo::kube
