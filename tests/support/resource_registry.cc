#include "tests/support/resource_registry.h"

#include <fmt/format.h>

#include <algorithm>

namespace geo::testapi {

namespace {

// Merge keys of the built-in kinds' lists (the `patchMergeKey` tags of
// k8s.io/api), by the field's name and, where that is ambiguous, its parent.
ListInfo builtinListInfo(const std::string& kind, const std::vector<std::string>& path) {
  using T = ListInfo::Type;
  if (path.empty()) return {};
  const std::string& field = path.back();
  const std::string parent = path.size() >= 2 ? path[path.size() - 2] : "";
  if (field == "finalizers" && parent == "metadata") return {T::kSet, {}};
  if (field == "ownerReferences") return {T::kMap, {"uid"}};
  if (field == "containers" || field == "initContainers" || field == "ephemeralContainers" ||
      field == "env" || field == "volumes" || field == "imagePullSecrets") {
    return {T::kMap, {"name"}};
  }
  if (field == "volumeMounts") return {T::kMap, {"mountPath"}};
  if (field == "volumeDevices") return {T::kMap, {"devicePath"}};
  if (field == "hostAliases") return {T::kMap, {"ip"}};
  if (field == "conditions") return {T::kMap, {"type"}};
  if (field == "topologySpreadConstraints") return {T::kMap, {"topologyKey", "whenUnsatisfiable"}};
  if (field == "ports") {
    if (kind == "Service" && parent == "spec") return {T::kMap, {"port", "protocol"}};
    if (parent == "containers" || parent == "initContainers" || parent == "ephemeralContainers") {
      return {T::kMap, {"containerPort", "protocol"}};
    }
  }
  return {};
}

ResourceType builtin(std::string group, std::string version, std::string resource,
                     std::string singular, std::string kind, bool namespaced, bool status,
                     std::vector<std::string> shortNames = {},
                     std::vector<std::string> categories = {}) {
  ResourceType t;
  t.group = std::move(group);
  t.version = std::move(version);
  t.resource = std::move(resource);
  t.singular = std::move(singular);
  t.kind = std::move(kind);
  t.namespaced = namespaced;
  t.statusSubresource = status;
  t.shortNames = std::move(shortNames);
  t.categories = std::move(categories);
  return t;
}

void collectListTypes(const Json& schema, const std::string& path,
                      std::map<std::string, ListInfo>& out) {
  if (!schema.is_object()) return;
  if (schema.contains("properties")) {
    for (const auto& [name, child] : schema["properties"].items()) {
      collectListTypes(child, path.empty() ? name : path + "." + name, out);
    }
  }
  if (schema.value("type", "") == "array") {
    const std::string listType = schema.value("x-kubernetes-list-type", "atomic");
    if (listType == "map") {
      out[path] = {ListInfo::Type::kMap,
                   schema.value("x-kubernetes-list-map-keys", std::vector<std::string>{})};
    } else if (listType == "set") {
      out[path] = {ListInfo::Type::kSet, {}};
    }
    if (schema.contains("items")) collectListTypes(schema["items"], path, out);
  }
}

}  // namespace

ListInfo ResourceType::listInfo(const std::vector<std::string>& path) const {
  if (!custom) return builtinListInfo(kind, path);
  if (path.size() == 2 && path[0] == "metadata") return builtinListInfo(kind, path);
  std::string joined;
  for (const auto& p : path) joined += (joined.empty() ? "" : ".") + p;
  auto it = listTypes.find(joined);
  return it == listTypes.end() ? ListInfo{} : it->second;
}

ResourceRegistry::ResourceRegistry() {
  const std::vector<std::string> all = {"all"};
  std::lock_guard lock(mutex_);
  addLocked(builtin("", "v1", "namespaces", "namespace", "Namespace", false, true, {"ns"}));
  addLocked(builtin("", "v1", "configmaps", "configmap", "ConfigMap", true, false, {"cm"}));
  addLocked(builtin("", "v1", "secrets", "secret", "Secret", true, false));
  addLocked(builtin("", "v1", "services", "service", "Service", true, true, {"svc"}, all));
  addLocked(builtin("", "v1", "serviceaccounts", "serviceaccount", "ServiceAccount", true, false,
                    {"sa"}));
  addLocked(builtin("", "v1", "pods", "pod", "Pod", true, true, {"po"}, all));
  addLocked(builtin("", "v1", "persistentvolumeclaims", "persistentvolumeclaim",
                    "PersistentVolumeClaim", true, true, {"pvc"}, all));
  addLocked(builtin("", "v1", "events", "event", "Event", true, false, {"ev"}));
  addLocked(builtin("apps", "v1", "deployments", "deployment", "Deployment", true, true, {"deploy"},
                    all));
  addLocked(
      builtin("apps", "v1", "replicasets", "replicaset", "ReplicaSet", true, true, {"rs"}, all));
  addLocked(builtin("apps", "v1", "statefulsets", "statefulset", "StatefulSet", true, true, {"sts"},
                    all));
  addLocked(builtin("batch", "v1", "jobs", "job", "Job", true, true, {}, all));
  addLocked(builtin("coordination.k8s.io", "v1", "leases", "lease", "Lease", true, false));
  addLocked(builtin("events.k8s.io", "v1", "events", "event", "Event", true, false, {"ev"}));
  addLocked(builtin("policy", "v1", "poddisruptionbudgets", "poddisruptionbudget",
                    "PodDisruptionBudget", true, true, {"pdb"}));
  const std::string rbac = "rbac.authorization.k8s.io";
  addLocked(builtin(rbac, "v1", "roles", "role", "Role", true, false));
  addLocked(builtin(rbac, "v1", "clusterroles", "clusterrole", "ClusterRole", false, false));
  addLocked(builtin(rbac, "v1", "rolebindings", "rolebinding", "RoleBinding", true, false));
  addLocked(builtin(rbac, "v1", "clusterrolebindings", "clusterrolebinding", "ClusterRoleBinding",
                    false, false));
  addLocked(builtin("apiextensions.k8s.io", "v1", "customresourcedefinitions",
                    "customresourcedefinition", "CustomResourceDefinition", false, true,
                    {"crd", "crds"}));
}

void ResourceRegistry::addLocked(ResourceType type) {
  auto ptr = std::make_shared<const ResourceType>(std::move(type));
  for (auto& t : types_) {
    if (t->group == ptr->group && t->version == ptr->version && t->resource == ptr->resource) {
      t = ptr;
      return;
    }
  }
  types_.push_back(std::move(ptr));
}

ResourceTypePtr ResourceRegistry::find(std::string_view group, std::string_view version,
                                       std::string_view resource) const {
  std::lock_guard lock(mutex_);
  for (const auto& t : types_) {
    if (t->group == group && t->version == version && t->resource == resource) return t;
  }
  return nullptr;
}

ResourceTypePtr ResourceRegistry::findKind(std::string_view apiVersion,
                                           std::string_view kind) const {
  std::lock_guard lock(mutex_);
  for (const auto& t : types_) {
    if (t->apiVersion() == apiVersion && t->kind == kind) return t;
  }
  return nullptr;
}

std::vector<ResourceTypePtr> ResourceRegistry::all() const {
  std::lock_guard lock(mutex_);
  return types_;
}

Json ResourceRegistry::validateCrd(const Json& crd) {
  Json causes = Json::array();
  auto fail = [&](std::string field, std::string message) {
    causes.push_back({{"reason", "FieldValueInvalid"}, {"field", field}, {"message", message}});
  };
  const Json spec = crd.value("spec", Json::object());
  const std::string group = spec.value("group", "");
  const Json names = spec.value("names", Json::object());
  const std::string plural = names.value("plural", "");
  if (group.empty()) fail("spec.group", "Required value");
  if (plural.empty()) fail("spec.names.plural", "Required value");
  if (names.value("kind", "").empty()) fail("spec.names.kind", "Required value");
  const std::string scope = spec.value("scope", "");
  if (scope != "Namespaced" && scope != "Cluster") {
    fail("spec.scope", "Unsupported value: \"" + scope +
                           "\": supported values: \"Cluster\", "
                           "\"Namespaced\"");
  }
  const std::string name = crd.value("metadata", Json::object()).value("name", "");
  if (!plural.empty() && !group.empty() && name != plural + "." + group) {
    fail("metadata.name",
         "Invalid value: \"" + name + "\": must be spec.names.plural+\".\"+spec.group");
  }
  const Json versions = spec.value("versions", Json::array());
  if (!versions.is_array() || versions.empty()) fail("spec.versions", "Required value");
  int storage = 0;
  for (const auto& v : versions) storage += v.value("storage", false) ? 1 : 0;
  if (versions.is_array() && !versions.empty() && storage != 1) {
    fail("spec.versions", "Invalid value: must have exactly one version marked as storage version");
  }
  return causes;
}

void ResourceRegistry::applyCrd(const Json& crd) {
  const Json& spec = crd.at("spec");
  const Json& names = spec.at("names");
  std::lock_guard lock(mutex_);
  // Versions no longer served disappear, as on the real server.
  const std::string group = spec.at("group").get<std::string>();
  const std::string plural = names.at("plural").get<std::string>();
  std::erase_if(types_, [&](const ResourceTypePtr& t) {
    return t->custom && t->group == group && t->resource == plural;
  });
  for (const auto& v : spec.at("versions")) {
    if (!v.value("served", false)) continue;
    ResourceType t;
    t.group = group;
    t.version = v.at("name").get<std::string>();
    t.resource = plural;
    t.kind = names.at("kind").get<std::string>();
    t.singular = names.value("singular", "");
    if (t.singular.empty()) {
      t.singular = t.kind;
      std::transform(t.singular.begin(), t.singular.end(), t.singular.begin(), ::tolower);
    }
    t.namespaced = spec.at("scope") == "Namespaced";
    t.custom = true;
    t.statusSubresource = v.contains("subresources") && v["subresources"].contains("status");
    t.shortNames = names.value("shortNames", std::vector<std::string>{});
    t.categories = names.value("categories", std::vector<std::string>{});
    for (const auto& c : v.value("additionalPrinterColumns", Json::array())) {
      t.printerColumns.push_back({c.value("name", ""), c.value("type", "string"),
                                  c.value("format", ""), c.value("description", ""),
                                  c.value("jsonPath", ""), c.value("priority", 0)});
    }
    if (v.contains("schema") && v["schema"].contains("openAPIV3Schema")) {
      collectListTypes(v["schema"]["openAPIV3Schema"], "", t.listTypes);
    }
    addLocked(std::move(t));
  }
}

void ResourceRegistry::removeCrd(const Json& crd) {
  const Json& spec = crd.at("spec");
  const std::string group = spec.at("group").get<std::string>();
  const std::string plural = spec.at("names").at("plural").get<std::string>();
  std::lock_guard lock(mutex_);
  std::erase_if(types_, [&](const ResourceTypePtr& t) {
    return t->custom && t->group == group && t->resource == plural;
  });
}

}  // namespace geo::testapi
