// The cost model of DTS's two exchanges and the choice between them
// (sync.exchange: auto, and `geotrain plan`) on exact inputs.

#include "worker/sync/exchange_choice.h"

#include <gtest/gtest.h>

#include "worker/sync/auto_rules.h"

namespace geo::sync {
namespace {

// G workers one a region, every payload to every other, links of
// `latency` one way, an uplink of `rate` bytes/s.
ExchangeInputs inputs(double group, double payload, double rate, double latency, double codec = 0) {
  ExchangeInputs in;
  in.group = group;
  in.peersOut = group - 1;
  in.payloadBytes = payload;
  in.uplinkBytesPerSecond = rate;
  in.latencySeconds = latency;
  in.codecPayloadSeconds = codec;
  return in;
}

TEST(ExchangeChoice, RoundShapesCountBytesHopsAndCodecWork) {
  const ExchangeInputs in = inputs(16, 100'000, 1e6, 0.1, 0.001);
  const RoundShape g = roundShape(Exchange::kAllGather, in);
  EXPECT_DOUBLE_EQ(g.bytesPerRound, 15 * 100'000.0);
  EXPECT_DOUBLE_EQ(g.roundUplink, 1.5);
  EXPECT_DOUBLE_EQ(g.roundLink, 0.1 + 1.5);
  EXPECT_DOUBLE_EQ(g.codecRound, 16 * 0.001);  // its own encoded, 15 decoded
  const RoundShape s = roundShape(Exchange::kReduceScatter, in);
  EXPECT_DOUBLE_EQ(s.bytesPerRound, 2.0 * 15 / 16 * 100'000);
  EXPECT_DOUBLE_EQ(s.roundUplink, 0.1875);
  EXPECT_DOUBLE_EQ(s.roundLink, 2 * 0.1 + 0.1875);  // two hops
  EXPECT_DOUBLE_EQ(s.codecRound, 4 * 0.001);
  // A hierarchical leader also decodes its region's members.
  ExchangeInputs lan = in;
  lan.lanDecodes = 3;
  EXPECT_DOUBLE_EQ(roundShape(Exchange::kAllGather, lan).codecRound, 19 * 0.001);
  EXPECT_DOUBLE_EQ(roundShape(Exchange::kReduceScatter, lan).codecRound, 7 * 0.001);
  // No uplink figure: the bytes count, their time does not; one region: nothing crosses.
  ExchangeInputs unknown = in;
  unknown.uplinkBytesPerSecond = 0;
  EXPECT_DOUBLE_EQ(roundShape(Exchange::kAllGather, unknown).roundUplink, 0);
  EXPECT_DOUBLE_EQ(roundShape(Exchange::kAllGather, unknown).roundLink, 0.1);
  ExchangeInputs one = in;
  one.wan = false;
  EXPECT_DOUBLE_EQ(roundShape(Exchange::kReduceScatter, one).bytesPerRound, 0);
  EXPECT_DOUBLE_EQ(roundShape(Exchange::kReduceScatter, one).roundLink, 0);
}

TEST(ExchangeChoice, DtsCostWaitsForWhatTheDelayDoesNotCover) {
  RoundShape shape;
  shape.roundUplink = 0.8;
  shape.roundLink = 1.0;
  shape.codecRound = 0.08;
  // K = 8, D = 2 fixed, 50 ms of compute: the uplink's 0.1 s a step is
  // the base; 1.0 - 2 x 0.1 s is waited for once a round.
  const DtsCost fixed = dtsCost(shape, 0.05, 8, 2, 100);
  EXPECT_DOUBLE_EQ(fixed.uplinkStep, 0.1);
  EXPECT_DOUBLE_EQ(fixed.codecStep, 0.01);
  EXPECT_DOUBLE_EQ(fixed.waitStep, 0.8 / 8);
  EXPECT_DOUBLE_EQ(fixed.stepSeconds, 0.1 + 0.1);
  EXPECT_DOUBLE_EQ(fixed.stepsFactor, dtsStepsFactor(2, 0));
  // D auto: the link in steps of the uplink's share, nothing waited for.
  const DtsCost automatic = dtsCost(shape, 0.05, 8, std::nullopt, 100);
  EXPECT_EQ(automatic.delay, 10);
  EXPECT_DOUBLE_EQ(automatic.waitStep, 0);
  EXPECT_DOUBLE_EQ(automatic.secondsPerReferenceStep(), 0.1 * dtsStepsFactor(10, 0));
}

TEST(ExchangeChoice, SettledPeriodIsWhereTheAutoRulesKeepK) {
  RoundShape shape;
  shape.roundUplink = 0.3;  // the uplink needs 0.3 s a round
  const int64_t k = settledPeriod(shape, 0.01, 16, 1024);
  // Kept: the rules ask for it again.
  const auto again = shape.roundUplink > static_cast<double>(k) * 0.01
                         ? periodForHeldUplink(shape.roundUplink, 0.01, k, 1024)
                         : autoPeriod(shape.roundUplink, 0.01, k, 1024, 0);
  EXPECT_TRUE(!again || *again == k);
  EXPECT_GE(static_cast<double>(k) * 0.01, shape.roundUplink);  // a round carries its bytes
  EXPECT_EQ(settledPeriod(shape, 0.01, 16, 8), 8);              // at most the largest
}

TEST(ExchangeChoice, StepsFactorInterpolatesTheMeasuredPointsAndSaysWhenItExtrapolates) {
  // Four workers (and fewer): the ten-seed batch.
  for (const double g : {2.0, 3.0, 4.0}) {
    bool ex = true;
    EXPECT_DOUBLE_EQ(dtsStepsFactor(0, g, &ex), 1.0);
    EXPECT_FALSE(ex);
    EXPECT_DOUBLE_EQ(dtsStepsFactor(3.4, g), 233.0 / 205.0);
    EXPECT_DOUBLE_EQ(dtsStepsFactor(44.1, g), 290.0 / 205.0);
    EXPECT_NEAR(dtsStepsFactor((3.4 + 44.1) / 2, g), (233.0 + 290.0) / 2 / 205.0, 1e-12);
    const double slope = (290.0 - 233.0) / 205.0 / (44.1 - 3.4);
    EXPECT_NEAR(dtsStepsFactor(95.8, g, &ex), 290.0 / 205.0 + slope * (95.8 - 44.1), 1e-12);
    EXPECT_TRUE(ex);
  }
}

TEST(ExchangeChoice, AStepOfStalenessCostsMoreWhereMoreWorkersAverage) {
  constexpr double kAllreduce = (128.0 + 144.0) / 2;  // sixteen workers' allreduce (two seeds)
  bool ex = true;
  EXPECT_DOUBLE_EQ(dtsStepsFactor(0, 16, &ex), 144.0 / kAllreduce);
  EXPECT_FALSE(ex);
  EXPECT_DOUBLE_EQ(dtsStepsFactor(11.6, 16), 264.0 / kAllreduce);
  EXPECT_DOUBLE_EQ(dtsStepsFactor(37.6, 16, &ex), 352.0 / kAllreduce);
  EXPECT_FALSE(ex);
  EXPECT_NEAR(dtsStepsFactor((11.6 + 22.93) / 2, 16), (264.0 + 336.0) / 2 / kAllreduce, 1e-12);
  EXPECT_GT(dtsStepsFactor(50, 16, &ex), 352.0 / kAllreduce);
  EXPECT_TRUE(ex);
  // Over sixteen workers: sixteen's curve, said to be extrapolated.
  EXPECT_DOUBLE_EQ(dtsStepsFactor(11.6, 64, &ex), dtsStepsFactor(11.6, 16));
  EXPECT_TRUE(ex);
  // Eight workers: halfway in log2 G between the two curves.
  EXPECT_NEAR(dtsStepsFactor(11.6, 8), (dtsStepsFactor(11.6, 4) + dtsStepsFactor(11.6, 16)) / 2,
              1e-12);
  // Every staleness costs more at sixteen than at four.
  for (double s = 0.5; s < 100; s *= 1.5) {
    EXPECT_GT(dtsStepsFactor(s, 16), dtsStepsFactor(s, 8)) << s;
    EXPECT_GT(dtsStepsFactor(s, 8), dtsStepsFactor(s, 4)) << s;
  }
}

TEST(ExchangeChoice, ReduceScatterWhereTheUplinkLimitsAllGather) {
  // 16 regions, a 1 MB payload, 100 Mbit/s, 100 ms one way, 20 ms steps:
  // all-gather's round needs 1.2 s of uplink, reduce-scatter's 0.15 s.
  const ExchangeInputs in = inputs(16, 1e6, 12.5e6, 0.1);
  const ExchangeVerdict v = chooseExchange(in, 0.02, DtsPolicy{}, Exchange::kAllGather);
  EXPECT_EQ(v.choice, Exchange::kReduceScatter);
  EXPECT_LT(v.reduceScatter.secondsPerReferenceStep(),
            kExchangeMargin * v.allGather.secondsPerReferenceStep());
  // All-gather's K must grow eightfold to carry its bytes, and its D with it.
  EXPECT_GT(v.allGather.period, v.reduceScatter.period);
  EXPECT_GT(v.allGather.delay, v.reduceScatter.delay);
}

TEST(ExchangeChoice, AllGatherWhereLatencyAloneLimits) {
  // Four regions, a small payload over a fast uplink: reduce-scatter's
  // second hop doubles D (more staleness) and saves nothing the step needs.
  const ExchangeInputs in = inputs(4, 100'000, 125e6, 0.1);
  const ExchangeVerdict v = chooseExchange(in, 0.02, DtsPolicy{}, Exchange::kAllGather);
  EXPECT_EQ(v.choice, Exchange::kAllGather);
  EXPECT_GT(v.reduceScatter.delay, v.allGather.delay);
  EXPECT_LT(v.allGather.secondsPerReferenceStep(), v.reduceScatter.secondsPerReferenceStep());
  // Links of 300 ms and steps of 2 ms: D = 152 against 301 (autoDelaySteps
  // of each round's link), and a job on reduce-scatter moves back.
  const ExchangeInputs far = inputs(4, 100'000, 125e6, 0.3);
  const ExchangeVerdict back = chooseExchange(far, 0.002, DtsPolicy{}, Exchange::kReduceScatter);
  EXPECT_EQ(back.choice, Exchange::kAllGather);
  EXPECT_EQ(back.allGather.delay,
            autoDelaySteps(roundShape(Exchange::kAllGather, far).roundLink, 0.002, 1024));
  EXPECT_EQ(back.reduceScatter.delay,
            autoDelaySteps(roundShape(Exchange::kReduceScatter, far).roundLink, 0.002, 1024));
  EXPECT_NEAR(static_cast<double>(back.reduceScatter.delay) / back.allGather.delay, 2, 0.05);
}

TEST(ExchangeChoice, TheCodecsWorkCountsToo) {
  // No uplink figure (it does not limit), but decoding 31 payloads a round
  // takes 0.31 s against reduce-scatter's 0.04 s: with a fixed K = 4 of
  // 10 ms steps the codec is most of all-gather's step.
  ExchangeInputs in = inputs(32, 1e6, 0, 0.001, 0.01);
  DtsPolicy fixed;
  fixed.autoPeriod = false;
  fixed.period = 4;
  fixed.delay = 4;
  const ExchangeVerdict v = chooseExchange(in, 0.01, fixed, Exchange::kAllGather);
  EXPECT_EQ(v.choice, Exchange::kReduceScatter);
  EXPECT_DOUBLE_EQ(v.allGather.codecStep, 32 * 0.01 / 4);
  EXPECT_DOUBLE_EQ(v.reduceScatter.codecStep, 4 * 0.01 / 4);
}

TEST(ExchangeChoice, MovesOnlyForAMarginAndNeverBelowThreeWorkers) {
  // Costs within the margin of each other: whichever runs stays.
  const ExchangeInputs in = inputs(16, 1e6, 12.5e6, 0.1);
  const ExchangeVerdict v = chooseExchange(in, 0.02, DtsPolicy{}, Exchange::kAllGather);
  const double ratio =
      v.reduceScatter.secondsPerReferenceStep() / v.allGather.secondsPerReferenceStep();
  ASSERT_LT(ratio, kExchangeMargin);
  // Scale compute until the two are within the margin of each other.
  double compute = 0.02;
  ExchangeVerdict close = v;
  for (int i = 0; i < 40; ++i) {
    compute *= 1.25;
    close = chooseExchange(in, compute, DtsPolicy{}, Exchange::kAllGather);
    const double r =
        close.reduceScatter.secondsPerReferenceStep() / close.allGather.secondsPerReferenceStep();
    if (r > kExchangeMargin && r < 1 / kExchangeMargin) break;
  }
  const double r =
      close.reduceScatter.secondsPerReferenceStep() / close.allGather.secondsPerReferenceStep();
  ASSERT_GT(r, kExchangeMargin);
  ASSERT_LT(r, 1 / kExchangeMargin);
  EXPECT_EQ(close.choice, Exchange::kAllGather);
  EXPECT_EQ(chooseExchange(in, compute, DtsPolicy{}, Exchange::kReduceScatter).choice,
            Exchange::kReduceScatter);
  // Two workers: all-gather whatever the figures.
  EXPECT_EQ(
      chooseExchange(inputs(2, 1e9, 1e3, 0.1), 0.02, DtsPolicy{}, Exchange::kReduceScatter).choice,
      Exchange::kAllGather);
}

// The schedule a worker ends on when two coordinators (either side of a
// suspicion) each announced a change: the later one, in whatever order the
// two arrive and wherever the worker is.
TEST(ScheduleAction, EveryWorkerEndsOnTheLaterOfTwoChangesInEitherOrder) {
  using detail::DtsSchedule;
  using detail::ScheduleAction;
  using detail::scheduleAction;
  const DtsSchedule current{12, 704, 64, Exchange::kAllGather};
  const DtsSchedule early{22, 1344, 64, Exchange::kReduceScatter};  // the first coordinator's
  const DtsSchedule late{26, 1600, 64, Exchange::kReduceScatter};   // the second's
  // The earlier change first, its round ahead: awaited, then replaced.
  EXPECT_EQ(scheduleAction(early, current, std::nullopt, 20), ScheduleAction::kAwait);
  EXPECT_EQ(scheduleAction(late, current, early, 20), ScheduleAction::kAwait);
  // The later first: the earlier is ignored, its round ahead or opened
  // already (the worker that held the later change and heard the earlier
  // one after opening round 22 took it at once).
  EXPECT_EQ(scheduleAction(early, current, late, 20), ScheduleAction::kIgnore);
  EXPECT_EQ(scheduleAction(early, current, late, 23), ScheduleAction::kIgnore);
  // Alone, a change whose round is open already is taken at once.
  EXPECT_EQ(scheduleAction(early, current, std::nullopt, 23), ScheduleAction::kAdoptNow);
  // What is in force wins over an older or the same change.
  EXPECT_EQ(scheduleAction(early, late, std::nullopt, 30), ScheduleAction::kIgnore);
  EXPECT_EQ(scheduleAction(late, late, std::nullopt, 30), ScheduleAction::kIgnore);
  // The same round: the larger K, then reduce-scatter.
  const DtsSchedule larger{22, 1344, 128, Exchange::kAllGather};
  EXPECT_EQ(scheduleAction(larger, current, early, 20), ScheduleAction::kAwait);
  EXPECT_EQ(scheduleAction(early, current, larger, 20), ScheduleAction::kIgnore);
  const DtsSchedule gather{22, 1344, 64, Exchange::kAllGather};
  EXPECT_EQ(scheduleAction(gather, current, early, 20), ScheduleAction::kIgnore);
  EXPECT_EQ(scheduleAction(early, current, gather, 20), ScheduleAction::kAwait);
}

// The coordinator of the schedule: the lowest-ranked member heard, and only
// where it hears most of the group. A worker cut off from the rest decided
// alone, and its change won wherever it was heard.
TEST(DecidesSchedule, TheLowestRankedMemberHeardWhereItHearsMostOfTheGroup) {
  using detail::decidesSchedule;
  // Everyone heard: rank 0 decides, nobody else.
  EXPECT_TRUE(decidesSchedule({true, true, true, true}, 0));
  EXPECT_FALSE(decidesSchedule({true, true, true, true}, 1));
  // Rank 0 suspected by rank 1, which hears the other two: 3 of 4.
  EXPECT_TRUE(decidesSchedule({false, true, true, true}, 1));
  EXPECT_FALSE(decidesSchedule({false, true, true, true}, 2));
  // A throttled rank 1 that suspects ranks 0 and 3 and hears rank 2 alone:
  // 2 of 4 is no majority.
  EXPECT_FALSE(decidesSchedule({false, true, true, false}, 1));
  // Rank 0 cut off from all: nobody in its half, and the other three elect
  // rank 1.
  EXPECT_FALSE(decidesSchedule({true, false, false, false}, 0));
  EXPECT_TRUE(decidesSchedule({false, true, true, true}, 1));
  // Five members: three is a majority, two is not.
  EXPECT_TRUE(decidesSchedule({true, true, true, false, false}, 0));
  EXPECT_FALSE(decidesSchedule({true, true, false, false, false}, 0));
  // Alone, and two members cut apart: no change.
  EXPECT_TRUE(decidesSchedule({true}, 0));
  EXPECT_FALSE(decidesSchedule({true, false}, 0));
  EXPECT_TRUE(decidesSchedule({true, true}, 0));
}

}  // namespace

// A lag report's schedule in force comes before its next: a worker that
// does not have the first in force takes it first, and the second only
// once the first is in force (the reports repeat it).
TEST(ReportedSchedules, TheSendersScheduleInForceComesBeforeItsNext) {
  using detail::DtsSchedule;
  using detail::reportedSchedules;
  const DtsSchedule initial{0, 0, 16, Exchange::kAllGather};
  const DtsSchedule a{5, 80, 32, Exchange::kAllGather};    // in force at the sender
  const DtsSchedule b{13, 336, 64, Exchange::kAllGather};  // the sender's next
  // A worker restarted, at round 0 before its state comes, awaiting the
  // first: the next waits.
  auto o = reportedSchedules(a, b, initial, a, 0);
  EXPECT_FALSE(o.dropAwaited);
  EXPECT_FALSE(o.takeNext);
  // Awaiting the next already (heard when the first was not in force at
  // its sender yet, or before this rule): the next goes, the first is
  // awaited in its place.
  o = reportedSchedules(a, b, initial, b, 0);
  EXPECT_TRUE(o.dropAwaited);
  EXPECT_FALSE(o.takeNext);
  // A worker that has opened the first's round already takes it at once
  // (scheduleAction: kAdoptNow), then awaits the next.
  o = reportedSchedules(a, b, initial, b, 7);
  EXPECT_TRUE(o.dropAwaited);
  EXPECT_TRUE(o.takeNext);
  // With the first in force, the next is handed on as before.
  o = reportedSchedules(a, b, a, std::nullopt, 9);
  EXPECT_FALSE(o.dropAwaited);
  EXPECT_TRUE(o.takeNext);
  o = reportedSchedules(a, std::nullopt, initial, std::nullopt, 0);
  EXPECT_FALSE(o.takeNext);
  // Two coordinators' changes over the schedule both had in force: each
  // comes as a next, and scheduleAction picks the later, as before.
  const DtsSchedule current{12, 704, 64, Exchange::kAllGather};
  const DtsSchedule early{22, 1344, 64, Exchange::kReduceScatter};
  const DtsSchedule late{26, 1600, 64, Exchange::kReduceScatter};
  o = reportedSchedules(current, late, current, early, 20);
  EXPECT_FALSE(o.dropAwaited);
  EXPECT_TRUE(o.takeNext);
  o = reportedSchedules(current, early, current, late, 23);
  EXPECT_FALSE(o.dropAwaited);
  EXPECT_TRUE(o.takeNext);
}

}  // namespace geo::sync
