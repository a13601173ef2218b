// `geotrain-worker`: one training worker. Reads worker.yaml (every field has
// a default; see docs/worker-config.md), applies command-line overrides,
// loads its shard of the data set, builds the model, connects to its peers
// (sync.algorithm other than none) and trains, printing progress every
// training.logInterval steps: log lines on stderr, or with
// `--progress-format jsonl` one JSON object per line on stdout (the contract
// `geotrain local` reads; see docs/worker-progress.md). Exit code 0 on
// success (also when the job had finished before this worker could rejoin
// it), 1 on a failure (with the reason on stderr), 2 on a usage or
// configuration error (retrying the same configuration cannot help: the
// Kubernetes pod failure policy fails the job on it).
//
// Fault injection for `geotrain local`: SIGUSR1 cuts this worker off from the
// other regions (the emulated links drop everything both ways) until
// SIGUSR2; --emulate-slowdown stretches every step.

#include <fmt/format.h>
#include <torch/torch.h>
#include <CLI/CLI.hpp>

#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/logging.h"
#include "common/worker_config.h"
#include "worker/metrics/worker_metrics.h"
#include "worker/sync/synchronizer.h"
#include "worker/train/trainer.h"
#include "worker/transport/keys.h"
#include "worker/transport/link.h"
#include "worker/transport/zmq_transport.h"

namespace {

constexpr int kExitOk = 0;
constexpr int kExitFailure = 1;
constexpr int kExitUsage = 2;

std::string jsonString(const std::string& text) {
  std::string out = "\"";
  for (const char ch : text) {
    switch (ch) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(ch) < 0x20) {
          out += fmt::format("\\u{:04x}", static_cast<int>(ch));
        } else {
          out += ch;
        }
    }
  }
  return out + "\"";
}

// "loss":X for a JSON line. JSON has no NaN or infinity: a loss that is no
// finite number is null, with the flag
// that says so: "nonFinite":["loss"], so that a reader can tell a diverged
// loss from a missing one.
std::string lossFields(double loss) {
  return std::isfinite(loss) ? fmt::format("\"loss\":{:.6g}", loss)
                             : std::string("\"loss\":null,\"nonFinite\":[\"loss\"]");
}

// Progress output: JSON lines on stdout for `--progress-format jsonl`.
class Progress {
 public:
  explicit Progress(bool jsonl, int64_t rank) : jsonl_(jsonl), rank_(rank) {}
  bool jsonl() const { return jsonl_; }
  double elapsed() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }
  // `fields`: the event's other members, already JSON ("\"a\":1,\"b\":2").
  void emit(const std::string& event, const std::string& fields) const {
    if (!jsonl_) return;
    std::string line = fmt::format("{{\"event\":\"{}\",\"rank\":{},\"time\":{:.3f}{}{}}}\n", event,
                                   rank_, elapsed(), fields.empty() ? "" : ",", fields);
    std::fwrite(line.data(), 1, line.size(), stdout);
    std::fflush(stdout);
  }

 private:
  bool jsonl_;
  int64_t rank_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

const Progress* gProgress = nullptr;

int fail(const geo::Status& s) {
  std::cerr << "geotrain-worker: " << s.message() << "\n";
  if (gProgress != nullptr) gProgress->emit("error", "\"message\":" + jsonString(s.message()));
  return kExitFailure;
}

// A configuration that cannot work: exit 2, so nobody retries it.
int failConfig(const geo::Status& s) {
  (void)fail(s);
  return kExitUsage;
}

// SIGUSR1 / SIGUSR2 start and end an emulated partition. main() blocks both
// before any thread exists (every thread inherits the mask); this thread
// takes them with sigwait and tells the transport, outside any signal
// handler. It lives until the process exits.
void watchPartitionSignals(geo::transport::Transport* transport) {
  std::thread([transport] {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGUSR1);
    sigaddset(&set, SIGUSR2);
    while (true) {
      int signal = 0;
      if (sigwait(&set, &signal) != 0) return;
      transport->setPartitioned(signal == SIGUSR1);
    }
  }).detach();
}

