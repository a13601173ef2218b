#include "controller/reconcile/reconciler.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "common/logging.h"
#include "controller/kube/config.h"
#include "controller/reconcile/status.h"
#include "worker/transport/keys.h"

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
    auto pub = transport::publicKeyOf(*text);
    if (!pub.ok()) continue;
    keys[static_cast<size_t>(r)] = {*pub, *text};
  }
}

std::string describe(const kube::ApiError& e) {
  return e.toStatus().message();
}

}  // namespace

Reconciler::Reconciler(kube::KubeClient& hub, Clusters& clusters, kube::EventRecorder* events,
                       ReconcilerOptions options, std::function<std::string()> now)
    : hub_(hub),
      clusters_(clusters),
      events_(events),
      options_(std::move(options)),
      now_(std::move(now)) {}

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
  if (flipped(api::kConditionRegionDegraded)) {
    event(object, true, "RegionDegraded",
          api::findCondition(status.conditions, api::kConditionRegionDegraded)->message);
  }
  return {};
}

StatusOr<ReconcileResult> Reconciler::cleanup(const json& object, const JobRef& job) {
  ReconcileResult result;
  if (!hasFinalizer(object)) return result;  // someone else's finalizers remain
  bool done = true;
  std::vector<std::string> failures;
  for (const api::Region& r : looseRegions(object)) {
    auto client = clusters_.client(r.cluster);
    if (!client.ok()) {
      done = false;
      failures.push_back(r.name + ": " + client.status().message());
      continue;
    }
    kube::DeleteOptions background;
    background.propagationPolicy = kube::PropagationPolicy::kBackground;
    const std::vector<std::pair<kube::ResourceRef, std::string>> objects = {
        {res::kJobs, workerJobName(job, r.name)},
        {res::kServices, gatewayServiceName(job, r.name)},
        {res::kServices, headlessServiceName(job, r.name)},
        {res::kConfigMaps, configMapName(job, r.name)},
        {res::kSecrets, keysSecretName(job, r.name)}};
    for (const auto& [resource, name] : objects) {
      auto d = (*client)->remove(resource, job.ns, name, background);
      if (!d.ok() && !d.error().isNotFound()) {
        done = false;
        failures.push_back(fmt::format("{}: delete {} {}: {}", r.name, resource.resource, name,
                                       describe(d.error())));
        break;
      }
    }
  }
  if (!done) {
    logger()->warn("trainingjob {}/{}: cleanup incomplete, retrying: {}", job.ns, job.name,
                   fmt::join(failures, "; "));
    api::TrainingJobStatus previous = api::statusFromJson(object.value("status", json::object()));
    api::TrainingJobStatus status = previous;
    api::setCondition(status.conditions,
                      {std::string(api::kConditionRegionDegraded), "True",
                       object["metadata"].value("generation", int64_t{0}), "", "CleanupBlocked",
                       "cannot delete in: " + fmt::format("{}", fmt::join(failures, "; "))},
                      now_());
    (void)writeStatus(object, previous, status);
    result.retry = true;
    return result;
  }
  json updated = object;
  json fin = json::array();
  for (const json& f : object["metadata"]["finalizers"]) {
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
    if (got.error().isNotFound()) return result;  // gone: nothing left to do
    return got.status("get TrainingJob " + ns + "/" + name);
  }
  json object = std::move(*got);
  const JobRef job{name, ns, kube::metadataField(object, "uid")};
  if (object["metadata"].contains("deletionTimestamp")) return cleanup(object, job);

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

  api::ParsedSpec parsed = api::parseSpec(object);
  if (parsed.errors.empty()) {
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

  // 4. Services, gateway addresses, keys and the Jobs as they are.
  std::vector<kube::KubeClient*> clients(spec.regions.size(), nullptr);
  std::map<std::string, std::string> endpoints;
  std::vector<RankKeys> keys(static_cast<size_t>(spec.totalReplicas()));
  kube::PatchOptions force;
  force.force = true;
  for (size_t i = 0; i < spec.regions.size(); ++i) {
    const api::Region& r = spec.regions[i];
    RegionObservation ro;
    ro.name = r.name;
    ro.replicas = r.replicas;
    auto unreachable = [&](const std::string& why) {
      ro.reachable = false;
      ro.unreachableReason = why;
      result.retry = true;
    };
    auto client = clusters_.client(r.cluster);
    if (!client.ok()) {
      unreachable(client.status().message());
      obs.regions.push_back(std::move(ro));
      continue;
    }
    kube::KubeClient& c = **client;
    auto headless =
        c.apply(res::kServices, ns, renderHeadlessService(job, spec, i, settings), force);
    auto gateway = headless.ok()
                       ? c.apply(res::kServices, ns, renderGatewayService(job, spec, i), force)
                       : headless;
    if (!gateway.ok()) {
      unreachable("apply Services: " + describe(gateway.error()));
      obs.regions.push_back(std::move(ro));
      continue;
    }
    ro.endpoint = gatewayEndpoint(job, r, *gateway, settings);
    if (!ro.endpoint.empty()) endpoints[r.name] = ro.endpoint;
    auto secret = c.get(res::kSecrets, ns, keysSecretName(job, r.name));
    if (secret.ok()) {
      readKeys(*secret, plan[i].firstRank, plan[i].replicas, keys);
    } else if (!secret.error().isNotFound()) {
      unreachable("read the key Secret: " + describe(secret.error()));
      obs.regions.push_back(std::move(ro));
      continue;
    }
    for (int64_t k = plan[i].firstRank; k < plan[i].firstRank + plan[i].replicas; ++k) {
      RankKeys& rk = keys[static_cast<size_t>(k)];
      if (rk.secretKey.empty()) {
        const transport::CurveKeyPair pair = transport::generateKeyPair();
        rk = {pair.publicKey, pair.secretKey};
      }
    }
    auto existing = c.get(res::kJobs, ns, workerJobName(job, r.name));
    if (existing.ok()) {
      ro.job = std::move(*existing);
    } else if (!existing.error().isNotFound()) {
      unreachable("read the Job: " + describe(existing.error()));
      obs.regions.push_back(std::move(ro));
      continue;
    }
    clients[i] = &c;
    obs.regions.push_back(std::move(ro));
  }
  for (const api::Region& r : spec.regions) {
    if (!endpoints.count(r.name)) {
      obs.waitingForGateway = r.name;
      break;
    }
  }

  // 5. The workloads, once everything they need is known: every Secret
  // first, then every ConfigMap, then the Jobs, so that no worker starts
  // with keys or peers another region does not have yet.
  const bool allReachable =
      std::all_of(clients.begin(), clients.end(), [](auto* c) { return c != nullptr; });
  bool createdJobs = false;
  if (obs.waitingForGateway.empty() && allReachable) {
    bool ok = true;
    auto failRegion = [&](size_t i, const std::string& what, const kube::ApiError& e) {
      obs.regions[i].reachable = false;
      obs.regions[i].unreachableReason = what + ": " + describe(e);
      result.retry = true;
      ok = false;
      if (e.isInvalid() || e.isForbidden())
        event(object, true, "ApplyFailed", obs.regions[i].unreachableReason);
    };
    for (size_t i = 0; ok && i < spec.regions.size(); ++i) {
      auto s = clients[i]->apply(res::kSecrets, ns, renderKeysSecret(job, spec, i, keys), force);
      if (!s.ok()) failRegion(i, "apply the key Secret", s.error());
    }
    for (size_t i = 0; ok && i < spec.regions.size(); ++i) {
      auto cm = renderConfigMap(job, spec, i, endpoints, keys, settings);
      if (!cm.ok()) return cm.status();
      auto a = clients[i]->apply(res::kConfigMaps, ns, *cm, force);
      if (!a.ok()) failRegion(i, "apply the ConfigMap", a.error());
    }
    for (size_t i = 0; ok && i < spec.regions.size(); ++i) {
      const bool isNew = obs.regions[i].job.is_null();
      auto a = clients[i]->apply(res::kJobs, ns, renderWorkerJob(job, spec, i, settings), force);
      if (!a.ok()) {
        failRegion(i, "apply the Job", a.error());
        continue;
      }
      createdJobs = createdJobs || isNew;
      obs.regions[i].job = std::move(*a);
    }
  }
  if (createdJobs) {
    event(object, false, "Created",
          fmt::format("workers of {} regions created ({} in all)", spec.regions.size(),
                      spec.totalReplicas()));
  }

  // 6. Status.
  for (const RegionObservation& ro : obs.regions) result.regionReachable[ro.name] = ro.reachable;
  const api::TrainingJobStatus status = aggregateStatus(previous, obs);
  if (Status s = writeStatus(object, previous, status); !s.ok()) {
    logger()->info("trainingjob {}/{}: {} (retrying)", ns, name, s.message());
    result.retry = true;
  }
  result.state = status.state;
  if (!obs.waitingForGateway.empty()) {
    result.requeueAfter = options_.pollGateways;
  } else if (status.state == "Running" || status.state == "Pending") {
    result.requeueAfter = options_.pollRunning;
  }
  return result;
}

}  // namespace geo::reconcile
