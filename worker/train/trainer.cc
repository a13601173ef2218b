#include "worker/train/trainer.h"

#include <ATen/CPUGeneratorImpl.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <regex>
#include <sstream>
#include <thread>

#include "common/logging.h"

namespace geo::train {

namespace fs = std::filesystem;

Status validateTrainerOptions(const TrainerOptions& o) {
  if (o.steps <= 0)
    return invalidArgument(fmt::format("training.steps must be > 0, got {}", o.steps));
  if (o.batchSize <= 0) {
    return invalidArgument(fmt::format("training.batchSize must be > 0, got {}", o.batchSize));
  }
  if (o.optimizer != "sgd" && o.optimizer != "adam") {
    return invalidArgument(
        fmt::format("training.optimizer: '{}' is not allowed (allowed: sgd, adam)", o.optimizer));
  }
  if (!(o.lr > 0)) return invalidArgument(fmt::format("training.lr must be > 0, got {}", o.lr));
  if (!(o.momentum >= 0 && o.momentum < 1)) {
    return invalidArgument(fmt::format("training.momentum must be in [0, 1), got {}", o.momentum));
  }
  if (o.schedule != "constant" && o.schedule != "cosine" && o.schedule != "step") {
    return invalidArgument(fmt::format(
        "training.schedule: '{}' is not allowed (allowed: constant, cosine, step)", o.schedule));
  }
  if (o.weightDecay < 0 || o.gradClip < 0 || o.warmupSteps < 0 || o.stepSize <= 0 ||
      o.evalInterval < 0 || o.logInterval <= 0) {
    return invalidArgument(
        "training: weightDecay, gradClip, warmupSteps and evalInterval must be >= 0, stepSize and "
        "logInterval > 0");
  }
  if (!o.checkpointDir.empty() && (o.checkpointInterval <= 0 || o.keepCheckpoints < 1)) {
    return invalidArgument("checkpoint: interval must be > 0 and keep >= 1");
  }
  return {};
}

double learningRateAt(const TrainerOptions& o, int64_t step) {
  if (step < o.warmupSteps) {
    return o.lr * static_cast<double>(step + 1) / static_cast<double>(o.warmupSteps);
  }
  const int64_t s = step - o.warmupSteps;
  if (o.schedule == "cosine") {
    const double span = static_cast<double>(std::max<int64_t>(1, o.steps - o.warmupSteps));
    return o.lr * 0.5 * (1.0 + std::cos(M_PI * std::min(1.0, static_cast<double>(s) / span)));
  }
  if (o.schedule == "step")
    return o.lr * std::pow(o.stepGamma, static_cast<double>(s / o.stepSize));
  return o.lr;
}

namespace {

FlatParameters flattenParameters(Model& model, torch::Device device) {
  torch::NoGradGuard noGrad;
  FlatParameters flat;
  int64_t total = 0;
  for (auto& p : model.parameters()) total += p.numel();
  const auto opts = torch::TensorOptions().dtype(torch::kFloat32).device(device);
  flat.values = torch::empty({total}, opts);
  flat.grads = torch::zeros({total}, opts);
  int64_t offset = 0;
  for (auto& p : model.parameters()) {
    const int64_t n = p.numel();
    auto value = flat.values.narrow(0, offset, n).view(p.sizes());
    value.copy_(p);
    p.set_data(value);  // the parameter now lives in the flat buffer
    p.mutable_grad() = flat.grads.narrow(0, offset, n).view(p.sizes());
    flat.params.push_back(p);
    offset += n;
  }
  return flat;
}

std::unique_ptr<torch::optim::Optimizer> makeOptimizer(const TrainerOptions& o,
                                                       const std::vector<torch::Tensor>& params) {
  if (o.optimizer == "adam") {
    return std::make_unique<torch::optim::Adam>(
        params, torch::optim::AdamOptions(o.lr).weight_decay(o.weightDecay));
  }
  return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(o.lr)
                                                         .momentum(o.momentum)
                                                         .nesterov(o.nesterov)
                                                         .weight_decay(o.weightDecay));
}

// fsync a file or directory by path; false on failure.
bool syncPath(const fs::path& path, bool directory) {
  const int fd = ::open(path.c_str(), (directory ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC);
  if (fd < 0) return false;
  const bool ok = ::fsync(fd) == 0;
  ::close(fd);
  return ok;
}

// Checkpoints in `dir`, newest first.
std::vector<std::pair<int64_t, fs::path>> listCheckpoints(const fs::path& dir) {
  std::vector<std::pair<int64_t, fs::path>> out;
  std::error_code ec;
  static const std::regex kName(R"(ckpt-(\d+)\.pt)");
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    std::smatch m;
    const std::string name = entry.path().filename().string();
    if (std::regex_match(name, m, kName)) out.emplace_back(std::stoll(m[1]), entry.path());
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  return out;
}

}  // namespace

Trainer::Trainer(std::unique_ptr<Model> model, TensorDataset train, TensorDataset test,
                 TrainerOptions options, StepHook* hook)
    : model_(std::move(model)),
      train_(std::move(train)),
      test_(std::move(test)),
      options_(std::move(options)),
      hook_(hook),
      sampler_(train_.size(), options_.batchSize, options_.seed) {}

StatusOr<std::unique_ptr<Trainer>> Trainer::create(std::unique_ptr<Model> model,
                                                   TensorDataset train, TensorDataset test,
                                                   TrainerOptions options, StepHook* hook) {
  GEO_RETURN_IF_ERROR(validateTrainerOptions(options));
  if (train.size() < options.batchSize) {
    return invalidArgument(fmt::format(
        "training.batchSize {} is larger than this worker's share of the data set ({} samples)",
        options.batchSize, train.size()));
  }
  try {
    model->to(options.device);
    std::unique_ptr<Trainer> t(
        new Trainer(std::move(model), std::move(train), std::move(test), options, hook));
    t->flat_ = flattenParameters(*t->model_, options.device);
    t->optimizer_ = makeOptimizer(t->options_, t->flat_.params);
    torch::optim::Optimizer* optimizer = t->optimizer_.get();
    t->flat_.saveOptimizer = [optimizer] {
      torch::serialize::OutputArchive archive;
      optimizer->save(archive);
      std::ostringstream out;
      archive.save_to(out);
      return out.str();
    };
    t->flat_.loadOptimizer = [optimizer](const std::string& bytes) -> Status {
      try {
        std::istringstream in(bytes);
        torch::serialize::InputArchive archive;
        archive.load_from(in);
        optimizer->load(archive);
      } catch (const c10::Error& e) {
        return dataLoss(
            fmt::format("the optimizer state cannot be read: {}", e.what_without_backtrace()));
      }
      return {};
    };
    return t;
  } catch (const c10::Error& e) {
    return internalError(fmt::format("setting up training failed: {}", e.what_without_backtrace()));
  }
}

StatusOr<StepStats> Trainer::step() {
  StepStats stats;
  const auto started = std::chrono::steady_clock::now();
  try {
    const auto indices = sampler_.next();
    const auto x = train_.inputs.index_select(0, indices).to(options_.device);
    const auto y = train_.targets.index_select(0, indices).to(options_.device);
    model_->setTraining(true);
    flat_.grads.zero_();
    const auto loss = torch::nn::functional::cross_entropy(model_->forward(x), y);
    const double lossValue = loss.item<double>();
    if (!std::isfinite(lossValue)) {
      // A diverged worker stops and says so: its state must not reach its
      // peers (the synchronizers check what they send as well).
      return failedPrecondition(
          fmt::format("training diverged at step {}: the loss is {} (lower training.lr, or set "
                      "training.gradClip)",
                      step_ + 1, lossValue));
    }
    loss.backward();
    if (hook_ != nullptr) GEO_RETURN_IF_ERROR(hook_->afterBackward(step_, flat_));
    if (options_.gradClip > 0) torch::nn::utils::clip_grad_norm_(flat_.params, options_.gradClip);
    const double lr = learningRateAt(options_, step_);
    for (auto& group : optimizer_->param_groups()) group.options().set_lr(lr);
    optimizer_->step();
    ++step_;
    if (hook_ != nullptr) GEO_RETURN_IF_ERROR(hook_->afterStep(step_ - 1, flat_));
    stats.step = step_;
    stats.loss = lossValue;
    stats.lr = lr;
    if (options_.slowdown > 1) {
      std::this_thread::sleep_for((std::chrono::steady_clock::now() - started) *
                                  (options_.slowdown - 1));
    }
  } catch (const c10::Error& e) {
    return internalError(
        fmt::format("training step {} failed: {}", step_ + 1, e.what_without_backtrace()));
  }
  return stats;
}

double Trainer::evaluate() {
  torch::NoGradGuard noGrad;
  model_->setTraining(false);
  int64_t correct = 0;
  const int64_t n = test_.size();
  for (int64_t start = 0; start < n; start += 1000) {
    const int64_t len = std::min<int64_t>(1000, n - start);
    const auto x = test_.inputs.narrow(0, start, len).to(options_.device);
    const auto y = test_.targets.narrow(0, start, len).to(options_.device);
    correct += model_->forward(x).argmax(1).eq(y).sum().item<int64_t>();
  }
  model_->setTraining(true);
  return n == 0 ? 0.0 : static_cast<double>(correct) / static_cast<double>(n);
}

Status Trainer::run(const std::function<void(const StepStats&)>& progress) {
  if (hook_ != nullptr && step_ < options_.steps) {
    StatusOr<JoinResult> joined = internalError("join did not run");
    try {
      joined = hook_->join(step_, flat_);
    } catch (const c10::Error& e) {
      return internalError(fmt::format("joining the job failed: {}", e.what_without_backtrace()));
    }
    if (!joined.ok()) return joined.status();
    if (joined->jobFinished || joined->step >= options_.steps) {
      arrivedAfterEnd_ = true;
      return {};
    }
    if (joined->step != step_) {
      // The LR schedule, checkpoint names and the end follow the job's step;
      // the sampler keeps its own order (any batch order is as good).
      joinedAt_ = joined->step;
      step_ = std::min(joined->step, options_.steps);
    }
  }
  auto last = std::chrono::steady_clock::now();
  int64_t lastStep = step_;
  while (step_ < options_.steps) {
    auto stats = step();
    if (!stats.ok()) return stats.status();
    if (step_ == options_.steps && hook_ != nullptr) {
      try {
        GEO_RETURN_IF_ERROR(hook_->finish(step_, flat_));
      } catch (const c10::Error& e) {
        return internalError(
            fmt::format("finishing training failed: {}", e.what_without_backtrace()));
      }
    }
    const bool evalNow = step_ == options_.steps ||
                         (options_.evalInterval > 0 && step_ % options_.evalInterval == 0);
    if (step_ % options_.logInterval == 0 || evalNow) {
      // Training throughput only: measured before the evaluation runs.
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - last).count();
      stats->samplesPerSecond =
          seconds > 0 ? static_cast<double>((step_ - lastStep) * options_.batchSize) / seconds : 0;
      if (evalNow) stats->evalAccuracy = evaluate();
      last = std::chrono::steady_clock::now();
      lastStep = step_;
      if (progress) progress(*stats);
    }
    if (!options_.checkpointDir.empty() &&
        (step_ % options_.checkpointInterval == 0 || step_ == options_.steps)) {
      GEO_RETURN_IF_ERROR(saveCheckpoint());
    }
  }
  return {};
}

