// The libcurl client, watch, informer, leader election and event recorder
// against the test apiserver of tests/support/ (HTTPS with a generated CA,
// bearer token, Kubernetes semantics, fault injection), through a kubeconfig
// it writes, as the controller will use them against a real cluster.

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <thread>

#include "controller/kube/client.h"
#include "controller/kube/events.h"
#include "controller/kube/informer.h"
#include "controller/kube/leader_election.h"
#include "controller/kube/watch.h"
#include "tests/support/test_apiserver.h"

namespace geo::kube {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using std::chrono::milliseconds;

json configMap(const std::string& name, const std::string& value = "v") {
  return {{"apiVersion", "v1"},
          {"kind", "ConfigMap"},
          {"metadata", {{"name", name}, {"labels", {{"app", "geo"}}}}},
          {"data", {{"k", value}}}};
}

class KubeIntegrationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testapi::ServerOptions options;
    options.tls = true;
    options.token = "secret-token";
    options.bookmarkInterval = milliseconds(100);
    server_ = std::make_unique<testapi::TestApiServer>(options);
    server_->start();
    kubeconfig_ = fs::path(::testing::TempDir()) /
                  ("kube-it-" + std::to_string(::getpid()) + "-" +
                   ::testing::UnitTest::GetInstance()->current_test_info()->name());
    server_->writeKubeconfig(kubeconfig_.string());
    client_ = newClient();
  }
  void TearDown() override {
    client_.reset();
    server_->stop();
    fs::remove(kubeconfig_);
  }

  std::unique_ptr<KubeClient> newClient(ClientOptions options = {}) {
    auto config = loadKubeconfig(kubeconfig_);
    EXPECT_TRUE(config.ok()) << config.status().toString();
    options.retryBackoff = {milliseconds(10), milliseconds(100), 2.0, 0.5};
    auto client = makeKubeClient(*config, options);
    EXPECT_TRUE(client.ok()) << client.status().toString();
    return std::move(client).value();
  }

  std::unique_ptr<testapi::TestApiServer> server_;
  fs::path kubeconfig_;
  std::unique_ptr<KubeClient> client_;
};

TEST_F(KubeIntegrationTest, CrudWithPreconditions) {
  KubeClient& kube = *client_;
  auto created = kube.create(resources::kConfigMaps, "default", configMap("cm"));
  ASSERT_TRUE(created.ok()) << created.status().toString();
  EXPECT_FALSE(metadataField(*created, "uid").empty());
  const auto again = kube.create(resources::kConfigMaps, "default", configMap("cm"));
  ASSERT_FALSE(again.ok());
  EXPECT_TRUE(again.error().isAlreadyExists()) << again.status().toString();

  auto fetched = kube.get(resources::kConfigMaps, "default", "cm");
  ASSERT_TRUE(fetched.ok()) << fetched.status().toString();
  json changed = *fetched;
  changed["data"]["k"] = "v2";
  auto updated = kube.update(resources::kConfigMaps, "default", changed);
  ASSERT_TRUE(updated.ok()) << updated.status().toString();
  EXPECT_EQ((*updated)["data"]["k"], "v2");
  // The same stale version again: 409 Conflict, not a lost update.
  changed["data"]["k"] = "v3";
  const auto stale = kube.update(resources::kConfigMaps, "default", changed);
  ASSERT_FALSE(stale.ok());
  EXPECT_TRUE(stale.error().isConflict()) << stale.status().toString();
  EXPECT_EQ(stale.error().httpCode, 409);

  const auto missing = kube.get(resources::kConfigMaps, "default", "nope");
  EXPECT_TRUE(missing.error().isNotFound());

  DeleteOptions wrongUid;
  wrongUid.preconditionUid = "not-the-uid";
  EXPECT_TRUE(kube.remove(resources::kConfigMaps, "default", "cm", wrongUid).error().isConflict());
  DeleteOptions background;
  background.propagationPolicy = PropagationPolicy::kBackground;
  background.preconditionUid = metadataField(*updated, "uid");
  ASSERT_TRUE(kube.remove(resources::kConfigMaps, "default", "cm", background).ok());
  EXPECT_TRUE(kube.get(resources::kConfigMaps, "default", "cm").error().isNotFound());
}

