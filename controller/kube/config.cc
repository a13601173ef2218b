#include "controller/kube/config.h"

#include <sodium.h>
#include <yaml-cpp/yaml.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <system_error>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/logging.h"

namespace geo::kube {
namespace {

namespace fs = std::filesystem;

StatusOr<std::string> readFile(const fs::path& path, std::string_view what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return notFound(fmt::format("{} {}: cannot open", what, path.string()));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return dataLoss(fmt::format("{} {}: read error", what, path.string()));
  return text.str();
}

std::string trimmed(std::string text) {
  const auto first = text.find_first_not_of(" \t\r\n");
  if (first == std::string::npos) return "";
  const auto last = text.find_last_not_of(" \t\r\n");
  return text.substr(first, last - first + 1);
}

// Field access that names the file and the field path in every error.
class KubeconfigReader {
 public:
  KubeconfigReader(const fs::path& origin) : origin_(origin) {}  // NOLINT

  Status error(std::string_view field, std::string_view what) const {
    return invalidArgument(fmt::format("kubeconfig {}: {}: {}", origin_.string(), field, what));
  }

  // A scalar string field; "" when absent.
  StatusOr<std::string> string(const YAML::Node& node, std::string_view key,
                               const std::string& field) const {
    const YAML::Node value = node[std::string(key)];
    if (!value || value.IsNull()) return std::string();
    if (!value.IsScalar()) return error(field, "must be a string");
    return value.as<std::string>();
  }

  StatusOr<bool> boolean(const YAML::Node& node, std::string_view key,
                         const std::string& field) const {
    const YAML::Node value = node[std::string(key)];
    if (!value || value.IsNull()) return false;
    bool result = false;
    if (!value.IsScalar() || !YAML::convert<bool>::decode(value, result)) {
      return error(field, "must be true or false");
    }
    return result;
  }

  // The `body` map of the entry named `name` in the list `listKey`
  // (clusters/users/contexts each hold {name, <bodyKey>: {...}}).
  StatusOr<YAML::Node> entry(const YAML::Node& root, std::string_view listKey,
                             std::string_view bodyKey, const std::string& name) const {
    const YAML::Node list = root[std::string(listKey)];
    if (list && !list.IsNull() && !list.IsSequence()) return error(listKey, "must be a list");
    std::vector<std::string> names;
    if (list) {
      for (const YAML::Node& item : list) {
        if (!item.IsMap() || !item["name"] || !item["name"].IsScalar()) continue;
        const std::string itemName = item["name"].as<std::string>();
        if (itemName != name) {
          names.push_back(itemName);
          continue;
        }
        const YAML::Node body = item[std::string(bodyKey)];
        const std::string field = fmt::format("{}[name=\"{}\"].{}", listKey, name, bodyKey);
        if (!body || !body.IsMap()) return error(field, "missing or not a map");
        return body;
      }
    }
    return error(listKey,
                 fmt::format("no entry named \"{}\" (have: {})", name,
                             names.empty() ? "none" : fmt::format("{}", fmt::join(names, ", "))));
  }

  // `<key>-data` (base64) or `<key>` (a file, relative to the kubeconfig);
  // "" when neither is set.
  StatusOr<std::string> dataOrFile(const YAML::Node& node, const std::string& key,
                                   const std::string& prefix) const {
    const std::string dataKey = key + "-data";
    auto data = string(node, dataKey, prefix + "." + dataKey);
    if (!data.ok()) return data.status();
    if (!data->empty()) {
      auto decoded = decodeBase64(*data);
      if (!decoded) return error(prefix + "." + dataKey, "not valid base64");
      return *decoded;
    }
    auto file = string(node, key, prefix + "." + key);
    if (!file.ok()) return file.status();
    if (file->empty()) return std::string();
    auto contents = readFile(resolve(*file), "file");
    if (!contents.ok()) return error(prefix + "." + key, contents.status().message());
    return contents;
  }

  fs::path resolve(const std::string& file) const {
    const fs::path path(file);
    return path.is_absolute() ? path : origin_.parent_path() / path;
  }

