// The ZeroMQ transport over real loopback sockets: exchange, authentication,
// malformed frames, backpressure and link emulation. (Process restarts are in
// restart_test.cc; the wire-privacy relay in wire_privacy_test.cc.)

#include <arpa/inet.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <spdlog/sinks/ostream_sink.h>
#include <sys/socket.h>
#include <unistd.h>
#include <zmq.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "common/logging.h"
#include "tests/worker/transport/transport_fixture.h"
#include "worker/transport/frame.h"
#include "worker/transport/zmq_transport.h"

namespace geo::transport {
namespace {

using namespace std::chrono_literals;
using testing::freePort;
using testing::headerBytes;
using testing::pattern;
using testing::sameBytes;
using testing::validHeader;
using testing::World;

std::vector<std::unique_ptr<Transport>> startAll(const std::vector<TransportConfig>& configs) {
  std::vector<std::unique_ptr<Transport>> out;
  for (const auto& c : configs) {
    auto t = makeZmqTransport(c);
    EXPECT_TRUE(t.ok()) << t.status().toString();
    if (!t.ok()) return {};
    out.push_back(std::move(*t));
  }
  return out;
}

std::vector<std::unique_ptr<Transport>> startWorld(const World& w) {
  std::vector<TransportConfig> configs;
  for (uint32_t r = 0; r < w.keys.size(); ++r) configs.push_back(w.config(r));
  return startAll(configs);
}

class TransportExchange : public ::testing::TestWithParam<int> {};

// Every rank sends every other rank payloads of many sizes; each arrives
// intact, with its header fields, in order per sender.
TEST_P(TransportExchange, AllPairsManySizes) {
  const int n = GetParam();
  World w(static_cast<size_t>(n));
  auto ts = startWorld(w);
  ASSERT_EQ(ts.size(), static_cast<size_t>(n));
  // Around the chunk size too: one whole chunk, one byte more (a chunk of
  // one byte follows), and three chunks.
  const std::vector<size_t> sizes = {0,
                                     1,
                                     63,
                                     64,
                                     4096,
                                     1 << 20,
                                     (3 << 20) + 7,
                                     kMaxChunkBytes,
                                     kMaxChunkBytes + 1,
                                     2 * kMaxChunkBytes + 5};
  for (int s = 0; s < n; ++s) {
    for (int d = 0; d < n; ++d) {
      if (s == d) continue;
      for (size_t i = 0; i < sizes.size(); ++i) {
        SendMeta meta{.round = i, .step = 100 + i, .codec = CodecId::kRaw};
        auto st = ts[s]->send(d, MessageKind::kUpdate, meta,
                              Payload(pattern(sizes[i], s * 1000 + d * 10 + i)), 5s);
        ASSERT_TRUE(st.ok()) << st.toString();
      }
    }
  }
  for (int d = 0; d < n; ++d) {
    for (int s = 0; s < n; ++s) {
      if (s == d) continue;
      for (size_t i = 0; i < sizes.size(); ++i) {
        auto m = ts[d]->receive(MessageKind::kUpdate, i, s, 10s);
        ASSERT_TRUE(m.ok()) << m.status().toString();
        EXPECT_EQ(m->header.sender, static_cast<uint32_t>(s));
        EXPECT_EQ(m->header.step, 100 + i);
        EXPECT_EQ(m->header.payloadBytes, sizes[i]);
        EXPECT_EQ(m->header.elementCount, sizes[i]);
        EXPECT_TRUE(sameBytes(m->payload.bytes(), pattern(sizes[i], s * 1000 + d * 10 + i)))
            << "size " << sizes[i] << " from " << s << " to " << d;
      }
    }
  }
  // Every payload was counted, with a header per chunk (pings come on top).
  uint64_t wireBytes = 0;
  for (size_t size : sizes) {
    wireBytes += size + kFrameHeaderBytes *
                            std::max<size_t>(1, (size + kMaxChunkBytes - 1) / kMaxChunkBytes);
  }
  for (int s = 0; s < n; ++s) {
    for (const auto& c : ts[s]->peerCounters()) {
      if (c.peer == static_cast<uint32_t>(s)) continue;
      EXPECT_GE(c.messagesSent, sizes.size());
      EXPECT_GE(c.bytesSent, wireBytes);
      EXPECT_GE(c.messagesReceived, sizes.size());
      EXPECT_GE(c.bytesReceived, wireBytes);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, TransportExchange, ::testing::Values(2, 4));

TEST(Transport, Exchanges256MiB) {
  World w(2);
  auto ts = startWorld(w);
  ASSERT_EQ(ts.size(), 2u);
  const size_t size = size_t{256} << 20;
  auto sent = pattern(size, 7);
  const auto expected = sent;  // the transport takes `sent`
  ASSERT_TRUE(
      ts[0]->send(1, MessageKind::kUpdate, {.round = 9}, Payload(std::move(sent)), 5s).ok());
  auto m = ts[1]->receive(MessageKind::kUpdate, 9, 0, 60s);
  ASSERT_TRUE(m.ok()) << m.status().toString();
  EXPECT_TRUE(sameBytes(m->payload.bytes(), expected));
}

TEST(Transport, ReceiveTimesOutWithAClearError) {
  World w(2);
  auto ts = startWorld(w);
  ASSERT_EQ(ts.size(), 2u);
  auto m = ts[0]->receive(MessageKind::kUpdate, 3, 1, 50ms);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(m.status().message().find("no update message for round 3 from rank 1"),
            std::string::npos)
      << m.status().message();
}

TEST(Transport, RejectsBadConfigurations) {
  World w(2);
  auto c = w.config(0);
  c.rank = 5;
  EXPECT_NE(makeZmqTransport(c).status().message().find("rank 5 is out of range"),
            std::string::npos);
  c = w.config(0);
  c.secretKey = w.keys[1].secretKey;
  EXPECT_NE(makeZmqTransport(c).status().message().find("secretKey does not belong"),
            std::string::npos);
  c = w.config(0);
  c.publicKeys[1] = c.publicKeys[0];
  EXPECT_NE(makeZmqTransport(c).status().message().find("repeats another rank's key"),
            std::string::npos);
  c = w.config(0);
  c.encrypt = false;
  EXPECT_NE(makeZmqTransport(c).status().message().find("never sends plaintext"),
            std::string::npos);
  // An endpoint already bound by someone else.
  auto first = makeZmqTransport(w.config(0));
  ASSERT_TRUE(first.ok());
  auto again = makeZmqTransport(w.config(0));
  ASSERT_FALSE(again.ok());
  EXPECT_NE(again.status().message().find("cannot bind"), std::string::npos);
}

TEST(Transport, SendToSelfOrUnknownRankIsInvalid) {
  World w(2);
  auto ts = startWorld(w);
  ASSERT_EQ(ts.size(), 2u);
  EXPECT_EQ(ts[0]->send(0, MessageKind::kUpdate, {}, Payload(), 1s).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(ts[0]->send(7, MessageKind::kUpdate, {}, Payload(), 1s).code(),
            StatusCode::kInvalidArgument);
}

// Two regions of two ranks where, as in a cluster, only the leaders (0 and 2)
// are reachable across regions: the members 1 and 3 have no endpoint for the
// other region's member. Reachable pairs exchange; sending to an unreachable
// rank is refused at once; nobody ever connects there (no bytes, no pings).
TEST(Transport, RanksWithoutEndpointAreNeverContacted) {
  World w(4);
  std::vector<TransportConfig> configs;
  for (uint32_t r = 0; r < 4; ++r) configs.push_back(w.config(r));
  configs[1].endpoints[3].clear();
  configs[3].endpoints[1].clear();
  auto ts = startAll(configs);
  ASSERT_EQ(ts.size(), 4u);
  const std::vector<std::byte> body = pattern(1000, 7);
  for (auto [from, to] : {std::pair{0u, 1u}, {1u, 0u}, {0u, 2u}, {2u, 3u}, {3u, 0u}}) {
    ASSERT_TRUE(
        ts[from]
            ->send(to, MessageKind::kUpdate, {1, 0}, Payload(std::vector<std::byte>(body)), 1s)
            .ok())
        << from << " -> " << to;
    auto m = ts[to]->receive(MessageKind::kUpdate, 1, from, 5s);
    ASSERT_TRUE(m.ok()) << m.status().toString();
    EXPECT_TRUE(sameBytes(m->payload.bytes(), body));
  }
  const Status refused = ts[1]->send(3, MessageKind::kUpdate, {1, 0}, Payload(), 1s);
  EXPECT_EQ(refused.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.message().find("rank 3 has no endpoint at rank 1"), std::string::npos)
      << refused.message();
  std::this_thread::sleep_for(500ms);  // a few ping intervals
  for (auto [a, b] : {std::pair{1u, 3u}, {3u, 1u}}) {
    for (const auto& p : ts[a]->peerCounters()) {
      if (p.peer != b) continue;
      EXPECT_EQ(p.bytesSent, 0u) << a << " -> " << b;
      EXPECT_EQ(p.bytesReceived, 0u) << a << " <- " << b;
    }
  }
  // This rank's own endpoint cannot be missing (it is where it binds).
  auto c = w.config(0);
  c.endpoints[0].clear();
  EXPECT_NE(makeZmqTransport(c).status().message().find("endpoints[0] (this rank) is empty"),
            std::string::npos);
}

// With the peer absent, the bounded queue fills and send() reports
// backpressure instead of buffering without limit.
TEST(Transport, FullQueueGivesBackpressure) {
  World w(2);
  auto c = w.config(0);
  c.maxQueuedBytesPerPeer = 1 << 20;
  auto t = makeZmqTransport(c);
  ASSERT_TRUE(t.ok());
  Status st;
  int accepted = 0;
  for (int i = 0; i < 100 && st.ok(); ++i) {
    st = (*t)->send(1, MessageKind::kUpdate, {}, Payload(pattern(256 << 10, i)), 100ms);
    if (st.ok()) ++accepted;
  }
  EXPECT_EQ(st.code(), StatusCode::kDeadlineExceeded) << st.toString();
  EXPECT_NE(st.message().find("send queue to rank 1 stayed full"), std::string::npos);
  EXPECT_GE(accepted, 3);
  EXPECT_LE(accepted, 5);
  EXPECT_LE((*t)->peerCounters()[0].queuedBytes, (1u << 20) + (256u << 10) + 64);
}

// A raw ZeroMQ client, to speak to a transport as an outsider would.
struct RawClient {
  zmq::context_t ctx;
  zmq::socket_t sock{ctx, zmq::socket_type::dealer};

  RawClient(const std::string& endpoint, const std::string& serverKey,
            const std::optional<keys::CurveKeyPair>& own) {
    sock.set(zmq::sockopt::linger, 0);
    if (own) {
      sock.set(zmq::sockopt::curve_serverkey, serverKey);
      sock.set(zmq::sockopt::curve_publickey, own->publicKey);
      sock.set(zmq::sockopt::curve_secretkey, own->secretKey);
    }
    sock.connect(endpoint);
  }

  void sendFrames(const std::vector<std::vector<std::byte>>& frames) {
    for (size_t i = 0; i < frames.size(); ++i) {
      sock.send(zmq::buffer(frames[i].data(), frames[i].size()),
                i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
    }
  }
};

template <typename Pred>
bool eventually(Pred pred, std::chrono::milliseconds limit = 5s) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end) {
    if (pred()) return true;
    std::this_thread::sleep_for(10ms);
  }
  return pred();
}

TEST(TransportSecurity, KeyNotOnTheAllowlistCannotDeliverAndIsCounted) {
  World w(2);
  auto t = makeZmqTransport(w.config(0));
  ASSERT_TRUE(t.ok());
  const keys::CurveKeyPair intruder = keys::generateKeyPair();
  RawClient client(w.endpoints[0], w.keys[0].publicKey, intruder);
  const auto payload = pattern(100, 1);
  client.sendFrames({headerBytes(validHeader(1, 1, 100)), payload});
  EXPECT_TRUE(eventually([&] { return (*t)->counters().refusedKeys >= 1; }));
  EXPECT_EQ((*t)->receive(MessageKind::kUpdate, 1, kAnyPeer, 300ms).status().code(),
            StatusCode::kDeadlineExceeded);
  EXPECT_EQ((*t)->counters().framesRejected, 0u);  // nothing even reached the decoder
}

TEST(TransportSecurity, ClientWithoutCurveIsRefused) {
  World w(2);
  auto t = makeZmqTransport(w.config(0));
  ASSERT_TRUE(t.ok());
  RawClient client(w.endpoints[0], "", std::nullopt);
  client.sendFrames({headerBytes(validHeader(1, 1, 10)), pattern(10, 1)});
  EXPECT_TRUE(eventually([&] { return (*t)->counters().handshakeFailures >= 1; }));
  EXPECT_EQ((*t)->receive(MessageKind::kUpdate, 1, kAnyPeer, 300ms).status().code(),
            StatusCode::kDeadlineExceeded);
}

// An authenticated peer (rank 1's key) sending malformed frames: each is
// rejected with a reason, and the endpoint keeps serving.
TEST(TransportSecurity, MalformedFramesAreRejectedAndServingContinues) {
  World w(2);
  auto t = makeZmqTransport(w.config(0));
  ASSERT_TRUE(t.ok());
  RawClient client(w.endpoints[0], w.keys[0].publicKey, w.keys[1]);

  struct Case {
    std::vector<std::vector<std::byte>> frames;
    std::string reason;
  };
  FrameHeader wrongVersion = validHeader(1, 1, 4);
  auto wrongVersionBytes = headerBytes(wrongVersion);
  wrongVersionBytes[4] = std::byte{9};
  FrameHeader otherJob = validHeader(1, 1, 4);
  otherJob.jobHash = jobIdHash("another-job");
  FrameHeader oversized = validHeader(1, 1, 4);
  oversized.payloadBytes = uint64_t{1} << 40;
  FrameHeader spoofed = validHeader(0, 1, 4);  // claims to be rank 0
  FrameHeader outOfRange = validHeader(5, 1, 4);
  FrameHeader pastTheEnd = validHeader(1, 1, 4);
  pastTheEnd.payloadOffset = 2;
  FrameHeader noStart = validHeader(1, 1, 8);
  noStart.payloadOffset = 4;
  const std::vector<Case> cases = {
      {{pattern(10, 1)}, "expected a header frame and a chunk frame, got 1"},
      {{pattern(30, 2), pattern(4, 2)}, "header"},
      {{wrongVersionBytes, pattern(4, 3)}, "version"},
      {{headerBytes(otherJob), pattern(4, 4)}, "job"},
      {{headerBytes(oversized), pattern(4, 5)}, "payload"},
      {{headerBytes(spoofed), pattern(4, 6)}, "authenticated as 1"},
      {{headerBytes(outOfRange), pattern(4, 7)}, "sender"},
      {{headerBytes(validHeader(1, 1, 4)), pattern(4, 8), pattern(4, 8)}, "got 3 frame(s)"},
      {{headerBytes(pastTheEnd), pattern(4, 9)}, "does not fit"},
      {{headerBytes(noStart), pattern(4, 10)}, "no payload in progress"},
  };
  uint64_t rejected = 0;
  for (const auto& c : cases) {
    client.sendFrames(c.frames);
    ++rejected;
    ASSERT_TRUE(eventually([&] { return (*t)->counters().framesRejected >= rejected; }))
        << c.reason;
    EXPECT_NE((*t)->counters().lastRejectReason.find(c.reason), std::string::npos)
        << "expected '" << c.reason << "' in: " << (*t)->counters().lastRejectReason;
  }
  // Still serving: a valid frame from the same connection is delivered.
  const auto payload = pattern(4, 99);
  client.sendFrames({headerBytes(validHeader(1, 42, 4)), payload});
  auto m = (*t)->receive(MessageKind::kUpdate, 42, 1, 5s);
  ASSERT_TRUE(m.ok()) << m.status().toString();
  EXPECT_TRUE(sameBytes(m->payload.bytes(), payload));
}

// The chunked wire format as frame.h documents it, written by hand: a
// payload in chunks of any size, each [header with its payloadOffset][chunk],
// arrives whole; an unfinished one is dropped when the next begins.
TEST(TransportSecurity, ChunksWrittenByHandArriveAsOnePayload) {
  World w(2);
  auto t = makeZmqTransport(w.config(0));
  ASSERT_TRUE(t.ok());
  RawClient client(w.endpoints[0], w.keys[0].publicKey, w.keys[1]);
  const auto payload = pattern(1000, 5);
  auto sendChunk = [&](uint64_t round, uint64_t offset, uint64_t size) {
    FrameHeader h = validHeader(1, round, payload.size());
    h.payloadOffset = offset;
    client.sendFrames({headerBytes(h), std::vector<std::byte>(payload.begin() + offset,
                                                              payload.begin() + offset + size)});
  };
  sendChunk(7, 0, 100);
  sendChunk(7, 100, 899);
  sendChunk(7, 999, 1);
  auto m = (*t)->receive(MessageKind::kUpdate, 7, 1, 5s);
  ASSERT_TRUE(m.ok()) << m.status().toString();
  EXPECT_TRUE(sameBytes(m->payload.bytes(), payload));
  EXPECT_EQ(m->header.payloadBytes, 1000u);

  sendChunk(8, 0, 500);  // never finished
  sendChunk(9, 0, 1000);
  m = (*t)->receive(MessageKind::kUpdate, 9, 1, 5s);
  ASSERT_TRUE(m.ok()) << m.status().toString();
  EXPECT_TRUE(sameBytes(m->payload.bytes(), payload));
  EXPECT_EQ((*t)->counters().framesRejected, 1u);
  EXPECT_NE((*t)->counters().lastRejectReason.find("round 8 from rank 1 ended after 500 of 1000"),
            std::string::npos)
      << (*t)->counters().lastRejectReason;
  EXPECT_FALSE((*t)->receive(MessageKind::kUpdate, 8, 1, 100ms).ok());

  // A lost chunk breaks its payload: reported once, the rest dropped
  // quietly, and the next payload arrives.
  sendChunk(10, 0, 100);
  sendChunk(10, 500, 499);  // [100, 500) was lost
  sendChunk(10, 999, 1);
  sendChunk(11, 0, 1000);
  m = (*t)->receive(MessageKind::kUpdate, 11, 1, 5s);
  ASSERT_TRUE(m.ok()) << m.status().toString();
  EXPECT_TRUE(sameBytes(m->payload.bytes(), payload));
  EXPECT_EQ((*t)->counters().framesRejected, 2u);
  EXPECT_NE((*t)->counters().lastRejectReason.find("next offset 100"), std::string::npos)
      << (*t)->counters().lastRejectReason;
  EXPECT_FALSE((*t)->receive(MessageKind::kUpdate, 10, 1, 100ms).ok());
}

// ---- Hostile clients: counted, and logged rate-limited ----

// Collects what the "geo" logger writes while it exists.
class LogCapture {
 public:
  LogCapture() : sink_(std::make_shared<spdlog::sinks::ostream_sink_mt>(text_)) {
    logger()->sinks().push_back(sink_);
  }
  ~LogCapture() {
    auto& sinks = logger()->sinks();
    sinks.erase(std::remove(sinks.begin(), sinks.end(), sink_), sinks.end());
  }
  LogCapture(const LogCapture&) = delete;
  LogCapture& operator=(const LogCapture&) = delete;

  // Lines that contain `needle`.
  std::vector<std::string> lines(const std::string& needle) {
    sink_->flush();
    std::vector<std::string> out;
    std::istringstream in(text_.str());
    for (std::string line; std::getline(in, line);) {
      if (line.find(needle) != std::string::npos) out.push_back(line);
    }
    return out;
  }

 private:
  std::ostringstream text_;
  std::shared_ptr<spdlog::sinks::ostream_sink_mt> sink_;
};

int portOf(const std::string& endpoint) {
  return std::stoi(endpoint.substr(endpoint.rfind(':') + 1));
}

// A plain TCP client: connects to 127.0.0.1:port, writes `bytes` (maybe
// none), then either closes at once or holds the connection until close().
class TcpClient {
 public:
  explicit TcpClient(int port) : fd_(::socket(AF_INET, SOCK_STREAM, 0)) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  }
  ~TcpClient() { close(); }
  TcpClient(const TcpClient&) = delete;
  TcpClient& operator=(const TcpClient&) = delete;

  bool connected() const { return connected_; }
  void write(const std::string& bytes) {
    if (bytes.empty()) return;
    ASSERT_EQ(::write(fd_, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
  }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_;
  bool connected_ = false;
};

// Whatever a stranger sends that is not a ZMTP handshake with CURVE -- an
// HTTP request, nothing, random bytes, a ZMTP greeting gone wrong -- is one
// handshake failure per connection: in the counters (and so in
// geotrain_transport_refused_total{reason="handshake"}) and, rate-limited,
// in the log. A peer that completed its handshake is never counted, not
// even when it goes away.
TEST(TransportSecurity, JunkConnectionsAreCountedAndLoggedRateLimited) {
  LogCapture log;
  World w(2);
  auto ts = startWorld(w);
  ASSERT_EQ(ts.size(), 2u);
  ASSERT_TRUE(ts[1]->send(0, MessageKind::kUpdate, {1, 0}, Payload(pattern(8, 1)), 5s).ok());
  ASSERT_TRUE(ts[0]->receive(MessageKind::kUpdate, 1, 1, 5s).ok());
  EXPECT_EQ(ts[0]->counters().handshakeFailures, 0u);

  std::string garbage(64, '\0');
  for (size_t i = 0; i < garbage.size(); ++i) garbage[i] = static_cast<char>(i * 37 + 11);
  std::string badGreeting("\xff\0\0\0\0\0\0\0\x01\x7f\x03\x00NULL", 16);
  badGreeting += std::string(48, '\x5a');
  const std::vector<std::string> junk = {"GET / HTTP/1.1\r\nHost: x\r\n\r\n", "", garbage,
                                         badGreeting};
  const int port = portOf(w.endpoints[0]);
  constexpr uint64_t kConnections = 24;
  for (uint64_t i = 0; i < kConnections; ++i) {
    TcpClient client(port);
    ASSERT_TRUE(client.connected());
    client.write(junk[i % junk.size()]);
    std::this_thread::sleep_for(20ms);  // the server reads before the client closes
  }
  EXPECT_TRUE(eventually([&] { return ts[0]->counters().handshakeFailures >= kConnections; }))
      << ts[0]->counters().handshakeFailures;
  std::this_thread::sleep_for(300ms);
  EXPECT_EQ(ts[0]->counters().handshakeFailures, kConnections) << "each counted exactly once";
  EXPECT_EQ(ts[0]->counters().refusedKeys, 0u);

  // The peer that completed its handshake goes away: not a failure.
  ts[1].reset();
  std::this_thread::sleep_for(500ms);
  EXPECT_EQ(ts[0]->counters().handshakeFailures, kConnections);

  const auto lines = log.lines("transport rank 0: failed handshake #");
  ASSERT_EQ(lines.size(), 10u) << "the first 10 are logged, then every 1000th";
  EXPECT_NE(lines.back().find("failed handshake #10:"), std::string::npos) << lines.back();
  EXPECT_NE(lines.back().find("from now on only every 1000th"), std::string::npos) << lines.back();
}

// A junk connection that is open while a peer completes its handshake (so
// that ZeroMQ's success event could be either's) is still counted once it
// closes, and the peer is not.
TEST(TransportSecurity, JunkDuringAPeersHandshakeIsCountedOnce) {
  World w(2);
  auto t0 = makeZmqTransport(w.config(0));
  ASSERT_TRUE(t0.ok());
  TcpClient stranger(portOf(w.endpoints[0]));
  ASSERT_TRUE(stranger.connected());
  std::this_thread::sleep_for(100ms);
  auto t1 = makeZmqTransport(w.config(1));
  ASSERT_TRUE(t1.ok());
  ASSERT_TRUE((*t1)->send(0, MessageKind::kUpdate, {1, 0}, Payload(pattern(8, 1)), 5s).ok());
  ASSERT_TRUE((*t0)->receive(MessageKind::kUpdate, 1, 1, 5s).ok());
  stranger.write("GET / HTTP/1.1\r\n\r\n");
  std::this_thread::sleep_for(50ms);
  stranger.close();
  EXPECT_TRUE(eventually([&] { return (*t0)->counters().handshakeFailures >= 1; }));
  t1->reset();
  std::this_thread::sleep_for(500ms);
  EXPECT_EQ((*t0)->counters().handshakeFailures, 1u);
}

// 301 CURVE clients with a key that is not the job's: every one is refused
// and counted, and only the first 10 are logged.
TEST(TransportSecurity, RefusedKeysAreLoggedRateLimited) {
  LogCapture log;
  World w(1);
  auto t = makeZmqTransport(w.config(0));
  ASSERT_TRUE(t.ok());
  zmq::context_t ctx;
  const keys::CurveKeyPair intruder = keys::generateKeyPair();
  constexpr uint64_t kClients = 301;
  constexpr uint64_t kBatch = 50;
  for (uint64_t done = 0; done < kClients;) {
    const uint64_t n = std::min(kBatch, kClients - done);
    std::vector<zmq::socket_t> clients;
    for (uint64_t i = 0; i < n; ++i) {
      clients.emplace_back(ctx, zmq::socket_type::dealer);
      zmq::socket_t& c = clients.back();
      c.set(zmq::sockopt::linger, 0);
      c.set(zmq::sockopt::reconnect_ivl, -1);  // one attempt each
      c.set(zmq::sockopt::curve_serverkey, w.keys[0].publicKey);
      c.set(zmq::sockopt::curve_publickey, intruder.publicKey);
      c.set(zmq::sockopt::curve_secretkey, intruder.secretKey);
      c.connect(w.endpoints[0]);
    }
    done += n;
    ASSERT_TRUE(eventually([&] { return (*t)->counters().refusedKeys >= done; }, 10s))
        << (*t)->counters().refusedKeys << " of " << done;
  }
  EXPECT_GE((*t)->counters().refusedKeys, kClients);
  EXPECT_EQ((*t)->counters().handshakeFailures, 0u) << "a refusal is not counted twice";
  const auto lines = log.lines("transport rank 0: refused connection #");
  ASSERT_EQ(lines.size(), 10u);
  EXPECT_NE(lines.front().find("public key not allowed for this job"), std::string::npos)
      << lines.front();
  EXPECT_NE(lines.back().find("from now on only every 1000th"), std::string::npos) << lines.back();
}

// Link emulation: 50 ms one way in each direction is a 100 ms round trip,
// measured by the transport's pings and by an application-level echo.
TEST(TransportLink, RoundTripOf100Ms) {
  World w(2);
  std::vector<TransportConfig> configs = {w.config(0), w.config(1)};
  for (auto& c : configs) {
    c.links.assign(2, *parseLinkProfile("delay=50ms"));
    c.pingInterval = 100ms;
  }
  auto ts = startAll(configs);
  ASSERT_EQ(ts.size(), 2u);
  double total = 0;
  const int rounds = 5;
  // Round 0 connects (CURVE handshake); rounds 1..5 measure the link.
  for (int i = 0; i <= rounds; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    ASSERT_TRUE(
        ts[0]
            ->send(1, MessageKind::kUpdate, {.round = uint64_t(i)}, Payload(pattern(16, i)), 1s)
            .ok());
    auto m = ts[1]->receive(MessageKind::kUpdate, i, 0, 5s);
    ASSERT_TRUE(m.ok());
    ASSERT_TRUE(ts[1]
                    ->send(0, MessageKind::kUpdate, {.round = uint64_t(i)},
                           Payload::copyOf(m->payload.bytes()), 1s)
                    .ok());
    ASSERT_TRUE(ts[0]->receive(MessageKind::kUpdate, i, 1, 5s).ok());
    if (i > 0)
      total += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  EXPECT_NEAR(total / rounds, 0.100, 0.010);
  ASSERT_TRUE(eventually([&] { return ts[0]->peerCounters()[0].rttSeconds > 0; }));
  EXPECT_NEAR(ts[0]->peerCounters()[0].rttSeconds, 0.100, 0.010);
}

// 20 Mbit/s: 5 MB take 2 s (the 64 KiB burst is 1.3% of it).
TEST(TransportLink, Bandwidth20Mbit) {
  World w(2);
  std::vector<TransportConfig> configs = {w.config(0), w.config(1)};
  configs[0].links.assign(2, *parseLinkProfile("rate=20mbit"));
  configs[0].pingInterval = 0ms;
  configs[1].pingInterval = 0ms;
  auto ts = startAll(configs);
  ASSERT_EQ(ts.size(), 2u);
  // Warm up the connection so the handshake is not measured.
  ASSERT_TRUE(ts[0]->send(1, MessageKind::kControl, {}, Payload(pattern(1, 0)), 1s).ok());
  ASSERT_TRUE(ts[1]->receive(MessageKind::kControl, 0, 0, 5s).ok());
  std::this_thread::sleep_for(100ms);  // let the bucket refill to its burst

  const int messages = 20;
  const size_t size = 250'000 - kFrameHeaderBytes;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < messages; ++i) {
    ASSERT_TRUE(
        ts[0]
            ->send(1, MessageKind::kUpdate, {.round = uint64_t(i)}, Payload(pattern(size, i)), 10s)
            .ok());
  }
  for (int i = 0; i < messages; ++i) {
    ASSERT_TRUE(ts[1]->receive(MessageKind::kUpdate, i, 0, 10s).ok());
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double mbit = messages * 250'000 * 8 / seconds / 1e6;
  EXPECT_NEAR(mbit, 20.0, 2.0) << seconds << " s";
}

// A shared 20 Mbit/s uplink: sending to two peers at once shares it (20
// Mbit/s together, not 20 each), while a peer outside uplinkPeers is not held
// back by it.
TEST(TransportLink, SharedUplink) {
  World w(4);
  std::vector<TransportConfig> configs = {w.config(0), w.config(1), w.config(2), w.config(3)};
  configs[0].uplink = *parseLinkProfile("rate=20mbit");
  configs[0].uplinkPeers = {false, true, true, false};
  for (auto& c : configs) c.pingInterval = 0ms;
  auto ts = startAll(configs);
  ASSERT_EQ(ts.size(), 4u);
  for (uint32_t peer = 1; peer < 4; ++peer) {
    ASSERT_TRUE(ts[0]->send(peer, MessageKind::kControl, {}, Payload(pattern(1, 0)), 1s).ok());
    ASSERT_TRUE(ts[peer]->receive(MessageKind::kControl, 0, 0, 5s).ok());
  }
  std::this_thread::sleep_for(100ms);

  const int messages = 10;  // per uplink peer
  const size_t size = 250'000 - kFrameHeaderBytes;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < messages; ++i) {
    for (uint32_t peer : {1u, 2u}) {
      ASSERT_TRUE(ts[0]
                      ->send(peer, MessageKind::kUpdate, {.round = uint64_t(i)},
                             Payload(pattern(size, i)), 10s)
                      .ok());
    }
  }
  // The LAN peer's 5 MB arrive long before the uplink's 2 s.
  ASSERT_TRUE(
      ts[0]->send(3, MessageKind::kUpdate, {.round = 0}, Payload(pattern(5'000'000, 1)), 10s).ok());
  ASSERT_TRUE(ts[3]->receive(MessageKind::kUpdate, 0, 0, 10s).ok());
  const double lanSeconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(lanSeconds, 1.0);
  for (int i = 0; i < messages; ++i) {
    for (uint32_t peer : {1u, 2u}) {
      ASSERT_TRUE(ts[peer]->receive(MessageKind::kUpdate, i, 0, 10s).ok());
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double mbit = 2 * messages * 250'000 * 8 / seconds / 1e6;
  EXPECT_NEAR(mbit, 20.0, 2.0) << seconds << " s";
}

// A large payload on a slow WAN link arrives chunk by chunk, as a real
// link's bytes do, so its receiver keeps hearing the sender while it is in
// flight. 1 MB at 4 Mbit/s is 2 s; its pings queue behind it. As one chunk
// released at once, it was 2 s of silence: on a saturated uplink, a peer
// timeout's worth, and the sender was suspected while it was sending.
TEST(TransportLink, ALargePayloadOnASlowLinkKeepsItsSenderHeard) {
  World w(2);
  std::vector<TransportConfig> configs = {w.config(0), w.config(1)};
  configs[0].uplink = *parseLinkProfile("rate=4mbit");
  configs[0].uplinkPeers = {false, true};
  configs[1].uplinkPeers = {true, false};
  configs[0].pingInterval = 100ms;
  auto ts = startAll(configs);
  ASSERT_EQ(ts.size(), 2u);
  ASSERT_TRUE(ts[0]->send(1, MessageKind::kControl, {}, Payload(pattern(1, 0)), 1s).ok());
  ASSERT_TRUE(ts[1]->receive(MessageKind::kControl, 0, 0, 5s).ok());
  const size_t size = 1'000'000;
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(
      ts[0]->send(1, MessageKind::kUpdate, {.round = 1}, Payload(pattern(size, 3)), 1s).ok());
  double longestSilence = 0;
  StatusOr<Message> m = deadlineExceeded("not yet");
  while (!m.ok() && std::chrono::steady_clock::now() - t0 < 10s) {
    m = ts[1]->receive(MessageKind::kUpdate, 1, 0, 20ms);
    longestSilence = std::max(longestSilence, ts[1]->peerCounters()[0].silentSeconds);
  }
  ASSERT_TRUE(m.ok()) << m.status().toString();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(m->payload.size(), size);
  EXPECT_TRUE(
      std::equal(m->payload.bytes().begin(), m->payload.bytes().end(), pattern(size, 3).begin()));
  EXPECT_NEAR(seconds, 2.0, 0.4);  // the link's rate, not faster
  // 64 KiB chunks at 4 Mbit/s: one every 0.13 s.
  EXPECT_LT(longestSilence, 0.5) << "the receiver did not hear the sender for " << longestSilence
                                 << " s while its payload was in flight";
}

// What waits for the link is told apart from what is in flight on it: a
// 100 KB payload through an 8 Mbit/s uplink (0.1 s) onto a link with 0.6 s
// of delay is backlog while the uplink sends it, then queued (not yet
// delivered) but no longer backlog until it arrives.
TEST(TransportLink, BacklogIsWhatWaitsForTheLinkNotWhatTravelsOnIt) {
  World w(2);
  std::vector<TransportConfig> configs = {w.config(0), w.config(1)};
  configs[0].uplink = *parseLinkProfile("rate=8mbit");
  configs[0].uplinkPeers = {false, true};
  configs[1].uplinkPeers = {true, false};
  configs[0].links.assign(2, *parseLinkProfile("delay=600ms"));
  auto ts = startAll(configs);
  ASSERT_EQ(ts.size(), 2u);
  ASSERT_TRUE(ts[0]->send(1, MessageKind::kControl, {}, Payload(pattern(1, 0)), 1s).ok());
  ASSERT_TRUE(ts[1]->receive(MessageKind::kControl, 0, 0, 5s).ok());
  const auto toPeer = [&] {
    for (const auto& c : ts[0]->peerCounters()) {
      if (c.peer == 1) return c;
    }
    return PeerCounters{};
  };
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(
      ts[0]->send(1, MessageKind::kUpdate, {.round = 1}, Payload(pattern(100'000, 3)), 1s).ok());
  const auto first = toPeer();
  EXPECT_GE(first.backlogBytes, 100'000u) << "the uplink has not sent it yet";
  EXPECT_GE(first.queuedBytes, first.backlogBytes);
  std::this_thread::sleep_until(t0 + 350ms);  // sent at 0.1 s, arrives at 0.7 s
  const auto flying = toPeer();
  EXPECT_EQ(flying.backlogBytes, 0u) << "counted as waiting while in flight";
  EXPECT_GE(flying.queuedBytes, 100'000u);
  ASSERT_TRUE(ts[1]->receive(MessageKind::kUpdate, 1, 0, 5s).ok());
}

// Below the transport: what ZeroMQ and the kernel hold of ours that has not
// left, from the kernel's own count of acknowledged bytes, and the bytes the
// peer acknowledged -- a peer that reads nothing (its inbox full) leaves
// megabytes here; once it reads them, nothing, and every byte counted.
TEST(TransportLink, QueuedBelowIsWhatHasNotLeftAndAckedWhatArrived) {
  World w(2);
  std::vector<TransportConfig> configs = {w.config(0), w.config(1)};
  configs[1].maxInboxBytes = 1 << 20;  // takes about a megabyte, then stops reading
  auto ts = startAll(configs);
  ASSERT_EQ(ts.size(), 2u);
  const auto toPeer = [&] { return ts[0]->peerCounters().front(); };
  // More than the peer's kernel takes: its receive buffer may grow to
  // net.ipv4.tcp_rmem's limit (32 MiB on some machines).
  constexpr size_t kPayload = 4 << 20, kCount = 24;
  for (uint32_t i = 0; i < kCount; ++i) {
    ASSERT_TRUE(
        ts[0]->send(1, MessageKind::kUpdate, {.round = i}, Payload(pattern(kPayload, i)), 1s).ok());
  }
  // Much of 96 MB cannot be anywhere but here: the peer's inbox holds one
  // payload, its kernel at most 32 MiB.
  EXPECT_TRUE(eventually([&] { return ts[0]->queuedBelowBytes(1) > 8u << 20; }))
      << ts[0]->queuedBelowBytes(1) << " bytes below the transport";
  EXPECT_LE(ts[0]->queuedBelowBytes(1), kCount * (kPayload + 1024));
  for (uint32_t i = 0; i < kCount; ++i) {
    auto m = ts[1]->receive(MessageKind::kUpdate, i, 0, 10s);
    ASSERT_TRUE(m.ok()) << m.status().toString();
    EXPECT_TRUE(sameBytes(m->payload.bytes(), pattern(kPayload, i))) << "round " << i;
  }
  EXPECT_TRUE(eventually([&] {
    const auto c = toPeer();
    return ts[0]->queuedBelowBytes(1) == 0 && c.unackedBytes == 0;
  })) << ts[0]->queuedBelowBytes(1)
      << " bytes below the transport, " << toPeer().unackedBytes << " unacknowledged";
  EXPECT_GE(toPeer().ackedBytes, kCount * kPayload);
}

// Whether `t` hears its first peer (a ping or any message from it) within
// five seconds.
bool hearsFirstPeer(Transport& t) {
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (!t.peerCounters().front().heard && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(20ms);
  }
  return t.peerCounters().front().heard;
}

// Closing a transport gives every queued send the linger time, also one to
// a peer not connected yet: a process that sends and exits at once may do
// so before its connection is up.
TEST(TransportShutdown, AQueuedSendToAPeerNotUpYetLeavesWithinTheLinger) {
  World w(2);
  auto config = w.config(0);
  config.linger = 5s;
  auto a = makeZmqTransport(config);
  ASSERT_TRUE(a.ok()) << a.status().toString();
  ASSERT_TRUE((*a)->send(1, MessageKind::kUpdate, {.round = 7}, Payload(pattern(100, 7)), 1s).ok());
  std::this_thread::sleep_for(300ms);       // the DEALER has found nobody: blocked
  std::thread closer([&] { a->reset(); });  // waits for the send, at most the linger
  std::this_thread::sleep_for(1500ms);
  auto b = makeZmqTransport(w.config(1));
  ASSERT_TRUE(b.ok()) << b.status().toString();
  auto m = (*b)->receive(MessageKind::kUpdate, 7, 0, 5s);
  closer.join();
  ASSERT_TRUE(m.ok()) << m.status().toString();
  EXPECT_EQ(m->payload.size(), 100u);
}

// How long closing `t` (destroying it) takes, in seconds.
double secondsToClose(std::unique_ptr<Transport>& t) {
  const auto t0 = std::chrono::steady_clock::now();
  t.reset();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Whether `to` receives rank 0's update for `round`, pattern(size, round),
// whole and unchanged within `timeout`.
void expectPatternFromRank0(Transport& to, uint64_t round, size_t size,
                            std::chrono::milliseconds timeout, const std::string& context = "") {
  auto m = to.receive(MessageKind::kUpdate, round, 0, timeout);
  ASSERT_TRUE(m.ok()) << m.status().toString() << context;
  ASSERT_EQ(m->payload.size(), size);
  EXPECT_TRUE(sameBytes(m->payload.bytes(), pattern(size, round))) << "the payload arrived changed";
}

// What ZeroMQ already took from the queue when the transport closes leaves
// within the linger time too: a worker that sends a large message and exits
// at once (a region leader's final model to its members) must not drop it.
// Closed with no linger, the 64 MiB below were still being encrypted and
// written, and never arrived.
TEST(TransportShutdown, WhatZeroMqHoldsAtCloseLeavesWithinTheLinger) {
  World w(2);
  auto config = w.config(0);
  config.linger = 20s;
  auto a = makeZmqTransport(config);
  ASSERT_TRUE(a.ok()) << a.status().toString();
  auto b = makeZmqTransport(w.config(1));
  ASSERT_TRUE(b.ok()) << b.status().toString();
  ASSERT_TRUE(hearsFirstPeer(**a)) << "rank 1 not connected within 5 s";
  const size_t size = size_t{64} << 20;
  ASSERT_TRUE(
      (*a)->send(1, MessageKind::kUpdate, {.round = 9}, Payload(pattern(size, 9)), 5s).ok());
  a->reset();  // at once: the payload is still in ZeroMQ's hands
  expectPatternFromRank0(**b, 9, size, 20s);
}

// A message still moving when its sender closes -- behind a slow uplink,
// its chunks acknowledged as they arrive -- leaves however long that takes:
// the linger time is what a peer that takes nothing more gets, not a bound
// on a transfer in progress. A fixed 2 s lost the last gradient of an
// allreduce (45 MB to each of three peers through one 100 Mbit/s uplink,
// 11 s), and the peer that missed it waited for it until its time-out.
TEST(TransportShutdown, AMessageStillMovingAtCloseLeavesBeyondTheLinger) {
  World w(2);
  std::vector<TransportConfig> configs;
  for (uint32_t r = 0; r < 2; ++r) {
    TransportConfig c = w.config(r);
    c.uplinkPeers = {r != 0, r != 1};
    c.linger = 500ms;
    configs.push_back(c);
  }
  auto ts = startAll(configs);
  ASSERT_TRUE(hearsFirstPeer(*ts[0])) << "rank 1 not connected within 5 s";
  ts[0]->setUplinkRate(2e6);
  const size_t size = size_t{6} << 20;  // 3.1 s through the uplink
  ASSERT_TRUE(
      ts[0]->send(1, MessageKind::kUpdate, {.round = 3}, Payload(pattern(size, 3)), 1s).ok());
  const double closing = secondsToClose(ts[0]);
  expectPatternFromRank0(*ts[1], 3, size, 10s,
                         fmt::format(" (the sender closed in {:.2f} s)", closing));
  EXPECT_GT(closing, 2.5) << "closed before its data was through the uplink";
}

// ... and a message that does not move gets the linger time only: a peer
// gone before the close is not waited for.
TEST(TransportShutdown, AMessageThatDoesNotMoveGetsTheLingerOnly) {
  World w(2);
  auto config = w.config(0);
  config.linger = 500ms;
  auto a = makeZmqTransport(config);
  ASSERT_TRUE(a.ok()) << a.status().toString();
  {
    auto b = makeZmqTransport(w.config(1));
    ASSERT_TRUE(b.ok()) << b.status().toString();
    ASSERT_TRUE(hearsFirstPeer(**a)) << "rank 1 not connected within 5 s";
  }  // rank 1 is gone
  ASSERT_TRUE(
      (*a)->send(1, MessageKind::kUpdate, {.round = 4}, Payload(pattern(size_t{8} << 20, 4)), 1s)
          .ok());
  EXPECT_LT(secondsToClose(*a), 2.5) << "waited for a peer that takes nothing";
}

// Liveness: a peer is heard through its pings alone; once it is gone its
// silence grows, and a new incarnation on the same endpoint is heard again.
TEST(TransportLiveness, SilenceGrowsWhenAPeerDiesAndEndsWhenItComesBack) {
  World w(2);
  auto a = makeZmqTransport(w.config(0));
  ASSERT_TRUE(a.ok()) << a.status().toString();
  const auto counters = [&] { return (*a)->peerCounters().front(); };
  EXPECT_FALSE(counters().heard);
  {
    auto b = makeZmqTransport(w.config(1));
    ASSERT_TRUE(b.ok()) << b.status().toString();
    ASSERT_TRUE(hearsFirstPeer(**a)) << "no ping from rank 1 within 5 s";
    std::this_thread::sleep_for(600ms);  // three ping intervals: still heard
    EXPECT_LT(counters().silentSeconds, 0.5);
  }  // rank 1 is gone
  std::this_thread::sleep_for(800ms);
  EXPECT_GT(counters().silentSeconds, 0.6);
  auto again = makeZmqTransport(w.config(1));
  ASSERT_TRUE(again.ok()) << again.status().toString();
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (counters().silentSeconds > 0.3 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_LT(counters().silentSeconds, 0.3) << "the restarted rank 1 is not heard";
}

// Two transports, each across the WAN from the other (so that an emulated
// partition cuts them apart); `reconnectAfter` when given.
std::vector<std::unique_ptr<Transport>> startAcrossTheWan(
    const World& w, std::optional<std::chrono::milliseconds> reconnectAfter = std::nullopt) {
  std::vector<TransportConfig> configs;
  for (uint32_t r = 0; r < 2; ++r) {
    TransportConfig c = w.config(r);
    c.uplinkPeers = {r != 0, r != 1};
    c.emulatedPartitions = true;  // setPartitioned cuts them apart above the sockets
    if (reconnectAfter) c.reconnectAfter = *reconnectAfter;
    configs.push_back(c);
  }
  return startAll(configs);
}

// Open descriptors of this process.
size_t openDescriptors() {
  size_t n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) ++n;
  return n;
}

// A peer cut off again and again (a churn soak's partitions): every silence
// gets new connections every reconnectAfter while the old ones, across a
// partition, are still up -- and none may stay behind. Replaced on the same
// socket (disconnect, connect), they did: a 30-minute soak's workers held
// up to eight connections to one peer, 33 descriptors more at their end.
TEST(TransportLiveness, ReconnectionsLeaveNoConnectionBehind) {
  World w(2);
  auto ts = startAcrossTheWan(w, 300ms);
  ASSERT_EQ(ts.size(), 2u);
  const auto heard = [&] { return ts[0]->peerCounters().front().silentSeconds < 0.3; };
  size_t before = 0;
  for (uint64_t cut = 0; cut < 5; ++cut) {
    ASSERT_TRUE(eventually(heard, 5s)) << "cut " << cut;
    ASSERT_TRUE(ts[0]->send(1, MessageKind::kUpdate, {cut}, Payload(pattern(100, 1)), 1s).ok());
    ASSERT_TRUE(ts[1]->receive(MessageKind::kUpdate, cut, 0, 5s).ok()) << "cut " << cut;
    if (cut == 1) before = openDescriptors();  // after the first cut: steady state
    for (auto& t : ts) t->setPartitioned(true);
    std::this_thread::sleep_for(1500ms);  // silent: about four reconnections each
    for (auto& t : ts) t->setPartitioned(false);
  }
  ASSERT_TRUE(eventually(heard, 5s));
  std::this_thread::sleep_for(500ms);
  const size_t after = openDescriptors();
  EXPECT_LE(after, before + 2) << "descriptors grew from " << before << " to " << after
                               << " over four partitions";
}

// An emulated partition drops everything to and from the ranks behind the
// uplink, pings included (so they fall silent), and nothing once it ends.
TEST(TransportLiveness, APartitionDropsBothWaysUntilItEnds) {
  World w(2);
  auto ts = startAcrossTheWan(w);
  ASSERT_EQ(ts.size(), 2u);
  const auto payload = [] { return Payload(pattern(1000, 7)); };
  ASSERT_TRUE(ts[0]->send(1, MessageKind::kUpdate, {1}, payload(), 1s).ok());
  ASSERT_TRUE(ts[1]->receive(MessageKind::kUpdate, 1, 0, 5s).ok());
  ts[1]->setPartitioned(true);
  ASSERT_TRUE(ts[0]->send(1, MessageKind::kUpdate, {2}, payload(), 1s).ok());
  ASSERT_TRUE(ts[1]->send(0, MessageKind::kUpdate, {3}, payload(), 1s).ok());  // "OK", dropped
  EXPECT_FALSE(ts[1]->receive(MessageKind::kUpdate, 2, 0, 300ms).ok());
  EXPECT_FALSE(ts[0]->receive(MessageKind::kUpdate, 3, 1, 300ms).ok());
  std::this_thread::sleep_for(500ms);
  EXPECT_GT(ts[0]->peerCounters().front().silentSeconds, 0.5) << "pings crossed the partition";
  EXPECT_GE(ts[1]->counters().partitionDropped, 2u);
  ts[1]->setPartitioned(false);
  ASSERT_TRUE(ts[0]->send(1, MessageKind::kUpdate, {4}, payload(), 1s).ok());
  auto m = ts[1]->receive(MessageKind::kUpdate, 4, 0, 5s);
  ASSERT_TRUE(m.ok()) << m.status().toString();
  EXPECT_TRUE(sameBytes(m->payload.bytes(), pattern(1000, 7)));
}

// The receiver acknowledges the data it takes: once a payload is in, the
// sender has nothing outstanding; and the acknowledgements, like pings,
// travel on a connection of their own.
TEST(TransportAcks, DataTakenIsAcknowledged) {
  World w(2);
  auto ts = startWorld(w);
  ASSERT_EQ(ts.size(), 2u);
  const auto toPeer = [&] { return ts[0]->peerCounters().front(); };
  EXPECT_LT(toPeer().sinceAckSeconds, 0) << "acknowledged before anything was sent";
  ASSERT_TRUE(
      ts[0]->send(1, MessageKind::kUpdate, {.round = 1}, Payload(pattern(3 << 20, 5)), 1s).ok());
  ASSERT_TRUE(ts[1]->receive(MessageKind::kUpdate, 1, 0, 5s).ok());
  ASSERT_TRUE(eventually([&] {
    return toPeer().unackedBytes == 0 && toPeer().sinceAckSeconds >= 0;
  })) << toPeer().unackedBytes
      << " bytes still unacknowledged";
  EXPECT_EQ(toPeer().unackedSeconds, 0);
  // Probes are not data: a ping alone leaves nothing to acknowledge.
  ASSERT_TRUE(eventually([&] { return toPeer().minRttSeconds > 0; }));
  EXPECT_EQ(toPeer().unackedBytes, 0u);
}

// The warm-up: a transport starts its data connection to each WAN peer
// (uplinkPeers) with warmupBytes of padding, which the receiver counts as bytes received,
// acknowledges and drops -- nothing of it reaches the inbox. A LAN peer gets
// none.
TEST(TransportWarmup, AWanPeerGetsPaddingThatIsDroppedOnArrival) {
  World w(3);
  std::vector<TransportConfig> configs{w.config(0), w.config(1), w.config(2)};
  configs[0].uplinkPeers = {false, true, false};  // rank 1 is across the WAN, rank 2 is not
  configs[0].warmupBytes = 1 << 20;
  std::vector<std::unique_ptr<Transport>> ts;
  for (auto& c : configs) {
    auto t = makeZmqTransport(c);
    ASSERT_TRUE(t.ok()) << t.status().toString();
    ts.push_back(std::move(*t));
  }
  const auto from0 = [&](size_t at) {
    for (const auto& c : ts[at]->peerCounters()) {
      if (c.peer == 0) return c.bytesReceived;
    }
    return uint64_t{0};
  };
  ASSERT_TRUE(eventually([&] { return from0(1) >= (1u << 20); }))
      << "rank 1 received " << from0(1) << " bytes from rank 0";
  // Acknowledged, though nothing was sent but the padding.
  ASSERT_TRUE(eventually([&] {
    for (const auto& c : ts[0]->peerCounters()) {
      if (c.peer == 1) return c.sinceAckSeconds >= 0 && c.unackedBytes == 0;
    }
    return false;
  })) << "the padding was not acknowledged";
  // Data after it arrives whole, and alone.
  ASSERT_TRUE(
      ts[0]->send(1, MessageKind::kUpdate, {.round = 3}, Payload(pattern(1000, 9)), 1s).ok());
  auto m = ts[1]->receive(MessageKind::kUpdate, 3, 0, 5s);
  ASSERT_TRUE(m.ok()) << m.status().toString();
  EXPECT_TRUE(sameBytes(m->payload.bytes(), pattern(1000, 9)));
  for (const auto kind : {MessageKind::kWarmup, MessageKind::kControl}) {
    EXPECT_FALSE(ts[1]->receive(kind, 0, 0, 100ms).ok()) << messageKindName(kind);
  }
  EXPECT_LT(from0(2), uint64_t{64} << 10) << "a LAN peer got padding";
  ASSERT_TRUE(eventually([&] { return ts[0]->peerCounters().front().unackedBytes == 0; }));
}

// Two ranks across an emulated WAN link of 25 ms one way, rank 0's uplink
// 20 Mbit/s: a 5 MB payload takes 2 s to cross it.
std::vector<std::unique_ptr<Transport>> slowLinkPair(const World& w) {
  std::vector<TransportConfig> configs = {w.config(0), w.config(1)};
  for (auto& c : configs) c.links.assign(2, *parseLinkProfile("delay=25ms"));
  configs[0].uplink = *parseLinkProfile("rate=20mbit");
  configs[0].uplinkPeers = {false, true};
  configs[1].uplinkPeers = {true, false};
  return startAll(configs);
}

// A ping never waits behind data: with 2 s of payload crossing a 20 Mbit/s
// link of 25 ms one way, the round trips measured meanwhile stay the link's
// 50 ms (they came after the whole queue before probes had their own
// connection), and the data outstanding below the transport shows up as
// unacknowledged.
TEST(TransportAcks, PingsDoNotWaitBehindData) {
  World w(2);
  auto ts = slowLinkPair(w);
  ASSERT_EQ(ts.size(), 2u);
  ASSERT_TRUE(ts[0]->send(1, MessageKind::kControl, {}, Payload(pattern(1, 0)), 1s).ok());
  ASSERT_TRUE(ts[1]->receive(MessageKind::kControl, 0, 0, 5s).ok());
  ASSERT_TRUE(
      ts[0]->send(1, MessageKind::kUpdate, {.round = 1}, Payload(pattern(5'000'000, 2)), 1s).ok());
  const auto t0 = std::chrono::steady_clock::now();
  double worst = 0;
  while (std::chrono::steady_clock::now() < t0 + 1500ms) {
    std::this_thread::sleep_for(200ms);
    worst = std::max(worst, ts[0]->peerCounters().front().rttSeconds);
  }
  EXPECT_GT(worst, 0);
  EXPECT_LT(worst, 0.2) << "a ping waited behind the payload";
  ASSERT_TRUE(ts[1]->receive(MessageKind::kUpdate, 1, 0, 5s).ok());
  EXPECT_NEAR(ts[0]->peerCounters().front().minRttSeconds, 0.050, 0.015);
}

// A control-lane message (SendMeta::controlLane) overtakes data queued
// before it: with 2 s of payload crossing a 20 Mbit/s link of 25 ms one way,
// a small message sent after it arrives in about the link's delay, whole,
// with its header as sent; the data still arrives intact, and the lane's
// frame leaves nothing to acknowledge. Lane messages keep their order among
// themselves.
TEST(TransportControlLane, OvertakesDataQueuedBeforeIt) {
  World w(2);
  auto ts = slowLinkPair(w);
  ASSERT_EQ(ts.size(), 2u);
  ASSERT_TRUE(
      ts[0]->send(1, MessageKind::kUpdate, {.round = 1}, Payload(pattern(5'000'000, 2)), 1s).ok());
  const auto t0 = std::chrono::steady_clock::now();
  for (uint64_t round = 7; round < 10; ++round) {
    SendMeta lane{.round = round, .step = 42};
    lane.controlLane = true;
    ASSERT_TRUE(ts[0]->send(1, MessageKind::kControl, lane, Payload(pattern(16, round)), 1s).ok());
  }
  for (uint64_t round = 7; round < 10; ++round) {
    auto m = ts[1]->receive(MessageKind::kControl, round, 0, 5s);
    ASSERT_TRUE(m.ok()) << m.status().toString();
    EXPECT_TRUE(sameBytes(m->payload.bytes(), pattern(16, round)));
    EXPECT_EQ(m->header.step, 42u);
    EXPECT_EQ(m->header.flags, kFrameFlagControlLane);
  }
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(took, 0.5) << "the control-lane messages waited behind the payload";
  auto data = ts[1]->receive(MessageKind::kUpdate, 1, 0, 10s);
  ASSERT_TRUE(data.ok()) << data.status().toString();
  EXPECT_TRUE(sameBytes(data->payload.bytes(), pattern(5'000'000, 2)));
  EXPECT_EQ(data->header.flags, 0);
  ASSERT_TRUE(eventually([&] { return ts[0]->peerCounters().front().unackedBytes == 0; }))
      << ts[0]->peerCounters().front().unackedBytes << " bytes still unacknowledged";
}

// A control-lane message sent before the peer is up waits for its
// connection (a join's question is asked once), and one too large for the
// lane is refused, naming the limit.
TEST(TransportControlLane, WaitsForTheConnectionAndRefusesLargePayloads) {
  World w(2);
  auto first = makeZmqTransport(w.config(0));
  ASSERT_TRUE(first.ok()) << first.status().toString();
  SendMeta lane{.round = 3};
  lane.controlLane = true;
  ASSERT_TRUE((*first)->send(1, MessageKind::kControl, lane, Payload(pattern(8, 3)), 1s).ok());
  const Status big = (*first)->send(1, MessageKind::kControl, lane,
                                    Payload(pattern(kMaxControlLaneBytes + 1, 1)), 1s);
  EXPECT_EQ(big.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(big.message().find(std::to_string(kMaxControlLaneBytes)), std::string::npos)
      << big.message();
  std::this_thread::sleep_for(300ms);
  auto second = makeZmqTransport(w.config(1));
  ASSERT_TRUE(second.ok()) << second.status().toString();
  auto m = (*second)->receive(MessageKind::kControl, 3, 0, 5s);
  ASSERT_TRUE(m.ok()) << m.status().toString();
  EXPECT_TRUE(sameBytes(m->payload.bytes(), pattern(8, 3)));
}

// A peer silent for reconnectAfter gets new connections, and a partition's
// end is then heard within a connection's set-up, not after TCP's
// retransmission back-off (on loopback nothing backs off; what the test
// sees is that the transport reconnects during the silence and that the
// pair exchanges again after it).
TEST(TransportLiveness, ASilentPeerGetsNewConnections) {
  World w(2);
  std::vector<std::unique_ptr<Transport>> ts;
  for (uint32_t r = 0; r < 2; ++r) {
    TransportConfig c = w.config(r);
    c.uplinkPeers = {r != 0, r != 1};
    c.emulatedPartitions = true;
    c.reconnectAfter = 500ms;
    auto t = makeZmqTransport(c);
    ASSERT_TRUE(t.ok()) << t.status().toString();
    ts.push_back(std::move(*t));
  }
  ASSERT_TRUE(hearsFirstPeer(*ts[0]));
  ASSERT_TRUE(eventually([&] { return ts[0]->peerCounters().front().reconnects == 0; }));
  ts[1]->setPartitioned(true);
  std::this_thread::sleep_for(1500ms);
  ts[1]->setPartitioned(false);
  ASSERT_TRUE(eventually([&] { return ts[0]->peerCounters().front().reconnects >= 1; }))
      << "no new connection during the silence";
  ASSERT_TRUE(eventually([&] { return ts[0]->peerCounters().front().silentSeconds < 0.3; }));
  ASSERT_TRUE(ts[0]->send(1, MessageKind::kUpdate, {9}, Payload(pattern(1000, 9)), 1s).ok());
  auto m = ts[1]->receive(MessageKind::kUpdate, 9, 0, 5s);
  ASSERT_TRUE(m.ok()) << m.status().toString();
}

// discard() removes exactly the matching inbox messages.
TEST(TransportInbox, DiscardRemovesWhatMatches) {
  World w(2);
  auto ts = startWorld(w);
  ASSERT_EQ(ts.size(), 2u);
  for (uint64_t round = 0; round < 6; ++round) {
    ASSERT_TRUE(ts[0]->send(1, MessageKind::kUpdate, {round}, Payload(pattern(64, 1)), 1s).ok());
  }
  ASSERT_TRUE(ts[1]->receive(MessageKind::kUpdate, 5, 0, 5s).ok());  // all six have arrived
  const size_t n = ts[1]->discard(
      [](const FrameHeader& h) { return h.kind == MessageKind::kUpdate && h.round < 3; });
  EXPECT_EQ(n, 3u);
  EXPECT_FALSE(ts[1]->receive(MessageKind::kUpdate, 2, 0, 0ms).ok());
  EXPECT_TRUE(ts[1]->receive(MessageKind::kUpdate, 3, 0, 0ms).ok());
  EXPECT_TRUE(ts[1]->receive(MessageKind::kUpdate, 4, 0, 0ms).ok());
}

}  // namespace
}  // namespace geo::transport