Status Trainer::saveCheckpoint() {
  const fs::path dir = options_.checkpointDir;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    return unavailable(fmt::format("checkpoint: cannot create {}: {}", dir.string(), ec.message()));
  }
  const fs::path final = dir / fmt::format("ckpt-{:010d}.pt", step_);
  const fs::path tmp = dir / fmt::format(".ckpt-{:010d}.pt.tmp", step_);
  try {
    torch::serialize::OutputArchive archive;
    archive.write("step", torch::tensor(step_));
    const auto sampler = sampler_.state();
    archive.write("sampler", torch::tensor({sampler.epoch, sampler.position}));
    archive.write("rng", at::detail::getDefaultCPUGenerator().get_state());
    torch::serialize::OutputArchive modelArchive;
    model_->save(modelArchive);
    archive.write("model", modelArchive);
    torch::serialize::OutputArchive optimizerArchive;
    optimizer_->save(optimizerArchive);
    archive.write("optimizer", optimizerArchive);
    torch::serialize::OutputArchive syncArchive;
    if (hook_ != nullptr) hook_->saveState(syncArchive);
    archive.write("sync", syncArchive);
    archive.save_to(tmp.string());
  } catch (const std::exception& e) {
    fs::remove(tmp, ec);
    return unavailable(fmt::format("checkpoint: writing {} failed: {}", tmp.string(), e.what()));
  }
  if (!syncPath(tmp, false)) {
    fs::remove(tmp, ec);
    return unavailable(fmt::format("checkpoint: fsync of {} failed", tmp.string()));
  }
  if (beforeCheckpointRename) beforeCheckpointRename();
  fs::rename(tmp, final, ec);
  if (ec) {
    fs::remove(tmp, ec);
    return unavailable(fmt::format("checkpoint: rename to {} failed", final.string()));
  }
  syncPath(dir, true);
  const auto all = listCheckpoints(dir);
  for (size_t i = static_cast<size_t>(options_.keepCheckpoints); i < all.size(); ++i) {
    fs::remove(all[i].second, ec);
  }
  return {};
}

