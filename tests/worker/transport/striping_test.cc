// Striping one payload over several data connections (TransportConfig::
// connections, frame.h kFrameFlagStriped): the receiver's StripeAssembler on
// its own, then two real transports -- over loopback, a payload crosses on
// every connection and messages keep their order; over the namespace
// network (root), connections ended by the kernel in the middle of a
// payload lose none of it.

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <regex>
#include <string>
#include <thread>

#include "tests/worker/transport/netns_fixture.h"
#include "worker/transport/buffer_pool.h"
#include "worker/transport/link.h"
#include "worker/transport/stripe_assembler.h"
#include "worker/wan/netns_network.h"

namespace geo::transport {
namespace {

using namespace std::chrono_literals;
using testing::pattern;
using testing::sameBytes;
using Clock = StripeAssembler::Clock;

// A striped chunk [offset, offset + size) of `whole`, from rank `sender`.
struct Chunked {
  FrameHeader header;
  Payload chunk;
};
Chunked chunkOf(const std::vector<std::byte>& whole, uint32_t sender, uint64_t round, size_t offset,
                size_t size) {
  FrameHeader h = testing::validHeader(sender, round, whole.size());
  h.flags = kFrameFlagStriped;
  h.payloadOffset = offset;
  return {h, Payload::copyOf(std::span<const std::byte>(whole).subspan(offset, size))};
}

StripeAssembler makeAssembler(Clock::duration stall = 5s) {
  return StripeAssembler(3, BufferPool::create(4, size_t{64} << 20), stall);
}

TEST(StripeAssembler, ChunksInAnyOrderMakeThePayloadOnceTheLastByteIsIn) {
  auto a = makeAssembler();
  const auto whole = pattern(4000, 1);
  const auto now = Clock::now();
  // The last chunk (the order point) second, the first last.
  for (size_t off : {2000, 3000, 1000}) {
    auto c = chunkOf(whole, 1, 7, off, 1000);
    auto out = a.addChunk(c.header, c.chunk, now);
    EXPECT_TRUE(out.ready.empty());
    EXPECT_TRUE(out.dropped.ok());
  }
  EXPECT_EQ(a.unfinished(), 1u);
  EXPECT_EQ(a.unfinishedBytes(), 4000u);
  auto c = chunkOf(whole, 1, 7, 0, 1000);
  auto out = a.addChunk(c.header, c.chunk, now);
  ASSERT_EQ(out.ready.size(), 1u);
  EXPECT_TRUE(sameBytes(out.ready[0].payload.bytes(), whole));
  EXPECT_EQ(out.ready[0].header.round, 7u);
  EXPECT_EQ(out.ready[0].header.payloadOffset, 0u);
  EXPECT_EQ(a.unfinished(), 0u);
  EXPECT_FALSE(a.holding());
}

TEST(StripeAssembler, AChunkSentAgainIsIgnoredBeforeAndAfterThePayloadIsWhole) {
  auto a = makeAssembler();
  const auto whole = pattern(3000, 2);
  const auto now = Clock::now();
  auto first = chunkOf(whole, 2, 1, 0, 1000);
  EXPECT_TRUE(a.addChunk(first.header, first.chunk, now).ready.empty());
  EXPECT_TRUE(a.addChunk(first.header, first.chunk, now).ready.empty());  // again: in already
  auto last = chunkOf(whole, 2, 1, 2000, 1000);
  EXPECT_TRUE(a.addChunk(last.header, last.chunk, now).ready.empty());
  auto middle = chunkOf(whole, 2, 1, 1000, 1000);
  auto out = a.addChunk(middle.header, middle.chunk, now);
  ASSERT_EQ(out.ready.size(), 1u);
  EXPECT_TRUE(sameBytes(out.ready[0].payload.bytes(), whole));
  // Its chunks again, after delivery (their connection dropped before the
  // acknowledgement left): no second payload begins.
  EXPECT_TRUE(a.addChunk(middle.header, middle.chunk, now).ready.empty());
  EXPECT_TRUE(a.addChunk(last.header, last.chunk, now).ready.empty());
  EXPECT_EQ(a.unfinished(), 0u);
  EXPECT_FALSE(a.holding());
}

TEST(StripeAssembler, AMessageAfterAnIncompletePayloadWaitsForItAndOneBeforeDoesNot) {
  auto a = makeAssembler();
  const auto whole = pattern(3000, 3);
  const auto now = Clock::now();
  // Sent before the payload: its chunks on other connections are no reason to wait.
  auto early = chunkOf(whole, 1, 5, 0, 1000);
  EXPECT_TRUE(a.addChunk(early.header, early.chunk, now).ready.empty());
  auto before = a.addOrdered(testing::validHeader(1, 4, 10), Payload(pattern(10, 4)));
  ASSERT_EQ(before.ready.size(), 1u);
  EXPECT_EQ(before.ready[0].header.round, 4u);
  // The payload's last chunk, then two messages sent after it, then the
  // chunk that was still on another connection.
  auto last = chunkOf(whole, 1, 5, 2000, 1000);
  EXPECT_TRUE(a.addChunk(last.header, last.chunk, now).ready.empty());
  EXPECT_TRUE(a.holding());
  EXPECT_TRUE(a.addOrdered(testing::validHeader(1, 6, 10), Payload(pattern(10, 6))).ready.empty());
  EXPECT_TRUE(a.addOrdered(testing::validHeader(1, 7, 10), Payload(pattern(10, 7))).ready.empty());
  // Another sender is not held up.
  EXPECT_EQ(a.addOrdered(testing::validHeader(2, 9, 10), Payload(pattern(10, 9))).ready.size(), 1u);
  auto middle = chunkOf(whole, 1, 5, 1000, 1000);
  auto out = a.addChunk(middle.header, middle.chunk, now);
  ASSERT_EQ(out.ready.size(), 3u);
  EXPECT_EQ(out.ready[0].header.round, 5u);
  EXPECT_TRUE(sameBytes(out.ready[0].payload.bytes(), whole));
  EXPECT_EQ(out.ready[1].header.round, 6u);
  EXPECT_EQ(out.ready[2].header.round, 7u);
  EXPECT_FALSE(a.holding());
}

TEST(StripeAssembler, APayloadWholeAtItsLastChunkIsDeliveredThenAndHoldsNothing) {
  auto a = makeAssembler();
  const auto whole = pattern(2000, 5);
  const auto now = Clock::now();
  auto first = chunkOf(whole, 1, 5, 0, 1000);
  EXPECT_TRUE(a.addChunk(first.header, first.chunk, now).ready.empty());
  auto last = chunkOf(whole, 1, 5, 1000, 1000);
  auto out = a.addChunk(last.header, last.chunk, now);
  ASSERT_EQ(out.ready.size(), 1u);
  EXPECT_FALSE(a.holding());
  EXPECT_EQ(a.addOrdered(testing::validHeader(1, 6, 10), Payload(pattern(10, 6))).ready.size(), 1u);
}

TEST(StripeAssembler, APayloadThatStallsIsDroppedNamingItAndWhatWaitedGoes) {
  auto a = makeAssembler(2s);
  const auto whole = pattern(3000, 6);
  const auto t0 = Clock::now();
  auto last = chunkOf(whole, 1, 8, 2000, 1000);
  EXPECT_TRUE(a.addChunk(last.header, last.chunk, t0).ready.empty());
  EXPECT_TRUE(a.addOrdered(testing::validHeader(1, 9, 10), Payload(pattern(10, 9))).ready.empty());
  auto progress = chunkOf(whole, 1, 8, 0, 1000);
  EXPECT_TRUE(a.addChunk(progress.header, progress.chunk, t0 + 1500ms).ready.empty());
  // Progress 1.5 s in: not stalled 2 s after the first chunk.
  auto early = a.expire(t0 + 2500ms);
  EXPECT_TRUE(early.dropped.ok());
  EXPECT_TRUE(early.ready.empty());
  auto out = a.expire(t0 + 3600ms);
  ASSERT_FALSE(out.dropped.ok());
  EXPECT_EQ(out.dropped.code(), StatusCode::kDataLoss);
  EXPECT_NE(out.dropped.message().find("round 8"), std::string::npos) << out.dropped.message();
  EXPECT_NE(out.dropped.message().find("rank 1"), std::string::npos) << out.dropped.message();
  EXPECT_NE(out.dropped.message().find("2000 of its bytes"), std::string::npos)
      << out.dropped.message();
  ASSERT_EQ(out.ready.size(), 1u);
  EXPECT_EQ(out.ready[0].header.round, 9u);
  EXPECT_EQ(a.unfinished(), 0u);
  EXPECT_FALSE(a.holding());
}

TEST(StripeAssembler, ConnectionsMadeAnewDropWhatHasItsPlaceAndKeepWhatHasNot) {
  auto a = makeAssembler();
  const auto stale = pattern(3000, 20), fresh = pattern(3000, 21);
  const auto now = Clock::now();
  // Its last chunk came on the old connections, one chunk never will; a
  // message behind it waits.
  auto staleLast = chunkOf(stale, 1, 3, 2000, 1000);
  EXPECT_TRUE(a.addChunk(staleLast.header, staleLast.chunk, now).ready.empty());
  EXPECT_TRUE(a.addOrdered(testing::validHeader(1, 4, 10), Payload(pattern(10, 4))).ready.empty());
  // The first chunk of a payload of the new connections, come early.
  auto freshFirst = chunkOf(fresh, 1, 5, 0, 1000);
  EXPECT_TRUE(a.addChunk(freshFirst.header, freshFirst.chunk, now).ready.empty());
  // Another sender's payload is not touched.
  auto other = chunkOf(stale, 2, 3, 2000, 1000);
  EXPECT_TRUE(a.addChunk(other.header, other.chunk, now).ready.empty());

  auto out = a.forget(1);
  ASSERT_FALSE(out.dropped.ok());
  EXPECT_NE(out.dropped.message().find("round 3"), std::string::npos) << out.dropped.message();
  EXPECT_NE(out.dropped.message().find("made anew"), std::string::npos) << out.dropped.message();
  ASSERT_EQ(out.ready.size(), 1u);
  EXPECT_EQ(out.ready[0].header.round, 4u);
  EXPECT_EQ(a.unfinished(), 2u);  // the fresh one, and the other sender's
  for (size_t off : {1000, 2000}) {
    auto c = chunkOf(fresh, 1, 5, off, 1000);
    out = a.addChunk(c.header, c.chunk, now);
  }
  ASSERT_EQ(out.ready.size(), 1u);
  EXPECT_TRUE(sameBytes(out.ready[0].payload.bytes(), fresh));
  EXPECT_TRUE(a.forget(1).dropped.ok());  // nothing left to drop
}

TEST(StripeAssembler, ASenderKeepsAtMostSoManyPayloadsUnfinished) {
  auto a = makeAssembler();
  const auto whole = pattern(2000, 7);
  const auto t0 = Clock::now();
  for (uint64_t round = 0; round < StripeAssembler::kMaxUnfinished; ++round) {
    auto c = chunkOf(whole, 1, round, 0, 1000);
    EXPECT_TRUE(a.addChunk(c.header, c.chunk, t0 + std::chrono::milliseconds(round)).dropped.ok());
  }
  EXPECT_EQ(a.unfinished(), StripeAssembler::kMaxUnfinished);
  auto c = chunkOf(whole, 1, 100, 0, 1000);
  auto out = a.addChunk(c.header, c.chunk, t0 + 1s);
  ASSERT_FALSE(out.dropped.ok());
  EXPECT_NE(out.dropped.message().find("round 0 "), std::string::npos) << out.dropped.message();
  EXPECT_EQ(a.unfinished(), StripeAssembler::kMaxUnfinished);
}

// ---- Two transports over loopback ----

// Runs a command and returns its standard output ("" when it cannot run).
std::string commandOutput(const std::string& command) {
  std::string out;
  FILE* f = ::popen(command.c_str(), "r");
  if (f == nullptr) return out;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), f)) > 0) out.append(buf.data(), n);
  ::pclose(f);
  return out;
}