geo::train::TrainerOptions trainerOptions(const geo::WorkerConfig& c, torch::Device device) {
  geo::train::TrainerOptions o;
  const auto& t = c.training;
  o.steps = t.steps;
  o.batchSize = t.batchSize;
  o.optimizer = t.optimizer;
  o.lr = t.lr;
  o.momentum = t.momentum;
  o.nesterov = t.nesterov;
  o.weightDecay = t.weightDecay;
  o.schedule = t.schedule;
  o.warmupSteps = t.warmupSteps;
  o.stepSize = t.stepSize;
  o.stepGamma = t.stepGamma;
  o.gradClip = t.gradClip;
  o.evalInterval = t.evalInterval;
  o.logInterval = t.logInterval > 0 ? t.logInterval : t.steps;
  o.seed = c.job.seed + static_cast<uint64_t>(c.worker.rank);  // each worker its own order
  o.device = device;
  o.checkpointDir = c.checkpoint.dir;
  o.checkpointInterval = c.checkpoint.interval;
  o.keepCheckpoints = static_cast<int>(c.checkpoint.keep);
  o.resume = c.checkpoint.resume;
  return o;
}

// Splits a transport.links key "a-b" into two region names of the job (region
// names may contain '-': the split must leave two known names).
std::optional<std::pair<std::string, std::string>> splitLinkKey(
    const std::string& key, const std::set<std::string>& known) {
  for (size_t dash = key.find('-'); dash != std::string::npos; dash = key.find('-', dash + 1)) {
    std::string a = key.substr(0, dash);
    std::string b = key.substr(dash + 1);
    if (known.contains(a) && known.contains(b)) return std::make_pair(a, b);
  }
  return std::nullopt;
}

std::vector<std::string> rankRegions(const geo::WorkerConfig& c) {
  if (!c.transport.regions.empty()) return c.transport.regions;
  return std::vector<std::string>(static_cast<size_t>(c.worker.worldSize), c.worker.region);
}

// The transport of a job of several workers: endpoints, CURVE keys from
// transport.keyDir, and the emulated links to the ranks of other regions.
geo::StatusOr<std::unique_ptr<geo::transport::Transport>> makeTransport(
    const geo::WorkerConfig& c, const geo::sync::Topology& topology) {
  namespace gt = geo::transport;
  const auto world = static_cast<uint32_t>(c.worker.worldSize);
  if (c.transport.peers.empty()) {
    return geo::invalidArgument(fmt::format(
        "transport.peers: empty, but a job of {} workers needs one endpoint per rank", world));
  }
  gt::TransportConfig t;
  t.jobId = c.job.id;
  t.rank = topology.rank();
  t.endpoints = c.transport.peers;
  for (auto& e : t.endpoints) {
    if (e == "none") e.clear();  // never connected to (see transport.peers)
  }
  t.bindEndpoint = c.transport.listen;
  const std::filesystem::path keyDir = c.transport.keyDir;
  auto secret =
      gt::loadSecretKey(keyDir / fmt::format("worker-{}.key", t.rank),
                        c.transport.keyGroupReadable ? gt::SecretKeyAccess::kOwnerAndGroupRead
                                                     : gt::SecretKeyAccess::kOwnerOnly);
  if (!secret.ok()) return secret.status();
  t.secretKey = *secret;
  for (uint32_t r = 0; r < world; ++r) {
    auto pub = gt::loadPublicKey(keyDir / fmt::format("worker-{}.pub", r));
    if (!pub.ok()) return pub.status();
    t.publicKeys.push_back(*pub);
  }
  const std::vector<std::string> regions = rankRegions(c);
  const std::set<std::string> known(regions.begin(), regions.end());
  std::map<std::pair<std::string, std::string>, gt::LinkProfile> links;
  for (const auto& [key, spec] : c.transport.links) {
    const auto pair = splitLinkKey(key, known);
    if (!pair) {
      return geo::invalidArgument(
          fmt::format("transport.links.{}: not two regions of this job joined by '-' (regions: {})",
                      key, fmt::join(known, ", ")));
    }
    auto profile = gt::parseLinkProfile(spec);
    if (!profile.ok()) {
      return geo::invalidArgument(
          fmt::format("transport.links.{}: {}", key, profile.status().message()));
    }
    links[*pair] = *profile;
    links[{pair->second, pair->first}] = *profile;
  }
  auto uplink = gt::parseLinkProfile(c.transport.uplink);
  if (!uplink.ok()) {
    return geo::invalidArgument(fmt::format("transport.uplink: {}", uplink.status().message()));
  }
  t.uplink = *uplink;
  t.links.resize(world);
  t.uplinkPeers.assign(world, false);
  const std::string& mine = regions[t.rank];
  for (uint32_t r = 0; r < world; ++r) {
    if (r == t.rank || regions[r] == mine) continue;
    t.uplinkPeers[r] = true;
    if (auto it = links.find({mine, regions[r]}); it != links.end()) t.links[r] = it->second;
  }
  return gt::makeZmqTransport(std::move(t));
}

