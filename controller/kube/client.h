#pragma once
// KubeClient: the Kubernetes REST API of one cluster, for any
// group/version/resource, with objects as nlohmann::json.
//
// The interface has two virtual operations, call() (one request, one JSON
// answer) and stream() (a long-running GET read as chunks); the verbs (get,
// list, create, update, remove, patch, apply, watchOnce) are non-virtual and
// build the request: paths, query parameters, content types, preconditions.
// makeKubeClient() returns the libcurl implementation; tests substitute a
// recording implementation of the two virtuals.
//
// Ownership: a client owns its connections; the caller owns the client and
// must keep it alive while any call or stream on it runs.
// Threading: every member is thread-safe; calls run on the caller's thread and
// block (up to ClientOptions::timeout per attempt). Streams stop promptly when
// their CancelToken is cancelled.
// Errors: nothing throws for a failed request; every verb returns
// ApiResult<T> with an ApiError carrying the HTTP code and the Status reason.
// Retries (inside call()): 429 Too Many Requests for any verb after the
// server's Retry-After (bounded); 5xx answers and lost connections for
// idempotent requests (GET, PUT with a resourceVersion, DELETE, apply) with
// jittered exponential backoff; refused connections for any verb (nothing was
// sent); 401 Unauthorized once, for any verb, when the credentials came from
// an exec plugin (ClusterConfig::exec), after running it again. Never a
// request that timed out (no answer within ClientOptions::timeout): the
// cluster is partitioned or hung, and the caller's next pass tries again
// rather than this one waiting six times as long. After a lost
// answer, a retried DELETE may report NotFound and a
// retried PUT Conflict although the first attempt succeeded: both are what a
// level-based caller handles anyway (re-read and compare).

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "controller/kube/api_error.h"
#include "controller/kube/backoff.h"
#include "controller/kube/cancel.h"
#include "controller/kube/config.h"

namespace geo::kube {

// Which collection a call addresses. `group` is "" for the core API.
struct ResourceRef {
  std::string group;
  std::string version;
  std::string resource;  // lower-case plural: "configmaps", "trainingjobs"
  bool namespaced = true;

  // "v1", "batch/v1": the objects' apiVersion.
  std::string apiVersion() const { return group.empty() ? version : group + "/" + version; }
  // "/api/v1", "/apis/batch/v1".
  std::string basePath() const;
};

// The built-in resources the controller touches.
namespace resources {
inline const ResourceRef kNamespaces{"", "v1", "namespaces", false};
inline const ResourceRef kPods{"", "v1", "pods", true};
inline const ResourceRef kServices{"", "v1", "services", true};
inline const ResourceRef kConfigMaps{"", "v1", "configmaps", true};
inline const ResourceRef kSecrets{"", "v1", "secrets", true};
inline const ResourceRef kPersistentVolumeClaims{"", "v1", "persistentvolumeclaims", true};
inline const ResourceRef kEvents{"", "v1", "events", true};
inline const ResourceRef kEventsV1{"events.k8s.io", "v1", "events", true};
inline const ResourceRef kJobs{"batch", "v1", "jobs", true};
inline const ResourceRef kLeases{"coordination.k8s.io", "v1", "leases", true};
}  // namespace resources

// One HTTP request against the API server, as the verbs build it.
struct ApiRequest {
  std::string method;  // GET, POST, PUT, PATCH, DELETE
  std::string path;    // "/api/v1/namespaces/x/configmaps/y"
  std::vector<std::pair<std::string, std::string>> query;
  std::string contentType;  // of `body`; "" without a body
  std::string body;
  // Safe to repeat after a 5xx or a lost answer.
  bool idempotent = false;

