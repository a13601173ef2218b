#include "tests/support/test_apiserver.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

namespace geo::testapi {
namespace {

// A plain HTTP client that speaks to one test apiserver.
class Api {
 public:
  struct Reply {
    int code = 0;
    Json body;
    httplib::Headers headers;
  };

  explicit Api(httplib::Client client) : client_(std::move(client)) {
    client_.set_read_timeout(10, 0);
  }

  Reply call(const std::string& method, const std::string& path, const Json& body = nullptr,
             const std::string& contentType = "application/json",
             const httplib::Headers& headers = {}) {
    const std::string text = body.is_null() ? "" : body.dump();
    httplib::Result r =
        method == "GET"     ? client_.Get(path.c_str(), headers)
        : method == "POST"  ? client_.Post(path.c_str(), headers, text, contentType.c_str())
        : method == "PUT"   ? client_.Put(path.c_str(), headers, text, contentType.c_str())
        : method == "PATCH" ? client_.Patch(path.c_str(), headers, text, contentType.c_str())
                            : client_.Delete(path.c_str(), headers, text, contentType.c_str());
    Reply reply;
    if (!r) {
      ADD_FAILURE() << method << " " << path << ": " << httplib::to_string(r.error());
      return reply;
    }
    reply.code = r->status;
    reply.headers = r->headers;
    reply.body = Json::parse(r->body, nullptr, false);
    return reply;
  }

  // Raw YAML/JSON text as an apply patch.
  Reply apply(const std::string& path, const Json& object, const std::string& manager,
              bool force = false) {
    return call("PATCH", path + "?fieldManager=" + manager + (force ? "&force=true" : ""), object,
                "application/apply-patch+yaml");
  }

 private:
  httplib::Client client_;
};

const std::string kCms = "/api/v1/namespaces/default/configmaps";
const std::string kWidgets = "/apis/test.geotrain.io/v1alpha1/namespaces/default/widgets";

Json configMap(const std::string& name, Json data = Json::object(), Json labels = nullptr) {
  Json cm = {{"apiVersion", "v1"},
             {"kind", "ConfigMap"},
             {"metadata", {{"name", name}}},
             {"data", std::move(data)}};
  if (!labels.is_null()) cm["metadata"]["labels"] = std::move(labels);
  return cm;
}

Json widgetCrd() {
  return Json::parse(R"({
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": "widgets.test.geotrain.io"},
    "spec": {"group": "test.geotrain.io", "scope": "Namespaced",
      "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "shortNames": ["wd"]},
      "versions": [{"name": "v1alpha1", "served": true, "storage": true,
        "subresources": {"status": {}},
        "additionalPrinterColumns": [
          {"name": "Size", "type": "integer", "jsonPath": ".spec.size"},
          {"name": "Ready", "type": "string", "jsonPath": ".status.conditions[?(@.type==\"Ready\")].status"}],
        "schema": {"openAPIV3Schema": {"type": "object", "properties": {
          "status": {"type": "object", "properties": {"conditions": {"type": "array",
            "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"],
            "items": {"type": "object"}}}}}}}}]}})");
}

Json widget(const std::string& name, int size) {
  return {{"apiVersion", "test.geotrain.io/v1alpha1"},
          {"kind", "Widget"},
          {"metadata", {{"name", name}}},
          {"spec", {{"size", size}}}};
}

std::string rvOf(const Json& o) {
  return o["metadata"]["resourceVersion"].get<std::string>();
}

class ApiServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ServerOptions options;
    options.bookmarkInterval = std::chrono::milliseconds(50);
    server_ = std::make_unique<TestApiServer>(options);
    server_->start();
    api_ = std::make_unique<Api>(httplib::Client("127.0.0.1", server_->port()));
  }

  void installWidgets() {
    ASSERT_EQ(
        api_->call("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", widgetCrd())
            .code,
        201);
  }

  // Reads watch events from `path` until `until` says stop (or the stream
  // ends or `timeout` passes).
  std::vector<Json> watch(const std::string& path, const std::function<bool(const Json&)>& until,
                          int timeoutSeconds = 10) {
    httplib::Client client("127.0.0.1", server_->port());
    client.set_read_timeout(timeoutSeconds, 0);
    std::vector<Json> events;
    std::string buffer;
    bool stop = false;
    client.Get(path.c_str(), [&](const char* data, size_t n) {
      buffer.append(data, n);
      size_t eol;
      while (!stop && (eol = buffer.find('\n')) != std::string::npos) {
        events.push_back(Json::parse(buffer.substr(0, eol)));
        buffer.erase(0, eol + 1);
        stop = until(events.back());
      }
      return !stop;
    });
    return events;
  }

  std::unique_ptr<TestApiServer> server_;
  std::unique_ptr<Api> api_;
};

TEST_F(ApiServerTest, CreateGetAndErrorsCarryStatusBodies) {
  auto created = api_->call("POST", kCms, configMap("a", {{"k", "v"}}));
  ASSERT_EQ(created.code, 201);
  EXPECT_FALSE(created.body["metadata"]["uid"].get<std::string>().empty());
  EXPECT_FALSE(created.body["metadata"]["creationTimestamp"].get<std::string>().empty());
  EXPECT_EQ(created.body["metadata"]["namespace"], "default");
  EXPECT_EQ(api_->call("GET", kCms + "/a").body["data"]["k"], "v");

  auto again = api_->call("POST", kCms, configMap("a"));
  EXPECT_EQ(again.code, 409);
  EXPECT_EQ(again.body["kind"], "Status");
  EXPECT_EQ(again.body["apiVersion"], "v1");
  EXPECT_EQ(again.body["status"], "Failure");
  EXPECT_EQ(again.body["reason"], "AlreadyExists");
  EXPECT_EQ(again.body["code"], 409);
  EXPECT_EQ(again.body["details"]["name"], "a");
  EXPECT_EQ(again.body["message"], "configmaps \"a\" already exists");

  auto missing = api_->call("GET", kCms + "/nope");
  EXPECT_EQ(missing.code, 404);
  EXPECT_EQ(missing.body["reason"], "NotFound");
  EXPECT_EQ(missing.body["message"], "configmaps \"nope\" not found");

  auto bad = api_->call("POST", kCms, configMap("Not_Valid"));
  EXPECT_EQ(bad.code, 422);
  EXPECT_EQ(bad.body["reason"], "Invalid");
  EXPECT_EQ(bad.body["details"]["causes"][0]["field"], "metadata.name");

  EXPECT_EQ(api_->call("POST", kCms + "/a", configMap("a")).code, 405);
  EXPECT_EQ(api_->call("POST", "/api/v1/namespaces/ghost/configmaps", configMap("x")).code, 404);
  EXPECT_EQ(api_->call("GET", "/api/v1/nothings").code, 404);
  EXPECT_EQ(api_->call("GET", "/apis/apps/v1/namespaces/default/deployments/x").code, 404);

  auto generated = api_->call(
      "POST", kCms,
      Json{{"apiVersion", "v1"}, {"kind", "ConfigMap"}, {"metadata", {{"generateName", "gen-"}}}});
  ASSERT_EQ(generated.code, 201);
  EXPECT_EQ(generated.body["metadata"]["name"].get<std::string>().rfind("gen-", 0), 0u);
}