// One consistent reading of the synchronizer's and the transport's cumulative
// totals: a progress event and the metrics published from the same Totals
// agree to the byte (the transport's pings keep counting in the background).
struct Totals {
  geo::sync::SyncStats sync;
  std::vector<geo::transport::PeerCounters> peers;
  geo::transport::TransportCounters transport;
};

Totals readTotals(const geo::sync::Synchronizer* sync, const geo::transport::Transport* transport) {
  Totals t;
  if (sync != nullptr) t.sync = sync->stats();
  if (transport != nullptr) {
    t.peers = transport->peerCounters();
    t.transport = transport->counters();
  }
  return t;
}

// "sync":{...},"bytes":{...} members of a progress or done event.
std::string syncFields(const Totals& t, const geo::sync::Topology& topology) {
  uint64_t wanSent = 0, wanReceived = 0, lanSent = 0, lanReceived = 0;
  for (const auto& p : t.peers) {
    const bool lan = topology.sameRegion(p.peer, topology.rank());
    (lan ? lanSent : wanSent) += p.bytesSent;
    (lan ? lanReceived : wanReceived) += p.bytesReceived;
  }
  const geo::sync::SyncStats& s = t.sync;
  return fmt::format(
      "\"sync\":{{\"delay\":{},\"rounds\":{},\"appliedUpdates\":{},\"stalenessMean\":{:.4g},"
      "\"stalenessMax\":{},\"missing\":{},\"waitSeconds\":{:.4g},\"codecSeconds\":{:.4g},"
      "\"peersDown\":{},\"degradedSeconds\":{:.4g},\"rejoins\":{},\"peerRejoins\":{},"
      "\"stateTransferBytes\":{},\"lateApplied\":{},\"lateDropped\":{},\"rejected\":{}}},"
      "\"bytes\":{{\"wanSent\":{},\"wanReceived\":{},\"lanSent\":{},\"lanReceived\":{},"
      "\"payload\":{}}}",
      s.delay, s.rounds, s.appliedUpdates, s.stalenessMean(), s.stalenessMax, s.missing,
      s.waitSeconds, s.codecSeconds,
      std::count_if(s.peerUp.begin(), s.peerUp.end(), [](const auto& p) { return !p.second; }),
      s.degradedSeconds, s.rejoins, s.peerRejoins,
      s.stateTransferBytesSent + s.stateTransferBytesReceived, s.lateApplied, s.lateDropped,
      s.rejectedTotal(), wanSent, wanReceived, lanSent, lanReceived, s.payloadBytes);
}

// Around the synchronizer (which may be null: a single worker): feeds the
// Prometheus metrics once per step (when there are metrics), measures the
// longest step (a stall shows there), and reports a join as a progress event.
class WorkerHook final : public geo::train::StepHook {
 public:
  WorkerHook(geo::metrics::WorkerMetrics* metrics, geo::sync::Synchronizer* sync,
             const geo::transport::Transport* transport, uint64_t batchSize,
             const Progress& progress)
      : metrics_(metrics),
        sync_(sync),
        transport_(transport),
        batchSize_(batchSize),
        progress_(progress) {}

