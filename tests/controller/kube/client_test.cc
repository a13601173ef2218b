#include "controller/kube/client.h"

#include <gtest/gtest.h>

#include "tests/controller/kube/fake_client.h"

namespace geo::kube {
namespace {

using nlohmann::json;
using testing::FakeClient;
using testing::queryValue;

const ResourceRef kTrainingJobs{"geotrain.io", "v1alpha1", "trainingjobs", true};

TEST(ResourceRefTest, Paths) {
  EXPECT_EQ(resources::kConfigMaps.apiVersion(), "v1");
  EXPECT_EQ(resources::kJobs.apiVersion(), "batch/v1");
  EXPECT_EQ(collectionPath(resources::kConfigMaps, "ns"), "/api/v1/namespaces/ns/configmaps");
  EXPECT_EQ(collectionPath(resources::kConfigMaps, ""), "/api/v1/configmaps");
  EXPECT_EQ(collectionPath(resources::kNamespaces, "ignored"), "/api/v1/namespaces");
  EXPECT_EQ(objectPath(kTrainingJobs, "team-a", "mnist", "status"),
            "/apis/geotrain.io/v1alpha1/namespaces/team-a/trainingjobs/mnist/status");
  EXPECT_EQ(objectPath(resources::kLeases, "kube-system", "geo"),
            "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/geo");
}

TEST(ApiRequestTest, TargetEncodesQuery) {
  ApiRequest request;
  request.path = "/api/v1/pods";
  request.query = {{"labelSelector", "app in (a,b),tier!=db"}, {"limit", "5"}};
  EXPECT_EQ(request.target(),
            "/api/v1/pods?labelSelector=app%20in%20%28a%2Cb%29%2Ctier%21%3Ddb&limit=5");
  EXPECT_EQ(percentEncode("a-b_c.d~e/f"), "a-b_c.d~e%2Ff");
}

TEST(MetadataFieldTest, ReadsStringsOnly) {
  const json object = {{"metadata", {{"name", "x"}, {"generation", 3}}}};
  EXPECT_EQ(metadataField(object, "name"), "x");
  EXPECT_EQ(metadataField(object, "generation"), "");
  EXPECT_EQ(metadataField(object, "namespace"), "");
  EXPECT_EQ(metadataField(json::array(), "name"), "");
}

TEST(KubeClientTest, GetAndStatusSubresource) {
  FakeClient client;
  client.onCall = [](const ApiRequest&) -> ApiResult<json> { return json{{"kind", "ConfigMap"}}; };
  auto object = client.get(resources::kConfigMaps, "ns", "cm");
  ASSERT_TRUE(object.ok());
  EXPECT_EQ((*object)["kind"], "ConfigMap");
  EXPECT_EQ(client.lastRequest().method, "GET");
  EXPECT_EQ(client.lastRequest().path, "/api/v1/namespaces/ns/configmaps/cm");
  EXPECT_TRUE(client.lastRequest().idempotent);
  (void)client.get(kTrainingJobs, "ns", "job", GetOptions{"status"});
  EXPECT_EQ(client.lastRequest().path,
            "/apis/geotrain.io/v1alpha1/namespaces/ns/trainingjobs/job/status");
}

TEST(KubeClientTest, NamespacedObjectsNeedANamespace) {
  FakeClient client;
  const auto result = client.get(resources::kConfigMaps, "", "cm");
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.error().code, StatusCode::kInvalidArgument);
  EXPECT_TRUE(client.requests().empty());
}

TEST(KubeClientTest, ErrorsPassThrough) {
  FakeClient client;
  const auto result = client.get(resources::kSecrets, "ns", "missing");
  ASSERT_FALSE(result.ok());
  EXPECT_TRUE(result.error().isNotFound());
}

TEST(KubeClientTest, ListWithSelectorsAndPaging) {
  FakeClient client;
  client.onCall = [](const ApiRequest& request) -> ApiResult<json> {
    const std::string token = queryValue(request, "continue");
    if (token == "<absent>") {
      return json{{"metadata", {{"resourceVersion", "100"}, {"continue", "page2"}}},
                  {"items", {{{"metadata", {{"name", "a"}}}}, {{"metadata", {{"name", "b"}}}}}}};
    }
    EXPECT_EQ(token, "page2");
    return json{{"metadata", {{"resourceVersion", "100"}}},
                {"items", {{{"metadata", {{"name", "c"}}}}}}};
  };
  ListOptions options;
  options.labelSelector = "geotrain.io/job=mnist";
  options.fieldSelector = "metadata.name!=x";
  options.limit = 2;
  auto all = listAll(client, resources::kServices, "ns", options);
  ASSERT_TRUE(all.ok()) << all.status().toString();
  ASSERT_EQ(all->items.size(), 3u);
  EXPECT_EQ(all->items[2]["metadata"]["name"], "c");
  EXPECT_EQ(all->resourceVersion, "100");
  const auto requests = client.requests();
  ASSERT_EQ(requests.size(), 2u);
  for (const ApiRequest& request : requests) {
    EXPECT_EQ(request.path, "/api/v1/namespaces/ns/services");
    EXPECT_EQ(queryValue(request, "labelSelector"), "geotrain.io/job=mnist");
    EXPECT_EQ(queryValue(request, "fieldSelector"), "metadata.name!=x");
    EXPECT_EQ(queryValue(request, "limit"), "2");
  }
}

TEST(KubeClientTest, ListAllReturnsGoneForAnExpiredContinueToken) {
  FakeClient client;
  client.onCall = [](const ApiRequest& request) -> ApiResult<json> {
    if (queryValue(request, "continue") == "<absent>") {
      return json{{"metadata", {{"resourceVersion", "5"}, {"continue", "old"}}},
                  {"items", json::array()}};
    }
    return decodeApiError(410, R"({"kind":"Status","reason":"Expired","code":410})");
  };
  const auto all = listAll(client, resources::kPods, "", {});
  ASSERT_FALSE(all.ok());
  EXPECT_TRUE(all.error().isGone());
  EXPECT_EQ(queryValue(client.requests()[0], "limit"), "500");
}

TEST(KubeClientTest, ListRejectsANonList) {
  FakeClient client;
  client.onCall = [](const ApiRequest&) -> ApiResult<json> { return json{{"kind", "Pod"}}; };
  const auto page = client.list(resources::kPods, "ns");
  ASSERT_FALSE(page.ok());
  EXPECT_EQ(page.error().code, StatusCode::kDataLoss);
}

TEST(KubeClientTest, CreateUsesTheClientsFieldManager) {
  FakeClient client;
  client.onCall = [](const ApiRequest& request) -> ApiResult<json> {
    return json::parse(request.body);
  };
  const json object = {{"metadata", {{"generateName", "x-"}}}};
  ASSERT_TRUE(client.create(resources::kConfigMaps, "ns", object).ok());
  const ApiRequest request = client.lastRequest();
  EXPECT_EQ(request.method, "POST");
  EXPECT_EQ(request.path, "/api/v1/namespaces/ns/configmaps");
  EXPECT_EQ(request.contentType, "application/json");
  EXPECT_EQ(json::parse(request.body), object);
  EXPECT_EQ(queryValue(request, "fieldManager"), "geotrain-controller");
  EXPECT_FALSE(request.idempotent);
  WriteOptions dry;
  dry.dryRun = true;
  dry.fieldManager = "me";
  ASSERT_TRUE(client.create(resources::kConfigMaps, "ns", object, dry).ok());
  EXPECT_EQ(queryValue(client.lastRequest(), "dryRun"), "All");
  EXPECT_EQ(queryValue(client.lastRequest(), "fieldManager"), "me");
}

TEST(KubeClientTest, UpdateIsConditionalOnTheResourceVersion) {
  FakeClient client;
  client.onCall = [](const ApiRequest&) -> ApiResult<json> {
    return decodeApiError(
        409,
        R"({"kind":"Status","reason":"Conflict","message":"the object has been modified; please apply your changes to the latest version and try again","code":409})");
  };
  const json stale = {{"metadata", {{"name", "cm"}, {"resourceVersion", "7"}}}};
  const auto result = client.update(resources::kConfigMaps, "ns", stale);
  ASSERT_FALSE(result.ok());
  EXPECT_TRUE(result.error().isConflict());
  EXPECT_EQ(client.lastRequest().method, "PUT");
  EXPECT_EQ(client.lastRequest().path, "/api/v1/namespaces/ns/configmaps/cm");
  EXPECT_EQ(json::parse(client.lastRequest().body)["metadata"]["resourceVersion"], "7");

  const json unversioned = {{"metadata", {{"name", "cm"}}}};
  const auto refused = client.update(resources::kConfigMaps, "ns", unversioned);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().code, StatusCode::kInvalidArgument);
  EXPECT_EQ(client.requests().size(), 1u);