TEST_F(KubeIntegrationTest, PatchesApplyAndStatus) {
  KubeClient& kube = *client_;
  ASSERT_TRUE(kube.create(resources::kConfigMaps, "default", configMap("cm")).ok());
  auto merged = kube.patch(resources::kConfigMaps, "default", "cm", PatchType::kMerge,
                           {{"data", {{"m", "1"}}}});
  ASSERT_TRUE(merged.ok()) << merged.status().toString();
  EXPECT_EQ((*merged)["data"], json({{"k", "v"}, {"m", "1"}}));
  auto patched = kube.patch(resources::kConfigMaps, "default", "cm", PatchType::kJson,
                            json::parse(R"([{"op":"remove","path":"/data/m"}])"));
  ASSERT_TRUE(patched.ok()) << patched.status().toString();
  EXPECT_EQ((*patched)["data"], json({{"k", "v"}}));
  const auto badOp = kube.patch(resources::kConfigMaps, "default", "cm", PatchType::kJson,
                                json::parse(R"([{"op":"remove","path":"/data/absent"}])"));
  EXPECT_TRUE(badOp.error().isInvalid()) << badOp.status().toString();

  // Server-side apply creates, then a second manager conflicts unless forced.
  const json job = {{"apiVersion", "batch/v1"},
                    {"kind", "Job"},
                    {"metadata", {{"name", "worker"}}},
                    {"spec", {{"parallelism", 2}, {"completions", 2}}}};
  auto applied = kube.apply(resources::kJobs, "default", job);
  ASSERT_TRUE(applied.ok()) << applied.status().toString();
  json other = job;
  other["spec"]["parallelism"] = 3;
  PatchOptions intruder;
  intruder.fieldManager = "someone-else";
  const auto conflict = kube.apply(resources::kJobs, "default", other, intruder);
  ASSERT_FALSE(conflict.ok());
  EXPECT_TRUE(conflict.error().isConflict()) << conflict.status().toString();
  intruder.force = true;
  auto forced = kube.apply(resources::kJobs, "default", other, intruder);
  ASSERT_TRUE(forced.ok()) << forced.status().toString();
  EXPECT_EQ((*forced)["spec"]["parallelism"], 3);

  // /status: only status changes, and a stale version conflicts there too.
  json withStatus = *forced;
  withStatus["status"] = {{"active", 2}};
  withStatus["spec"]["parallelism"] = 9;
  auto status = kube.updateStatus(resources::kJobs, "default", withStatus);
  ASSERT_TRUE(status.ok()) << status.status().toString();
  EXPECT_EQ((*status)["status"]["active"], 2);
  EXPECT_EQ((*status)["spec"]["parallelism"], 3);
  EXPECT_TRUE(kube.updateStatus(resources::kJobs, "default", withStatus).error().isConflict());
  PatchOptions statusPatch;
  statusPatch.subresource = "status";
  auto statusMerged = kube.patch(resources::kJobs, "default", "worker", PatchType::kMerge,
                                 {{"status", {{"succeeded", 1}}}}, statusPatch);
  ASSERT_TRUE(statusMerged.ok()) << statusMerged.status().toString();
  EXPECT_EQ((*statusMerged)["status"]["succeeded"], 1);
}

TEST_F(KubeIntegrationTest, ListAllPagesWithSelectors) {
  for (int i = 0; i < 25; ++i) {
    ASSERT_TRUE(
        client_->create(resources::kConfigMaps, "default", configMap(fmt::format("cm-{:02}", i)))
            .ok());
  }
  json unlabelled = configMap("plain");
  unlabelled["metadata"].erase("labels");
  ASSERT_TRUE(client_->create(resources::kConfigMaps, "default", unlabelled).ok());
  ListOptions options;
  options.labelSelector = "app=geo";
  options.limit = 10;
  auto all = listAll(*client_, resources::kConfigMaps, "default", options);
  ASSERT_TRUE(all.ok()) << all.status().toString();
  std::set<std::string> names;
  for (const json& item : all->items) names.insert(metadataField(item, "name"));
  EXPECT_EQ(names.size(), 25u);
  EXPECT_FALSE(names.contains("plain"));
  EXPECT_FALSE(all->resourceVersion.empty());
  auto page = client_->list(resources::kConfigMaps, "default", options);
  ASSERT_TRUE(page.ok());
  EXPECT_EQ(page->items.size(), 10u);
  EXPECT_FALSE(page->continueToken.empty());
}

