// Membership (worker/sync/membership.h) in simulated time: suspicion, a
// common start, a rejoin by state transfer, a worker resumed after the job
// ended, over the in-memory network (transport/memory_transport.h) on a
// FakeClock. Minutes of peer time-outs and start-up grace take milliseconds,
// and every time asserted is the one the protocol promises, not a bound.
// (The same protocol over ZeroMQ and real time: sync_test's Membership
// tests and the shell tests with worker processes.)

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "tests/worker/sync/simulated_time.h"
#include "worker/sync/internal.h"
#include "worker/sync/membership.h"
#include "worker/sync/parts.h"
#include "worker/sync/synchronizer.h"
#include "worker/transport/memory_transport.h"

namespace geo::sync::detail {
namespace {

using namespace std::chrono_literals;
using Duration = geo::Clock::Duration;

// Runs each function on a thread of its own in simulated time
// (simulated_time.h), moving the clock on by `quantum` at a time.
void runSimulated(FakeClock& clock, std::vector<std::function<void()>> fns, Duration quantum = 1ms,
                  Duration limit = 600s) {
  std::atomic<size_t> running{fns.size()};
  std::vector<std::thread> threads;
  for (auto& fn : fns) {
    threads.emplace_back([&running, f = std::move(fn)] {
      f();
      --running;
    });
  }
  geo::testing::driveWhileRunning(clock, running, quantum, limit);
  for (auto& t : threads) t.join();
}

class MembershipTest : public ::testing::Test {
 protected:
  // n ranks in regions of their own; oneWay[from][to] in ms (empty: 0).
  void make(uint32_t n, std::vector<std::vector<int>> oneWayMs = {}) {
    transport::MemoryNetwork::Options o;
    o.worldSize = n;
    if (!oneWayMs.empty()) {
      o.oneWay.assign(n, std::vector<Duration>(n));
      for (uint32_t a = 0; a < n; ++a) {
        for (uint32_t b = 0; b < n; ++b) o.oneWay[a][b] = std::chrono::milliseconds(oneWayMs[a][b]);
      }
    }
    auto net = transport::MemoryNetwork::make(o, clock_);
    ASSERT_TRUE(net.ok()) << net.status().toString();
    net_ = *net;
    for (uint32_t r = 0; r < n; ++r) {
      regions_.push_back(fmt::format("r{}", r));
      transports_.push_back(nullptr);
      members_.push_back(nullptr);
    }
    options_.timeout = 60s;
    options_.peerTimeout = 3s;
    options_.clock = &clock_;
    t0_ = clock_.now();
  }
  // Rank r's process: its transport and its membership of the others.
  void start(uint32_t r) {
    members_[r].reset();
    transports_[r].reset();
    auto t = net_->open(r);
    ASSERT_TRUE(t.ok()) << t.status().toString();
    transports_[r] = std::move(*t);
    std::vector<uint32_t> peers;
    for (uint32_t p = 0; p < regions_.size(); ++p) {
      if (p != r) peers.push_back(p);
    }
    auto topology = Topology::make(regions_, r);
    ASSERT_TRUE(topology.ok()) << topology.status().toString();
    members_[r] =
        std::make_unique<Membership>(transports_[r].get(), *topology, peers, options_, "test");
  }
  double elapsed() const { return std::chrono::duration<double>(clock_.now() - t0_).count(); }
  // A worker training at `step` with `values`: it serves the others every
  // poll until `stop`.
  std::function<void()> serving(uint32_t r, int64_t step, torch::Tensor values, bool finished,
                                const std::atomic<bool>& stop) {
    return [this, r, step, values, finished, &stop] {
      while (!stop.load()) {
        ASSERT_TRUE(members_[r]->serve(step, values, finished).ok());
        clock_.sleepFor(20ms);
      }
    };
  }