  (void)client.updateStatus(kTrainingJobs, "ns",
                            json{{"metadata", {{"name", "j"}, {"resourceVersion", "1"}}}});
  EXPECT_EQ(client.lastRequest().path,
            "/apis/geotrain.io/v1alpha1/namespaces/ns/trainingjobs/j/status");
}

TEST(KubeClientTest, DeleteSendsDeleteOptions) {
  FakeClient client;
  client.onCall = [](const ApiRequest&) -> ApiResult<json> { return json{{"kind", "Status"}}; };
  DeleteOptions options;
  options.propagationPolicy = PropagationPolicy::kForeground;
  options.preconditionUid = "uid-1";
  options.preconditionResourceVersion = "1234567";
  options.gracePeriodSeconds = 0;
  ASSERT_TRUE(client.remove(resources::kJobs, "ns", "job-0", options).ok());
  const ApiRequest request = client.lastRequest();
  EXPECT_EQ(request.method, "DELETE");
  EXPECT_EQ(request.path, "/apis/batch/v1/namespaces/ns/jobs/job-0");
  EXPECT_EQ(
      json::parse(request.body),
      json::parse(R"({"kind":"DeleteOptions","apiVersion":"v1","propagationPolicy":"Foreground",
              "gracePeriodSeconds":0,"preconditions":{"uid":"uid-1","resourceVersion":"1234567"}})"));
}

