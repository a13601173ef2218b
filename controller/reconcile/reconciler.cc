#include "controller/reconcile/reconciler.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <optional>
#include <thread>

#include "common/keys/keys.h"
#include "common/logging.h"
#include "controller/kube/config.h"
#include "controller/kube/kube_time.h"
#include "controller/reconcile/pod_problems.h"
#include "controller/reconcile/progress.h"
#include "controller/reconcile/status.h"

namespace geo::reconcile {

namespace {

using nlohmann::json;
namespace res = kube::resources;

bool hasFinalizer(const json& object) {
  const json meta = object.value("metadata", json::object());
  const json fin = meta.value("finalizers", json::array());
  return std::find(fin.begin(), fin.end(), json(std::string(api::kFinalizer))) != fin.end();
}

// The regions of a spec as far as they can be read, for cleanup: a spec that
// turned invalid after its objects were created still names their regions.
std::vector<api::Region> looseRegions(const json& object) {
  std::vector<api::Region> out;
  const json spec = object.value("spec", json::object());
  if (!spec.is_object() || !spec.contains("regions") || !spec["regions"].is_array()) return out;
  for (const json& r : spec["regions"]) {
    if (!r.is_object() || !r.contains("name") || !r["name"].is_string()) continue;
    api::Region region;
    region.name = r["name"];
    if (r.contains("cluster") && r["cluster"].is_string()) region.cluster = r["cluster"];
    out.push_back(std::move(region));
  }
  return out;
}

// Secret keys of ranks [first, first + count) from a region's key Secret,
// with their public keys; a missing or malformed entry stays empty.
void readKeys(const json& secret, int64_t first, int64_t count, std::vector<RankKeys>& keys) {
  const json data = secret.value("data", json::object());
  for (int64_t r = first; r < first + count; ++r) {
    const std::string file = fmt::format("worker-{}.key", r);
    if (!data.contains(file) || !data[file].is_string()) continue;
    std::optional<std::string> text = kube::decodeBase64(data[file].get<std::string>());
    if (!text) continue;
    while (!text->empty() && (text->back() == '\n' || text->back() == '\r')) text->pop_back();
    auto pub = keys::publicKeyOf(*text);
    if (!pub.ok()) continue;
    keys[static_cast<size_t>(r)] = {*pub, *text};
  }
}

// 404 for the namespace itself: what an API server answers to a write
// into a namespace it does not have.
bool isMissingNamespace(const kube::ApiError& e) {
  return e.isNotFound() && e.details.is_object() && e.details.value("kind", "") == "namespaces";
}

std::string describe(const kube::ApiError& e) {
  return e.toStatus().message();
}

// What phase 4 learns about one region, for phase 5.
struct RegionWork {
  kube::KubeClient* client = nullptr;  // null: the region failed this pass
  json secret, claim, configMap;       // as read; null when absent
  bool retry = false;
};

// GET into `out` (null when not found); "" or what went wrong.
std::string read(kube::KubeClient& c, const kube::ResourceRef& resource, const std::string& ns,
                 const std::string& name, json& out) {
  auto g = c.get(resource, ns, name);
  if (g.ok()) {
    out = std::move(*g);
    return "";
  }
  if (g.error().isNotFound()) {
    out = nullptr;
    return "";
  }
  return describe(g.error());
}

constexpr std::string_view kAppliedHash = "geotrain.io/applied-hash";

// Worker problems reported per region and pass (pod_problems.h).
constexpr size_t kProblemsPerRegion = 5;

// FNV-1a (64 bit) of the object as rendered, in hex: stable across builds
// and hosts, which std::hash is not.
std::string contentHash(const json& object) {
  uint64_t h = 1469598103934665603ULL;
  for (const char c : object.dump()) {
    h ^= static_cast<unsigned char>(c);
    h *= 1099511628211ULL;
  }
  return fmt::format("{:016x}", h);
}

// Server-side applies `desired` (stamped with the hash of its content)
// unless `live` already carries that hash and `full` is false; returns the
// object as it is now.
kube::ApiResult<json> applyChanged(kube::KubeClient& c, const kube::ResourceRef& resource,
                                   const std::string& ns, const json& live, json desired,
                                   bool full) {
  const std::string hash = contentHash(desired);
  if (!full && live.is_object()) {
    const json annotations = live["metadata"].value("annotations", json::object());
    if (annotations.value(std::string(kAppliedHash), "") == hash) return live;
  }
  desired["metadata"]["annotations"][std::string(kAppliedHash)] = hash;
  kube::PatchOptions force;
  force.force = true;
  return c.apply(resource, ns, desired, force);
}

// How long until a finished job's spec.ttlSecondsAfterFinished is up (zero
// or less: now), counted from the lastTransitionTime of its Succeeded or
// Failed condition; nullopt when the job has not finished or sets no TTL.
// The field is read loosely: a finished job's spec is not validated again.
std::optional<std::chrono::milliseconds> ttlLeft(const json& object,
                                                 const api::TrainingJobStatus& status) {
  const json spec = object.value("spec", json::object());
  if (!spec.is_object() || !spec.contains("ttlSecondsAfterFinished")) return std::nullopt;
  const json& ttl = spec["ttlSecondsAfterFinished"];
  if (!ttl.is_number_integer() || ttl.get<int64_t>() < 0) return std::nullopt;
  for (std::string_view type : {api::kConditionSucceeded, api::kConditionFailed}) {
    const api::Condition* c = api::findCondition(status.conditions, type);
    if (c == nullptr || c->status != "True") continue;
    const auto finished = kube::parseTime(c->lastTransitionTime);
    if (!finished) return std::chrono::milliseconds(0);  // no time to count from: at once
    return std::chrono::duration_cast<std::chrono::milliseconds>(
        *finished + std::chrono::seconds(ttl.get<int64_t>()) - std::chrono::system_clock::now());
  }
  return std::nullopt;
}

}  // namespace

std::vector<api::FieldError> unknownClusters(const api::TrainingJobSpec& spec,
                                             const std::optional<std::vector<std::string>>& known) {
  std::vector<api::FieldError> errors;
  if (!known) return errors;
  for (size_t i = 0; i < spec.regions.size(); ++i) {
    const std::string& cluster = spec.regions[i].cluster;
    if (std::find(known->begin(), known->end(), cluster) != known->end()) continue;
    errors.push_back({api::FieldError::Type::kNotSupported,
                      fmt::format("spec.regions[{}].cluster", i),
                      fmt::format("{} is not a member cluster; known: {} (members are listed in "
                                  "the hub chart's values, members[].name)",
                                  json(cluster).dump(), fmt::join(*known, ", "))});
  }
  return errors;
}

bool needsReconcile(const json& oldObject, const json& newObject) {
  auto strip = [](json o) {
    o.erase("status");
    if (o.contains("metadata") && o["metadata"].is_object()) {
      o["metadata"].erase("resourceVersion");
      o["metadata"].erase("managedFields");
    }
    return o;
  };
  return strip(oldObject) != strip(newObject);
}

bool Reconciler::dueForFullApply(const std::string& key) {
  const auto now = std::chrono::steady_clock::now();
  std::lock_guard lock(fullApplyMu_);
  auto [it, isNew] = lastFullApply_.try_emplace(key, now);
  if (isNew) return true;
  if (now - it->second < options_.fullApplyEvery) return false;
  it->second = now;
  return true;
}

void Reconciler::forgetFullApply(const std::string& key) {
  std::lock_guard lock(fullApplyMu_);
  lastFullApply_.erase(key);
}

bool Reconciler::firstSighting(const std::string& job, const std::string& uid,
                               const std::string& key) {
  std::lock_guard lock(problemsMu_);
  Sightings& seen = reportedProblems_[job];
  // Another incarnation of the name, or bounded: a job whose pods keep
  // failing for days forgets its old sightings rather than growing without
  // end (a repeat is then one more Event, which the recorder aggregates).
  if (seen.uid != uid || seen.keys.size() >= kMaxRememberedProblems) {
    seen.uid = uid;
    seen.keys.clear();
  }
  return seen.keys.insert(key).second;
}

void Reconciler::forgetProblems(const std::string& job) {
  std::lock_guard lock(problemsMu_);
  reportedProblems_.erase(job);
}

Reconciler::Reconciler(kube::KubeClient& hub, Clusters& clusters, kube::EventRecorder* events,
                       ReconcilerOptions options, std::function<std::string()> now)
    : hub_(hub),
      clusters_(clusters),
      events_(events),
      options_(std::move(options)),
      now_(std::move(now)),
      pool_(options_.regionThreads) {}

void Reconciler::event(const json& object, bool warning, std::string_view reason,
                       const std::string& message) {
  if (events_ == nullptr) return;
  events_->record(kube::ObjectReference::of(object),
                  warning ? kube::EventType::kWarning : kube::EventType::kNormal, reason, message);
}

Status Reconciler::writeStatus(const json& object, const api::TrainingJobStatus& previous,
                               const api::TrainingJobStatus& status) {
  if (status == previous) return {};  // a converged job writes nothing
  json updated = object;
  updated["status"] = api::statusToJson(status);
  auto r = hub_.updateStatus(kTrainingJobs, kube::metadataField(object, "namespace"), updated);
  if (!r.ok()) return r.status("update TrainingJob status");
  // Events on the transitions users care about.
  auto flipped = [&](std::string_view type) {
    const api::Condition* now = api::findCondition(status.conditions, type);
    const api::Condition* before = api::findCondition(previous.conditions, type);
    return now != nullptr && now->status == "True" &&
           (before == nullptr || before->status != "True");
  };
  if (flipped(api::kConditionSucceeded))
    event(object, false, "Succeeded", "every region completed");
  if (flipped(api::kConditionFailed)) {
    event(object, true, "Failed",
          api::findCondition(status.conditions, api::kConditionFailed)->message);
  }
  // RegionDegraded both ways: a region lost (its cluster, or a worker that
  // is being restarted) and every region whole again, so that `kubectl
  // describe` tells how long a restart took. A job that failed, succeeded
  // or was suspended meanwhile is not degraded any more either, but has
  // not recovered: its own event says what happened.
  if (flipped(api::kConditionRegionDegraded)) {
    event(object, true, "RegionDegraded",
          api::findCondition(status.conditions, api::kConditionRegionDegraded)->message);
  }
  const api::Condition* degradedBefore =
      api::findCondition(previous.conditions, api::kConditionRegionDegraded);
  const api::Condition* degradedNow =
      api::findCondition(status.conditions, api::kConditionRegionDegraded);
  if (degradedBefore != nullptr && degradedBefore->status == "True" && degradedNow != nullptr &&
      degradedNow->status == "False" && (status.state == "Running" || status.state == "Pending")) {
    event(object, false, "RegionRecovered",
          "no region is degraded any more (was: " + degradedBefore->message + ")");
  }
  return {};
}

StatusOr<ReconcileResult> Reconciler::cleanup(const json& object, const JobRef& job) {
  ReconcileResult result;
  if (!hasFinalizer(object)) return result;  // someone else's finalizers remain
  const std::vector<api::Region> regions = looseRegions(object);
  const std::optional<std::vector<std::string>> known = clusters_.known();
  std::vector<std::string> regionFailure(regions.size());
  pool_.parallelFor(regions.size(), [&](size_t i) {
    const api::Region& r = regions[i];
    // A cluster that is no member was never written to (its spec was
    // invalid): nothing to delete there.
    if (known && std::find(known->begin(), known->end(), r.cluster) == known->end()) {
      logger()->info("trainingjob {}/{}: region {}: cluster {} is no member, nothing to delete",
                     job.ns, job.name, r.name, r.cluster);
      return;
    }
    auto client = clusters_.client(r.cluster);
    if (!client.ok()) {
      regionFailure[i] = r.name + ": " + client.status().message();
      return;
    }
    kube::DeleteOptions background;
    background.propagationPolicy = kube::PropagationPolicy::kBackground;
    const std::vector<std::pair<kube::ResourceRef, std::string>> objects = {
        {res::kJobs, workerJobName(job, r.name)},
        {res::kServices, gatewayServiceName(job, r.name)},
        {res::kServices, headlessServiceName(job, r.name)},
        {res::kConfigMaps, configMapName(job, r.name)},
        {res::kSecrets, keysSecretName(job, r.name)},
        {res::kPersistentVolumeClaims, checkpointClaimName(job, r.name)}};
    for (const auto& [resource, name] : objects) {
      auto d = (*client)->remove(resource, job.ns, name, background);
      if (!d.ok() && !d.error().isNotFound()) {
        regionFailure[i] = fmt::format("{}: delete {} {}: {}", r.name, resource.resource, name,
                                       describe(d.error()));
        return;
      }
    }
  });
  std::vector<std::string> failures;
  for (std::string& f : regionFailure) {
    if (!f.empty()) failures.push_back(std::move(f));
  }
  json current = object;
  if (!failures.empty()) {
    // How long deletion has waited (deletionTimestamp): past
    // options_.cleanupTimeout the regions that still fail are given up, so
    // that deleting a TrainingJob always completes.
    const auto since = kube::parseTime(current["metadata"].value("deletionTimestamp", ""));
    const auto waited = since ? std::chrono::duration_cast<std::chrono::seconds>(
                                    std::chrono::system_clock::now() - *since)
                              : std::chrono::seconds(0);
    const bool giveUp = waited >= options_.cleanupTimeout;
    const std::string list = fmt::format("{}", fmt::join(failures, "; "));
    const std::string message =
        giveUp ? fmt::format(
                     "gave up deleting after {} s (cleanupTimeout); what is left stays in "
                     "these regions (delete it there: label geotrain.io/job={}): {}",
                     waited.count(), job.name, list)
               : fmt::format("cannot delete in: {} (retrying; giving up {} s after the deletion)",
                             list, options_.cleanupTimeout.count() / 1000);
    api::TrainingJobStatus previous = api::statusFromJson(current.value("status", json::object()));
    api::TrainingJobStatus status = previous;
    api::setCondition(status.conditions,
                      {std::string(api::kConditionRegionDegraded), "True",
                       current["metadata"].value("generation", int64_t{0}), "",
                       giveUp ? "CleanupAbandoned" : "CleanupBlocked", message},
                      now_());
    (void)writeStatus(current, previous, status);
    if (!giveUp) {
      logger()->warn("trainingjob {}/{}: cleanup incomplete, retrying: {}", job.ns, job.name, list);
      result.retry = true;
      return result;
    }
    logger()->warn("trainingjob {}/{}: {}", job.ns, job.name, message);
    event(current, true, "CleanupAbandoned", message);
    // The status write moved the resourceVersion on.
    auto fresh = hub_.get(kTrainingJobs, job.ns, job.name);
    if (!fresh.ok()) {
      if (fresh.error().isNotFound()) return result;
      result.retry = true;
      return result;
    }
    current = std::move(*fresh);
  }
  json updated = current;
  json fin = json::array();
  for (const json& f : current["metadata"]["finalizers"]) {
    if (f != std::string(api::kFinalizer)) fin.push_back(f);
  }
  updated["metadata"]["finalizers"] = fin;
  auto u = hub_.update(kTrainingJobs, job.ns, updated);
  if (!u.ok() && !u.error().isNotFound()) {
    if (u.error().isConflict()) {
      result.retry = true;
      return result;
    }
    return u.status("remove the finalizer");
  }
  logger()->info("trainingjob {}/{}: deleted its objects in every region", job.ns, job.name);
  return result;
}

StatusOr<ReconcileResult> Reconciler::reconcile(const std::string& ns, const std::string& name) {
  ReconcileResult result;
  auto got = hub_.get(kTrainingJobs, ns, name);
  if (!got.ok()) {
    if (got.error().isNotFound()) {  // gone: nothing left to do
      forgetFullApply(ns + "/" + name);
      forgetProblems(ns + "/" + name);
      return result;
    }
    return got.status("get TrainingJob " + ns + "/" + name);
  }
  json object = std::move(*got);
  const JobRef job = jobRefOf(object);
  if (object["metadata"].contains("deletionTimestamp")) {
    forgetProblems(ns + "/" + name);
    return cleanup(object, job);
  }

  if (!hasFinalizer(object)) {
    object["metadata"]["finalizers"] = object["metadata"].value("finalizers", json::array());
    object["metadata"]["finalizers"].push_back(std::string(api::kFinalizer));
    auto u = hub_.update(kTrainingJobs, ns, object);
    if (!u.ok()) {
      if (u.error().isConflict() || u.error().isNotFound()) {
        result.retry = u.error().isConflict();
        return result;
      }
      return u.status("add the finalizer");
    }
    object = std::move(*u);
  }

  const int64_t generation = object["metadata"].value("generation", int64_t{0});
  const api::TrainingJobStatus previous =
      api::statusFromJson(object.value("status", json::object()));
  Observation obs;
  obs.generation = generation;
  obs.now = now_();

  // 2b. Finished: terminal (reconciler.h). Nothing in the regions is read or
  // applied, so nothing deleted there is ever recreated; the status stays
  // (an observation of no regions keeps it, status.h).
  if (isFinished(previous)) {
    const api::TrainingJobStatus status = aggregateStatus(previous, obs);
    if (Status s = writeStatus(object, previous, status); !s.ok()) {
      logger()->info("trainingjob {}/{}: {} (retrying)", ns, name, s.message());
      result.retry = true;
    }
    forgetFullApply(ns + "/" + name);
    forgetProblems(ns + "/" + name);
    result.state = status.state;
    // spec.ttlSecondsAfterFinished: deleted once it is up, as the TTL
    // controller deletes a Job; the finalizer then cleans every region.
    if (const auto left = ttlLeft(object, status)) {
      if (*left > std::chrono::milliseconds(0)) {
        result.requeueAfter = *left;
        return result;
      }
      kube::DeleteOptions once;
      once.preconditionUid = job.uid;  // not a new job of the same name
      once.propagationPolicy = kube::PropagationPolicy::kBackground;
      auto d = hub_.remove(kTrainingJobs, ns, name, once);
      if (!d.ok() && !d.error().isNotFound()) {
        logger()->info("trainingjob {}/{}: delete after ttlSecondsAfterFinished: {} (retrying)", ns,
                       name, describe(d.error()));
        result.retry = true;
        return result;
      }
      logger()->info("trainingjob {}/{}: {} and ttlSecondsAfterFinished is up: deleted", ns, name,
                     status.state);
    }
    return result;
  }

  api::ParsedSpec parsed = api::parseSpec(object);
  if (parsed.errors.empty()) {
    for (api::FieldError& e : unknownClusters(parsed.spec, clusters_.known()))
      parsed.errors.push_back(std::move(e));
    if (Status s = checkNames(job, parsed.spec); !s.ok()) {
      const std::string message = s.message();
      const size_t colon = message.find(": ");
      parsed.errors.push_back(
          {api::FieldError::Type::kInvalid, message.substr(0, colon), message.substr(colon + 2)});
    }
  }
  if (!parsed.errors.empty()) {
    obs.specErrors = parsed.errors;
    const api::TrainingJobStatus status = aggregateStatus(previous, obs);
    if (status != previous) event(object, true, "InvalidSpec", api::joinErrors(parsed.errors));
    GEO_RETURN_IF_ERROR(writeStatus(object, previous, status));
    result.state = status.state;
    return result;
  }
  const api::TrainingJobSpec& spec = parsed.spec;
  obs.suspended = spec.runPolicy.suspend;
  const std::vector<RegionPlan> plan = planRanks(spec);
  const RenderSettings& settings = options_.render;

  // 4. Every region at once: the Services, the gateway address, the keys and
  // the objects as they are. A region's objects are written only when what
  // the controller would apply differs from what it applied last (the hash
  // annotation), or on the periodic full apply that undoes edits by hand.
  const size_t n = spec.regions.size();
  const bool full = dueForFullApply(ns + "/" + name);
  std::vector<RegionWork> work(n);
  obs.regions.resize(n);
  std::vector<RankKeys> keys(static_cast<size_t>(spec.totalReplicas()));
  pool_.parallelFor(n, [&](size_t i) {
    const api::Region& r = spec.regions[i];
    RegionObservation& ro = obs.regions[i];
    RegionWork& w = work[i];
    ro.name = r.name;
    ro.replicas = r.replicas;
    auto unreachable = [&](const std::string& why) {
      ro.reachable = false;
      ro.unreachableReason = why;
      w.retry = true;
    };
    auto client = clusters_.client(r.cluster);
    if (!client.ok()) return unreachable(client.status().message());
    kube::KubeClient& c = **client;
    // From the cluster's cache when it holds the object, else a GET.
    const ClusterCache* cache = clusters_.cache(r.cluster);
    // A synced cache that lacks an object is believed too, except for the
    // key Secret: applying an object that exists after all rewrites it
    // with the same content, but keys generated for a Secret that exists
    // would replace the region's keys.
    auto fetch = [&](const kube::ResourceRef& resource, const std::string& objectName, json& out) {
      if (cache != nullptr && cache->synced(resource)) {
        if (kube::ObjectPtr hit = cache->get(resource, ns, objectName)) {
          out = *hit;
          return std::string();
        }
        if (resource.resource != res::kSecrets.resource) {
          out = nullptr;
          return std::string();
        }
      }
      return read(c, resource, ns, objectName, out);
    };
    json headless, gateway;
    if (auto s = fetch(res::kServices, headlessServiceName(job, r.name), headless); !s.empty())
      return unreachable("read the headless Service: " + s);
    if (auto s = fetch(res::kServices, gatewayServiceName(job, r.name), gateway); !s.empty())
      return unreachable("read the gateway Service: " + s);
    // Both Services at once.
    std::optional<kube::ApiResult<json>> h, g;
    pool_.parallelFor(2, [&](size_t k) {
      if (k == 0) {
        h = applyChanged(c, res::kServices, ns, headless,
                         renderHeadlessService(job, spec, i, settings), full);
      } else {
        g = applyChanged(c, res::kServices, ns, gateway, renderGatewayService(job, spec, i), full);
      }
    });
    // The first writes into the region: a namespace that does not exist
    // there is said as such, not as a cluster that cannot be reached.
    for (const auto* a : {&*h, &*g}) {
      if (!a->ok() && isMissingNamespace(a->error())) {
        ro.missingNamespace =
            fmt::format("namespace {} does not exist in cluster {} (region {}): create it there",
                        ns, r.cluster, r.name);
        return unreachable(ro.missingNamespace);
      }
    }
    if (!h->ok()) return unreachable("apply the headless Service: " + describe(h->error()));
    if (!g->ok()) return unreachable("apply the gateway Service: " + describe(g->error()));
    ro.endpoint = gatewayEndpoint(job, r, **g, settings);
    if (auto s = fetch(res::kSecrets, keysSecretName(job, r.name), w.secret); !s.empty())
      return unreachable("read the key Secret: " + s);
    if (w.secret.is_object()) readKeys(w.secret, plan[i].firstRank, plan[i].replicas, keys);
    for (int64_t k = plan[i].firstRank; k < plan[i].firstRank + plan[i].replicas; ++k) {
      RankKeys& rk = keys[static_cast<size_t>(k)];
      if (rk.secretKey.empty()) {
        const keys::CurveKeyPair pair = keys::generateKeyPair();
        rk = {pair.publicKey, pair.secretKey};
      }
    }
    if (auto s = fetch(res::kConfigMaps, configMapName(job, r.name), w.configMap); !s.empty())
      return unreachable("read the ConfigMap: " + s);
    if (spec.checkpointVolume) {
      if (auto s = fetch(res::kPersistentVolumeClaims, checkpointClaimName(job, r.name), w.claim);
          !s.empty())
        return unreachable("read the checkpoint claim: " + s);
    }
    if (auto s = fetch(res::kJobs, workerJobName(job, r.name), ro.job); !s.empty())
      return unreachable("read the Job: " + s);
    w.client = &c;
  });
  std::map<std::string, std::string> endpoints;
  for (size_t i = 0; i < n; ++i) {
    result.retry = result.retry || work[i].retry;
    if (!obs.regions[i].endpoint.empty()) endpoints[spec.regions[i].name] = obs.regions[i].endpoint;
  }
  for (const api::Region& r : spec.regions) {
    if (!endpoints.count(r.name)) {
      obs.waitingForGateway = r.name;
      break;
    }
  }

  // 5. The workloads, once everything they need is known: every Secret,
  // claim and ConfigMap first (at once), then the Jobs, so that no worker
  // starts with keys or peers another region does not have yet.
  const bool allReachable = std::all_of(work.begin(), work.end(),
                                        [](const RegionWork& w) { return w.client != nullptr; });
  std::vector<char> createdJob(n, 0);
  if (obs.waitingForGateway.empty() && allReachable) {
    std::vector<json> configMaps;
    for (size_t i = 0; i < n; ++i) {
      auto cm = renderConfigMap(job, spec, i, endpoints, keys, settings);
      if (!cm.ok()) return cm.status();
      configMaps.push_back(std::move(*cm));
    }
    std::atomic<bool> ok{true};
    std::mutex failMu;
    auto failRegion = [&](size_t i, const std::string& what, const kube::ApiError& e) {
      std::lock_guard lock(failMu);
      obs.regions[i].reachable = false;
      obs.regions[i].unreachableReason = what + ": " + describe(e);
      work[i].retry = true;
      ok = false;
      if (e.isInvalid() || e.isForbidden())
        event(object, true, "ApplyFailed", obs.regions[i].unreachableReason);
    };
    // Every region's Secret, claim and ConfigMap at once.
    const size_t kinds = 3;
    pool_.parallelFor(n * kinds, [&](size_t task) {
      const size_t i = task / kinds;
      RegionWork& w = work[i];
      switch (task % kinds) {
        case 0: {
          auto a = applyChanged(*w.client, res::kSecrets, ns, w.secret,
                                renderKeysSecret(job, spec, i, keys), full);
          if (!a.ok()) failRegion(i, "apply the key Secret", a.error());
          break;
        }
        case 1: {
          if (!spec.checkpointVolume) break;
          auto a = applyChanged(*w.client, res::kPersistentVolumeClaims, ns, w.claim,
                                renderCheckpointClaim(job, spec, i), full);
          if (!a.ok()) failRegion(i, "apply the checkpoint PersistentVolumeClaim", a.error());
          break;
        }
        default: {
          auto a = applyChanged(*w.client, res::kConfigMaps, ns, w.configMap, configMaps[i], full);
          if (!a.ok()) failRegion(i, "apply the ConfigMap", a.error());
        }
      }
    });
    // Then the Jobs, once all of that is in place everywhere.
    if (ok) {
      pool_.parallelFor(n, [&](size_t i) {
        const bool isNew = obs.regions[i].job.is_null();
        json desired = renderWorkerJob(job, spec, i, settings);
        setJobSuspend(desired, spec.runPolicy.suspend, obs.regions[i].job);
        auto a = applyChanged(*work[i].client, res::kJobs, ns, obs.regions[i].job,
                              std::move(desired), full);
        if (!a.ok() && !isNew && a.error().isInvalid()) {
          // The Job exists and refuses the change: Kubernetes keeps its pod
          // template, podFailurePolicy and backoffLimitPerIndex as created,
          // and the spec now renders others (a spec change, or a Job that an
          // earlier controller version created). The Job runs on as it is,
          // so the region is reachable and its status still counts; only
          // this write is refused, and retrying it cannot help.
          event(object, true, "ApplyFailed",
                fmt::format("region {}: the Job keeps its current spec (these fields cannot "
                            "change): {}",
                            spec.regions[i].name, describe(a.error())));
          return;
        }
        if (!a.ok()) return failRegion(i, "apply the Job", a.error());
        createdJob[i] = isNew;
        obs.regions[i].job = std::move(*a);
      });
    }
    for (const RegionWork& w : work) result.retry = result.retry || w.retry;
    if (!ok) forgetFullApply(ns + "/" + name);  // the next pass applies everything again
  }
  if (std::any_of(createdJob.begin(), createdJob.end(), [](char c) { return c != 0; })) {
    event(object, false, "Created",
          fmt::format("workers of {} regions created ({} in all)", spec.regions.size(),
                      spec.totalReplicas()));
  }

  // 5b. What goes wrong in the regions' clusters (pod_problems.h), as
  // Events on the TrainingJob, each problem once. A region's pods are
  // listed only while one of its workers is not ready, or one more has
  // failed since the last status: a healthy job costs no request.
  if (events_ != nullptr && !spec.runPolicy.suspend) {
    std::vector<std::vector<Problem>> found(n);
    pool_.parallelFor(n, [&](size_t i) {
      const RegionObservation& ro = obs.regions[i];
      if (work[i].client == nullptr || !ro.job.is_object()) return;
      found[i] = jobProblems(ro.name, ro.job);
      const json jobSpec = ro.job.value("spec", json::object());
      if (jobSpec.is_object() && jobSpec.value("suspend", false)) return;
      const json st = ro.job.value("status", json::object());
      auto count = [&](const char* key) {
        return st.is_object() && st.contains(key) && st[key].is_number_integer()
                   ? st[key].get<int64_t>()
                   : int64_t{0};
      };
      int64_t failedBefore = 0;
      for (const api::RegionStatus& p : previous.regions) {
        if (p.name == ro.name) failedBefore = p.failed;
      }
      if (count("ready") + count("succeeded") >= ro.replicas && count("failed") <= failedBefore)
        return;
      kube::ListOptions selector;
      selector.labelSelector =
          fmt::format("geotrain.io/job={},geotrain.io/region={}", job.name, ro.name);
      auto pods = work[i].client->list(res::kPods, ns, selector);
      if (!pods.ok()) {
        logger()->debug("trainingjob {}/{}: region {}: list the pods: {}", ns, name, ro.name,
                        describe(pods.error()));
        return;
      }
      for (Problem& p : podProblems(ro.name, json(pods->items))) found[i].push_back(std::move(p));
    });
    for (const std::vector<Problem>& problems : found) {
      size_t reported = 0;
      for (const Problem& p : problems) {
        // A region in trouble has many pods alike: a few Events say it.
        if (reported == kProblemsPerRegion) break;
        if (!firstSighting(fmt::format("{}/{}", ns, name), job.uid, p.key)) continue;
        ++reported;
        logger()->info("trainingjob {}/{}: {}", ns, name, p.message);
        event(object, true, p.reason, p.message);
      }
    }
  }

  // 6. Progress from rank 0 while its region's workers run. A failed scrape
  // keeps the last progress: metrics are a view, never a reason to retry.
  kube::KubeClient* first = work[0].client;  // rank 0's region
  if (options_.scrapeProgress && !spec.runPolicy.suspend && first != nullptr &&
      obs.regions[0].job.is_object() &&
      obs.regions[0].job.value("status", json::object()).value("active", int64_t{0}) > 0) {
    auto pod = leaderPod(*first, ns, name, spec.regions[0].name);
    StatusOr<api::Progress> progress =
        !pod.ok() ? StatusOr<api::Progress>(pod.status())
        : pod->empty()
            ? StatusOr<api::Progress>(unavailable("rank 0 has no running pod"))
            : scrapeProgress(*first, ns, *pod, settings.metricsPort, options_.scrapeTimeout);
    if (progress.ok()) {
      if (progress->step) obs.progress = *progress;
    } else {
      logger()->debug("trainingjob {}/{}: no progress: {}", ns, name, progress.status().message());
    }
  }

  // 7. Status.
  for (const RegionObservation& ro : obs.regions)
    result.regionReachable[ro.name] = ro.reachable || !ro.missingNamespace.empty();
  const api::TrainingJobStatus status = aggregateStatus(previous, obs);
  // Waiting for a load balancer: said once (an Event and the log), with
  // what to do on a cluster that has no load-balancer controller, where the
  // job would otherwise wait with no visible cause.
  const api::Condition* created = api::findCondition(status.conditions, api::kConditionCreated);
  const api::Condition* createdBefore =
      api::findCondition(previous.conditions, api::kConditionCreated);
  if (created != nullptr && created->reason == "WaitingForGateway" &&
      (createdBefore == nullptr || createdBefore->reason != created->reason ||
       createdBefore->message != created->message)) {
    for (size_t i = 0; i < n; ++i) {
      const api::Region& r = spec.regions[i];
      if (r.name != obs.waitingForGateway) continue;
      const std::string message = fmt::format(
          "waiting for the load balancer of region {}: Service {} in cluster {} has no ingress "
          "address yet (without a load-balancer controller there, set "
          "spec.regions[{}].gateway.serviceType NodePort with an endpoint, or "
          "gateway.endpoint)",
          r.name, gatewayServiceName(job, r.name), r.cluster, i);
      logger()->info("trainingjob {}/{}: {}", ns, name, message);
      event(object, false, "WaitingForGateway", message);
    }
  }
  if (Status s = writeStatus(object, previous, status); !s.ok()) {
    logger()->info("trainingjob {}/{}: {} (retrying)", ns, name, s.message());
    result.retry = true;
  }
  result.state = status.state;
  if (!obs.waitingForGateway.empty()) {
    result.requeueAfter = options_.pollGateways;
  } else if (status.state == "Running" || status.state == "Pending") {
    result.requeueAfter = options_.pollRunning;
  } else if (const auto left = ttlLeft(object, status)) {
    // Just finished: the pass that deletes it when its TTL is up.
    result.requeueAfter = std::max(*left, std::chrono::milliseconds(0));
  }
  return result;
}

}  // namespace geo::reconcile