  geo::StatusOr<geo::train::JoinResult> join(int64_t step,
                                             geo::train::FlatParameters& flat) override {
    if (sync_ == nullptr) return geo::train::JoinResult{step, false};
    auto joined = sync_->join(step, flat);
    if (joined.ok()) {
      const geo::sync::SyncStats s = sync_->stats();
      progress_.emit("joined",
                     fmt::format("\"step\":{},\"fromStep\":{},\"transferred\":{},"
                                 "\"jobFinished\":{},\"stateTransferSeconds\":{:.4g}",
                                 joined->step, step, s.rejoins > 0 ? "true" : "false",
                                 joined->jobFinished ? "true" : "false", s.stateTransferSeconds));
    }
    last_ = std::chrono::steady_clock::now();
    return joined;
  }
  geo::Status afterBackward(int64_t step, geo::train::FlatParameters& flat) override {
    return sync_ != nullptr ? sync_->afterBackward(step, flat) : geo::Status();
  }
  geo::Status afterStep(int64_t step, geo::train::FlatParameters& flat) override {
    if (sync_ != nullptr) GEO_RETURN_IF_ERROR(sync_->afterStep(step, flat));
    const auto now = std::chrono::steady_clock::now();
    const double seconds = std::chrono::duration<double>(now - last_).count();
    // The first step includes connection set-up and warm-up.
    if (++steps_ > 1) longestStep_ = std::max(longestStep_, seconds);
    if (metrics_ != nullptr) {
      metrics_->recordStep(seconds, loss_, batchSize_);
      metrics_->setStep(step + 1);
      publish(readTotals(sync_, transport_));
    }
    last_ = now;
    return {};
  }
  geo::Status finish(int64_t steps, geo::train::FlatParameters& flat) override {
    if (sync_ != nullptr) GEO_RETURN_IF_ERROR(sync_->finish(steps, flat));
    if (metrics_ != nullptr) publish(readTotals(sync_, transport_));
    return {};
  }
  void saveState(torch::serialize::OutputArchive& archive) override {
    if (sync_ != nullptr) sync_->saveState(archive);
  }
  geo::Status loadState(torch::serialize::InputArchive& archive) override {
    return sync_ != nullptr ? sync_->loadState(archive) : geo::Status();
  }
  // The trainer reports the loss with its progress (every logInterval steps);
  // the gauge shows the latest reported value.
  void setLoss(double loss) { loss_ = loss; }
  // The longest step so far, after the first (seconds).
  double longestStep() const { return longestStep_; }

  // Sets the transport and synchronizer metrics to `t`.
  void publish(const Totals& t) {
    if (metrics_ == nullptr) return;
    if (transport_ != nullptr) metrics_->updateTransport(t.peers, t.transport);
    if (sync_ == nullptr) return;
    const geo::sync::SyncStats& s = t.sync;
    geo::metrics::SyncSnapshot m;
    m.delay = s.delay;
    m.rounds = s.rounds;
    m.appliedUpdates = s.appliedUpdates;
    m.missing = s.missing;
    m.stalenessSum = s.stalenessSum;
    m.stalenessCounts = s.stalenessCounts;
    m.payloadBytes = s.payloadBytes;
    m.encodedBytes = s.encodedBytes;
    m.waitSeconds = s.waitSeconds;
    m.codecSeconds = s.codecSeconds;
    m.roundSecondsSum = s.roundSecondsSum;
    m.roundSecondsCount = s.roundSecondsCount;
    m.peerUp = s.peerUp;
    m.degradedSeconds = s.degradedSeconds;
    m.rejoins = s.rejoins;
    m.peerRejoins = s.peerRejoins;
    m.stateTransferBytesSent = s.stateTransferBytesSent;
    m.stateTransferBytesReceived = s.stateTransferBytesReceived;
    m.stateTransferSeconds = s.stateTransferSeconds;
    m.lateApplied = s.lateApplied;
    m.lateDropped = s.lateDropped;
    for (const auto& r : s.rejected) m.rejected.push_back({r.peer, r.reason, r.count});
    metrics_->updateSync(m);
  }

 private:
  geo::metrics::WorkerMetrics* metrics_;
  geo::sync::Synchronizer* sync_;
  const geo::transport::Transport* transport_;
  uint64_t batchSize_;
  const Progress& progress_;
  double loss_ = 0;
  int64_t steps_ = 0;
  double longestStep_ = 0;
  std::chrono::steady_clock::time_point last_ = std::chrono::steady_clock::now();
};