TEST_F(KubeIntegrationTest, RetryAfterAndServerErrors) {
  ASSERT_TRUE(client_->create(resources::kConfigMaps, "default", configMap("cm")).ok());
  server_->faults().failNext(1, 429, "GET", "/configmaps/cm", 1);
  auto start = std::chrono::steady_clock::now();
  auto throttled = client_->get(resources::kConfigMaps, "default", "cm");
  ASSERT_TRUE(throttled.ok()) << throttled.status().toString();
  EXPECT_GE(std::chrono::steady_clock::now() - start, milliseconds(950));
  // 429 is retried for a POST too: the server did nothing.
  server_->faults().failNext(1, 429, "POST", "/configmaps", 1);
  EXPECT_TRUE(client_->create(resources::kConfigMaps, "default", configMap("cm2")).ok());
  // 500: a GET is retried, a POST is not.
  server_->faults().failNext(2, 500, "GET", "/configmaps/cm");
  EXPECT_TRUE(client_->get(resources::kConfigMaps, "default", "cm").ok());
  server_->faults().failNext(1, 500, "POST", "/configmaps");
  const auto failed = client_->create(resources::kConfigMaps, "default", configMap("cm3"));
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.error().httpCode, 500);
  // Bounded: more failures than retries surface.
  ClientOptions few;
  few.maxRetries = 2;
  auto impatient = newClient(few);
  server_->faults().failNext(5, 503, "GET", "/configmaps/cm");
  EXPECT_EQ(impatient->get(resources::kConfigMaps, "default", "cm").error().httpCode, 503);
}

TEST_F(KubeIntegrationTest, WrongTokenIsUnauthorized) {
  auto config = loadKubeconfig(kubeconfig_);
  ASSERT_TRUE(config.ok());
  config->token = TokenSource::fixed("wrong");
  auto client = std::move(makeKubeClient(*config)).value();
  EXPECT_TRUE(client->get(resources::kConfigMaps, "default", "x").error().isUnauthorized());
  config->caPem.clear();  // the generated CA is not in the system store
  client = std::move(makeKubeClient(*config)).value();
  const auto untrusted = client->get(resources::kConfigMaps, "default", "x");
  EXPECT_TRUE(untrusted.error().isTransport());
  EXPECT_EQ(untrusted.error().code, StatusCode::kFailedPrecondition);
}

// A kubeconfig whose user is an exec plugin, as EKS, GKE and AKS write them:
// a script that prints an ExecCredential. Its first token is one the server
// refuses (as a token revoked before it expired would be): the 401 makes the
// client run the plugin again and repeat the request, for a write too.
TEST_F(KubeIntegrationTest, ExecPluginCredentialsRenewedOn401) {
  for (const std::string version : {"v1", "v1beta1"}) {
    SCOPED_TRACE(version);
    const fs::path plugin = kubeconfig_.string() + "-plugin-" + version;
    const fs::path count = kubeconfig_.string() + "-count-" + version;
    std::ofstream(plugin) << "#!/bin/sh\nn=$(( $(cat " << count.string()
                          << " 2>/dev/null || echo 0) + 1 ))\necho $n > " << count.string()
                          << "\nif [ $n = 1 ]; then token=revoked; else token=$GEO_TOKEN; fi\n"
                          << R"(printf '{"apiVersion":"client.authentication.k8s.io/)" << version
                          << R"(","kind":"ExecCredential","status":{"token":"%s"}}' "$token")"
                          << "\n";
    fs::permissions(plugin, fs::perms::owner_all);
    std::ifstream in(kubeconfig_);
    json config = json::parse(in);
    config["users"][0]["user"] = {{"exec",
                                   {{"apiVersion", "client.authentication.k8s.io/" + version},
                                    {"command", plugin.string()},
                                    {"env", {{{"name", "GEO_TOKEN"}, {"value", "secret-token"}}}},
                                    {"interactiveMode", "Never"}}}};
    const fs::path execKubeconfig = kubeconfig_.string() + "-exec-" + version;
    std::ofstream(execKubeconfig) << config.dump();
    auto loaded = loadKubeconfig(execKubeconfig);
    ASSERT_TRUE(loaded.ok()) << loaded.status().toString();
    const std::shared_ptr<ExecCredentialSource> source = loaded->exec;
    ASSERT_TRUE(source);
    auto client = std::move(makeKubeClient(*loaded)).value();
    auto created = client->create(resources::kConfigMaps, "default", configMap("exec-" + version));
    ASSERT_TRUE(created.ok()) << created.status().toString();
    EXPECT_EQ(source->runs(), 2) << "a 401 with the first token, then the second";
    EXPECT_TRUE(client->get(resources::kConfigMaps, "default", "exec-" + version).ok());
    EXPECT_EQ(source->runs(), 2) << "a credential without expiry is kept";
    fs::remove(plugin);
    fs::remove(count);
    fs::remove(execKubeconfig);
  }
}

