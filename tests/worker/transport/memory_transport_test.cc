// The in-memory network's model in simulated time (a FakeClock): delays,
// the uplink, kills and restarts, partitions, acknowledgements and linger,
// each to the exact time the model promises (memory_transport.h). None of
// these tests sleeps: a minute of simulated time takes microseconds.

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "worker/transport/memory_transport.h"

namespace geo::transport {
namespace {

using namespace std::chrono_literals;
using Duration = geo::Clock::Duration;

Payload bytes(size_t n) {
  return Payload(std::vector<std::byte>(n, std::byte{7}));
}

// A payload whose message takes exactly `wire` bytes on the wire.
Payload wireOf(size_t wire) {
  return bytes(wire - kFrameHeaderBytes);
}

Status send(Transport& t, uint32_t to, uint64_t round, Payload p, Duration timeout = 0ms) {
  SendMeta meta;
  meta.round = round;
  return t.send(to, MessageKind::kUpdate, meta, std::move(p),
                std::chrono::duration_cast<std::chrono::milliseconds>(timeout));
}

class MemoryNetworkTest : public ::testing::Test {
 protected:
  // n ranks, each a region of its own, `oneWay` on every link.
  void make(uint32_t n, Duration oneWay, MemoryNetwork::Options o = {}) {
    o.worldSize = n;
    o.oneWay.assign(n, std::vector<Duration>(n, oneWay));
    auto made = MemoryNetwork::make(o, clock_);
    ASSERT_TRUE(made.ok()) << made.status().toString();
    net_ = *made;
    for (uint32_t r = 0; r < n; ++r) t_.push_back(open(r));
    t0_ = clock_.now();
  }
  std::unique_ptr<Transport> open(uint32_t r) {
    auto t = net_->open(r);
    EXPECT_TRUE(t.ok()) << t.status().toString();
    return t.ok() ? std::move(*t) : nullptr;
  }
  double since(geo::Clock::TimePoint t) const {
    return std::chrono::duration<double>(t - t0_).count();
  }
  bool arrived(Transport& t, uint64_t round) {
    return t.receive(MessageKind::kUpdate, round, kAnyPeer, 0ms).ok();
  }
  // Rank 0 sends rank 1 rounds 1 and 2 and a control-lane message (round
  // 9), and rank 1 sends rank 0 round 3; then 5 s pass.
  void sendBothWaysFor5s() {
    ASSERT_TRUE(send(*t_[0], 1, 1, bytes(10)).ok());
    ASSERT_TRUE(send(*t_[0], 1, 2, bytes(10)).ok());
    ASSERT_TRUE(send(*t_[1], 0, 3, bytes(10)).ok());
    SendMeta lane;
    lane.round = 9;
    lane.controlLane = true;
    ASSERT_TRUE(t_[0]->send(1, MessageKind::kControl, lane, bytes(10), 0ms).ok());
    clock_.advance(5s);
  }

