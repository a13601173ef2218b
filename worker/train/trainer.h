#pragma once
// The single-worker training loop: data, model, optimizer, learning-rate
// schedule, gradient clipping, evaluation and checkpoints, with a hook around
// the optimizer step through which a synchronizer (allreduce, DTS, swarm)
// plugs in -- modelled on PyTorch DDP communication hooks.
//
// Threading: a Trainer and its hook run on one thread. Errors: configuration
// and I/O problems come back as Status; LibTorch errors inside a step are
// caught and returned as Status too, so the worker can report them.

#include <torch/torch.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/worker_config.h"
#include "worker/train/checkpoint_store.h"
#include "worker/train/dataset.h"
#include "worker/train/evaluation.h"
#include "worker/train/model.h"

namespace geo::train {

struct TrainerOptions {
  int64_t steps = 1000;
  int64_t batchSize = 64;
  std::string optimizer = "sgd";  // sgd | adam
  double lr = 0.05;
  double momentum = 0.9;  // sgd
  bool nesterov = true;   // sgd (the worker config's default)
  double weightDecay = 0;
  std::string schedule = "constant";  // constant | cosine | step
  int64_t warmupSteps = 0;            // linear warm-up before the schedule
  int64_t stepSize = 1000;            // step schedule: multiply by stepGamma every stepSize
  double stepGamma = 0.1;
  double gradClip = 0;       // max global L2 norm; 0 = off
  int64_t evalInterval = 0;  // evaluate every N steps (and at the end); 0 = only at the end
  // Background evaluation: snapshots that may wait while one is evaluated
  // (each costs a copy of the parameters); 0 = an evaluation step that finds
  // one running is skipped. With a backlog, every snapshot still waiting at
  // the end is evaluated (and reported) before the final evaluation.
  int64_t evalBacklog = 0;
  int64_t logInterval = 50;  // progress callback every N steps
  uint64_t seed = 42;        // batch order
  torch::Device device = torch::kCPU;