TEST(KubeClientTest, PatchContentTypes) {
  FakeClient client;
  client.onCall = [](const ApiRequest&) -> ApiResult<json> { return json::object(); };
  const json merge = {{"metadata", {{"labels", {{"a", "b"}}}}}};
  ASSERT_TRUE(client.patch(resources::kPods, "ns", "p", PatchType::kMerge, merge).ok());
  EXPECT_EQ(client.lastRequest().contentType, "application/merge-patch+json");
  EXPECT_EQ(client.lastRequest().method, "PATCH");
  EXPECT_FALSE(client.lastRequest().idempotent);
  ASSERT_TRUE(client.patch(resources::kPods, "ns", "p", PatchType::kStrategicMerge, merge).ok());
  EXPECT_EQ(client.lastRequest().contentType, "application/strategic-merge-patch+json");
  const json ops = json::parse(R"([{"op":"replace","path":"/spec/replicas","value":3}])");
  ASSERT_TRUE(client.patch(resources::kPods, "ns", "p", PatchType::kJson, ops).ok());
  EXPECT_EQ(client.lastRequest().contentType, "application/json-patch+json");
  EXPECT_EQ(json::parse(client.lastRequest().body), ops);
  // The body must match the type.
  EXPECT_FALSE(client.patch(resources::kPods, "ns", "p", PatchType::kJson, merge).ok());
  EXPECT_FALSE(client.patch(resources::kPods, "ns", "p", PatchType::kMerge, ops).ok());
  EXPECT_EQ(client.requests().size(), 3u);
}

