// Discovery (legacy form), content negotiation, OpenAPI and YAML decoding.

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <map>
#include <regex>

#include "tests/support/server_impl.h"
#include "tests/support/yaml_json.h"

namespace geo::testapi {

namespace {

struct MediaRange {
  std::string type;
  std::map<std::string, std::string> params;
};

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t") - b + 1);
}

std::vector<MediaRange> parseAccept(const std::string& accept) {
  std::vector<MediaRange> out;
  size_t pos = 0;
  while (pos <= accept.size()) {
    size_t comma = accept.find(',', pos);
    if (comma == std::string::npos) comma = accept.size();
    const std::string item = accept.substr(pos, comma - pos);
    MediaRange range;
    size_t p = 0;
    bool first = true;
    while (p <= item.size()) {
      size_t semi = item.find(';', p);
      if (semi == std::string::npos) semi = item.size();
      const std::string piece = trim(item.substr(p, semi - p));
      if (first) {
        range.type = piece;
        first = false;
      } else if (const size_t eq = piece.find('='); eq != std::string::npos) {
        range.params[trim(piece.substr(0, eq))] = trim(piece.substr(eq + 1));
      }
      p = semi + 1;
    }
    if (!range.type.empty()) out.push_back(std::move(range));
    pos = comma + 1;
  }
  return out;
}

bool jsonCompatible(const std::string& type) {
  return type == "application/json" || type == "*/*" || type == "application/*";
}

// Kubernetes version priority: GA before beta before alpha, higher first.
int versionRank(const std::string& v, int* number, int* minor) {
  std::smatch m;
  static const std::regex kRe(R"(v(\d+)(?:(alpha|beta)(\d+))?)");
  if (!std::regex_match(v, m, kRe)) return 0;
  *number = std::stoi(m[1]);
  *minor = m[3].matched ? std::stoi(m[3]) : 0;
  return !m[2].matched ? 3 : m[2] == "beta" ? 2 : 1;
}

bool versionBefore(const std::string& a, const std::string& b) {
  int an = 0, am = 0, bn = 0, bm = 0;
  const int ar = versionRank(a, &an, &am);
  const int br = versionRank(b, &bn, &bm);
  if (ar != br) return ar > br;
  if (an != bn) return an > bn;
  if (am != bm) return am > bm;
  return a < b;
}

Json resourceList(const ResourceRegistry& registry, const std::string& group,
                  const std::string& version) {
  Json resources = Json::array();
  for (const auto& t : registry.all()) {
    if (t->group != group || t->version != version) continue;
    Json r = {
        {"name", t->resource},
        {"singularName", t->singular},
        {"namespaced", t->namespaced},
        {"kind", t->kind},
        {"verbs",
         {"create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"}}};
    if (!t->shortNames.empty()) r["shortNames"] = t->shortNames;
    if (!t->categories.empty()) r["categories"] = t->categories;
    resources.push_back(std::move(r));
    if (t->statusSubresource) {
      resources.push_back({{"name", t->resource + "/status"},
                           {"singularName", ""},
                           {"namespaced", t->namespaced},
                           {"kind", t->kind},
                           {"verbs", {"get", "patch", "update"}}});
    }
  }
  if (resources.empty()) return Json();
  return {{"kind", "APIResourceList"},
          {"apiVersion", "v1"},
          {"groupVersion", group.empty() ? version : group + "/" + version},
          {"resources", resources}};
}

Json groupDocument(const std::string& name, std::vector<std::string> versions) {
  std::sort(versions.begin(), versions.end(), versionBefore);
  Json list = Json::array();
  for (const auto& v : versions) list.push_back({{"groupVersion", name + "/" + v}, {"version", v}});
  return {{"name", name}, {"versions", list}, {"preferredVersion", list.front()}};
}

std::map<std::string, std::vector<std::string>> groupsOf(const ResourceRegistry& registry) {
  std::map<std::string, std::vector<std::string>> groups;
  std::vector<std::string> order;
  for (const auto& t : registry.all()) {
    if (t->group.empty()) continue;
    auto& versions = groups[t->group];
    if (std::find(versions.begin(), versions.end(), t->version) == versions.end()) {
      versions.push_back(t->version);
    }
  }
  return groups;
}

}  // namespace

Rendering negotiate(const std::string& accept) {
  if (trim(accept).empty()) return {};
  for (const auto& range : parseAccept(accept)) {
    if (!jsonCompatible(range.type)) continue;
    auto as = range.params.find("as");
    if (as == range.params.end()) return {};
    const std::string g = range.params.count("g") ? range.params.at("g") : "";
    const std::string v = range.params.count("v") ? range.params.at("v") : "";
    if (g != "meta.k8s.io" || (v != "v1" && v != "v1beta1")) continue;
    if (as->second == "Table") return {Rendering::Form::kTable, v};
    if (as->second == "PartialObjectMetadata" || as->second == "PartialObjectMetadataList") {
      return {Rendering::Form::kPartialMetadata, v};
    }
  }
  throw ApiError(406, "NotAcceptable",
                 "only the following media types are accepted: application/json");
}

