#include "controller/reconcile/clusters.h"

#include <fmt/format.h>

#include <optional>
#include <set>
#include <utility>

#include "common/enforce.h"
#include "common/logging.h"
#include "controller/kube/config.h"

namespace geo::reconcile {

// A member's client that can switch to another kubeconfig's client while in
// use: every request goes to the client current when it starts, which stays
// alive until the request ends. A watch stream open on a replaced client is
// ended as if the server had closed it, so that its watcher reconnects with
// the new credentials (and lists again if the server is another one).
class SecretClusters::SwitchableClient final : public kube::KubeClient {
 public:
  explicit SwitchableClient(std::unique_ptr<kube::KubeClient> first)
      : ns_(first->defaultNamespace()), options_(first->options()) {
    replace(std::move(first));
  }

  void replace(std::unique_ptr<kube::KubeClient> next) {
    auto generation = std::make_shared<Generation>();
    generation->client = std::move(next);
    std::shared_ptr<Generation> old;
    {
      std::lock_guard lock(mu_);
      old = std::exchange(current_, std::move(generation));
    }
    if (old) old->retired.cancel();
  }

  kube::ApiResult<nlohmann::json> call(const kube::ApiRequest& request,
                                       const kube::CancelToken* cancel) override {
    return current()->client->call(request, cancel);
  }

  kube::ApiResult<std::monostate> stream(const kube::ApiRequest& request,
                                         const std::function<void(std::string_view)>& onChunk,
                                         std::chrono::milliseconds timeout,
                                         const kube::CancelToken& cancel) override {
    const std::shared_ptr<Generation> generation = current();
    kube::CancelToken either;
    const kube::CancelToken::Subscription byCaller(cancel, [&either] { either.cancel(); });
    const kube::CancelToken::Subscription byReplace(generation->retired,
                                                    [&either] { either.cancel(); });
    auto result = generation->client->stream(request, onChunk, timeout, either);
    if (!result.ok() && result.error().isCancelled() && !cancel.cancelled()) {
      return std::monostate{};  // replaced: ended as by the server
    }
    return result;
  }

  // The first kubeconfig's: the controller names a namespace in every call.
  const std::string& defaultNamespace() const override { return ns_; }
  const kube::ClientOptions& options() const override { return options_; }

 private:
  struct Generation {
    std::unique_ptr<kube::KubeClient> client;
    kube::CancelToken retired;
  };

  std::shared_ptr<Generation> current() {
    std::lock_guard lock(mu_);
    return current_;
  }