TEST_F(ApiServerTest, TwoWritersOneGetsConflict) {
  const Json cm = api_->call("POST", kCms, configMap("shared", {{"v", "0"}})).body;
  Json first = cm;
  Json second = cm;
  first["data"]["v"] = "1";
  second["data"]["v"] = "2";
  auto a = api_->call("PUT", kCms + "/shared", first);
  auto b = api_->call("PUT", kCms + "/shared", second);
  EXPECT_EQ(a.code, 200);
  EXPECT_EQ(b.code, 409);
  EXPECT_EQ(b.body["reason"], "Conflict");
  EXPECT_NE(b.body["message"].get<std::string>().find("the object has been modified"),
            std::string::npos);
  EXPECT_GT(std::stoull(rvOf(a.body)), std::stoull(rvOf(cm)));
  EXPECT_EQ(api_->call("GET", kCms + "/shared").body["data"]["v"], "1");
  // A no-op update writes nothing: same resourceVersion.
  auto noop = api_->call("PUT", kCms + "/shared", a.body);
  EXPECT_EQ(rvOf(noop.body), rvOf(a.body));
}

TEST_F(ApiServerTest, GenerationCountsSpecAndStatusIsSeparate) {
  installWidgets();
  Json w = api_->call("POST", kWidgets, widget("w", 1)).body;
  ASSERT_EQ(w["metadata"]["generation"], 1);
  w["metadata"]["labels"] = {{"x", "y"}};
  w["status"] = {{"phase", "ignored"}};
  w = api_->call("PUT", kWidgets + "/w", w).body;
  EXPECT_EQ(w["metadata"]["generation"], 1) << "metadata changes keep the generation";
  EXPECT_FALSE(w.contains("status")) << "the main resource ignores status";
  w["spec"]["size"] = 2;
  w = api_->call("PUT", kWidgets + "/w", w).body;
  EXPECT_EQ(w["metadata"]["generation"], 2);

  Json s = w;
  s["status"] = {{"conditions", {{{"type", "Ready"}, {"status", "True"}}}}};
  s["spec"]["size"] = 99;
  auto st = api_->call("PUT", kWidgets + "/w/status", s);
  ASSERT_EQ(st.code, 200);
  EXPECT_EQ(st.body["status"]["conditions"][0]["status"], "True");
  EXPECT_EQ(st.body["spec"]["size"], 2) << "/status ignores spec";
  EXPECT_EQ(st.body["metadata"]["generation"], 2);

  auto merged =
      api_->call("PATCH", kWidgets + "/w/status", Json{{"status", {{"observedGeneration", 2}}}},
                 "application/merge-patch+json");
  EXPECT_EQ(merged.body["status"]["observedGeneration"], 2);
  EXPECT_EQ(api_->call("GET", "/apis/apps/v1/namespaces/default/deployments/x/scale").code, 404);
}