int portOf(const std::string& endpoint) {
  return std::stoi(endpoint.substr(endpoint.rfind(':') + 1));
}

struct Pair {
  testing::World world{2};
  std::unique_ptr<Transport> a, b;

  explicit Pair(size_t connections, std::string link = "") {
    for (uint32_t r = 0; r < 2; ++r) {
      TransportConfig c = world.config(r);
      c.uplinkPeers = {r != 0, r != 1};  // each other's WAN peer: striping applies
      c.connections = connections;
      c.emulatedPartitions = true;  // setPartitioned cuts the pair apart
      c.reconnectAfter = 1s;
      if (!link.empty() && r == 0) {
        c.links.resize(2);
        c.links[1] = *parseLinkProfile(link);
      }
      auto made = makeZmqTransport(c);
      EXPECT_TRUE(made.ok()) << made.status().toString();
      (r == 0 ? a : b) = std::move(*made);
    }
  }
};

Status sendBytes(Transport& t, uint64_t round, const std::vector<std::byte>& bytes) {
  return t.send(1, MessageKind::kUpdate, {.round = round}, Payload(bytes), 10s);
}

TEST(Striping, MessagesArriveWholeAndInOrderWithAPayloadSpreadOverEveryConnection) {
  constexpr size_t kConnections = 4;
  Pair pair(kConnections);
  const std::string established =
      "ss -tnH state established '( dport = :" + std::to_string(portOf(pair.world.endpoints[1])) +
      " )' 2>/dev/null";
  // Every connection up first (a chunk goes to the connections that take it:
  // one still in its handshake would carry none of a transfer this short).
  const auto upBy = std::chrono::steady_clock::now() + 10s;
  while (std::chrono::steady_clock::now() < upBy) {
    const std::string up = commandOutput(established);
    if (static_cast<size_t>(std::count(up.begin(), up.end(), '\n')) >= kConnections + 1) break;
    std::this_thread::sleep_for(20ms);
  }
  std::this_thread::sleep_for(200ms);  // and their CURVE handshakes
  const auto small1 = pattern(100, 1), big2 = pattern(size_t{16} << 20, 2),
             small3 = pattern(100, 3), big4 = pattern(size_t{16} << 20, 4),
             small5 = pattern(100, 5);
  ASSERT_TRUE(sendBytes(*pair.a, 1, small1).ok());
  ASSERT_TRUE(sendBytes(*pair.a, 2, big2).ok());
  ASSERT_TRUE(sendBytes(*pair.a, 3, small3).ok());
  ASSERT_TRUE(sendBytes(*pair.a, 4, big4).ok());
  ASSERT_TRUE(sendBytes(*pair.a, 5, small5).ok());
  const std::vector<const std::vector<std::byte>*> sent = {&small1, &big2, &small3, &big4, &small5};
  std::vector<std::chrono::steady_clock::time_point> arrived;
  for (uint64_t round = 1; round <= 5; ++round) {
    auto m = pair.b->receive(MessageKind::kUpdate, round, 0, 30s);
    ASSERT_TRUE(m.ok()) << "round " << round << ": " << m.status().toString();
    EXPECT_TRUE(sameBytes(m->payload.bytes(), *sent[round - 1])) << "round " << round;
    EXPECT_EQ(m->header.flags, 0) << "the striped flag stays inside the transport";
    arrived.push_back(m->received);
  }
  // Delivered in the order sent: a message sent after a striped payload
  // never completes before it.
  EXPECT_TRUE(std::is_sorted(arrived.begin(), arrived.end()));

  // Every data connection carried a share of the 32 MiB: the kernel's own
  // count of the bytes each connection to the receiver had acknowledged.
  // The shares are not even (a connection whose queue is full is passed
  // over; the first also carries the other messages): at least a
  // twelfth of an even share each, 0.7 MB, where the probes' carry a few KB.
  const std::string ss = commandOutput(
      "ss -tinH state established '( dport = :" + std::to_string(portOf(pair.world.endpoints[1])) +
      " )' 2>/dev/null");
  if (ss.empty()) GTEST_SKIP() << "ss (iproute2) is not here to count the connections";
  std::vector<uint64_t> acked;
  const std::regex bytesAcked("bytes_acked:([0-9]+)");
  for (auto it = std::sregex_iterator(ss.begin(), ss.end(), bytesAcked);
       it != std::sregex_iterator(); ++it) {
    acked.push_back(std::stoull((*it)[1]));
  }
  std::sort(acked.rbegin(), acked.rend());
  ASSERT_GE(acked.size(), kConnections + 1) << ss;  // the data connections and the probes'
  for (size_t i = 0; i < kConnections; ++i) {
    EXPECT_GE(acked[i], (size_t{32} << 20) / (12 * kConnections))
        << "connection " << i << " carried too little of the payloads:\n"
        << ss;
  }
}

