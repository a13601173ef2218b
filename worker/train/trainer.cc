#include "worker/train/trainer.h"

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>
#include <tuple>
#include <type_traits>

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
  if (o.evalBacklog < 0 || o.evalBacklog > kMaxEvalBacklog) {
    return invalidArgument(
        fmt::format("training: evalBacklog {} is outside 0..{}", o.evalBacklog, kMaxEvalBacklog));
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
  // float32 buffers (batch norm's running statistics; not its integer
  // batch count) live after the parameters, in the same storage.
  std::vector<torch::Tensor> buffers;
  int64_t buffered = 0;
  for (auto& [name, b] : model.namedBuffers()) {
    if (b.scalar_type() != torch::kFloat32 || b.numel() == 0) continue;
    buffers.push_back(b);
    buffered += b.numel();
  }
  const auto opts = torch::TensorOptions().dtype(torch::kFloat32).device(device);
  flat.model = torch::empty({total + buffered}, opts);
  flat.values = flat.model.narrow(0, 0, total);
  flat.grads = torch::zeros({total}, opts);
  int64_t at = total;
  for (auto& b : buffers) {
    const int64_t n = b.numel();
    auto value = flat.model.narrow(0, at, n).view(b.sizes());
    value.copy_(b);
    b.set_data(value);  // the buffer now lives in the flat storage
    at += n;
  }
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
  return std::make_unique<InPlaceSgd>(params, torch::optim::SGDOptions(o.lr)
                                                  .momentum(o.momentum)
                                                  .nesterov(o.nesterov)
                                                  .weight_decay(o.weightDecay));
}

// fsync a file or directory by path; false on failure.
// The training loss of `output` against `targets`: cross-entropy over class
// logits, or the mean squared error against float targets [N, T].
// Next-token logits [N, T, V] against token ids [N, T]: the cross-entropy
// of every position.
// Whether a tensor holds only finite values (integer tensors always do).
bool allFinite(const torch::Tensor& t) {
  if (!t.defined() || !t.is_floating_point()) return true;
  return torch::isfinite(t).all().item<bool>();
}

// The key of a parameter's optimizer state, as LibTorch's own optimizers
// (and the serialization of their state) make it: its TensorImpl's address,
// printed as a string in Debian's LibTorch (1.13), the address itself in
// newer releases (PyTorch 2.11's). Key is the state map's key type.
template <typename Key>
Key stateKey(c10::TensorImpl* impl) {
  if constexpr (std::is_same_v<Key, std::string>)
    return c10::str(impl);
  else
    return impl;
}

}  // namespace

torch::Tensor InPlaceSgd::step(LossClosure closure) {
  torch::NoGradGuard noGrad;
  torch::Tensor loss;
  if (closure != nullptr) {
    at::AutoGradMode enableGrad(true);
    loss = closure();
  }
  for (auto& group : param_groups_) {
    const auto& o = static_cast<const torch::optim::SGDOptions&>(group.options());
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      torch::Tensor d = p.grad();  // the gradient's own storage
      if (o.weight_decay() != 0) d.add_(p, o.weight_decay());
      if (o.momentum() != 0) {
        const auto key =
            stateKey<std::decay_t<decltype(state_.begin()->first)>>(p.unsafeGetTensorImpl());
        torch::Tensor buf;
        auto found = state_.find(key);
        if (found == state_.end()) {
          buf = torch::clone(d).detach();
          auto state = std::make_unique<torch::optim::SGDParamState>();
          state->momentum_buffer(buf);
          state_[key] = std::move(state);
        } else {
          buf = static_cast<torch::optim::SGDParamState&>(*found->second).momentum_buffer();
          buf.mul_(o.momentum()).add_(d, 1 - o.dampening());
        }
        if (o.nesterov()) {
          d.add_(buf, o.momentum());
        } else {
          d = buf;
        }
      }
      p.add_(d, -1 * o.lr());
    }
  }
  return loss;
}

