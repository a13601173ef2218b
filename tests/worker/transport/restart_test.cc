// A peer process killed (SIGKILL) and started again on the same endpoint: the
// surviving side reconnects by itself and the exchange resumes.

#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <filesystem>
#include <string>
#include <vector>

#include "common/keys/keys.h"
#include "tests/worker/transport/transport_fixture.h"
#include "worker/transport/zmq_transport.h"

extern char** environ;

namespace geo::transport {
namespace {

using namespace std::chrono_literals;

pid_t spawnPeer(const std::string& keysDir, uint64_t first, uint64_t count,
                const std::vector<std::string>& endpoints) {
  std::vector<std::string> args = {GEO_TRANSPORT_PEER_BIN, keysDir, "1", std::to_string(first),
                                   std::to_string(count)};
  args.insert(args.end(), endpoints.begin(), endpoints.end());
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  EXPECT_EQ(posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), environ), 0);
  return pid;
}

// Sends round `round` to rank 1 until its echo comes back (a frame handed to a
// connection that is just dying can be lost: delivery is at most once).
bool exchange(Transport& t, uint64_t round) {
  const auto payload = testing::pattern(1000, static_cast<uint32_t>(round));
  for (int attempt = 0; attempt < 10; ++attempt) {
    if (!t.send(1, MessageKind::kUpdate, {.round = round}, Payload(payload), 5s).ok()) return false;
    auto m = t.receive(MessageKind::kUpdate, round, 1, 2s);
    if (m.ok()) {
      return m->payload.size() == payload.size() &&
             std::memcmp(m->payload.data(), payload.data(), payload.size()) == 0;
    }
  }
  return false;
}

TEST(TransportRestart, PeerKilledAndRestartedReconnects) {
  testing::World w(2);
  const auto dir =
      std::filesystem::temp_directory_path() / ("geo-restart-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(keys::writeKeyPair(w.keys[r], dir, "rank" + std::to_string(r)).ok());
  }
  auto t = makeZmqTransport(w.config(0));
  ASSERT_TRUE(t.ok()) << t.status().toString();

  // First life: echoes rounds 1..100; we use round 1 and then kill it.
  pid_t pid = spawnPeer(dir, 1, 100, w.endpoints);
  ASSERT_TRUE(exchange(**t, 1));
  ASSERT_EQ(::kill(pid, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFSIGNALED(status));

  // Second life on the same endpoint and keys.
  pid = spawnPeer(dir, 2, 1, w.endpoints);
  EXPECT_TRUE(exchange(**t, 2));
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_GE((*t)->peerCounters()[0].reconnects, 1u);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace geo::transport