  // path?k=v&... with keys and values percent-encoded.
  std::string target() const;
};

// Percent-encodes everything but RFC 3986 unreserved characters.
std::string percentEncode(std::string_view text);

struct GetOptions {
  std::string subresource;  // "status", "scale"; "" for the object
};

struct ListOptions {
  std::string labelSelector;  // "app=x,tier in (a,b)"
  std::string fieldSelector;  // "metadata.name=x"
  int64_t limit = 0;          // page size; 0: the server's choice (everything)
  std::string continueToken;  // from the previous page
  std::string resourceVersion;
  std::string resourceVersionMatch;  // "NotOlderThan", "Exact"
};

// One page of a list: the items, the list's resourceVersion (watch from it),
// and the token for the next page ("" on the last).
struct ListPage {
  std::vector<nlohmann::json> items;
  std::string resourceVersion;
  std::string continueToken;
};

struct WriteOptions {
  std::string subresource;   // "status" writes only the status
  std::string fieldManager;  // "": the client's ClientOptions::fieldManager
  bool dryRun = false;
};

enum class PropagationPolicy { kOrphan, kBackground, kForeground };

struct DeleteOptions {
  std::optional<PropagationPolicy> propagationPolicy;
  std::optional<int64_t> gracePeriodSeconds;
  // Preconditions: the server answers 409 Conflict unless they hold.
  std::string preconditionUid;
  std::string preconditionResourceVersion;
  bool dryRun = false;
};

enum class PatchType {
  kMerge,           // application/merge-patch+json (RFC 7386)
  kJson,            // application/json-patch+json (RFC 6902); the body is an array
  kStrategicMerge,  // application/strategic-merge-patch+json (built-in types only)
  kApply,           // application/apply-patch+yaml: server-side apply
};

struct PatchOptions {
  std::string subresource;
  std::string fieldManager;  // "": the client's; server-side apply needs one
  bool force = false;        // apply: take ownership of conflicting fields
  bool dryRun = false;
};

enum class WatchEventType { kAdded, kModified, kDeleted, kBookmark, kError };

struct WatchEvent {
  WatchEventType type = WatchEventType::kAdded;
  // The object; for kError the metav1.Status; for kBookmark an object with
  // only metadata.resourceVersion (and annotations) set.
  nlohmann::json object;
};

struct WatchOptions {
  std::string labelSelector;
  std::string fieldSelector;
  // Start after this version ("" = from now, with synthetic ADDED events for
  // what exists; "0" = any cached version).
  std::string resourceVersion;
  bool allowBookmarks = true;
  // The server ends the stream after this long (with jitter of its own).
  std::chrono::seconds timeout{300};
};

struct ClientOptions {
  // Per attempt of a call (connect included); streams use their own.
  std::chrono::milliseconds timeout{30000};
  std::chrono::milliseconds connectTimeout{10000};
  // Retries after the first attempt, for 429, 5xx and transport failures
  // other than a time-out.
  int maxRetries = 5;
  // A Retry-After beyond this is waited for only this long.
  std::chrono::seconds maxRetryAfter{30};
  BackoffPolicy retryBackoff{std::chrono::milliseconds(100), std::chrono::milliseconds(5000)};
  std::string userAgent = "geotrain-controller";
  std::string fieldManager = "geotrain-controller";
  // Handles kept for reuse (each keeps its connection alive).
  int maxIdleHandles = 8;
};

// Whether and how long to wait before retrying after `error`; nullopt: do
// not retry. `backoff` supplies the delay when the server gave none.
std::optional<std::chrono::milliseconds> retryDelay(const ApiError& error, bool idempotent,
                                                    const ClientOptions& options, Backoff& backoff);

class KubeClient {
 public:
  virtual ~KubeClient() = default;

  // One request: the decoded JSON body of a 2xx answer (null when empty), or
  // the ApiError, after the retries described above. `cancel` (may be null)
  // aborts a request in flight and any retry wait.
  virtual ApiResult<nlohmann::json> call(const ApiRequest& request, const CancelToken* cancel) = 0;

  // A streaming GET: `onChunk` sees the body's bytes as they arrive, in
  // pieces of any size, on the calling thread. Ends ok when the server closes
  // the stream; with the decoded ApiError for a non-2xx answer; kCancelled
  // when `cancel` fires; kDeadlineExceeded after `timeout`. No retries: the
  // caller (watchWithResume) owns reconnecting.
  virtual ApiResult<std::monostate> stream(const ApiRequest& request,
                                           const std::function<void(std::string_view)>& onChunk,
                                           std::chrono::milliseconds timeout,
                                           const CancelToken& cancel) = 0;

