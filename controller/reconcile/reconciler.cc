#include "controller/reconcile/reconciler.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <mutex>
#include <optional>

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

// One entry of a Secret's data, decoded and without its line end; "" when
// absent or malformed.
std::string secretEntry(const json& data, const std::string& file) {
  if (!data.contains(file) || !data[file].is_string()) return "";
  std::optional<std::string> text = kube::decodeBase64(data[file].get<std::string>());
  if (!text) return "";
  while (!text->empty() && (text->back() == '\n' || text->back() == '\r')) text->pop_back();
  return *text;
}

// Secret keys of ranks [first, first + count) from a region's key Secret,
// with their public keys, and a key rotation's next secret key and
// previous public key; a missing or malformed entry stays empty.
void readKeys(const json& secret, int64_t first, int64_t count, std::vector<RankKeys>& keys) {
  const json data = secret.value("data", json::object());
  for (int64_t r = first; r < first + count; ++r) {
    const std::string text = secretEntry(data, fmt::format("worker-{}.key", r));
    auto pub = keys::publicKeyOf(text);
    if (!pub.ok()) continue;
    RankKeys& k = keys[static_cast<size_t>(r)];
    k = {*pub, text, "", "", ""};
    const std::string next = secretEntry(data, fmt::format("worker-{}.next.key", r));
    if (auto nextPub = keys::publicKeyOf(next); nextPub.ok()) {
      k.nextPublicKey = *nextPub;
      k.nextSecretKey = next;
    }
    const std::string previous = secretEntry(data, fmt::format("worker-{}.previous.pub", r));
    if (keys::isZ85Key(previous)) k.previousPublicKey = previous;
  }
}

// The keys of the ranks of `region` from its key Secret (null when it has
// none yet); a rank without a valid key gets a new pair (libsodium). A
// secret key is only ever written into its own region's cluster.
void fillKeys(const json& secret, const RegionPlan& region, std::vector<RankKeys>& keys) {
  if (secret.is_object()) readKeys(secret, region.firstRank, region.replicas, keys);
  for (int64_t k = region.firstRank; k < region.firstRank + region.replicas; ++k) {
    RankKeys& rk = keys[static_cast<size_t>(k)];
    if (rk.secretKey.empty()) {
      const keys::CurveKeyPair pair = keys::generateKeyPair();
      rk = RankKeys{pair.publicKey, pair.secretKey, "", "", ""};
    }
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

// What observeRegions() learns about one region, for applyWorkloads().
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

// Reads the objects of one region: from the cluster's informer cache when
// it holds the object, else a GET. A synced cache that lacks an object is
// believed too, except for the key Secret: applying an object that exists
// after all rewrites it with the same content, but keys generated for a
// Secret that exists would replace the region's keys.
struct RegionReader {
  kube::KubeClient& client;
  const ClusterCache* cache;  // null: GET everything
  const std::string& ns;

  // Into `out` (null when absent); "" or what went wrong.
  std::string operator()(const kube::ResourceRef& resource, const std::string& name,
                         json& out) const {
    if (cache != nullptr && cache->synced(resource)) {
      if (kube::ObjectPtr hit = cache->get(resource, ns, name)) {
        out = *hit;
        return "";
      }
      if (resource.resource != res::kSecrets.resource) {
        out = nullptr;
        return "";
      }
    }
    return read(client, resource, ns, name, out);
  }
};

// applyChanged() into one region's namespace.
struct ApplyTarget {
  kube::KubeClient& client;
  const std::string& ns;
  bool full;

  kube::ApiResult<json> apply(const kube::ResourceRef& resource, const json& live,
                              json desired) const {
    return applyChanged(client, resource, ns, live, std::move(desired), full);
  }
};

// How long until a finished job's spec.ttlSecondsAfterFinished is up (zero
// or less: now), counted from the lastTransitionTime of its Succeeded or
// Failed condition; nullopt when the job has not finished or sets no TTL.
// The field is read loosely: a finished job's spec is not validated again.
std::optional<std::chrono::milliseconds> ttlLeft(const json& object,
                                                 const api::TrainingJobStatus& status,
                                                 Clock::WallTime now) {
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
        *finished + std::chrono::seconds(ttl.get<int64_t>()) - now);
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
  const Clock::TimePoint now = clock_.now();
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
                       ReconcilerOptions options, const Clock& clock)
    : hub_(hub),
      clusters_(clusters),
      events_(events),
      options_(std::move(options)),
      clock_(clock),
      pool_(options_.regionThreads) {}

std::string Reconciler::stamp() const {
  return api::rfc3339(clock_.wallNow());
}

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
  const std::vector<std::string> failures = deleteInRegions(object, job);
  json current = object;
  if (!failures.empty()) {
    if (!cleanupGivesUp(current, job, failures)) {
      result.requeue.retry = true;
      return result;
    }
    // The status write moved the resourceVersion on.
    auto fresh = hub_.get(kTrainingJobs, job.ns, job.name);
    if (!fresh.ok()) {
      result.requeue.retry = !fresh.error().isNotFound();
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
      result.requeue.retry = true;
      return result;
    }
    return u.status("remove the finalizer");
  }
  logger()->info("trainingjob {}/{}: deleted its objects in every region", job.ns, job.name);
  return result;
}

