// Key rotation from the key files (worker/app/transport_setup.h loadKeySet,
// worker/app/key_watcher.h): what a rotation's files mean, and a watcher
// that hands every new, consistent set to a running transport.

#include "worker/app/key_watcher.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "common/keys/keys.h"
#include "tests/worker/transport/transport_fixture.h"
#include "worker/app/transport_setup.h"
#include "worker/transport/zmq_transport.h"

namespace geo::app {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

// A job of three workers on loopback, each with its keys in one folder.
class KeyFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("geo-key-files-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    for (int r = 0; r < 3; ++r) {
      pairs_.push_back(keys::generateKeyPair());
      ASSERT_TRUE(keys::writeKeyPair(pairs_.back(), dir_, "worker-" + std::to_string(r)).ok());
    }
    config_.job.id = "job";
    config_.worker.worldSize = 3;
    config_.worker.rank = 2;
    config_.worker.region = "tokyo";
    for (int r = 0; r < 3; ++r) {
      config_.transport.peers.push_back(transport::testing::tcp(transport::testing::freePort()));
    }
    config_.transport.listen =
        config_.transport.peers[2];  // not the default port: tests run at once
    config_.transport.regions = {"london", "london", "tokyo"};
    config_.transport.keyDir = dir_.string();
    config_.sync.algorithm = "dts";
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Writes `text` into `name`, next to its place first and renamed over it.
  void put(const std::string& name, const std::string& text) {
    const fs::path tmp = dir_ / (name + ".tmp");
    std::ofstream(tmp) << text;
    fs::permissions(tmp, name.ends_with(".key")
                             ? fs::perms::owner_read | fs::perms::owner_write
                             : fs::perms::owner_read | fs::perms::owner_write |
                                   fs::perms::group_read | fs::perms::others_read);
    fs::rename(tmp, dir_ / name);
  }

  fs::path dir_;
  std::vector<keys::CurveKeyPair> pairs_;
  WorkerConfig config_;
};

TEST_F(KeyFiles, ARotationsOtherPublicKeysFollowEachRanksOwn) {
  const auto next = keys::generateKeyPair();
  put("worker-1.next.pub", next.publicKey + "\n");
  put("worker-0.previous.pub", next.publicKey.substr(0, 39) + "1\n");
  auto set = loadKeySet(config_, 2);
  ASSERT_TRUE(set.ok()) << set.status().toString();
  EXPECT_EQ(set->secretKey, pairs_[2].secretKey);
  EXPECT_EQ(set->publicKeys[1], (std::vector<std::string>{pairs_[1].publicKey, next.publicKey}));
  EXPECT_EQ(set->publicKeys[0].size(), 2u);
  EXPECT_EQ(set->publicKeys[2], (std::vector<std::string>{pairs_[2].publicKey}));
}

// Mid-switch, the new secret key may be read before the new public key:
// this worker's own public key comes first, whichever file holds it.
TEST_F(KeyFiles, ThisWorkersOwnPublicKeyComesFirstWhicheverFileHoldsIt) {
  const auto next = keys::generateKeyPair();
  put("worker-2.next.pub", next.publicKey + "\n");
  put("worker-2.key", next.secretKey + "\n");
  auto set = loadKeySet(config_, 2);
  ASSERT_TRUE(set.ok()) << set.status().toString();
  EXPECT_EQ(set->publicKeys[2], (std::vector<std::string>{next.publicKey, pairs_[2].publicKey}));
  // The transport's config takes each rank's first.
  auto t = transportConfig(config_, 2);
  ASSERT_TRUE(t.ok()) << t.status().toString();
  EXPECT_EQ(t->publicKeys[2], next.publicKey);
  EXPECT_EQ(t->secretKey, next.secretKey);
}

TEST_F(KeyFiles, FilesThatDoNotAgreeAreRefusedNamingThem) {
  put("worker-2.key", keys::generateKeyPair().secretKey + "\n");
  auto set = loadKeySet(config_, 2);
  ASSERT_FALSE(set.ok());
  EXPECT_EQ(set.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(set.status().message().find("worker-2.key does not belong to worker-2.pub"),
            std::string::npos)
      << set.status().message();
  put("worker-2.key", pairs_[2].secretKey + "\n");
  put("worker-0.next.pub", "not a key\n");
  set = loadKeySet(config_, 2);
  ASSERT_FALSE(set.ok());
  EXPECT_NE(set.status().message().find("worker-0.next.pub"), std::string::npos)
      << set.status().message();
}

// A running transport takes each new set the files make; a set that does
// not load is skipped, and the next good one is taken.
TEST_F(KeyFiles, TheWatcherHandsEveryNewConsistentSetToTheTransport) {
  auto config = transportConfig(config_, 2);
  ASSERT_TRUE(config.ok()) << config.status().toString();
  auto t = transport::makeZmqTransport(std::move(*config));
  ASSERT_TRUE(t.ok()) << t.status().toString();
  KeyWatcher watcher(config_, 2, t->get(), 20ms);
  const auto applied = [&](uint64_t n) {
    for (int i = 0; i < 200 && watcher.applied() < n; ++i) std::this_thread::sleep_for(10ms);
    return watcher.applied();
  };
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(watcher.applied(), 0u);  // nothing changed
  put("worker-1.next.pub", keys::generateKeyPair().publicKey + "\n");
  EXPECT_EQ(applied(1), 1u);
  put("worker-0.next.pub", "not a key\n");
  std::this_thread::sleep_for(200ms);
  EXPECT_EQ(watcher.applied(), 1u);  // skipped: the keys in force stay
  put("worker-0.next.pub", keys::generateKeyPair().publicKey + "\n");
  EXPECT_EQ(applied(2), 2u);
  // This worker's own switch.
  const auto next = keys::generateKeyPair();
  put("worker-2.previous.pub", pairs_[2].publicKey + "\n");
  put("worker-2.key", next.secretKey + "\n");
  put("worker-2.pub", next.publicKey + "\n");
  EXPECT_GE(applied(3), 3u);
}

// Started in the middle of a rotation, a worker admits the other keys at once.
TEST_F(KeyFiles, AWorkerStartedMidRotationAdmitsTheOtherKeysAtOnce) {
  put("worker-0.next.pub", keys::generateKeyPair().publicKey + "\n");
  auto config = transportConfig(config_, 2);
  ASSERT_TRUE(config.ok()) << config.status().toString();
  auto t = transport::makeZmqTransport(std::move(*config));
  ASSERT_TRUE(t.ok()) << t.status().toString();
  KeyWatcher watcher(config_, 2, t->get(), std::chrono::hours(1));
  EXPECT_EQ(watcher.applied(), 1u);
}

}  // namespace
}  // namespace geo::app
