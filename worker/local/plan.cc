#include "worker/local/plan.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <utility>

#include "common/worker_config.h"
#include "kernels/qsgd.h"
#include "worker/local/faults.h"
#include "worker/sync/auto_rules.h"
#include "worker/sync/exchange_choice.h"
#include "worker/sync/final_average.h"
#include "worker/transport/link.h"
#if defined(GEO_PLAN_READS_JOBS)
#include <yaml-cpp/yaml.h>
#include <nlohmann/json.hpp>

#include "controller/api/manifest_yaml.h"
#include "controller/api/training_job.h"
#endif

namespace geo::local {
namespace {

// What the transport adds to a payload on the WAN: a 64-byte frame header
// per chunk of 64 KiB (TransportConfig::wanChunkBytes) and CurveZMQ's
// MESSAGE command around each (a 16-byte tag, an 8-byte nonce and the
// command's own framing, about 40 bytes).
constexpr double kWanChunkBytes = 64.0 * 1024;
constexpr double kPerChunkOverhead = 64 + 40;

// swarm, H = 4, world links: 1025 steps against allreduce's 175 (the
// five-seed batch, first crossings of rank 0's own model: swarm has no job
// model before its final average).
constexpr double kSwarmFactor = 1025.0 / 175.0;
constexpr int64_t kSwarmMeasuredH = 4;

bool knownCodec(const std::string& name) {
  return std::find(kCodecNames.begin(), kCodecNames.end(), name) != kCodecNames.end();
}

// One payload to each of `peers`, through an uplink of `rate` bytes/s.
double uplinkSeconds(double peers, double payload, double rate) {
  return rate > 0 ? peers * payload / rate : 0.0;
}

// The largest part of a step: what a user would change first.
std::string limitOf(double compute, double codec, double latency, double uplink) {
  const std::array<std::pair<double, const char*>, 4> parts = {
      {{compute, "compute"}, {codec, "codec"}, {latency, "latency"}, {uplink, "uplink"}}};
  return std::max_element(parts.begin(), parts.end(),
                          [](const auto& a, const auto& b) { return a.first < b.first; })
      ->second;
}

#if defined(GEO_PLAN_READS_JOBS)
StatusOr<nlohmann::json> yamlFileToJson(const std::string& path) {
  try {
    return api::yamlNodeToJson(YAML::LoadFile(path));
  } catch (const YAML::BadFile&) {
    return notFound("cannot be read (is the path right?)");
  } catch (const YAML::Exception& e) {
    return invalidArgument(fmt::format("not YAML: {}", e.what()));
  }
}
#endif

}  // namespace

Status validatePlanInput(const PlanInput& in) {
  const size_t r = in.regions.size();
  if (r == 0) return invalidArgument("no regions (give at least one)");
  if (in.workersPerRegion < 1) {
    return invalidArgument(
        fmt::format("--workers-per-region {} (allowed: 1 or more)", in.workersPerRegion));
  }
  if (r * static_cast<size_t>(in.workersPerRegion) < 2) {
    return invalidArgument(
        "one worker exchanges nothing: give at least two regions or --workers-per-region 2");
  }
  if (in.rttSeconds.size() != r) {
    return invalidArgument(
        fmt::format("the round-trip matrix has {} rows for {} regions", in.rttSeconds.size(), r));
  }
  for (size_t i = 0; i < r; ++i) {
    if (in.rttSeconds[i].size() != r) {
      return invalidArgument(fmt::format("round-trip row {} has {} entries for {} regions", i,
                                         in.rttSeconds[i].size(), r));
    }
    for (size_t j = 0; j < r; ++j) {
      const double t = in.rttSeconds[i][j];
      if (!std::isfinite(t) || t < 0 || t != in.rttSeconds[j][i]) {
        return invalidArgument(
            fmt::format("the round trip {}-{} is {} s (allowed: finite, >= 0, the same both ways)",
                        in.regions[i], in.regions[j], t));
      }
    }
  }
  if (!(in.uplinkBytesPerSecond >= 0) || !std::isfinite(in.uplinkBytesPerSecond)) {
    return invalidArgument("the uplink rate must be finite and >= 0 (0: unlimited)");
  }
  if (in.tensorSizes.empty()) return invalidArgument("the model has no parameters");
  for (int64_t n : in.tensorSizes) {
    if (n < 1) return invalidArgument(fmt::format("a tensor of {} values (allowed: >= 1)", n));
  }
  if (!(in.stepSeconds > 0) || !std::isfinite(in.stepSeconds)) {
    return invalidArgument(
        fmt::format("--step-time {} s (allowed: a time > 0, e.g. 25ms)", in.stepSeconds));
  }
  if (!(in.codecSecondsPerValue >= 0) || !std::isfinite(in.codecSecondsPerValue) ||
      !(in.syncSecondsPerStep >= 0) || !std::isfinite(in.syncSecondsPerStep) ||
      !(in.coresPerWorker > 0) || !std::isfinite(in.coresPerWorker)) {
    return invalidArgument(
        "--codec-ns-per-value must be >= 0 and --cores-per-worker > 0 (e.g. 0.125 for 16 "
        "workers sharing 2 cores)");
  }
  if (!(in.cipherSecondsPerByte >= 0) || !std::isfinite(in.cipherSecondsPerByte)) {
    return invalidArgument("the cipher's seconds per byte must be finite and >= 0");
  }
  if (std::find(kLanCodecNames.begin(), kLanCodecNames.end(), in.lanCodec) ==
      kLanCodecNames.end()) {
    return invalidArgument(
        fmt::format("--lan-codec {} (allowed: {})", in.lanCodec, fmt::join(kLanCodecNames, ", ")));
  }
  if (!knownCodec(in.codec)) {
    return invalidArgument(
        fmt::format("--codec {} (allowed: {})", in.codec, fmt::join(kCodecNames, ", ")));
  }
  if (in.codec == "qsgd") {
    if (!kernels::isQsgdBits(in.bits)) {
      return invalidArgument(fmt::format("--bits {} (allowed: 2, 4, 8)", in.bits));
    }
    if (in.bucket < kernels::kQsgdMinBucket || in.bucket > kernels::kQsgdMaxBucket) {
      return invalidArgument(fmt::format("--bucket {} (allowed: {}..{})", in.bucket,
                                         kernels::kQsgdMinBucket, kernels::kQsgdMaxBucket));
    }
  }
  if (in.period < 1 || in.swarmH < 1 || in.maxAutoPeriod < 1 || in.maxAutoDelay < 0 ||
      (in.delay && *in.delay < 0)) {
    return invalidArgument(
        "period, swarm H and the largest auto period must be >= 1, the delay and the "
        "largest auto delay >= 0");
  }
  if (!(in.referenceSteps > 0) || !std::isfinite(in.referenceSteps)) {
    return invalidArgument("--reference-steps must be > 0");
  }
  return {};
}

double planPayloadBytes(const PlanInput& in, const std::string& codec) {
  double bytes = 0;
  if (codec == "qsgd") {
    kernels::QsgdConfig cfg;
    cfg.bits = in.bits;
    cfg.bucketSize = in.bucket;
    for (int64_t n : in.tensorSizes) {
      bytes += n < in.smallTensorThreshold ? 4.0 * static_cast<double>(n)
                                           : static_cast<double>(kernels::qsgdEncodedBytes(n, cfg));
    }
  } else {
    double values = 0;
    for (int64_t n : in.tensorSizes) values += static_cast<double>(n);
    bytes = values * (codec == "identity" ? 4.0 : 2.0);
  }
  const double chunks = std::max(1.0, std::ceil(bytes / kWanChunkBytes));
  return bytes + chunks * kPerChunkOverhead;
}

StatusOr<Plan> plan(const PlanInput& in) {
  if (Status s = validatePlanInput(in); !s.ok()) return s;
  const double regions = static_cast<double>(in.regions.size());
  const double perRegion = static_cast<double>(in.workersPerRegion);
  const bool hier = in.hierarchical && in.workersPerRegion > 1;
  // Who one worker sends each payload to over the WAN: the other regions'
  // leaders under hierarchical sync, else every rank of the other regions.
  const double peersOut = hier ? regions - 1 : (regions - 1) * perRegion;
  const double rate = in.uplinkBytesPerSecond;
  double values = 0;
  for (int64_t n : in.tensorSizes) values += static_cast<double>(n);
  // One payload encoded or decoded, in seconds of this worker's cores.
  const double codecOne = values * in.codecSecondsPerValue / in.coresPerWorker;
  // A leader's LAN reduce every step: each member's update in, the result
  // out to each, every byte through the cipher at its end. (The members'
  // own part, one payload each way, overlaps the leader's.) The 0.2M mlp
  // in fp32, 4 workers a region: 4.8 MB a step, 4.6 ms of a core.
  const double lanSeconds = hier ? 2 * (perRegion - 1) * planPayloadBytes(in, in.lanCodec) *
                                       in.cipherSecondsPerByte / in.coresPerWorker
                                 : 0.0;
  const double c = in.stepSeconds + in.syncSecondsPerStep / in.coresPerWorker + lanSeconds;
  // Whose payloads a worker decodes each exchange: every other rank, or
  // under hierarchical sync a leader's region members and the other leaders.
  const double decodes = hier ? (regions - 1) + (perRegion - 1) : regions * perRegion - 1;

  Plan p;
  p.lanSecondsPerStep = lanSeconds;
  p.payloadBytes = planPayloadBytes(in, in.codec);
  p.fp32PayloadBytes = planPayloadBytes(in, "identity");
  for (const auto& row : in.rttSeconds) {
    for (double t : row) p.slowestOneWaySeconds = std::max(p.slowestOneWaySeconds, t / 2);
  }
  const double latency = p.slowestOneWaySeconds;
  const bool wan = in.regions.size() > 1;
  if (wan) {
    // The models to the coordinator side by side, then its average back
    // through its uplink once per member, or (a large model) in shards
    // each member forwards, or by reduce-scatter among all of them
    // (sync::finalAverageWay, with the coordinator's own reckoning).
    const auto members = static_cast<size_t>(peersOut);
    const auto modelBytes = static_cast<uint64_t>(p.fp32PayloadBytes);
    p.finalAverageWay = sync::finalAverageWay(members, modelBytes, rate, latency);
    p.finalAverageShards = p.finalAverageWay == sync::FinalAverageWay::kWhole ? 0 : members;
    p.finalAverageSeconds =
        rate > 0 ? sync::finalAverageSeconds(p.finalAverageWay, members, modelBytes, rate, latency)
                 : 2 * latency;
  }

  auto finish = [&](PlanRow row, double factor) {
    row.stepsPerSecond = 1.0 / row.stepSeconds;
    row.stepsToTarget = in.referenceSteps * factor;
    row.secondsToTarget = row.stepsToTarget * row.stepSeconds;
    p.rows.push_back(std::move(row));
  };

  // allreduce: a synchronous all-gather every step.
  auto allreduce = [&](const std::string& name, double payload) {
    PlanRow row;
    row.algorithm = name;
    const double up = wan ? uplinkSeconds(peersOut, payload, rate) : 0.0;
    const double lat = wan ? latency : 0.0;
    row.codecSeconds = (1 + decodes) * codecOne;
    row.stepSeconds = c + row.codecSeconds + lat + up;
    row.wanBytesPerStep = wan ? peersOut * payload : 0.0;
    row.limit = limitOf(c, row.codecSeconds, lat, up);
    finish(std::move(row), 1.0);
  };
  allreduce("allreduce fp32", p.fp32PayloadBytes);
  if (in.codec != "identity") allreduce(fmt::format("allreduce {}", in.codec), p.payloadBytes);

  // dts: one round every K steps, due D steps after it leaves. How its
  // contributions meet (sync.exchange): all-gather or reduce-scatter among
  // the group of G workers that run DTS (the leaders under hierarchical
  // sync), costed by the model the workers' own choice uses at run time
  // (sync/exchange_choice.h).
  const double group = hier ? regions : regions * perRegion;
  sync::ExchangeInputs x;
  x.group = group;
  x.peersOut = peersOut;
  x.payloadBytes = p.payloadBytes;
  x.uplinkBytesPerSecond = rate;
  x.latencySeconds = latency;
  x.codecPayloadSeconds = codecOne;
  x.lanDecodes = hier ? perRegion - 1 : 0;
  x.wan = wan;
  auto dts = [&](const std::string& name, int64_t k, std::optional<int64_t> fixedDelay,
                 sync::Exchange e) {
    const sync::RoundShape shape = sync::roundShape(e, x);
    const sync::DtsCost cost = sync::dtsCost(shape, c, k, fixedDelay, in.maxAutoDelay);
    PlanRow row;
    row.algorithm = name;
    row.period = k;
    row.codecSeconds = cost.codecStep;
    row.delay = cost.delay;
    row.stepSeconds = cost.stepSeconds;
    row.wanBytesPerStep = shape.bytesPerRound / static_cast<double>(k);
    row.staleness = static_cast<double>(row.delay);
    row.limit = cost.uplinkStep > c + cost.codecStep ? "uplink"
                                                     : limitOf(c, cost.codecStep, cost.waitStep, 0);
    row.extrapolated = cost.extrapolated;
    finish(std::move(row), cost.stepsFactor);
  };
  dts(fmt::format("dts K={} D={}", in.period, in.delay ? std::to_string(*in.delay) : "auto"),
      in.period, in.delay, sync::Exchange::kAllGather);
  // dts auto: K from kAutoPeriodStart by the worker's own rules until they
  // keep it (sync::settledPeriod), then D, for each exchange; and which of
  // the two a job under sync.exchange: auto would run (its start is
  // all-gather). No reduce-scatter row for two workers: the same bytes, a
  // hop more.
  sync::DtsPolicy automatic;
  automatic.period = std::min(kAutoPeriodStart, in.maxAutoPeriod);
  automatic.maxAutoPeriod = in.maxAutoPeriod;
  automatic.maxAutoDelay = in.maxAutoDelay;
  const sync::ExchangeVerdict verdict =
      sync::chooseExchange(x, c, automatic, sync::Exchange::kAllGather);
  p.autoExchange = verdict.choice;
  dts("dts K=auto D=auto", verdict.allGather.period, std::nullopt, sync::Exchange::kAllGather);
  if (group >= 3) {
    dts("dts K=auto D=auto reducescatter", verdict.reduceScatter.period, std::nullopt,
        sync::Exchange::kReduceScatter);
  }

  // swarm: a request and (on average) one reply every H steps, never waited for.
  {
    PlanRow row;
    row.algorithm = fmt::format("swarm H={}", in.swarmH);
    row.period = in.swarmH;
    const double h = static_cast<double>(in.swarmH);
    const double uplinkStep = wan ? uplinkSeconds(2, p.payloadBytes, rate) / h : 0.0;
    // A request and a reply each way: two payloads encoded, two decoded.
    row.codecSeconds = 4 * codecOne / h;
    const double busy = c + row.codecSeconds;
    row.stepSeconds = std::max(busy, uplinkStep);
    row.wanBytesPerStep = wan ? 2 * p.payloadBytes / h : 0.0;
    row.limit = uplinkStep > busy ? "uplink" : limitOf(c, row.codecSeconds, 0, 0);
    row.extrapolated = in.swarmH != kSwarmMeasuredH;
    finish(std::move(row), kSwarmFactor);
  }

  for (size_t i = 1; i < p.rows.size(); ++i) {
    if (p.rows[i].secondsToTarget < p.rows[p.recommended].secondsToTarget) p.recommended = i;
  }
  return p;
}

std::vector<int64_t> mlpTensorSizes(int64_t width) {
  constexpr int64_t kInputs = 28 * 28;
  constexpr int64_t kClasses = 10;
  return {width * kInputs, width, kClasses * width, kClasses};
}

std::vector<int64_t> cnnTensorSizes() {
  // conv1 1->16 5x5, conv2 16->32 5x5, fc1 32*7*7->128, fc2 128->10.
  return {16 * 1 * 25, 16, 32 * 16 * 25, 32, 128 * 32 * 7 * 7, 128, 10 * 128, 10};
}

Status applyJobFile(PlanOptions& o) {
#if !defined(GEO_PLAN_READS_JOBS)
  return failedPrecondition(fmt::format(
      "--job {}: this build of geotrain reads no TrainingJob (it was built without the "
      "controller, -DGEO_BUILD_CONTROLLER=OFF); give the regions, workers and model as flags",
      o.jobFile));
#else
  auto json = yamlFileToJson(o.jobFile);
  if (!json.ok()) return json.status().withContext(fmt::format("--job {}", o.jobFile));
  const api::ParsedSpec parsed = api::parseSpec(*json);
  if (!parsed.errors.empty()) {
    return invalidArgument(fmt::format("--job {}: not a valid TrainingJob: {}", o.jobFile,
                                       api::joinErrors(parsed.errors)));
  }
  const api::TrainingJobSpec& spec = parsed.spec;
  std::vector<std::string> names;
  for (const api::Region& r : spec.regions) {
    if (r.replicas != spec.regions.front().replicas) {
      return invalidArgument(fmt::format(
          "--job {}: region {} has {} workers and {} has {}: the plan needs as many in every "
          "region",
          o.jobFile, spec.regions.front().name, spec.regions.front().replicas, r.name, r.replicas));
    }
    names.push_back(r.name);
  }
  o.topology.regions = fmt::format("{}", fmt::join(names, ","));
  o.topology.workersPerRegion = spec.regions.front().replicas;
  const WorkerConfig& c = spec.worker;
  o.model = c.model.builtin.empty() ? "torchscript" : c.model.builtin;
  if (c.model.width > 0) o.width = c.model.width;
  o.codec = c.sync.codec;
  o.bits = static_cast<int>(c.sync.bits);
  o.bucket = c.sync.bucket;
  o.hierarchical = c.sync.hierarchical;
  o.lanCodec = c.sync.lanCodec;
  if (c.sync.period) o.period = *c.sync.period;
  o.delay = c.sync.delay;
  o.swarmH = c.sync.swarmH;
  return {};
#endif
}

StatusOr<PlanInput> makePlanInput(const PlanOptions& given) {
  PlanOptions o = given;
  if (!o.jobFile.empty()) GEO_RETURN_IF_ERROR(applyJobFile(o));
  auto topology = makeTopology(o.topology);
  if (!topology.ok()) return topology.status();
  PlanInput in;
  in.regions = topology->regions;
  in.workersPerRegion = topology->workersPerRegion;
  in.rttSeconds.assign(in.regions.size(), std::vector<double>(in.regions.size(), 0.0));
  for (size_t i = 0; i < in.regions.size(); ++i) {
    for (size_t j = 0; j < in.regions.size(); ++j) {
      in.rttSeconds[i][j] = static_cast<double>(topology->rtt[i][j].count()) * 1e-6;
    }
  }
  if (!topology->uplink.empty()) {
    auto link = transport::parseLinkProfile(topology->uplink);
    if (!link.ok()) return link.status().withContext("--uplink");
    in.uplinkBytesPerSecond = link->bytesPerSecond;
  }
  if (o.stepTime.empty()) {
    return invalidArgument(
        "--step-time is required: one worker's time per step without any exchange (e.g. 25ms: "
        "what `geotrain-worker --steps 20` takes alone on the node type, or a `geotrain local "
        "--algorithm none` run's ms/step)");
  }
  auto step = parseSeconds(o.stepTime);
  if (!step.ok()) return step.status().withContext("--step-time");
  in.stepSeconds = *step;
  in.codecSecondsPerValue = o.codecNsPerValue * 1e-9;
  in.coresPerWorker = o.coresPerWorker;
  if (o.parameters < 0) {
    return invalidArgument(fmt::format("--parameters {} (allowed: >= 1)", o.parameters));
  }
  if (o.parameters > 0) {
    in.tensorSizes = {o.parameters};
  } else if (o.model == "mlp") {
    if (o.width < 1 || o.width > kMaxModelWidth) {
      return invalidArgument(fmt::format("--width {} (allowed: 1..{})", o.width, kMaxModelWidth));
    }
    in.tensorSizes = mlpTensorSizes(o.width);
  } else if (o.model == "cnn") {
    in.tensorSizes = cnnTensorSizes();
  } else if (o.model == "resnet18") {
    in.tensorSizes = {kResnet18Parameters};
  } else {
    return invalidArgument(fmt::format(
        "--model {}: mlp, cnn and resnet18 are known; give any other model's parameter count "
        "with --parameters (each worker logs it at start: \"(N parameters)\")",
        o.model));
  }
  in.codec = o.codec;
  in.bits = o.bits;
  in.bucket = o.bucket;
  in.hierarchical = o.hierarchical;
  in.lanCodec = o.lanCodec;
  in.period = o.period;
  in.delay = o.delay;
  in.swarmH = o.swarmH;
  in.referenceSteps = o.referenceSteps;
  if (Status s = validatePlanInput(in); !s.ok()) return s;
  return in;
}

std::string formatPlan(const PlanInput& in, const Plan& p) {
  auto kb = [](double bytes) { return bytes / 1000.0; };
  int64_t params = 0;
  for (int64_t n : in.tensorSizes) params += n;
  std::string out = fmt::format(
      "{} regions x {} workers; slowest link {:.0f} ms one way; uplink {}\n"
      "model: {} parameters; one update {:.1f} KB with {} ({:.1f} KB in fp32); a step computes "
      "in {:.2f} ms; the codec takes {:.2f} ns a value on {:.3g} cores\n\n",
      in.regions.size(), in.workersPerRegion, p.slowestOneWaySeconds * 1e3,
      in.uplinkBytesPerSecond > 0 ? fmt::format("{:.0f} Mbit/s", in.uplinkBytesPerSecond * 8e-6)
                                  : std::string("unlimited"),
      params, kb(p.payloadBytes), in.codec == "qsgd" ? fmt::format("qsgd-{}", in.bits) : in.codec,
      kb(p.fp32PayloadBytes), in.stepSeconds * 1e3, in.codecSecondsPerValue * 1e9,
      in.coresPerWorker);
  out += fmt::format("{:<31} {:>4} {:>4} {:>9} {:>9} {:>9} {:>12} {:>9} {:>15} {:>15}  {}\n",
                     "algorithm", "K", "D", "step ms", "codec ms", "steps/s", "WAN KB/step",
                     "staleness", "steps to target", "time to target", "limited by");
  for (size_t i = 0; i < p.rows.size(); ++i) {
    const PlanRow& r = p.rows[i];
    out += fmt::format(
        "{:<31} {:>4} {:>4} {:>9.2f} {:>9.2f} {:>9.1f} {:>12.1f} {:>9.1f} {:>14.0f}{} {:>13.1f} s  "
        "{}{}\n",
        r.algorithm, r.period, r.delay, r.stepSeconds * 1e3, r.codecSeconds * 1e3, r.stepsPerSecond,
        kb(r.wanBytesPerStep), r.staleness, r.stepsToTarget, r.extrapolated ? "*" : " ",
        r.secondsToTarget, r.limit, i == p.recommended ? "  <- recommended" : "");
  }
  const PlanRow& best = p.rows[p.recommended];
  const PlanRow& ddp = p.rows.front();
  out += fmt::format(
      "\nrecommended: {} ({:.1f} s to the target, {:.1f}x sooner than allreduce fp32 every "
      "step)\n",
      best.algorithm, best.secondsToTarget, ddp.secondsToTarget / best.secondsToTarget);
  if (in.regions.size() * static_cast<size_t>(in.workersPerRegion) > 2) {
    out += fmt::format(
        "sync.exchange auto: {} (the workers start on allgather and move where the other "
        "promises at least a fifth less time to the target)\n",
        p.autoExchange == sync::Exchange::kReduceScatter ? "would move to reducescatter"
                                                         : "would keep allgather");
  }
  if (std::any_of(p.rows.begin(), p.rows.end(), [](const PlanRow& r) { return r.extrapolated; })) {
    out += "* steps to target beyond what was measured (docs/benchmarks.md): extrapolated\n";
  }
  out += fmt::format(
      "steps to target: {:.0f} steps of allreduce fp32 (--reference-steps) times each "
      "algorithm's measured factor; time excludes the start and the final average\n",
      in.referenceSteps);
  if (in.hierarchical && in.workersPerRegion > 1) {
    out += fmt::format(
        "a region's LAN reduce: {:.2f} ms of a leader's step encrypting and decrypting its "
        "members' updates and their result (sync.lanCodec {}); the LAN's own time and the "
        "barrier it makes of every step are not counted\n",
        p.lanSecondsPerStep * 1e3, in.lanCodec);
  }
  if (p.finalAverageSeconds > 0) {
    out += fmt::format(
        "the final average (dts, allreduce): {}, about {:.1f} s\n",
        p.finalAverageWay == sync::FinalAverageWay::kReduceScatter
            ? fmt::format("by reduce-scatter in fp32, each of the {} workers averaging one shard",
                          p.finalAverageShards + 1)
        : p.finalAverageWay == sync::FinalAverageWay::kShards
            ? fmt::format(
                  "the models in fp32 to one worker and back in {} shards, each forwarded by its "
                  "member",
                  p.finalAverageShards)
            : std::string("the models in fp32 to one worker and back"),
        p.finalAverageSeconds);
  }
  return out;
}

}  // namespace geo::local
