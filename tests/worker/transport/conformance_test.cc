// The Transport contract (worker/transport/transport.h), one suite run
// against each implementation: the ZeroMQ transport over real loopback
// sockets, and the in-memory network (memory_transport.h) on the real clock.
// What runs above a transport may be tested on either only as far as both
// pass this suite; anything a test above relies on that is not here belongs
// here first.

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "tests/worker/transport/transport_fixture.h"
#include "worker/transport/memory_transport.h"
#include "worker/transport/zmq_transport.h"

namespace geo::transport {
namespace {

using namespace std::chrono_literals;
using testing::pattern;
using testing::sameBytes;

// The limits every implementation gets here, so that the suite can reach
// them.
constexpr uint64_t kMaxPayload = uint64_t{16} << 20;
constexpr uint64_t kMaxQueued = uint64_t{1} << 20;

// A world of n ranks of one implementation, each in its own region (every
// peer is a WAN peer: partitions cut them, and the ZeroMQ transport cuts
// its payloads into WAN chunks).
class Net {
 public:
  virtual ~Net() = default;
  // Starts rank r (again, after stop(r): a new incarnation).
  virtual std::unique_ptr<Transport> start(uint32_t r) = 0;
};

class ZmqNet : public Net {
 public:
  explicit ZmqNet(size_t n) : world_(n) {}
  std::unique_ptr<Transport> start(uint32_t r) override {
    TransportConfig c = world_.config(r);
    c.maxPayloadBytes = kMaxPayload;
    c.maxQueuedBytesPerPeer = kMaxQueued;
    c.uplinkPeers.assign(world_.keys.size(), true);
    c.uplinkPeers[r] = false;
    c.emulatedPartitions = true;  // a partition is setPartitioned
    c.linger = 200ms;
    auto t = makeZmqTransport(c);
    EXPECT_TRUE(t.ok()) << t.status().toString();
    return t.ok() ? std::move(*t) : nullptr;
  }

 private:
  testing::World world_;
};

class MemoryNet : public Net {
 public:
  explicit MemoryNet(size_t n) {
    MemoryNetwork::Options o;
    o.worldSize = static_cast<uint32_t>(n);
    o.maxPayloadBytes = kMaxPayload;
    o.maxQueuedBytesPerPeer = kMaxQueued;
    o.linger = 200ms;
    auto net = MemoryNetwork::make(o, systemClock());
    EXPECT_TRUE(net.ok()) << net.status().toString();
    net_ = *net;
  }
  std::unique_ptr<Transport> start(uint32_t r) override {
    auto t = net_->open(r);
    EXPECT_TRUE(t.ok()) << t.status().toString();
    return t.ok() ? std::move(*t) : nullptr;
  }