TEST_F(ApiServerTest, SelectorsAndPagination) {
  auto c1 = api_->call("POST", kCms, configMap("c1", {}, {{"env", "a"}, {"tier", "web"}}));
  ASSERT_EQ(c1.code, 201) << c1.body.dump();
  api_->call("POST", kCms, configMap("c2", {}, {{"env", "b"}}));
  api_->call("POST", kCms, configMap("c3", {}, {{"env", "c"}}));
  api_->call("POST", kCms, configMap("c4", {}, {{"team", "x"}}));
  api_->call("POST", kCms, configMap("c5"));
  auto names = [&](const std::string& query) {
    std::vector<std::string> out;
    const Json list = api_->call("GET", kCms + "?" + query).body;
    for (const auto& i : list["items"]) {
      out.push_back(i["metadata"]["name"]);
    }
    return out;
  };
  using V = std::vector<std::string>;
  EXPECT_EQ(names("labelSelector=env%20in%20(a,b)"), (V{"c1", "c2"}));
  EXPECT_EQ(names("labelSelector=env%20notin%20(a,b)"), (V{"c3", "c4", "c5"}));
  EXPECT_EQ(names("labelSelector=env,!tier"), (V{"c2", "c3"}));
  EXPECT_EQ(names("labelSelector=env%3Db"), (V{"c2"}));
  EXPECT_EQ(names("labelSelector=env!%3Da"), (V{"c2", "c3", "c4", "c5"}));
  EXPECT_EQ(names("fieldSelector=metadata.name%3Dc4"), (V{"c4"}));
  EXPECT_EQ(api_->call("GET", kCms + "?fieldSelector=spec.bogus%3D1").code, 400);

  V paged;
  std::string cont;
  int pages = 0;
  do {
    auto page = api_->call("GET", kCms + "?limit=2" + (cont.empty() ? "" : "&continue=" + cont));
    ASSERT_EQ(page.code, 200);
    for (const auto& i : page.body["items"]) paged.push_back(i["metadata"]["name"]);
    cont = page.body["metadata"].value("continue", "");
    ++pages;
  } while (!cont.empty());
  EXPECT_EQ(pages, 3);
  EXPECT_EQ(paged, (V{"c1", "c2", "c3", "c4", "c5"}));

  ASSERT_EQ(
      api_->call(
              "POST", "/api/v1/namespaces",
              Json{{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", "other"}}}})
          .code,
      201);
  api_->call("POST", "/api/v1/namespaces/other/configmaps", configMap("c9"));
  EXPECT_EQ(api_->call("GET", "/api/v1/configmaps").body["items"].size(), 6u);
  auto gone = api_->call("DELETE", kCms + "?labelSelector=env");
  EXPECT_EQ(gone.code, 200);
  EXPECT_EQ(names(""), (V{"c4", "c5"}));
}

TEST_F(ApiServerTest, FinalizersDelayDeletion) {
  Json cm = configMap("f");
  cm["metadata"]["finalizers"] = {"test/hold"};
  ASSERT_EQ(api_->call("POST", kCms, cm).code, 201);
  auto marked = api_->call("DELETE", kCms + "/f");
  ASSERT_EQ(marked.code, 200);
  EXPECT_TRUE(marked.body["metadata"].contains("deletionTimestamp"));
  Json live = api_->call("GET", kCms + "/f").body;
  EXPECT_TRUE(live["metadata"].contains("deletionTimestamp"));

  Json more = live;
  more["metadata"]["finalizers"].push_back("test/another");
  EXPECT_EQ(api_->call("PUT", kCms + "/f", more).code, 422);

  auto released = api_->call("PATCH", kCms + "/f", Json{{"metadata", {{"finalizers", nullptr}}}},
                             "application/merge-patch+json");
  EXPECT_EQ(released.code, 200);
  EXPECT_EQ(api_->call("GET", kCms + "/f").code, 404);
}

TEST_F(ApiServerTest, GarbageCollectionBackgroundForegroundOrphan) {
  auto owned = [&](const std::string& name, const Json& owner, bool finalizer = false) {
    Json cm = configMap(name);
    cm["metadata"]["ownerReferences"] = {{{"apiVersion", "v1"},
                                          {"kind", "ConfigMap"},
                                          {"name", owner["metadata"]["name"]},
                                          {"uid", owner["metadata"]["uid"]},
                                          {"blockOwnerDeletion", true}}};
    if (finalizer) cm["metadata"]["finalizers"] = {"test/hold"};
    EXPECT_EQ(api_->call("POST", kCms, cm).code, 201);
  };
  // Background: the owner goes at once, its dependents after it.
  Json bg = api_->call("POST", kCms, configMap("bg")).body;
  owned("bg-child", bg);
  EXPECT_EQ(api_->call("DELETE", kCms + "/bg?propagationPolicy=Background").code, 200);
  EXPECT_EQ(api_->call("GET", kCms + "/bg-child").code, 404);

  // Foreground: the owner waits (foregroundDeletion) for its dependents.
  Json fg = api_->call("POST", kCms, configMap("fg")).body;
  owned("fg-child", fg, true);
  auto del = api_->call(
      "DELETE", kCms + "/fg",
      Json{{"kind", "DeleteOptions"}, {"apiVersion", "v1"}, {"propagationPolicy", "Foreground"}});
  EXPECT_EQ(del.code, 200);
  Json owner = api_->call("GET", kCms + "/fg").body;
  EXPECT_EQ(owner["metadata"]["finalizers"], Json::array({"foregroundDeletion"}));
  EXPECT_TRUE(api_->call("GET", kCms + "/fg-child").body["metadata"].contains("deletionTimestamp"));
  api_->call("PATCH", kCms + "/fg-child", Json{{"metadata", {{"finalizers", nullptr}}}},
             "application/merge-patch+json");
  EXPECT_EQ(api_->call("GET", kCms + "/fg-child").code, 404);
  EXPECT_EQ(api_->call("GET", kCms + "/fg").code, 404);

  // Orphan: dependents stay, without the owner reference.
  Json orphan = api_->call("POST", kCms, configMap("or")).body;
  owned("or-child", orphan);
  EXPECT_EQ(api_->call("DELETE", kCms + "/or?propagationPolicy=Orphan").code, 200);
  EXPECT_EQ(api_->call("GET", kCms + "/or").code, 404);
  auto child = api_->call("GET", kCms + "/or-child");
  EXPECT_EQ(child.code, 200);
  EXPECT_FALSE(child.body["metadata"].contains("ownerReferences"));
}

// The collector works from indexes (owner uid -> dependents, objects being
// deleted, candidates for orphan collection); every way of becoming garbage
// must still be seen.
TEST_F(ApiServerTest, GarbageCollectionFindsEveryDependent) {
  auto ref = [](const Json& owner) {
    return Json{{"apiVersion", "v1"},
                {"kind", owner["kind"]},
                {"name", owner["metadata"]["name"]},
                {"uid", owner["metadata"]["uid"]}};
  };
  const std::string secrets = "/api/v1/namespaces/default/secrets";
  // A chain across kinds: a -> b (Secret) -> c; deleting a takes all.
  Json a = api_->call("POST", kCms, configMap("a")).body;
  Json b = {{"apiVersion", "v1"},
            {"kind", "Secret"},
            {"metadata", {{"name", "b"}, {"ownerReferences", {ref(a)}}}}};
  b = api_->call("POST", secrets, b).body;
  Json c = configMap("c");
  c["metadata"]["ownerReferences"] = {ref(b)};
  ASSERT_EQ(api_->call("POST", kCms, c).code, 201);
  EXPECT_EQ(api_->call("DELETE", kCms + "/a").code, 200);
  EXPECT_EQ(api_->call("GET", secrets + "/b").code, 404);
  EXPECT_EQ(api_->call("GET", kCms + "/c").code, 404);

  // Two owners: the dependent stays while one is left.
  Json p1 = api_->call("POST", kCms, configMap("p1")).body;
  Json p2 = api_->call("POST", kCms, configMap("p2")).body;
  Json both = configMap("both");
  both["metadata"]["ownerReferences"] = {ref(p1), ref(p2)};
  ASSERT_EQ(api_->call("POST", kCms, both).code, 201);
  EXPECT_EQ(api_->call("DELETE", kCms + "/p1").code, 200);
  EXPECT_EQ(api_->call("GET", kCms + "/both").code, 200);
  // Orphaning p2 keeps the dependent, without p2's reference; it still
  // names p1, which is gone, so the collector takes it.
  EXPECT_EQ(api_->call("DELETE", kCms + "/p2?propagationPolicy=Orphan").code, 200);
  EXPECT_EQ(api_->call("GET", kCms + "/both").code, 404);

  // Written with (or given by a later write) a reference to an owner that
  // does not exist: collected at once.
  Json ghost = configMap("ghost-owned");
  ghost["metadata"]["ownerReferences"] = {
      {{"apiVersion", "v1"}, {"kind", "ConfigMap"}, {"name", "x"}, {"uid", "no-such-uid"}}};
  EXPECT_EQ(api_->call("POST", kCms, ghost).code, 201);
  EXPECT_EQ(api_->call("GET", kCms + "/ghost-owned").code, 404);
  Json gone = api_->call("POST", kCms, configMap("gone")).body;
  ASSERT_EQ(api_->call("POST", kCms, configMap("late-ref")).code, 201);
  EXPECT_EQ(api_->call("DELETE", kCms + "/gone").code, 200);
  EXPECT_EQ(api_->call("PATCH", kCms + "/late-ref",
                       Json{{"metadata", {{"ownerReferences", {ref(gone)}}}}},
                       "application/merge-patch+json")
                .code,
            200);
  EXPECT_EQ(api_->call("GET", kCms + "/late-ref").code, 404);

  // A dependent in another namespace than its (cluster-scoped) owner, and
  // foreground deletion through two levels.
  Json nsOwner = api_->call("POST", "/api/v1/namespaces",
                            Json{{"apiVersion", "v1"},
                                 {"kind", "Namespace"},
                                 {"metadata", {{"name", "owner-ns"}}}})
                     .body;
  Json top = api_->call("POST", kCms, configMap("top")).body;
  Json mid = configMap("mid");
  mid["metadata"]["ownerReferences"] = {ref(top)};
  mid = api_->call("POST", kCms, mid).body;
  Json leaf = configMap("leaf");
  leaf["metadata"]["ownerReferences"] = {ref(mid), ref(nsOwner)};
  leaf["metadata"]["finalizers"] = {"test/hold"};
  ASSERT_EQ(api_->call("POST", kCms, leaf).code, 201);
  EXPECT_EQ(api_->call("DELETE", kCms + "/top?propagationPolicy=Foreground").code, 200);
  EXPECT_TRUE(api_->call("GET", kCms + "/leaf").body["metadata"].contains("deletionTimestamp"));
  EXPECT_EQ(api_->call("GET", kCms + "/mid").code, 200);
  EXPECT_EQ(api_->call("GET", kCms + "/top").code, 200);
  api_->call("PATCH", kCms + "/leaf", Json{{"metadata", {{"finalizers", nullptr}}}},
             "application/merge-patch+json");
  EXPECT_EQ(api_->call("GET", kCms + "/leaf").code, 404);
  EXPECT_EQ(api_->call("GET", kCms + "/mid").code, 404);
  EXPECT_EQ(api_->call("GET", kCms + "/top").code, 404);
}

// Answers are compressed as kube-apiserver compresses them: gzip, only from
// 128 KiB, never brotli (cpp-httplib alone would brotli everything).
TEST_F(ApiServerTest, LargeAnswersAreGzippedSmallOnesNot) {
  const std::string big(4000, 'x');
  for (int i = 0; i < 40; ++i) {
    ASSERT_EQ(api_->call("POST", kCms, configMap(fmt::format("big-{}", i), {{"v", big}})).code,
              201);
  }
  httplib::Client client("127.0.0.1", server_->port());
  client.set_decompress(false);
  const httplib::Headers offer = {{"Accept-Encoding", "br, gzip, deflate"}};
  auto list = client.Get(kCms.c_str(), offer);
  ASSERT_TRUE(list);
  EXPECT_EQ(list->get_header_value("Content-Encoding"), "gzip");
  EXPECT_LT(list->body.size(), 40u * 4000u / 4);
  auto one = client.Get((kCms + "/big-0").c_str(), offer);
  ASSERT_TRUE(one);
  EXPECT_FALSE(one->has_header("Content-Encoding"));
  EXPECT_EQ(Json::parse(one->body)["data"]["v"], big);
  auto brOnly = client.Get(kCms.c_str(), {{"Accept-Encoding", "br"}});
  ASSERT_TRUE(brOnly);
  EXPECT_FALSE(brOnly->has_header("Content-Encoding"));
  EXPECT_EQ(Json::parse(brOnly->body)["items"].size(), 40u);
  // And a decompressing client reads the gzipped list.
  httplib::Client plain("127.0.0.1", server_->port());
  auto decoded = plain.Get(kCms.c_str(), offer);
  ASSERT_TRUE(decoded);
  EXPECT_EQ(Json::parse(decoded->body)["items"].size(), 40u);
}

TEST_F(ApiServerTest, NamespaceDeletionRemovesContent) {
  api_->call("POST", "/api/v1/namespaces",
             Json{{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", "tmp"}}}});
  Json held = configMap("held");
  held["metadata"]["finalizers"] = {"test/hold"};
  api_->call("POST", "/api/v1/namespaces/tmp/configmaps", held);
  api_->call("POST", "/api/v1/namespaces/tmp/configmaps", configMap("plain"));
  api_->call("DELETE", "/api/v1/namespaces/tmp");
  EXPECT_EQ(api_->call("GET", "/api/v1/namespaces/tmp").body["status"]["phase"], "Terminating");
  EXPECT_EQ(api_->call("GET", "/api/v1/namespaces/tmp/configmaps/plain").code, 404);
  EXPECT_EQ(api_->call("POST", "/api/v1/namespaces/tmp/configmaps", configMap("late")).code, 403);
  api_->call("PATCH", "/api/v1/namespaces/tmp/configmaps/held",
             Json{{"metadata", {{"finalizers", nullptr}}}}, "application/merge-patch+json");
  EXPECT_EQ(api_->call("GET", "/api/v1/namespaces/tmp").code, 404);
}

TEST_F(ApiServerTest, WatchResumesFromBookmarkWithoutLossOrDuplicates) {
  const std::string rv0 = api_->call("GET", kCms).body["metadata"]["resourceVersion"];
  for (int i = 0; i < 10; ++i) api_->call("POST", kCms, configMap(fmt::format("w{}", i)));
  const std::string last = rvOf(api_->call("GET", kCms + "/w9").body);
  // First connection: read until a bookmark at or past the last write.
  std::string bookmark;
  auto first =
      watch(fmt::format("{}?watch=1&allowWatchBookmarks=true&resourceVersion={}", kCms, rv0),
            [&](const Json& e) {
              if (e["type"] == "BOOKMARK" && std::stoull(rvOf(e["object"])) >= std::stoull(last)) {
                bookmark = rvOf(e["object"]);
                return true;
              }
              return false;
            });
  ASSERT_FALSE(bookmark.empty());
  for (int i = 10; i < 20; ++i) api_->call("POST", kCms, configMap(fmt::format("w{}", i)));
  int added = 0;
  auto second =
      watch(fmt::format("{}?watch=1&allowWatchBookmarks=true&resourceVersion={}", kCms, bookmark),
            [&](const Json& e) { return e["type"] == "ADDED" && ++added == 10; });
  std::multiset<std::string> seen;
  for (const auto* batch : {&first, &second}) {
    for (const auto& e : *batch) {
      if (e["type"] == "ADDED") seen.insert(e["object"]["metadata"]["name"]);
    }
  }
  EXPECT_EQ(seen.size(), 20u);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(seen.count(fmt::format("w{}", i)), 1u) << i;
}

TEST_F(ApiServerTest, WatchFromCompactedVersionIsGone) {
  server_->store().setRetention(5);
  const std::string rv0 = api_->call("GET", kCms).body["metadata"]["resourceVersion"];
  for (int i = 0; i < 10; ++i) api_->call("POST", kCms, configMap(fmt::format("g{}", i)));
  auto events = watch(fmt::format("{}?watch=1&resourceVersion={}", kCms, rv0),
                      [](const Json&) { return true; });
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0]["type"], "ERROR");
  EXPECT_EQ(events[0]["object"]["code"], 410);
  EXPECT_EQ(events[0]["object"]["reason"], "Expired");

  auto page = api_->call("GET", kCms + "?limit=2").body;
  api_->call("POST", kCms, configMap("after-page"));
  server_->store().compact();
  auto stale = api_->call(
      "GET", kCms + "?limit=2&continue=" + page["metadata"]["continue"].get<std::string>());
  EXPECT_EQ(stale.code, 410);
  // Without a version a watch starts with the current objects.
  int added = 0;
  watch(kCms + "?watch=1", [&](const Json& e) { return e["type"] == "ADDED" && ++added == 11; });
  EXPECT_EQ(added, 11);
}

TEST_F(ApiServerTest, WatchFiltersBySelectorAndTimesOut) {
  const std::string rv0 = api_->call("GET", kCms).body["metadata"]["resourceVersion"];
  Json cm = api_->call("POST", kCms, configMap("s", {}, {{"app", "x"}})).body;
  cm["metadata"]["labels"]["app"] = "y";
  api_->call("PUT", kCms + "/s", cm);
  auto events =
      watch(kCms + "?watch=1&timeoutSeconds=1&labelSelector=app%3Dx&resourceVersion=" + rv0,
            [](const Json&) { return false; });
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0]["type"], "ADDED");
  EXPECT_EQ(events[1]["type"], "DELETED") << "leaving the selector reads as a deletion";

  api_->call("POST", kCms, configMap("other"));
  auto byName = watch(kCms + "/s?watch=1&timeoutSeconds=1", [](const Json&) { return false; });
  ASSERT_EQ(byName.size(), 1u);
  EXPECT_EQ(byName[0]["object"]["metadata"]["name"], "s");
}

TEST_F(ApiServerTest, ServerSideApplyConflictsAndForce) {
  auto created = api_->apply(kCms + "/ssa", configMap("ssa", {{"a", "1"}, {"b", "1"}}), "alice");
  ASSERT_EQ(created.code, 201);
  ASSERT_EQ(created.body["metadata"]["managedFields"][0]["manager"], "alice");
  ASSERT_EQ(created.body["metadata"]["managedFields"][0]["operation"], "Apply");
  // Same value: shared ownership, no conflict.
  EXPECT_EQ(api_->apply(kCms + "/ssa", configMap("ssa", {{"a", "1"}}), "bob").code, 200);
  auto clash = api_->apply(kCms + "/ssa", configMap("ssa", {{"b", "2"}}), "bob");
  ASSERT_EQ(clash.code, 409);
  EXPECT_EQ(clash.body["reason"], "Conflict");
  EXPECT_EQ(clash.body["details"]["causes"][0]["reason"], "FieldManagerConflict");
  EXPECT_EQ(clash.body["details"]["causes"][0]["field"], ".data.b");
  EXPECT_NE(clash.body["message"].get<std::string>().find("conflict with \"alice\""),
            std::string::npos);
  auto forced = api_->apply(kCms + "/ssa", configMap("ssa", {{"b", "2"}}), "bob", true);
  ASSERT_EQ(forced.code, 200);
  EXPECT_EQ(forced.body["data"]["b"], "2");
  // alice stops applying "a"; bob stopped applying it too, so it goes.
  auto dropped = api_->apply(kCms + "/ssa", configMap("ssa", Json::object()), "alice");
  EXPECT_EQ(dropped.code, 200);
  EXPECT_FALSE(dropped.body["data"].contains("a"));
  EXPECT_EQ(dropped.body["data"]["b"], "2");
  // An identical apply is a no-op.
  auto again = api_->apply(kCms + "/ssa", configMap("ssa", Json::object()), "alice");
  EXPECT_EQ(rvOf(again.body), rvOf(dropped.body));
  EXPECT_EQ(
      api_->call("PATCH", kCms + "/ssa", configMap("ssa"), "application/apply-patch+yaml").code,
      400)
      << "apply needs a field manager";
  // An Update manager conflicts too.
  Json cm = again.body;
  cm["data"]["c"] = "1";
  api_->call("PUT", kCms + "/ssa?fieldManager=editor", cm);
  EXPECT_EQ(api_->apply(kCms + "/ssa", configMap("ssa", {{"c", "2"}}), "alice").code, 409);
}

TEST_F(ApiServerTest, MergeJsonAndStrategicPatches) {
  installWidgets();
  api_->call("POST", kWidgets, widget("p", 1));
  auto merged = api_->call("PATCH", kWidgets + "/p", Json{{"spec", {{"color", "red"}}}},
                           "application/merge-patch+json");
  EXPECT_EQ(merged.body["spec"], (Json{{"size", 1}, {"color", "red"}}));
  auto jp = api_->call("PATCH", kWidgets + "/p",
                       Json::array({{{"op", "replace"}, {"path", "/spec/size"}, {"value", 5}}}),
                       "application/json-patch+json");
  EXPECT_EQ(jp.body["spec"]["size"], 5);
  auto failedTest =
      api_->call("PATCH", kWidgets + "/p",
                 Json::array({{{"op", "test"}, {"path", "/spec/size"}, {"value", 1}}}),
                 "application/json-patch+json");
  EXPECT_EQ(failedTest.code, 422);
  EXPECT_EQ(api_->call("PATCH", kWidgets + "/p", Json{{"spec", {{"size", 2}}}},
                       "application/strategic-merge-patch+json")
                .code,
            415);

  const std::string deps = "/apis/apps/v1/namespaces/default/deployments";
  Json d = Json::parse(R"({"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"d"},
    "spec":{"template":{"spec":{"containers":[
      {"name":"a","image":"a:1","env":[{"name":"X","value":"1"}]},
      {"name":"b","image":"b:1"}]}}}})");
  ASSERT_EQ(api_->call("POST", deps, d).code, 201);
  auto smp = api_->call("PATCH", deps + "/d", Json::parse(R"({"spec":{"template":{"spec":{
      "$setElementOrder/containers":[{"name":"b"},{"name":"a"}],
      "containers":[{"name":"a","image":"a:2","env":[{"name":"Y","value":"2"}]},
                    {"name":"b","$patch":"delete"}]}}}})"),
                        "application/strategic-merge-patch+json");
  ASSERT_EQ(smp.code, 200);
  const Json containers = smp.body["spec"]["template"]["spec"]["containers"];
  ASSERT_EQ(containers.size(), 1u);
  EXPECT_EQ(containers[0]["image"], "a:2");
  EXPECT_EQ(containers[0]["env"].size(), 2u) << "env merges by name";
  EXPECT_EQ(smp.body["metadata"]["generation"], 2);
}

