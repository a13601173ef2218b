#include "worker/train/evaluation.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <utility>

#include "common/logging.h"

namespace geo::train {

torch::Tensor lossOf(const torch::Tensor& output, const torch::Tensor& targets) {
  if (targets.is_floating_point()) {
    return torch::mse_loss(output.reshape(targets.sizes()), targets);
  }
  if (targets.dim() == 2) {
    return torch::nn::functional::cross_entropy(output.reshape({-1, output.size(-1)}),
                                                targets.reshape({-1}));
  }
  return torch::nn::functional::cross_entropy(output, targets);
}

int64_t evaluationBatch(Model& model, int64_t trainingBatch, bool tokens) {
  if (tokens) return 16;
  int64_t params = 0;
  for (const torch::Tensor& p : model.parameters()) params += p.numel();
  if (params < 1'000'000 || trainingBatch <= 0) return 1000;
  return std::max<int64_t>(trainingBatch, kLargeModelEvaluationBatch);
}

std::optional<Evaluation> evaluationOf(Model& model, const TensorDataset& test,
                                       torch::Device device, const std::atomic<bool>* stop,
                                       int64_t batch) {
  torch::NoGradGuard noGrad;
  const int64_t chunk = batch > 0 ? batch : evaluationBatch(model, 0, test.targets.dim() == 2);
  model.setTraining(false);
  int64_t correct = 0;
  double lossSum = 0;
  const int64_t n = test.size();
  // Accuracy for class labels; a regression or a language model has its
  // loss alone.
  const bool lossOnly = test.regression() || test.targets.dim() != 1;
  for (int64_t start = 0; start < n; start += chunk) {
    if (stop != nullptr && stop->load()) {
      model.setTraining(true);
      return std::nullopt;
    }
    const int64_t len = std::min<int64_t>(chunk, n - start);
    const auto x = test.inputs.narrow(0, start, len).to(device);
    const auto y = test.targets.narrow(0, start, len).to(device);
    const auto out = model.forward(x);
    lossSum += lossOf(out, y).item<double>() * static_cast<double>(len);
    if (!lossOnly) correct += out.argmax(1).eq(y).sum().item<int64_t>();
  }
  model.setTraining(true);
  Evaluation e;
  e.loss = n == 0 ? 0.0 : lossSum / static_cast<double>(n);
  if (!lossOnly) {
    e.accuracy = n == 0 ? 0.0 : static_cast<double>(correct) / static_cast<double>(n);
  }
  return e;
}

BackgroundEvaluator::BackgroundEvaluator(std::unique_ptr<Model> model, const TensorDataset* test,
                                         torch::Device device, std::function<void()>* before,
                                         size_t backlog, int64_t batch)
    : model_(std::move(model)),
      test_(test),
      device_(device),
      before_(before),
      backlog_(backlog),
      batch_(batch) {
  thread_ = std::thread([this] { loop(); });
}

BackgroundEvaluator::~BackgroundEvaluator() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

bool BackgroundEvaluator::submit(int64_t step, torch::Tensor params,
                                 std::vector<torch::Tensor> buffers) {
  std::lock_guard lock(mu_);
  if (busy_ && jobs_.size() >= backlog_) {
    ++skipped_;
    return false;
  }
  busy_ = true;
  jobs_.push_back(Job{step, Clock::now(), std::move(params), std::move(buffers)});
  cv_.notify_all();
  return true;
}

std::vector<BackgroundEvaluator::Result> BackgroundEvaluator::take() {
  std::lock_guard lock(mu_);
  return std::exchange(done_, {});
}

std::vector<BackgroundEvaluator::Result> BackgroundEvaluator::next() {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return !done_.empty() || !busy_; });
  return std::exchange(done_, {});
}

void BackgroundEvaluator::abandon() {
  abandon_ = true;
  std::unique_lock lock(mu_);
  skipped_ += jobs_.size();
  jobs_.clear();
  cv_.wait(lock, [&] { return !busy_; });
  abandon_ = false;
}

uint64_t BackgroundEvaluator::skipped() const {
  std::lock_guard lock(mu_);
  return skipped_;
}

void BackgroundEvaluator::loop() {
  // Below the training threads (nice 10; Linux applies it per thread): on
  // a machine with few cores a contended CPU gives the evaluation about a
  // tenth of the time of a training thread. Not nice 19 or SCHED_IDLE:
  // measured with four workers on two vCPUs, those starve it, and an
  // evaluation started at step 100 finished only at the end of the run.
  (void)::setpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid)), 10);
  while (true) {
    Job job;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
      if (stop_) return;
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    std::optional<Evaluation> evaluation;  // nullopt: abandoned, or failed (logged)
    try {
      if (before_ != nullptr && *before_) (*before_)();
      torch::NoGradGuard noGrad;
      int64_t offset = 0;
      for (torch::Tensor& p : model_->parameters()) {
        p.view({-1}).copy_(job.params.narrow(0, offset, p.numel()));
        offset += p.numel();
      }
      auto buffers = model_->namedBuffers();
      for (size_t i = 0; i < buffers.size() && i < job.buffers.size(); ++i) {
        buffers[i].second.copy_(job.buffers[i]);
      }
      evaluation = evaluationOf(*model_, *test_, device_, &abandon_, batch_);
    } catch (const c10::Error& e) {
      logger()->warn("background evaluation of step {} failed: {}", job.step,
                     e.what_without_backtrace());
    }
    {
      std::lock_guard lock(mu_);
      if (evaluation) {
        done_.push_back({job.step, job.takenAt, *evaluation});
      } else if (abandon_) {
        ++skipped_;
      }
      busy_ = !jobs_.empty();
    }
    cv_.notify_all();
  }
}

}  // namespace geo::train