// Starts the /metrics endpoint when metrics.enabled. A port that cannot be
// bound is logged and training goes on without metrics: a busy port should
// not cost a training run.
std::unique_ptr<geo::metrics::WorkerMetrics> startMetrics(const geo::WorkerConfig& c,
                                                          const geo::sync::Topology& topology) {
  if (!c.metrics.enabled) return nullptr;
  std::vector<geo::metrics::PeerInfo> peers;
  for (uint32_t r = 0; r < topology.worldSize(); ++r) {
    if (r == topology.rank()) continue;
    peers.push_back({r, topology.regionOf(r), !topology.sameRegion(r, topology.rank())});
  }
  auto m = geo::metrics::WorkerMetrics::start(
      c.metrics.listen, {c.job.id, c.worker.region, c.worker.rank}, std::move(peers));
  if (!m.ok()) {
    geo::logger()->warn(
        "metrics: {}; training without metrics (set metrics.listen, or "
        "metrics.enabled: false)",
        m.status().message());
    return nullptr;
  }
  geo::logger()->info("metrics: http://{}/metrics (port {})", c.metrics.listen, (*m)->port());
  return std::move(*m);
}

geo::sync::SyncOptions syncOptions(const geo::WorkerConfig& c) {
  geo::sync::SyncOptions o;
  o.algorithm = c.sync.algorithm;
  o.period = c.sync.period.value_or(geo::kAutoPeriodStart);
  o.autoPeriod = !c.sync.period.has_value();
  o.delay = c.sync.delay;
  o.swarmH = c.sync.swarmH;
  o.codec.name = c.sync.codec;
  o.codec.bits = static_cast<int>(c.sync.bits);
  o.codec.bucket = c.sync.bucket;
  o.codec.threads = static_cast<int>(c.training.threads);
  o.lanCodec = c.sync.lanCodec;
  o.errorFeedback = c.sync.errorFeedback;
  o.hierarchical = c.sync.hierarchical;
  o.timeout = std::chrono::milliseconds(static_cast<int64_t>(c.sync.timeoutSeconds * 1000));
  o.peerTimeout = std::chrono::milliseconds(static_cast<int64_t>(c.sync.peerTimeoutSeconds * 1000));
  o.seed = c.job.seed;
  return o;
}

// 64-bit FNV-1a of the model's bytes: workers that agree on the final model
// print the same value.
std::string modelHash(const torch::Tensor& values) {
  const torch::Tensor v = values.contiguous().to(torch::kCPU);
  const auto* bytes = static_cast<const unsigned char*>(v.data_ptr());
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < static_cast<size_t>(v.numel()) * v.element_size(); ++i) {
    h = (h ^ bytes[i]) * 0x100000001b3ull;
  }
  return fmt::format("{:016x}", h);
}