Trainer::Trainer(std::unique_ptr<Model> model, TensorDataset train, TensorDataset test,
                 TrainerOptions options, StepHook* hook)
    : model_(std::move(model)),
      train_(std::move(train)),
      test_(std::move(test)),
      options_(std::move(options)),
      hook_(hook),
      // A token stream draws its windows by step (randomWindowStarts), not
      // from a permutation of its millions of starts: its sampler is idle.
      sampler_(train_.isTokenStream() ? options_.batchSize : train_.size(), options_.batchSize,
               options_.seed),
      checkpoints_(options_.checkpointDir.empty()
                       ? nullptr
                       : std::make_unique<CheckpointStore>(options_.checkpointDir,
                                                           options_.keepCheckpoints)) {
  evaluationBatch_ = evaluationBatch(*model_, options_.batchSize, test_.targets.dim() == 2);
}

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
    // On a GPU the batch is gathered into pinned memory and copied without
    // blocking: the copy is queued behind the previous step's work and this
    // thread goes on queueing the forward pass.
    const auto toDevice = [&](const torch::Tensor& t) {
      if (options_.device.is_cpu()) return t;
      return t.pin_memory().to(options_.device, /*non_blocking=*/true);
    };
    torch::Tensor x, y;
    if (train_.isTokenStream()) {
      // Windows from anywhere in this worker's part of the stream, drawn
      // by step: a resumed worker draws what it would have.
      std::tie(x, y) = tokenWindows(
          train_, randomWindowStarts(options_.seed, step_, options_.batchSize, train_.size()));
      x = toDevice(x);
      y = toDevice(y);
    } else {
      const auto indices = sampler_.next();
      x = toDevice(train_.inputs.index_select(0, indices));
      y = toDevice(train_.targets.index_select(0, indices));
    }
    model_->setTraining(true);
    flat_.grads.zero_();
    const auto loss = lossOf(model_->forward(x), y);
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
    double hookSeconds = 0;
    // The hook's time, measured around each call, so that the rest of the
    // step is the computation's.
    // On a GPU the work of the step is queued, not done: the device is
    // synchronized first, so that it counts as computation rather than as
    // the synchronizer's first call that waits for the device (an encode).
    const bool onGpu = options_.device.is_cuda();
    const auto timed = [&hookSeconds, onGpu](auto&& call) {
      if (onGpu) torch::cuda::synchronize();
      const auto t0 = std::chrono::steady_clock::now();
      Status s = call();
      hookSeconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      return s;
    };
    if (hook_ != nullptr) {
      GEO_RETURN_IF_ERROR(timed([&] { return hook_->afterBackward(step_, flat_); }));
    }
    if (options_.gradClip > 0) torch::nn::utils::clip_grad_norm_(flat_.params, options_.gradClip);
    const double lr = learningRateAt(options_, step_);
    for (auto& group : optimizer_->param_groups()) group.options().set_lr(lr);
    optimizer_->step();
    ++step_;
    if (emulation_.minStepTime.count() > 0) {
      std::this_thread::sleep_until(started + emulation_.minStepTime);
    }
    if (hook_ != nullptr) {
      GEO_RETURN_IF_ERROR(timed([&] { return hook_->afterStep(step_ - 1, flat_); }));
    }
    stats.step = step_;
    stats.loss = lossValue;
    stats.lr = lr;
    if (emulation_.slowdown > 1) {
      std::this_thread::sleep_for((std::chrono::steady_clock::now() - started) *
                                  (emulation_.slowdown - 1));
    }
    ++timing_.steps;
    timing_.hookSeconds += hookSeconds;
    timing_.computeSeconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count() -
        hookSeconds;
  } catch (const c10::Error& e) {
    return internalError(
        fmt::format("training step {} failed: {}", step_ + 1, e.what_without_backtrace()));
  }
  return stats;
}

