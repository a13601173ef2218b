// Key rotation without a restart (Transport::updateKeys) over real loopback
// sockets: a job's keys replaced in the three phases of docs/security.md
// while every pair keeps exchanging, and the old keys refused after it.

#include <gtest/gtest.h>

#include <array>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "common/keys/keys.h"
#include "tests/worker/transport/transport_fixture.h"
#include "worker/transport/frame.h"
#include "worker/transport/zmq_transport.h"

namespace geo::transport {
namespace {

using namespace std::chrono_literals;
using testing::pattern;
using testing::sameBytes;
using testing::World;

std::vector<std::unique_ptr<Transport>> startWorld(const World& w) {
  std::vector<std::unique_ptr<Transport>> out;
  for (uint32_t r = 0; r < w.keys.size(); ++r) {
    auto t = makeZmqTransport(w.config(r));
    EXPECT_TRUE(t.ok()) << t.status().toString();
    if (!t.ok()) return {};
    out.push_back(std::move(*t));
  }
  return out;
}

// Every rank sends every other one a message of `round`; each arrives
// intact within `limit`. As the synchronizers do after a reconnect, a
// message is sent again while it has not arrived: what a connection closed
// by a key change held is lost (delivery is at most once). Returns what
// went wrong ("" when nothing did).
std::string exchangeAll(std::vector<std::unique_ptr<Transport>>& ts, uint64_t round,
                        std::chrono::milliseconds limit) {
  const auto n = static_cast<uint32_t>(ts.size());
  const auto deadline = std::chrono::steady_clock::now() + limit;
  for (uint32_t s = 0; s < n; ++s) {
    for (uint32_t d = 0; d < n; ++d) {
      if (s == d) continue;
      while (true) {
        const Status sent =
            ts[s]->send(d, MessageKind::kUpdate, {round}, Payload(pattern(5000, s * 100 + d)), 1s);
        if (!sent.ok()) return sent.toString();
        auto m = ts[d]->receive(MessageKind::kUpdate, round, s, 300ms);
        if (m.ok()) {
          if (!sameBytes(m->payload.bytes(), pattern(5000, s * 100 + d))) return "bytes differ";
          break;
        }
        if (std::chrono::steady_clock::now() >= deadline) {
          return "round " + std::to_string(round) + ", " + std::to_string(s) + " -> " +
                 std::to_string(d) + ": " + m.status().toString();
        }
      }
      // Copies sent again that arrived after all.
      ts[d]->discard([&](const FrameHeader& h) { return h.round == round; });
    }
  }
  return "";
}

// A DEALER that speaks CURVE to `serverKey` as the holder of `own`.
zmq::socket_t curveClient(zmq::context_t& ctx, const std::string& endpoint,
                          const std::string& serverKey, const keys::CurveKeyPair& own) {
  zmq::socket_t s(ctx, zmq::socket_type::dealer);
  s.set(zmq::sockopt::linger, 0);
  s.set(zmq::sockopt::curve_serverkey, serverKey);
  s.set(zmq::sockopt::curve_publickey, own.publicKey);
  s.set(zmq::sockopt::curve_secretkey, own.secretKey);
  s.connect(endpoint);
  return s;
}

// One update frame of `bytes` from `sender`, as a peer's transport writes it.
void sendRawUpdate(zmq::socket_t& s, uint32_t sender, uint64_t round, size_t bytes) {
  const auto header = testing::headerBytes(testing::validHeader(sender, round, bytes));
  const auto payload = pattern(bytes, 7);
  s.send(zmq::buffer(header.data(), header.size()), zmq::send_flags::sndmore);
  s.send(zmq::buffer(payload.data(), payload.size()), zmq::send_flags::none);
}

uint64_t reconnects(const Transport& t) {
  uint64_t n = 0;
  for (const auto& c : t.peerCounters()) n += c.reconnects;
  return n;
}

// Rank r's key lists for every rank: `current[k]` first, then `also[k]`
// where one is given.
KeySet keySet(const std::string& secret, const std::vector<keys::CurveKeyPair>& current,
              const std::vector<keys::CurveKeyPair>& also = {}) {
  KeySet k;
  k.secretKey = secret;
  for (size_t r = 0; r < current.size(); ++r) {
    k.publicKeys.push_back({current[r].publicKey});
    if (r < also.size()) k.publicKeys.back().push_back(also[r].publicKey);
  }
  return k;
}

// Rotation in three phases, rank by rank in each as files reach workers at
// different times: (1) every rank learns the next keys and admits them,
// (2) each switches to its own next key, the others still knowing it by its
// old one first, (3) the old keys retire. Messages flow between every
// pair after every step; adding keys or retiring them makes no connection
// anew; after the overlap a connection made with an old key has its frames
// refused, and a new one is refused.
TEST(TransportKeyRotation, ThreePhasesKeepEveryPairExchanging) {
  World w(3);
  auto ts = startWorld(w);
  ASSERT_EQ(ts.size(), 3u);
  uint64_t round = 0;
  ASSERT_EQ(exchangeAll(ts, round++, 5s), "");
  std::vector<keys::CurveKeyPair> next;
  for (int r = 0; r < 3; ++r) next.push_back(keys::generateKeyPair());

  // Phase 1: the next keys admitted; nothing reconnects.
  std::vector<uint64_t> before;
  for (auto& t : ts) before.push_back(reconnects(*t));
  for (uint32_t r = 0; r < 3; ++r) {
    ASSERT_TRUE(ts[r]->updateKeys(keySet(w.keys[r].secretKey, w.keys, next)).ok());
    ASSERT_EQ(exchangeAll(ts, round++, 5s), "") << "phase 1, rank " << r;
  }
  for (uint32_t r = 0; r < 3; ++r) EXPECT_EQ(reconnects(*ts[r]), before[r]) << "rank " << r;

  // Phase 2: rank r switches; it lists every rank's next key first, the
  // ranks that have not switched yet still list its old key first.
  for (uint32_t r = 0; r < 3; ++r) {
    ASSERT_TRUE(ts[r]->updateKeys(keySet(next[r].secretKey, next, w.keys)).ok());
    ASSERT_EQ(exchangeAll(ts, round++, 10s), "") << "phase 2, rank " << r << " switched";
  }

  // A client still on rank 1's old key (admitted until phase 3) delivers.
  zmq::context_t ctx;
  zmq::socket_t stale = curveClient(ctx, w.endpoints[0], next[0].publicKey, w.keys[1]);
  sendRawUpdate(stale, 1, 1000, 100);
  ASSERT_TRUE(ts[0]->receive(MessageKind::kUpdate, 1000, 1, 5s).ok());

  // Phase 3: the old keys retire; the legitimate connections stay.
  for (auto& t : ts) before[&t - ts.data()] = reconnects(*t);
  for (uint32_t r = 0; r < 3; ++r) {
    ASSERT_TRUE(ts[r]->updateKeys(keySet(next[r].secretKey, next)).ok());
    ASSERT_EQ(exchangeAll(ts, round++, 10s), "") << "phase 3, rank " << r;
  }

  for (uint32_t r = 0; r < 3; ++r) EXPECT_EQ(reconnects(*ts[r]), before[r]) << "rank " << r;

  // The connection made with the old key: its frames are refused now.
  const uint64_t rejected = ts[0]->counters().framesRejected;
  sendRawUpdate(stale, 1, 1001, 100);
  EXPECT_FALSE(ts[0]->receive(MessageKind::kUpdate, 1001, 1, 1s).ok());
  EXPECT_GT(ts[0]->counters().framesRejected, rejected);
  EXPECT_NE(ts[0]->counters().lastRejectReason.find("retired"), std::string::npos)
      << ts[0]->counters().lastRejectReason;

  // A new connection with the old key is refused.
  const uint64_t refused = ts[0]->counters().refusedKeys;
  zmq::socket_t old = curveClient(ctx, w.endpoints[0], next[0].publicKey, w.keys[1]);
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (ts[0]->counters().refusedKeys == refused && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(10ms);
  }
  EXPECT_GT(ts[0]->counters().refusedKeys, refused) << "rank 1's old key was not refused";
  EXPECT_EQ(exchangeAll(ts, round++, 5s), "");
}

// A rank that switches before a peer has its next key is refused by it
// (the reason for phase 1), and gets through once the peer admits the key.
TEST(TransportKeyRotation, ASwitchBeforeThePeerKnowsTheKeyIsRefusedUntilItDoes) {
  World w(2);
  auto ts = startWorld(w);
  ASSERT_EQ(ts.size(), 2u);
  ASSERT_EQ(exchangeAll(ts, 0, 5s), "");
  std::vector<keys::CurveKeyPair> next = {keys::generateKeyPair(), w.keys[1]};
  const uint64_t refused = ts[1]->counters().refusedKeys;
  ASSERT_TRUE(ts[0]->updateKeys(keySet(next[0].secretKey, next, w.keys)).ok());
  ASSERT_TRUE(ts[0]->send(1, MessageKind::kUpdate, {1}, Payload(pattern(100, 1)), 1s).ok());
  EXPECT_FALSE(ts[1]->receive(MessageKind::kUpdate, 1, 0, 1500ms).ok());
  EXPECT_GT(ts[1]->counters().refusedKeys, refused);
  ASSERT_TRUE(ts[1]->updateKeys(keySet(w.keys[1].secretKey, w.keys, next)).ok());
  EXPECT_EQ(exchangeAll(ts, 2, 5s), "");
}

TEST(TransportKeyRotation, BadKeySetsAreRefusedAndTheKeysInForceStay) {
  World w(2);
  auto ts = startWorld(w);
  ASSERT_EQ(ts.size(), 2u);
  const auto other = keys::generateKeyPair();
  const auto expectRefused = [&](const KeySet& k, const std::string& text) {
    const Status s = ts[0]->updateKeys(k);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.toString();
    EXPECT_NE(s.message().find(text), std::string::npos) << s.message();
  };
  KeySet k = keySet(w.keys[0].secretKey, w.keys);
  k.publicKeys.pop_back();
  expectRefused(k, "one list per rank");
  k = keySet(w.keys[0].secretKey, w.keys);
  k.publicKeys[1].clear();
  expectRefused(k, "rank 1 has no public key");
  k = keySet(w.keys[0].secretKey, w.keys);
  k.publicKeys[1].push_back("not a key");
  expectRefused(k, "Z85");
  k = keySet(w.keys[0].secretKey, w.keys);
  k.publicKeys[1].push_back(w.keys[0].publicKey);
  expectRefused(k, "share a public key");
  expectRefused(keySet(other.secretKey, w.keys), "does not belong to rank 0");
  EXPECT_EQ(exchangeAll(ts, 0, 5s), "");
}

}  // namespace
}  // namespace geo::transport