  std::filesystem::path checkpointDir;  // empty: no checkpoints
  int64_t checkpointInterval = 500;
  int keepCheckpoints = 3;
  bool resume = true;  // start from the newest good checkpoint in checkpointDir
};

// What `geotrain local` emulates on one machine, apart from what a job
// trains (Trainer::setEmulation; the worker's --emulate-* flags, never its
// worker.yaml).
struct StepEmulation {
  // A straggler (`geotrain local --slow REGION=3x`): every step is
  // stretched to this many times its duration by sleeping after it. 1: off.
  double slowdown = 1;
  // A larger model (`geotrain local --step-time 20ms`): a step's compute
  // (forward, backward, optimizer) lasts at least this long, padded with a
  // sleep before the synchronizer's part. Runs whose timeline is in
  // seconds (fault scenarios) then take the same steps on any machine.
  // 0: off.
  std::chrono::milliseconds minStepTime{0};
};

// Throws nothing; names the field and the allowed values.
Status validateTrainerOptions(const TrainerOptions& o);

// The learning rate at `step` (0-based) for the options' schedule.
double learningRateAt(const TrainerOptions& o, int64_t step);

// A model's parameters as one contiguous fp32 buffer: every parameter is a
// view into `values` and every gradient a view into `grads`, in the model's
// fixed parameter order. Synchronizers read and write these buffers directly
// (no copies, one message per buffer or per slice).
struct FlatParameters {
  torch::Tensor values;
  torch::Tensor grads;
  std::vector<torch::Tensor> params;  // the views, in order
  // `values` followed by the model's float32 buffers (batch norm's running
  // statistics), in one storage: `values` is its first part. Training
  // exchanges `values` only (each worker's statistics follow its own
  // batches); the final average and the final model carry all of it, so
  // that every worker ends with -- and exports -- the same whole model.
  // Undefined where a caller built the struct itself: wholeModel() is then
  // `values`.
  torch::Tensor model;
  // The optimizer's state (momentum buffers, Adam moments) as bytes and back,
  // so that a synchronizer can hand a joining worker the whole training
  // state, not only the parameters. Set by the Trainer; empty otherwise.
  // loadOptimizer returns DataLoss for bytes that are not such a state.
  std::function<std::string()> saveOptimizer;
  std::function<Status(const std::string&)> loadOptimizer;
};

// `flat.model` where the trainer set it, else `flat.values`.
inline torch::Tensor wholeModel(const FlatParameters& flat) {
  return flat.model.defined() ? flat.model : flat.values;
}

// What StepHook::join() decided.
struct JoinResult {
  int64_t step = 0;          // the step training continues from
  bool jobFinished = false;  // the job already ended without this worker: do not train
  // jobFinished: the parameters now hold the job's final model, from a peer
  // that finished.
  bool finalModel = false;
};

struct JobModel {
  int64_t step = 0;
  torch::Tensor values;
};

// Around every optimizer step. afterBackward sees the local gradients (an
// allreduce averages them here); afterStep sees the updated parameters (DTS
// and swarm correct them here). Their state goes into checkpoints. Every
// step calls both, and nothing but the hook changes the parameters from
// one afterStep to the next afterBackward: DTS encodes a round closed at
// afterStep beside the next step's forward and backward passes, from the
// parameters as they were at the close, until afterBackward.
class StepHook {
 public:
  virtual ~StepHook() = default;
  // Once, before the first step of run(), with the step the worker is at
  // (0, or resumed from its checkpoint): a synchronizer whose peers are
  // ahead replaces `flat.values` by a live peer's model and returns the
  // job's step, which the trainer adopts (its optimizer state stays its own).
  // A job's step at or past the last (a peer answered after its last step,
  // before its final average) means the job is finishing with us: the
  // trainer takes no step, calls finish() at once, and ends on what it
  // leaves (the job's final model) as a worker that arrived after the end.
  virtual StatusOr<JoinResult> join(int64_t step, FlatParameters& flat) {
    (void)flat;
    return JoinResult{step, false};
  }
  virtual Status afterBackward(int64_t step, FlatParameters& flat) {
    (void)step;
    (void)flat;
    return {};
  }
  virtual Status afterStep(int64_t step, FlatParameters& flat) {
    (void)step;
    (void)flat;
    return {};
  }
  // Once, after the last step and before the final evaluation and
  // checkpoint: a synchronizer completes the rounds in flight and agrees on
  // the final model here. `steps` is the number of steps taken.
  virtual Status finish(int64_t steps, FlatParameters& flat) {
    (void)steps;
    (void)flat;
    return {};
  }
  // The job's model, which a periodic evaluation measures: a synchronizer
  // that lets the workers' models drift apart between averages (dts) knows
  // the model they agree on as of the last round it completed. Its values
  // are shaped like the flat parameters and its step is the one up to
  // which it holds every worker's samples (at most the steps taken).
  // nullopt: the hook keeps none, and the local model is the one to measure
  // (allreduce: it is the job's; swarm: there is no single one).
  virtual std::optional<JobModel> jobModel() { return std::nullopt; }
  virtual void saveState(torch::serialize::OutputArchive& archive) { (void)archive; }
  virtual Status loadState(torch::serialize::InputArchive& archive) {
    (void)archive;
    return {};
  }
};

struct StepStats {
  int64_t step = 0;  // steps completed
  double loss = 0;
  double lr = 0;
  double samplesPerSecond = 0;  // since the previous report
  // An evaluation reported with this step: its accuracy, the step whose
  // model it measured (this one; an earlier one for a background
  // evaluation, or for the job's model, StepHook::jobModel), and how long
  // before this report that model was taken (0 for an evaluation run in
  // line).
  // (Classification only; evalLoss is set with every evaluation.)
  std::optional<double> evalAccuracy;
  std::optional<double> evalLoss;
  std::optional<int64_t> evalStep;
  double evalAgeSeconds = 0;
  // Checkpoint writes that failed so far (a full disk, an I/O error, a
  // read-only file system): each was logged, the previous checkpoint kept,
  // and training went on.
  uint64_t checkpointFailures = 0;
  // When this step's training ended: after the synchronizer's afterStep (at
  // the last step, its final average too), before any evaluation reported
  // with it. What a steps/s counts up to.
  std::chrono::steady_clock::time_point endedAt{};