Evaluation Trainer::evaluate() {
  return *evaluationOf(*model_, test_, options_.device, nullptr, evaluationBatch_);
}

Trainer::~Trainer() = default;

Status Trainer::evaluateInBackground(std::unique_ptr<Model> evalModel) {
  if (evalModel == nullptr) return invalidArgument("background evaluation: no model");
  const auto mine = model_->namedParameters();
  const auto theirs = evalModel->namedParameters();
  const auto myBuffers = model_->namedBuffers();
  const auto theirBuffers = evalModel->namedBuffers();
  const auto sameShapes = [](const auto& a, const auto& b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i) {
      if (a[i].second.sizes() != b[i].second.sizes()) return false;
    }
    return true;
  };
  if (!sameShapes(mine, theirs) || !sameShapes(myBuffers, theirBuffers)) {
    return invalidArgument(
        "background evaluation: the evaluation model's parameters or buffers differ from the "
        "trained model's (not the same architecture)");
  }
  try {
    evalModel->to(options_.device);
  } catch (const c10::Error& e) {
    return internalError(fmt::format("background evaluation: {}", e.what_without_backtrace()));
  }
  evaluator_ = std::make_unique<BackgroundEvaluator>(
      std::move(evalModel), &test_, options_.device, &beforeBackgroundEvaluation,
      static_cast<size_t>(options_.evalBacklog), evaluationBatch_);
  return {};
}

uint64_t Trainer::evalsSkipped() const {
  return evaluator_ ? evaluator_->skipped() : 0;
}

namespace {

// `stats` reporting a background evaluation's result.
StepStats withEvaluation(StepStats stats, const BackgroundEvaluator::Result& r) {
  stats.evalAccuracy = r.evaluation.accuracy;
  stats.evalLoss = r.evaluation.loss;
  stats.evalStep = r.step;
  stats.evalAgeSeconds =
      std::chrono::duration<double>(BackgroundEvaluator::Clock::now() - r.takenAt).count();
  return stats;
}

}  // namespace

