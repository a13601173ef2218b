#include "controller/kube/events.h"

#include <gtest/gtest.h>

#include "tests/controller/kube/fake_client.h"

namespace geo::kube {
namespace {

using nlohmann::json;
using testing::FakeClient;

const json kJob = {
    {"apiVersion", "geotrain.io/v1alpha1"},
    {"kind", "TrainingJob"},
    {"metadata",
     {{"name", "mnist"}, {"namespace", "team-a"}, {"uid", "u-1"}, {"resourceVersion", "7"}}}};

TEST(EventsTest, CamelCaseReasons) {
  EXPECT_TRUE(isCamelCaseReason("InvalidSpec"));
  EXPECT_TRUE(isCamelCaseReason("RegionDegraded"));
  EXPECT_TRUE(isCamelCaseReason("Created2"));
  EXPECT_FALSE(isCamelCaseReason(""));
  EXPECT_FALSE(isCamelCaseReason("invalidSpec"));
  EXPECT_FALSE(isCamelCaseReason("Invalid Spec"));
  EXPECT_FALSE(isCamelCaseReason("Invalid_Spec"));
}

TEST(EventsTest, ObjectReference) {
  const ObjectReference ref = ObjectReference::of(kJob);
  EXPECT_EQ(ref.kind, "TrainingJob");
  EXPECT_EQ(ref.ns, "team-a");
  EXPECT_EQ(ref.toJson(), json::parse(R"({"apiVersion":"geotrain.io/v1alpha1","kind":"TrainingJob",
    "name":"mnist","namespace":"team-a","uid":"u-1","resourceVersion":"7"})"));
}

TEST(EventsTest, PostsThenAggregatesRepeats) {
  FakeClient client;
  int patchesNotFound = 0;
  client.onCall = [&](const ApiRequest& request) -> ApiResult<json> {
    if (request.method == "PATCH" && patchesNotFound-- > 0) return decodeApiError(404, "");
    return json::parse(request.body);
  };
  {
    EventRecorder recorder(client, "geotrain-controller", "pod-1");
    const ObjectReference ref = ObjectReference::of(kJob);
    recorder.record(ref, EventType::kWarning, "InvalidSpec", "spec.regions: Required value");
    recorder.record(ref, EventType::kWarning, "InvalidSpec", "spec.regions: Required value");
    recorder.record(ref, EventType::kNormal, "Created", "created 3 regions");
    recorder.record(ref, EventType::kNormal, "not camel", "dropped");
    recorder.flush();
    const auto requests = client.requests();
    ASSERT_EQ(requests.size(), 3u);
    EXPECT_EQ(requests[0].method, "POST");
    EXPECT_EQ(requests[0].path, "/api/v1/namespaces/team-a/events");
    const json first = json::parse(requests[0].body);
    EXPECT_EQ(first["type"], "Warning");
    EXPECT_EQ(first["reason"], "InvalidSpec");
    EXPECT_EQ(first["count"], 1);
    EXPECT_EQ(first["involvedObject"]["uid"], "u-1");
    EXPECT_EQ(first["source"]["component"], "geotrain-controller");
    EXPECT_EQ(first["reportingInstance"], "pod-1");
    const std::string name = first["metadata"]["name"];
    EXPECT_EQ(name.rfind("mnist.", 0), 0u);
    EXPECT_EQ(requests[1].method, "PATCH");
    EXPECT_EQ(requests[1].path, "/api/v1/namespaces/team-a/events/" + name);
    EXPECT_EQ(requests[1].contentType, "application/merge-patch+json");
    EXPECT_EQ(json::parse(requests[1].body)["count"], 2);
    EXPECT_EQ(requests[2].method, "POST");
    EXPECT_EQ(json::parse(requests[2].body)["reason"], "Created");
    // The aggregated event expired on the server: a new one is created.
    patchesNotFound = 1;
    recorder.record(ref, EventType::kWarning, "InvalidSpec", "spec.regions: Required value");
    recorder.flush();
    ASSERT_EQ(client.requests().size(), 5u);
    EXPECT_EQ(client.requests()[4].method, "POST");
  }
}

TEST(EventsTest, FailuresNeverReachTheCaller) {
  FakeClient client;  // answers 404 to everything
  EventRecorder recorder(client, "geotrain-controller", "pod-1", /*maxQueued=*/2);
  const ObjectReference ref = ObjectReference::of(kJob);
  for (int i = 0; i < 100; ++i) {
    recorder.record(ref, EventType::kNormal, "Created", std::string(5000, 'x'));
  }
  recorder.flush();
  EXPECT_GE(client.requests().size(), 1u);
  EXPECT_LE(client.requests().size(), 100u);
  EXPECT_EQ(json::parse(client.requests()[0].body)["message"].get<std::string>().size(), 1024u);
}

}  // namespace
}  // namespace geo::kube
