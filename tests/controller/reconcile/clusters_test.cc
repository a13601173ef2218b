// SecretClusters against test apiservers: member kubeconfigs read from
// Secrets of the hub, and replaced Secrets picked up while the clients are in
// use (watchSecrets).

#include "controller/reconcile/clusters.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "common/clock.h"
#include "controller/kube/config.h"
#include "tests/support/test_apiserver.h"

namespace geo::reconcile {
namespace {

namespace fs = std::filesystem;
namespace res = kube::resources;
using nlohmann::json;
using std::chrono::milliseconds;

// Polls `done` for up to 10 s.
template <typename F>
bool eventually(F done) {
  for (int i = 0; i < 1000; ++i) {
    if (done()) return true;
    std::this_thread::sleep_for(milliseconds(10));
  }
  return done();
}

class SecretClustersTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           ("geo-clusters-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
    // The member before and after: another server and another token, as
    // when a member's credentials are rotated or its API server moves.
    const std::vector<std::pair<std::unique_ptr<testapi::TestApiServer>*, std::string>> servers = {
        {&hub_, "hub-token"}, {&before_, "token-1"}, {&after_, "token-2"}};
    for (const auto& [server, token] : servers) {
      testapi::ServerOptions o;
      o.tls = true;
      o.token = token;
      *server = std::make_unique<testapi::TestApiServer>(o);
      (*server)->start();
    }
    hub_->writeKubeconfig((dir_ / "hub").string());
    hubClient_ = std::move(kube::makeKubeClient(*kube::loadKubeconfig(dir_ / "hub"))).value();
    ASSERT_TRUE(hubClient_
                    ->create(res::kNamespaces, "",
                             {{"apiVersion", "v1"},
                              {"kind", "Namespace"},
                              {"metadata", {{"name", "geotrain-system"}}}})
                    .ok());
    // A namespace that only one of the two has tells them apart.
    for (auto& [server, ns] :
         {std::pair{before_.get(), "only-before"}, std::pair{after_.get(), "only-after"}}) {
      server->writeKubeconfig((dir_ / ns).string());
      auto c = std::move(kube::makeKubeClient(*kube::loadKubeconfig(dir_ / ns))).value();
      ASSERT_TRUE(
          c->create(res::kNamespaces, "",
                    {{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", ns}}}})
              .ok());
    }
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string kubeconfig(const std::string& ns) {
    std::ifstream in(dir_ / ns);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }

  // Creates or replaces the Secret geotrain-member-tokyo.
  void storeSecret(const std::string& kubeconfigText) {
    const json secret = {{"apiVersion", "v1"},
                         {"kind", "Secret"},
                         {"metadata", {{"name", "geotrain-member-tokyo"}}},
                         {"stringData", {{"kubeconfig", kubeconfigText}}}};
    kube::PatchOptions options;
    options.fieldManager = "test";
    options.force = true;
    auto applied = hubClient_->apply(res::kSecrets, "geotrain-system", secret, options);
    ASSERT_TRUE(applied.ok()) << applied.status().toString();
  }

  bool reaches(kube::KubeClient& client, const std::string& ns) {
    return client.get(res::kNamespaces, "", ns).ok();
  }

  fs::path dir_;
  std::unique_ptr<testapi::TestApiServer> hub_, before_, after_;
  std::unique_ptr<kube::KubeClient> hubClient_;
};

TEST_F(SecretClustersTest, AReplacedSecretIsUsedWithoutARestart) {
  storeSecret(kubeconfig("only-before"));
  SecretClusters clusters(*hubClient_, "geotrain-system",
                          {{"tokyo", {"geotrain-member-tokyo", "kubeconfig"}}}, {});
  clusters.watchSecrets();
  auto tokyo = clusters.client("tokyo");
  ASSERT_TRUE(tokyo.ok()) << tokyo.status().toString();
  kube::KubeClient& member = **tokyo;
  EXPECT_TRUE(reaches(member, "only-before"));

  // A watch open on the old kubeconfig ends, as if the server had closed
  // it, so that its watcher reconnects with the new one.
  std::atomic<bool> watchEnded{false};
  std::optional<kube::ApiResult<std::monostate>> watchResult;
  kube::CancelToken stop;
  std::thread watcher([&] {
    kube::WatchOptions options;
    options.timeout = std::chrono::seconds(60);
    watchResult = member.watchOnce(
        res::kConfigMaps, "", options, [](kube::WatchEvent&&) {}, stop);
    watchEnded = true;
  });
  std::this_thread::sleep_for(milliseconds(200));

  // An unusable replacement changes nothing.
  storeSecret("not: a kubeconfig\n");
  storeSecret(kubeconfig("only-after"));
  ASSERT_TRUE(eventually([&] { return clusters.reloads("tokyo") == 1; }))
      << clusters.reloads("tokyo");
  EXPECT_EQ(*clusters.client("tokyo"), &member) << "the same client, with new credentials";
  EXPECT_TRUE(reaches(member, "only-after"));
  EXPECT_FALSE(reaches(member, "only-before"));
  EXPECT_TRUE(eventually([&] { return watchEnded.load(); }));
  stop.cancel();
  watcher.join();
  ASSERT_TRUE(watchResult);
  EXPECT_TRUE(watchResult->ok()) << watchResult->status().toString();

  // Only the data counts: a new label is no reload.
  auto labelled = hubClient_->patch(res::kSecrets, "geotrain-system", "geotrain-member-tokyo",
                                    kube::PatchType::kMerge,
                                    {{"metadata", {{"labels", {{"rotated", "yes"}}}}}});
  ASSERT_TRUE(labelled.ok());
  storeSecret(kubeconfig("only-before"));
  // Events come in order: when the data's change has been handled, the
  // label's has too.
  ASSERT_TRUE(eventually([&] { return clusters.reloads("tokyo") >= 2; }));
  EXPECT_EQ(clusters.reloads("tokyo"), 2);
  EXPECT_TRUE(reaches(member, "only-before"));
}

TEST_F(SecretClustersTest, ASecretCreatedLaterIsReadAtOnce) {
  // A retry interval far longer than the test, on a clock that stands still:
  // only the watch can explain the second call's success. The fake clock's
  // time since its epoch (24 h) is shorter than the interval, as a machine's
  // steady clock is on a machine booted less than that long ago: a "never
  // tried" stored as the epoch reads as "tried just now" there, whatever the
  // uptime of the machine running the test.
  FakeClock clock;
  SecretClusters clusters(*hubClient_, "geotrain-system",
                          {{"tokyo", {"geotrain-member-tokyo", "kubeconfig"}}}, {},
                          std::chrono::hours(48), clock);
  clusters.watchSecrets();
  auto missing = clusters.client("tokyo");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("member tokyo: Secret geotrain-system/"
                                            "geotrain-member-tokyo"),
            std::string::npos)
      << missing.status().message();
  storeSecret(kubeconfig("only-after"));
  ASSERT_TRUE(eventually([&] { return clusters.client("tokyo").ok(); }));
  EXPECT_TRUE(reaches(**clusters.client("tokyo"), "only-after"));
  EXPECT_EQ(clusters.reloads("tokyo"), 0) << "a first read is not a reload";
}

TEST_F(SecretClustersTest, AFailedMemberIsTriedAgainOnlyAfterTheInterval) {
  // Without the watch, a Secret created later is read once the retry
  // interval has passed on the clock, and not before; the very first try
  // happens at once whatever the clock says.
  FakeClock clock;
  SecretClusters clusters(*hubClient_, "geotrain-system",
                          {{"tokyo", {"geotrain-member-tokyo", "kubeconfig"}}}, {},
                          std::chrono::hours(48), clock);
  auto missing = clusters.client("tokyo");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("geotrain-member-tokyo"), std::string::npos)
      << missing.status().message();
  storeSecret(kubeconfig("only-after"));
  clock.advance(std::chrono::hours(47));
  EXPECT_FALSE(clusters.client("tokyo").ok()) << "tried again before the interval";
  clock.advance(std::chrono::hours(1));
  auto tokyo = clusters.client("tokyo");
  ASSERT_TRUE(tokyo.ok()) << tokyo.status().toString();
  EXPECT_TRUE(reaches(**tokyo, "only-after"));
}

}  // namespace
}  // namespace geo::reconcile
