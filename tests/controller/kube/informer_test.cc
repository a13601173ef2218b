#include "controller/kube/informer.h"

#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <thread>

#include "tests/controller/kube/fake_client.h"

namespace geo::kube {
namespace {

using nlohmann::json;
using testing::FakeClient;
using testing::queryValue;
using testing::ScriptedStream;

json object(std::string_view name, std::string_view version) {
  return {{"metadata", {{"namespace", "ns"}, {"name", name}, {"resourceVersion", version}}}};
}

std::string event(std::string_view type, const json& o) {
  return json{{"type", type}, {"object", o}}.dump() + "\n";
}

TEST(StoreTest, KeysAndReplace) {
  EXPECT_EQ(objectKey(object("a", "1")), "ns/a");
  EXPECT_EQ(objectKey(json{{"metadata", {{"name", "node-1"}}}}), "node-1");
  Store store;
  EXPECT_EQ(store.upsert(std::make_shared<const json>(object("a", "1"))), nullptr);
  const ObjectPtr old = store.upsert(std::make_shared<const json>(object("a", "2")));
  ASSERT_NE(old, nullptr);
  EXPECT_EQ(metadataField(*old, "resourceVersion"), "1");
  EXPECT_EQ(metadataField(*store.get("ns/a"), "resourceVersion"), "2");
  const auto previous = store.replace({std::make_shared<const json>(object("b", "3"))});
  EXPECT_EQ(previous.size(), 1u);
  EXPECT_EQ(store.keys(), std::vector<std::string>{"ns/b"});
  EXPECT_EQ(store.erase("ns/b")->at("metadata")["name"], "b");
  EXPECT_EQ(store.erase("ns/b"), nullptr);
  EXPECT_EQ(store.size(), 0u);
}

// Records handler calls as "add a@1", "update a@1->2", "delete a@2".
class Recorder {
 public:
  EventHandlers handlers() {
    return {[this](const json& o) { push("add " + describe(o)); },
            [this](const json& a, const json& b) {
              push("update " + describe(a) + "->" + metadataField(b, "resourceVersion"));
            },
            [this](const json& o) { push("delete " + describe(o)); }};
  }
  std::vector<std::string> calls() const {
    std::lock_guard lock(mu_);
    return calls_;
  }
  bool waitFor(size_t count) const {
    for (int i = 0; i < 500; ++i) {
      if (calls().size() >= count) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }

 private:
  static std::string describe(const json& o) {
    return metadataField(o, "name") + "@" + metadataField(o, "resourceVersion");
  }
  void push(std::string call) {
    std::lock_guard lock(mu_);
    calls_.push_back(std::move(call));
  }
  mutable std::mutex mu_;
  std::vector<std::string> calls_;
};

TEST(InformerTest, ListsWatchesAndRelistsOnGone) {
  FakeClient client;
  std::atomic<int> lists{0};
  client.onCall = [&](const ApiRequest& request) -> ApiResult<json> {
    EXPECT_EQ(queryValue(request, "labelSelector"), "app=geo");
    if (lists++ == 0) {
      return json{{"metadata", {{"resourceVersion", "10"}}},
                  {"items", {object("a", "5"), object("b", "6")}}};
    }
    // After the 410: "a" changed, "b" is gone, "c" is new.
    return json{{"metadata", {{"resourceVersion", "30"}}},
                {"items", {object("a", "21"), object("c", "22")}}};
  };
  std::atomic<int> streams{0};
  client.onStream = [&](const ApiRequest& request) {
    EXPECT_EQ(queryValue(request, "labelSelector"), "app=geo");
    switch (streams++) {
      case 0:
        EXPECT_EQ(queryValue(request, "resourceVersion"), "10");
        return ScriptedStream{
            {event("MODIFIED", object("a", "11")) + event("DELETED", object("b", "12")),
             event("ADDED", object("d", "13"))},
            decodeApiError(410, R"({"kind":"Status","code":410})")};
      default: {
        EXPECT_EQ(queryValue(request, "resourceVersion"), "30");
        ScriptedStream open;
        open.holdOpen = true;
        return open;
      }
    }
  };
  InformerOptions options;
  options.labelSelector = "app=geo";
  options.backoff = {std::chrono::milliseconds(1), std::chrono::milliseconds(5), 2.0, 0.5};
  Informer informer(client, resources::kConfigMaps, "ns", options);
  Recorder recorder;
  informer.addHandlers(recorder.handlers());
  EXPECT_FALSE(informer.hasSynced());
  informer.start();
  ASSERT_TRUE(informer.waitForSync(std::chrono::seconds(10)));
  ASSERT_TRUE(recorder.waitFor(8));
  informer.stop();
  EXPECT_EQ(recorder.calls(), (std::vector<std::string>{
                                  "add a@5", "add b@6",                          // list
                                  "update a@5->11", "delete b@12", "add d@13",   // watch
                                  "update a@11->21", "add c@22", "delete d@13",  // re-list
                              }));
  EXPECT_EQ(informer.store().size(), 2u);
  EXPECT_EQ(metadataField(*informer.store().get("ns/a"), "resourceVersion"), "21");
  EXPECT_EQ(informer.store().get("ns/d"), nullptr);
  EXPECT_EQ(informer.lastResourceVersion(), "30");
}

TEST(InformerTest, ListFailuresAreRetriedAndHandlerExceptionsContained) {
  FakeClient client;
  std::atomic<int> lists{0};
  client.onCall = [&](const ApiRequest&) -> ApiResult<json> {
    if (lists++ < 2) return decodeApiError(500, "");
    return json{{"metadata", {{"resourceVersion", "1"}}}, {"items", {object("a", "1")}}};
  };
  client.onStream = [](const ApiRequest&) {
    ScriptedStream open;
    open.holdOpen = true;
    return open;
  };
  InformerOptions options;
  options.backoff = {std::chrono::milliseconds(1), std::chrono::milliseconds(5), 2.0, 0.5};
  Informer informer(client, resources::kConfigMaps, "ns", options);
  informer.addHandlers({[](const json&) { throw std::runtime_error("handler bug"); }, {}, {}});
  Recorder recorder;
  informer.addHandlers(recorder.handlers());
  informer.start();
  ASSERT_TRUE(informer.waitForSync(std::chrono::seconds(10)));
  EXPECT_EQ(recorder.calls(), std::vector<std::string>{"add a@1"});
  EXPECT_EQ(lists.load(), 3);
  informer.stop();
  EXPECT_THROW(informer.addHandlers({}), Error);
}

TEST(InformerTest, StopBeforeSyncEndsWaiting) {
  FakeClient client;  // every list answers 404
  InformerOptions options;
  options.backoff = {std::chrono::milliseconds(1), std::chrono::milliseconds(5), 2.0, 0.5};
  Informer informer(client, resources::kConfigMaps, "ns", options);
  informer.start();
  std::thread stopper([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    informer.stop();
  });
  EXPECT_FALSE(informer.waitForSync(std::chrono::seconds(10)));
  stopper.join();
  EXPECT_FALSE(informer.hasSynced());
}

}  // namespace
}  // namespace geo::kube
