#pragma once
// Internals of TestApiServer shared by its translation units (HTTP routing,
// discovery, resource verbs, watch, tables). Not for tests to include.

#include <httplib.h>

#include <atomic>
#include <optional>
#include <string>
#include <thread>

#include "tests/support/api_error.h"
#include "tests/support/test_apiserver.h"
#include "tests/support/tls.h"

namespace geo::testapi {

// How a response body is rendered, from the Accept header.
struct Rendering {
  enum class Form { kObject, kTable, kPartialMetadata };
  Form form = Form::kObject;
  std::string version = "v1";  // meta.k8s.io version of Table / PartialObjectMetadata
};

// One resource request, after routing.
struct Target {
  ResourceTypePtr type;
  std::string ns;  // "" for cluster-scoped or all-namespaces requests
  std::string name;
  std::string subresource;
};

struct TestApiServer::Impl {
  explicit Impl(ServerOptions opts);

  // Every request: compression (see test_apiserver.cc) around dispatch().
  void handle(const httplib::Request& req, httplib::Response& res);
  // Authentication, fault injection, then the endpoint.
  void dispatch(const httplib::Request& req, httplib::Response& res);
  // /api..., /apis...: discovery or a resource request.
  void route(const httplib::Request& req, httplib::Response& res);
  void serveResource(const httplib::Request& req, httplib::Response& res, const Target& target);
  void serveWatch(const httplib::Request& req, httplib::Response& res, const Target& target);
  void serveOpenApi(const httplib::Request& req, httplib::Response& res);
  // pods/{id}/proxy[/path] (proxy.cc): forwards to the pod's status.podIP.
  // `consumedSegments`: how many path segments, up to and including
  // "proxy", come before the path to forward.
  void serveProxy(const httplib::Request& req, httplib::Response& res, const Target& target,
                  size_t consumedSegments);

  ServerOptions options;
  ResourceRegistry registry;
  ObjectStore store;
  FaultInjector faults;
  std::optional<TlsMaterial> tls;
  std::unique_ptr<httplib::Server> http;
  std::thread listener;
  std::atomic<bool> stopping{false};
  std::atomic<int64_t> bookmarkIntervalMs;
  int port = 0;
};

void sendJson(httplib::Response& res, int code, const Json& body);
void sendError(httplib::Response& res, const ApiError& error);
// Throws 406 when nothing acceptable is offered.
Rendering negotiate(const std::string& accept);
// The discovery documents (legacy form): nullopt if `path` is none of them.
std::optional<Json> discoveryDocument(const ResourceRegistry& registry, const std::string& path);
// A meta.k8s.io Table of `objects` with the type's columns.
Json toTable(const ResourceType& type, const Json& objects, const Json& listMeta,
             const std::string& tableVersion, const std::string& includeObject);
Json toPartialMetadata(const Json& object, const std::string& version);
// JSON from a YAML document (apply-patch+yaml and application/yaml bodies).
Json yamlToJson(const std::string& text);

}  // namespace geo::testapi