std::optional<Json> discoveryDocument(const ResourceRegistry& registry, const std::string& path) {
  if (path == "/api" || path == "/api/") {
    return Json{{"kind", "APIVersions"},
                {"versions", {"v1"}},
                {"serverAddressByClientCIDRs",
                 {{{"clientCIDR", "0.0.0.0/0"}, {"serverAddress", "127.0.0.1"}}}}};
  }
  if (path == "/api/v1") return resourceList(registry, "", "v1");
  const auto groups = groupsOf(registry);
  if (path == "/apis" || path == "/apis/") {
    Json list = Json::array();
    for (const auto& [name, versions] : groups) list.push_back(groupDocument(name, versions));
    return Json{{"kind", "APIGroupList"}, {"apiVersion", "v1"}, {"groups", list}};
  }
  std::smatch m;
  static const std::regex kGroup(R"(/apis/([^/]+)/?)");
  static const std::regex kGroupVersion(R"(/apis/([^/]+)/([^/]+)/?)");
  if (std::regex_match(path, m, kGroup)) {
    auto it = groups.find(m[1]);
    if (it == groups.end()) return std::nullopt;
    Json doc = groupDocument(it->first, it->second);
    doc["kind"] = "APIGroup";
    doc["apiVersion"] = "v1";
    return doc;
  }
  if (std::regex_match(path, m, kGroupVersion)) {
    Json doc = resourceList(registry, m[1], m[2]);
    if (doc.is_null()) return std::nullopt;
    return doc;
  }
  return std::nullopt;
}

namespace {

// An OpenAPI v3 document for one group/version with only what clients read
// from it: one PATCH operation per resource, tagged with its GVK and listing
// the query parameters the server honours (kubectl and helm look for
// fieldValidation there to decide on server-side validation). There are no
// schemas: clients fall back to their compiled-in types for strategic merge
// patches.
Json openApiGroupVersion(const ResourceRegistry& registry, const std::string& group,
                         const std::string& version) {
  Json paths = Json::object();
  for (const auto& t : registry.all()) {
    if (t->group != group || t->version != version) continue;
    const std::string prefix = group.empty() ? "/api/" + version : "/apis/" + group + "/" + version;
    const std::string path =
        prefix + (t->namespaced ? "/namespaces/{namespace}/" : "/") + t->resource + "/{name}";
    Json params = Json::array();
    for (const char* p : {"dryRun", "fieldManager", "fieldValidation", "force"}) {
      params.push_back({{"name", p}, {"in", "query"}, {"schema", {{"type", "string"}}}});
    }
    paths[path] = {{"patch",
                    {{"operationId", "patch" + t->kind},
                     {"parameters", params},
                     {"responses", {{"200", {{"description", "OK"}}}}},
                     {"x-kubernetes-action", "patch"},
                     {"x-kubernetes-group-version-kind",
                      {{"group", group}, {"version", version}, {"kind", t->kind}}}}}};
  }
  if (paths.empty()) return Json();
  return {{"openapi", "3.0.0"},
          {"info", {{"title", "Kubernetes"}, {"version", "v1.33.0"}}},
          {"paths", paths},
          {"components", {{"schemas", Json::object()}}}};
}

}  // namespace

void TestApiServer::Impl::serveOpenApi(const httplib::Request& req, httplib::Response& res) {
  // OpenAPI v2: a document without definitions. kubectl falls back to it
  // to validate kinds the v3 root it cached does not list (a CRD created by
  // the same `kubectl apply`); with no schema for a kind it skips client-side
  // validation, as it does for a real server's schema-less kinds. The empty
  // protobuf message is the empty Document.
  if (req.path == "/openapi/v2") {
    const std::string accept = req.get_header_value("Accept");
    if (accept.find("protobuf") != std::string::npos) {
      res.set_content("", "application/com.github.proto-openapi.spec.v2.v1.0+protobuf");
      return;
    }
    sendJson(res, 200,
             {{"swagger", "2.0"},
              {"info", {{"title", "Kubernetes"}, {"version", "v1.33.0"}}},
              {"paths", Json::object()},
              {"definitions", Json::object()}});
    return;
  }
  const std::string v3 = "/openapi/v3";
  if (!req.path.starts_with(v3)) {
    throw ApiError(404, "NotFound", "the server could not find the requested resource");
  }
  std::map<std::string, std::pair<std::string, std::string>> gvs;
  for (const auto& t : registry.all()) {
    gvs[t->group.empty() ? "api/" + t->version : "apis/" + t->group + "/" + t->version] = {
        t->group, t->version};
  }
  if (req.path == v3 || req.path == v3 + "/") {
    Json paths = Json::object();
    for (const auto& [key, gv] : gvs) {
      const std::string hash = fmt::format(
          "{:016X}",
          std::hash<std::string>{}(openApiGroupVersion(registry, gv.first, gv.second).dump()));
      paths[key] = {{"serverRelativeURL", v3 + "/" + key + "?hash=" + hash}};
    }
    sendJson(res, 200, {{"paths", paths}});
    return;
  }
  auto it = gvs.find(req.path.substr(v3.size() + 1));
  if (it == gvs.end()) {
    throw ApiError(404, "NotFound", "the server could not find the requested resource");
  }
  sendJson(res, 200, openApiGroupVersion(registry, it->second.first, it->second.second));
}

Json yamlToJson(const std::string& text) {
  try {
    return yamlNodeToJson(YAML::Load(text));
  } catch (const YAML::Exception& e) {
    throw badRequest(fmt::format("error converting YAML to JSON: {}", e.what()));
  }
}

}  // namespace geo::testapi
