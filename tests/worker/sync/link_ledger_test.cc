// DTS's link measurements on exact inputs (no clock, no sockets): samples
// from both ends' lags of a round, in whichever order they come.

#include "worker/sync/link_ledger.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

namespace geo::sync {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Three workers, this one group index 0; small limits to see them work.
LinkLedger ledger() {
  return LinkLedger(3, {2, 3, 600, 3});
}

TEST(LinkLedger, TheSkewBetweenTheTwoEndsCancels) {
  // Peer 1's clock runs 0.2 s ahead: it sees our contribution 0.3 s after
  // its own, we see its 0.1 s before ours. The link is 0.1 s one way.
  LinkLedger l = ledger();
  l.ownLags(7, {kNaN, -0.1, kNaN});
  EXPECT_FALSE(l.measured(1));
  l.theirLag(7, 1, 0.3);
  ASSERT_TRUE(l.measured(1));
  EXPECT_DOUBLE_EQ(*l.longestSample(1), 0.1);
  EXPECT_FALSE(l.measured(2));  // no lag of its
}

TEST(LinkLedger, AReportThatComesFirstWaitsForOurLagsOfItsRound) {
  LinkLedger l = ledger();
  l.theirLag(7, 2, 0.25);
  l.theirLag(8, 2, 0.5);
  EXPECT_FALSE(l.measured(2));
  l.ownLags(7, {kNaN, kNaN, 0.15});
  ASSERT_EQ(l.samples(2).size(), 1u);
  EXPECT_DOUBLE_EQ(l.samples(2).front(), 0.2);
  l.ownLags(8, {kNaN, kNaN, 0.3});
  EXPECT_DOUBLE_EQ(*l.longestSample(2), 0.4);
}

TEST(LinkLedger, KeepsTheLatestSamplesAndNoneBelowZero) {
  LinkLedger l = ledger();
  for (uint64_t round = 1; round <= 3; ++round) {
    l.ownLags(round, {kNaN, 0.1 * static_cast<double>(round), kNaN});
    l.theirLag(round, 1, 0.1 * static_cast<double>(round));
  }
  // Limits::samples = 2: rounds 2 and 3.
  ASSERT_EQ(l.samples(1).size(), 2u);
  EXPECT_DOUBLE_EQ(l.samples(1).front(), 0.2);
  EXPECT_DOUBLE_EQ(*l.longestSample(1), 0.3);
  // Clocks that disagree by more than the link read as 0, not as a negative link.
  l.ownLags(4, {kNaN, -0.5, kNaN});
  l.theirLag(4, 1, 0.1);
  EXPECT_DOUBLE_EQ(l.samples(1).back(), 0.0);
}

TEST(LinkLedger, NoSampleFromALagThatIsNotFiniteOrBeyondTheLimit) {
  LinkLedger l = ledger();
  l.ownLags(1, {kNaN, kNaN, 700.0});
  l.theirLag(1, 1, 0.1);  // our lag of peer 1 is NaN: its contribution never came
  l.theirLag(1, 2, 0.1);  // ours is beyond 600 s
  l.ownLags(2, {kNaN, 0.1, kNaN});
  l.theirLag(2, 1, std::numeric_limits<double>::infinity());
  l.theirLag(2, 1, -601.0);
  l.theirLag(2, 5, 0.1);  // not a member of the group
  EXPECT_FALSE(l.measured(1));
  EXPECT_FALSE(l.measured(2));
}

TEST(LinkLedger, ReportsOfRoundsLongPastAreForgotten) {
  LinkLedger l = ledger();
  l.theirLag(1, 1, 0.2);            // we never complete round 1 ourselves
  l.ownLags(5, {kNaN, 0.2, kNaN});  // more than Limits::ownRounds = 3 rounds later
  l.ownLags(1, {kNaN, 0.2, kNaN});  // (a late round 1 of ours finds nothing waiting)
  EXPECT_FALSE(l.measured(1));
  // Our lags of a round are kept for Limits::ownRounds rounds.
  l.ownLags(6, {kNaN, 0.2, kNaN});
  l.ownLags(7, {kNaN, 0.2, kNaN});
  l.ownLags(8, {kNaN, 0.2, kNaN});
  l.theirLag(5, 1, 0.2);  // our lags of round 5 are gone (we keep rounds 6, 7 and 8)
  EXPECT_FALSE(l.measured(1));
  l.theirLag(6, 1, 0.2);
  EXPECT_TRUE(l.measured(1));
}

TEST(LinkLedger, AStateTransferForgetsTheRoundsNotTheLinks) {
  LinkLedger l = ledger();
  l.ownLags(3, {kNaN, 0.1, kNaN});
  l.theirLag(3, 1, 0.1);
  l.theirLag(4, 1, 0.3);
  l.forgetRounds();
  l.ownLags(4, {kNaN, 0.3, kNaN});  // the new numbering's round 4 is another round
  ASSERT_EQ(l.samples(1).size(), 1u);
  EXPECT_DOUBLE_EQ(*l.longestSample(1), 0.1);
}

// Rounds sent before a peer was suspected (or heard again, restarted,
// reconnected, or an update applied late) measure that, not the link: an
// 8 s partition is no 8 s link. Their lags are no samples, whichever end's
// comes first; the rounds sent after measure again; a state transfer's new
// numbering starts undisturbed.
TEST(LinkLedger, RoundsSentBeforeADisturbanceMeasureNoLink) {
  LinkLedger l = ledger();
  l.theirLag(5, 1, 8.2);  // peer 1's report comes first
  l.disturbed(5);
  l.disturbed(3);  // an earlier bound does not move it down
  EXPECT_FALSE(l.measures(4));
  EXPECT_FALSE(l.measures(5));
  EXPECT_TRUE(l.measures(6));
  l.ownLags(5, {kNaN, 8.1, 0.3});
  l.theirLag(5, 2, 0.3);  // ours of round 5 were kept as none
  EXPECT_FALSE(l.measured(1));
  EXPECT_FALSE(l.measured(2));
  l.ownLags(6, {kNaN, 0.1, kNaN});
  l.theirLag(6, 1, 0.1);
  ASSERT_TRUE(l.measured(1));
  EXPECT_DOUBLE_EQ(*l.longestSample(1), 0.1);
  l.forgetRounds();
  EXPECT_TRUE(l.measures(2));
}

TEST(LinkLedger, TheSmallestRecentRoundTripIsThePaths) {
  LinkLedger l = ledger();
  EXPECT_FALSE(l.smallestRtt(1).has_value());
  l.addRtt(1, 0.23);
  l.addRtt(1, 0.40);  // behind a queue
  l.addRtt(1, -1);    // none measured: ignored
  EXPECT_DOUBLE_EQ(*l.smallestRtt(1), 0.23);
  l.addRtt(1, 0.35);
  l.addRtt(1, 0.30);  // Limits::rtts = 3: 0.23 is no longer recent
  EXPECT_DOUBLE_EQ(*l.smallestRtt(1), 0.30);
}

TEST(LinkLedger, TheLongestCrossingSeenHolds) {
  LinkLedger l = ledger();
  EXPECT_EQ(l.crossingSeconds(), 0);
  l.sawCrossing(2.3);
  l.sawCrossing(0.4);
  EXPECT_DOUBLE_EQ(l.crossingSeconds(), 2.3);
}

// A round seen waiting in our own queue counts for D (the longer of both
// kinds), not for the period's crossing.
TEST(LinkLedger, ARoundSeenInOurQueueCountsForTheDelayOnly) {
  LinkLedger l = ledger();
  l.sawCrossing(2.3);
  l.sawQueuedCrossing(3.6);
  l.sawQueuedCrossing(1.0);
  EXPECT_DOUBLE_EQ(l.crossingSeconds(), 2.3);
  EXPECT_DOUBLE_EQ(l.delayCrossingSeconds(), 3.6);
  l.sawCrossing(4.0);
  EXPECT_DOUBLE_EQ(l.delayCrossingSeconds(), 4.0);
}

}  // namespace
}  // namespace geo::sync
