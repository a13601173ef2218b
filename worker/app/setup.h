#pragma once
// What geotrain-worker builds from its configuration besides the transport
// (transport_setup.h): the synchronizer's and the trainer's options, the
// training device, this worker's shard of the data set, the metrics endpoint,
// and the refusal of peers whose sync settings differ. Each maps worker.yaml
// keys onto the typed options of a lower layer; the schema has checked every
// key on its own.

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/exit_codes.h"
#include "common/status.h"
#include "common/worker_config.h"
#include "worker/app/progress.h"
#include "worker/metrics/worker_metrics.h"
#include "worker/sync/synchronizer.h"
#include "worker/train/dataset.h"
#include "worker/train/trainer.h"

namespace geo::app {

// sync.* (and training.threads for the codec, job.seed) as SyncOptions.
sync::SyncOptions syncOptions(const WorkerConfig& config);

// training.* and checkpoint.* as TrainerOptions; the seed is job.seed plus
// the rank (each worker its own batch order). logInterval 0 means one report
// at the end.
train::TrainerOptions trainerOptions(const WorkerConfig& config, torch::Device device);

// training.device: cpu, cuda, or auto (cuda when this LibTorch has a usable
// device). FailedPrecondition for cuda without one.
StatusOr<torch::Device> trainingDevice(const WorkerConfig& config);

// This worker's shard of the training split and the whole test split.
struct TrainingData {
  train::TensorDataset shard;
  train::TensorDataset test;
  int64_t shardIndex = 0;
  int64_t shardCount = 1;
  std::vector<int64_t> inputShape;  // one sample's: C, H, W for images
  int64_t numClasses = 0;
};
// The rest of the training split is freed before returning.
StatusOr<TrainingData> loadTrainingData(const WorkerConfig& config);

// Starts the /metrics endpoint when metrics.enabled (null otherwise). A port
// that cannot be bound is logged and null is returned: a busy port should not
// cost a training run.
std::unique_ptr<metrics::WorkerMetrics> startMetrics(const WorkerConfig& config,
                                                     const sync::Topology& topology);

// 64-bit FNV-1a of the values' bytes, 16 hex digits: workers that agree on
// the final model print the same. Given train::wholeModel(), it covers batch
// norm's running statistics too.
std::string modelHash(const torch::Tensor& values);

}  // namespace geo::app