std::vector<std::string> Reconciler::deleteInRegions(const json& object, const JobRef& job) {
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
  return failures;
}

bool Reconciler::cleanupGivesUp(const json& object, const JobRef& job,
                                const std::vector<std::string>& failures) {
  // How long deletion has waited (deletionTimestamp): past
  // options_.cleanupTimeout the regions that still fail are given up, so
  // that deleting a TrainingJob always completes.
  const auto since = kube::parseTime(object["metadata"].value("deletionTimestamp", ""));
  const auto waited =
      since ? std::chrono::duration_cast<std::chrono::seconds>(clock_.wallNow() - *since)
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
  const api::TrainingJobStatus previous =
      api::statusFromJson(object.value("status", json::object()));
  api::TrainingJobStatus status = previous;
  api::setCondition(status.conditions,
                    {std::string(api::kConditionRegionDegraded), "True",
                     object["metadata"].value("generation", int64_t{0}), "",
                     giveUp ? "CleanupAbandoned" : "CleanupBlocked", message},
                    stamp());
  (void)writeStatus(object, previous, status);
  if (!giveUp) {
    logger()->warn("trainingjob {}/{}: cleanup incomplete, retrying: {}", job.ns, job.name, list);
    return false;
  }
  logger()->warn("trainingjob {}/{}: {}", job.ns, job.name, message);
  event(object, true, "CleanupAbandoned", message);
  return true;
}

// The state one pass carries from stage to stage.
struct Reconciler::Pass {
  std::string ns, name, key;  // key: "ns/name"
  json object;                // the TrainingJob as read (with the finalizer)
  JobRef job;
  api::TrainingJobSpec spec;  // checked (stage 3) before the regions are touched
  std::vector<RegionPlan> plan;
  api::TrainingJobStatus previous;               // the status as read
  Observation obs;                               // what the pass sees, for the status
  bool full = false;                             // apply every object, changed or not
  std::vector<RegionWork> work;                  // per region: observeRegions() -> applyWorkloads()
  std::vector<RankKeys> keys;                    // every rank's CURVE keys
  std::map<std::string, std::string> endpoints;  // region -> gateway address
  std::mutex mu;                                 // guards the regions in applyWorkloads()
  bool applyFailed = false;                      // a write of applyWorkloads() failed
  // When the key rotation in progress wants the next pass (recordKeyRotation).
  std::optional<std::chrono::milliseconds> keyRotationWait;
  ReconcileResult result;
};