TEST(KubeClientTest, ServerSideApply) {
  FakeClient client;
  client.onCall = [](const ApiRequest&) -> ApiResult<json> { return json::object(); };
  const json intent = {{"apiVersion", "v1"},
                       {"kind", "ConfigMap"},
                       {"metadata", {{"name", "worker-config"}}},
                       {"data", {{"worker.yaml", "x"}}}};
  PatchOptions options;
  options.force = true;
  options.subresource = "";
  ASSERT_TRUE(client.apply(resources::kConfigMaps, "ns", intent, options).ok());
  const ApiRequest request = client.lastRequest();
  EXPECT_EQ(request.method, "PATCH");
  EXPECT_EQ(request.path, "/api/v1/namespaces/ns/configmaps/worker-config");
  EXPECT_EQ(request.contentType, "application/apply-patch+yaml");
  EXPECT_EQ(queryValue(request, "fieldManager"), "geotrain-controller");
  EXPECT_EQ(queryValue(request, "force"), "true");
  EXPECT_TRUE(request.idempotent);
  const json noKind = {{"metadata", {{"name", "x"}}}};
  EXPECT_EQ(client.apply(resources::kConfigMaps, "ns", noKind).error().code,
            StatusCode::kInvalidArgument);
  // Status through apply on the subresource.
  PatchOptions status;
  status.subresource = "status";
  status.fieldManager = "geotrain-status";
  ASSERT_TRUE(client
                  .apply(kTrainingJobs, "ns",
                         json{{"apiVersion", "geotrain.io/v1alpha1"},
                              {"kind", "TrainingJob"},
                              {"metadata", {{"name", "j"}}}},
                         status)
                  .ok());
  EXPECT_EQ(client.lastRequest().path,
            "/apis/geotrain.io/v1alpha1/namespaces/ns/trainingjobs/j/status");
  EXPECT_EQ(queryValue(client.lastRequest(), "fieldManager"), "geotrain-status");
  EXPECT_EQ(queryValue(client.lastRequest(), "force"), "<absent>");
}

TEST(RetryDelayTest, TooManyRequestsHonoursRetryAfterForAnyVerb) {
  ClientOptions options;
  options.maxRetries = 3;
  options.maxRetryAfter = std::chrono::seconds(10);
  Backoff backoff(options.retryBackoff, 1);
  const ApiError throttled = decodeApiError(429, "", "2");
  EXPECT_EQ(retryDelay(throttled, /*idempotent=*/false, options, backoff),
            std::chrono::milliseconds(2000));
  const ApiError longWait = decodeApiError(429, "", "3600");
  EXPECT_EQ(retryDelay(longWait, false, options, backoff), std::chrono::milliseconds(10000));
  const auto noHeader = retryDelay(decodeApiError(429, ""), false, options, backoff);
  ASSERT_TRUE(noHeader);
  // Bounded: after maxRetries attempts, no more.
  EXPECT_FALSE(retryDelay(throttled, false, options, backoff));
}

TEST(RetryDelayTest, ServerErrorsAndLostAnswersOnlyForIdempotentRequests) {
  ClientOptions options;
  Backoff backoff(options.retryBackoff, 1);
  const ApiError unavailable = decodeApiError(503, "");
  EXPECT_TRUE(retryDelay(unavailable, true, options, backoff));
  EXPECT_FALSE(retryDelay(unavailable, false, options, backoff));
  const ApiError lost = localError(StatusCode::kUnknown, "connection reset");
  EXPECT_TRUE(retryDelay(lost, true, options, backoff));
  EXPECT_FALSE(retryDelay(lost, false, options, backoff));
  // Refused connections: nothing was sent, so even a POST may repeat.
  const ApiError refused = localError(StatusCode::kUnavailable, "connection refused");
  EXPECT_TRUE(retryDelay(refused, false, options, backoff));
  // Never: client errors, cancellation, bad TLS configuration, and a
  // server that did not answer within the attempt's time-out (a partitioned
  // or hung cluster: each retry would wait as long again).
  for (const ApiError& error :
       {decodeApiError(404, ""), decodeApiError(409, ""), decodeApiError(422, ""),
        localError(StatusCode::kCancelled, "x"), localError(StatusCode::kFailedPrecondition, "tls"),
        localError(StatusCode::kDeadlineExceeded, "timed out")}) {
    Backoff fresh(options.retryBackoff, 1);
    EXPECT_FALSE(retryDelay(error, true, options, fresh)) << error.toStatus().toString();
  }
}

TEST(RetryDelayTest, BackoffDelaysAreBounded) {
  ClientOptions options;
  options.maxRetries = 20;
  Backoff backoff(options.retryBackoff, 3);
  for (int i = 0; i < 20; ++i) {
    const auto delay = retryDelay(decodeApiError(500, ""), true, options, backoff);
    ASSERT_TRUE(delay);
    EXPECT_LE(*delay, options.retryBackoff.max);
  }
  EXPECT_FALSE(retryDelay(decodeApiError(500, ""), true, options, backoff));
}

}  // namespace
}  // namespace geo::kube