Status Trainer::finishWithHook() {
  try {
    return hook_->finish(step_, flat_);
  } catch (const c10::Error& e) {
    return internalError(fmt::format("finishing training failed: {}", e.what_without_backtrace()));
  }
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
    if (!joined->jobFinished && joined->step >= options_.steps) {
      // A peer sent its state after its last step, before its final
      // average: the peers count on us in that average (a region leader
      // sends us the job's final model), so take part in it.
      logger()->info("joined the job at its last step ({}); taking part in its final average",
                     joined->step);
      step_ = options_.steps;
      GEO_RETURN_IF_ERROR(finishWithHook());
      arrivedAfterEnd_ = true;
      holdsFinalModel_ = true;
      return {};
    }
    if (joined->jobFinished) {
      arrivedAfterEnd_ = true;
      holdsFinalModel_ = joined->finalModel;
      if (holdsFinalModel_) step_ = options_.steps;
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
    if (step_ == options_.steps && hook_ != nullptr) GEO_RETURN_IF_ERROR(finishWithHook());
    const bool atEnd = step_ == options_.steps;
    // When the parameters an in-line evaluation measures were settled: the
    // evaluation's age counts from here (at the end, the snapshots that
    // waited are evaluated first).
    const auto settled = std::chrono::steady_clock::now();
    stats->endedAt = settled;
    const bool periodic = options_.evalInterval > 0 && step_ % options_.evalInterval == 0;
    const bool evalInLine = atEnd || (periodic && !evaluator_);
    // What a periodic evaluation measures: the job's model where the hook
    // keeps one, else this worker's.
    std::optional<JobModel> job;
    if (periodic && !atEnd && hook_ != nullptr) {
      torch::NoGradGuard noGrad;
      job = hook_->jobModel();
    }
    if (periodic && !atEnd && evaluator_) {
      torch::NoGradGuard noGrad;
      std::vector<torch::Tensor> buffers;
      for (auto& [name, b] : model_->namedBuffers()) buffers.push_back(b.clone());
      if (!evaluator_->submit(job ? job->step : step_, job ? job->values : flat_.values.clone(),
                              std::move(buffers))) {
        logger()->debug("evaluation of step {} skipped: the previous one is still running", step_);
      }
    }
    // A background result is reported at once, with this step's figures; at
    // the end before the final evaluation (with no backlog, one still running
    // is abandoned; with one, every snapshot waiting is evaluated first).
    bool background = false;
    if (evaluator_) {
      // A result rides this step's report; any other is reported on its own,
      // with no throughput (this step's report, or the final one, carries it).
      StepStats alone = *stats;
      alone.samplesPerSecond = 0;
      const auto report = [&](const BackgroundEvaluator::Result& r) {
        if (progress) progress(withEvaluation(alone, r));
      };
      if (atEnd && options_.evalBacklog > 0) {
        for (auto ready = evaluator_->next(); !ready.empty(); ready = evaluator_->next()) {
          for (const auto& r : ready) report(r);
        }
      } else if (atEnd) {
        evaluator_->abandon();
      }
      const auto results = evaluator_->take();
      for (size_t i = 0; i < results.size(); ++i) {
        if (atEnd || i + 1 < results.size()) {
          report(results[i]);
        } else {
          *stats = withEvaluation(*stats, results[i]);
          background = true;
        }
      }
    }
    if (step_ % options_.logInterval == 0 || evalInLine || background) {
      // Training throughput only: up to this step's end, before any
      // evaluation runs or waits.
      const double seconds = std::chrono::duration<double>(settled - last).count();
      stats->samplesPerSecond =
          seconds > 0 ? static_cast<double>((step_ - lastStep) * options_.batchSize) / seconds : 0;
      if (evalInLine) {
        if (job) {
          // The job's model in place of this worker's, for the evaluation only.
          torch::NoGradGuard noGrad;
          const torch::Tensor own = flat_.values.clone();
          flat_.values.copy_(job->values);
          stats->setEvaluation(evaluate());
          flat_.values.copy_(own);
        } else {
          stats->setEvaluation(evaluate());
        }
        stats->evalStep = job ? job->step : step_;
        stats->evalAgeSeconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - settled).count();
      }
      last = std::chrono::steady_clock::now();
      lastStep = step_;
      stats->checkpointFailures = checkpointFailures_;
      if (progress) progress(*stats);
    }
    if (!options_.checkpointDir.empty() &&
        (step_ % options_.checkpointInterval == 0 || step_ == options_.steps)) {
      // A disk that is full or failing costs a checkpoint, not the job: the
      // model is in memory and the peers hold it too; the last good
      // checkpoint stays, and the next one is tried as usual. A diverged
      // state (FailedPrecondition) still stops training.
      if (Status saved = saveCheckpoint(); !saved.ok()) {
        if (saved.code() != StatusCode::kUnavailable) return saved;
        ++checkpointFailures_;
        logger()->error(
            "checkpoint for step {} not written: {}; training goes on, the checkpoints written "
            "before are kept ({} failed write(s) so far)",
            step_, saved.message(), checkpointFailures_);
      }
    }
    if (afterCheckpoint_ && step_ % options_.checkpointInterval == 0 && step_ < options_.steps) {
      afterCheckpoint_(step_);
    }
  }
  if (evalsSkipped() > 0) {
    logger()->info(
        "{} periodic evaluation(s) skipped because the previous one was still running (raise "
        "training.evalInterval to see every one)",
        evalsSkipped());
  }
  return {};
}