// Events arrive once each across dropped streams; a compacted version ends
// the watch with Gone.
TEST_F(KubeIntegrationTest, WatchResumesAcrossDropsAndReportsGone) {
  auto start = client_->list(resources::kConfigMaps, "default");
  ASSERT_TRUE(start.ok());
  std::mutex mu;
  std::vector<std::string> seen;
  CancelToken cancel;
  std::optional<ApiError> end;
  std::atomic<bool> finished{false};
  WatchOptions options;
  options.resourceVersion = start->resourceVersion;
  options.timeout = std::chrono::seconds(30);
  std::thread watcher([&] {
    end = watchWithResume(*client_, resources::kConfigMaps, "default", options,
                          [&](WatchEvent&& event) {
                            if (event.type == WatchEventType::kBookmark) return;
                            std::lock_guard lock(mu);
                            seen.push_back(std::string(watchEventTypeName(event.type)) + " " +
                                           metadataField(event.object, "name"));
                          },
                          cancel, {milliseconds(10), milliseconds(100), 2.0, 0.5});
    finished = true;
  });
  const auto waitFor = [&](size_t count) {
    for (int i = 0; i < 1000; ++i) {
      {
        std::lock_guard lock(mu);
        if (seen.size() >= count) return true;
      }
      std::this_thread::sleep_for(milliseconds(10));
    }
    return false;
  };
  ASSERT_TRUE(client_->create(resources::kConfigMaps, "default", configMap("a")).ok());
  ASSERT_TRUE(waitFor(1));
  server_->faults().dropWatches();
  ASSERT_TRUE(client_->create(resources::kConfigMaps, "default", configMap("b")).ok());
  ASSERT_TRUE(client_->remove(resources::kConfigMaps, "default", "a").ok());
  ASSERT_TRUE(waitFor(3));
  // Hold the watch off (its reconnects fail) while the server moves on and
  // compacts; once it gets through, its version is gone.
  server_->faults().failNext(1000000, 500, "GET", "/namespaces/default/configmaps");
  server_->faults().dropWatches();
  // The server notices a dropped watch within its 100 ms poll.
  std::this_thread::sleep_for(milliseconds(300));
  ASSERT_TRUE(client_->create(resources::kConfigMaps, "default", configMap("c")).ok());
  server_->store().compact();
  server_->faults().reset();
  // A watch that never reports Gone fails the test instead of hanging it.
  for (int i = 0; i < 1000 && !finished; ++i) std::this_thread::sleep_for(milliseconds(10));
  cancel.cancel();
  watcher.join();
  ASSERT_TRUE(end);
  EXPECT_TRUE(end->isGone()) << end->toStatus().toString();
  std::lock_guard lock(mu);
  ASSERT_GE(seen.size(), 3u);
  EXPECT_EQ(std::vector<std::string>(seen.begin(), seen.begin() + 3),
            (std::vector<std::string>{"ADDED a", "ADDED b", "DELETED a"}));
}

