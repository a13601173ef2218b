// `geotrain-worker`: one training worker. Reads worker.yaml (every field has
// a default; see docs/worker-config.md), applies command-line overrides,
// loads its shard of the data set, builds the model and trains, printing one
// progress line every training.logInterval steps. Exit code 0 on success, 1 on
// a failure (with the reason on stderr), 2 on a usage error.

#include <torch/torch.h>
#include <CLI/CLI.hpp>

#include <iostream>
#include <string>
#include <vector>

#include "common/logging.h"
#include "common/worker_config.h"
#include "worker/train/trainer.h"

namespace {

constexpr int kExitOk = 0;
constexpr int kExitFailure = 1;
constexpr int kExitUsage = 2;

int fail(const geo::Status& s) {
  std::cerr << "geotrain-worker: " << s.message() << "\n";
  return kExitFailure;
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

int runWorker(const geo::WorkerConfig& c) {
  if (auto s = geo::initLogging(c.log.level); !s.ok()) return fail(s);
  if (c.sync.algorithm != "none") {
    return fail(geo::invalidArgument(
        "sync.algorithm '" + c.sync.algorithm +
        "': this build of geotrain-worker trains a single worker only (sync.algorithm: none); "
        "the synchronizers are not part of it yet"));
  }
  if (c.training.threads > 0) torch::set_num_threads(static_cast<int>(c.training.threads));
  torch::Device device = torch::kCPU;
  if (c.training.device == "cuda" || (c.training.device == "auto" && torch::cuda::is_available())) {
    if (!torch::cuda::is_available()) {
      return fail(geo::failedPrecondition(
          "training.device: cuda was requested but this LibTorch has no usable CUDA device"));
    }
    device = torch::kCUDA;
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
  auto trainer = geo::train::Trainer::create(std::move(*model), std::move(shard), *test,
                                             trainerOptions(c, device));
  if (!trainer.ok()) return fail(trainer.status());
  auto resumed = (*trainer)->resume();
  if (!resumed.ok()) return fail(resumed.status());

  geo::logger()->info(
      "rank {}/{} ({}): {} ({} parameters) on {}, {} shard {}/{} ({} samples), {} steps of {}{}",
      c.worker.rank, c.worker.worldSize, c.worker.region, describe, params, device.str(),
      c.dataset.name, shardIndex, shardCount, shardSamples, c.training.steps, c.training.batchSize,
      *resumed > 0 ? ", resumed at step " + std::to_string(*resumed) : std::string());
  const geo::Status s = (*trainer)->run([&](const geo::train::StepStats& st) {
    if (st.evalAccuracy) {
      geo::logger()->info(
          "step {:>6} loss {:.4f} lr {:.4g} {:>8.0f} samples/s eval accuracy {:.2f}%", st.step,
          st.loss, st.lr, st.samplesPerSecond, *st.evalAccuracy * 100);
    } else {
      geo::logger()->info("step {:>6} loss {:.4f} lr {:.4g} {:>8.0f} samples/s", st.step, st.loss,
                          st.lr, st.samplesPerSecond);
    }
  });
  if (!s.ok()) return fail(s);
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
  addShort("--log-level", "log.level", "trace, debug, info, warn, error, critical or off");
  app.add_flag("--print-config", printConfig, "Print the effective configuration as YAML and exit");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? kExitOk : kExitUsage;
  }

  geo::WorkerConfig config;
  if (!configPath.empty()) {
    auto loaded = geo::loadWorkerConfig(configPath, geo::ConfigCheck::kFieldsOnly);
    if (!loaded.ok()) return fail(loaded.status());
    config = std::move(*loaded);
  }
  for (const auto& [key, value] : shorthand) {
    if (auto s = geo::applyOverride(config, key, value); !s.ok()) return fail(s);
  }
  for (const auto& kv : sets) {
    const auto eq = kv.find('=');
    if (eq == std::string::npos) {
      std::cerr << "geotrain-worker: --set expects key=value, got '" << kv << "'\n";
      return kExitUsage;
    }
    if (auto s = geo::applyOverride(config, kv.substr(0, eq), kv.substr(eq + 1)); !s.ok()) {
      return fail(s);
    }
  }
  if (auto s = geo::validateWorkerConfig(config); !s.ok()) return fail(s);
  if (printConfig) {
    std::cout << geo::toYaml(config);
    return kExitOk;
  }
  try {
    return runWorker(config);
  } catch (const std::exception& e) {
    return fail(geo::internalError(e.what()));
  }
}