TEST_F(ApiServerTest, InjectedFaults) {
  server_->faults().failNext(1, 429, "GET", "/configmaps", 7);
  auto throttled = api_->call("GET", kCms);
  EXPECT_EQ(throttled.code, 429);
  EXPECT_EQ(throttled.body["reason"], "TooManyRequests");
  auto retry = throttled.headers.find("Retry-After");
  ASSERT_NE(retry, throttled.headers.end());
  EXPECT_EQ(retry->second, "7");
  EXPECT_EQ(api_->call("GET", kCms).code, 200);

  server_->faults().failNext(1, 500);
  auto broken = api_->call("GET", kCms);
  EXPECT_EQ(broken.code, 500);
  EXPECT_EQ(broken.body["reason"], "InternalError");

  Json cm = api_->call("POST", kCms, configMap("storm")).body;
  server_->faults().conflictNextWrites("configmaps", "default", "storm", 3);
  int conflicts = 0;
  for (int attempt = 0; attempt < 10; ++attempt) {
    cm["data"] = {{"n", std::to_string(attempt)}};
    auto r = api_->call("PUT", kCms + "/storm", cm);
    if (r.code == 409) {
      ++conflicts;
      continue;
    }
    EXPECT_EQ(r.code, 200);
    break;
  }
  EXPECT_EQ(conflicts, 3);

  server_->faults().setLatency(std::chrono::milliseconds(200));
  const auto t0 = std::chrono::steady_clock::now();
  api_->call("GET", kCms);
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(200));
  server_->faults().reset();

  std::atomic<bool> opened{false};
  std::thread dropper([&] {
    while (!opened) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    server_->faults().dropWatches();
  });
  const auto start = std::chrono::steady_clock::now();
  watch(kCms + "?watch=1", [&](const Json&) {
    opened = true;
    return false;
  });
  dropper.join();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5))
      << "a dropped stream ends long before its timeout";
}

