#pragma once
// SecretClusters: the region clusters a hub controller writes to, as named in
// spec.regions[].cluster: "local" is the hub's own cluster, every other name
// a member whose kubeconfig is in a Secret of the controller's namespace
// (`--member tokyo=geotrain-member-tokyo:kubeconfig`).
//
// A member's client is made on first use and kept; a Secret that is missing
// or holds no usable kubeconfig is an error naming it, tried again on the
// next call (the user may create it later) but not more than every
// `retryAfter` (measured on `clock`), so a broken member cannot slow every
// reconcile down. A member never tried, or whose Secret changed since the
// last try, is read on its next call whatever the time.
// With enableCaches(), each cluster also gets a ClusterCache on first use.
//
// With watchSecrets(), the member Secrets are watched: when one changes (a
// rotated token, a new certificate, a moved API server), the member's
// client switches to the new kubeconfig for every request from then on,
// without a restart. The pointer client() returned stays the same (a
// request in flight finishes on the old connection), so its ClusterCache
// and every holder of it follow. A changed Secret that holds no usable
// kubeconfig is logged and the member keeps the kubeconfig it has.
// Thread-safe.

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "common/clock.h"
#include "controller/kube/client.h"
#include "controller/kube/informer.h"
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
                 std::chrono::milliseconds retryAfter = std::chrono::seconds(10),
                 const Clock& clock = systemClock());

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

  // Starts watching the member Secrets (one informer over the Secrets of
  // the namespace, keeping only the members' keys); returns once it has
  // listed them, or after `timeout`. Once; the destructor stops it.
  void watchSecrets(std::chrono::milliseconds timeout = std::chrono::seconds(10));
  // How often a member's client has switched to a changed kubeconfig.
  int reloads(const std::string& cluster);

  ~SecretClusters() override;

 private:
  class SwitchableClient;
  struct Member {
    MemberSecret secret;
    std::unique_ptr<SwitchableClient> client;
    // The kubeconfig the client was made from.
    std::string kubeconfig;
    int reloads = 0;
    std::unique_ptr<ClusterCache> cache;
    Status lastError;
    // When the Secret was last read; empty: never, or it changed since, so
    // the next client() reads it at once. (Not a default time_point: that is
    // the clock's epoch, the machine's boot, which is not "long ago" on a
    // machine up for less than retryAfter.)
    std::optional<Clock::TimePoint> lastTry;
  };
  kube::KubeClient& hub_;
  const std::string ns_;
  const kube::ClientOptions options_;
  const std::chrono::milliseconds retryAfter_;
  const Clock& clock_;
  mutable std::mutex mu_;
  std::map<std::string, Member> members_;
  void notify(const std::string& ns, const std::string& job);
  // A member Secret as the informer saw it.
  void secretChanged(const nlohmann::json& secret);

  bool caching_ = false;
  std::mutex notifyMu_;
  ClusterCache::OnChange onChange_;  // guarded by notifyMu_
  std::unique_ptr<ClusterCache> localCache_;
  // Last: stopped first, as its handler uses the members.
  std::unique_ptr<kube::Informer> secrets_;
};

}  // namespace geo::reconcile