Status Trainer::loadCheckpoint(const fs::path& path) {
  try {
    torch::serialize::InputArchive archive;
    archive.load_from(path.string());
    torch::Tensor step, sampler, rng;
    archive.read("step", step);
    archive.read("sampler", sampler);
    archive.read("rng", rng);
    torch::serialize::InputArchive modelArchive, optimizerArchive, syncArchive;
    archive.read("model", modelArchive);
    archive.read("optimizer", optimizerArchive);
    archive.read("sync", syncArchive);
    GEO_RETURN_IF_ERROR(model_->load(modelArchive));
    optimizer_->load(optimizerArchive);
    if (hook_ != nullptr) GEO_RETURN_IF_ERROR(hook_->loadState(syncArchive));
    at::Generator generator = at::detail::getDefaultCPUGenerator();  // a handle, shared
    {
      std::lock_guard<std::mutex> lock(generator.mutex());
      generator.set_state(rng);
    }
    sampler_.restore({sampler[0].item<int64_t>(), sampler[1].item<int64_t>()});
    step_ = step.item<int64_t>();
  } catch (const c10::Error& e) {
    return dataLoss(
        fmt::format("checkpoint {} cannot be read: {}", path.string(), e.what_without_backtrace()));
  }
  return {};
}

StatusOr<int64_t> Trainer::resume() {
  if (options_.checkpointDir.empty() || !options_.resume) return int64_t{0};
  Status lastError;
  for (const auto& [step, path] : listCheckpoints(options_.checkpointDir)) {
    Status s = loadCheckpoint(path);
    if (s.ok()) {
      logger()->info("resumed from {} (step {})", path.string(), step_);
      return step_;
    }
    logger()->warn("skipping checkpoint: {}", s.message());
    lastError = s;
  }
  // A failed load may have overwritten part of the state: never train on
  // from that silently.
  if (!lastError.ok()) {
    return lastError.withContext("no checkpoint in " + options_.checkpointDir.string() +
                                 " could be read; move them away to start fresh");
  }
  return int64_t{0};
}

}  // namespace geo::train