 private:
  fs::path origin_;
};

// users[].user.exec: what the plugin is and how to run it. `config` has the
// cluster (for provideClusterInfo).
StatusOr<std::shared_ptr<ExecCredentialSource>> parseExec(const YAML::Node& exec,
                                                          const KubeconfigReader& reader,
                                                          const std::string& field,
                                                          const ClusterConfig& config) {
  if (!exec.IsMap()) return reader.error(field, "must be a map");
  ExecConfig c;
  auto text = [&](const char* key, std::string& out) -> Status {
    auto value = reader.string(exec, key, field + "." + key);
    if (!value.ok()) return value.status();
    out = *value;
    return {};
  };
  GEO_RETURN_IF_ERROR(text("apiVersion", c.apiVersion));
  GEO_RETURN_IF_ERROR(text("command", c.command));
  GEO_RETURN_IF_ERROR(text("installHint", c.installHint));
  std::string interactive;
  GEO_RETURN_IF_ERROR(text("interactiveMode", interactive));
  if (c.command.empty()) return reader.error(field + ".command", "missing");
  if (c.apiVersion != "client.authentication.k8s.io/v1" &&
      c.apiVersion != "client.authentication.k8s.io/v1beta1") {
    return reader.error(field + ".apiVersion", fmt::format("\"{}\" is not supported (supported: "
                                                           "client.authentication.k8s.io/v1, "
                                                           "client.authentication.k8s.io/v1beta1)",
                                                           c.apiVersion));
  }
  if (interactive == "Always") {
    return reader.error(field + ".interactiveMode",
                        "Always is not supported: the controller has no terminal for the plugin "
                        "(use a plugin mode that needs no user, e.g. a service account or "
                        "workload identity)");
  }
  if (!interactive.empty() && interactive != "Never" && interactive != "IfAvailable") {
    return reader.error(
        field + ".interactiveMode",
        fmt::format("\"{}\" is not one of Never, IfAvailable, Always", interactive));
  }
  if (const YAML::Node args = exec["args"]; args && !args.IsNull()) {
    if (!args.IsSequence()) return reader.error(field + ".args", "must be a list of strings");
    for (const YAML::Node& a : args) {
      if (!a.IsScalar()) return reader.error(field + ".args", "must be a list of strings");
      c.args.push_back(a.as<std::string>());
    }
  }
  if (const YAML::Node env = exec["env"]; env && !env.IsNull()) {
    if (!env.IsSequence()) return reader.error(field + ".env", "must be a list of {name, value}");
    for (size_t i = 0; i < env.size(); ++i) {
      const YAML::Node& e = env[i];
      const std::string at = fmt::format("{}.env[{}]", field, i);
      if (!e.IsMap() || !e["name"] || !e["name"].IsScalar() ||
          e["name"].as<std::string>().empty() || (e["value"] && !e["value"].IsScalar())) {
        return reader.error(at, "must be {name, value} with a name");
      }
      c.env.emplace_back(e["name"].as<std::string>(),
                         e["value"] && !e["value"].IsNull() ? e["value"].as<std::string>() : "");
    }
  }
  auto provide = reader.boolean(exec, "provideClusterInfo", field + ".provideClusterInfo");
  if (!provide.ok()) return provide.status();
  c.provideClusterInfo = *provide;
  c.dir = reader.resolve(".").parent_path();
  c.server = config.server;
  c.caPem = config.caPem;
  c.insecureSkipTlsVerify = config.insecureSkipTlsVerify;
  return std::make_shared<ExecCredentialSource>(std::move(c));
}

#define GEO_ASSIGN_OR_RETURN_STR(lhs, expr)     \
  auto lhs##Or_ = (expr);                       \
  if (!lhs##Or_.ok()) return lhs##Or_.status(); \
  std::string lhs = std::move(lhs##Or_).value()

StatusOr<ClusterConfig> parseRoot(const YAML::Node& root, const KubeconfigReader& reader,
                                  const std::string& requestedContext) {
  if (!root.IsMap()) return reader.error("(document)", "not a YAML map");
  ClusterConfig config;
  config.name = requestedContext;
  if (config.name.empty()) {
    GEO_ASSIGN_OR_RETURN_STR(current, reader.string(root, "current-context", "current-context"));
    if (current.empty()) return reader.error("current-context", "not set and no context given");
    config.name = current;
  }

  auto context = reader.entry(root, "contexts", "context", config.name);
  if (!context.ok()) return context.status();
  const std::string contextField = fmt::format("contexts[name=\"{}\"].context", config.name);
  GEO_ASSIGN_OR_RETURN_STR(clusterName,
                           reader.string(*context, "cluster", contextField + ".cluster"));
  if (clusterName.empty()) return reader.error(contextField + ".cluster", "missing");
  GEO_ASSIGN_OR_RETURN_STR(userName, reader.string(*context, "user", contextField + ".user"));
  GEO_ASSIGN_OR_RETURN_STR(ns, reader.string(*context, "namespace", contextField + ".namespace"));
  if (!ns.empty()) config.defaultNamespace = ns;

  auto cluster = reader.entry(root, "clusters", "cluster", clusterName);
  if (!cluster.ok()) return cluster.status();
  const std::string clusterField = fmt::format("clusters[name=\"{}\"].cluster", clusterName);
  GEO_ASSIGN_OR_RETURN_STR(server, reader.string(*cluster, "server", clusterField + ".server"));
  if (server.empty()) return reader.error(clusterField + ".server", "missing");
  if (!server.starts_with("https://") && !server.starts_with("http://")) {
    return reader.error(clusterField + ".server",
                        fmt::format("\"{}\" must start with https:// or http://", server));
  }
  while (server.ends_with('/')) server.pop_back();
  config.server = server;
  GEO_ASSIGN_OR_RETURN_STR(ca, reader.dataOrFile(*cluster, "certificate-authority", clusterField));
  config.caPem = ca;
  auto insecure = reader.boolean(*cluster, "insecure-skip-tls-verify",
                                 clusterField + ".insecure-skip-tls-verify");
  if (!insecure.ok()) return insecure.status();
  config.insecureSkipTlsVerify = *insecure;

  if (userName.empty()) return config;  // anonymous, as kubectl allows
  auto user = reader.entry(root, "users", "user", userName);
  if (!user.ok()) return user.status();
  const std::string userField = fmt::format("users[name=\"{}\"].user", userName);
  for (const char* unsupported : {"auth-provider", "username", "password"}) {
    if ((*user)[unsupported]) {
      return reader.error(userField + "." + unsupported,
                          "not supported (use token, tokenFile, a client certificate or exec)");
    }
  }
  if (const YAML::Node exec = (*user)["exec"]; exec && !exec.IsNull()) {
    auto plugin = parseExec(exec, reader, userField + ".exec", config);
    if (!plugin.ok()) return plugin.status();
    for (const char* other : {"token", "tokenFile", "client-certificate", "client-certificate-data",
                              "client-key", "client-key-data"}) {
      if ((*user)[other]) {
        return reader.error(userField + "." + other,
                            "cannot be combined with exec (the plugin supplies the credentials)");
      }
    }
    config.exec = std::move(*plugin);
    return config;
  }
  GEO_ASSIGN_OR_RETURN_STR(token, reader.string(*user, "token", userField + ".token"));
  GEO_ASSIGN_OR_RETURN_STR(tokenFile, reader.string(*user, "tokenFile", userField + ".tokenFile"));
  if (!token.empty()) {
    config.token = TokenSource::fixed(token);
  } else if (!tokenFile.empty()) {
    auto source = TokenSource::fromFile(reader.resolve(tokenFile));
    if (!source.ok()) return reader.error(userField + ".tokenFile", source.status().message());
    config.token = *source;
  }
  GEO_ASSIGN_OR_RETURN_STR(cert, reader.dataOrFile(*user, "client-certificate", userField));
  GEO_ASSIGN_OR_RETURN_STR(key, reader.dataOrFile(*user, "client-key", userField));
  if (cert.empty() != key.empty()) {
    return reader.error(userField + (cert.empty() ? ".client-certificate" : ".client-key"),
                        "missing (a client certificate needs both certificate and key)");
  }
  config.clientCertPem = cert;
  config.clientKeyPem = key;
  return config;
}

#undef GEO_ASSIGN_OR_RETURN_STR

}  // namespace

std::optional<std::string> decodeBase64(std::string_view text) {
  std::string out(text.size() / 4 * 3 + 3, '\0');
  size_t length = 0;
  const char* end = nullptr;
  if (sodium_base642bin(reinterpret_cast<unsigned char*>(out.data()), out.size(), text.data(),
                        text.size(), " \t\r\n", &length, &end,
                        sodium_base64_VARIANT_ORIGINAL) != 0 ||
      end != text.data() + text.size()) {
    return std::nullopt;
  }
  out.resize(length);
  return out;
}

TokenSource::TokenSource(std::string token, std::filesystem::path path)
    : token_(std::move(token)), path_(std::move(path)) {}

std::shared_ptr<TokenSource> TokenSource::fixed(std::string token) {
  return std::shared_ptr<TokenSource>(new TokenSource(std::move(token), {}));
}

StatusOr<std::shared_ptr<TokenSource>> TokenSource::fromFile(std::filesystem::path path) {
  std::shared_ptr<TokenSource> source(new TokenSource("", std::move(path)));
  std::lock_guard lock(source->mu_);
  GEO_RETURN_IF_ERROR(source->reloadLocked());
  return source;
}

Status TokenSource::reloadLocked() {
  std::error_code ec;
  const auto mtime = fs::last_write_time(path_, ec);
  if (ec) return notFound(fmt::format("token file {}: {}", path_.string(), ec.message()));
  const auto size = fs::file_size(path_, ec);
  if (ec) return notFound(fmt::format("token file {}: {}", path_.string(), ec.message()));
  if (mtime == mtime_ && size == size_ && !token_.empty()) return {};
  auto text = readFile(path_, "token file");
  if (!text.ok()) return text.status();
  std::string token = trimmed(std::move(text).value());
  if (token.empty()) return invalidArgument(fmt::format("token file {}: empty", path_.string()));
  token_ = std::move(token);
  mtime_ = mtime;
  size_ = size;
  return {};
}

std::string TokenSource::token() {
  std::lock_guard lock(mu_);
  if (!path_.empty()) {
    const Status status = reloadLocked();
    if (!status.ok()) logger()->warn("keeping the last bearer token: {}", status.message());
  }
  return token_;
}

StatusOr<ClusterConfig> parseKubeconfig(const std::string& yaml, const fs::path& origin,
                                        const std::string& context) {
  const KubeconfigReader reader(origin);
  try {
    return parseRoot(YAML::Load(yaml), reader, context);
  } catch (const YAML::Exception& e) {
    return reader.error("(document)", e.what());
  }
}

StatusOr<ClusterConfig> loadKubeconfig(const fs::path& path, const std::string& context) {
  auto text = readFile(path, "kubeconfig");
  if (!text.ok()) return text.status();
  return parseKubeconfig(*text, path, context);
}

StatusOr<ClusterConfig> loadInClusterConfig(const InClusterPaths& paths) {
  const char* host = std::getenv("KUBERNETES_SERVICE_HOST");
  const char* port = std::getenv("KUBERNETES_SERVICE_PORT");
  if (host == nullptr || port == nullptr || *host == '\0' || *port == '\0') {
    return failedPrecondition(
        "not running in a cluster: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT must be "
        "set");
  }
  ClusterConfig config;
  config.name = "in-cluster";
  const std::string_view hostView(host);
  // An IPv6 service address needs brackets in a URL.
  config.server = hostView.find(':') != std::string_view::npos
                      ? fmt::format("https://[{}]:{}", host, port)
                      : fmt::format("https://{}:{}", host, port);
  auto token = TokenSource::fromFile(paths.token);
  if (!token.ok()) return token.status().withContext("in-cluster config");
  config.token = *token;
  auto ca = readFile(paths.ca, "service-account CA");
  if (!ca.ok()) return ca.status().withContext("in-cluster config");
  config.caPem = *ca;
  std::error_code ec;
  if (fs::exists(paths.namespaceFile, ec)) {
    auto ns = readFile(paths.namespaceFile, "service-account namespace");
    if (!ns.ok()) return ns.status().withContext("in-cluster config");
    if (std::string name = trimmed(*ns); !name.empty()) config.defaultNamespace = name;
  }
  return config;
}

}  // namespace geo::kube
