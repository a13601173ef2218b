// DTS's uplink pacing on exact inputs (no clock of its own, no sockets):
// when a round waits for the uplink, and what the rounds' pace says of it.

#include "worker/sync/uplink_pace.h"

#include <gtest/gtest.h>

#include <chrono>
#include <vector>

namespace geo::sync {
namespace {

using std::chrono::milliseconds;

constexpr uint64_t kRound = 100'000;  // bytes of a round's update

TEST(RoundStillQueued, WhenTheTransportHoldsARoundsBytesOrMore) {
  EXPECT_TRUE(roundStillQueued({kRound, 0.23, 0, 0.01}, kRound, 0.05));
  EXPECT_TRUE(roundStillQueued({3 * kRound, -1, 0, -1}, kRound, 0.05));  // nothing measured yet
  EXPECT_FALSE(roundStillQueued({kRound - 1, 0.23, 0, 0.01}, kRound, 0.05));
}

TEST(RoundStillQueued, ARoundsBytesNotYetLeftThisMachineWhateverTheAcknowledgementsSay) {
  // In ZeroMQ's pipe and the kernel's send buffer (PeerCounters::
  // Transport::queuedBelowBytes): the peer's acknowledgements silent for seconds, as
  // across its own saturated uplink, do not hide them.
  EXPECT_TRUE(roundStillQueued({0, 0.23, 5.0, 3.0, kRound}, kRound, 0.05));
  EXPECT_TRUE(roundStillQueued({kRound / 2, 0.23, 0, -1, kRound / 2}, kRound, 0.05));
  EXPECT_FALSE(roundStillQueued({0, 0.23, 5.0, 3.0, kRound - 1}, kRound, 0.05));
}

TEST(RoundStillQueued, BelowTheTransportWhileAcknowledgementsKeepComing) {
  // A socket buffer took the bytes at once (no backlog here): the oldest
  // data unacknowledged for longer than a round trip and two rounds (0.23 +
  // 2 x 0.05 = 0.33 s) says a round's worth waits on the way.
  EXPECT_TRUE(roundStillQueued({0, 0.23, 0.34, 0.01}, kRound, 0.05));
  EXPECT_FALSE(roundStillQueued({0, 0.23, 0.32, 0.01}, kRound, 0.05));
  // The rounds' length counts: longer rounds leave the queue more time.
  EXPECT_FALSE(roundStillQueued({0, 0.23, 0.34, 0.01}, kRound, 0.10));
}

TEST(RoundStillQueued, NotOnTheSilenceOfAcknowledgements) {
  // Acknowledgements stopped (lost at a full queue, TCP backing off): their
  // silence says nothing of the data's queue, and holding on it stalled
  // every worker for seconds.
  EXPECT_FALSE(roundStillQueued({0, 0.23, 2.0, 0.5}, kRound, 0.05));
  // No acknowledgement or round trip yet: nothing to go by.
  EXPECT_FALSE(roundStillQueued({0, 0.23, 2.0, -1}, kRound, 0.05));
  EXPECT_FALSE(roundStillQueued({0, -1, 2.0, 0.01}, kRound, 0.05));
}

TEST(RoundStillQueued, NeverBeforeTheFirstRound) {
  EXPECT_FALSE(roundStillQueued({5, 0.23, 2.0, 0.01}, 0, 0.05));
}

// A shared uplink queues a round for every peer; one peer's queue alone
// is its link's (a cut, a slow path), and holds nothing back.
TEST(UplinkHoldsRound, OnlyWhereTheRoundIsQueuedForMoreThanHalfThePeers) {
  const PeerQueue queued{2 * kRound, 0.23, 0, 0.01};
  const PeerQueue clear{0, 0.23, 0.01, 0.01};
  const auto holds = [](std::vector<PeerQueue> q) { return uplinkHoldsRound(q, kRound, 0.05); };
  EXPECT_TRUE(holds({queued}));
  EXPECT_FALSE(holds({queued, clear}));
  EXPECT_TRUE(holds({queued, queued}));
  EXPECT_FALSE(holds({clear, queued, clear}));
  EXPECT_TRUE(holds({queued, queued, clear}));
  std::vector<PeerQueue> fifteen(15, clear);
  fifteen[12] = queued;  // one link cut among fifteen
  EXPECT_FALSE(holds(fifteen));
  EXPECT_FALSE(holds({}));
  EXPECT_FALSE(uplinkHoldsRound(std::vector<PeerQueue>{queued}, 0, 0.05));  // no round yet
}

TEST(UplinkPace, ARoundLastsKStepsUntilRoundsHaveLeftThenTheirMeanInterval) {
  UplinkPace pace(4);
  EXPECT_DOUBLE_EQ(pace.roundSeconds(16, 0.002), 0.032);
  const geo::Clock::TimePoint t0{};
  pace.sent(t0);  // the first round: no interval yet
  EXPECT_DOUBLE_EQ(pace.roundSeconds(16, 0.002), 0.032);
  pace.sent(t0 + milliseconds(100));
  pace.sent(t0 + milliseconds(300));
  EXPECT_DOUBLE_EQ(pace.roundSeconds(16, 0.002), 0.150);
  // The window keeps the last four intervals.
  for (int i = 1; i <= 4; ++i) pace.sent(t0 + milliseconds(300 + 50 * i));
  EXPECT_DOUBLE_EQ(pace.roundSeconds(16, 0.002), 0.050);
  // A new period forgets the old one's rounds.
  pace.periodChanged();
  EXPECT_DOUBLE_EQ(pace.roundSeconds(32, 0.002), 0.064);
}

TEST(UplinkPace, TwoRoundsHeldBackGiveTheLongerOfTheirIntervals) {
  UplinkPace pace(4);
  const geo::Clock::TimePoint t0{};
  pace.sent(t0);
  pace.setHeld(true);
  pace.sent(t0 + milliseconds(400));
  EXPECT_FALSE(pace.heldRoundSeconds().has_value());  // one held round is not two
  pace.sent(t0 + milliseconds(850));
  ASSERT_TRUE(pace.heldRoundSeconds().has_value());
  EXPECT_NEAR(*pace.heldRoundSeconds(), 0.450, 1e-12);
  pace.setHeld(false);
  pace.sent(t0 + milliseconds(900));
  EXPECT_FALSE(pace.heldRoundSeconds().has_value());
  EXPECT_FALSE(pace.held());
}

// The uplink's rate from what the peers acknowledged while it held two
// rounds back: not the rounds' length, which also holds the draining of a
// queue an earlier K left.
TEST(UplinkPace, TheHeldRateIsTheBytesAcknowledgedOverTwoHeldRounds) {
  UplinkPace pace(4);
  const geo::Clock::TimePoint t0{};
  pace.sent(t0, 1'000);
  pace.setHeld(true);
  pace.sent(t0 + milliseconds(4000), 1'000 + 1'000'000);  // 4 s of queue drained
  EXPECT_FALSE(pace.heldBytesPerSecond().has_value());    // one held round is not two
  EXPECT_EQ(pace.heldRate(), 0);
  pace.sent(t0 + milliseconds(5000), 1'000 + 1'250'000);
  ASSERT_TRUE(pace.heldBytesPerSecond().has_value());
  EXPECT_DOUBLE_EQ(*pace.heldBytesPerSecond(), 250'000);  // 1.25 MB over 5 s
  EXPECT_NEAR(*pace.heldRoundSeconds(), 4.0, 1e-12);      // the length: the drain's
  EXPECT_DOUBLE_EQ(pace.heldRate(), 250'000);
  // A round not held: no rate now, the last one kept, across a new period.
  pace.setHeld(false);
  pace.sent(t0 + milliseconds(5500), 1'000 + 1'300'000);
  EXPECT_FALSE(pace.heldBytesPerSecond().has_value());
  pace.periodChanged();
  EXPECT_DOUBLE_EQ(pace.heldRate(), 250'000);
  // Nothing acknowledged (a transport that does not count, or a counter
  // that went back): no rate.
  UplinkPace silent(4);
  silent.setHeld(true);
  silent.sent(t0, 0);
  silent.sent(t0 + milliseconds(100), 0);
  silent.sent(t0 + milliseconds(200), 0);
  EXPECT_TRUE(silent.heldRoundSeconds().has_value());
  EXPECT_FALSE(silent.heldBytesPerSecond().has_value());
  // Less than a round's payload acknowledged over two held rounds: the
  // acknowledgements lag (they travel with the peers' traffic and pings),
  // and no rate is taken from it (two short held rounds read as 1.4 KB/s
  // where the reports said 24 MB/s, and paced a final average at that).
  UplinkPace lagging(4);
  lagging.encoded(100'000);
  lagging.sent(t0, 5'000);
  lagging.setHeld(true);
  lagging.sent(t0 + milliseconds(50), 5'000 + 100);
  lagging.sent(t0 + milliseconds(100), 5'000 + 138);
  EXPECT_TRUE(lagging.heldRoundSeconds().has_value());
  EXPECT_FALSE(lagging.heldBytesPerSecond().has_value());
  EXPECT_EQ(lagging.heldRate(), 0);
  lagging.sent(t0 + milliseconds(150), 5'000 + 100'138);  // a round's payload over the last two
  ASSERT_TRUE(lagging.heldBytesPerSecond().has_value());
  EXPECT_DOUBLE_EQ(*lagging.heldBytesPerSecond(), 100'038 / 0.1);
}

TEST(UplinkPace, TheRateIsTheLatestRoundToEveryPeerOverTheSlowestTransfer) {
  UplinkPace pace(4);
  pace.measuredTransfer(0.5, 3);
  EXPECT_EQ(pace.bytesPerSecond(), 0);  // no round yet
  pace.encoded(1'000'000);
  EXPECT_EQ(pace.lastRoundBytes(), 1'000'000u);
  pace.measuredTransfer(0.0, 3);  // no transfer measured
  pace.measuredTransfer(0.5, 0);  // no peer
  EXPECT_EQ(pace.bytesPerSecond(), 0);
  pace.measuredTransfer(0.25, 3);
  EXPECT_DOUBLE_EQ(pace.bytesPerSecond(), 12'000'000);
}

// The rate the final average goes by: the smaller of the two where both are
// known (each can read high: a transfer from lag reports bounds the
// uplink's time from below where the uplink is not the limit), the one
// known otherwise, 0 before either.
TEST(UplinkPace, TheRateIsTheSmallerOfTheHeldAndTheReportedOnesWhereBothAreKnown) {
  UplinkPace pace(4);
  EXPECT_EQ(pace.rate(), 0);
  EXPECT_EQ(pace.rateSource(), "nothing");
  const geo::Clock::TimePoint t0{};
  pace.sent(t0, 0);
  pace.setHeld(true);
  pace.sent(t0 + milliseconds(1000), 250'000);
  pace.sent(t0 + milliseconds(2000), 500'000);
  ASSERT_DOUBLE_EQ(pace.heldRate(), 250'000);
  EXPECT_DOUBLE_EQ(pace.rate(), 250'000);  // held only: across a change of K too
  EXPECT_EQ(pace.rateSource(), "rounds the uplink held back");
  pace.periodChanged();
  EXPECT_DOUBLE_EQ(pace.rate(), 250'000);
  pace.encoded(100'000);
  pace.measuredTransfer(0.3, 3);  // 1 MB/s by the reports
  EXPECT_DOUBLE_EQ(pace.rate(), 250'000);
  pace.measuredTransfer(3.0, 3);  // 0.1 MB/s
  EXPECT_DOUBLE_EQ(pace.rate(), 100'000);
  EXPECT_EQ(pace.rateSource(),
            "the smaller of rounds held back (0.25 MB/s) and the lag reports (0.1 MB/s)");
  UplinkPace reported(4);
  reported.encoded(100'000);
  reported.measuredTransfer(0.3, 3);
  EXPECT_DOUBLE_EQ(reported.rate(), 1'000'000);  // reports only
  EXPECT_EQ(reported.rateSource(), "the lag reports");
}

// What left this machine while it held data back: a 2 Mbit/s uplink
// (250 KB/s) sampled every 100 ms, 25 KB leaving each time.
TEST(BusyUplinkRate, TheBytesThatLeftOverTheTimeDataWaitedAtBothEnds) {
  BusyUplinkRate busy;
  const geo::Clock::TimePoint t0{};
  const auto at = [&](int tenths) { return t0 + milliseconds(100 * tenths); };
  busy.sample(at(0), 0, 200'000);
  for (int i = 1; i < 10; ++i) busy.sample(at(i), 25'000 * static_cast<uint64_t>(i), 200'000);
  // 0.9 s busy: not yet a rate (a round trip's or a burst's timing).
  EXPECT_NEAR(busy.busySeconds(), 0.9, 1e-9);
  EXPECT_EQ(busy.bytesPerSecond(), 0);
  busy.sample(at(10), 250'000, 200'000);
  EXPECT_DOUBLE_EQ(busy.bytesPerSecond(), 250'000);
}

TEST(BusyUplinkRate, NotWhereThisWorkerPacedItsOwnBytes) {
  BusyUplinkRate busy;
  const geo::Clock::TimePoint t0{};
  const auto at = [&](int tenths) { return t0 + milliseconds(100 * tenths); };
  // 1.2 s busy at 250 KB/s.
  for (int i = 0; i <= 12; ++i) busy.sample(at(i), 25'000 * static_cast<uint64_t>(i), 100'000);
  ASSERT_DOUBLE_EQ(busy.bytesPerSecond(), 250'000);
  // The queue ran dry within the next interval: its bytes count (they left
  // no faster than the path carries them).
  busy.sample(at(13), 325'000, 0);
  EXPECT_DOUBLE_EQ(busy.bytesPerSecond(), 250'000);
  // An interval that began with nothing queued does not: 1 MB handed over
  // and gone within it, at a pace this worker set, not the path.
  busy.sample(at(14), 1'325'000, 100'000);
  EXPECT_DOUBLE_EQ(busy.bytesPerSecond(), 250'000);
  // Nor one over kLongestGap: the queue may have run dry in between.
  busy.sample(at(30), 2'000'000, 100'000);
  EXPECT_DOUBLE_EQ(busy.bytesPerSecond(), 250'000);
  busy.sample(at(31), 2'025'000, BusyUplinkRate::kBusyBytes - 1);
  EXPECT_DOUBLE_EQ(busy.bytesPerSecond(), 250'000);
  // Nor one that began with less than kBusyBytes queued.
  busy.sample(at(32), 2'200'000, 100'000);
  EXPECT_DOUBLE_EQ(busy.bytesPerSecond(), 250'000);
  // A counter that went back (a transport replaced) counts from there on.
  busy.sample(at(33), 0, 100'000);
  busy.sample(at(34), 25'000, 100'000);
  EXPECT_DOUBLE_EQ(busy.bytesPerSecond(), 250'000);
  EXPECT_NEAR(busy.busySeconds(), 1.5, 1e-9);
}
}  // namespace
}  // namespace geo::sync
