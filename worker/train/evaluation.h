#pragma once
// Measuring a model on the test split: in line (evaluationOf), or on a
// thread of its own while training goes on (BackgroundEvaluator, which a
// Trainer runs when its worker evaluates in the background).
//
// Threading: evaluationOf runs on the caller's thread. A
// BackgroundEvaluator's methods are called from one thread (the trainer's);
// it evaluates on its own thread, which owns its model.

#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "worker/train/dataset.h"
#include "worker/train/model.h"

namespace geo::train {

// A model measured on the test split.
struct Evaluation {
  std::optional<double> accuracy;  // top-1; classification only
  double loss = 0;                 // mean per sample: cross-entropy, or squared error
};

// The training loss of a batch: squared error for float targets (a
// regression), cross-entropy for class labels, per token for token windows
// (targets of two dimensions).
torch::Tensor lossOf(const torch::Tensor& output, const torch::Tensor& targets);

// `model` on `test`, `batch` samples a forward pass (0:
// evaluationBatch(model, 0)): top-1 accuracy (classification) and the mean
// loss per sample; nullopt when `stop` became true between two batches.
// The model is in evaluation mode meanwhile and back in training mode
// after.
std::optional<Evaluation> evaluationOf(Model& model, const TensorDataset& test,
                                       torch::Device device,
                                       const std::atomic<bool>* stop = nullptr, int64_t batch = 0);

// Samples a forward pass of an evaluation: 16 token windows (each costs
// T x T of attention); 1000 samples for a model under 1M parameters (fewer
// passes, and its activations are small); else the training's batch
// (`trainingBatch`; 1000 when 0), at least kLargeModelEvaluationBatch. At
// 1000 samples a pass the 101.3M-parameter mlp's hidden layer alone was
// 510 MB, more than everything a round holds; at the training's 64, every
// pass read the whole model again (157 passes of the test split), and
// rank 0 of the 19.9M-parameter mlp spent a minute after its last step
// evaluating its snapshots. 256 holds a quarter of the 1000's activations
// and reads the model 40 times.
inline constexpr int64_t kLargeModelEvaluationBatch = 256;
int64_t evaluationBatch(Model& model, int64_t trainingBatch, bool tokens = false);

// One evaluation thread with its own model (the trained model's
// architecture) and a queue of snapshots of the trained model's values.
// The trainer thread submits snapshots and takes results; the evaluation
// thread copies each into its model and evaluates it, below the training
// threads' priority (nice 10).
class BackgroundEvaluator {
 public:
  using Clock = std::chrono::steady_clock;
  struct Result {
    int64_t step = 0;           // the step whose model was measured
    Clock::time_point takenAt;  // when the snapshot was submitted
    Evaluation evaluation;
  };

  // `model`: on `device`, of the trained model's architecture. `test` must
  // outlive the evaluator. `before` (may be null or empty): called on the
  // evaluation thread before each evaluation (a test seam). `backlog`:
  // snapshots that may wait while one is evaluated (0: none, an evaluation
  // step that finds one running is skipped).
  // `batch`: as evaluationOf's.
  BackgroundEvaluator(std::unique_ptr<Model> model, const TensorDataset* test, torch::Device device,
                      std::function<void()>* before, size_t backlog, int64_t batch = 0);
  // Stops the thread (after the evaluation in flight, if any).
  ~BackgroundEvaluator();
  BackgroundEvaluator(const BackgroundEvaluator&) = delete;
  BackgroundEvaluator& operator=(const BackgroundEvaluator&) = delete;

  // Hands a snapshot over: the parameters flattened in the model's order,
  // and its buffers. False (and a skip counted) while one is in flight and
  // the backlog is full.
  bool submit(int64_t step, torch::Tensor params, std::vector<torch::Tensor> buffers);

  // The results that finished since the last call, oldest first.
  std::vector<Result> take();

  // Blocks until a result is ready or nothing is left to evaluate; the
  // results ready, oldest first (empty: all done).
  std::vector<Result> next();

  // Stops the evaluation in flight, if any, at its next batch (it is then
  // counted as skipped), and returns once none runs. One that finished
  // before stays in take(). Waiting for it instead could take long: on a
  // saturated machine the evaluation thread gets little CPU time.
  // Snapshots still waiting are dropped and counted as skipped too.
  void abandon();

  // Snapshots refused or dropped, and evaluations abandoned, so far.
  uint64_t skipped() const;

 private:
  struct Job {
    int64_t step = 0;
    Clock::time_point takenAt;
    torch::Tensor params;
    std::vector<torch::Tensor> buffers;
  };

  void loop();

  std::unique_ptr<Model> model_;
  const TensorDataset* test_;
  torch::Device device_;
  std::function<void()>* before_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  size_t backlog_;
  int64_t batch_;
  std::deque<Job> jobs_;  // waiting; the one being evaluated is not here
  bool busy_ = false;     // a job is being evaluated or waiting
  bool stop_ = false;
  std::atomic<bool> abandon_{false};
  uint64_t skipped_ = 0;
  std::vector<Result> done_;
  std::thread thread_;
};

}  // namespace geo::train
