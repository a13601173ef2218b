#include "worker/app/run.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>
#include <set>
#include <string>
#include <thread>

#include "common/logging.h"
#include "common/sync_algorithms.h"
#include "worker/app/key_watcher.h"
#include "worker/app/memory_plan.h"
#include "worker/app/setup.h"
#include "worker/app/transport_setup.h"
#include "worker/app/worker_hook.h"
#include "worker/train/blas.h"

namespace geo::app {
namespace {

// DTS on the CPU: refuses, before anything trains, a job whose rounds in
// flight or final average cannot fit in this worker's memory
// (worker/app/memory_plan.h); the plan is logged either way.
Status checkDtsMemory(const WorkerConfig& c, train::Model& model, const TrainingData& data) {
  MemoryPlanInput in;
  in.parameters = model.parameterCount();
  // The built-in mlp's layers add their weights' gradients in place
  // (AccumulatingLinear, worker/train/model.cc): no transient gradient.
  if (c.model.builtin != "mlp") {
    for (const auto& [name, t] : model.namedParameters()) {
      in.largestTensor = std::max<int64_t>(in.largestTensor, t.numel());
    }
  }
  for (const train::TensorDataset* d : {&data.shard, &data.test}) {
    for (const torch::Tensor* t : {&d->inputs, &d->targets}) {
      if (t->defined()) in.datasetBytes += static_cast<int64_t>(t->nbytes());
    }
  }
  // Who exchanges rounds (sync::makeSynchronizer): the region leaders
  // under hierarchical sync with a region of several workers, else every
  // worker. A member of a region holds no rounds; nor does a lone worker.
  const std::set<std::string> named(c.transport.regions.begin(), c.transport.regions.end());
  const auto regions = named.empty() ? c.worker.worldSize : static_cast<int64_t>(named.size());
  const bool hierarchical = c.sync.hierarchical && regions < c.worker.worldSize;
  if (hierarchical && c.worker.localRank != 0) return {};
  in.peers = hierarchical ? regions : c.worker.worldSize;
  if (in.peers <= 1) return {};
  in.optimizer = c.training.optimizer;
  in.momentum = c.training.momentum;
  in.codec = c.sync.codec;
  in.reduceScatter = c.sync.exchange == "reducescatter";
  in.bits = static_cast<int>(c.sync.bits);
  in.period = c.sync.period;
  in.delay = c.sync.delay;
  if (c.training.evalInterval > 0) in.evaluationModels = 2 + c.training.evalBacklog;
  const MemoryPlan plan = planDtsMemory(in);
  const auto limit = readMemoryLimit();
  logger()->info(
      "memory: at least {} while training ({} round(s) in flight{}), {} for the final "
      "average; this worker may use {}",
      formatBytes(plan.trainingBytes), plan.roundsInFlight,
      plan.roundsExact ? "" : " or more under auto K or D", formatBytes(plan.endBytes),
      limit ? formatBytes(*limit) : std::string("an unknown amount"));
  return limit ? checkMemoryPlan(plan, *limit) : Status();
}

using local::EventKind;
using local::WorkerEvent;

// What a user loading the exported model needs to know of it (model.json).
struct ExportFacts {
  std::string model;
  std::vector<int64_t> inputShape;
  int64_t outputs = 0;
  std::optional<double> testAccuracy;
  std::optional<double> testLoss;
  std::string modelHash;
  int64_t step = 0;   // the step the model is at
  bool final = true;  // the job's final model; false: an export at a checkpoint
};

// The job's final model into output.path: once per region (its first
// worker; the others hold the same bytes), so that each region's volume has
// it. A failure fails the worker: the user asked for the model there. With
// output.everyCheckpoint, also this worker's model at each checkpoint
// (f.final false), which the next export replaces.
Status exportJobModel(const WorkerConfig& c, train::Model& model, const ExportFacts& f) {
  if (c.output.path.empty() || c.worker.localRank != 0) return {};
  nlohmann::ordered_json meta = {
      {"job", c.job.id},
      {"region", c.worker.region},
      {"model", f.model},
      {"inputShape", f.inputShape},
      {"outputs", f.outputs},
      {"task", c.training.loss == "mse"          ? "regression"
               : c.training.loss == "next-token" ? "next-token prediction"
                                                 : "classification"},
      {"loss", c.training.loss},
      {"dataset", c.dataset.name},
      {"inputs", train::describeInputs(c.dataset.name)},
      {"steps", c.training.steps},
      {"step", f.step},
      {"final", f.final},
      {"testAccuracy", f.testAccuracy ? nlohmann::ordered_json(*f.testAccuracy) : nullptr},
      {"testLoss", f.testLoss ? nlohmann::ordered_json(*f.testLoss) : nullptr},
      {"modelHash", f.modelHash},
  };
  auto written = train::exportModel(model, c.output.path, meta.dump(2) + "\n");
  if (!written.ok()) return written.status().withContext("exporting the model (output.path)");
  std::vector<std::string> names;
  for (const auto& p : *written) names.push_back(p.filename().string());
  if (f.final) {
    logger()->info("output: the job's model is in {} ({})", c.output.path, fmt::join(names, ", "));
  } else {
    logger()->info("output: the model at step {} is in {} (output.everyCheckpoint)", f.step,
                   c.output.path);
  }
  return {};
}

// "test accuracy 86.21%" (classification), "test loss 0.0123" (mse) or
// "validation loss 1.52 (2.19 bits per token)" (next-token).
std::string describeEvaluation(std::optional<double> accuracy, double loss,
                               const std::string& lossName) {
  if (accuracy) return fmt::format("test accuracy {:.2f}%", *accuracy * 100);
  if (lossName == "next-token") {
    return fmt::format("validation loss {:.4f} ({:.3f} bits per token)", loss,
                       loss / std::log(2.0));
  }
  return fmt::format("test loss {:.5g}", loss);
}

// This process's peak resident memory so far, in bytes (Linux reports
// ru_maxrss in KiB).
uint64_t maxRssBytes() {
  rusage u{};
  if (::getrusage(RUSAGE_SELF, &u) != 0) return 0;
  return static_cast<uint64_t>(u.ru_maxrss) * 1024;
}

// A step's log line for --progress-format text.
// `delayed`: the algorithm's rounds apply D steps after they leave
// (SyncAlgorithm::delayedRounds), and the line shows D.
void logStep(const train::StepStats& st, const sync::Synchronizer* sync, bool delayed) {
  std::string eval;
  if (st.evalAccuracy) {
    eval = fmt::format(" eval accuracy {:.2f}%", *st.evalAccuracy * 100);
  } else if (st.evalLoss) {
    eval = fmt::format(" eval loss {:.5g}", *st.evalLoss);
  }
  if (!eval.empty() && st.evalStep && *st.evalStep != st.step) {
    eval += fmt::format(" (step {})", *st.evalStep);
  }
  std::string syncText;
  if (sync != nullptr) {
    const auto ss = sync->stats();
    syncText = fmt::format(" staleness {:.1f} wait {:.1f}s", ss.stalenessMean(), ss.waitSeconds);
    if (delayed) syncText += fmt::format(" D={}", ss.delay);
  }
  logger()->info("step {:>6} loss {:.4f} lr {:.4g} {:>8.0f} samples/s{}{}", st.step, st.loss, st.lr,
                 st.samplesPerSecond, syncText, eval);
}

}  // namespace

int runWorker(const WorkerConfig& c, const Progress& progress, const Emulation& emulation,
              Connection connection) {
  if (c.training.threads > 0) {
    torch::set_num_threads(static_cast<int>(c.training.threads));
    train::setBlasThreads(static_cast<int>(c.training.threads));
  }
  auto device = trainingDevice(c);
  if (!device.ok()) return reportFailure(&progress, device.status());
  if (device->is_cpu()) {
    const auto blas = train::blasInfo();
    logger()->info("BLAS: {}",
                   blas.openblas
                       ? fmt::format("{} ({}, {} thread{} per call)", *blas.openblas, blas.parallel,
                                     blas.threads, blas.threads == 1 ? "" : "s")
                       : fmt::format("{} (not OpenBLAS)", blas.library));
    if (const auto warning = train::blasWarning(blas)) logger()->warn("{}", *warning);
  }

  auto topology = sync::Topology::make(rankRegions(c), static_cast<uint32_t>(c.worker.rank));
  if (!topology.ok()) return reportFailure(&progress, topology.status());
  // Opened by the caller before LibTorch was loaded (connect.h).
  std::unique_ptr<transport::Transport> transport = std::move(connection.transport);
  std::unique_ptr<KeyWatcher> keyWatcher = std::move(connection.keyWatcher);  // goes first
  std::unique_ptr<sync::Synchronizer> sync;
  if (c.sync.algorithm != "none") {
    auto s = sync::makeSynchronizer(syncOptions(c), *topology, transport.get());
    if (!s.ok()) return reportFailure(&progress, s.status());
    sync = std::move(*s);
  }

  auto data = loadTrainingData(c);
  if (!data.ok()) return reportFailure(&progress, data.status());
  const int64_t shardSamples = data->shard.size();
  const std::vector<int64_t> inputShape = data->inputShape;
  const int64_t numClasses = data->numClasses;
  torch::manual_seed(c.job.seed);  // identical initial weights on every worker
  const train::ModelSpec modelSpec{c.model.builtin, c.model.torchscript, c.model.width,
                                   c.model.layers,  c.model.heads,       c.model.context};
  auto model = train::makeModel(modelSpec, data->inputShape, data->numClasses);
  if (!model.ok()) return reportFailure(&progress, model.status());
  const std::string describe = (*model)->describe();
  const int64_t params = (*model)->parameterCount();
  const SyncAlgorithm* algorithm = findSyncAlgorithm(c.sync.algorithm);  // null: none
  const bool delayedRounds = algorithm != nullptr && algorithm->delayedRounds;
  if (delayedRounds && device->is_cpu()) {
    if (const Status fits = checkDtsMemory(c, **model, *data); !fits.ok()) {
      return reportFailure(&progress, fits);
    }
  }
  auto options = trainerOptions(c, *device);
  // An evaluation over the test set costs as much as many steps, and a
  // worker that evaluates falls behind its peers: only rank 0 evaluates
  // every training.evalInterval steps; every worker evaluates its final
  // model (the same on all once the synchronizer has averaged them).
  if (c.worker.rank != 0 && c.sync.algorithm != "none") options.evalInterval = 0;
  const auto metrics = startMetrics(c, *topology);
  WorkerHook hook(metrics.get(), sync.get(), transport.get(),
                  static_cast<uint64_t>(c.training.batchSize), progress);
  if (transport != nullptr) {
    if (auto limits = readTcpBufferLimits(); limits.ok()) {
      if (auto w = initialWindowWarning(*limits, c.transport.tcpInitialWindow)) {
        logger()->warn("{}", *w);
      }
      hook.reportTcpCeiling(*limits, c.transport.connections,
                            [&t = *topology](uint32_t r) { return t.describe(r); });
    } else {
      logger()->debug("tcp: {}", limits.status().message());
    }
  }
  auto trainer =
      train::Trainer::create(std::move(*model), std::move(data->shard), data->test, options, &hook);
  if (!trainer.ok()) return reportFailure(&progress, trainer.status());
  (*trainer)->setEmulation({emulation.slowdown, emulation.minStepTime});
  if (options.evalInterval > 0) {
    // Periodic evaluations run on a snapshot in the background, on a second
    // instance of the model, so that they never hold up a step (nor, through
    // the synchronizer, every other worker).
    auto evalModel = train::makeModel(modelSpec, data->inputShape, data->numClasses);
    if (!evalModel.ok()) return reportFailure(&progress, evalModel.status());
    if (const Status s = (*trainer)->evaluateInBackground(std::move(*evalModel)); !s.ok()) {
      return reportFailure(&progress, s);
    }
  }
  auto resumed = (*trainer)->resume();
  if (!resumed.ok()) return reportFailure(&progress, resumed.status());
  if (c.output.everyCheckpoint && !c.output.path.empty() && c.worker.localRank == 0) {
    train::Trainer* t = trainer->get();
    (*trainer)->setAfterCheckpoint([&c, t, describe, inputShape, numClasses](int64_t step) {
      const std::string hash = modelHash(train::wholeModel(t->flat()));
      ExportFacts facts{describe,     inputShape, numClasses, std::nullopt,
                        std::nullopt, hash,       step,       false};
      if (Status s = exportJobModel(c, t->model(), facts); !s.ok()) {
        logger()->warn("{}; training goes on (the final export must succeed)", s.message());
      }
    });
  }

  // Whose data the shard is cut from: one copy for the job, or this
  // region's own (dataset.sharding).
  const std::string of = c.dataset.shardIndex || c.dataset.shardCount ? "as configured"
                         : c.dataset.sharding == "region"
                             ? fmt::format("of region {}'s copy", c.worker.region)
                             : std::string("of the job's data");
  logger()->info(
      "rank {}/{} ({}): {} ({} parameters) on {}, {} shard {}/{} {} ({} samples in {}), {} steps "
      "of {}{}",
      c.worker.rank, c.worker.worldSize, c.worker.region, describe, params, device->str(),
      c.dataset.name, data->shardIndex, data->shardCount, of, shardSamples,
      c.dataset.name == "synthetic" ? std::string("memory, generated")
      : c.dataset.path.empty()      ? train::defaultDatasetPath(c.dataset.name).string()
                                    : c.dataset.path,
      c.training.steps, c.training.batchSize,
      *resumed > 0 ? ", resumed at step " + std::to_string(*resumed) : std::string());
  if (sync) logger()->info("sync: {}", sync->describe());
  WorkerEvent start;
  start.kind = EventKind::kStart;
  start.region = c.worker.region;
  start.localRank = c.worker.localRank;
  start.worldSize = c.worker.worldSize;
  start.model = describe;
  start.parameters = params;
  start.shardSamples = shardSamples;
  start.steps = c.training.steps;
  start.algorithm = c.sync.algorithm;
  start.resumedAt = *resumed;
  progress.emit(std::move(start));

  std::optional<double> finalAccuracy, finalEvalLoss;
  double finalLoss = 0;
  const Status s = (*trainer)->run([&](const train::StepStats& st) {
    if (st.step == c.training.steps) {
      finalAccuracy = st.evalAccuracy;
      finalEvalLoss = st.evalLoss;
      finalLoss = st.loss;
    }
    hook.setLoss(st.loss);
    if (metrics && st.evalAccuracy) metrics->setEvalAccuracy(*st.evalAccuracy);
    if (metrics && st.evalLoss) metrics->setEvalLoss(*st.evalLoss);
    if (metrics) metrics->setCheckpointFailures(st.checkpointFailures);
    if (!progress.jsonl()) return logStep(st, sync.get(), delayedRounds);
    WorkerEvent e;
    e.kind = EventKind::kProgress;
    e.step = st.step;
    if (st.endedAt != std::chrono::steady_clock::time_point{}) {
      e.stepEndedAt = progress.secondsAt(st.endedAt);
    }
    e.loss = st.loss;
    e.lr = st.lr;
    e.samplesPerSecond = st.samplesPerSecond;
    if (st.evalAccuracy || st.evalLoss) {
      e.evalAccuracy = st.evalAccuracy;
      e.evalLoss = st.evalLoss;
      e.evalStep = st.evalStep.value_or(st.step);
      e.evalAgeSeconds = st.evalAgeSeconds;
    }
    e.stepSecondsMax = hook.longestStep();
    e.maxRssBytes = maxRssBytes();
    addTotals(e, readTotals(sync.get(), transport.get()), *topology);
    const WorkerHook::InStep inStep = hook.inStep();
    addTiming(e, (*trainer)->timing(), inStep.codecSeconds, inStep.encodeSeconds,
              inStep.waitSeconds);
    progress.emit(std::move(e));
  });
  if (!s.ok()) return reportFailure(&progress, s);
  WorkerEvent done;
  done.kind = EventKind::kDone;
  done.step = c.training.steps;
  if ((*trainer)->arrivedAfterEnd()) {
    // The job ended without us. With its final model (a peer that finished
    // sent it) this worker ends as the others did: evaluated, checkpointed,
    // exit 0, so that a supervisor does not start it again and again.
    // Without it, it fails: exiting 0 with a model no other worker holds
    // would pass for a finished worker.
    if (!(*trainer)->holdsFinalModel()) {
      return reportFailure(
          &progress,
          failedPrecondition(fmt::format(
              "the job finished before this worker could rejoin it, and no peer sent its final "
              "model (all {} steps were done without it)",
              c.training.steps)));
    }
    const train::Evaluation final = (*trainer)->evaluate();
    if (!c.checkpoint.dir.empty()) {
      if (Status saved = (*trainer)->saveCheckpoint(); !saved.ok()) {
        logger()->warn("the job's final model was not checkpointed: {}", saved.message());
      }
    }
    logger()->info(
        "the job finished before this worker could rejoin it; it holds the job's final model "
        "({})",
        describeEvaluation(final.accuracy, final.loss, c.training.loss));
    done.arrivedAfterEnd = true;
    done.testAccuracy = final.accuracy;
    done.testLoss = final.loss;
    done.modelHash = modelHash(train::wholeModel((*trainer)->flat()));
    if (Status exported = exportJobModel(c, (*trainer)->model(),
                                         {describe, inputShape, numClasses, final.accuracy,
                                          final.loss, done.modelHash, c.training.steps});
        !exported.ok()) {
      return reportFailure(&progress, exported);
    }
    progress.emit(std::move(done));
    return kExitOk;
  }
  done.loss = finalLoss;
  done.stepSecondsMax = hook.longestStep();
  done.maxRssBytes = maxRssBytes();
  done.modelHash = modelHash(train::wholeModel((*trainer)->flat()));
  done.joinedAt = (*trainer)->joinedAt();
  done.testAccuracy = finalAccuracy;
  done.testLoss = finalEvalLoss;
  if (Status exported = exportJobModel(c, (*trainer)->model(),
                                       {describe, inputShape, numClasses, finalAccuracy,
                                        finalEvalLoss, done.modelHash, c.training.steps});
      !exported.ok()) {
    return reportFailure(&progress, exported);
  }
  // The last metrics and the done event come from one reading, so a scraper
  // that finds the worker lingering sees exactly the totals of the event.
  const Totals totals = readTotals(sync.get(), transport.get());
  hook.publish(totals);
  addTotals(done, totals, *topology);
  const WorkerHook::InStep inStep = hook.inStep();
  addTiming(done, (*trainer)->timing(), inStep.codecSeconds, inStep.encodeSeconds,
            inStep.waitSeconds);
  progress.emit(std::move(done));
  if (finalAccuracy || finalEvalLoss) {
    logger()->info("done: {} steps, {}", c.training.steps,
                   describeEvaluation(finalAccuracy, finalEvalLoss.value_or(0), c.training.loss));
  }
  if (metrics && c.metrics.lingerSeconds > 0) {
    // A worker that exits at once takes its final values with it before
    // Prometheus' next scrape: keep serving them for one scrape interval.
    logger()->info("metrics: serving the final values for {}s (metrics.lingerSeconds)",
                   c.metrics.lingerSeconds);
    std::this_thread::sleep_for(std::chrono::duration<double>(c.metrics.lingerSeconds));
  }
  return kExitOk;
}

}  // namespace geo::app