TEST_F(ApiServerTest, DiscoveryTablesAndCrdRegistration) {
  EXPECT_EQ(api_->call("GET", "/api").body["versions"], Json::array({"v1"}));
  EXPECT_EQ(api_->call("GET", "/apis/test.geotrain.io/v1alpha1").code, 404);
  installWidgets();
  auto groups = api_->call("GET", "/apis").body["groups"];
  bool found = false;
  for (const auto& g : groups) found = found || g["name"] == "test.geotrain.io";
  EXPECT_TRUE(found);
  auto resources = api_->call("GET", "/apis/test.geotrain.io/v1alpha1").body["resources"];
  ASSERT_EQ(resources.size(), 2u);
  EXPECT_EQ(resources[0]["name"], "widgets");
  EXPECT_EQ(resources[0]["shortNames"], Json::array({"wd"}));
  EXPECT_EQ(resources[1]["name"], "widgets/status");
  auto crd = api_->call(
      "GET", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/widgets.test.geotrain.io");
  EXPECT_EQ(crd.body["status"]["conditions"][1]["type"], "Established");

  EXPECT_EQ(api_->call("GET", "/apis", nullptr, "",
                       {{"Accept",
                         "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"}})
                .code,
            406);
  EXPECT_EQ(
      api_->call("GET", kCms, nullptr, "", {{"Accept", "application/vnd.kubernetes.protobuf"}})
          .code,
      406);

  Json w = api_->call("POST", kWidgets, widget("t", 4)).body;
  w["status"] = {{"conditions", {{{"type", "Ready"}, {"status", "True"}}}}};
  api_->call("PUT", kWidgets + "/t/status", w);
  auto table =
      api_->call("GET", kWidgets, nullptr, "",
                 {{"Accept", "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"}});
  ASSERT_EQ(table.body["kind"], "Table");
  EXPECT_EQ(table.body["columnDefinitions"][1]["name"], "Size");
  EXPECT_EQ(table.body["rows"][0]["cells"], Json::array({"t", 4, "True"}));

  EXPECT_EQ(
      api_->call("DELETE",
                 "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/widgets.test.geotrain.io")
          .code,
      200);
  EXPECT_EQ(api_->call("GET", kWidgets).code, 404);
}

// A server restarted on the same state file and TLS directory -- here the
// first one is not even stopped cleanly, only dropped -- answers with every
// object it had (a custom resource's included), continues the version
// counter, presents the same CA, and sends watches from versions before the
// restart to list again (410), as a real apiserver after a restart does.
TEST(ApiServerRestart, KeepsObjectsVersionsAndCertificateAcrossARestart) {
  const auto dir =
      std::filesystem::temp_directory_path() / fmt::format("geo-apiserver-restart-{}", ::getpid());
  std::filesystem::remove_all(dir);
  ServerOptions options;
  options.tls = true;
  options.tlsDir = (dir / "tls").string();
  options.stateFile = (dir / "state.json").string();
  std::string ca, rvBefore;
  uint16_t port = 0;
  {
    TestApiServer first(options);
    first.start();
    port = first.port();
    ca = first.caPem();
    httplib::Client client(fmt::format("https://127.0.0.1:{}", port));
    client.enable_server_certificate_verification(false);
    Api api(std::move(client));
    ASSERT_EQ(
        api.call("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", widgetCrd())
            .code,
        201);
    ASSERT_EQ(api.call("POST", kWidgets, widget("kept", 7)).code, 201);
    ASSERT_EQ(api.call("POST", kCms, configMap("kept", {{"k", "v"}})).code, 201);
    rvBefore = api.call("GET", kCms).body["metadata"]["resourceVersion"];
  }
  options.port = port;
  TestApiServer second(options);
  second.start();
  EXPECT_EQ(second.caPem(), ca) << "a new CA: the kubeconfigs written before no longer trust it";
  httplib::Client client(fmt::format("https://127.0.0.1:{}", port));
  client.enable_server_certificate_verification(false);
  Api api(std::move(client));
  EXPECT_EQ(api.call("GET", kWidgets + "/kept").body["spec"]["size"], 7);
  EXPECT_EQ(api.call("GET", kCms + "/kept").body["data"]["k"], "v");
  EXPECT_EQ(api.call("GET", kCms).body["metadata"]["resourceVersion"], rvBefore);
  const Json next = api.call("POST", kCms, configMap("after")).body;
  EXPECT_GT(std::stoull(rvOf(next)), std::stoull(rvBefore));
  const auto stale = api.call("GET", kCms + "?watch=1&timeoutSeconds=1&resourceVersion=1");
  EXPECT_NE(stale.body.dump().find("410"), std::string::npos) << stale.body.dump();
  std::filesystem::remove_all(dir);
}

// Protobuf encoding helpers: a length-delimited field.
std::string pbField(int number, const std::string& payload) {
  std::string out(1, char((number << 3) | 2));
  out += char(payload.size());  // every payload here is shorter than 128 bytes
  return out + payload;
}

TEST_F(ApiServerTest, DecodesProtobufBodiesOfTypedClients) {
  const std::string meta = pbField(1, "pb");
  const std::string entry = pbField(1, "k") + pbField(2, "v");
  const std::string raw = pbField(1, meta) + pbField(2, entry);
  const std::string typeMeta = pbField(1, "v1") + pbField(2, "ConfigMap");
  const std::string body = std::string("k8s\0", 4) + pbField(1, typeMeta) + pbField(2, raw);
  httplib::Client client("127.0.0.1", server_->port());
  auto r = client.Post(kCms.c_str(), body, "application/vnd.kubernetes.protobuf");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 201) << r->body;
  EXPECT_EQ(api_->call("GET", kCms + "/pb").body["data"]["k"], "v");

  const std::string podMeta = pbField(1, "v1") + pbField(2, "Pod");
  const std::string pod = std::string("k8s\0", 4) + pbField(1, podMeta) + pbField(2, meta);
  auto refused =
      client.Post("/api/v1/namespaces/default/pods", pod, "application/vnd.kubernetes.protobuf");
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 415) << "kinds it cannot decode are refused, not guessed";
}