StatusOr<ReconcileResult> Reconciler::reconcile(const std::string& ns, const std::string& name) {
  const std::string key = ns + "/" + name;
  auto got = hub_.get(kTrainingJobs, ns, name);
  if (!got.ok()) {
    if (got.error().isNotFound()) {  // gone: nothing left to do
      forgetFullApply(key);
      forgetProblems(key);
      return ReconcileResult{};
    }
    return got.status("get TrainingJob " + key);
  }
  json object = std::move(*got);
  const JobRef job = jobRefOf(object);
  // 1. Deleted.
  if (object["metadata"].contains("deletionTimestamp")) {
    forgetProblems(key);
    return cleanup(object, job);
  }
  // 2. The finalizer.
  if (!hasFinalizer(object)) {
    auto u = addFinalizer(object);
    if (!u.ok()) {
      if (u.error().isConflict() || u.error().isNotFound()) {
        ReconcileResult result;
        result.requeue.retry = u.error().isConflict();
        return result;
      }
      return u.status("add the finalizer");
    }
    object = std::move(*u);
  }
  Pass pass;
  pass.ns = ns;
  pass.name = name;
  pass.key = key;
  pass.job = job;
  pass.previous = api::statusFromJson(object.value("status", json::object()));
  pass.obs.generation = object["metadata"].value("generation", int64_t{0});
  pass.obs.now = stamp();
  pass.object = std::move(object);
  // 2b. Finished: left as it is.
  if (isFinished(pass.previous)) return finished(pass);
  // 3. The spec.
  api::ParsedSpec parsed = parseAndCheck(pass.object, job);
  if (!parsed.errors.empty()) return invalidSpec(pass, std::move(parsed.errors));
  pass.spec = std::move(parsed.spec);
  pass.obs.suspended = pass.spec.runPolicy.suspend;
  pass.obs.outputPath = pass.spec.worker.output.path;
  pass.plan = planRanks(pass.spec);
  observeRegions(pass);                       // 4
  rotateKeys(pass);                           // 4b
  GEO_RETURN_IF_ERROR(applyWorkloads(pass));  // 5
  recordKeyRotation(pass);
  reportWorkerProblems(pass);  // 5b
  readProgress(pass);          // 6
  updateStatus(pass);          // 7
  return pass.result;
}

kube::ApiResult<json> Reconciler::addFinalizer(const json& object) {
  json updated = object;
  updated["metadata"]["finalizers"] = object["metadata"].value("finalizers", json::array());
  updated["metadata"]["finalizers"].push_back(std::string(api::kFinalizer));
  return hub_.update(kTrainingJobs, kube::metadataField(object, "namespace"), updated);
}

StatusOr<ReconcileResult> Reconciler::finished(Pass& pass) {
  // Nothing in the regions is read or applied, so nothing deleted there is
  // ever recreated; the status stays (an observation of no regions keeps
  // it, status.h).
  ReconcileResult& result = pass.result;
  const api::TrainingJobStatus status = aggregateStatus(pass.previous, pass.obs);
  if (Status s = writeStatus(pass.object, pass.previous, status); !s.ok()) {
    logger()->info("trainingjob {}: {} (retrying)", pass.key, s.message());
    result.requeue.retry = true;
  }
  forgetFullApply(pass.key);
  forgetProblems(pass.key);
  result.report.state = status.state;
  // spec.ttlSecondsAfterFinished: deleted once it is up, as the TTL
  // controller deletes a Job; the finalizer then cleans every region.
  const auto left = ttlLeft(pass.object, status, clock_.wallNow());
  if (!left) return result;
  if (*left > std::chrono::milliseconds(0)) {
    result.requeue.after = *left;
    return result;
  }
  kube::DeleteOptions once;
  once.preconditionUid = pass.job.uid;  // not a new job of the same name
  once.propagationPolicy = kube::PropagationPolicy::kBackground;
  auto d = hub_.remove(kTrainingJobs, pass.ns, pass.name, once);
  if (!d.ok() && !d.error().isNotFound()) {
    logger()->info("trainingjob {}: delete after ttlSecondsAfterFinished: {} (retrying)", pass.key,
                   describe(d.error()));
    result.requeue.retry = true;
    return result;
  }
  logger()->info("trainingjob {}: {} and ttlSecondsAfterFinished is up: deleted", pass.key,
                 status.state);
  return result;
}