TEST_F(KubeIntegrationTest, WatchCancelsPromptly) {
  CancelToken cancel;
  std::thread canceller([&] {
    std::this_thread::sleep_for(milliseconds(200));
    cancel.cancel();
  });
  const auto start = std::chrono::steady_clock::now();
  WatchOptions options;
  options.timeout = std::chrono::seconds(60);
  const ApiError end = watchWithResume(
      *client_, resources::kConfigMaps, "", options, [](WatchEvent&&) {}, cancel);
  canceller.join();
  EXPECT_TRUE(end.isCancelled());
  EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(1500));
}

TEST_F(KubeIntegrationTest, InformerFollowsChangesAndRelists) {
  ASSERT_TRUE(client_->create(resources::kConfigMaps, "default", configMap("before")).ok());
  InformerOptions options;
  options.labelSelector = "app=geo";
  options.backoff = {milliseconds(10), milliseconds(100), 2.0, 0.5};
  Informer informer(*client_, resources::kConfigMaps, "default", options);
  std::mutex mu;
  std::vector<std::string> calls;
  informer.addHandlers({[&](const json& o) {
                          std::lock_guard lock(mu);
                          calls.push_back("add " + metadataField(o, "name"));
                        },
                        [&](const json&, const json& o) {
                          std::lock_guard lock(mu);
                          calls.push_back("update " + metadataField(o, "name"));
                        },
                        [&](const json& o) {
                          std::lock_guard lock(mu);
                          calls.push_back("delete " + metadataField(o, "name"));
                        }});
  informer.start();
  ASSERT_TRUE(informer.waitForSync(std::chrono::seconds(10)));
  EXPECT_NE(informer.store().get("default/before"), nullptr);
  ASSERT_TRUE(client_->create(resources::kConfigMaps, "default", configMap("during")).ok());
  ASSERT_TRUE(client_
                  ->patch(resources::kConfigMaps, "default", "before", PatchType::kMerge,
                          {{"data", {{"k", "changed"}}}})
                  .ok());
  // The informer must have seen "during" before the cut: a relist would
  // otherwise never tell it that "during" existed, and there would be no
  // delete to see (the test was flaky under load without this wait).
  bool sawDuring = false;
  for (int i = 0; i < 1000 && !sawDuring; ++i) {
    std::this_thread::sleep_for(milliseconds(5));
    const auto before = informer.store().get("default/before");
    sawDuring = informer.store().get("default/during") != nullptr && before != nullptr &&
                before->value("data", json::object()).value("k", std::string()) == "changed";
  }
  ASSERT_TRUE(sawDuring) << "the informer never saw the create and the patch";
  // Cut the informer's watch and hold it off (its reconnects fail) while
  // objects change and the server compacts: its version is then gone, so it
  // must list again and still end up with the server's state.
  server_->faults().failNext(1000000, 500, "GET", "/namespaces/default/configmaps");
  server_->faults().dropWatches();
  std::this_thread::sleep_for(milliseconds(300));  // the server's poll notices the drop
  ASSERT_TRUE(client_->remove(resources::kConfigMaps, "default", "during").ok());
  ASSERT_TRUE(client_->create(resources::kConfigMaps, "default", configMap("after")).ok());
  server_->store().compact();
  server_->faults().reset();
  bool converged = false;
  for (int i = 0; i < 500 && !converged; ++i) {
    std::this_thread::sleep_for(milliseconds(10));
    converged = informer.store().get("default/after") && !informer.store().get("default/during") &&
                informer.store().size() == 2;
  }
  EXPECT_TRUE(converged);
  EXPECT_EQ((*informer.store().get("default/before"))["data"]["k"], "changed");
  informer.stop();
  std::lock_guard lock(mu);
  EXPECT_EQ(calls.front(), "add before");
  EXPECT_NE(std::find(calls.begin(), calls.end(), "add after"), calls.end());
  EXPECT_NE(std::find(calls.begin(), calls.end(), "delete during"), calls.end());
}

LeaderElectionConfig electionConfig(std::string identity, std::atomic<int>& leading) {
  LeaderElectionConfig config;
  config.leaseNamespace = "kube-system";
  config.leaseName = "geotrain-controller";
  config.identity = std::move(identity);
  config.leaseDuration = milliseconds(1000);
  config.renewDeadline = milliseconds(600);
  config.retryPeriod = milliseconds(100);
  config.onStartedLeading = [&leading] { ++leading; };
  config.onStoppedLeading = [&leading] { --leading; };
  return config;
}