  FakeClock clock_;
  std::shared_ptr<transport::MemoryNetwork> net_;
  std::vector<std::string> regions_;
  std::vector<std::unique_ptr<transport::Transport>> transports_;
  std::vector<std::unique_ptr<Membership>> members_;
  SyncOptions options_;
  geo::Clock::TimePoint t0_;
};

TEST_F(MembershipTest, APeerSilentForThePeerTimeoutIsSuspectedAndHeardAgainWhenItReturns) {
  make(2, {{0, 100}, {100, 0}});
  start(0);
  start(1);
  clock_.advance(1s);
  members_[0]->refresh();
  EXPECT_FALSE(members_[0]->suspected(1));
  net_->kill(1);  // its last pings arrive 100 ms later; then 3 s of silence
  clock_.advance(3100ms);
  members_[0]->refresh();
  EXPECT_FALSE(members_[0]->suspected(1)) << "suspected before the peer time-out";
  EXPECT_TRUE(members_[0]->takeNewlySuspected().empty());
  clock_.advance(1ms);
  members_[0]->refresh();
  EXPECT_TRUE(members_[0]->suspected(1));
  // The event, once (the synchronizers' peerSuspected hook).
  members_[0]->refresh();
  EXPECT_EQ(members_[0]->takeNewlySuspected(), std::vector<uint32_t>{1});
  EXPECT_TRUE(members_[0]->takeNewlySuspected().empty());

  start(1);  // a new incarnation, heard 100 ms later
  clock_.advance(99ms);
  members_[0]->refresh();
  EXPECT_TRUE(members_[0]->suspected(1));
  clock_.advance(1ms);
  members_[0]->refresh();
  EXPECT_FALSE(members_[0]->suspected(1));
  EXPECT_EQ(members_[0]->takeHeardAgain(), std::vector<uint32_t>{1});
  EXPECT_TRUE(members_[0]->absent(1)) << "expected again only once it delivers";
  SyncStats stats;
  members_[0]->addTo(stats);
  EXPECT_NEAR(stats.degradedSeconds, 0.1, 1e-6);
}

TEST_F(MembershipTest, APeerNeverHeardIsSuspectedAfterTheStartUpGrace) {
  make(2);
  start(0);  // rank 1 never starts
  clock_.advance(20s);
  members_[0]->refresh();
  EXPECT_FALSE(members_[0]->suspected(1));
  clock_.advance(1ms);
  members_[0]->refresh();
  EXPECT_TRUE(members_[0]->suspected(1)) << "the grace is min(round time-out, 20 s)";
}

TEST_F(MembershipTest, ACommonStartContinuesFromStepZeroAfterOneRoundTrip) {
  // A triangle of 50, 100 and 150 ms one way.
  make(3, {{0, 50, 100}, {50, 0, 150}, {100, 150, 0}});
  for (uint32_t r = 0; r < 3; ++r) start(r);
  std::vector<StatusOr<Membership::Joined>> joined(3, Status(StatusCode::kUnknown, "not run"));
  std::vector<double> tookSeconds(3);
  std::vector<torch::Tensor> values(3);
  std::vector<std::function<void()>> workers;
  for (uint32_t r = 0; r < 3; ++r) {
    values[r] = torch::full({8}, static_cast<float>(r));
    workers.push_back([&, r] {
      joined[r] = members_[r]->join(0, 1, values[r]);
      tookSeconds[r] = elapsed();
    });
  }
  runSimulated(clock_, std::move(workers));
  for (uint32_t r = 0; r < 3; ++r) {
    ASSERT_TRUE(joined[r].ok()) << joined[r].status().toString();
    EXPECT_EQ(joined[r]->step, 0);
    EXPECT_FALSE(joined[r]->transferred) << "rank " << r;
    EXPECT_TRUE(torch::equal(values[r], torch::full({8}, static_cast<float>(r))));
    // Its longest round trip (300 ms for ranks 1 and 2, 200 ms for rank
    // 0), plus at most one poll.
    const double rtt = r == 0 ? 0.2 : 0.3;
    EXPECT_GE(tookSeconds[r], rtt) << "rank " << r;
    EXPECT_LE(tookSeconds[r], rtt + 0.021) << "rank " << r;
  }
}

TEST_F(MembershipTest, ALateWorkerTakesTheStateOfTheNearestPeerAhead) {
  // Rank 2 is 200 ms from rank 0 and 20 ms from rank 1.
  make(3, {{0, 10, 200}, {10, 0, 20}, {200, 20, 0}});
  start(0);
  start(1);
  clock_.advance(5s);  // the others train on
  start(2);
  std::atomic<bool> stop{false};
  StatusOr<Membership::Joined> joined = Status(StatusCode::kUnknown, "not run");
  torch::Tensor mine = torch::zeros({8});
  std::vector<std::function<void()>> workers;
  workers.push_back(serving(0, 500, torch::full({8}, 10.0f), false, stop));
  workers.push_back(serving(1, 500, torch::full({8}, 11.0f), false, stop));
  workers.push_back([&] {
    // Its first pings must have come back for the nearest to be known.
    clock_.sleepFor(1s);
    joined = members_[2]->join(0, 1, mine);
    stop = true;
  });
  runSimulated(clock_, std::move(workers));
  ASSERT_TRUE(joined.ok()) << joined.status().toString();
  EXPECT_TRUE(joined->transferred);
  EXPECT_EQ(joined->step, 500);
  EXPECT_FALSE(joined->jobFinished);
  EXPECT_TRUE(torch::equal(mine, torch::full({8}, 11.0f))) << "not the nearest peer's state";
  SyncStats stats;
  members_[2]->addTo(stats);
  EXPECT_EQ(stats.rejoins, 1u);
}

// A state over two parts (4 MiB each) goes in parts behind the sender's
// rounds. Rank 2 takes the 14.7 MB state of rank 1, whose uplink carries
// 10 MB/s; as the first parts leave, rank 1 sends rank 0 a round of 4.2 MB.
// Sent whole, the state was ahead of the round on the uplink, and the
// round took 1.9 s to arrive; in parts, it waits behind the two parts
// already queued at most (1.26 s), and the next part waits for it. The
// state arrives whole, byte for byte.
TEST_F(MembershipTest, ALargeStateGoesInPartsBehindTheSendersRounds) {
  // Rank 2 is 10 ms from rank 1 and 50 ms from rank 0.
  make(3, {{0, 10, 50}, {10, 0, 10}, {50, 10, 0}});
  start(0);
  start(1);
  transports_[1]->setUplinkRate(10e6);
  clock_.advance(5s);
  start(2);
  constexpr int64_t kValues = 3'670'016;  // 14.7 MB: four parts, the last short
  const torch::Tensor state = torch::arange(kValues, torch::kFloat32);
  std::atomic<bool> stop{false};
  StatusOr<Membership::Joined> joined = Status(StatusCode::kUnknown, "not run");
  torch::Tensor mine = torch::zeros({kValues});
  std::optional<geo::Clock::TimePoint> roundSent, roundArrived;
  std::vector<std::function<void()>> workers;
  workers.push_back([&] {
    while (!stop.load()) {
      ASSERT_TRUE(members_[0]->serve(500, torch::zeros({kValues}), false).ok());
      if (!roundArrived &&
          transports_[0]
              ->receive(transport::MessageKind::kUpdate, 7, 1, std::chrono::milliseconds(0))
              .ok()) {
        roundArrived = clock_.now();
      }
      clock_.sleepFor(5ms);
    }
  });
  workers.push_back([&] {
    while (!stop.load()) {
      ASSERT_TRUE(members_[1]->serve(500, state, false).ok());
      if (!roundSent) {
        for (const auto& c : transports_[1]->peerCounters()) {
          if (c.peer != 2 || c.queuedBytes == 0) continue;
          transport::SendMeta meta{7, 500, transport::CodecId::kRaw, 0};
          ASSERT_TRUE(transports_[1]
                          ->send(0, transport::MessageKind::kUpdate, meta,
                                 transport::Payload(std::vector<std::byte>(4'200'000)), 1s)
                          .ok());
          roundSent = clock_.now();
        }
      }
      clock_.sleepFor(5ms);
    }
  });
  workers.push_back([&] {
    clock_.sleepFor(1s);  // its first pings back: the nearest is known
    joined = members_[2]->join(0, 1, mine);
    clock_.sleepFor(2s);  // the round's arrival
    stop = true;
  });
  runSimulated(clock_, std::move(workers));
  ASSERT_TRUE(joined.ok()) << joined.status().toString();
  EXPECT_TRUE(joined->transferred);
  EXPECT_EQ(joined->step, 500);
  EXPECT_TRUE(torch::equal(mine, state)) << "the state's parts did not make it whole";
  ASSERT_TRUE(roundSent && roundArrived);
  const double roundSeconds = std::chrono::duration<double>(*roundArrived - *roundSent).count();
  EXPECT_LT(roundSeconds, 1.4) << "the round waited behind more of the state than two parts";
  std::printf("the round took %.2f s\n", roundSeconds);
}

TEST_F(MembershipTest, AStartUpQueryDeliveredAfterItsSenderStartedAloneLeavesItExpected) {
  // Rank 1's query waits, unread, while rank 0 does not serve (as behind a
  // partition): rank 1 starts on its own after the start-up grace, and its
  // announcement has not come (lost with a connection replaced on a real
  // network) when rank 0 reads the query at step 500 and finds it behind.
  make(2, {{0, 30}, {30, 0}});
  start(0);
  start(1);
  torch::Tensor mine = torch::zeros({8});
  StatusOr<Membership::Joined> joined = Status(StatusCode::kUnknown, "not run");
  runSimulated(clock_, {[&] { joined = members_[1]->join(0, 1, mine); }}, 20ms);
  ASSERT_TRUE(joined.ok()) << joined.status().toString();
  EXPECT_FALSE(joined->transferred) << "nobody answered: it starts from its own state";
  std::atomic<bool> stop{false};
  bool joiningSeen = false;
  runSimulated(clock_,
               {serving(1, 300, torch::full({8}, 1.0f), false, stop), [&] {
                  for (int i = 0; i < 100; ++i) {
                    ASSERT_TRUE(members_[0]->serve(500, torch::full({8}, 2.0f), false).ok());
                    joiningSeen = joiningSeen || members_[0]->joining(1);
                    clock_.sleepFor(20ms);
                  }
                  stop = true;
                }});
  EXPECT_TRUE(joiningSeen) << "the query was not taken for a late joiner's: nothing was tested";
  EXPECT_FALSE(members_[0]->joining(1))
      << "rank 1 started on its own long ago, yet rank 0 still waits for its join";
  EXPECT_TRUE(members_[0]->expected(1, 300));
}

TEST_F(MembershipTest, AWorkerResumedWhenNoPeerAnswersFailsAfterTheGraceSayingWhy) {
  make(2);
  start(0);  // rank 1 is gone for good
  StatusOr<Membership::Joined> joined = Status(StatusCode::kUnknown, "not run");
  torch::Tensor mine = torch::zeros({8});
  // Time in steps of the join's poll (20 ms): 20 s in a thousand of them.
  runSimulated(clock_, {[&] { joined = members_[0]->join(50, 1, mine); }}, 20ms);
  ASSERT_EQ(joined.status().code(), StatusCode::kFailedPrecondition) << joined.status().toString();
  EXPECT_NE(joined.status().message().find("resumed at step 50"), std::string::npos)
      << joined.status().message();
  EXPECT_NEAR(elapsed(), 20.0, 0.021) << "the start-up grace";
}

TEST_F(MembershipTest, AWorkerThatStartsAfterTheEndTakesTheFinalModel) {
  make(2, {{0, 30}, {30, 0}});
  start(0);
  members_[0]->setFinishing();
  members_[0]->setFinalModel();
  clock_.advance(2s);
  start(1);
  std::atomic<bool> stop{false};
  StatusOr<Membership::Joined> joined = Status(StatusCode::kUnknown, "not run");
  torch::Tensor mine = torch::zeros({8});
  runSimulated(clock_, {serving(0, 800, torch::full({8}, 7.0f), true, stop), [&] {
                          joined = members_[1]->join(0, 1, mine);
                          stop = true;
                        }});
  ASSERT_TRUE(joined.ok()) << joined.status().toString();
  EXPECT_TRUE(joined->jobFinished);
  EXPECT_TRUE(joined->finalModel);
  EXPECT_TRUE(torch::equal(mine, torch::full({8}, 7.0f)));
}

// Announced resumes: a resume sent before its sender came to suspect us is
// stale, whatever order the two arrive in. Rank 0's sends are lost (a
// throttled uplink); rank 2 suspects it and tells rank 1, which stops
// waiting for it and asks it for its resume, offering its own (from round
// 10); a second later rank 1 suspects rank 0 itself and tells it so. Rank
// 0, busy all that time (on the namespace network its ACKs were stuck
// behind the throttle, so what the peers sent it came in one burst), reads
// the notice and the resume at once: taking the resume, it waited for rank
// 1's contributions until the throttle lifted, though rank 1 sent it none.
// Once rank 1 hears rank 0 again, its fresh resume is taken; a resume that
// names an older round than one taken since is stale as well.
TEST_F(MembershipTest, AResumeSentBeforeItsSenderCameToSuspectUsIsStale) {
  make(3, {{0, 50, 50}, {50, 0, 50}, {50, 50, 0}});
  options_.peerTimeout = 4s;
  start(1);  // slower to suspect than rank 2
  options_.peerTimeout = 3s;
  start(0);
  start(2);
  for (auto& m : members_) m->setResumeAnnounced(true);
  const torch::Tensor values = torch::zeros({4});
  const auto serve = [&](std::initializer_list<uint32_t> ranks) {
    for (uint32_t r : ranks) ASSERT_TRUE(members_[r]->serve(10, values, false).ok());
  };
  const auto runFor = [&](Duration d, std::initializer_list<uint32_t> ranks) {
    for (const auto end = clock_.now() + d; clock_.now() < end;) {
      clock_.advance(20ms);
      serve(ranks);
    }
  };
  runFor(1s, {0, 1, 2});
  ASSERT_TRUE(members_[0]->expected(1, 10));
  net_->cutOneWay(0, 1, true);
  net_->cutOneWay(0, 2, true);
  runFor(3500ms, {1, 2});
  ASSERT_TRUE(members_[2]->suspected(0));
  ASSERT_FALSE(members_[1]->suspected(0));
  ASSERT_FALSE(members_[1]->expected(0, 10)) << "rank 2's notice was not taken";
  runFor(1s, {1, 2});
  ASSERT_TRUE(members_[1]->suspected(0));
  serve({0});
  EXPECT_FALSE(members_[0]->expected(1, 10))
      << "took the resume rank 1 sent before it came to suspect rank 0";
  EXPECT_FALSE(members_[0]->expected(2, 10));
  net_->cutOneWay(0, 1, false);
  net_->cutOneWay(0, 2, false);
  runFor(500ms, {0, 1, 2});
  EXPECT_FALSE(members_[1]->suspected(0));
  EXPECT_TRUE(members_[0]->expected(1, 10)) << "the resume rank 1 sent on hearing rank 0 again";
  EXPECT_TRUE(members_[0]->expected(2, 10));
  // A resume naming an older round than one taken since (an old connection
  // delivering after a new one; a worker's oldest open round only grows),
  // though it counts every notice: stale too. Taken, rank 0 would wait for
  // round 5, which rank 1 completed without it.
  auto topology = Topology::make(regions_, 1);
  ASSERT_TRUE(topology.ok()) << topology.status().toString();
  // (No join ran here: rank 0 does not know rank 1's incarnation, and
  // takes any.)
  ASSERT_TRUE(sendBuffer(*transports_[1], *topology, {0}, transport::MessageKind::kControl,
                         {roundOf(Control::kResume), 10}, ResumePayload{5, false, 1, 0}.encode(),
                         1s)
                  .ok());
  runFor(200ms, {0, 1, 2});
  EXPECT_FALSE(members_[0]->expected(1, 5)) << "took a resume older than one taken before";
  EXPECT_TRUE(members_[0]->expected(1, 10));
}

// Notices and resumes carry their sender's incarnation. What an earlier
// process of a peer sent (a killed worker's kernel still sends what its
// sockets held, and over a congested path that comes late) is void: its
// notice, counting 7 where the new process has sent none, made every
// resume of the new one stale, and the peer was never waited for again.
TEST_F(MembershipTest, NoticesAndResumesOfAnEarlierProcessOfAPeerAreVoid) {
  make(2, {{0, 50}, {50, 0}});
  start(0);
  start(1);
  for (auto& m : members_) m->setResumeAnnounced(true);
  std::vector<torch::Tensor> values = {torch::zeros({4}), torch::zeros({4})};
  runSimulated(clock_, {[&] { ASSERT_TRUE(members_[0]->join(0, 1, values[0]).ok()); },
                        [&] { ASSERT_TRUE(members_[1]->join(0, 1, values[1]).ok()); }});
  const auto runFor = [&](Duration d) {
    for (const auto end = clock_.now() + d; clock_.now() < end;) {
      clock_.advance(20ms);
      for (uint32_t r : {0u, 1u}) ASSERT_TRUE(members_[r]->serve(10, values[r], false).ok());
    }
  };
  runFor(1s);
  ASSERT_TRUE(members_[0]->expected(1, 10));
  auto topology = Topology::make(regions_, 1);
  ASSERT_TRUE(topology.ok()) << topology.status().toString();
  const uint64_t earlier = 12345;  // not rank 1's (random, 64 bits)
  const auto fromEarlier = [&](Control control, std::shared_ptr<std::vector<std::byte>> bytes) {
    ASSERT_TRUE(sendBuffer(*transports_[1], *topology, {0}, transport::MessageKind::kControl,
                           {roundOf(control), 10}, std::move(bytes), 1s)
                    .ok());
  };
  // Taken, the notice would leave rank 0 asking rank 1 for its resume every
  // 2 s, and taking none of its answers (they count no notice).
  fromEarlier(Control::kSuspects, SuspectsPayload{10, 7, earlier}.encode());
  runFor(5s);
  EXPECT_TRUE(members_[0]->expected(1, 10)) << "took a notice of an earlier process of rank 1";
  fromEarlier(Control::kResume, ResumePayload{3, false, 7, earlier}.encode());
  runFor(200ms);
  // Taken, the resume would have moved the first round rank 1 is expected
  // in from 0 (a common start) to 3.
  EXPECT_TRUE(members_[0]->expected(1, 0)) << "took a resume of an earlier process of rank 1";
}

// A payload's parts (parts.h) put back together: in order, a sender that
// begins again at byte 0, and each way a part can be wrong, named.
TEST(PartsAssembler, PutsAPayloadTogetherAndNamesABrokenPart) {
  std::vector<std::byte> whole(10);
  for (size_t i = 0; i < whole.size(); ++i) whole[i] = static_cast<std::byte>(i);
  PartsAssembler a(64);
  bool complete = true;
  ASSERT_TRUE(a.add(*makePart(whole, 0, 4), complete).ok());
  EXPECT_FALSE(complete);
  EXPECT_EQ(a.received(), 4u);
  EXPECT_EQ(a.total(), 10u);
  // The sender began again: the payload starts over.
  ASSERT_TRUE(a.add(*makePart(whole, 0, 4), complete).ok());
  ASSERT_TRUE(a.add(*makePart(whole, 4, 4), complete).ok());
  ASSERT_TRUE(a.add(*makePart(whole, 8, 2), complete).ok());
  ASSERT_TRUE(complete);
  EXPECT_EQ(a.take(), whole);
  EXPECT_EQ(a.total(), 0u);
  const auto refused = [&](std::span<const std::byte> part, const std::string& says) {
    const Status s = a.add(part, complete);
    EXPECT_FALSE(s.ok()) << says;
    EXPECT_NE(s.message().find(says), std::string::npos) << s.message();
    EXPECT_FALSE(complete);
    EXPECT_EQ(a.received(), 0u) << "a broken part drops what came";
  };
  refused(std::vector<std::byte>(15), "a part of 15 bytes");
  ASSERT_TRUE(a.add(*makePart(whole, 0, 4), complete).ok());
  refused(*makePart(whole, 8, 2), "a part at byte 8 of 10 after 4 bytes");  // out of order
  std::vector<std::byte> large(100);
  refused(*makePart(large, 0, 4), "of 100 after 0 bytes of 0 (at most 64)");
  auto overlong = makePart(whole, 8, 2);
  overlong->push_back(std::byte{0});  // past the payload's end
  ASSERT_TRUE(a.add(*makePart(whole, 0, 8), complete).ok());
  refused(*overlong, "a part at byte 8 of 10");
}

}  // namespace
}  // namespace geo::sync::detail
