#include "worker/sync/exchange_choice.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <span>
#include <utility>

#include "worker/sync/auto_rules.h"

namespace geo::sync {
namespace {

using Point = std::pair<double, double>;  // a staleness, its steps factor

// Steps to the target against allreduce fp32 at a staleness, four workers:
// the ten-seed batch of docs/benchmarks.md ("Ten seeds, and the accuracy
// averaged over them": the mlp to 85%, the accuracy averaged over the
// seeds): allreduce 205 steps, DTS at a staleness of 3.4 steps 233, at
// 44.1 steps 290. Beyond 44.1 the last slope (0.0066 a step) goes on: it
// gives 1.75 at 95.8, where the rtt3 run of the five-seed batch measured
// 2.10 / 1.65 of the world run's (1.79 on this scale).
constexpr std::array<Point, 3> kFourWorkers = {
    {{0.0, 1.0}, {3.4, 233.0 / 205.0}, {44.1, 290.0 / 205.0}}};

// Sixteen workers ("What a step of staleness costs at sixteen workers" in
// docs/benchmarks.md): 16 regions x 1 worker on the lan preset over the
// namespace network, K = 16 and D fixed at 0, 4, 12, 24 and 40, seeds 42
// and 1, rank 0's first evaluation at 85% (every 16 steps), the means of
// the two seeds: allreduce fp32 136 steps (128 and 144); DTS 144 at a
// staleness of 0, 176 at 3.87, 264 at 11.6, 336 at 22.93 and 352 at 37.6
// (the staleness the workers measured). Beyond 37.6 the last slope (0.008
// a step) goes on.
constexpr std::array<Point, 5> kSixteenWorkers = {{{0.0, 144.0 / 136.0},
                                                   {3.87, 176.0 / 136.0},
                                                   {11.6, 264.0 / 136.0},
                                                   {22.93, 336.0 / 136.0},
                                                   {37.6, 352.0 / 136.0}}};

// Linear between the points, and on along the last slope beyond them
// (`beyond` then set). At least two points, in increasing staleness.
double onCurve(std::span<const Point> c, double s, bool* beyond) {
  *beyond = s > c.back().first;
  size_t i = 1;
  while (i + 1 < c.size() && s > c[i].first) ++i;
  const auto [s0, f0] = c[i - 1];
  const auto [s1, f1] = c[i];
  return f0 + (f1 - f0) * (s - s0) / (s1 - s0);
}

}  // namespace

std::string_view exchangeName(Exchange e) {
  return e == Exchange::kReduceScatter ? "reducescatter" : "allgather";
}

RoundShape roundShape(Exchange e, const ExchangeInputs& in) {
  RoundShape s;
  s.group = in.group;
  const double rate = in.uplinkBytesPerSecond;
  if (e == Exchange::kAllGather) {
    s.bytesPerRound = in.wan ? in.peersOut * in.payloadBytes : 0.0;
    s.roundUplink = in.wan && rate > 0 ? s.bytesPerRound / rate : 0.0;
    s.roundLink = in.wan ? in.latencySeconds + s.roundUplink : 0.0;  // its last byte's arrival
    s.codecRound = (in.group + in.lanDecodes) * in.codecPayloadSeconds;
    return s;
  }
  s.bytesPerRound = in.wan && in.group > 0 ? 2 * in.peersOut / in.group * in.payloadBytes : 0.0;
  s.roundUplink = in.wan && rate > 0 ? s.bytesPerRound / rate : 0.0;
  s.roundLink = in.wan ? 2 * in.latencySeconds + s.roundUplink : 0.0;
  s.codecRound = (4 + in.lanDecodes) * in.codecPayloadSeconds;
  return s;
}

DtsCost dtsCost(const RoundShape& shape, double computeSeconds, int64_t period,
                std::optional<int64_t> delay, int64_t maxAutoDelay) {
  DtsCost r;
  r.period = std::max<int64_t>(period, 1);
  const double kd = static_cast<double>(r.period);
  const double c = computeSeconds;
  r.uplinkStep = shape.roundUplink / kd;
  r.codecStep = shape.codecRound / kd;
  const double busy = c + r.codecStep;
  const double base = std::max(busy, r.uplinkStep);
  // The worker counts D in steps of its compute (dts.cc's step time leaves
  // the synchronizer's own work out), as the auto rules do.
  r.delay =
      delay ? *delay
            : autoDelaySteps(shape.roundLink, std::max(c, r.uplinkStep), maxAutoDelay).value_or(0);
  // What a round still needs at its due step is waited for, once a round.
  const double wait = std::max(0.0, shape.roundLink - static_cast<double>(r.delay) * base);
  r.waitStep = wait / kd;
  r.stepSeconds = base + r.waitStep;
  r.stepsFactor = dtsStepsFactor(static_cast<double>(r.delay), shape.group, &r.extrapolated);
  return r;
}

int64_t settledPeriod(const RoundShape& shape, double computeSeconds, int64_t start,
                      int64_t maxAutoPeriod) {
  const double c = computeSeconds;
  int64_t k = std::clamp<int64_t>(start, 1, std::max<int64_t>(maxAutoPeriod, 1));
  for (int i = 0; i < 16; ++i) {
    const double kd = static_cast<double>(k);
    const std::optional<int64_t> next =
        shape.roundUplink > kd * c ? periodForHeldUplink(shape.roundUplink, c, k, maxAutoPeriod)
                                   : autoPeriod(shape.roundUplink, c + shape.codecRound / kd, k,
                                                maxAutoPeriod, shape.codecRound);
    if (!next || *next == k) break;
    k = *next;
  }
  return k;
}

double dtsStepsFactor(double staleness, double group, bool* extrapolated) {
  const double s = std::max(0.0, staleness);
  bool beyondFour = false, beyondSixteen = false;
  const double four = onCurve(kFourWorkers, s, &beyondFour);
  const double sixteen = onCurve(kSixteenWorkers, s, &beyondSixteen);
  const double w = std::clamp(std::log2(std::max(group, 1.0) / 4) / 2, 0.0, 1.0);
  if (extrapolated) {
    *extrapolated = group > 16 || (w < 1 && beyondFour) || (w > 0 && beyondSixteen);
  }
  return (1 - w) * four + w * sixteen;
}

ExchangeVerdict chooseExchange(const ExchangeInputs& in, double computeSeconds,
                               const DtsPolicy& policy, Exchange current) {
  const auto cost = [&](Exchange e) {
    const RoundShape shape = roundShape(e, in);
    const int64_t k = policy.autoPeriod ? settledPeriod(shape, computeSeconds, policy.period,
                                                        policy.maxAutoPeriod)
                                        : policy.period;
    return dtsCost(shape, computeSeconds, k, policy.delay, policy.maxAutoDelay);
  };
  ExchangeVerdict v;
  v.allGather = cost(Exchange::kAllGather);
  v.reduceScatter = cost(Exchange::kReduceScatter);
  if (in.group < 3) return v;  // all-gather
  const double gather = v.allGather.secondsPerReferenceStep();
  const double scatter = v.reduceScatter.secondsPerReferenceStep();
  if (current == Exchange::kAllGather) {
    v.choice = scatter < kExchangeMargin * gather ? Exchange::kReduceScatter : Exchange::kAllGather;
  } else {
    v.choice = gather < kExchangeMargin * scatter ? Exchange::kAllGather : Exchange::kReduceScatter;
  }
  return v;
}

}  // namespace geo::sync