TEST(Striping, OneConnectionSendsAsBefore) {
  Pair pair(1);
  const auto big = pattern(size_t{8} << 20, 9);
  ASSERT_TRUE(sendBytes(*pair.a, 1, big).ok());
  auto m = pair.b->receive(MessageKind::kUpdate, 1, 0, 30s);
  ASSERT_TRUE(m.ok()) << m.status().toString();
  EXPECT_TRUE(sameBytes(m->payload.bytes(), big));
}

// A partition longer than reconnectAfter: both ends make all their
// connections anew (silence), the extra data connections with them, again
// and again while it lasts; afterwards a striped payload crosses.
TEST(Striping, AfterConnectionsAreMadeAnewStripedPayloadsCrossAgain) {
  Pair pair(4);
  const auto before = pattern(size_t{2} << 20, 30);
  ASSERT_TRUE(sendBytes(*pair.a, 1, before).ok());
  ASSERT_TRUE(pair.b->receive(MessageKind::kUpdate, 1, 0, 10s).ok());
  // A transport replaces connections only to a peer it has heard: one never
  // heard is left to ZeroMQ's own retries. b has heard a (the payload); a
  // hears b by a ping or the payload's acknowledgement, which on a busy
  // machine may come after the partition begins unless waited for.
  const auto hasHeard = [](Transport& t, uint32_t peer) {
    for (const PeerCounters& c : t.peerCounters()) {
      if (c.peer == peer) return c.heard;
    }
    return false;
  };
  for (auto waited = 0ms; !(hasHeard(*pair.a, 1) && hasHeard(*pair.b, 0)); waited += 10ms) {
    ASSERT_LT(waited, 10000ms) << "the two transports never heard each other";
    std::this_thread::sleep_for(10ms);
  }
  pair.a->setPartitioned(true);
  pair.b->setPartitioned(true);
  std::this_thread::sleep_for(3500ms);  // renewed at 1 s and every 1 s after
  pair.a->setPartitioned(false);
  pair.b->setPartitioned(false);
  for (const PeerCounters& c : pair.a->peerCounters()) {
    if (c.peer == 1) {
      EXPECT_GE(c.reconnects, 2u);
    }
  }
  const auto after = pattern(size_t{4} << 20, 31);
  ASSERT_TRUE(sendBytes(*pair.a, 2, after).ok());
  auto m = pair.b->receive(MessageKind::kUpdate, 2, 0, 10s);
  ASSERT_TRUE(m.ok()) << m.status().toString();
  EXPECT_TRUE(sameBytes(m->payload.bytes(), after));
}