// A loopback HTTP server standing in for a pod (a worker's /metrics).
class FakePod {
 public:
  FakePod() {
    server_.Get("/metrics", [](const httplib::Request& req, httplib::Response& res) {
      res.set_content("geotrain_steps_total 42\n# target " + req.target + "\n",
                      "text/plain; version=0.0.4; charset=utf-8");
    });
    server_.Get("/echo/.*", [](const httplib::Request& req, httplib::Response& res) {
      res.status = 418;
      res.set_header("X-Saw-Authorization", req.has_header("Authorization") ? "yes" : "no");
      res.set_content(req.target + " accept=" + req.get_header_value("Accept"), "text/x-echo");
    });
    server_.Post("/echo/.*", [](const httplib::Request& req, httplib::Response& res) {
      res.set_content("posted " + req.body, "text/plain");
    });
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    while (!server_.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ~FakePod() {
    server_.stop();
    thread_.join();
  }
  int port() const { return port_; }

 private:
  httplib::Server server_;
  std::thread thread_;
  int port_ = 0;
};

// A loopback port nothing listens on: bound (so the kernel picks a free one),
// never listened on, released.
int closedPort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  EXPECT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  ::close(fd);
  return ntohs(addr.sin_port);
}

Json pod(const std::string& name, int containerPort = 0) {
  Json container = {{"name", "worker"}, {"image", "geotrain/worker:test"}};
  if (containerPort > 0)
    container["ports"] = {{{"name", "metrics"}, {"containerPort", containerPort}}};
  return {{"apiVersion", "v1"},
          {"kind", "Pod"},
          {"metadata", {{"name", name}}},
          {"spec", {{"containers", {container}}}}};
}

TEST_F(ApiServerTest, PodProxyForwardsToThePodIp) {
  FakePod target;
  const std::string pods = "/api/v1/namespaces/default/pods";
  ASSERT_EQ(api_->call("POST", pods, pod("worker-0", target.port())).code, 201);
  ASSERT_EQ(api_->call("PATCH", pods + "/worker-0/status", {{"status", {{"podIP", "127.0.0.1"}}}},
                       "application/merge-patch+json")
                .code,
            200);
  httplib::Client client("127.0.0.1", server_->port());
  client.set_read_timeout(10, 0);
  client.set_url_encode(false);  // send the query below byte for byte

  // Explicit port; path and query (encoded as sent) reach the pod; status,
  // Content-Type and body come back unchanged.
  const std::string base = fmt::format("{}/worker-0:{}/proxy", pods, target.port());
  auto metrics = client.Get((base + "/metrics?name%5B%5D=a+b&x=1").c_str());
  ASSERT_TRUE(metrics) << httplib::to_string(metrics.error());
  EXPECT_EQ(metrics->status, 200);
  EXPECT_EQ(metrics->get_header_value("Content-Type"), "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_EQ(metrics->body, "geotrain_steps_total 42\n# target /metrics?name%5B%5D=a+b&x=1\n");

  // The first declared containerPort when none is named; the http: form.
  for (const std::string& id :
       {std::string("worker-0"), fmt::format("http:worker-0:{}", target.port())}) {
    auto r = client.Get((pods + "/" + id + "/proxy/metrics").c_str());
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200) << id;
    EXPECT_EQ(r->body, "geotrain_steps_total 42\n# target /metrics\n") << id;
  }

  // Any upstream status passes through; request headers are forwarded.
  auto echo = client.Get((base + "/echo/a/b").c_str(), {{"Accept", "application/openmetrics-text"},
                                                        {"Authorization", "Bearer x"}});
  ASSERT_TRUE(echo);
  EXPECT_EQ(echo->status, 418);
  EXPECT_EQ(echo->get_header_value("Content-Type"), "text/x-echo");
  EXPECT_EQ(echo->body, "/echo/a/b accept=application/openmetrics-text");
  EXPECT_EQ(echo->get_header_value("X-Saw-Authorization"), "no")
      << "the apiserver's credential is not passed on";
  auto posted = client.Post((base + "/echo/p").c_str(), "payload", "text/plain");
  ASSERT_TRUE(posted);
  EXPECT_EQ(posted->status, 200);
  EXPECT_EQ(posted->body, "posted payload");

  // No path: a redirect to ".../proxy/", as the real server answers.
  auto root = client.Get((base + "?a=1").c_str());
  ASSERT_TRUE(root);
  EXPECT_EQ(root->status, 301);
  EXPECT_EQ(root->get_header_value("Location"), base + "/?a=1");

  // A missing pod is the usual 404.
  auto missing = api_->call("GET", pods + "/ghost:8080/proxy/metrics");
  EXPECT_EQ(missing.code, 404);
  EXPECT_EQ(missing.body["reason"], "NotFound");
  EXPECT_EQ(missing.body["message"], "pods \"ghost\" not found");

  // No podIP yet: the real server's 400 "address not allowed".
  ASSERT_EQ(api_->call("POST", pods, pod("pending")).code, 201);
  auto pending = api_->call("GET", pods + "/pending:8080/proxy/metrics");
  EXPECT_EQ(pending.code, 400);
  EXPECT_EQ(pending.body["reason"], "BadRequest");
  EXPECT_EQ(pending.body["message"], "address not allowed");

  // Nothing listening: 503 naming the address.
  const int closed = closedPort();
  auto refused = api_->call("GET", fmt::format("{}/worker-0:{}/proxy/metrics", pods, closed));
  EXPECT_EQ(refused.code, 503);
  EXPECT_EQ(refused.body["reason"], "ServiceUnavailable");
  EXPECT_EQ(refused.body["message"],
            fmt::format("error trying to reach service: dial tcp 127.0.0.1:{}: connect: "
                        "connection refused",
                        closed));

  // Container port names are not resolved (as on the real server), and
  // malformed ids are 400.
  auto named = api_->call("GET", pods + "/worker-0:metrics/proxy/metrics");
  EXPECT_EQ(named.code, 503);
  EXPECT_NE(named.body["message"].get<std::string>().find("unknown port"), std::string::npos);
  EXPECT_EQ(api_->call("GET", pods + "/ftp:worker-0:21/proxy/").code, 400);
  EXPECT_EQ(api_->call("GET", pods + "/a:b:c:d/proxy/").code, 400);
}

TEST(TestApiServerProxy, PodProxyNeedsTheToken) {
  ServerOptions options;
  options.token = "s3cret";
  TestApiServer server(options);
  server.start();
  httplib::Client client("127.0.0.1", server.port());
  auto anonymous = client.Get("/api/v1/namespaces/default/pods/p:80/proxy/metrics");
  ASSERT_TRUE(anonymous);
  EXPECT_EQ(anonymous->status, 401);
  client.set_bearer_token_auth("s3cret");
  auto authed = client.Get("/api/v1/namespaces/default/pods/p:80/proxy/metrics");
  ASSERT_TRUE(authed);
  EXPECT_EQ(authed->status, 404);
}

TEST(TestApiServerTls, TokenAndKubeconfig) {
  ServerOptions options;
  options.tls = true;
  options.token = "s3cret";
  TestApiServer server(options);
  server.start();
  ASSERT_NE(server.caPem().find("BEGIN CERTIFICATE"), std::string::npos);
  const std::string dir = ::testing::TempDir();
  const std::string ca = dir + "/geo-ca.pem";
  std::ofstream(ca) << server.caPem();
  httplib::SSLClient client("127.0.0.1", server.port());
  client.set_ca_cert_path(ca.c_str());
  client.enable_server_certificate_verification(true);
  auto anonymous = client.Get("/api/v1/namespaces");
  ASSERT_TRUE(anonymous) << httplib::to_string(anonymous.error());
  EXPECT_EQ(anonymous->status, 401);
  EXPECT_EQ(Json::parse(anonymous->body)["reason"], "Unauthorized");
  client.set_bearer_token_auth("s3cret");
  auto authed = client.Get("/api/v1/namespaces");
  ASSERT_TRUE(authed);
  EXPECT_EQ(authed->status, 200);
  EXPECT_EQ(Json::parse(authed->body)["items"].size(), 4u);

  const std::string kubeconfig = dir + "/geo-kubeconfig";
  server.writeKubeconfig(kubeconfig);
  std::ifstream in(kubeconfig);
  const Json config = Json::parse(in);
  EXPECT_EQ(config["clusters"][0]["cluster"]["server"], server.url());
  EXPECT_FALSE(
      config["clusters"][0]["cluster"]["certificate-authority-data"].get<std::string>().empty());
  EXPECT_EQ(config["users"][0]["user"]["token"], "s3cret");
}

TEST(TestApiServerMany, ServersAreIndependent) {
  TestApiServer hub;
  TestApiServer member;
  hub.start();
  member.start();
  EXPECT_NE(hub.port(), member.port());
  Api a(httplib::Client("127.0.0.1", hub.port()));
  Api b(httplib::Client("127.0.0.1", member.port()));
  EXPECT_EQ(a.call("POST", kCms, configMap("only-hub")).code, 201);
  EXPECT_EQ(b.call("GET", kCms + "/only-hub").code, 404);
}

}  // namespace
}  // namespace geo::testapi