// Two candidates with their own clients: never both leaders; when the
// leader dies without releasing, the standby takes over after the lease
// expires; a leader that is cancelled releases at once.
TEST_F(KubeIntegrationTest, LeaderElectionBetweenTwoClients) {
  ClientOptions fast;
  fast.timeout = milliseconds(300);
  fast.maxRetries = 1;
  auto clientA = newClient(fast);
  auto clientB = newClient(fast);
  std::atomic<int> leadingA{0}, leadingB{0};
  LeaderElectionConfig configA = electionConfig("a", leadingA);
  configA.releaseOnCancel = false;  // "killed": no release
  LeaderElector a(*clientA, configA);
  LeaderElector b(*clientB, electionConfig("b", leadingB));
  CancelToken cancelA, cancelB;
  std::thread runA([&] { a.run(cancelA); });
  for (int i = 0; i < 300 && leadingA == 0; ++i) std::this_thread::sleep_for(milliseconds(10));
  ASSERT_EQ(leadingA, 1);
  std::atomic<bool> both{false};
  std::thread runB([&] { b.run(cancelB); });
  for (int i = 0; i < 100; ++i) {
    if (a.isLeader() && b.isLeader()) both = true;
    std::this_thread::sleep_for(milliseconds(10));
  }
  EXPECT_FALSE(both);
  EXPECT_EQ(leadingB, 0);
  EXPECT_EQ(b.observedLeader(), "a");

  const auto killed = std::chrono::steady_clock::now();
  cancelA.cancel();
  runA.join();
  for (int i = 0; i < 500 && leadingB == 0; ++i) std::this_thread::sleep_for(milliseconds(10));
  EXPECT_EQ(leadingB, 1);
  // The standby waits a full lease duration from the last renewal it saw.
  EXPECT_GE(std::chrono::steady_clock::now() - killed, milliseconds(700));
  auto lease = client_->get(resources::kLeases, "kube-system", "geotrain-controller");
  ASSERT_TRUE(lease.ok());
  EXPECT_EQ(LeaseRecord::fromLease(*lease).holderIdentity, "b");
  EXPECT_EQ(LeaseRecord::fromLease(*lease).leaseTransitions, 1);

  cancelB.cancel();
  runB.join();
  EXPECT_EQ(leadingB, 0);
  lease = client_->get(resources::kLeases, "kube-system", "geotrain-controller");
  EXPECT_EQ(LeaseRecord::fromLease(*lease).holderIdentity, "");  // released
}

TEST_F(KubeIntegrationTest, EventsArePostedAndAggregated) {
  auto job =
      client_->apply(resources::kJobs, "default",
                     {{"apiVersion", "batch/v1"}, {"kind", "Job"}, {"metadata", {{"name", "j"}}}});
  ASSERT_TRUE(job.ok()) << job.status().toString();
  {
    EventRecorder recorder(*client_, "geotrain-controller", "pod-1");
    for (int i = 0; i < 3; ++i) {
      recorder.record(ObjectReference::of(*job), EventType::kWarning, "InvalidSpec", "bad spec");
    }
    recorder.record(ObjectReference::of(*job), EventType::kNormal, "Created", "created");
    recorder.flush();
  }
  ListOptions options;
  options.fieldSelector = "involvedObject.name=j";
  auto events = listAll(*client_, resources::kEvents, "default", options);
  ASSERT_TRUE(events.ok()) << events.status().toString();
  ASSERT_EQ(events->items.size(), 2u);
  for (const json& event : events->items) {
    if (event["reason"] == "InvalidSpec") {
      EXPECT_EQ(event["count"], 3);
      EXPECT_EQ(event["type"], "Warning");
      EXPECT_EQ(event["involvedObject"]["uid"], metadataField(*job, "uid"));
    } else {
      EXPECT_EQ(event["reason"], "Created");
      EXPECT_EQ(event["count"], 1);
    }
  }
}

}  // namespace
}  // namespace geo::kube