 private:
  std::shared_ptr<MemoryNetwork> net_;
};

class Conformance : public ::testing::TestWithParam<std::string> {
 protected:
  std::unique_ptr<Net> makeNet(size_t n) {
    if (GetParam() == "zmq") return std::make_unique<ZmqNet>(n);
    return std::make_unique<MemoryNet>(n);
  }
  std::vector<std::unique_ptr<Transport>> startAll(Net& net, size_t n) {
    std::vector<std::unique_ptr<Transport>> out;
    for (uint32_t r = 0; r < n; ++r) out.push_back(net.start(r));
    return out;
  }
};

Payload bytesOf(size_t size, uint32_t seed) {
  return Payload(pattern(size, seed));
}

Status sendRaw(Transport& t, uint32_t to, MessageKind kind, uint64_t round, uint64_t step,
               Payload payload, bool lane = false) {
  SendMeta meta;
  meta.round = round;
  meta.step = step;
  meta.controlLane = lane;
  return t.send(to, kind, meta, std::move(payload), 5000ms);
}

TEST_P(Conformance, APayloadArrivesWholeWithItsHeader) {
  auto net = makeNet(2);
  auto t = startAll(*net, 2);
  // Empty, one value, a WAN chunk and more, more than the largest chunk.
  const std::vector<size_t> sizes = {0, 4, 70'000, (size_t{4} << 20) + 4};
  for (size_t i = 0; i < sizes.size(); ++i) {
    SendMeta meta;
    meta.round = 7;
    meta.step = 100 + i;
    meta.codec = CodecId::kFp32;
    meta.elementCount = sizes[i] / 4;
    ASSERT_TRUE(t[1]->send(0, MessageKind::kUpdate, meta, bytesOf(sizes[i], i), 5000ms).ok());
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    auto m = t[0]->receive(MessageKind::kUpdate, 7, 1, 10000ms);
    ASSERT_TRUE(m.ok()) << m.status().toString();
    EXPECT_EQ(m->header.kind, MessageKind::kUpdate);
    EXPECT_EQ(m->header.round, 7u);
    EXPECT_EQ(m->header.step, 100 + i);
    EXPECT_EQ(m->header.sender, 1u);
    EXPECT_EQ(m->header.codec, CodecId::kFp32);
    EXPECT_EQ(m->header.elementCount, sizes[i] / 4);
    EXPECT_EQ(m->header.payloadBytes, sizes[i]);
    EXPECT_TRUE(sameBytes(m->payload.bytes(), pattern(sizes[i], i))) << "payload " << i;
  }
}

TEST_P(Conformance, ARawPayloadCountsItsBytesAsElements) {
  auto net = makeNet(2);
  auto t = startAll(*net, 2);
  ASSERT_TRUE(sendRaw(*t[0], 1, MessageKind::kControl, 1, 0, bytesOf(33, 1)).ok());
  auto m = t[1]->receive(MessageKind::kControl, 1, 0, 10000ms);
  ASSERT_TRUE(m.ok()) << m.status().toString();
  EXPECT_EQ(m->header.codec, CodecId::kRaw);
  EXPECT_EQ(m->header.elementCount, 33u);
}

TEST_P(Conformance, AHeaderTheReceiverRefusesIsCountedNotDelivered) {
  auto net = makeNet(2);
  auto t = startAll(*net, 2);
  SendMeta meta;
  meta.round = 1;
  meta.codec = CodecId::kFp32;
  meta.elementCount = 3;  // 12 bytes of fp32, not 10
  ASSERT_TRUE(t[1]->send(0, MessageKind::kUpdate, meta, bytesOf(10, 1), 5000ms).ok());
  ASSERT_TRUE(sendRaw(*t[1], 0, MessageKind::kUpdate, 2, 0, bytesOf(10, 2)).ok());
  ASSERT_TRUE(t[0]->receive(MessageKind::kUpdate, 2, 1, 10000ms).ok());
  EXPECT_EQ(t[0]->receive(MessageKind::kUpdate, 1, 1, 0ms).status().code(),
            StatusCode::kDeadlineExceeded);
  const TransportCounters c = t[0]->counters();
  EXPECT_EQ(c.framesRejected, 1u);
  EXPECT_NE(c.lastRejectReason.find("elementCount"), std::string::npos) << c.lastRejectReason;
}

TEST_P(Conformance, MessagesFromOneSenderArriveInOrder) {
  auto net = makeNet(3);
  auto t = startAll(*net, 3);
  constexpr int kMessages = 200;
  for (int i = 0; i < kMessages; ++i) {
    // Sizes that make the chunked and the whole ones alternate.
    const size_t size = (i % 7 == 0) ? 150'000 : static_cast<size_t>(i * 13);
    for (uint32_t from : {1u, 2u}) {
      ASSERT_TRUE(sendRaw(*t[from], 0, MessageKind::kUpdate, 3, i, bytesOf(size, i)).ok());
    }
  }
  for (uint32_t from : {1u, 2u}) {
    for (int i = 0; i < kMessages; ++i) {
      auto m = t[0]->receive(MessageKind::kUpdate, 3, from, 10000ms);
      ASSERT_TRUE(m.ok()) << m.status().toString();
      ASSERT_EQ(m->header.step, static_cast<uint64_t>(i)) << "from rank " << from;
    }
  }
}

TEST_P(Conformance, ControlLaneMessagesKeepTheirOrderAmongThemselves) {
  auto net = makeNet(2);
  auto t = startAll(*net, 2);
  for (int i = 0; i < 40; ++i) {
    ASSERT_TRUE(sendRaw(*t[1], 0, MessageKind::kControl, 9, i, bytesOf(100, i), true).ok());
  }
  for (int i = 0; i < 40; ++i) {
    auto m = t[0]->receive(MessageKind::kControl, 9, 1, 10000ms);
    ASSERT_TRUE(m.ok()) << m.status().toString();
    EXPECT_EQ(m->header.step, static_cast<uint64_t>(i));
  }
}

TEST_P(Conformance, ReceiveSelectsByKindRoundAndSender) {
  auto net = makeNet(3);
  auto t = startAll(*net, 3);
  ASSERT_TRUE(sendRaw(*t[1], 0, MessageKind::kUpdate, 1, 11, bytesOf(8, 1)).ok());
  ASSERT_TRUE(sendRaw(*t[1], 0, MessageKind::kControl, 1, 12, bytesOf(8, 2)).ok());
  ASSERT_TRUE(sendRaw(*t[2], 0, MessageKind::kUpdate, 2, 21, bytesOf(8, 3)).ok());
  ASSERT_TRUE(sendRaw(*t[2], 0, MessageKind::kUpdate, 1, 22, bytesOf(8, 4)).ok());

  auto control = t[0]->receive(MessageKind::kControl, 1, kAnyPeer, 10000ms);
  ASSERT_TRUE(control.ok());
  EXPECT_EQ(control->header.step, 12u);
  auto fromTwo = t[0]->receive(MessageKind::kUpdate, 1, 2, 10000ms);
  ASSERT_TRUE(fromTwo.ok());
  EXPECT_EQ(fromTwo->header.step, 22u);
  auto fromOne = t[0]->receive(MessageKind::kUpdate, 1, kAnyPeer, 10000ms);
  ASSERT_TRUE(fromOne.ok());
  EXPECT_EQ(fromOne->header.step, 11u);
  auto roundTwo = t[0]->receive(MessageKind::kUpdate, 2, kAnyPeer, 10000ms);
  ASSERT_TRUE(roundTwo.ok());
  EXPECT_EQ(roundTwo->header.step, 21u);
  // Each was delivered once.
  for (uint64_t round : {1u, 2u}) {
    EXPECT_EQ(t[0]->receive(MessageKind::kUpdate, round, kAnyPeer, 100ms).status().code(),
              StatusCode::kDeadlineExceeded);
  }
}

TEST_P(Conformance, AReceiveThatFindsNothingSaysSoAfterItsTimeout) {
  auto net = makeNet(2);
  auto t = startAll(*net, 2);
  const auto t0 = std::chrono::steady_clock::now();
  // A poll's miss is the common case and says only that (its caller knows
  // what it looked for); a wait that ran out names what it waited for.
  auto poll = t[0]->receive(MessageKind::kUpdate, 1, 1, 0ms);
  EXPECT_EQ(poll.status().code(), StatusCode::kDeadlineExceeded);
  auto waited = t[0]->receive(MessageKind::kUpdate, 1, kAnyPeer, 150ms);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(waited.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(waited.status().message().find("round 1"), std::string::npos)
      << waited.status().message();
  EXPECT_GE(seconds, 0.15);
}

TEST_P(Conformance, AnArrivalOfAnyKindEndsAWaitForOneAndStaysInTheInbox) {
  auto net = makeNet(2);
  auto t = startAll(*net, 2);
  const uint64_t seen = t[0]->arrivals();
  bool came = false;
  std::thread waiter([&] { came = t[0]->awaitArrival(seen, 10000ms); });
  std::this_thread::sleep_for(100ms);
  const auto sentAt = std::chrono::steady_clock::now();
  ASSERT_TRUE(sendRaw(*t[1], 0, MessageKind::kPart, 7, 3, bytesOf(10, 7)).ok());
  waiter.join();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - sentAt).count();
  EXPECT_TRUE(came);
  EXPECT_LT(seconds, 5.0);  // woken by the message, not the 10 s time-out
  EXPECT_EQ(t[0]->arrivals(), seen + 1);
  // The wait took nothing: the message is there for the receive that wants it.
  auto m = t[0]->receive(MessageKind::kPart, 7, 1, 0ms);
  ASSERT_TRUE(m.ok()) << m.status().toString();
  EXPECT_EQ(m->header.step, 3u);
}

TEST_P(Conformance, AWaitForAnArrivalEndsAtOnceForOneSinceItsCountAndElseAtItsTimeout) {
  auto net = makeNet(2);
  auto t = startAll(*net, 2);
  const uint64_t seen = t[0]->arrivals();
  ASSERT_TRUE(sendRaw(*t[1], 0, MessageKind::kUpdate, 2, 1, bytesOf(10, 2)).ok());
  // Read before a poll, waited on after it: what came in between is not
  // slept through.
  ASSERT_TRUE(t[0]->receive(MessageKind::kUpdate, 2, 1, 10000ms).ok());
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(t[0]->awaitArrival(seen, 10000ms));
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 1.0);

  t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(t[0]->awaitArrival(t[0]->arrivals(), 150ms));
  EXPECT_GE(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 0.15);
  EXPECT_FALSE(t[0]->awaitArrival(t[0]->arrivals(), 0ms));  // a look, no wait
}

TEST_P(Conformance, ABlockedReceiveWakesForAMessage) {
  auto net = makeNet(2);
  auto t = startAll(*net, 2);
  StatusOr<Message> got = Status(StatusCode::kUnknown, "not yet");
  std::thread waiter([&] { got = t[0]->receive(MessageKind::kUpdate, 5, 1, 10000ms); });
  std::this_thread::sleep_for(100ms);
  ASSERT_TRUE(sendRaw(*t[1], 0, MessageKind::kUpdate, 5, 1, bytesOf(10, 5)).ok());
  waiter.join();
  ASSERT_TRUE(got.ok()) << got.status().toString();
  EXPECT_EQ(got->header.step, 1u);
}

TEST_P(Conformance, BadSendsAreRefusedNamingWhy) {
  auto net = makeNet(2);
  auto t = startAll(*net, 2);
  const auto code = [&](uint32_t to, size_t size, bool lane) {
    return sendRaw(*t[0], to, MessageKind::kUpdate, 1, 0, bytesOf(size, 0), lane).code();
  };
  EXPECT_EQ(code(0, 1, false), StatusCode::kInvalidArgument);  // itself
  EXPECT_EQ(code(2, 1, false), StatusCode::kInvalidArgument);  // outside the world
  EXPECT_EQ(code(1, kMaxPayload + 1, false), StatusCode::kInvalidArgument);
  EXPECT_EQ(code(1, kMaxControlLaneBytes + 1, true), StatusCode::kInvalidArgument);
  const Status lane =
      sendRaw(*t[0], 1, MessageKind::kControl, 1, 0, bytesOf(kMaxControlLaneBytes + 1, 0), true);
  EXPECT_NE(lane.message().find(std::to_string(kMaxControlLaneBytes)), std::string::npos)
      << lane.message();
  EXPECT_TRUE(
      sendRaw(*t[0], 1, MessageKind::kControl, 1, 0, bytesOf(kMaxControlLaneBytes, 0), true).ok());
}

TEST_P(Conformance, DiscardRemovesWhatMatchesAndCountsIt) {
  auto net = makeNet(2);
  auto t = startAll(*net, 2);
  for (uint64_t round = 1; round <= 4; ++round) {
    ASSERT_TRUE(sendRaw(*t[1], 0, MessageKind::kUpdate, round, round, bytesOf(64, 1)).ok());
  }
  // In order: once round 4 is in, so are the three before it.
  ASSERT_TRUE(t[0]->receive(MessageKind::kUpdate, 4, 1, 10000ms).ok());
  EXPECT_EQ(t[0]->discard([](const FrameHeader& h) { return h.round < 3; }), 2u);
  EXPECT_EQ(t[0]->receive(MessageKind::kUpdate, 1, 1, 0ms).status().code(),
            StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(t[0]->receive(MessageKind::kUpdate, 3, 1, 0ms).ok());
}

TEST_P(Conformance, AFullQueueToAnAbsentPeerPushesBack) {
  auto net = makeNet(2);
  auto sender = net->start(0);  // rank 1 never starts
  const size_t size = kMaxQueued * 3 / 4;
  ASSERT_TRUE(sendRaw(*sender, 1, MessageKind::kUpdate, 1, 0, bytesOf(size, 1)).ok());
  SendMeta meta;
  meta.round = 2;
  const auto t0 = std::chrono::steady_clock::now();
  const Status s = sender->send(1, MessageKind::kUpdate, meta, bytesOf(size, 2), 200ms);
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s.toString();
  EXPECT_GE(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 0.2);
  EXPECT_NE(s.message().find("rank 1"), std::string::npos) << s.message();
  const auto counters = sender->peerCounters();
  ASSERT_EQ(counters.size(), 1u);
  EXPECT_GE(counters[0].queuedBytes, size);
  EXPECT_FALSE(counters[0].heard);
}

TEST_P(Conformance, AQueueToAPeerNotStartedYetReachesItOnceItIs) {
  auto net = makeNet(2);
  auto sender = net->start(0);
  ASSERT_TRUE(sendRaw(*sender, 1, MessageKind::kUpdate, 1, 42, bytesOf(1000, 1)).ok());
  std::this_thread::sleep_for(100ms);
  auto late = net->start(1);
  auto m = late->receive(MessageKind::kUpdate, 1, 0, 10000ms);
  ASSERT_TRUE(m.ok()) << m.status().toString();
  EXPECT_EQ(m->header.step, 42u);
}

TEST_P(Conformance, CountersFollowTheTraffic) {
  auto net = makeNet(2);
  auto t = startAll(*net, 2);
  constexpr int kMessages = 5;
  for (int i = 0; i < kMessages; ++i) {
    ASSERT_TRUE(sendRaw(*t[0], 1, MessageKind::kUpdate, 1, i, bytesOf(10'000, i)).ok());
  }
  for (int i = 0; i < kMessages; ++i)
    ASSERT_TRUE(t[1]->receive(MessageKind::kUpdate, 1, 0, 10000ms).ok());
  // The receiver has heard the sender; the sender sees its data taken and,
  // soon, acknowledged.
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  PeerCounters sent, received;
  do {
    sent = t[0]->peerCounters().at(0);
    received = t[1]->peerCounters().at(0);
    if (sent.heard && sent.sinceAckSeconds >= 0 && sent.unackedBytes == 0 && sent.rttSeconds >= 0) {
      break;
    }
    std::this_thread::sleep_for(20ms);
  } while (std::chrono::steady_clock::now() < deadline);
  EXPECT_EQ(sent.peer, 1u);
  EXPECT_EQ(received.peer, 0u);
  EXPECT_GE(sent.messagesSent, static_cast<uint64_t>(kMessages));
  EXPECT_GE(sent.bytesSent, kMessages * (10'000 + kFrameHeaderBytes));
  EXPECT_GE(received.messagesReceived, static_cast<uint64_t>(kMessages));
  EXPECT_GE(received.bytesReceived, kMessages * (10'000 + kFrameHeaderBytes));
  EXPECT_TRUE(received.heard);
  EXPECT_LT(received.silentSeconds, 2.0);
  EXPECT_TRUE(sent.heard);
  EXPECT_EQ(sent.queuedBytes, 0u);
  EXPECT_EQ(sent.backlogBytes, 0u);
  EXPECT_EQ(sent.unackedBytes, 0u);
  EXPECT_GE(sent.sinceAckSeconds, 0.0);
  EXPECT_GE(sent.rttSeconds, 0.0);
  EXPECT_GE(sent.rttSeconds, sent.minRttSeconds);
}

TEST_P(Conformance, APartitionDropsBothWaysAndHeals) {
  auto net = makeNet(2);
  auto t = startAll(*net, 2);
  // Connected first: a message crosses.
  ASSERT_TRUE(sendRaw(*t[1], 0, MessageKind::kUpdate, 1, 0, bytesOf(10, 0)).ok());
  ASSERT_TRUE(t[0]->receive(MessageKind::kUpdate, 1, 1, 10000ms).ok());

  t[0]->setPartitioned(true);
  EXPECT_TRUE(sendRaw(*t[0], 1, MessageKind::kUpdate, 2, 0, bytesOf(10, 0)).ok());
  EXPECT_TRUE(sendRaw(*t[1], 0, MessageKind::kUpdate, 2, 0, bytesOf(10, 0)).ok());
  EXPECT_EQ(t[1]->receive(MessageKind::kUpdate, 2, 0, 300ms).status().code(),
            StatusCode::kDeadlineExceeded);
  EXPECT_EQ(t[0]->receive(MessageKind::kUpdate, 2, 1, 300ms).status().code(),
            StatusCode::kDeadlineExceeded);
  EXPECT_GE(t[0]->counters().partitionDropped, 2u);

  t[0]->setPartitioned(false);
  ASSERT_TRUE(sendRaw(*t[0], 1, MessageKind::kUpdate, 3, 0, bytesOf(10, 0)).ok());
  ASSERT_TRUE(sendRaw(*t[1], 0, MessageKind::kUpdate, 3, 0, bytesOf(10, 0)).ok());
  EXPECT_TRUE(t[1]->receive(MessageKind::kUpdate, 3, 0, 10000ms).ok());
  EXPECT_TRUE(t[0]->receive(MessageKind::kUpdate, 3, 1, 10000ms).ok());
}

TEST_P(Conformance, APeerThatStopsFallsSilentAndARestartedOneIsHeardAgain) {
  auto net = makeNet(2);
  auto t = startAll(*net, 2);
  // Both ways first: reconnects counts connections made again, so rank
  // 0's to rank 1 must have been made once.
  ASSERT_TRUE(sendRaw(*t[1], 0, MessageKind::kUpdate, 1, 0, bytesOf(10, 0)).ok());
  ASSERT_TRUE(t[0]->receive(MessageKind::kUpdate, 1, 1, 10000ms).ok());
  ASSERT_TRUE(sendRaw(*t[0], 1, MessageKind::kUpdate, 1, 0, bytesOf(10, 0)).ok());
  ASSERT_TRUE(t[1]->receive(MessageKind::kUpdate, 1, 0, 10000ms).ok());
  ASSERT_TRUE(t[0]->peerCounters().at(0).heard);
  EXPECT_EQ(t[0]->peerCounters().at(0).reconnects, 0u);

  t[1].reset();
  std::this_thread::sleep_for(800ms);
  EXPECT_GE(t[0]->peerCounters().at(0).silentSeconds, 0.3);

  t[1] = net->start(1);
  ASSERT_TRUE(sendRaw(*t[1], 0, MessageKind::kUpdate, 2, 0, bytesOf(10, 0)).ok());
  ASSERT_TRUE(t[0]->receive(MessageKind::kUpdate, 2, 1, 10000ms).ok());
  ASSERT_TRUE(sendRaw(*t[0], 1, MessageKind::kUpdate, 2, 0, bytesOf(10, 0)).ok());
  ASSERT_TRUE(t[1]->receive(MessageKind::kUpdate, 2, 0, 10000ms).ok());
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  PeerCounters c = t[0]->peerCounters().at(0);
  while (c.reconnects == 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(20ms);
    c = t[0]->peerCounters().at(0);
  }
  EXPECT_GE(c.reconnects, 1u);
  EXPECT_LT(c.silentSeconds, 2.0);
}

INSTANTIATE_TEST_SUITE_P(Implementations, Conformance, ::testing::Values("zmq", "memory"),
                         [](const auto& param) { return param.param; });

}  // namespace
}  // namespace geo::transport