  // The namespace of the config's context (or the service account).
  virtual const std::string& defaultNamespace() const = 0;
  virtual const ClientOptions& options() const = 0;

  // ---- Verbs. `ns` is ignored for cluster-scoped resources and is required
  // for namespaced ones except list and watch, where "" means all namespaces.

  ApiResult<nlohmann::json> get(const ResourceRef& resource, std::string_view ns,
                                std::string_view name, const GetOptions& options = {});
  ApiResult<ListPage> list(const ResourceRef& resource, std::string_view ns,
                           const ListOptions& options = {});
  // POST; the name comes from metadata.name (or metadata.generateName).
  ApiResult<nlohmann::json> create(const ResourceRef& resource, std::string_view ns,
                                   const nlohmann::json& object, const WriteOptions& options = {});
  // PUT of metadata.name, conditional on metadata.resourceVersion, which must
  // be set: a stale one answers Conflict (isConflict()), never a lost update.
  ApiResult<nlohmann::json> update(const ResourceRef& resource, std::string_view ns,
                                   const nlohmann::json& object, const WriteOptions& options = {});
  // update() of the /status subresource.
  ApiResult<nlohmann::json> updateStatus(const ResourceRef& resource, std::string_view ns,
                                         const nlohmann::json& object);
  // DELETE; the answer is the object (with deletionTimestamp while finalizers
  // remain) or a Status.
  ApiResult<nlohmann::json> remove(const ResourceRef& resource, std::string_view ns,
                                   std::string_view name, const DeleteOptions& options = {});
  // PATCH with `patch` as the body (an array for kJson).
  ApiResult<nlohmann::json> patch(const ResourceRef& resource, std::string_view ns,
                                  std::string_view name, PatchType type,
                                  const nlohmann::json& patch, const PatchOptions& options = {});
  // Server-side apply of a full intent (apiVersion, kind, metadata.name).
  ApiResult<nlohmann::json> apply(const ResourceRef& resource, std::string_view ns,
                                  const nlohmann::json& object, const PatchOptions& options = {});

  // One watch request: each event to `onEvent` (on this thread) until the
  // server ends the stream (ok), an ERROR event (its Status as the ApiError:
  // isGone() for 410, then list again), a broken stream or cancel.
  ApiResult<std::monostate> watchOnce(const ResourceRef& resource, std::string_view ns,
                                      const WatchOptions& options,
                                      const std::function<void(WatchEvent&&)>& onEvent,
                                      const CancelToken& cancel);
};

// metadata.<field> of an object when it is a string, else "" (name,
// namespace, resourceVersion, uid, ...).
std::string metadataField(const nlohmann::json& object, std::string_view field);

// The collection and object paths of the verbs (exposed for tests).
std::string collectionPath(const ResourceRef& resource, std::string_view ns);
std::string objectPath(const ResourceRef& resource, std::string_view ns, std::string_view name,
                       std::string_view subresource = {});

// Every page of a list, following `continue` tokens with options.limit items
// per page (500 when 0). Gone (an expired continue token) is returned as is:
// the caller lists again from the start.
struct ListResult {
  std::vector<nlohmann::json> items;
  std::string resourceVersion;
};
ApiResult<ListResult> listAll(KubeClient& client, const ResourceRef& resource, std::string_view ns,
                              ListOptions options = {});

// The libcurl client for `config`. One easy handle per request, taken from a
// small pool so kept-alive connections and TLS sessions are reused; a handle
// serves one request at a time. Fails (InvalidArgument) when libcurl lacks a
// feature the config needs.
StatusOr<std::unique_ptr<KubeClient>> makeKubeClient(ClusterConfig config,
                                                     ClientOptions options = {});

}  // namespace geo::kube
