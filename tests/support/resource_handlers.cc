// The resource verbs: get, list, create, update, patch, delete,
// deletecollection (watch is in watch.cc).

#include <fmt/format.h>

#include "tests/support/managed_fields.h"
#include "tests/support/patch.h"
#include "tests/support/protobuf.h"
#include "tests/support/server_impl.h"

namespace geo::testapi {

namespace {

std::string param(const httplib::Request& req, const char* name) {
  return req.has_param(name) ? req.get_param_value(name) : "";
}

std::string mediaType(const httplib::Request& req) {
  std::string ct = req.get_header_value("Content-Type");
  const size_t semi = ct.find(';');
  if (semi != std::string::npos) ct = ct.substr(0, semi);
  while (!ct.empty() && ct.back() == ' ') ct.pop_back();
  return ct;
}

ApiError unsupportedMediaType(const std::string& type) {
  return ApiError(415, "UnsupportedMediaType",
                  fmt::format("the body of the request was in an unknown format - accepted media "
                              "types include: application/json, application/yaml (got \"{}\")",
                              type));
}

Json decodeBody(const httplib::Request& req) {
  const std::string type = mediaType(req);
  if (type == "application/yaml") return yamlToJson(req.body);
  if (type == "application/vnd.kubernetes.protobuf") return decodeKubernetesProtobuf(req.body);
  if (type != "application/json" && !type.empty()) throw unsupportedMediaType(type);
  try {
    return Json::parse(req.body);
  } catch (const Json::parse_error& e) {
    throw badRequest(fmt::format("error decoding request body: {}", e.what()));
  }
}

// The field manager of a write: the fieldManager parameter, else the
// User-Agent's product name, as the real server derives it.
std::string fieldManager(const httplib::Request& req) {
  std::string manager = param(req, "fieldManager");
  if (!manager.empty()) return manager;
  manager = req.get_header_value("User-Agent");
  const size_t slash = manager.find('/');
  if (slash != std::string::npos) manager = manager.substr(0, slash);
  return manager.empty() ? "unknown" : manager;
}

bool dryRun(const httplib::Request& req) {
  if (!req.has_param("dryRun")) return false;
  const std::string v = param(req, "dryRun");
  if (v != "All") throw badRequest(fmt::format("Invalid dry run value: {}", v));
  return true;
}

ListOptions listOptions(const httplib::Request& req, const ResourceType& type) {
  ListOptions o;
  o.labels = LabelSelector::parse(param(req, "labelSelector"));
  if (req.has_param("fieldSelector") && !param(req, "fieldSelector").empty()) {
    o.fields = FieldSelector::parse(param(req, "fieldSelector"), type.kind);
  }
  if (req.has_param("limit")) {
    try {
      o.limit = std::stoll(param(req, "limit"));
    } catch (const std::exception&) {
      throw badRequest("invalid limit");
    }
  }
  o.continueToken = param(req, "continue");
  return o;
}

DeleteOptions deleteOptions(const httplib::Request& req) {
  DeleteOptions o;
  Json body = Json::object();
  if (!req.body.empty()) body = decodeBody(req);
  o.propagationPolicy = body.value("propagationPolicy", param(req, "propagationPolicy"));
  const std::string orphan = body.contains("orphanDependents") ? body["orphanDependents"].dump()
                                                               : param(req, "orphanDependents");
  if (o.propagationPolicy.empty() && orphan == "true") o.propagationPolicy = "Orphan";
  if (o.propagationPolicy.empty() && orphan == "false") o.propagationPolicy = "Background";
  if (body.contains("preconditions")) {
    const Json& p = body["preconditions"];
    if (p.contains("uid") && p["uid"].is_string()) o.preconditionUid = p["uid"].get<std::string>();
    if (p.contains("resourceVersion") && p["resourceVersion"].is_string()) {
      o.preconditionResourceVersion = p["resourceVersion"].get<std::string>();
    }
  }
  o.dryRun = dryRun(req);
  if (body.contains("dryRun")) {
    for (const auto& v : body["dryRun"]) {
      if (v != "All") throw badRequest(fmt::format("Invalid dry run value: {}", v.dump()));
      o.dryRun = true;
    }
  }
  return o;
}

Json render(const Json& object, const ResourceType& type, const Rendering& rendering,
            const httplib::Request& req) {
  switch (rendering.form) {
    case Rendering::Form::kObject: return object;
    case Rendering::Form::kPartialMetadata: return toPartialMetadata(object, rendering.version);
    case Rendering::Form::kTable:
      return toTable(type, Json::array({object}),
                     {{"resourceVersion", object["metadata"].value("resourceVersion", "")}},
                     rendering.version, param(req, "includeObject"));
  }
  return object;
}

Json renderList(const Json& list, const ResourceType& type, const Rendering& rendering,
                const httplib::Request& req) {
  switch (rendering.form) {
    case Rendering::Form::kObject: return list;
    case Rendering::Form::kPartialMetadata: {
      Json items = Json::array();
      for (const auto& o : list["items"]) items.push_back(toPartialMetadata(o, rendering.version));
      return {{"kind", "PartialObjectMetadataList"},
              {"apiVersion", "meta.k8s.io/" + rendering.version},
              {"metadata", list["metadata"]},
              {"items", items}};
    }
    case Rendering::Form::kTable:
      return toTable(type, list["items"], list["metadata"], rendering.version,
                     param(req, "includeObject"));
  }
  return list;
}

}  // namespace

void TestApiServer::Impl::serveResource(const httplib::Request& req, httplib::Response& res,
                                        const Target& target) {
  const ResourceType& type = *target.type;
  const std::string& method = req.method;
  const Rendering rendering = negotiate(req.get_header_value("Accept"));
  if (type.namespaced && target.ns.empty() && !target.name.empty()) {
    throw ApiError(404, "NotFound", "the server could not find the requested resource");
  }
  const std::string& ns = target.ns;
  const std::string& name = target.name;
  WriteContext ctx{fieldManager(req), target.subresource, false};
  auto checkStorm = [&] {
    if (faults.takeConflict(type.resource, ns, name)) {
      throw conflict(type.group, type.resource, name,
                     "the object has been modified; please apply your changes to the latest "
                     "version and try again");
    }
  };

  if (method == "GET") {
    const std::string watch = param(req, "watch");
    if ((watch == "1" || watch == "true") && target.subresource.empty()) {
      serveWatch(req, res, target);
      return;
    }
    if (name.empty()) {
      sendJson(res, 200,
               renderList(store.list(type, ns, listOptions(req, type)), type, rendering, req));
      return;
    }
    sendJson(res, 200, render(store.get(type, ns, name), type, rendering, req));
    return;
  }
  if (method == "POST") {
    if (!name.empty()) throw methodNotSupported(type.group, type.resource, "create");
    if (type.namespaced && ns.empty())
      throw methodNotSupported(type.group, type.resource, "create");
    ctx.dryRun = dryRun(req);
    sendJson(res, 201, render(store.create(type, ns, decodeBody(req), ctx), type, rendering, req));
    return;
  }
  if (method == "DELETE") {
    const DeleteOptions deleteOpts = deleteOptions(req);
    if (name.empty()) {
      sendJson(res, 200, store.removeCollection(type, ns, listOptions(req, type), deleteOpts));
      return;
    }
    checkStorm();
    sendJson(res, 200, store.remove(type, ns, name, deleteOpts));
    return;
  }
  if (name.empty()) {
    throw methodNotSupported(type.group, type.resource, method == "PUT" ? "update" : "patch");
  }
  ctx.dryRun = dryRun(req);
  if (method == "PUT") {
    checkStorm();
    sendJson(res, 200,
             render(store.update(type, ns, name, decodeBody(req), ctx), type, rendering, req));
    return;
  }
  // PATCH
  checkStorm();
  const std::string patchType = mediaType(req);
  bool created = false;
  Json out;
  if (patchType == "application/apply-patch+yaml") {
    if (!req.has_param("fieldManager") || param(req, "fieldManager").empty()) {
      throw badRequest(
          "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: "
          "is required for apply patch");
    }
    const std::string force = param(req, "force");
    Json applied = yamlToJson(req.body);
    if (!applied.is_object()) throw badRequest("apply patch must be a YAML or JSON object");
    if (applied.value("apiVersion", "") != type.apiVersion() ||
        applied.value("kind", "") != type.kind) {
      throw badRequest(fmt::format(
          "the API version in the data ({}) does not match the expected "
          "API version ({}) or kind ({})",
          applied.value("apiVersion", ""), type.apiVersion(), applied.value("kind", "")));
    }
    const std::string appliedName = applied["metadata"].value("name", "");
    if (appliedName != name) {
      throw badRequest(
          fmt::format("the name of the object ({}) does not match the name on the "
                      "URL ({})",
                      appliedName, name));
    }
    out = store.modify(
        type, ns, name, ctx,
        [&](const Json* current) {
          return serverSideApply(current, applied, type, ctx.manager, force == "true",
                                 target.subresource, nowRfc3339());
        },
        true, &created);
  } else {
    Json patch;
    try {
      patch = Json::parse(req.body);
    } catch (const Json::parse_error& e) {
      throw badRequest(fmt::format("error decoding patch: {}", e.what()));
    }
    out = store.modify(
        type, ns, name, ctx,
        [&](const Json* current) -> Json {
          if (patchType == "application/json-patch+json") return applyJsonPatch(*current, patch);
          if (patchType == "application/merge-patch+json") return applyMergePatch(*current, patch);
          if (patchType == "application/strategic-merge-patch+json") {
            return applyStrategicMergePatch(*current, patch, type);
          }
          throw ApiError(415, "UnsupportedMediaType",
                         fmt::format("the body of the request was in an unknown format - accepted "
                                     "media types include: application/json-patch+json, "
                                     "application/merge-patch+json, "
                                     "application/apply-patch+yaml (got \"{}\")",
                                     patchType));
        },
        false, &created);
  }
  sendJson(res, created ? 201 : 200, render(out, type, rendering, req));
}

}  // namespace geo::testapi