  const std::string ns_;
  const kube::ClientOptions options_;
  std::mutex mu_;
  std::shared_ptr<Generation> current_;  // guarded by mu_
};

namespace {

// The kubeconfig in `key` of a Secret's data, or nullopt.
std::optional<std::string> kubeconfigOf(const nlohmann::json& secret, const std::string& key) {
  const nlohmann::json data = secret.value("data", nlohmann::json::object());
  if (!data.is_object() || !data.contains(key) || !data[key].is_string()) return std::nullopt;
  return kube::decodeBase64(data[key].get<std::string>());
}

StatusOr<std::unique_ptr<kube::KubeClient>> clientFor(const std::string& yaml,
                                                      const std::string& where,
                                                      const kube::ClientOptions& options) {
  auto config = kube::parseKubeconfig(yaml, where);
  if (!config.ok()) return config.status();
  auto client = kube::makeKubeClient(std::move(*config), options);
  if (!client.ok()) return client.status().withContext(where);
  return std::move(*client);
}

}  // namespace

StatusOr<std::pair<std::string, MemberSecret>> parseMemberFlag(const std::string& flag) {
  const size_t eq = flag.find('=');
  const std::string allowed =
      "allowed: NAME=SECRET or NAME=SECRET:KEY, NAME a DNS label other than local";
  if (eq == std::string::npos || eq == 0 || eq + 1 == flag.size()) {
    return invalidArgument(fmt::format("--member {}: not NAME=SECRET ({})", flag, allowed));
  }
  const std::string name = flag.substr(0, eq);
  std::string secret = flag.substr(eq + 1);
  MemberSecret m;
  if (const size_t colon = secret.find(':'); colon != std::string::npos) {
    m.key = secret.substr(colon + 1);
    secret = secret.substr(0, colon);
  }
  m.secret = secret;
  if (!api::isDnsLabel(name) || name == api::kLocalCluster || m.secret.empty() || m.key.empty()) {
    return invalidArgument(fmt::format("--member {}: not allowed ({})", flag, allowed));
  }
  return std::make_pair(name, m);
}

SecretClusters::SecretClusters(kube::KubeClient& hub, std::string ns,
                               std::map<std::string, MemberSecret> members,
                               kube::ClientOptions options, std::chrono::milliseconds retryAfter,
                               const Clock& clock)
    : hub_(hub),
      ns_(std::move(ns)),
      options_(std::move(options)),
      retryAfter_(retryAfter),
      clock_(clock) {
  for (auto& [name, secret] : members) members_[name].secret = std::move(secret);
}

void SecretClusters::enableCaches(ClusterCache::OnChange onChange) {
  {
    std::lock_guard lock(mu_);
    caching_ = true;
  }
  setOnChange(std::move(onChange));
}

void SecretClusters::setOnChange(ClusterCache::OnChange onChange) {
  std::lock_guard lock(notifyMu_);
  onChange_ = std::move(onChange);
}

void SecretClusters::notify(const std::string& ns, const std::string& job) {
  std::lock_guard lock(notifyMu_);
  if (onChange_) onChange_(ns, job);
}

const ClusterCache* SecretClusters::cache(const std::string& cluster) {
  std::lock_guard lock(mu_);
  if (cluster == api::kLocalCluster) return localCache_.get();
  auto it = members_.find(cluster);
  return it == members_.end() ? nullptr : it->second.cache.get();
}

std::optional<std::vector<std::string>> SecretClusters::known() const {
  std::lock_guard lock(mu_);
  std::vector<std::string> names = {std::string(api::kLocalCluster)};
  for (const auto& [name, m] : members_) names.push_back(name);
  return names;
}

StatusOr<kube::KubeClient*> SecretClusters::client(const std::string& cluster) {
  std::lock_guard lock(mu_);
  if (cluster == api::kLocalCluster) {
    if (caching_ && !localCache_)
      localCache_ = std::make_unique<ClusterCache>(
          hub_, [this](const std::string& ns, const std::string& job) { notify(ns, job); });
    return &hub_;
  }
  auto it = members_.find(cluster);
  if (it == members_.end()) {
    std::string known = std::string(api::kLocalCluster);
    for (const auto& [name, m] : members_) known += ", " + name;
    return notFound(
        fmt::format("cluster {} is not a member cluster (known: {}; members are listed in the hub "
                    "chart's values, members[].name)",
                    cluster, known));
  }
  Member& m = it->second;
  if (m.client) return m.client.get();
  const auto now = clock_.now();
  if (!m.lastError.ok() && m.lastTry && now - *m.lastTry < retryAfter_) return m.lastError;
  m.lastTry = now;
  const std::string where =
      fmt::format("member {}: Secret {}/{} key {}", cluster, ns_, m.secret.secret, m.secret.key);
  auto secret = hub_.get(kube::resources::kSecrets, ns_, m.secret.secret);
  if (!secret.ok()) {
    m.lastError = secret.status(where);
    return m.lastError;
  }
  std::optional<std::string> yaml = kubeconfigOf(*secret, m.secret.key);
  if (!yaml) {
    m.lastError = failedPrecondition(where + ": no such key, or not base64");
    return m.lastError;
  }
  auto client = clientFor(*yaml, where, options_);
  if (!client.ok()) {
    m.lastError = client.status();
    return m.lastError;
  }
  m.client = std::make_unique<SwitchableClient>(std::move(*client));
  m.kubeconfig = std::move(*yaml);
  m.lastError = {};
  if (caching_)
    m.cache = std::make_unique<ClusterCache>(
        *m.client, [this](const std::string& ns, const std::string& job) { notify(ns, job); });
  return m.client.get();
}

SecretClusters::~SecretClusters() {
  if (secrets_) secrets_->stop();
}

void SecretClusters::watchSecrets(std::chrono::milliseconds timeout) {
  std::set<std::string> names;
  {
    std::lock_guard lock(mu_);
    GEO_ENFORCE(!secrets_, "watchSecrets() is called once");
    for (const auto& [cluster, m] : members_) names.insert(m.secret.secret);
  }
  kube::InformerOptions options;
  // The namespace may hold other Secrets (Helm's releases, tokens): only the
  // members' are kept, and of them only their data.
  options.transform = [names](nlohmann::json secret) {
    nlohmann::json slim = {{"metadata",
                            {{"name", kube::metadataField(secret, "name")},
                             {"namespace", kube::metadataField(secret, "namespace")},
                             {"resourceVersion", kube::metadataField(secret, "resourceVersion")}}}};
    if (names.count(kube::metadataField(secret, "name")) != 0 && secret.contains("data")) {
      slim["data"] = std::move(secret["data"]);
    }
    return slim;
  };
  auto informer = std::make_unique<kube::Informer>(hub_, kube::resources::kSecrets, ns_, options);
  kube::EventHandlers handlers;
  handlers.onAdd = [this](const nlohmann::json& s) { secretChanged(s); };
  handlers.onUpdate = [this](const nlohmann::json&, const nlohmann::json& s) { secretChanged(s); };
  informer->addHandlers(std::move(handlers));
  kube::Informer* started = informer.get();
  {
    std::lock_guard lock(mu_);
    secrets_ = std::move(informer);
  }
  started->start();
  if (!started->waitForSync(timeout)) {
    logger()->warn("member Secrets in {}: not listed within {} ms; watching on", ns_,
                   timeout.count());
  }
}

int SecretClusters::reloads(const std::string& cluster) {
  std::lock_guard lock(mu_);
  auto it = members_.find(cluster);
  return it == members_.end() ? 0 : it->second.reloads;
}

void SecretClusters::secretChanged(const nlohmann::json& secret) {
  const std::string name = kube::metadataField(secret, "name");
  std::lock_guard lock(mu_);
  for (auto& [cluster, m] : members_) {
    if (m.secret.secret != name) continue;
    if (!m.client) {
      m.lastTry.reset();  // not made yet, or failed: the next client() reads the Secret at once
      continue;
    }
    const std::string where =
        fmt::format("member {}: Secret {}/{} key {}", cluster, ns_, name, m.secret.key);
    std::optional<std::string> yaml = kubeconfigOf(secret, m.secret.key);
    if (yaml && *yaml == m.kubeconfig) continue;  // another key, or only metadata, changed
    auto next = yaml ? clientFor(*yaml, where, options_)
                     : StatusOr<std::unique_ptr<kube::KubeClient>>(
                           failedPrecondition(where + ": no such key, or not base64"));
    if (!next.ok()) {
      logger()->warn("{}: changed, but cannot be used ({}); the member keeps its kubeconfig", where,
                     next.status().message());
      continue;
    }
    m.client->replace(std::move(*next));
    m.kubeconfig = std::move(*yaml);
    ++m.reloads;
    logger()->info("{}: changed; the member's requests use its new kubeconfig from now on", where);
  }
}

}  // namespace geo::reconcile