// Over the namespace network, where the kernel's TCP holds what is in
// flight (100 Mbit/s, 50 ms round trip: about 2 MB of a payload on the
// link and in the uplink's queue at any moment), so that connections ended
// in the middle of a payload take chunks of it with them.
TEST(Striping, ConnectionsEndedByTheKernelMidPayloadLoseNothingOfIt) {
  if (Status s = wan::checkNetnsAllowed(); !s.ok()) GTEST_SKIP() << s.message();
  wan::WanShape shape;
  shape.sites = {"a", "b"};
  shape.oneWay = {{wan::Microseconds(0), wan::Microseconds(25'000)},
                  {wan::Microseconds(25'000), wan::Microseconds(0)}};
  shape.site.resize(2);
  for (auto& site : shape.site) {
    site.egressBitsPerSecond = 100e6;
    site.queue = wan::Microseconds(100'000);
  }
  auto net = wan::NetnsNetwork::create(shape, {});
  ASSERT_TRUE(net.ok()) << net.status().toString();
  testing::World world(2);
  const auto t = testing::transportsInSites(**net, world, [](uint32_t r, TransportConfig& c) {
    c.uplinkPeers = {r != 0, r != 1};
    c.connections = 4;
    c.reconnectAfter = 1s;
  });
  ASSERT_EQ(t.size(), 2u);
  // Connected, so that the payload is on the link when the connections end.
  const auto warm = pattern(1000, 10);
  ASSERT_TRUE(sendBytes(*t[0], 0, warm).ok());
  ASSERT_TRUE(t[1]->receive(MessageKind::kUpdate, 0, 0, 30s).ok());

  // 16 MiB: 1.3 s at 100 Mbit/s.
  const auto big = pattern(size_t{16} << 20, 11), after = pattern(100, 12);
  ASSERT_TRUE(sendBytes(*t[0], 1, big).ok());
  ASSERT_TRUE(sendBytes(*t[0], 2, after).ok());
  std::this_thread::sleep_for(500ms);
  // Every connection of the sender to the receiver, destroyed by the
  // sender's kernel as a reset would end them: the extra data connections,
  // the first (which carries the payload's last chunk and the message after
  // it) and the probes'.
  std::string killed;
  ASSERT_TRUE((*net)
                  ->runIn(0,
                          [&] {
                            killed = commandOutput(
                                "ss -K -tnH state established '( dport = :7000 )' 2>&1");
                          })
                  .ok());
  const auto lines = std::count(killed.begin(), killed.end(), '\n');
  if (lines == 0) GTEST_SKIP() << "the kernel destroyed no socket (no SOCK_DESTROY): " << killed;
  EXPECT_GE(lines, 5) << killed;
  auto m = t[1]->receive(MessageKind::kUpdate, 1, 0, 30s);
  ASSERT_TRUE(m.ok()) << m.status().toString();
  EXPECT_TRUE(sameBytes(m->payload.bytes(), big));
  // The message sent after it: lost with the first connection (delivery is
  // at most once for what is not striped), or after the payload.
  auto next = t[1]->receive(MessageKind::kUpdate, 2, 0, 3s);
  if (next.ok()) {
    EXPECT_TRUE(sameBytes(next->payload.bytes(), after));
    EXPECT_GE(next->received, m->received);
  }
  // The connections were made anew, and the pair works on.
  const auto more = pattern(size_t{4} << 20, 13);
  ASSERT_TRUE(sendBytes(*t[0], 3, more).ok());
  auto later = t[1]->receive(MessageKind::kUpdate, 3, 0, 30s);
  ASSERT_TRUE(later.ok()) << later.status().toString();
  EXPECT_TRUE(sameBytes(later->payload.bytes(), more));
}

TEST(Striping, ConnectionsOutsideOneToSixteenAreRefusedNamingTheField) {
  testing::World world(2);
  for (size_t n : {size_t{0}, kMaxConnections + 1}) {
    TransportConfig c = world.config(0);
    c.connections = n;
    auto made = makeZmqTransport(c);
    ASSERT_FALSE(made.ok());
    EXPECT_EQ(made.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(made.status().message().find("connections is " + std::to_string(n)),
              std::string::npos)
        << made.status().message();
  }
}

}  // namespace
}  // namespace geo::transport