api::ParsedSpec Reconciler::parseAndCheck(const json& object, const JobRef& job) {
  api::ParsedSpec parsed = api::parseSpec(object);
  if (!parsed.errors.empty()) return parsed;
  for (api::FieldError& e : unknownClusters(parsed.spec, clusters_.known()))
    parsed.errors.push_back(std::move(e));
  if (Status s = checkNames(job, parsed.spec); !s.ok()) {
    const std::string message = s.message();
    const size_t colon = message.find(": ");
    parsed.errors.push_back(
        {api::FieldError::Type::kInvalid, message.substr(0, colon), message.substr(colon + 2)});
  }
  return parsed;
}

StatusOr<ReconcileResult> Reconciler::invalidSpec(Pass& pass, std::vector<api::FieldError> errors) {
  const std::string message = api::joinErrors(errors);
  pass.obs.specErrors = std::move(errors);
  const api::TrainingJobStatus status = aggregateStatus(pass.previous, pass.obs);
  if (status != pass.previous) event(pass.object, true, "InvalidSpec", message);
  GEO_RETURN_IF_ERROR(writeStatus(pass.object, pass.previous, status));
  pass.result.report.state = status.state;
  return pass.result;
}

void Reconciler::observeRegions(Pass& pass) {
  // Every region at once. A region's objects are written only when what the
  // controller would apply differs from what it applied last (the hash
  // annotation), or on the periodic full apply that undoes edits by hand.
  const size_t n = pass.spec.regions.size();
  pass.full = dueForFullApply(pass.key);
  pass.work.assign(n, RegionWork{});
  pass.obs.regions.resize(n);
  pass.keys.assign(static_cast<size_t>(pass.spec.totalReplicas()), RankKeys{});
  pool_.parallelFor(n, [&](size_t i) { observeRegion(pass, i); });
  for (size_t i = 0; i < n; ++i) {
    pass.result.requeue.retry = pass.result.requeue.retry || pass.work[i].retry;
    const std::string& endpoint = pass.obs.regions[i].endpoint;
    if (!endpoint.empty()) pass.endpoints[pass.spec.regions[i].name] = endpoint;
  }
  for (const api::Region& r : pass.spec.regions) {
    if (!pass.endpoints.count(r.name)) {
      pass.obs.waitingForGateway = r.name;
      break;
    }
  }
}

void Reconciler::observeRegion(Pass& pass, size_t i) {
  const api::Region& r = pass.spec.regions[i];
  const std::string& ns = pass.ns;
  RegionObservation& ro = pass.obs.regions[i];
  RegionWork& w = pass.work[i];
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
  const RegionReader fetch{c, clusters_.cache(r.cluster), ns};
  json headless, gateway;
  if (auto s = fetch(res::kServices, headlessServiceName(pass.job, r.name), headless); !s.empty())
    return unreachable("read the headless Service: " + s);
  if (auto s = fetch(res::kServices, gatewayServiceName(pass.job, r.name), gateway); !s.empty())
    return unreachable("read the gateway Service: " + s);
  // Both Services at once.
  std::optional<kube::ApiResult<json>> h, g;
  pool_.parallelFor(2, [&](size_t k) {
    if (k == 0) {
      h = applyChanged(c, res::kServices, ns, headless,
                       renderHeadlessService(pass.job, pass.spec, i, options_.render), pass.full);
    } else {
      g = applyChanged(c, res::kServices, ns, gateway, renderGatewayService(pass.job, pass.spec, i),
                       pass.full);
    }
  });
  // The first writes into the region: a namespace that does not exist
  // there is said as such, not as a cluster that cannot be reached.
  for (const auto* a : {&*h, &*g}) {
    if (!a->ok() && isMissingNamespace(a->error())) {
      ro.missingNamespace =
          fmt::format("namespace {} does not exist in cluster {} (region {}): create it there", ns,
                      r.cluster, r.name);
      return unreachable(ro.missingNamespace);
    }
  }
  if (!h->ok()) return unreachable("apply the headless Service: " + describe(h->error()));
  if (!g->ok()) return unreachable("apply the gateway Service: " + describe(g->error()));
  ro.endpoint = gatewayEndpoint(pass.job, r, **g, options_.render);
  if (auto s = fetch(res::kSecrets, keysSecretName(pass.job, r.name), w.secret); !s.empty())
    return unreachable("read the key Secret: " + s);
  fillKeys(w.secret, pass.plan[i], pass.keys);
  if (auto s = fetch(res::kConfigMaps, configMapName(pass.job, r.name), w.configMap); !s.empty())
    return unreachable("read the ConfigMap: " + s);
  if (pass.spec.checkpointVolume) {
    if (auto s =
            fetch(res::kPersistentVolumeClaims, checkpointClaimName(pass.job, r.name), w.claim);
        !s.empty())
      return unreachable("read the checkpoint claim: " + s);
  }
  if (auto s = fetch(res::kJobs, workerJobName(pass.job, r.name), ro.job); !s.empty())
    return unreachable("read the Job: " + s);
  w.client = &c;
}