int runWorker(const geo::WorkerConfig& c, const Progress& progress, double slowdown) {
  if (auto s = geo::initLogging(c.log.level); !s.ok()) return fail(s);
  if (auto s = geo::setLogFormat(c.log.format); !s.ok()) return fail(s);
  if (c.training.threads > 0) torch::set_num_threads(static_cast<int>(c.training.threads));
  torch::Device device = torch::kCPU;
  if (c.training.device == "cuda" || (c.training.device == "auto" && torch::cuda::is_available())) {
    if (!torch::cuda::is_available()) {
      return fail(geo::failedPrecondition(
          "training.device: cuda was requested but this LibTorch has no usable CUDA device"));
    }
    device = torch::kCUDA;
  }

  auto topology = geo::sync::Topology::make(rankRegions(c), static_cast<uint32_t>(c.worker.rank));
  if (!topology.ok()) return fail(topology.status());
  std::unique_ptr<geo::transport::Transport> transport;
  std::unique_ptr<geo::sync::Synchronizer> sync;
  if (c.sync.algorithm != "none") {
    if (c.worker.worldSize > 1) {
      auto t = makeTransport(c, *topology);
      if (!t.ok()) return fail(t.status());
      transport = std::move(*t);
      watchPartitionSignals(transport.get());
    }
    auto s = geo::sync::makeSynchronizer(syncOptions(c), *topology, transport.get());
    if (!s.ok()) return fail(s.status());
    sync = std::move(*s);
  }

  geo::train::DatasetSpec spec;
  spec.name = c.dataset.name;
  spec.path = c.dataset.path;
  spec.syntheticSamples = c.dataset.syntheticSamples;
  spec.seed = c.job.seed;
  auto train = geo::train::loadDataset(spec, geo::train::Split::kTrain);
  if (!train.ok()) return fail(train.status());
  auto test = geo::train::loadDataset(spec, geo::train::Split::kTest);
  if (!test.ok()) return fail(test.status());
  const int64_t shardIndex = geo::effectiveShardIndex(c);
  const int64_t shardCount = geo::effectiveShardCount(c);
  auto shard = geo::train::shard(*train, shardIndex, shardCount);
  const int64_t shardSamples = shard.size();
  const std::vector<int64_t> inputShape = {train->inputs.size(1), train->inputs.size(2),
                                           train->inputs.size(3)};
  const int64_t numClasses = train->numClasses;
  train = geo::train::TensorDataset{};  // the shard owns its samples: free the rest

  torch::manual_seed(c.job.seed);  // identical initial weights on every worker
  auto model =
      geo::train::makeModel({c.model.builtin, c.model.torchscript}, inputShape, numClasses);
  if (!model.ok()) return fail(model.status());
  const std::string describe = (*model)->describe();
  const int64_t params = (*model)->parameterCount();
  auto options = trainerOptions(c, device);
  options.slowdown = slowdown;
  // An evaluation over the test set costs as much as many steps, and a
  // worker that evaluates falls behind its peers: only rank 0 evaluates
  // every training.evalInterval steps; every worker evaluates its final
  // model (the same on all once the synchronizer has averaged them).
  if (c.worker.rank != 0 && c.sync.algorithm != "none") options.evalInterval = 0;
  const auto metrics = startMetrics(c, *topology);
  auto workerHook =
      std::make_unique<WorkerHook>(metrics.get(), sync.get(), transport.get(),
                                   static_cast<uint64_t>(c.training.batchSize), progress);
  geo::train::StepHook* hook = workerHook.get();
  auto trainer =
      geo::train::Trainer::create(std::move(*model), std::move(shard), *test, options, hook);
  if (!trainer.ok()) return fail(trainer.status());
  if (options.evalInterval > 0) {
    // Periodic evaluations run on a snapshot in the background, on a second
    // instance of the model, so that they never hold up a step (nor, through
    // the synchronizer, every other worker).
    auto evalModel =
        geo::train::makeModel({c.model.builtin, c.model.torchscript}, inputShape, numClasses);
    if (!evalModel.ok()) return fail(evalModel.status());
    if (const geo::Status s = (*trainer)->evaluateInBackground(std::move(*evalModel)); !s.ok()) {
      return fail(s);
    }
  }
  auto resumed = (*trainer)->resume();
  if (!resumed.ok()) return fail(resumed.status());

  geo::logger()->info(
      "rank {}/{} ({}): {} ({} parameters) on {}, {} shard {}/{} ({} samples), {} steps of {}{}",
      c.worker.rank, c.worker.worldSize, c.worker.region, describe, params, device.str(),
      c.dataset.name, shardIndex, shardCount, shardSamples, c.training.steps, c.training.batchSize,
      *resumed > 0 ? ", resumed at step " + std::to_string(*resumed) : std::string());
  if (sync) geo::logger()->info("sync: {}", sync->describe());
  progress.emit("start", fmt::format("\"region\":{},\"localRank\":{},\"worldSize\":{},\"model\":{},"
                                     "\"parameters\":{},\"shardSamples\":{},\"steps\":{},"
                                     "\"algorithm\":{},\"resumedAt\":{}",
                                     jsonString(c.worker.region), c.worker.localRank,
                                     c.worker.worldSize, jsonString(describe), params, shardSamples,
                                     c.training.steps, jsonString(c.sync.algorithm), *resumed));

  std::optional<double> finalAccuracy;
  double finalLoss = 0;
  const geo::Status s = (*trainer)->run([&](const geo::train::StepStats& st) {
    if (st.step == c.training.steps) {
      finalAccuracy = st.evalAccuracy;
      finalLoss = st.loss;
    }
    workerHook->setLoss(st.loss);
    if (metrics && st.evalAccuracy) metrics->setEvalAccuracy(*st.evalAccuracy);
    if (progress.jsonl()) {
      std::string fields = fmt::format("\"step\":{},{},\"lr\":{:.6g},\"samplesPerSecond\":{:.1f}",
                                       st.step, lossFields(st.loss), st.lr, st.samplesPerSecond);
      if (st.evalAccuracy) {
        fields += fmt::format(",\"evalAccuracy\":{:.6g},\"evalStep\":{},\"evalAgeSeconds\":{:.4g}",
                              *st.evalAccuracy, st.evalStep.value_or(st.step), st.evalAgeSeconds);
      }
      fields += fmt::format(",\"stepSecondsMax\":{:.4g}", workerHook->longestStep());
      progress.emit("progress",
                    fields + "," + syncFields(readTotals(sync.get(), transport.get()), *topology));
      return;
    }
    std::string eval;
    if (st.evalAccuracy) {
      eval = fmt::format(" eval accuracy {:.2f}%", *st.evalAccuracy * 100);
      if (st.evalStep && *st.evalStep != st.step) eval += fmt::format(" (step {})", *st.evalStep);
    }
    std::string syncText;
    if (sync) {
      const auto ss = sync->stats();
      syncText = fmt::format(" staleness {:.1f} wait {:.1f}s", ss.stalenessMean(), ss.waitSeconds);
      if (c.sync.algorithm == "dts") syncText += fmt::format(" D={}", ss.delay);
    }
    geo::logger()->info("step {:>6} loss {:.4f} lr {:.4g} {:>8.0f} samples/s{}{}", st.step, st.loss,
                        st.lr, st.samplesPerSecond, syncText, eval);
  });
  if (!s.ok()) return fail(s);
  if ((*trainer)->arrivedAfterEnd()) {
    // Nothing to do: the job ended without us (exit 0, so that a supervisor
    // does not restart us again and again).
    geo::logger()->warn(
        "the job finished before this worker could rejoin it (every peer that answered had "
        "completed {} steps); nothing to do",
        c.training.steps);
    progress.emit("done", fmt::format("\"step\":{},\"arrivedAfterEnd\":true", c.training.steps));
    return kExitOk;
  }
  std::string done = fmt::format(
      "\"step\":{},{},\"stepSecondsMax\":{:.4g},"
      "\"modelHash\":\"{}\"",
      c.training.steps, lossFields(finalLoss), workerHook->longestStep(),
      modelHash((*trainer)->flat().values));
  if (auto joinedAt = (*trainer)->joinedAt()) done += fmt::format(",\"joinedAt\":{}", *joinedAt);
  if (finalAccuracy) done += fmt::format(",\"testAccuracy\":{:.6g}", *finalAccuracy);
  // The last metrics and the done event come from one reading, so a scraper
  // that finds the worker lingering sees exactly the totals of the event.
  const Totals totals = readTotals(sync.get(), transport.get());
  workerHook->publish(totals);
  progress.emit("done", done + "," + syncFields(totals, *topology));
  if (finalAccuracy) {
    geo::logger()->info("done: {} steps, test accuracy {:.2f}%", c.training.steps,
                        *finalAccuracy * 100);
  }
  if (metrics && c.metrics.lingerSeconds > 0) {
    // A worker that exits at once takes its final values with it before
    // Prometheus' next scrape: keep serving them for one scrape interval.
    geo::logger()->info("metrics: serving the final values for {}s (metrics.lingerSeconds)",
                        c.metrics.lingerSeconds);
    std::this_thread::sleep_for(std::chrono::duration<double>(c.metrics.lingerSeconds));
  }
  return kExitOk;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app(
      "geotrain-worker: one geotrain training worker.\n"
      "Reads worker.yaml (every key has a default: docs/worker-config.md), applies the\n"
      "overrides given here, trains, and prints progress every training.logInterval steps.");
  std::string configPath;
  std::vector<std::string> sets;
  bool printConfig = false;
  std::string progressFormat = "text";
  app.add_option("--config,-c", configPath, "worker.yaml to read (default: all defaults)")
      ->check(CLI::ExistingFile);
  app.add_option("--set", sets,
                 "Override one key, e.g. --set training.lr=0.1 --set model.builtin=cnn "
                 "(repeatable; same names and checks as worker.yaml)");
  // Shorthands for the keys changed most often; each is a --set.
  std::vector<std::pair<std::string, std::string>> shorthand;
  auto addShort = [&](const std::string& flag, const std::string& key, const std::string& help) {
    app.add_option_function<std::string>(
        flag, [&shorthand, key](const std::string& v) { shorthand.emplace_back(key, v); },
        help + " (= --set " + key + "=...)");
  };
  addShort("--model", "model.builtin", "Built-in model: mlp, cnn or resnet18");
  addShort("--torchscript", "model.torchscript", "TorchScript model file to train instead");
  addShort("--dataset", "dataset.name", "fashion-mnist, mnist, cifar10 or synthetic");
  addShort("--data-path", "dataset.path", "Folder with the data set files");
  addShort("--steps", "training.steps", "Optimizer steps");
  addShort("--batch-size", "training.batchSize", "Samples per step");
  addShort("--lr", "training.lr", "Learning rate");
  addShort("--checkpoint-dir", "checkpoint.dir", "Where to write and resume checkpoints");
  addShort("--metrics-listen", "metrics.listen", "host:port of the Prometheus /metrics endpoint");
  addShort("--log-level", "log.level", "trace, debug, info, warn, error, critical or off");
  addShort("--log-format", "log.format", "text, or json: one object a line for log collectors");
  double slowdown = 1;
  app.add_option("--emulate-slowdown", slowdown,
                 "Fault injection: stretch every step to this many times its duration, emulating a "
                 "slower machine (geotrain local --slow)")
      ->check(CLI::Range(1.0, 100.0))
      ->capture_default_str();
  std::optional<int64_t> completionIndex;
  app.add_option("--completion-index", completionIndex,
                 "Place this worker as the N-th (0-based) of worker.region: sets worker.localRank "
                 "and worker.rank from transport.regions (Kubernetes Indexed Jobs pass "
                 "$(JOB_COMPLETION_INDEX)); applied after --set");
  app.add_flag("--print-config", printConfig, "Print the effective configuration as YAML and exit");
  app.add_option("--progress-format", progressFormat,
                 "text: progress as log lines on stderr; jsonl: also one JSON object per line on "
                 "stdout (events start, progress, done, error; see docs/worker-progress.md)")
      ->check(CLI::IsMember({"text", "jsonl"}))
      ->capture_default_str();
  // Before any thread exists, so that every thread inherits it: SIGUSR1 and
  // SIGUSR2 (emulated partitions) are taken by one thread with sigwait.
  sigset_t partitionSignals;
  sigemptyset(&partitionSignals);
  sigaddset(&partitionSignals, SIGUSR1);
  sigaddset(&partitionSignals, SIGUSR2);
  pthread_sigmask(SIG_BLOCK, &partitionSignals, nullptr);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? kExitOk : kExitUsage;
  }

  geo::WorkerConfig config;
  if (!configPath.empty()) {
    auto loaded = geo::loadWorkerConfig(configPath, geo::ConfigCheck::kFieldsOnly);
    if (!loaded.ok()) return failConfig(loaded.status());
    config = std::move(*loaded);
  }
  for (const auto& [key, value] : shorthand) {
    if (auto s = geo::applyOverride(config, key, value); !s.ok()) return failConfig(s);
  }
  for (const auto& kv : sets) {
    const auto eq = kv.find('=');
    if (eq == std::string::npos) {
      std::cerr << "geotrain-worker: --set expects key=value, got '" << geo::printableText(kv)
                << "'\n";
      return kExitUsage;
    }
    if (auto s = geo::applyOverride(config, kv.substr(0, eq), kv.substr(eq + 1)); !s.ok()) {
      return failConfig(s);
    }
  }
  if (completionIndex) {
    if (auto s = geo::placeByCompletionIndex(config, *completionIndex); !s.ok()) {
      return failConfig(s.withContext("--completion-index"));
    }
  }
  if (auto s = geo::validateWorkerConfig(config); !s.ok()) return failConfig(s);
  if (printConfig) {
    std::cout << geo::toYaml(config);
    return kExitOk;
  }
  const Progress progress(progressFormat == "jsonl", config.worker.rank);
  gProgress = &progress;
  try {
    return runWorker(config, progress, slowdown);
  } catch (const std::exception& e) {
    return fail(geo::internalError(e.what()));
  }
}
