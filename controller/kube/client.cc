#include "controller/kube/client.h"

#include <algorithm>
#include <cctype>

#include <fmt/format.h>

#include "controller/kube/watch.h"

namespace geo::kube {
namespace {

using nlohmann::json;

ApiError badCall(std::string message) {
  return localError(StatusCode::kInvalidArgument, std::move(message));
}

// Namespaced resources need a namespace for single objects and creates.
std::optional<ApiError> checkNamespace(const ResourceRef& resource, std::string_view ns) {
  if (resource.namespaced && ns.empty()) {
    return badCall(fmt::format("{} is namespaced: a namespace is required", resource.resource));
  }
  return std::nullopt;
}

ApiRequest makeRequest(std::string method, std::string path, bool idempotent,
                       std::string contentType = {}, std::string body = {}) {
  ApiRequest request;
  request.method = std::move(method);
  request.path = std::move(path);
  request.idempotent = idempotent;
  request.contentType = std::move(contentType);
  request.body = std::move(body);
  return request;
}

void addWriteQuery(ApiRequest& request, const std::string& fieldManager, bool dryRun) {
  if (!fieldManager.empty()) request.query.emplace_back("fieldManager", fieldManager);
  if (dryRun) request.query.emplace_back("dryRun", "All");
}

std::string_view patchContentType(PatchType type) {
  switch (type) {
    case PatchType::kMerge: return "application/merge-patch+json";
    case PatchType::kJson: return "application/json-patch+json";
    case PatchType::kStrategicMerge: return "application/strategic-merge-patch+json";
    case PatchType::kApply: return "application/apply-patch+yaml";
  }
  return "application/merge-patch+json";
}

std::string_view propagationName(PropagationPolicy policy) {
  switch (policy) {
    case PropagationPolicy::kOrphan: return "Orphan";
    case PropagationPolicy::kBackground: return "Background";
    case PropagationPolicy::kForeground: return "Foreground";
  }
  return "Background";
}

}  // namespace

std::string ResourceRef::basePath() const {
  return group.empty() ? fmt::format("/api/{}", version)
                       : fmt::format("/apis/{}/{}", group, version);
}

std::string percentEncode(std::string_view text) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (std::isalnum(byte) != 0 || c == '-' || c == '.' || c == '_' || c == '~') {
      out.push_back(c);
    } else {
      out.push_back('%');
      out.push_back(kHex[byte >> 4]);
      out.push_back(kHex[byte & 0xF]);
    }
  }
  return out;
}

std::string ApiRequest::target() const {
  std::string out = path;
  char separator = '?';
  for (const auto& [key, value] : query) {
    out += separator;
    out += percentEncode(key);
    out += '=';
    out += percentEncode(value);
    separator = '&';
  }
  return out;
}

std::string metadataField(const json& object, std::string_view field) {
  if (!object.is_object()) return "";
  const auto metadata = object.find("metadata");
  if (metadata == object.end() || !metadata->is_object()) return "";
  const auto value = metadata->find(field);
  if (value == metadata->end() || !value->is_string()) return "";
  return value->get<std::string>();
}

std::string collectionPath(const ResourceRef& resource, std::string_view ns) {
  if (resource.namespaced && !ns.empty()) {
    return fmt::format("{}/namespaces/{}/{}", resource.basePath(), percentEncode(ns),
                       resource.resource);
  }
  return fmt::format("{}/{}", resource.basePath(), resource.resource);
}

std::string objectPath(const ResourceRef& resource, std::string_view ns, std::string_view name,
                       std::string_view subresource) {
  std::string path = fmt::format("{}/{}", collectionPath(resource, ns), percentEncode(name));
  if (!subresource.empty()) path += fmt::format("/{}", subresource);
  return path;
}

std::optional<std::chrono::milliseconds> retryDelay(const ApiError& error, bool idempotent,
                                                    const ClientOptions& options,
                                                    Backoff& backoff) {
  if (backoff.attempts() >= options.maxRetries) return std::nullopt;
  if (error.isTooManyRequests()) {
    // The server did not act on the request, so any verb may repeat it.
    const auto wait = backoff.next();
    if (!error.retryAfter) return wait;
    return std::chrono::duration_cast<std::chrono::milliseconds>(
        std::min(*error.retryAfter, options.maxRetryAfter));
  }
  const bool notSent = error.isTransport() && error.code == StatusCode::kUnavailable;
  // Not a timeout: a server silent for a whole attempt is partitioned or
  // hung, and each retry waited as long again (six attempts of 30 s held a
  // pass, and every other region of it, for three minutes). The next pass
  // tries again.
  const bool mayRepeat =
      idempotent &&
      ((error.isTransport() && error.code == StatusCode::kUnknown) || error.isServerError());
  if (!notSent && !mayRepeat) return std::nullopt;
  if (error.retryAfter) {
    backoff.next();  // counts the attempt
    return std::chrono::duration_cast<std::chrono::milliseconds>(
        std::min(*error.retryAfter, options.maxRetryAfter));
  }
  return backoff.next();
}

