#pragma once
// SecretClusters: the region clusters a hub controller writes to, as named in
// spec.regions[].cluster: "local" is the hub's own cluster, every other name
// a member whose kubeconfig is in a Secret of the controller's namespace
// (`--member tokyo=geotrain-member-tokyo:kubeconfig`).
//
// A member's client is made on first use and kept; a Secret that is missing
// or holds no usable kubeconfig is an error naming it, tried again on the
// next call (the user may create it later) but not more than every
// `retryAfter`, so a broken member cannot slow every reconcile down.
// With enableCaches(), each cluster also gets a ClusterCache on first use.
// Thread-safe.

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "controller/kube/client.h"
#include "controller/reconcile/reconciler.h"

namespace geo::reconcile {

struct MemberSecret {
  std::string secret;
  std::string key = "kubeconfig";
};

// Parses `--member NAME=SECRET[:KEY]`; errors name the flag value and what is
// allowed (NAME a DNS label other than local).
StatusOr<std::pair<std::string, MemberSecret>> parseMemberFlag(const std::string& flag);

class SecretClusters : public Clusters {
 public:
  SecretClusters(kube::KubeClient& hub, std::string ns, std::map<std::string, MemberSecret> members,
                 kube::ClientOptions options,
                 std::chrono::milliseconds retryAfter = std::chrono::seconds(10));

  StatusOr<kube::KubeClient*> client(const std::string& cluster) override;
  // local, then the members by name.
  std::optional<std::vector<std::string>> known() const override;
  // With caching on, a cluster's cache starts with its first client() call.
  const ClusterCache* cache(const std::string& cluster) override;

  // Turns the clusters' informer caches on; `onChange` (may be empty) hears
  // of changes in any cluster (ClusterCache::OnChange). Before the first
  // client() call.
  void enableCaches(ClusterCache::OnChange onChange);
  // Replaces the listener (empty: none), e.g. before the queue it feeds ends.
  void setOnChange(ClusterCache::OnChange onChange);

 private:
  struct Member {
    MemberSecret secret;
    std::unique_ptr<kube::KubeClient> client;
    std::unique_ptr<ClusterCache> cache;
    Status lastError;
    std::chrono::steady_clock::time_point lastTry{};
  };
  kube::KubeClient& hub_;
  const std::string ns_;
  const kube::ClientOptions options_;
  const std::chrono::milliseconds retryAfter_;
  mutable std::mutex mu_;
  std::map<std::string, Member> members_;
  void notify(const std::string& ns, const std::string& job);

  bool caching_ = false;
  std::mutex notifyMu_;
  ClusterCache::OnChange onChange_;  // guarded by notifyMu_
  std::unique_ptr<ClusterCache> localCache_;
};

}  // namespace geo::reconcile