  FakeClock clock_;
  std::shared_ptr<MemoryNetwork> net_;
  std::vector<std::unique_ptr<Transport>> t_;
  geo::Clock::TimePoint t0_;
};

TEST_F(MemoryNetworkTest, AMessageArrivesExactlyTheLinksDelayLater) {
  make(2, 100ms);
  ASSERT_TRUE(send(*t_[0], 1, 1, bytes(10)).ok());
  clock_.advance(99ms);
  EXPECT_FALSE(arrived(*t_[1], 1));
  clock_.advance(1ms);
  auto m = t_[1]->receive(MessageKind::kUpdate, 1, 0, 0ms);
  ASSERT_TRUE(m.ok()) << m.status().toString();
  EXPECT_DOUBLE_EQ(since(m->received), 0.1);
}

TEST_F(MemoryNetworkTest, AWaitingReceiveMovesWithTheClock) {
  make(2, 100ms);
  StatusOr<Message> got = Status(StatusCode::kUnknown, "not yet");
  std::thread waiter([&] { got = t_[1]->receive(MessageKind::kUpdate, 1, 0, 60000ms); });
  ASSERT_TRUE(clock_.awaitWaiters(1));
  ASSERT_TRUE(send(*t_[0], 1, 1, bytes(10)).ok());
  clock_.advance(100ms);
  waiter.join();
  ASSERT_TRUE(got.ok()) << got.status().toString();

  // A minute's time-out is over when the clock says so, not before.
  std::thread timeout([&] { got = t_[1]->receive(MessageKind::kUpdate, 2, 0, 60000ms); });
  ASSERT_TRUE(clock_.awaitWaiters(1));
  clock_.advance(59s);
  ASSERT_TRUE(clock_.awaitWaiters(1));
  clock_.advance(1s);
  timeout.join();
  EXPECT_EQ(got.status().code(), StatusCode::kDeadlineExceeded);
}

TEST_F(MemoryNetworkTest, AWaitForAnArrivalMovesWithTheClock) {
  make(2, 100ms);
  const uint64_t seen = t_[1]->arrivals();
  bool came = false;
  std::thread waiter([&] { came = t_[1]->awaitArrival(seen, 60000ms); });
  ASSERT_TRUE(clock_.awaitWaiters(1));
  ASSERT_TRUE(send(*t_[0], 1, 1, bytes(10)).ok());
  clock_.advance(99ms);
  ASSERT_TRUE(clock_.awaitWaiters(1));  // not there yet: still waiting
  clock_.advance(1ms);
  waiter.join();
  EXPECT_TRUE(came);
  EXPECT_EQ(t_[1]->arrivals(), seen + 1);
  EXPECT_TRUE(arrived(*t_[1], 1));  // the wait left it in the inbox

  std::thread timeout([&] { came = t_[1]->awaitArrival(t_[1]->arrivals(), 20ms); });
  ASSERT_TRUE(clock_.awaitWaiters(1));
  clock_.advance(20ms);
  timeout.join();
  EXPECT_FALSE(came);
  EXPECT_DOUBLE_EQ(since(clock_.now()), 0.12);
}

TEST_F(MemoryNetworkTest, TheUplinkCarriesTheWanTrafficInTurn) {
  make(3, 50ms);
  t_[0]->setUplinkRate(1e6);  // 1 MB/s: 100 KB in 100 ms
  ASSERT_TRUE(send(*t_[0], 1, 1, wireOf(100'000)).ok());
  ASSERT_TRUE(send(*t_[0], 2, 1, wireOf(100'000)).ok());
  const auto counters = t_[0]->peerCounters();
  EXPECT_EQ(counters[0].backlogBytes, 100'000u);
  EXPECT_EQ(counters[1].backlogBytes, 100'000u);
  clock_.advance(1s);
  auto first = t_[1]->receive(MessageKind::kUpdate, 1, 0, 0ms);
  auto second = t_[2]->receive(MessageKind::kUpdate, 1, 0, 0ms);
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_NEAR(since(first->received), 0.15, 1e-6);
  EXPECT_NEAR(since(second->received), 0.25, 1e-6);
}

TEST_F(MemoryNetworkTest, AKilledPeerLosesWhatWasInFlightAndIsHeardAgainWhenItRestarts) {
  make(2, 100ms);
  ASSERT_TRUE(send(*t_[0], 1, 1, bytes(10)).ok());
  clock_.advance(50ms);
  net_->kill(1);
  EXPECT_EQ(t_[1]->receive(MessageKind::kUpdate, 1, 0, 0ms).status().code(),
            StatusCode::kCancelled);
  // Its last pings arrive until 150 ms; then silence.
  clock_.advance(950ms);
  PeerCounters seen = t_[0]->peerCounters().at(0);
  EXPECT_TRUE(seen.heard);
  EXPECT_NEAR(seen.silentSeconds, 0.85, 1e-6);
  // The lost message is never acknowledged.
  EXPECT_EQ(seen.unackedBytes, 10 + kFrameHeaderBytes);
  EXPECT_EQ(seen.ackedBytes, 0u);

  // Queued while it is down, delivered to the next incarnation.
  ASSERT_TRUE(send(*t_[0], 1, 2, bytes(10)).ok());
  t_[1] = open(1);
  clock_.advance(100ms);
  EXPECT_FALSE(arrived(*t_[1], 1));
  EXPECT_TRUE(arrived(*t_[1], 2));
  seen = t_[0]->peerCounters().at(0);
  EXPECT_DOUBLE_EQ(seen.silentSeconds, 0.0);
  // Heard again before our own new connection to it is made, which takes
  // three round trips (600 ms), as on the real network.
  EXPECT_EQ(seen.reconnects, 0u);
  clock_.advance(100ms);  // round 2's acknowledgement is back; round 1's record went
  EXPECT_EQ(t_[0]->peerCounters().at(0).unackedBytes, 0u);
  // What arrived, not what was lost with the killed incarnation.
  EXPECT_EQ(t_[0]->peerCounters().at(0).ackedBytes, 10 + kFrameHeaderBytes);
  clock_.advance(399ms);
  EXPECT_EQ(t_[0]->peerCounters().at(0).reconnects, 0u);
  clock_.advance(1ms);
  EXPECT_EQ(t_[0]->peerCounters().at(0).reconnects, 1u);
}

TEST_F(MemoryNetworkTest, OnlyAPartitionLongerThanTheReconnectTimeMakesNewConnections) {
  make(2, 10ms);
  clock_.advance(1s);
  t_[0]->setPartitioned(true);
  ASSERT_TRUE(send(*t_[0], 1, 1, bytes(10)).ok());  // dropped at the sender
  ASSERT_TRUE(send(*t_[1], 0, 1, bytes(10)).ok());  // dropped at the receiver
  clock_.advance(1s);
  EXPECT_FALSE(arrived(*t_[0], 1));
  EXPECT_FALSE(arrived(*t_[1], 1));
  EXPECT_EQ(t_[0]->counters().partitionDropped, 2u);
  EXPECT_NEAR(t_[1]->peerCounters().at(0).silentSeconds, 0.99, 1e-6);
  t_[0]->setPartitioned(false);
  clock_.advance(10ms);
  EXPECT_EQ(t_[1]->peerCounters().at(0).reconnects, 0u);

  t_[0]->setPartitioned(true);
  clock_.advance(3s);
  t_[0]->setPartitioned(false);
  clock_.advance(10ms);
  // Heard again; the new connections count three round trips (60 ms) on.
  EXPECT_DOUBLE_EQ(t_[1]->peerCounters().at(0).silentSeconds, 0.0);
  EXPECT_EQ(t_[1]->peerCounters().at(0).reconnects, 0u);
  clock_.advance(50ms);
  EXPECT_EQ(t_[1]->peerCounters().at(0).reconnects, 1u);
  EXPECT_EQ(t_[0]->peerCounters().at(0).reconnects, 1u);
  ASSERT_TRUE(send(*t_[0], 1, 2, bytes(10)).ok());
  clock_.advance(10ms);
  EXPECT_TRUE(arrived(*t_[1], 2));
}

TEST_F(MemoryNetworkTest, ALinkCutOneWayLosesOnlyWhatGoesThatWay) {
  make(2, 10ms);
  clock_.advance(1s);
  net_->cutOneWay(0, 1, true);
  ASSERT_TRUE(send(*t_[0], 1, 1, bytes(10)).ok());  // lost
  ASSERT_TRUE(send(*t_[1], 0, 1, bytes(10)).ok());  // passes
  clock_.advance(1s);
  EXPECT_FALSE(arrived(*t_[1], 1));
  EXPECT_TRUE(arrived(*t_[0], 1));
  EXPECT_EQ(t_[0]->counters().partitionDropped, 1u);
  // 1 stops hearing 0 at once; 0 still hears 1.
  EXPECT_NEAR(t_[1]->peerCounters().at(0).silentSeconds, 1.0, 1e-6);
  EXPECT_DOUBLE_EQ(t_[0]->peerCounters().at(0).silentSeconds, 0.0);
  net_->cutOneWay(0, 1, false);
  clock_.advance(10ms);
  EXPECT_DOUBLE_EQ(t_[1]->peerCounters().at(0).silentSeconds, 0.0);
  ASSERT_TRUE(send(*t_[0], 1, 2, bytes(10)).ok());
  clock_.advance(10ms);
  EXPECT_TRUE(arrived(*t_[1], 2));
}

// Data held one way waits in the sender's queue, in order, while the
// control lane and liveness pass both ways; released, it leaves.
TEST_F(MemoryNetworkTest, DataHeldOneWayWaitsWhileTheLaneAndLivenessPass) {
  make(2, 10ms);
  clock_.advance(1s);
  net_->holdData(0, 1, true);
  sendBothWaysFor5s();  // the other way passes
  EXPECT_FALSE(arrived(*t_[1], 1));
  EXPECT_FALSE(arrived(*t_[1], 2));
  EXPECT_TRUE(arrived(*t_[0], 3));
  EXPECT_TRUE(t_[1]->receive(MessageKind::kControl, 9, 0, 0ms).ok());
  EXPECT_DOUBLE_EQ(t_[1]->peerCounters().at(0).silentSeconds, 0.0);
  EXPECT_DOUBLE_EQ(t_[0]->peerCounters().at(0).silentSeconds, 0.0);
  const PeerCounters held = t_[0]->peerCounters().at(0);
  EXPECT_EQ(held.backlogBytes, 2 * (kFrameHeaderBytes + 10));
  EXPECT_EQ(t_[0]->counters().partitionDropped, 0u);
  net_->holdData(0, 1, false);
  clock_.advance(10ms);
  EXPECT_TRUE(arrived(*t_[1], 1));
  EXPECT_TRUE(arrived(*t_[1], 2));
}

// A way both cut and held: a clogged uplink. Its frames are lost (the
// receiver stops hearing the sender, the control lane is dropped), while
// its data waits in the sender's queue, in order; mended and released, the
// data leaves. The way back passes throughout.
TEST_F(MemoryNetworkTest, DataOnAWayCutAndHeldWaitsWhileItsFramesAreLost) {
  make(2, 10ms);
  clock_.advance(1s);
  net_->cutOneWay(0, 1, true);
  net_->holdData(0, 1, true);
  sendBothWaysFor5s();
  EXPECT_FALSE(arrived(*t_[1], 1));
  EXPECT_FALSE(arrived(*t_[1], 2));
  EXPECT_TRUE(arrived(*t_[0], 3));
  EXPECT_FALSE(t_[1]->receive(MessageKind::kControl, 9, 0, 0ms).ok());
  EXPECT_GE(t_[1]->peerCounters().at(0).silentSeconds, 4.9);
  EXPECT_DOUBLE_EQ(t_[0]->peerCounters().at(0).silentSeconds, 0.0);
  EXPECT_EQ(t_[0]->peerCounters().at(0).backlogBytes, 2 * (kFrameHeaderBytes + 10));
  EXPECT_EQ(t_[0]->counters().partitionDropped, 1u);  // the lane's message
  net_->cutOneWay(0, 1, false);
  net_->holdData(0, 1, false);
  clock_.advance(10ms);
  EXPECT_TRUE(arrived(*t_[1], 1));
  EXPECT_TRUE(arrived(*t_[1], 2));
}

TEST_F(MemoryNetworkTest, DataIsAcknowledgedARoundTripAfterItLeft) {
  make(2, 100ms);
  ASSERT_TRUE(send(*t_[0], 1, 1, wireOf(1000)).ok());
  clock_.advance(150ms);
  PeerCounters c = t_[0]->peerCounters().at(0);
  EXPECT_EQ(c.unackedBytes, 1000u);
  EXPECT_NEAR(c.unackedSeconds, 0.15, 1e-6);
  EXPECT_EQ(c.sinceAckSeconds, -1.0);
  EXPECT_NEAR(c.rttSeconds, 0.2, 1e-9);
  clock_.advance(60ms);
  c = t_[0]->peerCounters().at(0);
  EXPECT_EQ(c.unackedBytes, 0u);
  EXPECT_EQ(c.ackedBytes, 1000u);
  EXPECT_EQ(t_[0]->queuedBelowBytes(1), 0u);  // its queue is backlogBytes
  EXPECT_NEAR(c.sinceAckSeconds, 0.01, 1e-6);
}

// A closed sender's queue for an open peer leaves however long the uplink
// takes (ZmqTransport renews its linger while the data moves); for a peer
// that is not open, it waits the linger time for it, then is dropped.
TEST_F(MemoryNetworkTest, AClosedSendersQueueLeavesWhileItMovesAndWithinItsLingerForAClosedPeer) {
  make(3, 0ms);  // linger: 2 s
  t_[0]->setUplinkRate(1e6);
  for (uint64_t round = 1; round <= 4; ++round) {
    ASSERT_TRUE(send(*t_[0], 1, round, wireOf(1'000'000)).ok());  // leave at 1, 2, 3, 4 s
  }
  t_[2].reset();  // rank 2 is not open
  ASSERT_TRUE(send(*t_[0], 2, 5, wireOf(100)).ok());
  t_[0].reset();
  clock_.advance(5s);
  for (uint64_t round = 1; round <= 4; ++round) EXPECT_TRUE(arrived(*t_[1], round)) << round;
  auto again = open(2);
  ASSERT_NE(again, nullptr);
  clock_.advance(1s);
  EXPECT_FALSE(arrived(*again, 5)) << "left for a peer that was not open beyond the linger";
}

TEST_F(MemoryNetworkTest, ASendWaitsForRoomUntilTheUplinkHasCarriedTheQueue) {
  MemoryNetwork::Options o;
  o.maxQueuedBytesPerPeer = 1'000'000;
  make(2, 0ms, o);
  t_[0]->setUplinkRate(1e6);
  ASSERT_TRUE(send(*t_[0], 1, 1, wireOf(800'000)).ok());
  EXPECT_EQ(send(*t_[0], 1, 2, wireOf(800'000)).code(), StatusCode::kDeadlineExceeded);
  Status second = Status(StatusCode::kUnknown, "not yet");
  std::thread sender([&] { second = send(*t_[0], 1, 2, wireOf(800'000), 10s); });
  ASSERT_TRUE(clock_.awaitWaiters(1));
  clock_.advance(799ms);
  ASSERT_TRUE(clock_.awaitWaiters(1));  // still waiting
  clock_.advance(1ms);
  sender.join();
  EXPECT_TRUE(second.ok()) << second.toString();
  clock_.advance(800ms);
  EXPECT_TRUE(arrived(*t_[1], 1));
  EXPECT_TRUE(arrived(*t_[1], 2));
}

TEST_F(MemoryNetworkTest, ControlLaneMessagesSkipTheQueue) {
  make(2, 50ms);
  t_[0]->setUplinkRate(1e6);
  ASSERT_TRUE(send(*t_[0], 1, 1, wireOf(1'000'000)).ok());
  SendMeta lane;
  lane.round = 9;
  lane.controlLane = true;
  ASSERT_TRUE(t_[0]->send(1, MessageKind::kControl, lane, bytes(10), 0ms).ok());
  clock_.advance(50ms);
  auto m = t_[1]->receive(MessageKind::kControl, 9, 0, 0ms);
  ASSERT_TRUE(m.ok()) << m.status().toString();
  EXPECT_TRUE(m->header.flags & kFrameFlagControlLane);
  EXPECT_FALSE(arrived(*t_[1], 1));
}

TEST_F(MemoryNetworkTest, BadOptionsAndOpensAreRefusedNamingWhat) {
  MemoryNetwork::Options o;
  o.worldSize = 2;
  o.oneWay = {{0ms, 0ms}};
  auto bad = MemoryNetwork::make(o, clock_);
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("oneWay"), std::string::npos);
  o.oneWay.clear();
  o.regions = {"a"};
  EXPECT_EQ(MemoryNetwork::make(o, clock_).status().code(), StatusCode::kInvalidArgument);

  make(2, 0ms);
  EXPECT_EQ(net_->open(1).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(net_->open(2).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(t_[0]->updateKeys({}).code(), StatusCode::kUnimplemented);
}

}  // namespace
}  // namespace geo::transport