ApiResult<json> KubeClient::get(const ResourceRef& resource, std::string_view ns,
                                std::string_view name, const GetOptions& options) {
  if (auto error = checkNamespace(resource, ns)) return *error;
  ApiRequest request =
      makeRequest("GET", objectPath(resource, ns, name, options.subresource), true);
  return call(request, nullptr);
}

ApiResult<ListPage> KubeClient::list(const ResourceRef& resource, std::string_view ns,
                                     const ListOptions& options) {
  ApiRequest request = makeRequest("GET", collectionPath(resource, ns), true);
  auto& query = request.query;
  if (!options.labelSelector.empty()) query.emplace_back("labelSelector", options.labelSelector);
  if (!options.fieldSelector.empty()) query.emplace_back("fieldSelector", options.fieldSelector);
  if (options.limit > 0) query.emplace_back("limit", std::to_string(options.limit));
  if (!options.continueToken.empty()) query.emplace_back("continue", options.continueToken);
  if (!options.resourceVersion.empty()) {
    query.emplace_back("resourceVersion", options.resourceVersion);
  }
  if (!options.resourceVersionMatch.empty()) {
    query.emplace_back("resourceVersionMatch", options.resourceVersionMatch);
  }
  auto answer = call(request, nullptr);
  if (!answer.ok()) return answer.error();
  json& body = *answer;
  const auto items = body.find("items");
  if (!body.is_object() || items == body.end() || !(items->is_array() || items->is_null())) {
    return localError(StatusCode::kDataLoss,
                      fmt::format("GET {}: the answer is not a list", request.path));
  }
  ListPage page;
  if (items->is_array()) {
    page.items.reserve(items->size());
    for (json& item : *items) page.items.push_back(std::move(item));
  }
  page.resourceVersion = metadataField(body, "resourceVersion");
  page.continueToken = metadataField(body, "continue");
  return page;
}

ApiResult<json> KubeClient::create(const ResourceRef& resource, std::string_view ns,
                                   const json& object, const WriteOptions& options) {
  if (auto error = checkNamespace(resource, ns)) return *error;
  ApiRequest request =
      makeRequest("POST", collectionPath(resource, ns), false, "application/json", object.dump());
  addWriteQuery(request,
                options.fieldManager.empty() ? this->options().fieldManager : options.fieldManager,
                options.dryRun);
  return call(request, nullptr);
}

ApiResult<json> KubeClient::update(const ResourceRef& resource, std::string_view ns,
                                   const json& object, const WriteOptions& options) {
  if (auto error = checkNamespace(resource, ns)) return *error;
  const std::string name = metadataField(object, "name");
  if (name.empty()) return badCall("update: metadata.name is required");
  if (metadataField(object, "resourceVersion").empty()) {
    return badCall(
        fmt::format("update of {} \"{}\": metadata.resourceVersion is required (the write is "
                    "conditional on it)",
                    resource.resource, name));
  }
  ApiRequest request = makeRequest("PUT", objectPath(resource, ns, name, options.subresource), true,
                                   "application/json", object.dump());
  addWriteQuery(request,
                options.fieldManager.empty() ? this->options().fieldManager : options.fieldManager,
                options.dryRun);
  return call(request, nullptr);
}

ApiResult<json> KubeClient::updateStatus(const ResourceRef& resource, std::string_view ns,
                                         const json& object) {
  WriteOptions options;
  options.subresource = "status";
  return update(resource, ns, object, options);
}

ApiResult<json> KubeClient::remove(const ResourceRef& resource, std::string_view ns,
                                   std::string_view name, const DeleteOptions& options) {
  if (auto error = checkNamespace(resource, ns)) return *error;
  json body = {{"kind", "DeleteOptions"}, {"apiVersion", "v1"}};
  if (options.propagationPolicy) {
    body["propagationPolicy"] = propagationName(*options.propagationPolicy);
  }
  if (options.gracePeriodSeconds) body["gracePeriodSeconds"] = *options.gracePeriodSeconds;
  if (!options.preconditionUid.empty()) body["preconditions"]["uid"] = options.preconditionUid;
  if (!options.preconditionResourceVersion.empty()) {
    body["preconditions"]["resourceVersion"] = options.preconditionResourceVersion;
  }
  if (options.dryRun) body["dryRun"] = json::array({"All"});
  ApiRequest request =
      makeRequest("DELETE", objectPath(resource, ns, name), true, "application/json", body.dump());
  return call(request, nullptr);
}