std::optional<std::string> Trainer::nonFiniteModelState() {
  torch::NoGradGuard noGrad;
  if (allFinite(flat_.values)) {
    for (auto& [name, t] : model_->namedBuffers()) {
      if (!allFinite(t)) return fmt::format("buffer '{}'", name);
    }
    return std::nullopt;
  }
  for (auto& [name, t] : model_->namedParameters()) {
    if (!allFinite(t)) return fmt::format("parameter '{}'", name);
  }
  return std::string("a parameter");  // not reached: every parameter is a view of flat_.values
}

namespace {

// The key LibTorch's optimizer state has for parameter `p`: its TensorImpl
// address, as text (ostream form) in the LibTorch Debian ships, as the
// pointer itself in later ones (PyTorch's own LibTorch).
template <typename State>
typename State::key_type optimizerStateKey(const State& state, const torch::Tensor& p) {
  (void)state;
  using Key = typename State::key_type;
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream text;
    text << p.unsafeGetTensorImpl();
    return text.str();
  } else {
    return static_cast<Key>(p.unsafeGetTensorImpl());
  }
}

}  // namespace

std::optional<std::string> Trainer::nonFiniteOptimizerState() {
  torch::NoGradGuard noGrad;
  std::map<const void*, std::string> names;
  for (auto& [name, t] : model_->namedParameters()) names[t.unsafeGetTensorImpl()] = name;
  auto& state = optimizer_->state();
  for (auto& group : optimizer_->param_groups()) {
    for (auto& p : group.params()) {
      const auto it = state.find(optimizerStateKey(state, p));
      if (it == state.end() || it->second == nullptr) continue;
      const auto name = names.find(p.unsafeGetTensorImpl());
      const std::string param = name == names.end() ? "a parameter" : "'" + name->second + "'";
      auto bad = [&](const char* what) {
        return fmt::format("the optimizer's {} of parameter {}", what, param);
      };
      if (const auto* sgd = dynamic_cast<const torch::optim::SGDParamState*>(it->second.get())) {
        if (!allFinite(sgd->momentum_buffer())) return bad("momentum buffer");
      } else if (const auto* adam =
                     dynamic_cast<const torch::optim::AdamParamState*>(it->second.get())) {
        if (!allFinite(adam->exp_avg())) return bad("first moment (exp_avg)");
        if (!allFinite(adam->exp_avg_sq())) return bad("second moment (exp_avg_sq)");
        if (!allFinite(adam->max_exp_avg_sq())) return bad("max_exp_avg_sq");
      }
    }
  }
  return std::nullopt;
}

Status Trainer::saveCheckpoint() {
  if (checkpoints_ == nullptr) {
    return failedPrecondition("checkpoint: this trainer has no checkpoint folder (checkpointDir)");
  }
  // A diverged state is never written: rotation would otherwise replace the
  // good checkpoints by copies of it.
  std::optional<std::string> bad;
  try {
    bad = nonFiniteModelState();
    if (!bad) bad = nonFiniteOptimizerState();
  } catch (const c10::Error& e) {
    return internalError(fmt::format("checkpoint: checking the state at step {} failed: {}", step_,
                                     e.what_without_backtrace()));
  }
  if (bad) {
    return failedPrecondition(fmt::format(
        "checkpoint for step {} not written: {} holds a NaN or an infinity (the training state "
        "diverged; the earlier checkpoints are kept)",
        step_, *bad));
  }
  std::string bytes;
  try {
    torch::serialize::OutputArchive archive;
    archive.write("step", torch::tensor(step_));
    // What the state belongs to, so that a checkpoint of another
    // configuration is refused by name rather than by a LibTorch assert.
    archive.write("optimizerName", c10::IValue(options_.optimizer));
    archive.write("parameterCount", c10::IValue(model_->parameterCount()));
    archive.write("modelName", c10::IValue(model_->describe()));
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
    // In memory first: the checksum is of exactly the bytes written.
    archive.save_to([&bytes](const void* data, size_t size) {
      bytes.append(static_cast<const char*>(data), size);
      return size;
    });
  } catch (const std::exception& e) {
    return unavailable(fmt::format("checkpoint: serializing step {} failed: {}", step_, e.what()));
  }
  return checkpoints_->write(step_, bytes, beforeCheckpointRename);
}