void Reconciler::rotateKeys(Pass& pass) {
  const json annotations = pass.object["metadata"].value("annotations", json::object());
  const std::string request =
      annotations.is_object() ? annotations.value(std::string(kRotateKeysAnnotation), "") : "";
  std::optional<api::KeyRotationStatus> rotation = pass.previous.keyRotation;
  const bool running = rotation && rotation->phase != "Done";
  if (!running && !request.empty() && (!rotation || rotation->request != request)) {
    rotation = api::KeyRotationStatus{request, "Admitting", ""};
    logger()->info(
        "trainingjob {}: rotating the job's keys (request {}): the next keys go to every "
        "region",
        pass.key, request);
  } else if (running && !rotation->phaseSince.empty()) {
    const auto since = kube::parseTime(rotation->phaseSince);
    if (!since || clock_.wallNow() - *since >= options_.keyRotationStep) {
      static const std::map<std::string, std::string> kNext = {
          {"Admitting", "Switching"}, {"Switching", "Retiring"}, {"Retiring", "Done"}};
      const auto next = kNext.find(rotation->phase);
      rotation->phase = next != kNext.end() ? next->second : "Done";
      rotation->phaseSince.clear();
    }
  }
  // The files of the phase, for every rank whose keys this pass read: again
  // on every pass, so that a region whose write failed gets them on the
  // next, and idempotent (a rank switched already has no next key).
  const std::string phase = rotation ? rotation->phase : "Done";
  for (RankKeys& k : pass.keys) {
    if (k.secretKey.empty()) continue;
    if (phase == "Admitting" && k.nextSecretKey.empty()) {
      const keys::CurveKeyPair pair = keys::generateKeyPair();
      k.nextPublicKey = pair.publicKey;
      k.nextSecretKey = pair.secretKey;
    } else if (phase == "Switching" && !k.nextSecretKey.empty()) {
      k.previousPublicKey = std::exchange(k.publicKey, std::exchange(k.nextPublicKey, ""));
      k.secretKey = std::exchange(k.nextSecretKey, "");
    } else if (phase == "Retiring" || phase == "Done") {
      k.nextPublicKey.clear();
      k.nextSecretKey.clear();
      k.previousPublicKey.clear();
    }
  }
  if (rotation) pass.obs.keyRotation = rotation;
}

