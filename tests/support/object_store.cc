#include "tests/support/object_store.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>

#include "common/enforce.h"
#include "tests/support/api_error.h"
#include "tests/support/encoding.h"
#include "tests/support/managed_fields.h"

namespace geo::testapi {

namespace {

const std::string kNamespacesKey = "/namespaces";
const std::string kCrdKey = "apiextensions.k8s.io/customresourcedefinitions";
const std::string kCrdCleanup = "customresourcecleanup.apiextensions.k8s.io";

Json& meta(Json& o) {
  if (!o.contains("metadata") || !o["metadata"].is_object()) o["metadata"] = Json::object();
  return o["metadata"];
}

std::string metaString(const Json& o, const char* key) {
  if (!o.contains("metadata") || !o["metadata"].contains(key)) return "";
  const Json& v = o["metadata"][key];
  return v.is_string() ? v.get<std::string>() : "";
}

std::vector<std::string> finalizersOf(const Json& o) {
  if (!o.contains("metadata") || !o["metadata"].contains("finalizers")) return {};
  return o["metadata"]["finalizers"].get<std::vector<std::string>>();
}

bool beingDeleted(const Json& o) {
  return !metaString(o, "deletionTimestamp").empty();
}

// What generation counts: everything but metadata (and status, which has
// its own endpoint when the kind has a status subresource).
Json specPart(const Json& o, const ResourceType& type) {
  Json out = o;
  out.erase("metadata");
  out.erase("apiVersion");
  out.erase("kind");
  if (type.statusSubresource) out.erase("status");
  return out;
}

// Equal for the purpose of "did this write change anything" (the real
// server skips no-op updates: no new resourceVersion, no event).
bool sameContent(Json a, Json b) {
  a["metadata"].erase("resourceVersion");
  b["metadata"].erase("resourceVersion");
  return a == b;
}

Json causeList(std::string field, std::string message, std::string reason = "FieldValueInvalid") {
  return Json::array({{{"reason", reason}, {"message", message}, {"field", field}}});
}

uint64_t parseRv(const std::string& text) {
  try {
    return text.empty() ? 0 : std::stoull(text);
  } catch (const std::exception&) {
    throw badRequest(fmt::format("invalid resource version: {}", text));
  }
}

}  // namespace

std::string nowRfc3339() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

ObjectStore::ObjectStore(ResourceRegistry& registry, size_t retention)
    : registry_(registry), retention_(retention) {
  // The namespaces every cluster starts with.
  const auto nsType = registry_.find("", "v1", "namespaces");
  std::lock_guard lock(mutex_);
  for (const char* ns : {"default", "kube-system", "kube-public", "kube-node-lease"}) {
    createLocked(*nsType, "",
                 Json{{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", ns}}}},
                 WriteContext{"kube-apiserver", "", false}, false);
  }
}

ObjectStore::Bucket& ObjectStore::bucketLocked(const ResourceType& type) {
  Bucket& b = buckets_[type.storageKey()];
  b.key = type.storageKey();
  b.group = type.group;
  b.resource = type.resource;
  b.kind = type.kind;
  return b;
}

Json* ObjectStore::findLocked(const std::string& storageKey, const std::string& ns,
                              const std::string& name) {
  auto b = buckets_.find(storageKey);
  if (b == buckets_.end()) return nullptr;
  auto it = b->second.objects.find({ns, name});
  return it == b->second.objects.end() ? nullptr : &it->second;
}

void ObjectStore::validateLocked(const ResourceType& type, const Json& object) const {
  const std::string name = metaString(object, "name");
  // DNS-1123 subdomains for most kinds, labels for namespaces; RBAC names
  // are path segments (they hold ':' in "system:..." roles).
  static const std::regex kSubdomain(
      R"([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*)");
  static const std::regex kLabel(R"([a-z0-9]([-a-z0-9]*[a-z0-9])?)");
  const bool rbac = type.group == "rbac.authorization.k8s.io";
  const bool ok =
      rbac ? name.find_first_of("/%") == std::string::npos && name != "." && name != ".."
      : type.resource == "namespaces" ? name.size() <= 63 && std::regex_match(name, kLabel)
                                      : name.size() <= 253 && std::regex_match(name, kSubdomain);
  if (name.empty()) {
    throw invalid(type.group, type.kind, name,
                  causeList("metadata.name", "Required value: name or generateName is required",
                            "FieldValueRequired"));
  }
  if (!ok) {
    throw invalid(
        type.group, type.kind, name,
        causeList("metadata.name",
                  fmt::format("Invalid value: \"{}\": a lowercase RFC 1123 {} must "
                              "consist of lower case alphanumeric characters, '-' or "
                              "'.', and must start and end with an alphanumeric "
                              "character",
                              name, type.resource == "namespaces" ? "label" : "subdomain")));
  }
  if (object.contains("metadata") && object["metadata"].contains("labels")) {
    for (const auto& v : object["metadata"]["labels"]) {
      if (!v.is_string()) {
        throw invalid(type.group, type.kind, name,
                      causeList("metadata.labels", "Invalid value: label values must be strings"));
      }
    }
  }
  if (type.storageKey() == kCrdKey) {
    Json causes = ResourceRegistry::validateCrd(object);
    if (!causes.empty()) throw invalid(type.group, type.kind, name, causes);
  }
}

void ObjectStore::emitLocked(const Bucket& bucket, const std::string& ns, std::string type,
                             Json object, Json previous) {
  log_.push_back(std::make_shared<const WatchEvent>(WatchEvent{
      resourceVersion_, bucket.key, ns, std::move(type), std::move(object), std::move(previous)}));
  while (log_.size() > retention_) {
    compactedRv_ = log_.front()->resourceVersion;
    log_.pop_front();
  }
  eventsChanged_.notify_all();
}

namespace {
const Json kNoRefs = Json::array();

// metadata.ownerReferences, or an empty array; no copy.
const Json& ownerRefsOf(const Json& o) {
  auto m = o.find("metadata");
  if (m == o.end() || !m->is_object()) return kNoRefs;
  auto refs = m->find("ownerReferences");
  return refs != m->end() && refs->is_array() ? *refs : kNoRefs;
}

std::string refUid(const Json& ref) {
  auto uid = ref.is_object() ? ref.find("uid") : ref.end();
  return uid != ref.end() && uid->is_string() ? uid->get<std::string>() : "";
}
}  // namespace

void ObjectStore::indexLocked(const ObjectKey& key, const Json& object) {
  uids_[metaString(object, "uid")] = key;
  const Json& refs = ownerRefsOf(object);
  for (const Json& ref : refs) dependents_[refUid(ref)].insert(key);
  if (beingDeleted(object)) {
    deleting_.insert(key);
  } else if (!refs.empty()) {
    orphanCandidates_.insert(key);
  }
}

void ObjectStore::unindexLocked(const ObjectKey& key, const Json& object) {
  auto uid = uids_.find(metaString(object, "uid"));
  if (uid != uids_.end() && uid->second == key) uids_.erase(uid);
  for (const Json& ref : ownerRefsOf(object)) {
    auto deps = dependents_.find(refUid(ref));
    if (deps == dependents_.end()) continue;
    deps->second.erase(key);
    if (deps->second.empty()) dependents_.erase(deps);
  }
  deleting_.erase(key);
}

std::vector<ObjectStore::ObjectKey> ObjectStore::dependentsLocked(const std::string& uid) const {
  auto deps = dependents_.find(uid);
  if (deps == dependents_.end()) return {};
  return {deps->second.begin(), deps->second.end()};
}

Json* ObjectStore::objectLocked(const ObjectKey& key, Bucket** bucket) {
  auto b = buckets_.find(std::get<0>(key));
  if (b == buckets_.end()) return nullptr;
  auto it = b->second.objects.find({std::get<1>(key), std::get<2>(key)});
  if (it == b->second.objects.end()) return nullptr;
  if (bucket != nullptr) *bucket = &b->second;
  return &it->second;
}

void ObjectStore::commitLocked(Bucket& bucket, Json object, const Json* previous) {
  const std::string ns = metaString(object, "namespace");
  const std::string name = metaString(object, "name");
  const ObjectKey key{bucket.key, ns, name};
  Json prev = previous != nullptr ? *previous : Json();
  Json& slot = bucket.objects[{ns, name}];
  if (!slot.is_null()) unindexLocked(key, slot);
  slot = object;
  indexLocked(key, slot);
  emitLocked(bucket, ns, previous != nullptr ? "MODIFIED" : "ADDED", std::move(object),
             std::move(prev));
  persistLocked();
}

void ObjectStore::eraseLocked(Bucket& bucket, const std::string& ns, const std::string& name) {
  auto it = bucket.objects.find({ns, name});
  if (it == bucket.objects.end()) return;
  Json object = std::move(it->second);
  bucket.objects.erase(it);
  unindexLocked({bucket.key, ns, name}, object);
  // Its dependents may have lost their last owner.
  for (ObjectKey& dep : dependentsLocked(metaString(object, "uid"))) {
    orphanCandidates_.insert(std::move(dep));
  }
  meta(object)["resourceVersion"] = std::to_string(++resourceVersion_);
  if (bucket.key == kCrdKey) registry_.removeCrd(object);
  emitLocked(bucket, ns, "DELETED", std::move(object), Json());
  persistLocked();
}

void ObjectStore::persistTo(const std::string& path) {
  const auto parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
  std::lock_guard lock(mutex_);
  persistPath_ = path;
  persistLocked();
}

void ObjectStore::persistLocked() const {
  if (persistPath_.empty()) return;
  Json state{{"resourceVersion", resourceVersion_}, {"buckets", Json::array()}};
  for (const auto& [key, bucket] : buckets_) {
    Json objects = Json::array();
    for (const auto& [nsName, object] : bucket.objects) objects.push_back(object);
    state["buckets"].push_back({{"key", bucket.key},
                                {"group", bucket.group},
                                {"resource", bucket.resource},
                                {"kind", bucket.kind},
                                {"objects", std::move(objects)}});
  }
  const std::string temporary = persistPath_ + ".tmp";
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    out << state.dump();
    out.flush();
    GEO_ENFORCE(out.good(), "test apiserver: cannot write its state to {}", temporary);
  }
  GEO_ENFORCE(std::rename(temporary.c_str(), persistPath_.c_str()) == 0,
              "test apiserver: cannot rename {} to {}", temporary, persistPath_);
}

void ObjectStore::load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  GEO_ENFORCE(in.good(), "test apiserver: cannot read the state file {}", path);
  const Json state = Json::parse(std::istreambuf_iterator<char>(in), {}, nullptr, false);
  GEO_ENFORCE(state.is_object() && state.contains("resourceVersion") &&
                  state["resourceVersion"].is_number_unsigned() && state.contains("buckets") &&
                  state["buckets"].is_array(),
              "test apiserver: {} is not a state file it wrote (resourceVersion, buckets)", path);
  std::lock_guard lock(mutex_);
  buckets_.clear();
  uids_.clear();
  dependents_.clear();
  deleting_.clear();
  orphanCandidates_.clear();
  log_.clear();
  // The CRDs first: their resources must exist before objects of them.
  std::vector<const Json*> ordered;
  for (const Json& b : state["buckets"]) {
    if (b.value("key", "") == kCrdKey)
      ordered.insert(ordered.begin(), &b);
    else
      ordered.push_back(&b);
  }
  for (const Json* b : ordered) {
    Bucket& bucket = buckets_[b->at("key").get<std::string>()];
    bucket.key = b->at("key").get<std::string>();
    bucket.group = b->at("group").get<std::string>();
    bucket.resource = b->at("resource").get<std::string>();
    bucket.kind = b->at("kind").get<std::string>();
    for (const Json& object : b->at("objects")) {
      const std::string ns = metaString(object, "namespace");
      const std::string name = metaString(object, "name");
      bucket.objects[{ns, name}] = object;
      indexLocked({bucket.key, ns, name}, bucket.objects[{ns, name}]);
      if (bucket.key == kCrdKey) registry_.applyCrd(object);
    }
  }
  resourceVersion_ = state["resourceVersion"].get<uint64_t>();
  compactedRv_ = resourceVersion_;
}

namespace {
// The real server folds a Secret's write-only stringData into data (base64,
// stringData winning) and never stores stringData.
void foldStringData(const ResourceType& type, Json& object) {
  if (type.group != "" || type.resource != "secrets" || !object.contains("stringData")) return;
  const Json stringData = object["stringData"];
  object.erase("stringData");
  if (!stringData.is_object()) throw badRequest("stringData: must be a map of strings");
  if (!object.contains("data") || !object["data"].is_object()) object["data"] = Json::object();
  for (const auto& [key, value] : stringData.items()) {
    if (!value.is_string()) throw badRequest("stringData." + key + ": must be a string");
    object["data"][key] = base64Encode(value.get<std::string>());
  }
}
}  // namespace

Json ObjectStore::createLocked(const ResourceType& type, const std::string& ns, Json object,
                               const WriteContext& ctx, bool applied) {
  if (!object.is_object()) throw badRequest("the body of the request must be a JSON object");
  if (object.value("apiVersion", type.apiVersion()) != type.apiVersion() ||
      object.value("kind", type.kind) != type.kind) {
    throw badRequest(
        fmt::format("the API version in the data ({}) does not match the expected "
                    "API version ({})",
                    object.value("apiVersion", ""), type.apiVersion()));
  }
  object["apiVersion"] = type.apiVersion();
  object["kind"] = type.kind;
  foldStringData(type, object);
  Json& m = meta(object);
  const std::string objNs = metaString(object, "namespace");
  if (type.namespaced) {
    if (!objNs.empty() && objNs != ns) {
      throw badRequest(
          "the namespace of the provided object does not match the namespace sent "
          "on the request");
    }
    m["namespace"] = ns;
  } else {
    m.erase("namespace");
  }
  if (metaString(object, "name").empty() && !metaString(object, "generateName").empty()) {
    m["name"] = metaString(object, "generateName") + randomSuffix(5);
  }
  validateLocked(type, object);
  const std::string name = metaString(object, "name");
  if (type.namespaced) {
    Json* nsObj = findLocked(kNamespacesKey, "", ns);
    if (nsObj == nullptr) throw notFound("", "namespaces", ns);
    if (beingDeleted(*nsObj)) {
      throw forbidden(
          fmt::format("{} \"{}\" is forbidden: unable to create new content in "
                      "namespace {} because it is being terminated",
                      qualifiedResource(type.group, type.resource), name, ns));
    }
  }
  Bucket& bucket = bucketLocked(type);
  if (bucket.objects.contains({type.namespaced ? ns : "", name})) {
    throw alreadyExists(type.group, type.resource, name);
  }
  for (const char* k : {"deletionTimestamp", "deletionGracePeriodSeconds", "resourceVersion"}) {
    m.erase(k);
  }
  m["uid"] = randomUuid();
  m["creationTimestamp"] = nowRfc3339();
  m["generation"] = 1;
  if (type.statusSubresource) object.erase("status");
  if (type.storageKey() == kNamespacesKey) {
    m["labels"]["kubernetes.io/metadata.name"] = name;
    object["spec"] = {{"finalizers", {"kubernetes"}}};
    object["status"] = {{"phase", "Active"}};
  }
  if (type.storageKey() == kCrdKey) {
    auto finalizers = finalizersOf(object);
    if (std::find(finalizers.begin(), finalizers.end(), kCrdCleanup) == finalizers.end()) {
      m["finalizers"].push_back(kCrdCleanup);
    }
  }
  if (!applied) trackUpdate(nullptr, object, type, ctx.manager, "", nowRfc3339());
  if (ctx.dryRun) return object;
  if (type.storageKey() == kCrdKey) {
    // What the CRD controllers do: accept the names and establish the API.
    const std::string now = nowRfc3339();
    object["status"] = {{"acceptedNames", object["spec"]["names"]},
                        {"storedVersions", Json::array()},
                        {"conditions",
                         {{{"type", "NamesAccepted"},
                           {"status", "True"},
                           {"reason", "NoConflicts"},
                           {"message", "no conflicts found"},
                           {"lastTransitionTime", now}},
                          {{"type", "Established"},
                           {"status", "True"},
                           {"reason", "InitialNamesAccepted"},
                           {"message", "the initial names have been accepted"},
                           {"lastTransitionTime", now}}}}};
    for (const auto& v : object["spec"]["versions"]) {
      if (v.value("storage", false)) object["status"]["storedVersions"].push_back(v["name"]);
    }
    registry_.applyCrd(object);
  }
  m["resourceVersion"] = std::to_string(++resourceVersion_);
  commitLocked(bucket, object, nullptr);
  collectGarbageLocked();
  return object;
}

Json ObjectStore::updateLocked(const ResourceType& type, Json& stored, Json next,
                               const WriteContext& ctx, bool applied) {
  if (!next.is_object()) throw badRequest("the body of the request must be a JSON object");
  const Json old = stored;
  const std::string name = metaString(old, "name");
  if (next.value("apiVersion", type.apiVersion()) != type.apiVersion() ||
      next.value("kind", type.kind) != type.kind) {
    throw badRequest(
        fmt::format("the API version in the data ({}) does not match the expected "
                    "API version ({})",
                    next.value("apiVersion", ""), type.apiVersion()));
  }
  foldStringData(type, next);
  const std::string nextName = metaString(next, "name");
  if (!nextName.empty() && nextName != name) {
    throw badRequest(
        fmt::format("the name of the object ({}) does not match the name on the URL "
                    "({})",
                    nextName, name));
  }
  const std::string nextNs = metaString(next, "namespace");
  if (type.namespaced && !nextNs.empty() && nextNs != metaString(old, "namespace")) {
    throw badRequest(
        "the namespace of the provided object does not match the namespace sent on "
        "the request");
  }
  const std::string wantRv = metaString(next, "resourceVersion");
  if (!wantRv.empty() && wantRv != metaString(old, "resourceVersion")) {
    throw conflict(type.group, type.resource, name,
                   "the object has been modified; please apply your changes to the latest "
                   "version and try again");
  }
  const std::string wantUid = metaString(next, "uid");
  if (!wantUid.empty() && wantUid != metaString(old, "uid")) {
    throw conflict(type.group, type.resource, name,
                   fmt::format("Precondition failed: UID in precondition: {}, UID in object "
                               "meta: {}",
                               wantUid, metaString(old, "uid")));
  }

  Json result;
  if (ctx.subresource == "status") {
    result = old;
    if (next.contains("status")) {
      result["status"] = next["status"];
    } else {
      result.erase("status");
    }
    if (next.contains("metadata") && next["metadata"].contains("managedFields")) {
      meta(result)["managedFields"] = next["metadata"]["managedFields"];
    }
  } else {
    result = std::move(next);
    result["apiVersion"] = type.apiVersion();
    result["kind"] = type.kind;
    Json& m = meta(result);
    for (const char* k : {"name", "namespace", "uid", "creationTimestamp", "generation",
                          "deletionTimestamp", "deletionGracePeriodSeconds"}) {
      if (old["metadata"].contains(k)) {
        m[k] = old["metadata"][k];
      } else {
        m.erase(k);
      }
    }
    if (!m.contains("managedFields") && old["metadata"].contains("managedFields")) {
      m["managedFields"] = old["metadata"]["managedFields"];
    }
    if (type.statusSubresource) {
      if (old.contains("status")) {
        result["status"] = old["status"];
      } else {
        result.erase("status");
      }
    }
    if (type.storageKey() == kNamespacesKey) result["status"] = old["status"];
    if (beingDeleted(old)) {
      const auto before = finalizersOf(old);
      std::vector<std::string> added;
      for (const auto& f : finalizersOf(result)) {
        if (std::find(before.begin(), before.end(), f) == before.end()) added.push_back(f);
      }
      if (!added.empty()) {
        throw invalid(type.group, type.kind, name,
                      causeList("metadata.finalizers",
                                fmt::format("Forbidden: no new finalizers can be added if the "
                                            "object is being deleted, found new finalizers {}",
                                            Json(added).dump()),
                                "FieldValueForbidden"));
      }
    }
    if (type.storageKey() == kCrdKey) result["status"] = old.value("status", Json::object());
  }
  validateLocked(type, result);
  if (sameContent(result, old)) return old;
  if (specPart(result, type) != specPart(old, type)) {
    meta(result)["generation"] = old["metadata"].value("generation", 1) + 1;
  }
  if (!applied) trackUpdate(&old, result, type, ctx.manager, ctx.subresource, nowRfc3339());
  if (sameContent(result, old)) return old;
  if (ctx.dryRun) return result;
  if (type.storageKey() == kCrdKey) {
    result["status"]["acceptedNames"] = result["spec"]["names"];
    registry_.applyCrd(result);
  }
  meta(result)["resourceVersion"] = std::to_string(++resourceVersion_);
  Bucket& bucket = bucketLocked(type);
  const std::string ns = metaString(result, "namespace");
  commitLocked(bucket, result, &old);
  if (beingDeleted(result) && finalizersOf(result).empty()) eraseLocked(bucket, ns, name);
  collectGarbageLocked();
  return result;
}

Json ObjectStore::create(const ResourceType& type, const std::string& ns, Json object,
                         const WriteContext& ctx) {
  std::lock_guard lock(mutex_);
  return createLocked(type, ns, std::move(object), ctx, false);
}

Json ObjectStore::get(const ResourceType& type, const std::string& ns,
                      const std::string& name) const {
  std::lock_guard lock(mutex_);
  auto b = buckets_.find(type.storageKey());
  if (b != buckets_.end()) {
    auto it = b->second.objects.find({type.namespaced ? ns : "", name});
    if (it != b->second.objects.end()) {
      Json out = it->second;
      out["apiVersion"] = type.apiVersion();
      return out;
    }
  }
  throw notFound(type.group, type.resource, name);
}

Json ObjectStore::list(const ResourceType& type, const std::string& ns,
                       const ListOptions& options) const {
  std::lock_guard lock(mutex_);
  uint64_t listRv = resourceVersion_;
  std::pair<std::string, std::string> start;
  if (!options.continueToken.empty()) {
    Json token;
    try {
      token = Json::parse(base64Decode(options.continueToken));
      listRv = token.at("rv").get<uint64_t>();
      start = {token.at("ns").get<std::string>(), token.at("name").get<std::string>()};
    } catch (const std::exception&) {
      throw badRequest("continue key is not valid: incorrect encoded start resourceVersion");
    }
    if (listRv < compactedRv_) {
      throw gone(
          "The provided continue parameter is too old to display a consistent list "
          "result. You can start a new list without the continue parameter, or use the "
          "continue token in this response to retrieve the remainder of the results. "
          "Continuing with the provided token results in an inconsistent list - objects "
          "that were created, modified, or deleted between the time the first chunk was "
          "returned and now may show up in the list.");
    }
  }
  Json items = Json::array();
  Json out = {{"apiVersion", type.apiVersion()},
              {"kind", type.kind + "List"},
              {"metadata", {{"resourceVersion", std::to_string(listRv)}}}};
  auto b = buckets_.find(type.storageKey());
  if (b != buckets_.end()) {
    const auto& objects = b->second.objects;
    // Objects are ordered by (namespace, name): a namespace's are one range.
    auto it = !options.continueToken.empty() ? objects.upper_bound(start)
              : ns.empty()                   ? objects.begin()
                                             : objects.lower_bound({ns, ""});
    if (!ns.empty() && it != objects.end() && it->first.first < ns) {
      it = objects.lower_bound({ns, ""});
    }
    int64_t remaining = 0;
    for (; it != objects.end(); ++it) {
      const Json& o = it->second;
      if (!ns.empty() && it->first.first != ns) break;
      if (!options.labels.matches(o)) continue;
      if (options.fields && !options.fields->matches(o)) continue;
      if (options.limit > 0 && int64_t(items.size()) == options.limit) {
        ++remaining;
        continue;
      }
      Json item = o;
      item["apiVersion"] = type.apiVersion();
      items.push_back(std::move(item));
      start = it->first;
    }
    if (remaining > 0) {
      Json token = {{"rv", listRv}, {"ns", start.first}, {"name", start.second}};
      out["metadata"]["continue"] = base64Encode(token.dump());
      out["metadata"]["remainingItemCount"] = remaining;
    }
  }
  out["items"] = std::move(items);
  return out;
}

Json ObjectStore::update(const ResourceType& type, const std::string& ns, const std::string& name,
                         Json object, const WriteContext& ctx) {
  std::lock_guard lock(mutex_);
  Json* stored = findLocked(type.storageKey(), type.namespaced ? ns : "", name);
  if (stored == nullptr) {
    // PUT creates for the kinds whose strategy allows it (none of the
    // built-ins here, nor custom resources): the real server answers 404.
    throw notFound(type.group, type.resource, name);
  }
  return updateLocked(type, *stored, std::move(object), ctx, false);
}

Json ObjectStore::modify(const ResourceType& type, const std::string& ns, const std::string& name,
                         const WriteContext& ctx,
                         const std::function<Json(const Json* current)>& mutate,
                         bool serverSideApply, bool* created) {
  std::lock_guard lock(mutex_);
  Json* stored = findLocked(type.storageKey(), type.namespaced ? ns : "", name);
  *created = stored == nullptr;
  if (stored == nullptr) {
    if (!serverSideApply || !ctx.subresource.empty()) {
      throw notFound(type.group, type.resource, name);
    }
    Json object = mutate(nullptr);
    meta(object)["name"] = name;
    return createLocked(type, ns, std::move(object), ctx, true);
  }
  Json current = *stored;
  current["apiVersion"] = type.apiVersion();
  return updateLocked(type, *stored, mutate(&current), ctx, serverSideApply);
}

Json ObjectStore::removeLocked(Bucket& bucket, const std::string& ns, const std::string& name,
                               const DeleteOptions& options) {
  auto it = bucket.objects.find({ns, name});
  if (it == bucket.objects.end()) throw notFound(bucket.group, bucket.resource, name);
  Json& stored = it->second;
  if (options.preconditionUid && *options.preconditionUid != metaString(stored, "uid")) {
    throw conflict(bucket.group, bucket.resource, name,
                   fmt::format("Precondition failed: UID in precondition: {}, UID in object "
                               "meta: {}",
                               *options.preconditionUid, metaString(stored, "uid")));
  }
  if (options.preconditionResourceVersion &&
      *options.preconditionResourceVersion != metaString(stored, "resourceVersion")) {
    throw conflict(
        bucket.group, bucket.resource, name,
        fmt::format("Precondition failed: ResourceVersion in precondition: {}, "
                    "ResourceVersion in object meta: {}",
                    *options.preconditionResourceVersion, metaString(stored, "resourceVersion")));
  }
  std::string policy = options.propagationPolicy;
  if (policy.empty()) {
    // batch/v1 Jobs default to orphaning their pods for compatibility.
    policy = bucket.group == "batch" && bucket.resource == "jobs" ? "Orphan" : "Background";
  }
  if (policy != "Background" && policy != "Foreground" && policy != "Orphan") {
    throw invalid("meta.k8s.io", "DeleteOptions", "",
                  causeList("propagationPolicy",
                            fmt::format("Unsupported value: \"{}\": supported values: "
                                        "\"Foreground\", \"Background\", \"Orphan\", \"nil\"",
                                        policy),
                            "FieldValueNotSupported"));
  }
  Json next = stored;
  auto finalizers = finalizersOf(next);
  auto addFinalizer = [&](const std::string& f) {
    if (std::find(finalizers.begin(), finalizers.end(), f) == finalizers.end()) {
      finalizers.push_back(f);
    }
  };
  if (policy == "Foreground") addFinalizer("foregroundDeletion");
  if (policy == "Orphan") addFinalizer("orphan");
  const bool isNamespace = bucket.group.empty() && bucket.resource == "namespaces";
  if (options.dryRun) return stored;
  if (finalizers.empty() && !isNamespace) {
    Json last = stored;
    const std::string uid = metaString(last, "uid");
    eraseLocked(bucket, ns, name);
    collectGarbageLocked();
    Json details = {{"name", name}, {"kind", bucket.resource}, {"uid", uid}};
    if (!bucket.group.empty()) details["group"] = bucket.group;
    return {{"kind", "Status"},
            {"apiVersion", "v1"},
            {"metadata", Json::object()},
            {"status", "Success"},
            {"details", details}};
  }
  if (!beingDeleted(next) || finalizers != finalizersOf(stored)) {
    Json& m = meta(next);
    if (!beingDeleted(next)) {
      m["deletionTimestamp"] = nowRfc3339();
      m["deletionGracePeriodSeconds"] = 0;
    }
    if (finalizers.empty()) {
      m.erase("finalizers");
    } else {
      m["finalizers"] = finalizers;
    }
    if (isNamespace) next["status"]["phase"] = "Terminating";
    m["resourceVersion"] = std::to_string(++resourceVersion_);
    const Json previous = stored;
    commitLocked(bucket, next, &previous);
    collectGarbageLocked();
  }
  return next;
}

Json ObjectStore::remove(const ResourceType& type, const std::string& ns, const std::string& name,
                         const DeleteOptions& options) {
  std::lock_guard lock(mutex_);
  Json out = removeLocked(bucketLocked(type), type.namespaced ? ns : "", name, options);
  if (out.value("kind", "") != "Status") out["apiVersion"] = type.apiVersion();
  return out;
}

Json ObjectStore::removeCollection(const ResourceType& type, const std::string& ns,
                                   const ListOptions& listOptions, const DeleteOptions& options) {
  Json listed = list(type, ns, listOptions);
  std::lock_guard lock(mutex_);
  Bucket& bucket = bucketLocked(type);
  Json items = Json::array();
  for (const auto& item : listed["items"]) {
    const std::string name = metaString(item, "name");
    const std::string itemNs = metaString(item, "namespace");
    if (!bucket.objects.contains({itemNs, name})) continue;
    Json out = removeLocked(bucket, itemNs, name, options);
    items.push_back(out.value("kind", "") == "Status" ? item : out);
  }
  listed["items"] = std::move(items);
  listed["metadata"]["resourceVersion"] = std::to_string(resourceVersion_);
  return listed;
}

void ObjectStore::dropFinalizerLocked(Bucket& bucket, const std::string& ns,
                                      const std::string& name, const std::string& finalizer) {
  auto it = bucket.objects.find({ns, name});
  if (it == bucket.objects.end()) return;
  const Json previous = it->second;
  Json next = previous;
  auto finalizers = finalizersOf(next);
  std::erase(finalizers, finalizer);
  if (finalizers.empty()) {
    next["metadata"].erase("finalizers");
  } else {
    next["metadata"]["finalizers"] = finalizers;
  }
  next["metadata"]["resourceVersion"] = std::to_string(++resourceVersion_);
  commitLocked(bucket, next, &previous);
  if (beingDeleted(next) && finalizers.empty()) eraseLocked(bucket, ns, name);
}

// One step of the garbage collector and the namespace and CRD controllers,
// as a walk of the store in order would take it (first the first orphaned
// dependent, then the first object being deleted that has work to do), but
// reading the indexes instead of walking every object.
bool ObjectStore::collectOnceLocked() {
  // Dependents all of whose owners are gone go too (background).
  while (!orphanCandidates_.empty()) {
    const ObjectKey key = *orphanCandidates_.begin();
    orphanCandidates_.erase(orphanCandidates_.begin());
    Bucket* bucket = nullptr;
    const Json* o = objectLocked(key, &bucket);
    if (o == nullptr || beingDeleted(*o)) continue;
    const Json& refs = ownerRefsOf(*o);
    if (refs.empty() || std::any_of(refs.begin(), refs.end(),
                                    [&](const Json& r) { return uids_.contains(refUid(r)); })) {
      continue;
    }
    removeLocked(*bucket, std::get<1>(key), std::get<2>(key),
                 DeleteOptions{"Background", {}, {}, false});
    return true;
  }
  // Objects being deleted whose finalizers the control plane handles. Each
  // branch acts and returns at once: the loop's iterator may not survive
  // the write.
  for (const ObjectKey& deletingKey : deleting_) {
    const ObjectKey target = deletingKey;
    Bucket* bucketPtr = nullptr;
    Json* found = objectLocked(target, &bucketPtr);
    if (found == nullptr) continue;
    Bucket& bucket = *bucketPtr;
    Json& o = *found;
    const std::string& key = std::get<0>(target);
    const std::string& targetNs = std::get<1>(target);
    const std::string& targetName = std::get<2>(target);
    const std::string uid = metaString(o, "uid");
    const auto finalizers = finalizersOf(o);
    auto has = [&](const std::string& f) {
      return std::find(finalizers.begin(), finalizers.end(), f) != finalizers.end();
    };
    if (has("orphan")) {
      for (const ObjectKey& depKey : dependentsLocked(uid)) {
        Bucket* depBucket = nullptr;
        const Json* dep = objectLocked(depKey, &depBucket);
        if (dep == nullptr) continue;
        const Json previous = *dep;
        Json next = previous;
        Json refs = Json::array();
        for (const auto& r : next["metadata"]["ownerReferences"]) {
          if (r.value("uid", "") != uid) refs.push_back(r);
        }
        if (refs.empty()) {
          next["metadata"].erase("ownerReferences");
        } else {
          next["metadata"]["ownerReferences"] = refs;
        }
        next["metadata"]["resourceVersion"] = std::to_string(++resourceVersion_);
        commitLocked(*depBucket, next, &previous);
      }
      dropFinalizerLocked(bucket, targetNs, targetName, "orphan");
      return true;
    }
    if (has("foregroundDeletion")) {
      const auto deps = dependentsLocked(uid);
      for (const ObjectKey& depKey : deps) {
        Bucket* depBucket = nullptr;
        const Json* dep = objectLocked(depKey, &depBucket);
        if (dep != nullptr && !beingDeleted(*dep)) {
          removeLocked(*depBucket, std::get<1>(depKey), std::get<2>(depKey),
                       DeleteOptions{"Foreground", {}, {}, false});
          return true;
        }
      }
      if (deps.empty()) {
        dropFinalizerLocked(bucket, targetNs, targetName, "foregroundDeletion");
        return true;
      }
    }
    if (key == kNamespacesKey) {
      // The namespace controller: delete the content, then the namespace.
      bool any = false;
      for (auto& [otherKey, other] : buckets_) {
        for (auto it = other.objects.lower_bound({targetName, ""});
             it != other.objects.end() && it->first.first == targetName; ++it) {
          any = true;
          if (!beingDeleted(it->second)) {
            const auto victim = it->first;
            removeLocked(other, victim.first, victim.second, DeleteOptions{});
            return true;
          }
        }
      }
      if (!any && finalizers.empty()) {
        eraseLocked(bucket, targetNs, targetName);
        return true;
      }
    }
    if (key == kCrdKey && has(kCrdCleanup)) {
      const std::string crKey =
          o["spec"].value("group", "") + "/" + o["spec"]["names"].value("plural", "");
      auto crs = buckets_.find(crKey);
      if (crs != buckets_.end() && !crs->second.objects.empty()) {
        for (auto& [crId, cr] : crs->second.objects) {
          if (!beingDeleted(cr)) {
            const auto victim = crId;
            removeLocked(crs->second, victim.first, victim.second, DeleteOptions{});
            return true;
          }
        }
      } else {
        dropFinalizerLocked(bucket, targetNs, targetName, kCrdCleanup);
        return true;
      }
    }
  }
  return false;
}

void ObjectStore::collectGarbageLocked() {
  // removeLocked re-enters here; the outermost call runs to a fixed point.
  static thread_local bool running = false;
  if (running) return;
  running = true;
  try {
    while (collectOnceLocked()) {
    }
  } catch (...) {
    running = false;
    throw;
  }
  running = false;
}

std::pair<std::vector<Json>, uint64_t> ObjectStore::snapshot(const ResourceType& type,
                                                             const std::string& ns) const {
  std::lock_guard lock(mutex_);
  std::vector<Json> out;
  auto b = buckets_.find(type.storageKey());
  if (b != buckets_.end()) {
    const auto& objects = b->second.objects;
    for (auto it = ns.empty() ? objects.begin() : objects.lower_bound({ns, ""});
         it != objects.end() && (ns.empty() || it->first.first == ns); ++it) {
      out.push_back(it->second);
    }
  }
  return {out, resourceVersion_};
}

std::optional<std::vector<WatchEventPtr>> ObjectStore::eventsAfter(uint64_t fromRv,
                                                                   std::chrono::milliseconds wait,
                                                                   uint64_t* currentRv,
                                                                   const std::string& storageKey) {
  std::unique_lock lock(mutex_);
  if (fromRv < compactedRv_) return std::nullopt;
  eventsChanged_.wait_for(lock, wait, [&] {
    return fromRv < compactedRv_ || (!log_.empty() && log_.back()->resourceVersion > fromRv);
  });
  if (fromRv < compactedRv_) return std::nullopt;
  std::vector<WatchEventPtr> out;
  auto it =
      std::upper_bound(log_.begin(), log_.end(), fromRv,
                       [](uint64_t rv, const WatchEventPtr& e) { return rv < e->resourceVersion; });
  for (; it != log_.end(); ++it) {
    if (storageKey.empty() || (*it)->storageKey == storageKey) out.push_back(*it);
  }
  *currentRv = resourceVersion_;
  return out;
}

uint64_t ObjectStore::currentResourceVersion() const {
  std::lock_guard lock(mutex_);
  return resourceVersion_;
}

void ObjectStore::compact() {
  std::lock_guard lock(mutex_);
  compactedRv_ = resourceVersion_;
  log_.clear();
  eventsChanged_.notify_all();
}

void ObjectStore::setRetention(size_t events) {
  std::lock_guard lock(mutex_);
  retention_ = events;
  while (log_.size() > retention_) {
    compactedRv_ = log_.front()->resourceVersion;
    log_.pop_front();
  }
}

void ObjectStore::wakeWatchers() {
  eventsChanged_.notify_all();
}

uint64_t parseResourceVersion(const std::string& text) {
  return parseRv(text);
}

}  // namespace geo::testapi
