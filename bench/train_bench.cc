// Training-loop overhead: Trainer::step() (sampler, flat parameter buffer,
// hook points, schedule, checkpoint-ready state) against a bare LibTorch
// loop doing the same work (same model, batch, optimizer), measured in the
// same run, alternating rounds so drift on a noisy machine hits both alike.
//
//   geo_train_bench [--models mlp,cnn,resnet18] [--steps 50] [--rounds 3]
//
// Target (issue "Training runtime"): overhead <= 5%. Prints samples/s.

#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <sstream>

#include "worker/train/trainer.h"

using namespace geo::train;

namespace {

double seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

struct Setup {
  TensorDataset train;
  TensorDataset test;
  std::vector<int64_t> shape;
};

Setup dataFor(const std::string& model) {
  DatasetSpec spec;
  spec.name = "synthetic";
  spec.syntheticSamples = 4096;
  auto train = loadDataset(spec, Split::kTrain);
  auto test = loadDataset(spec, Split::kTest);
  if (!train.ok() || !test.ok()) {
    std::fprintf(stderr, "%s\n", train.status().toString().c_str());
    std::exit(1);
  }
  Setup s{*train, *test, {1, 28, 28}};
  if (model == "resnet18") {  // 3x32x32 inputs: pad and repeat the channel
    auto pad = [](const torch::Tensor& x) {
      return torch::constant_pad_nd(x, {2, 2, 2, 2}).repeat({1, 3, 1, 1}).contiguous();
    };
    s.train.inputs = pad(s.train.inputs);
    s.test.inputs = pad(s.test.inputs);
    s.shape = {3, 32, 32};
  }
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("geotrain training-loop overhead: Trainer vs a bare LibTorch loop");
  std::string models = "mlp,cnn,resnet18";
  int steps = 50;
  int rounds = 3;
  int64_t batch = 64;
  app.add_option("--models", models, "comma-separated built-in models");
  app.add_option("--steps", steps, "steps per measurement (resnet18 uses steps / 10)")
      ->check(CLI::PositiveNumber);
  app.add_option("--rounds", rounds, "alternating rounds; the best of each is reported")
      ->check(CLI::PositiveNumber);
  app.add_option("--batch-size", batch, "samples per step")->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);

  std::printf("%-10s %14s %14s %10s\n", "model", "bare samples/s", "trainer samples/s", "overhead");
  std::stringstream list(models);
  std::string name;
  while (std::getline(list, name, ',')) {
    const Setup data = dataFor(name);
    const int n = name == "resnet18" ? std::max(1, steps / 10) : steps;
    TrainerOptions o;
    o.steps = 1 << 30;
    o.batchSize = batch;

    torch::manual_seed(1);
    auto bareModel = makeModel({name, {}}, data.shape, 10);
    torch::manual_seed(1);
    auto trainerModel = makeModel({name, {}}, data.shape, 10);
    if (!bareModel.ok() || !trainerModel.ok()) {
      std::fprintf(stderr, "%s\n", bareModel.status().toString().c_str());
      return 1;
    }
    auto params = (*bareModel)->parameters();
    torch::optim::SGD bareOpt(
        params, torch::optim::SGDOptions(o.lr).momentum(o.momentum).nesterov(o.nesterov));
    auto trainer = Trainer::create(std::move(*trainerModel), data.train, data.test, o);
    if (!trainer.ok()) {
      std::fprintf(stderr, "%s\n", trainer.status().toString().c_str());
      return 1;
    }
    const int64_t size = data.train.size();
    int64_t cursor = 0;
    auto bareStep = [&] {
      // The same work: a random batch gathered from the data set.
      const auto idx = torch::randint(size, {batch}, torch::kLong);
      const auto x = data.train.inputs.index_select(0, idx);
      const auto y = data.train.targets.index_select(0, idx);
      bareOpt.zero_grad();
      auto loss = torch::nn::functional::cross_entropy((*bareModel)->forward(x), y);
      loss.backward();
      bareOpt.step();
      cursor += batch;
    };
    bareStep();  // warm up both
    (void)(*trainer)->step();
    double bestBare = 1e30, bestTrainer = 1e30;
    for (int r = 0; r < rounds; ++r) {
      auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < n; ++i) bareStep();
      bestBare = std::min(bestBare, seconds(t0));
      t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < n; ++i) (void)(*trainer)->step();
      bestTrainer = std::min(bestTrainer, seconds(t0));
    }
    const double bareRate = n * batch / bestBare;
    const double trainerRate = n * batch / bestTrainer;
    std::printf("%-10s %14.0f %14.0f %9.1f%%\n", name.c_str(), bareRate, trainerRate,
                (bestTrainer / bestBare - 1) * 100);
  }
  return 0;
}