ApiResult<json> KubeClient::patch(const ResourceRef& resource, std::string_view ns,
                                  std::string_view name, PatchType type, const json& patch,
                                  const PatchOptions& options) {
  if (auto error = checkNamespace(resource, ns)) return *error;
  if (type == PatchType::kJson && !patch.is_array()) {
    return badCall("a JSON patch must be an array of operations");
  }
  if (type != PatchType::kJson && !patch.is_object()) {
    return badCall("a merge, strategic-merge or apply patch must be an object");
  }
  const std::string& manager =
      options.fieldManager.empty() ? this->options().fieldManager : options.fieldManager;
  if (type == PatchType::kApply && manager.empty()) {
    return badCall("server-side apply needs a fieldManager");
  }
  // Applying the same intent twice has the effect of applying it once.
  ApiRequest request =
      makeRequest("PATCH", objectPath(resource, ns, name, options.subresource),
                  type == PatchType::kApply, std::string(patchContentType(type)), patch.dump());
  addWriteQuery(request, manager, options.dryRun);
  if (type == PatchType::kApply && options.force) request.query.emplace_back("force", "true");
  return call(request, nullptr);
}

ApiResult<json> KubeClient::apply(const ResourceRef& resource, std::string_view ns,
                                  const json& object, const PatchOptions& options) {
  const std::string name = metadataField(object, "name");
  if (name.empty()) return badCall("apply: metadata.name is required");
  if (!object.contains("apiVersion") || !object.contains("kind")) {
    return badCall(fmt::format("apply of \"{}\": apiVersion and kind are required", name));
  }
  return patch(resource, ns, name, PatchType::kApply, object, options);
}

ApiResult<std::monostate> KubeClient::watchOnce(const ResourceRef& resource, std::string_view ns,
                                                const WatchOptions& options,
                                                const std::function<void(WatchEvent&&)>& onEvent,
                                                const CancelToken& cancel) {
  ApiRequest request = makeRequest("GET", collectionPath(resource, ns), true);
  auto& query = request.query;
  query.emplace_back("watch", "1");
  if (!options.resourceVersion.empty()) {
    query.emplace_back("resourceVersion", options.resourceVersion);
  }
  if (options.allowBookmarks) query.emplace_back("allowWatchBookmarks", "true");
  query.emplace_back("timeoutSeconds", std::to_string(options.timeout.count()));
  if (!options.labelSelector.empty()) query.emplace_back("labelSelector", options.labelSelector);
  if (!options.fieldSelector.empty()) query.emplace_back("fieldSelector", options.fieldSelector);

  LineSplitter splitter;
  std::optional<ApiError> failure;  // the first bad line or ERROR event ends the stream
  CancelToken stop;                 // cancelled by `cancel` or by a failure
  const CancelToken::Subscription forward(cancel, [&stop] { stop.cancel(); });
  const auto onLine = [&](std::string_view line) {
    if (failure) return;
    auto event = parseWatchEvent(line);
    if (!event.ok()) {
      failure = event.error();
    } else if (event->type == WatchEventType::kError) {
      failure = decodeApiError(event->object.value("code", 0), event->object.dump());
    } else {
      onEvent(std::move(*event));
    }
    if (failure) stop.cancel();
  };
  // The server's timeout plus slack, so a dead connection cannot hang forever.
  const auto limit = std::chrono::duration_cast<std::chrono::milliseconds>(
      options.timeout + std::chrono::seconds(30));
  auto result = stream(
      request,
      [&](std::string_view chunk) {
        if (!splitter.feed(chunk, onLine) && !failure) {
          failure = localError(StatusCode::kDataLoss, "watch event larger than the line limit");
          stop.cancel();
        }
      },
      limit, stop);
  if (failure) return *failure;
  if (!result.ok()) return result.error();
  if (splitter.buffered() > 0) {
    return localError(StatusCode::kUnknown, "watch stream ended inside an event");
  }
  return std::monostate{};
}

ApiResult<ListResult> listAll(KubeClient& client, const ResourceRef& resource, std::string_view ns,
                              ListOptions options) {
  if (options.limit <= 0) options.limit = 500;
  options.continueToken.clear();
  ListResult result;
  while (true) {
    auto page = client.list(resource, ns, options);
    if (!page.ok()) return page.error();
    for (auto& item : page->items) result.items.push_back(std::move(item));
    // Every page carries the version of the snapshot the first page started.
    result.resourceVersion = page->resourceVersion;
    if (page->continueToken.empty()) return result;
    options.continueToken = std::move(page->continueToken);
    // A continued list must not repeat the version selection of the first.
    options.resourceVersion.clear();
    options.resourceVersionMatch.clear();
  }
}

}  // namespace geo::kube
