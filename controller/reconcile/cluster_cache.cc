#include "controller/reconcile/cluster_cache.h"

#include <fmt/format.h>

#include "controller/reconcile/render.h"

namespace geo::reconcile {

namespace {

namespace res = kube::resources;
using nlohmann::json;

// The TrainingJob an object belongs to (label geotrain.io/job), or "".
std::string jobOf(const json& object) {
  const json meta = object.value("metadata", json::object());
  const json labels = meta.value("labels", json::object());
  return labels.is_object() ? labels.value("geotrain.io/job", "") : "";
}

}  // namespace

json slimForCache(json object) {
  json out = json::object();
  for (const char* key : {"apiVersion", "kind", "status", "data"}) {
    auto it = object.find(key);
    if (it != object.end()) out[key] = std::move(*it);
  }
  if (out.value("kind", "") != "Secret") out.erase("data");
  auto meta = object.find("metadata");
  if (meta == object.end() || !meta->is_object()) return out;
  // nlohmann::json spends ~100 bytes a member: keep only the members a pass
  // or a handler reads.
  json slim = json::object();
  for (const char* key : {"name", "namespace", "resourceVersion", "deletionTimestamp"}) {
    auto it = meta->find(key);
    if (it != meta->end()) slim[key] = std::move(*it);
  }
  if (auto a = meta->find("annotations"); a != meta->end() && a->is_object()) {
    for (const char* key : {"geotrain.io/applied-hash", "geotrain.io/suspend"}) {
      if (a->contains(key)) slim["annotations"][key] = std::move((*a)[key]);
    }
  }
  // A Job's spec.suspend: another manager (Kueue) may own it (render.h,
  // setJobSuspend()).
  if (auto sp = object.find("spec"); out.value("kind", "") == "Job" && sp != object.end() &&
                                     sp->is_object() && sp->contains("suspend")) {
    out["spec"]["suspend"] = std::move((*sp)["suspend"]);
  }
  if (auto l = meta->find("labels");
      l != meta->end() && l->is_object() && l->contains("geotrain.io/job"))
    slim["labels"]["geotrain.io/job"] = std::move((*l)["geotrain.io/job"]);
  out["metadata"] = std::move(slim);
  return out;
}

ClusterCache::ClusterCache(kube::KubeClient& client, OnChange onChange) {
  for (const kube::ResourceRef& r : {res::kServices, res::kSecrets, res::kConfigMaps,
                                     res::kPersistentVolumeClaims, res::kJobs}) {
    kube::InformerOptions options;
    options.labelSelector = fmt::format("app.kubernetes.io/managed-by={}", kManager);
    options.transform = slimForCache;
    auto informer = std::make_unique<kube::Informer>(client, r, "", options);
    if (onChange) {
      // What a pass must see: a deletion by anyone, and a status change (a
      // Job's workers, a load balancer's address). The controller's own
      // creates and applies are not news to it.
      kube::EventHandlers h;
      h.onUpdate = [onChange](const json& before, const json& after) {
        // A Job suspended or resumed by another manager (Kueue admitting
        // it) changes the job's status too.
        if (before.value("status", json()) != after.value("status", json()) ||
            before.value("spec", json()) != after.value("spec", json())) {
          const std::string job = jobOf(after);
          if (!job.empty()) onChange(kube::metadataField(after, "namespace"), job);
        }
      };
      h.onDelete = [onChange](const json& object) {
        const std::string job = jobOf(object);
        if (!job.empty()) onChange(kube::metadataField(object, "namespace"), job);
      };
      informer->addHandlers(std::move(h));
    }
    informer->start();
    informers_.emplace_back(r, std::move(informer));
  }
}

ClusterCache::~ClusterCache() {
  for (auto& [r, informer] : informers_) informer->stop();
}

kube::ObjectPtr ClusterCache::get(const kube::ResourceRef& resource, const std::string& ns,
                                  const std::string& name) const {
  for (const auto& [r, informer] : informers_) {
    if (r.group == resource.group && r.resource == resource.resource) {
      if (!informer->hasSynced()) return nullptr;
      return informer->store().get(ns + "/" + name);
    }
  }
  return nullptr;
}

bool ClusterCache::synced(const kube::ResourceRef& resource) const {
  for (const auto& [r, informer] : informers_) {
    if (r.group == resource.group && r.resource == resource.resource) return informer->hasSynced();
  }
  return false;
}

bool ClusterCache::synced() const {
  for (const auto& [r, informer] : informers_) {
    if (!informer->hasSynced()) return false;
  }
  return true;
}

}  // namespace geo::reconcile