void Reconciler::recordKeyRotation(Pass& pass) {
  if (!pass.obs.keyRotation) return;
  api::KeyRotationStatus& rotation = *pass.obs.keyRotation;
  const bool everyRegion = pass.obs.waitingForGateway.empty() && !pass.applyFailed &&
                           std::all_of(pass.work.begin(), pass.work.end(),
                                       [](const RegionWork& w) { return w.client != nullptr; });
  if (everyRegion && rotation.phaseSince.empty()) {
    rotation.phaseSince = stamp();
    const auto step = std::chrono::duration_cast<std::chrono::seconds>(options_.keyRotationStep);
    static const std::map<std::string, std::string> kSaid = {
        {"Admitting",
         "every region has every rank's next public key; the workers switch to their "
         "new keypairs in {} s"},
        {"Switching",
         "every region has every rank's new keypair; the old keys are refused in {} s"},
        {"Retiring",
         "the old keys are gone from every region; done in {} s, once every pod's "
         "files are updated"},
        {"Done", "every region has only the new keys"}};
    const auto said = kSaid.find(rotation.phase);
    const std::string message =
        fmt::format("key rotation {}: {}", rotation.request,
                    said != kSaid.end() ? fmt::format(fmt::runtime(said->second), step.count())
                                        : rotation.phase);
    logger()->info("trainingjob {}: {}", pass.key, message);
    event(pass.object, false, "KeyRotation", message);
  }
  if (rotation.phase == "Done") return;
  // Again once the phase is due, or soon while a region still lacks its files.
  std::chrono::milliseconds wait = options_.pollGateways;
  if (const auto since = kube::parseTime(rotation.phaseSince)) {
    wait = std::max(std::chrono::milliseconds(0),
                    std::chrono::duration_cast<std::chrono::milliseconds>(
                        *since + options_.keyRotationStep - clock_.wallNow()));
  }
  pass.keyRotationWait = wait;
}

Status Reconciler::applyWorkloads(Pass& pass) {
  // Once everything they need is known: every Secret, claim and ConfigMap
  // first (at once), then the Jobs, so that no worker starts with keys or
  // peers another region does not have yet.
  const bool allReachable = std::all_of(pass.work.begin(), pass.work.end(),
                                        [](const RegionWork& w) { return w.client != nullptr; });
  if (!pass.obs.waitingForGateway.empty() || !allReachable) return {};
  const size_t n = pass.spec.regions.size();
  std::vector<json> configMaps;
  for (size_t i = 0; i < n; ++i) {
    auto cm = renderConfigMap(pass.job, pass.spec, i, pass.endpoints, pass.keys, options_.render);
    if (!cm.ok()) return cm.status();
    configMaps.push_back(std::move(*cm));
  }
  pool_.parallelFor(n * 3, [&](size_t task) {
    const size_t i = task / 3;
    const RegionWork& w = pass.work[i];
    const ApplyTarget target{*w.client, pass.ns, pass.full};
    switch (task % 3) {
      case 0: {
        auto a = target.apply(res::kSecrets, w.secret,
                              renderKeysSecret(pass.job, pass.spec, i, pass.keys));
        if (!a.ok()) failRegion(pass, i, "apply the key Secret", a.error());
        break;
      }
      case 1: {
        if (!pass.spec.checkpointVolume) break;
        auto a = target.apply(res::kPersistentVolumeClaims, w.claim,
                              renderCheckpointClaim(pass.job, pass.spec, i));
        if (!a.ok()) failRegion(pass, i, "apply the checkpoint PersistentVolumeClaim", a.error());
        break;
      }
      default: {
        auto a = target.apply(res::kConfigMaps, w.configMap, configMaps[i]);
        if (!a.ok()) failRegion(pass, i, "apply the ConfigMap", a.error());
      }
    }
  });
  // Then the Jobs, once all of that is in place everywhere.
  std::vector<char> createdJob(n, 0);
  if (!pass.applyFailed) pool_.parallelFor(n, [&](size_t i) { createdJob[i] = applyJob(pass, i); });
  for (const RegionWork& w : pass.work)
    pass.result.requeue.retry = pass.result.requeue.retry || w.retry;
  if (pass.applyFailed) forgetFullApply(pass.key);  // the next pass applies everything again
  if (std::any_of(createdJob.begin(), createdJob.end(), [](char c) { return c != 0; })) {
    event(pass.object, false, "Created",
          fmt::format("workers of {} regions created ({} in all)", pass.spec.regions.size(),
                      pass.spec.totalReplicas()));
  }
  return {};
}

