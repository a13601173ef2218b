#pragma once
// ClusterCache: informers over what the controller wrote into one region
// cluster (every kind it renders, selected by the label
// app.kubernetes.io/managed-by=geotrain-controller, in every namespace).
//
// A pass then reads a region's objects from memory instead of with a GET
// each, and a change in the cluster starts a pass at once instead of at the
// next poll: a Job's status (workers ready, finished, failed) or its
// spec.suspend (another manager admitting or suspending it), a load
// balancer's address, an object deleted by someone else.
//
// Stored objects keep only what the reconciler reads (name, namespace,
// resourceVersion, the geotrain.io/ annotations it writes, status, a
// Secret's data and a Job's spec.suspend), so 1,000 jobs of 3 regions
// cost a few MiB. The cache may lag the cluster by a watch event: the
// reconciler trusts it only for objects it finds (a stale hit is corrected by
// the event that follows), and GETs what it does not find.
//
// Threading: get() from any thread. `onChange` runs on an informer thread
// and must only enqueue.

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "controller/kube/client.h"
#include "controller/kube/informer.h"

namespace geo::reconcile {

class ClusterCache {
 public:
  // (namespace, TrainingJob name) of an object that changed in a way a pass
  // must see.
  using OnChange = std::function<void(const std::string& ns, const std::string& job)>;

  // Starts one informer per kind; `client` must outlive the cache.
  ClusterCache(kube::KubeClient& client, OnChange onChange);
  ~ClusterCache();
  ClusterCache(const ClusterCache&) = delete;
  ClusterCache& operator=(const ClusterCache&) = delete;

  // The object as last seen, or null when the cache does not hold it (not
  // there, not synced yet, or a kind the cache does not follow).
  kube::ObjectPtr get(const kube::ResourceRef& resource, const std::string& ns,
                      const std::string& name) const;

  // True once every informer has listed its kind; synced(r): the kind of r
  // (then a null get() means the cluster has no such object, as far as the
  // last watch event tells).
  bool synced() const;
  bool synced(const kube::ResourceRef& resource) const;

 private:
  std::vector<std::pair<kube::ResourceRef, std::unique_ptr<kube::Informer>>> informers_;
};

// What the cache keeps of an object (see above).
nlohmann::json slimForCache(nlohmann::json object);

}  // namespace geo::reconcile