  void setEvaluation(const Evaluation& e) {
    evalAccuracy = e.accuracy;
    evalLoss = e.loss;
  }
};

// Where the training thread's time went over the steps taken so far
// (cumulative seconds): computing (the batch, forward, backward, the
// optimizer's step, and an emulated step time or slowdown), and inside the
// hook's afterBackward and afterStep (the synchronizer: encoding, sending,
// waiting for peers or the uplink, decoding and applying). Checkpoints,
// evaluation snapshots and progress reports between steps are in neither.
struct StepTiming {
  int64_t steps = 0;
  double computeSeconds = 0;
  double hookSeconds = 0;
};

// torch::optim::SGD's step with its temporaries made in place in the
// gradient, which is dead once the step is taken (the next step zeroes it
// before its backward pass): LibTorch's step() allocates a parameter-sized
// tensor for weight decay and another for Nesterov's look-ahead (on by
// default here) on every step -- the largest transient of a large model's
// step, 400 MB a step for a 101M-parameter mlp (docs/algorithms.md,
// "Memory"). The operations on each value are LibTorch 1.13's (SGD::step
// in torch/csrc/api/src/optim/sgd.cpp) in the same order, so the same bits,
// and its state is LibTorch's (momentum_buffer under the same key), so
// checkpoints and their optimizer state are unchanged.
class InPlaceSgd final : public torch::optim::SGD {
 public:
  using SGD::SGD;
  torch::Tensor step(LossClosure closure = nullptr) override;
};

class Trainer {
 public:
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // `hook` may be null; it must outlive the Trainer.
  static StatusOr<std::unique_ptr<Trainer>> create(std::unique_ptr<Model> model,
                                                   TensorDataset train, TensorDataset test,
                                                   TrainerOptions options,
                                                   StepHook* hook = nullptr);

  // Loads the newest checkpoint that verifies and fits this worker, newest
  // first, skipping with a warning that names the file and the reason:
  // one whose bytes do not match its checksum file (bit flips, truncation,
  // zero-filled blocks), one LibTorch cannot read, one written for another
  // optimizer or model, and one holding a NaN or an infinity. A checkpoint
  // without a checksum file (written by an older version) is loaded
  // unverified, with a warning. Returns the step resumed from, 0 when there
  // was none, and DataLoss naming the folder when there were checkpoints but
  // none could be used (the state may then be half loaded).
  StatusOr<int64_t> resume();

  // One optimizer step.
  StatusOr<StepStats> step();

  // Steps until options.steps, calling `progress` every logInterval steps
  // and at every evaluation; checkpoints every checkpointInterval steps and
  // at the end. After the last step, the hook's finish() runs before the
  // final evaluation and checkpoint. A periodic evaluation measures the
  // hook's job model where it keeps one (StepHook::jobModel), and reports
  // that model's step; the final one measures the final model.
  Status run(const std::function<void(const StepStats&)>& progress);

  // Top-1 accuracy of the current parameters on the test set.
  Evaluation evaluate();

  // From now on, periodic evaluations (every evalInterval steps) run in the
  // background on `evalModel`, a second instance of the same architecture:
  // at an evaluation step the trainer copies the parameters and buffers (a
  // snapshot, one memcpy) and trains on at once; a thread at lower priority
  // evaluates the snapshot, and the result is reported with the first step
  // after it finished (StepStats::evalStep names the snapshot's step, or
  // the job model's). At
  // most one evaluation is in flight, and at most options.evalBacklog
  // snapshots wait for it: an evaluation step that finds the backlog full
  // is skipped and counted (evalsSkipped()). The final evaluation still runs
  // in line, on the final model. Before it, with no backlog, one still in
  // flight is abandoned (and counted as skipped); with a backlog, the
  // snapshots still waiting are evaluated and reported, oldest first, each
  // with the step and age of its snapshot. InvalidArgument when evalModel's
  // parameters or buffers do not match this trainer's model in number and shapes.
  Status evaluateInBackground(std::unique_ptr<Model> evalModel);
  uint64_t evalsSkipped() const;

