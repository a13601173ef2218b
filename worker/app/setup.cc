#include "worker/app/setup.h"

#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "common/logging.h"

namespace geo::app {

sync::SyncOptions syncOptions(const WorkerConfig& c) {
  sync::SyncOptions o;
  o.algorithm = c.sync.algorithm;
  o.period = c.sync.period.value_or(kAutoPeriodStart);
  o.autoPeriod = !c.sync.period.has_value();
  o.delay = c.sync.delay;
  o.exchange = c.sync.exchange;
  o.swarmH = c.sync.swarmH;
  o.codec.name = c.sync.codec;
  o.codec.bits = static_cast<int>(c.sync.bits);
  o.codec.bucket = c.sync.bucket;
  o.codec.threads = static_cast<int>(c.training.threads);
  o.lanCodec = c.sync.lanCodec;
  o.errorFeedback = c.sync.errorFeedback;
  // Adam's step does not depend on the gradient's scale: the rule is for
  // SGD, where scaling the gradient scales the step.
  o.scaleLrWithDelay = c.sync.scaleLrWithDelay && c.training.optimizer == "sgd";
  o.hierarchical = c.sync.hierarchical;
  o.timeout = std::chrono::milliseconds(static_cast<int64_t>(c.sync.timeoutSeconds * 1000));
  o.peerTimeout = std::chrono::milliseconds(static_cast<int64_t>(c.sync.peerTimeoutSeconds * 1000));
  o.seed = c.job.seed;
  return o;
}

train::TrainerOptions trainerOptions(const WorkerConfig& c, torch::Device device) {
  train::TrainerOptions o;
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
  o.evalBacklog = t.evalBacklog;
  o.logInterval = t.logInterval > 0 ? t.logInterval : t.steps;
  o.seed = c.job.seed + static_cast<uint64_t>(c.worker.rank);  // each worker its own order
  o.device = device;
  o.checkpointDir = c.checkpoint.dir;
  o.checkpointInterval = c.checkpoint.interval;
  o.keepCheckpoints = static_cast<int>(c.checkpoint.keep);
  o.resume = c.checkpoint.resume;
  return o;
}

StatusOr<torch::Device> trainingDevice(const WorkerConfig& c) {
  if (c.training.device == "cuda" || (c.training.device == "auto" && torch::cuda::is_available())) {
    if (!torch::cuda::is_available()) {
      return failedPrecondition(
          "training.device: cuda was requested but this LibTorch has no usable CUDA device");
    }
    return torch::Device(torch::kCUDA);
  }
  return torch::Device(torch::kCPU);
}

StatusOr<TrainingData> loadTrainingData(const WorkerConfig& c) {
  train::DatasetSpec spec;
  spec.name = c.dataset.name;
  spec.path = c.dataset.path;
  spec.syntheticSamples = c.dataset.syntheticSamples;
  spec.seed = c.job.seed;
  spec.classes = c.model.classes;
  spec.tokenBytes = c.dataset.tokenBytes;
  spec.context = c.model.context;
  auto trainSplit = train::loadDataset(spec, train::Split::kTrain);
  if (!trainSplit.ok()) return trainSplit.status();
  auto test = train::loadDataset(spec, train::Split::kTest);
  if (!test.ok()) return test.status();
  GEO_RETURN_IF_ERROR(train::checkSplitsAgree(*trainSplit, *test, spec.name));
  // The loss must fit the targets: labels for cross-entropy, floats for mse.
  if (trainSplit->regression() != (c.training.loss == "mse")) {
    return invalidArgument(fmt::format(
        "training.loss: {} does not fit dataset {}, whose targets are {} (allowed: {})",
        c.training.loss, spec.name, trainSplit->regression() ? "floats" : "integer labels",
        trainSplit->regression() ? "mse" : "cross-entropy"));
  }
  TrainingData d;
  d.shardIndex = effectiveShardIndex(c);
  d.shardCount = effectiveShardCount(c);
  d.shard = train::shard(*trainSplit, d.shardIndex, d.shardCount);
  d.test = std::move(*test);
  d.inputShape = trainSplit->isTokenStream() ? std::vector<int64_t>{trainSplit->context}
                                             : trainSplit->inputs.sizes().slice(1).vec();
  d.numClasses = trainSplit->numClasses;
  return d;  // the shard owns its samples: the rest of the split goes here
}

std::unique_ptr<metrics::WorkerMetrics> startMetrics(const WorkerConfig& c,
                                                     const sync::Topology& topology) {
  if (!c.metrics.enabled) return nullptr;
  std::vector<metrics::PeerInfo> peers;
  for (uint32_t r = 0; r < topology.worldSize(); ++r) {
    if (r == topology.rank()) continue;
    peers.push_back({r, topology.regionOf(r), !topology.sameRegion(r, topology.rank())});
  }
  auto m = metrics::WorkerMetrics::start(
      c.metrics.listen, {c.job.id, c.worker.region, c.worker.rank}, std::move(peers));
  if (!m.ok()) {
    logger()->warn(
        "metrics: {}; training without metrics (set metrics.listen, or "
        "metrics.enabled: false)",
        m.status().message());
    return nullptr;
  }
  logger()->info("metrics: http://{}/metrics (port {})", c.metrics.listen, (*m)->port());
  return std::move(*m);
}

std::string modelHash(const torch::Tensor& values) {
  const torch::Tensor v = values.contiguous().to(torch::kCPU);
  const auto* bytes = static_cast<const unsigned char*>(v.data_ptr());
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < static_cast<size_t>(v.numel()) * v.element_size(); ++i) {
    h = (h ^ bytes[i]) * 0x100000001b3ull;
  }
  return fmt::format("{:016x}", h);
}

}  // namespace geo::app