void Reconciler::failRegion(Pass& pass, size_t i, const std::string& what,
                            const kube::ApiError& e) {
  std::lock_guard lock(pass.mu);
  pass.obs.regions[i].reachable = false;
  pass.obs.regions[i].unreachableReason = what + ": " + describe(e);
  pass.work[i].retry = true;
  pass.applyFailed = true;
  if (e.isInvalid() || e.isForbidden())
    event(pass.object, true, "ApplyFailed", pass.obs.regions[i].unreachableReason);
}

bool Reconciler::applyJob(Pass& pass, size_t i) {
  const ApplyTarget target{*pass.work[i].client, pass.ns, pass.full};
  RegionObservation& ro = pass.obs.regions[i];
  const bool isNew = ro.job.is_null();
  json desired = renderWorkerJob(pass.job, pass.spec, i, options_.render);
  setJobSuspend(desired, pass.spec.runPolicy.suspend, ro.job);
  auto a = target.apply(res::kJobs, ro.job, std::move(desired));
  if (!a.ok() && !isNew && a.error().isInvalid()) {
    // The Job exists and refuses the change: Kubernetes keeps its pod
    // template, podFailurePolicy and backoffLimitPerIndex as created, and
    // the spec now renders others (a spec change, or a Job that an earlier
    // controller version created). The Job runs on as it is, so the region
    // is reachable and its status still counts; only this write is
    // refused, and retrying it cannot help.
    event(pass.object, true, "ApplyFailed",
          fmt::format("region {}: the Job keeps its current spec (these fields cannot change): {}",
                      pass.spec.regions[i].name, describe(a.error())));
    return false;
  }
  if (!a.ok()) {
    failRegion(pass, i, "apply the Job", a.error());
    return false;
  }
  ro.job = std::move(*a);
  return isNew;
}

void Reconciler::reportWorkerProblems(Pass& pass) {
  // What goes wrong in the regions' clusters (pod_problems.h), as Events on
  // the TrainingJob, each problem once. A region's pods are listed only
  // while one of its workers is not ready, or one more has failed since the
  // last status: a healthy job costs no request.
  if (events_ == nullptr || pass.spec.runPolicy.suspend) return;
  const size_t n = pass.spec.regions.size();
  std::vector<std::vector<Problem>> found(n);
  pool_.parallelFor(n, [&](size_t i) { found[i] = regionProblems(pass, i); });
  for (const std::vector<Problem>& problems : found) {
    size_t reported = 0;
    for (const Problem& p : problems) {
      // A region in trouble has many pods alike: a few Events say it.
      if (reported == kProblemsPerRegion) break;
      if (!firstSighting(pass.key, pass.job.uid, p.key)) continue;
      ++reported;
      logger()->info("trainingjob {}: {}", pass.key, p.message);
      event(pass.object, true, p.reason, p.message);
    }
  }
}

std::vector<Problem> Reconciler::regionProblems(const Pass& pass, size_t i) {
  const RegionObservation& ro = pass.obs.regions[i];
  kube::KubeClient* client = pass.work[i].client;
  if (client == nullptr || !ro.job.is_object()) return {};
  std::vector<Problem> found = jobProblems(ro.name, ro.job);
  const json jobSpec = ro.job.value("spec", json::object());
  if (jobSpec.is_object() && jobSpec.value("suspend", false)) return found;
  const json st = ro.job.value("status", json::object());
  auto count = [&](const char* key) {
    return st.is_object() && st.contains(key) && st[key].is_number_integer()
               ? st[key].get<int64_t>()
               : int64_t{0};
  };
  int64_t failedBefore = 0;
  for (const api::RegionStatus& p : pass.previous.regions) {
    if (p.name == ro.name) failedBefore = p.failed;
  }
  if (count("ready") + count("succeeded") >= ro.replicas && count("failed") <= failedBefore)
    return found;
  kube::ListOptions selector;
  selector.labelSelector =
      fmt::format("geotrain.io/job={},geotrain.io/region={}", pass.job.name, ro.name);
  auto pods = client->list(res::kPods, pass.ns, selector);
  if (!pods.ok()) {
    logger()->debug("trainingjob {}: region {}: list the pods: {}", pass.key, ro.name,
                    describe(pods.error()));
    return found;
  }
  for (Problem& p : podProblems(ro.name, json(pods->items))) found.push_back(std::move(p));
  return found;
}