Status Trainer::loadCheckpoint(const fs::path& path) {
  auto file = CheckpointStore::read(path);
  if (!file.ok()) return file.status();
  if (!file->verified) {
    logger()->warn(
        "checkpoint {} has no checksum file {} (written by an older version): loading it "
        "unverified",
        path.string(), CheckpointStore::checksumPath(path).filename().string());
  }
  try {
    torch::serialize::InputArchive archive;
    archive.load_from(file->bytes.data(), file->bytes.size());
    // Older checkpoints lack these keys: LibTorch's own checks remain.
    c10::IValue value;
    if (archive.try_read("optimizerName", value)) {
      const std::string name = value.isString() ? value.toStringRef() : "(unreadable)";
      if (name != options_.optimizer) {
        return failedPrecondition(
            fmt::format("checkpoint {} was written for optimizer {}, this worker uses {} "
                        "(training.optimizer)",
                        path.string(), name, options_.optimizer));
      }
    }
    std::string writtenFor = "another model";
    if (archive.try_read("modelName", value) && value.isString()) {
      writtenFor = fmt::format("model '{}'", value.toStringRef());
    }
    const int64_t parameters = model_->parameterCount();
    if (archive.try_read("parameterCount", value) &&
        (!value.isInt() || value.toInt() != parameters)) {
      return failedPrecondition(fmt::format(
          "checkpoint {} was written for {} with {} parameters, this worker's model '{}' has {} "
          "(model.builtin / model.torchscript)",
          path.string(), writtenFor, value.isInt() ? std::to_string(value.toInt()) : "?",
          model_->describe(), parameters));
    }
    torch::Tensor step, sampler, rng;
    archive.read("step", step);
    archive.read("sampler", sampler);
    archive.read("rng", rng);
    torch::serialize::InputArchive modelArchive, optimizerArchive, syncArchive;
    archive.read("model", modelArchive);
    archive.read("optimizer", optimizerArchive);
    archive.read("sync", syncArchive);
    const Status fits = model_->load(modelArchive);
    if (!fits.ok()) {
      return failedPrecondition(
          fmt::format("checkpoint {} does not fit this worker's model '{}' (model.builtin / "
                      "model.torchscript): {}",
                      path.string(), model_->describe(), fits.message()));
    }
    if (const auto bad = nonFiniteModelState()) {
      return dataLoss(fmt::format("checkpoint {} is corrupt: {} holds a NaN or an infinity",
                                  path.string(), *bad));
    }
    // LibTorch's load sets the state of the parameters the archive has state
    // for and leaves the others as they were: drop what an earlier, refused
    // checkpoint may have left.
    optimizer_->state().clear();
    optimizer_->load(optimizerArchive);
    if (const auto bad = nonFiniteOptimizerState()) {
      return dataLoss(fmt::format("checkpoint {} is corrupt: {} holds a NaN or an infinity",
                                  path.string(), *bad));
    }
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
  for (const auto& [step, path] : checkpoints_->list()) {
    Status s = loadCheckpoint(path);
    if (s.ok()) {
      logger()->info("resumed from {} (step {})", path.string(), step_);
      return step_;
    }
    logger()->warn("skipping checkpoint: {}", s.message());
    checkpoints_->refuse(path);
    lastError = s;
  }
  // A failed load may have overwritten part of the state: never train on
  // from that silently.
  if (!lastError.ok()) {
    return dataLoss(fmt::format(
        "no checkpoint in {} could be used, each was skipped with a warning (the oldest: {}); "
        "move them away to start fresh",
        options_.checkpointDir.string(), lastError.message()));
  }
  return int64_t{0};
}

}  // namespace geo::train
