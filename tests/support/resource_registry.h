#pragma once
// The kinds of resource a test apiserver serves.
//
// A ResourceType says how one group/version/resource is addressed and stored:
// scope, subresources, names for discovery, and which lists merge by key
// (strategic merge patch and server-side apply need it). Built-in kinds are
// registered at construction; applying a CustomResourceDefinition registers
// its served versions and deleting it removes them. Thread-safe: lookups
// return immutable snapshots, so a CRD change never invalidates one in use.

#include <nlohmann/json.hpp>

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace geo::testapi {

using Json = nlohmann::json;

// How a list merges: atomic lists are replaced whole; map lists merge items
// by `keys`; set lists hold unique scalars.
struct ListInfo {
  enum class Type { kAtomic, kMap, kSet };
  Type type = Type::kAtomic;
  std::vector<std::string> keys;
};

// A CRD's additionalPrinterColumns entry.
struct PrinterColumn {
  std::string name;
  std::string type;
  std::string format;
  std::string description;
  std::string jsonPath;
  int priority = 0;
};

struct ResourceType {
  std::string group;  // "" for the core group
  std::string version;
  std::string resource;  // plural, lower case
  std::string singular;
  std::string kind;
  bool namespaced = true;
  bool statusSubresource = false;
  // From a CRD: the real server answers strategic merge patch with 415 for
  // custom resources, and lists merge only as the schema declares.
  bool custom = false;
  std::vector<std::string> shortNames;
  std::vector<std::string> categories;
  std::vector<PrinterColumn> printerColumns;
  // Dotted field path (list items add no segment) -> list type, from a
  // CRD's x-kubernetes-list-type / x-kubernetes-list-map-keys.
  std::map<std::string, ListInfo> listTypes;

  std::string apiVersion() const { return group.empty() ? version : group + "/" + version; }
  // Storage identity, shared by every version of a resource.
  std::string storageKey() const { return group + "/" + resource; }
  // How the list at `path` (field names from the object root) merges.
  ListInfo listInfo(const std::vector<std::string>& path) const;
};

using ResourceTypePtr = std::shared_ptr<const ResourceType>;

class ResourceRegistry {
 public:
  // Registers the built-in kinds (core v1, apps/v1, batch/v1, coordination,
  // events, rbac, apiextensions).
  ResourceRegistry();

  // nullptr when the group/version does not serve `resource`.
  ResourceTypePtr find(std::string_view group, std::string_view version,
                       std::string_view resource) const;
  // The served type for `apiVersion` + `kind`; nullptr if none.
  ResourceTypePtr findKind(std::string_view apiVersion, std::string_view kind) const;
  // Every served type, in registration order.
  std::vector<ResourceTypePtr> all() const;

  // Registers (or re-registers) the served versions of a CRD object. The
  // caller has validated it (see validateCrd).
  void applyCrd(const Json& crd);
  // Removes what applyCrd(crd) registered.
  void removeCrd(const Json& crd);

  // Field errors ({reason, message, field}) of a CRD object; empty if valid.
  static Json validateCrd(const Json& crd);

 private:
  void addLocked(ResourceType type);

  mutable std::mutex mutex_;
  std::vector<ResourceTypePtr> types_;
};

}  // namespace geo::testapi