  // Test seam: runs on the evaluation thread before each background
  // evaluation.
  std::function<void()> beforeBackgroundEvaluation;

  // Writes <dir>/ckpt-<step>.pt and its checksum file ckpt-<step>.pt.sum,
  // each atomically (temporary file, fsync, rename, fsync of the directory),
  // then keeps the newest keepCheckpoints -- and, when none of those
  // verifies, the newest one that does as well. A state with a NaN or an
  // infinity in the parameters, buffers or optimizer state is never written:
  // FailedPrecondition naming the step and the tensor, nothing renamed.
  // A write that fails (ENOSPC, EIO, EROFS, a folder that cannot be made)
  // is Unavailable naming the file and the error, and leaves nothing of it
  // behind: the checkpoints already written stay as they were. run() logs
  // such a failure, counts it (checkpointFailures()) and trains on; the
  // next checkpoint is tried as usual.
  Status saveCheckpoint();
  uint64_t checkpointFailures() const { return checkpointFailures_; }

  int64_t currentStep() const { return step_; }
  // The steps this trainer took and where their time went (training thread
  // only, like step()).
  const StepTiming& timing() const { return timing_; }
  // After run(): the hook's join() found that the job had finished without
  // this worker, so run() took no step.
  bool arrivedAfterEnd() const { return arrivedAfterEnd_; }
  // Called on the training thread every checkpointInterval steps before the
  // last (after that step's checkpoint, when checkpoints are written), with
  // the step: the worker exports the model there (output.everyCheckpoint).
  void setAfterCheckpoint(std::function<void(int64_t step)> f) { afterCheckpoint_ = std::move(f); }
  // With arrivedAfterEnd(): the parameters hold the job's final model (a
  // peer that finished sent it), and currentStep() is the last step.
  bool holdsFinalModel() const { return holdsFinalModel_; }
  // After run(): the step join() adopted from a peer, if it did.
  std::optional<int64_t> joinedAt() const { return joinedAt_; }
  FlatParameters& flat() { return flat_; }
  Model& model() { return *model_; }

  // Test seam: called between writing and renaming a checkpoint.
  std::function<void()> beforeCheckpointRename;

  // From the next step on (training thread, between steps).
  void setEmulation(StepEmulation e) { emulation_ = e; }

 private:
  Trainer(std::unique_ptr<Model> model, TensorDataset train, TensorDataset test,
          TrainerOptions options, StepHook* hook);
  Status loadCheckpoint(const std::filesystem::path& path);
  // The hook's finish() at step_, a LibTorch exception as an error.
  Status finishWithHook();
  // The first tensor of the training state holding a NaN or an infinity,
  // named ("parameter 'fc1.weight'", "buffer 'bn1.running_var'", "the
  // optimizer's momentum buffer of parameter 'fc1.weight'"); nullopt when
  // all are finite. May throw c10::Error.
  std::optional<std::string> nonFiniteModelState();
  std::optional<std::string> nonFiniteOptimizerState();

  std::unique_ptr<Model> model_;
  TensorDataset train_;
  TensorDataset test_;
  TrainerOptions options_;
  int64_t evaluationBatch_ = 0;  // samples a forward pass of an evaluation (evaluationBatch)
  StepEmulation emulation_;
  StepHook* hook_;
  FlatParameters flat_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  BatchSampler sampler_;
  int64_t step_ = 0;
  StepTiming timing_;
  bool arrivedAfterEnd_ = false;
  std::function<void(int64_t)> afterCheckpoint_;
  uint64_t checkpointFailures_ = 0;
  bool holdsFinalModel_ = false;
  std::optional<int64_t> joinedAt_;
  // The checkpoint folder (null without one); the checkpoints resume()
  // refused are marked there, so that rotation does not count them.
  std::unique_ptr<CheckpointStore> checkpoints_;
  std::unique_ptr<BackgroundEvaluator> evaluator_;
};

}  // namespace geo::train
