#include "controller/reconcile/clusters.h"

#include <fmt/format.h>

#include "controller/kube/config.h"

namespace geo::reconcile {

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
                               kube::ClientOptions options, std::chrono::milliseconds retryAfter)
    : hub_(hub), ns_(std::move(ns)), options_(std::move(options)), retryAfter_(retryAfter) {
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
  const auto now = std::chrono::steady_clock::now();
  if (!m.lastError.ok() && now - m.lastTry < retryAfter_) return m.lastError;
  m.lastTry = now;
  const std::string where =
      fmt::format("member {}: Secret {}/{} key {}", cluster, ns_, m.secret.secret, m.secret.key);
  auto secret = hub_.get(kube::resources::kSecrets, ns_, m.secret.secret);
  if (!secret.ok()) {
    m.lastError = secret.status(where);
    return m.lastError;
  }
  const nlohmann::json data = secret->value("data", nlohmann::json::object());
  std::optional<std::string> yaml;
  if (data.contains(m.secret.key) && data[m.secret.key].is_string()) {
    yaml = kube::decodeBase64(data[m.secret.key].get<std::string>());
  }
  if (!yaml) {
    m.lastError = failedPrecondition(where + ": no such key, or not base64");
    return m.lastError;
  }
  auto config = kube::parseKubeconfig(*yaml, where);
  if (!config.ok()) {
    m.lastError = config.status();
    return m.lastError;
  }
  auto client = kube::makeKubeClient(std::move(*config), options_);
  if (!client.ok()) {
    m.lastError = client.status().withContext(where);
    return m.lastError;
  }
  m.client = std::move(*client);
  m.lastError = {};
  if (caching_)
    m.cache = std::make_unique<ClusterCache>(
        *m.client, [this](const std::string& ns, const std::string& job) { notify(ns, job); });
  return m.client.get();
}

}  // namespace geo::reconcile