void Reconciler::readProgress(Pass& pass) {
  // From rank 0 while its region's workers run. A failed scrape keeps the
  // last progress: metrics are a view, never a reason to retry.
  kube::KubeClient* first = pass.work[0].client;  // rank 0's region
  const json& job0 = pass.obs.regions[0].job;
  if (!options_.scrapeProgress || pass.spec.runPolicy.suspend || first == nullptr ||
      !job0.is_object() || job0.value("status", json::object()).value("active", int64_t{0}) <= 0)
    return;
  auto pod = leaderPod(*first, pass.ns, pass.name, pass.spec.regions[0].name);
  StatusOr<api::Progress> progress =
      !pod.ok()      ? StatusOr<api::Progress>(pod.status())
      : pod->empty() ? StatusOr<api::Progress>(unavailable("rank 0 has no running pod"))
                     : scrapeProgress(*first, pass.ns, *pod, options_.render.metricsPort,
                                      options_.scrapeTimeout);
  if (progress.ok()) {
    if (progress->step) pass.obs.progress = *progress;
  } else {
    logger()->debug("trainingjob {}: no progress: {}", pass.key, progress.status().message());
  }
}

void Reconciler::updateStatus(Pass& pass) {
  ReconcileResult& result = pass.result;
  for (const RegionObservation& ro : pass.obs.regions)
    result.report.regionReachable[ro.name] = ro.reachable || !ro.missingNamespace.empty();
  const api::TrainingJobStatus status = aggregateStatus(pass.previous, pass.obs);
  announceWaitingForGateway(pass, status);
  if (Status s = writeStatus(pass.object, pass.previous, status); !s.ok()) {
    logger()->info("trainingjob {}: {} (retrying)", pass.key, s.message());
    result.requeue.retry = true;
  }
  result.report.state = status.state;
  if (!pass.obs.waitingForGateway.empty()) {
    result.requeue.after = options_.pollGateways;
  } else if (status.state == "Running" || status.state == "Pending") {
    result.requeue.after = options_.pollRunning;
  } else if (const auto left = ttlLeft(pass.object, status, clock_.wallNow())) {
    // Just finished: the pass that deletes it when its TTL is up.
    result.requeue.after = std::max(*left, std::chrono::milliseconds(0));
  }
  if (pass.keyRotationWait) {
    result.requeue.after =
        std::min(result.requeue.after.value_or(*pass.keyRotationWait), *pass.keyRotationWait);
  }
}

void Reconciler::announceWaitingForGateway(const Pass& pass, const api::TrainingJobStatus& status) {
  // Said once (an Event and the log), with what to do on a cluster that has
  // no load-balancer controller, where the job would otherwise wait with no
  // visible cause.
  const api::Condition* created = api::findCondition(status.conditions, api::kConditionCreated);
  const api::Condition* before =
      api::findCondition(pass.previous.conditions, api::kConditionCreated);
  if (created == nullptr || created->reason != "WaitingForGateway" ||
      (before != nullptr && before->reason == created->reason &&
       before->message == created->message))
    return;
  for (size_t i = 0; i < pass.spec.regions.size(); ++i) {
    const api::Region& r = pass.spec.regions[i];
    if (r.name != pass.obs.waitingForGateway) continue;
    const std::string message = fmt::format(
        "waiting for the load balancer of region {}: Service {} in cluster {} has no ingress "
        "address yet (without a load-balancer controller there, set "
        "spec.regions[{}].gateway.serviceType NodePort with an endpoint, or "
        "gateway.endpoint)",
        r.name, gatewayServiceName(pass.job, r.name), r.cluster, i);
    logger()->info("trainingjob {}: {}", pass.key, message);
    event(pass.object, false, "WaitingForGateway", message);
  }
}

}  // namespace geo::reconcile
