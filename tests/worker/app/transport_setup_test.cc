// The worker's transport from its configuration (worker/app/transport_setup.h):
// the link checks the schema cannot make, the key files, and the settings
// peers compare at connect time.

#include "worker/app/transport_setup.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "common/keys/keys.h"

namespace geo::app {
namespace {

namespace fs = std::filesystem;

// A job of three workers: ranks 0 and 1 in london, 2 in tokyo, with keys.
class TransportSetup : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("geo-transport-setup-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    for (int r = 0; r < 3; ++r) {
      ASSERT_TRUE(
          keys::writeKeyPair(keys::generateKeyPair(), dir_, "worker-" + std::to_string(r)).ok());
    }
    config_.job.id = "job";
    config_.worker.worldSize = 3;
    config_.worker.rank = 2;
    config_.worker.region = "tokyo";
    config_.transport.peers = {"tcp://a:7000", "none", "tcp://c:7000"};
    config_.transport.regions = {"london", "london", "tokyo"};
    config_.transport.keyDir = dir_.string();
    config_.sync.algorithm = "dts";
  }
  void TearDown() override { fs::remove_all(dir_); }

  fs::path dir_;
  WorkerConfig config_;
};

TEST(RankRegions, AreTransportRegionsOrTheWorkersOwnRegion) {
  WorkerConfig c;
  c.worker.worldSize = 3;
  c.worker.region = "ohio";
  EXPECT_EQ(rankRegions(c), (std::vector<std::string>{"ohio", "ohio", "ohio"}));
  c.transport.regions = {"a", "b", "a"};
  EXPECT_EQ(rankRegions(c), (std::vector<std::string>{"a", "b", "a"}));
}

TEST(AgreedSyncSettings, DtsWithQsgdNamesRoundsAndWireFormat) {
  WorkerConfig c;
  c.sync.algorithm = "dts";
  c.sync.period = 4;
  c.sync.delay = std::nullopt;
  c.sync.codec = "qsgd";
  c.sync.bits = 8;
  c.sync.bucket = 256;
  EXPECT_EQ(agreedSyncSettings(c),
            "sync.algorithm = dts\nsync.period = 4\nsync.delay = auto\nsync.exchange = allgather\n"
            "sync.codec = qsgd\n"
            "sync.bits = 8\nsync.bucket = 256\nsync.hierarchical = true\n"
            "sync.lanCodec = identity\n");
}

TEST(AgreedSyncSettings, AnAutoPeriodIsSpelledAuto) {
  WorkerConfig c;
  c.sync.algorithm = "dts";
  c.sync.period = std::nullopt;
  EXPECT_NE(agreedSyncSettings(c).find("sync.period = auto\n"), std::string::npos)
      << agreedSyncSettings(c);
}

TEST(AgreedSyncSettings, LeaveOutWhatTheAlgorithmAndCodecDoNotUse) {
  WorkerConfig c;
  c.sync.algorithm = "swarm";
  c.sync.swarmH = 2;
  c.sync.codec = "fp16";
  c.sync.bits = 8;  // not used by fp16: a worker may leave it at any value
  c.sync.hierarchical = false;
  c.sync.timeoutSeconds = 5;  // each worker's own
  EXPECT_EQ(agreedSyncSettings(c),
            "sync.algorithm = swarm\nsync.swarmH = 2\nsync.codec = fp16\n"
            "sync.hierarchical = false\n");
}

TEST_F(TransportSetup, BuildsEndpointsKeysLinksAndSettings) {
  config_.transport.links = {{"london-tokyo", "delay=50ms"}};
  config_.transport.uplink = "rate=100mbit";
  auto t = transportConfig(config_, 2);
  ASSERT_TRUE(t.ok()) << t.status().toString();
  EXPECT_EQ(t->rank, 2u);
  EXPECT_EQ(t->jobId, "job");
  EXPECT_EQ(t->endpoints, (std::vector<std::string>{"tcp://a:7000", "", "tcp://c:7000"}));
  ASSERT_EQ(t->publicKeys.size(), 3u);
  EXPECT_EQ(*keys::publicKeyOf(t->secretKey), t->publicKeys[2]);
  EXPECT_EQ(t->uplinkPeers, (std::vector<bool>{true, true, false}));
  ASSERT_EQ(t->links.size(), 3u);
  EXPECT_EQ(t->links[0].oneWayDelay, std::chrono::milliseconds(50));
  EXPECT_FALSE(t->links[2].shaped());
  EXPECT_TRUE(t->uplink.shaped());
  EXPECT_EQ(t->rankNames, config_.transport.regions);
  EXPECT_EQ(t->agreedSettings, agreedSyncSettings(config_));
}

TEST_F(TransportSetup, RefusesALinkBetweenRegionsTheJobDoesNotHave) {
  config_.transport.links = {{"london-paris", "delay=50ms"}};
  auto t = transportConfig(config_, 2);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(t.status().message().find("transport.links.london-paris: not two regions of this job "
                                      "joined by '-' (regions: london, tokyo)"),
            std::string::npos)
      << t.status().message();
}

TEST_F(TransportSetup, NamesTheKeyOfABadLinkProfile) {
  config_.transport.links = {{"london-tokyo", "delay=fast"}};
  auto t = transportConfig(config_, 2);
  ASSERT_FALSE(t.ok());
  EXPECT_TRUE(t.status().message().starts_with("transport.links.london-tokyo: "))
      << t.status().message();
  config_.transport.links.clear();
  config_.transport.uplink = "rate=lots";
  t = transportConfig(config_, 2);
  ASSERT_FALSE(t.ok());
  EXPECT_TRUE(t.status().message().starts_with("transport.uplink: ")) << t.status().message();
}

TEST_F(TransportSetup, NeedsPeersAndEveryKeyFile) {
  WorkerConfig noPeers = config_;
  noPeers.transport.peers.clear();
  auto t = transportConfig(noPeers, 2);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("transport.peers: empty, but a job of 3 workers"),
            std::string::npos)
      << t.status().message();

  fs::remove(dir_ / "worker-1.pub");
  t = transportConfig(config_, 2);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kNotFound);
  EXPECT_NE(t.status().message().find("worker-1.pub"), std::string::npos) << t.status().message();
}

TEST_F(TransportSetup, RefusesARankOutsideTheJob) {
  auto t = transportConfig(config_, 3);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("worker.rank: 3"), std::string::npos) << t.status().message();
}

}  // namespace
}  // namespace geo::app
