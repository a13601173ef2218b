#pragma once
// Where a cluster is and how to authenticate to it: from a kubeconfig file or
// from inside a pod (in-cluster). One ClusterConfig, one client, one cluster.
//
// Errors: StatusOr with InvalidArgument (NotFound for a missing file) whose
// message names the file and the field path that is missing or invalid, e.g.
//   kubeconfig /etc/kube/config: users[name="ci"].user.client-key-data: not valid base64
// Certificate and key files are read when the config is loaded (so errors
// surface there); only the bearer token file is re-read later, because
// projected service-account tokens rotate.

#include <cstdint>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include "common/status.h"
#include "controller/kube/exec_credential.h"

namespace geo::kube {

// A bearer token, either fixed or read from a file that is re-read whenever
// its modification time or size changes (kubelet rewrites projected tokens
// long before they expire). Thread-safe.
class TokenSource {
 public:
  static std::shared_ptr<TokenSource> fixed(std::string token);
  // Reads the file now; NotFound/InvalidArgument when it is missing or empty.
  static StatusOr<std::shared_ptr<TokenSource>> fromFile(std::filesystem::path path);

  // The current token. A file that cannot be re-read (mid-rotation) keeps the
  // last good token and logs a warning.
  std::string token();
  const std::filesystem::path& path() const { return path_; }

 private:
  TokenSource(std::string token, std::filesystem::path path);
  Status reloadLocked();

  std::mutex mu_;
  std::string token_;
  std::filesystem::path path_;  // empty: fixed token
  std::filesystem::file_time_type mtime_{};
  std::uintmax_t size_ = 0;
};

struct ClusterConfig {
  // The context name, or "in-cluster".
  std::string name;
  // "https://host:port" without a trailing slash.
  std::string server;
  // PEM; "" trusts the system store (or nothing, with insecureSkipTlsVerify).
  std::string caPem;
  // PEM client certificate and key; both or neither.
  std::string clientCertPem;
  std::string clientKeyPem;
  bool insecureSkipTlsVerify = false;
  // The context's namespace (or the service account's); "default" if unset.
  std::string defaultNamespace = "default";
  // Null: no Authorization header.
  std::shared_ptr<TokenSource> token;
  // An exec credential plugin (users[].user.exec): a token or a client
  // certificate from it on every request, instead of `token` and the
  // certificate above. Null: none.
  std::shared_ptr<ExecCredentialSource> exec;
};

// Loads `path` and resolves `context` ("" = current-context). Relative file
// paths inside the kubeconfig are relative to its directory, as kubectl does.
// Supported: server, certificate-authority(-data), insecure-skip-tls-verify,
// token, tokenFile, client-certificate(-data), client-key(-data), and exec
// credential plugins (client.authentication.k8s.io/v1 and v1beta1:
// command, args, env, installHint, provideClusterInfo, interactiveMode Never
// or IfAvailable; see exec_credential.h); the plugin runs on first use, not
// here. auth-provider plugins and basic auth are rejected by name.
StatusOr<ClusterConfig> loadKubeconfig(const std::filesystem::path& path,
                                       const std::string& context = "");

// The same from YAML text; `origin` names it in messages and anchors relative
// paths (its parent directory).
StatusOr<ClusterConfig> parseKubeconfig(const std::string& yaml,
                                        const std::filesystem::path& origin,
                                        const std::string& context = "");

// Files of the pod's service account; the defaults are where the kubelet
// mounts them, tests point them elsewhere.
struct InClusterPaths {
  std::filesystem::path token = "/var/run/secrets/kubernetes.io/serviceaccount/token";
  std::filesystem::path ca = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt";
  std::filesystem::path namespaceFile = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";
};

// From KUBERNETES_SERVICE_HOST / KUBERNETES_SERVICE_PORT and the service
// account files. FailedPrecondition when not running in a pod (variables
// unset); the namespace file is optional ("default" without it).
StatusOr<ClusterConfig> loadInClusterConfig(const InClusterPaths& paths = {});

// Decodes standard base64 (whitespace ignored), as kubeconfig *-data fields
// hold; nullopt when it is not valid base64.
std::optional<std::string> decodeBase64(std::string_view text);

}  // namespace geo::kube
