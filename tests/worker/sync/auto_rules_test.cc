// DTS's automatic delay and period decisions on exact inputs (no clock, no
// sockets): the rules docs/architecture.md section 3 specifies.

#include "worker/sync/auto_rules.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace geo::sync {
namespace {

TEST(AutoDelay, CoversTheSlowestLinkInStepsOfCompute) {
  EXPECT_EQ(autoDelaySteps(0.120, 0.017, 256), 8);  // 7.06 steps: round up
  EXPECT_EQ(autoDelaySteps(0.100, 0.020, 256), 5);  // an exact multiple stays
  EXPECT_EQ(autoDelaySteps(0.0, 0.020, 256), 0);    // no latency: no delay
  EXPECT_EQ(autoDelaySteps(0.001, 0.020, 256), 1);  // any latency: at least one step
}

TEST(AutoDelay, StaysWithinItsCap) {
  EXPECT_EQ(autoDelaySteps(3.35, 0.0113, 256), 256);  // a queued link, measured
  EXPECT_EQ(autoDelaySteps(600, 1e-9, 256), 256);     // absurd ratios do not overflow
}

TEST(AutoDelay, DecidesNothingWithoutAStepTimeOrALink) {
  EXPECT_FALSE(autoDelaySteps(0.1, 0.0, 256).has_value());
  EXPECT_FALSE(autoDelaySteps(-1.0, 0.02, 256).has_value());  // no link measured
}

// The job's pace: steps of 10 ms with a wait of 30 ms at every fourth (a
// round's due step, a slower peer): 17.5 ms a step; the D that covers a
// 140 ms link in it is 8 steps where the 10 ms between the waits asked 14.
// A round closed before the first D was known waits at the cap (256) and
// is due D after it was sent once D is known, or sooner where it already was.
TEST(DueStep, AProvisionalRoundIsDueDAfterItWasSent) {
  EXPECT_EQ(dueStepOnNewDelay(16, 16 + 256, 60, true, false), 76);
  EXPECT_EQ(dueStepOnNewDelay(16, 30, 60, true, false), 30);
  EXPECT_EQ(dueStepOnNewDelay(16, 16 + 256, 60, true, true), 76);
}

// Before every link is measured the rounds in flight follow D both ways:
// sixteen regions on two cores chose D = 231 from a first step of 1 ms and
// 20 once the others computed; the round sent at step 16 is due at 36, not
// kept at 247. And a D raised by a round seen crossing covers it too.
TEST(DueStep, BeforeTheLinksAreMeasuredARoundInFlightFollowsD) {
  EXPECT_EQ(dueStepOnNewDelay(16, 16 + 231, 20, false, false), 36);
  EXPECT_EQ(dueStepOnNewDelay(16, 36, 40, false, false), 56);
}

// Once the links are measured a round in flight comes due sooner with a
// smaller D, never later: a worker whose D had run up to 249 while it ran
// ahead on an idle core keeps its rounds in flight due 249 steps after
// they were sent no longer than it takes D to come down.
TEST(DueStep, OnceTheLinksAreMeasuredARoundInFlightOnlyComesSooner) {
  EXPECT_EQ(dueStepOnNewDelay(16, 36, 40, false, true), 36);
  EXPECT_EQ(dueStepOnNewDelay(16, 16 + 249, 15, false, true), 31);
}

// A peer whose rounds of 16 steps arrive every 480 ms runs at 30 ms a
// step: D for a 2 x 250 ms link counts 17 of those steps, not the 250 a
// worker's own 2 ms steps on an idle core asked.
TEST(PeerPace, IsTheSecondsBetweenItsRoundsPerStepOfItsOwn) {
  std::vector<PeerStamp> stamps;
  for (int r = 0; r < 5; ++r) stamps.push_back({10.0 + 0.48 * r, 16 * (r + 1)});
  const auto pace = peerPaceSeconds(stamps);
  ASSERT_TRUE(pace.has_value());
  EXPECT_NEAR(*pace, 0.030, 1e-12);
  EXPECT_EQ(autoDelaySteps(0.5, *pace, 256), 17);
  EXPECT_EQ(autoDelaySteps(0.5, 0.002, 256), 250);
}

// The median, not the span: a partition of 8 s between two rounds, or two
// rounds that arrive together behind a queue, move it by one interval.
TEST(PeerPace, OneLongGapOrABurstDoesNotMoveIt) {
  const std::vector<PeerStamp> gap = {{0, 16}, {0.32, 32}, {8.64, 48}, {8.96, 64}, {9.28, 80}};
  EXPECT_NEAR(*peerPaceSeconds(gap), 0.020, 1e-12);
  const std::vector<PeerStamp> burst = {{0, 16},    {0.32, 32}, {0.96, 48},
                                        {0.97, 64}, {1.28, 80}, {1.60, 96}};
  EXPECT_NEAR(*peerPaceSeconds(burst), 0.020, 1e-12);
  // An even count: the mean of the middle two (20 and 30 ms a step).
  const std::vector<PeerStamp> even = {{0, 0}, {0.16, 8}, {0.40, 16}, {0.72, 24}, {0.88, 32}};
  EXPECT_NEAR(*peerPaceSeconds(even), 0.025, 1e-12);
}

// Rounds of different lengths (an auto K that grew from 16 to 32) count
// per step; a round that closed no later than the one before adds nothing.
TEST(PeerPace, CountsPerStepAcrossAChangeOfPeriodAndSkipsNoStep) {
  const std::vector<PeerStamp> stamps = {{0, 16},    {0.32, 32}, {0.64, 48},
                                         {0.64, 48}, {1.28, 80}, {1.92, 112}};
  EXPECT_NEAR(*peerPaceSeconds(stamps), 0.020, 1e-12);
}

TEST(PeerPace, NeedsThreeIntervals) {
  EXPECT_FALSE(peerPaceSeconds(std::vector<PeerStamp>{}).has_value());
  EXPECT_FALSE(peerPaceSeconds(std::vector<PeerStamp>{{0, 16}, {0.3, 32}, {0.6, 48}}).has_value());
  EXPECT_FALSE(peerPaceSeconds(std::vector<PeerStamp>{{0, 16}, {0.3, 32}, {0.3, 32}, {0.6, 48}})
                   .has_value());
  EXPECT_TRUE(peerPaceSeconds(std::vector<PeerStamp>{{0, 16}, {0.3, 32}, {0.6, 48}, {0.9, 64}})
                  .has_value());
}

// The median of the peers' paces known (the upper one of an even count);
// a pace not known yet (0) is left out, and none known says nothing.
TEST(PeerPace, TheJobsPaceIsThePeersMedian) {
  EXPECT_EQ(medianPace(std::vector<double>{0.030, 0, 0.002, 0.045, 0.031}), 4u);
  EXPECT_EQ(medianPace(std::vector<double>{0.030, 0.045}), 1u);
  EXPECT_EQ(medianPace(std::vector<double>{0, 0.020, 0}), 1u);
  EXPECT_FALSE(medianPace(std::vector<double>{0, 0, -1}).has_value());
  EXPECT_FALSE(medianPace(std::vector<double>{}).has_value());
}

TEST(JobPace, CountsTheWaitsForSlowerPeersInTheStep) {
  std::vector<PaceStep> steps = {{0, 0}};
  for (int i = 1; i <= 8; ++i) {
    const double wait = i % 4 == 0 ? 0.030 : 0.0;
    steps.push_back({steps.back().endSeconds + 0.010 + wait, wait});
  }
  const auto pace = jobPaceSeconds(steps, 0.140);
  ASSERT_TRUE(pace.has_value());
  EXPECT_NEAR(*pace, 0.0175, 1e-12);
  EXPECT_EQ(autoDelaySteps(0.140, *pace, 256), 8);
  EXPECT_EQ(autoDelaySteps(0.140, 0.010, 256), 14);
}

// Without waits the pace is the step; a wait beyond the cap (a suspicion,
// a partition) counts only up to it: 3 s there, 4 steps of 10 ms and a cap
// of 100 ms give 35 ms, not 760.
TEST(JobPace, AFaultsWaitCountsOnlyUpToTheLink) {
  EXPECT_NEAR(*jobPaceSeconds(std::vector<PaceStep>{{1.0, 0}, {1.01, 0}, {1.02, 0}}, 0.1), 0.010,
              1e-12);
  const std::vector<PaceStep> steps = {{0, 0}, {0.010, 0}, {3.020, 3.0}, {3.030, 0}, {3.040, 0}};
  EXPECT_NEAR(*jobPaceSeconds(steps, 0.100), 0.035, 1e-12);
}

TEST(JobPace, KnowsNothingBeforeTwoSteps) {
  EXPECT_FALSE(jobPaceSeconds(std::vector<PaceStep>{}, 0.1).has_value());
  EXPECT_FALSE(jobPaceSeconds(std::vector<PaceStep>{{1.0, 0}}, 0.1).has_value());
}

TEST(LinkBeforeReports, IsHalfTheLongestRoundTripOnceEveryPeerHasOne) {
  const std::vector<double> all = {0.010, 0.230, 0.140};
  EXPECT_DOUBLE_EQ(*linkBeforeReports(all, 0), 0.115);
  // A round seen crossing for longer counts; one shorter does not.
  EXPECT_DOUBLE_EQ(*linkBeforeReports(all, 0.4), 0.4);
  EXPECT_DOUBLE_EQ(*linkBeforeReports(all, 0.05), 0.115);
}

TEST(LinkBeforeReports, KnowsNothingWhileAPeerHasNotAnswered) {
  // The near peers' round trips alone are not the slowest link.
  EXPECT_FALSE(linkBeforeReports(std::vector<double>{0.010, -1, 0.140}, 0).has_value());
  EXPECT_FALSE(linkBeforeReports(std::vector<double>{0.010, 0, 0.140}, 0.3).has_value());
  // No peer expected, or none answered: not a link of 0 ms.
  EXPECT_FALSE(linkBeforeReports(std::vector<double>{}, 0).has_value());
  EXPECT_FALSE(linkBeforeReports(std::vector<double>{-1, -1}, 0).has_value());
}

TEST(SlowestLink, APeerNotMeasuredYetCountsWithItsRoundTripBesideTheMeasuredOnes) {
  // oregon measured at 40 ms, london and tokyo not yet: tokyo's ping (230 ms
  // round trip) says more than oregon's measurement.
  const std::vector<PeerLink> peers = {
      {0.040, 0.080}, {std::nullopt, 0.180}, {std::nullopt, 0.230}};
  const auto slowest = slowestLink(peers, 0);
  ASSERT_TRUE(slowest.has_value());
  EXPECT_DOUBLE_EQ(slowest->seconds, 0.115);
  EXPECT_EQ(slowest->peer, 2u);
  EXPECT_TRUE(slowest->estimated);
  // A round seen crossing longer raises it further, still an estimate.
  const auto crossing = slowestLink(peers, 0.425);
  EXPECT_DOUBLE_EQ(crossing->seconds, 0.425);
  EXPECT_TRUE(crossing->estimated);
}

TEST(SlowestLink, AMeasuredLinkLongerThanTheEstimatesIsTheSlowest) {
  const std::vector<PeerLink> peers = {{0.040, 0.080}, {0.300, 0.180}, {std::nullopt, 0.230}};
  const auto slowest = slowestLink(peers, 0.2);
  EXPECT_DOUBLE_EQ(slowest->seconds, 0.300);
  EXPECT_EQ(slowest->peer, 1u);
  EXPECT_FALSE(slowest->estimated);
  // Every peer measured: the round trips and the crossing no longer count.
  const std::vector<PeerLink> all = {{0.040, 0.080}, {0.120, 0.180}, {0.110, 0.230}};
  const auto measured = slowestLink(all, 0.9);
  EXPECT_DOUBLE_EQ(measured->seconds, 0.120);
  EXPECT_EQ(measured->peer, 1u);
  EXPECT_FALSE(measured->estimated);
}

TEST(SlowestLink, KnowsNothingBeforeAnyReportUntilEveryPeerHasAnswered) {
  const std::vector<PeerLink> silent = {{std::nullopt, 0.080}, {std::nullopt, -1}};
  EXPECT_FALSE(slowestLink(silent, 0.3).has_value());
  EXPECT_FALSE(slowestLink(std::vector<PeerLink>{}, 0).has_value());
  // Once some are measured, a peer that has not answered a ping leaves them
  // to stand.
  const std::vector<PeerLink> some = {{0.040, 0.080}, {std::nullopt, -1}};
  const auto slowest = slowestLink(some, 0);
  EXPECT_DOUBLE_EQ(slowest->seconds, 0.040);
  EXPECT_FALSE(slowest->estimated);
}

TEST(DelayLrScale, FullUpToFourStepsThenInverseToTheStalenessDownToHalf) {
  EXPECT_EQ(delayLrScale(0), 1.0);  // K = 1, D = 0 stays allreduce
  EXPECT_EQ(delayLrScale(3.4), 1.0);
  EXPECT_EQ(delayLrScale(4), 1.0);
  EXPECT_DOUBLE_EQ(delayLrScale(5), 0.8);
  EXPECT_DOUBLE_EQ(delayLrScale(6), 4.0 / 6.0);
  EXPECT_EQ(delayLrScale(8), 0.5);
  EXPECT_EQ(delayLrScale(40), 0.5);
  EXPECT_EQ(delayLrScale(-1), 1.0);
  EXPECT_EQ(delayLrScale(std::nan("")), 1.0);
}

TEST(RoundTransfer, ALinkTimeThatFitsInARoundIsTheTransferItself) {
  // World links at 100 Mbit/s: 115 ms latency, 24 ms of transfer, rounds of
  // 4 x 17 ms; the largest sample counts (jitter).
  const double lags[] = {0.138, 0.139, 0.137, 0.136};
  EXPECT_NEAR(roundTransferSeconds(lags, 0.115, 0.068), 0.024, 1e-9);
  EXPECT_EQ(roundTransferSeconds({}, 0.115, 0.068), -1);
  const double early[] = {0.100};  // faster than the ping's latency: no transfer
  EXPECT_EQ(roundTransferSeconds(early, 0.115, 0.068), 0);
}

TEST(RoundTransfer, AGrowingQueueIsNotTransfer) {
  // 10 Mbit/s, 4 workers: 240 ms of transfer per round of 4 x 30 ms. The
  // queue grows by 120 ms a round; the last link time is 0.6 s above the
  // latency, but a round's own transfer is 120 + 120 ms.
  const double lags[] = {0.115 + 0.24 + 0.12, 0.115 + 0.24 + 0.24, 0.115 + 0.24 + 0.36,
                         0.115 + 0.24 + 0.48};
  EXPECT_NEAR(roundTransferSeconds(lags, 0.115, 0.120), 0.240, 1e-9);
  EXPECT_EQ(autoPeriod(roundTransferSeconds(lags, 0.115, 0.120), 0.030, 4, 64), 16);
  // Counting the queue as transfer chose the maximum.
  EXPECT_EQ(autoPeriod(0.72, 0.030, 4, 64), 64);
}

TEST(RoundTransfer, ADrainingQueueIsNotTransferEither) {
  // Rounds of 16 x 30 ms = 480 ms carrying 240 ms: the queue left from
  // before shrinks by 240 ms a round.
  const double lags[] = {0.115 + 0.24 + 0.96, 0.115 + 0.24 + 0.72, 0.115 + 0.24 + 0.48,
                         0.115 + 0.24 + 0.24};
  EXPECT_NEAR(roundTransferSeconds(lags, 0.115, 0.480), 0.240, 1e-9);
  EXPECT_FALSE(autoPeriod(0.240, 0.030, 16, 64).has_value());  // 16 stays
}

TEST(AutoPeriod, GrowsAtOnceToTheSmallestPowerOfTwoThatKeepsTheLinkHalfIdle) {
  // 24 ms of transfer per round over 17 ms steps: 2.8 steps of half-busy
  // link, so K = 4 (world links, 100 Mbit/s, four workers on two cores).
  EXPECT_EQ(autoPeriod(0.024, 0.017, 1, 64), 4);
  EXPECT_FALSE(autoPeriod(0.024, 0.017, 4, 64).has_value());  // already there
  // A 4 Mbit/s uplink: 107 ms per round over 5.7 ms steps wants 37.5.
  EXPECT_EQ(autoPeriod(0.107, 0.0057, 2, 64), 64);
  EXPECT_EQ(autoPeriod(0.107, 0.0057, 2, 16), 16);  // at most the cap
}

TEST(AutoPeriod, ShrinksOnlyWhenTheTransferFillsAQuarterOfTheSmallerK) {
  // Wants 3 (K = 4) from 8: 3 > 4 / 2, keep 8 (noise must not flap K).
  EXPECT_FALSE(autoPeriod(0.015, 0.010, 8, 64).has_value());
  // Wants 1.6 (K = 2) from 8: 1.6 > 1, keep.
  EXPECT_FALSE(autoPeriod(0.008, 0.010, 8, 64).has_value());
  // Wants 0.8 (K = 1) from 8: 0.8 > 0.5, keep; 0.4 <= 0.5: shrink to 1.
  EXPECT_FALSE(autoPeriod(0.004, 0.010, 8, 64).has_value());
  EXPECT_EQ(autoPeriod(0.002, 0.010, 8, 64), 1);
  // From 64 the same: wants 1.9 (K = 2), keep; wants 0.4 (K = 1), shrink.
  EXPECT_FALSE(autoPeriod(0.0095, 0.010, 64, 64).has_value());
  EXPECT_EQ(autoPeriod(0.004, 0.020, 64, 64), 1);
}

TEST(AutoPeriod, KeepsTheCodecsWorkAtMostAFifthOfAStep) {
  // The 19.9M-parameter mlp on a LAN (2-core VM): 0.5 s of encoding and
  // decoding a round over 0.84 s steps, a transfer of 0.19 s. The link
  // alone asks K = 1 (0.19 / 0.42 = 0.45), where the codec took 60% of a
  // step; 0.5 / (0.2 x 0.84) = 3.0 asks K = 4 (15% of a step).
  EXPECT_EQ(autoPeriod(0.19, 0.84, 1, 64, 0.5), 4);
  EXPECT_EQ(autoPeriod(0.19, 0.84, 16, 64, 0.0), 1);              // the link alone: shrink to 1
  EXPECT_FALSE(autoPeriod(0.19, 0.84, 16, 64, 0.5).has_value());  // the codec keeps 16
  EXPECT_TRUE(codecBoundsPeriod(0.19, 0.5));
  // At 1 Gbit/s on the world links, 0.42 s a round over 0.22 s steps:
  // 9.5 asks K = 16 (12% of a step), not 8 (24%).
  EXPECT_FALSE(autoPeriod(0.05, 0.22, 16, 64, 0.42).has_value());
  EXPECT_EQ(autoPeriod(0.05, 0.22, 8, 64, 0.42), 16);
  // Where the transfer asks more, the codec changes nothing: 2.4 s over
  // 0.25 s steps asks 19.2, K = 32, whatever a round's codec.
  EXPECT_EQ(autoPeriod(2.4, 0.25, 16, 64, 0.42), 32);
  EXPECT_FALSE(codecBoundsPeriod(2.4, 0.42));
  // A small model's codec (2 ms a round over 12 ms steps: 0.8) leaves K = 1.
  EXPECT_FALSE(autoPeriod(0.001, 0.012, 1, 64, 0.002).has_value());
  // The shrink keeps its margin against the codec's bound too: 3.0 from 8
  // (K = 4) is more than 4 / 2: keep 8.
  EXPECT_FALSE(autoPeriod(0.0, 0.84, 8, 64, 0.5).has_value());
  // A codec time that is not a number counts as none.
  EXPECT_EQ(autoPeriod(0.19, 0.84, 16, 64, std::nan("")), 1);
}

TEST(AutoPeriod, DecidesNothingWithoutAStepTime) {
  EXPECT_FALSE(autoPeriod(0.1, 0.0, 4, 64).has_value());
  EXPECT_FALSE(autoPeriod(-1.0, 0.01, 4, 64).has_value());
}

TEST(AutoPeriod, AHeldUplinkGetsRoundsOfComputeAsLongAsItsRounds) {
  // 10 Mbit/s, three peers: 280 ms a round through the uplink over 15 ms
  // steps wants 18.7: K = 32 (autoPeriod's half-busy link would take 64).
  EXPECT_EQ(periodForHeldUplink(0.280, 0.015, 4, 64), 32);
  EXPECT_EQ(autoPeriod(0.280, 0.015, 4, 64), 64);
  // Over 18 ms steps it wants 15.6: K = 16.
  EXPECT_EQ(periodForHeldUplink(0.280, 0.018, 4, 64), 16);
  EXPECT_EQ(periodForHeldUplink(0.280, 0.015, 4, 16), 16);  // at most the cap
  // Never smaller, nor the same: a held uplink only grows K.
  EXPECT_FALSE(periodForHeldUplink(0.280, 0.015, 32, 64).has_value());
  EXPECT_FALSE(periodForHeldUplink(0.050, 0.015, 8, 64).has_value());
  EXPECT_FALSE(periodForHeldUplink(0.280, 0.0, 4, 64).has_value());
}

TEST(AutoPeriod, ARoundSeenCrossingCountsNoLongerThanTheUplinkTakesForIt) {
  // Reduce-scatter on 2 Mbit/s uplinks (docs/benchmarks.md): a round seen
  // crossing for 9120 ms behind the queue the start's rounds left, the
  // farthest peer 160 ms away; its 170 KB through an uplink known to carry
  // at least 0.193 MB/s take 881 ms.
  const double bounded = crossingWithinUplink(9.120, 0.160, 170e3, 0.193e6);
  EXPECT_NEAR(bounded, 0.160 + 170e3 / 0.193e6, 1e-9);
  // Steps of 15.3 ms: K = 128 where the crossing alone asked 1024.
  EXPECT_EQ(periodFromCrossing(9.120, 0.160, 0.0153, 16, 1024), 1024);
  EXPECT_EQ(periodFromCrossing(bounded, 0.160, 0.0153, 16, 1024), 128);
  // A crossing shorter than that bound stays as it was seen.
  EXPECT_DOUBLE_EQ(crossingWithinUplink(0.700, 0.160, 170e3, 0.193e6), 0.700);
  // Without a rate or a round's bytes, nothing bounds it.
  EXPECT_DOUBLE_EQ(crossingWithinUplink(9.120, 0.160, 170e3, 0), 9.120);
  EXPECT_DOUBLE_EQ(crossingWithinUplink(9.120, 0.160, 0, 0.193e6), 9.120);
}

TEST(AutoPeriod, ARoundSeenCrossingRaisesKBeforeTheReports) {
  // The 20M-parameter mlp on the world links at 100 Mbit/s: a 10 MB round
  // to three peers seen crossing for 2524 ms one way, the farthest peer
  // 115 ms away, 250 ms steps: 2.41 s of transfer wants 19.3, K = 32.
  EXPECT_EQ(periodFromCrossing(2.524, 0.115, 0.250, 16, 64), 32);
  EXPECT_EQ(periodFromCrossing(2.524, 0.115, 0.250, 16, 16), std::nullopt);  // the cap
  // At 1 Gbit/s the same round crosses in about 0.6 s: 16 carries it.
  EXPECT_EQ(periodFromCrossing(0.600, 0.115, 0.250, 16, 64), std::nullopt);
  // Only raises: a bound from below on the transfer does not lower K.
  EXPECT_EQ(periodFromCrossing(0.130, 0.115, 0.250, 16, 64), std::nullopt);
  // No more than the latency (a small model's round): nothing to go by.
  EXPECT_EQ(periodFromCrossing(0.100, 0.115, 0.002, 16, 64), std::nullopt);
  EXPECT_EQ(periodFromCrossing(2.524, 0.115, 0.0, 16, 64), std::nullopt);  // no step time
}

TEST(AutoPeriod, AnnouncesTwoRoundsAndTheLatencyAhead) {
  EXPECT_EQ(periodAnnouncementSteps(4, 0.115, 0.017), 2 * 4 + 7);  // 6.8 -> 7 steps
  EXPECT_EQ(periodAnnouncementSteps(64, 0.0, 0.01), 128);
  EXPECT_EQ(periodAnnouncementSteps(4, 0.1, 0.0), 8);  // no step time yet: rounds only
}

}  // namespace
}  // namespace geo::sync
