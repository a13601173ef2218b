// The training runtime end to end on real Fashion-MNIST: convergence of the
// built-in models, a TorchScript model trained from C++, bitwise resume,
// checkpoints that survive an interrupted write, and checkpoints that are
// refused -- damaged, of another model or optimizer, not finite -- without
// rotation deleting the last good one.

#include <gtest/gtest.h>
#include <unistd.h>

#include <spdlog/sinks/ostream_sink.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#include "common/logging.h"
#include "worker/train/blas.h"
#include "worker/train/trainer.h"

namespace geo::train {
namespace {

namespace fs = std::filesystem;

const char* kFashion = "/usr/share/datasets/fashion-mnist";

struct Data {
  TensorDataset train, test;
};

const Data& fashion() {
  static const Data d = [] {
    DatasetSpec spec;
    spec.name = "fashion-mnist";
    spec.path = kFashion;
    auto train = loadDataset(spec, Split::kTrain);
    auto test = loadDataset(spec, Split::kTest);
    if (!train.ok() || !test.ok()) {
      ADD_FAILURE() << train.status().toString() << " " << test.status().toString();
      return Data{};
    }
    return Data{*train, *test};
  }();
  return d;
}

std::unique_ptr<Trainer> makeTrainer(const ModelSpec& model, TrainerOptions o,
                                     StepHook* hook = nullptr, uint64_t initSeed = 1) {
  torch::manual_seed(initSeed);
  auto m = makeModel(model, {1, 28, 28}, 10);
  EXPECT_TRUE(m.ok()) << m.status().toString();
  auto t = Trainer::create(std::move(*m), fashion().train, fashion().test, o, hook);
  EXPECT_TRUE(t.ok()) << t.status().toString();
  return std::move(*t);
}

double trainAndEvaluate(const ModelSpec& model, TrainerOptions o) {
  auto t = makeTrainer(model, o);
  double accuracy = 0;
  const Status s = t->run([&](const StepStats& st) {
    if (st.evalAccuracy) accuracy = *st.evalAccuracy;
  });
  EXPECT_TRUE(s.ok()) << s.toString();
  return accuracy;
}

// Stated budgets: batch 64, SGD lr 0.05 momentum 0.9, cosine decay; mlp
// 1000 steps, cnn 1500 steps (about 1 and 1.6 epochs).
TEST(TrainConvergence, MlpReaches86PercentIn1000Steps) {
  TrainerOptions o;
  o.steps = 1000;
  o.schedule = "cosine";
  EXPECT_GE(trainAndEvaluate({"mlp", {}}, o), 0.86);
}

TEST(TrainConvergence, CnnReaches89PercentIn1500Steps) {
  TrainerOptions o;
  o.steps = 1500;
  o.schedule = "cosine";
  EXPECT_GE(trainAndEvaluate({"cnn", {}}, o), 0.89);
}

// --step-time's floor: a step's compute lasts at least minStepTime, padded
// before the synchronizer's part (the hook sees the padded compute, as it
// would a larger model's).
TEST(TrainEmulation, MinStepTimePadsTheComputeBeforeTheHook) {
  struct Times : StepHook {
    std::vector<std::chrono::steady_clock::time_point> after;
    Status afterStep(int64_t, FlatParameters&) override {
      after.push_back(std::chrono::steady_clock::now());
      return {};
    }
  } times;
  TrainerOptions o;
  o.steps = 6;
  auto t = makeTrainer({"mlp", {}}, o, &times);
  t->setEmulation({1, std::chrono::milliseconds(40)});
  // The hook sees a step only once it has lasted minStepTime: the padding
  // comes before it, as a larger model's compute would. (A machine under
  // load only makes the steps longer, so this cannot fail for load; on an
  // idle one the mlp's own step is a few ms, and a padding after the hook
  // fails it.)
  std::vector<std::chrono::steady_clock::time_point> started;
  for (int i = 0; i < 5; ++i) {
    started.push_back(std::chrono::steady_clock::now());
    ASSERT_TRUE(t->step().ok());
  }
  ASSERT_EQ(times.after.size(), 5u);
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_GE(times.after[i] - started[i], std::chrono::milliseconds(40)) << "step " << i;
  }
}

// Where a step's time goes: the hook's calls on one side, the rest of the
// step (computing, padded by minStepTime) on the other.
TEST(TrainTiming, SplitsTheStepIntoComputeAndTheHook) {
  struct Slow : StepHook {
    std::vector<double> backward;  // each afterBackward's own length
    Status afterBackward(int64_t, FlatParameters&) override {
      const auto t0 = std::chrono::steady_clock::now();
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      backward.push_back(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      return {};
    }
    Status afterStep(int64_t, FlatParameters&) override {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      return {};
    }
  } slow;
  TrainerOptions o;
  o.steps = 5;
  auto t = makeTrainer({"mlp", {}}, o, &slow);
  t->setEmulation({1, std::chrono::milliseconds(50)});
  EXPECT_EQ(t->timing().steps, 0);
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(t->step().ok());
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const StepTiming& timing = t->timing();
  EXPECT_EQ(timing.steps, 4);
  // Sleeps only last longer under load: at least 30 ms of hook per step.
  // The padding runs to 50 ms from the step's start and afterBackward falls
  // inside it, so the rest of a step is at least 50 ms less afterBackward's
  // length as it measured itself (less 2 ms for the trainer's own clock
  // reads around it): a sleep that overran under load shortens it.
  EXPECT_GE(timing.hookSeconds, 4 * 0.030);
  ASSERT_EQ(slow.backward.size(), 4u);
  double computeAtLeast = 0;
  for (double b : slow.backward) computeAtLeast += std::max(0.0, 0.050 - b - 0.002);
  EXPECT_GE(timing.computeSeconds, computeAtLeast);
  EXPECT_GT(timing.computeSeconds, 0.0);
  // Both within the steps' wall time, and between them all of it but the
  // calls' own overhead.
  EXPECT_LE(timing.hookSeconds + timing.computeSeconds, wall);
  EXPECT_GE(timing.hookSeconds + timing.computeSeconds, 0.9 * wall);
}

// A worker calls the BLAS from two threads at once (training, and the
// evaluation on its own thread), and the synchronizers' tests run several
// workers in one process: the BLAS in use must give each call its own
// result. OpenBLAS's sequential build as Debian ships it has no locks, and
// its concurrent products came out wrong (flat and hierarchical allreduce
// differed by 4e-4 after one step in about one run of ten).
TEST(TrainBlas, ProductsFromSeveralThreadsAtOnceAreEachTheirOwn) {
  setBlasThreads(1);  // as the workers of sync_test, one thread per call
  const BlasInfo blas = blasInfo();
  // The mlp's forward and backward (addmm with its bias, the products of
  // the gradients with transposed operands), four workers' worth.
  struct Problem {
    torch::nn::Sequential model{nullptr};
    torch::Tensor x;
    std::vector<torch::Tensor> grads;
  };
  const auto gradients = [](Problem& p) {
    p.model->zero_grad();
    p.model->forward(p.x).logsumexp(1).sum().backward();
    std::vector<torch::Tensor> out;
    for (const auto& param : p.model->parameters()) out.push_back(param.grad().clone());
    return out;
  };
  std::vector<Problem> problems(4);
  for (size_t i = 0; i < problems.size(); ++i) {
    torch::manual_seed(static_cast<uint64_t>(i) + 5);
    Problem& p = problems[i];
    p.model = torch::nn::Sequential(torch::nn::Linear(784, 256), torch::nn::ReLU(),
                                    torch::nn::Linear(256, 10));
    p.x = torch::randn({64, 784});
    p.grads = gradients(p);
  }
  // 800 rounds caught the sequential build in 5 runs of 5 (1 s on OpenBLAS;
  // the reference BLAS, 13 times slower, has no shared buffers to race on).
  const int rounds = blas.openblas ? 800 : 100;
  std::atomic<int> wrong{0};
  const auto work = [&](Problem& p) {
    for (int i = 0; i < rounds; ++i) {
      const auto g = gradients(p);
      for (size_t j = 0; j < g.size(); ++j) {
        if (!torch::equal(g[j], p.grads[j])) ++wrong;
      }
    }
  };
  std::vector<std::thread> threads;
  for (Problem& p : problems) threads.emplace_back(work, std::ref(p));
  for (auto& t : threads) t.join();
  EXPECT_EQ(wrong.load(), 0) << "BLAS " << blas.library << " ("
                             << blas.openblas.value_or("not OpenBLAS") << ", " << blas.parallel
                             << ") is not safe to call from several threads";
}

// The warning a worker logs about its BLAS.
TEST(TrainBlas, TheReferenceAndTheSequentialOpenBlasAreWarnedOf) {
  BlasInfo reference;
  reference.library = "/usr/lib/x86_64-linux-gnu/blas/libblas.so.3";
  EXPECT_NE(blasWarning(reference).value_or("").find("apt-get install libopenblas0-pthread"),
            std::string::npos);
  BlasInfo serial;
  serial.openblas = "OpenBLAS 0.3.21";
  serial.parallel = "sequential";
  EXPECT_NE(blasWarning(serial).value_or("").find("not safe to call from two threads"),
            std::string::npos);
  BlasInfo pthreads = serial;
  pthreads.parallel = "pthreads";
  EXPECT_EQ(blasWarning(pthreads), std::nullopt);
  // And this process's: setBlasThreads reaches OpenBLAS where it is the BLAS
  // (2 and back: the other tests run with one thread per call).
  if (blasInfo().openblas) {
    setBlasThreads(2);
    EXPECT_EQ(blasInfo().threads, 2);
    setBlasThreads(1);
    EXPECT_EQ(blasInfo().threads, 1);
  }
}

// Runs `steps` steps; returns the first loss and the mean of the last 20.
std::pair<double, double> lossDrop(Trainer& t, int64_t steps) {
  double first = 0, lastMean = 0;
  for (int64_t i = 0; i < steps; ++i) {
    auto st = t.step();
    EXPECT_TRUE(st.ok()) << st.status().toString();
    if (!st.ok()) break;
    if (i == 0) first = st->loss;
    if (i >= steps - 20) lastMean += st->loss / 20;
  }
  return {first, lastMean};
}

TEST(TrainTorchScript, UserModelTrainsFromCpp) {
  TrainerOptions o;
  o.steps = 300;
  auto t = makeTrainer({"", GEO_TEST_DATA_DIR "/tiny_mlp.pt"}, o);
  const auto [first, lastMean] = lossDrop(*t, o.steps);
  EXPECT_GT(first, 1.8);  // untrained: about ln(10) = 2.3
  EXPECT_LT(lastMean, 0.35 * first);
  EXPECT_GE(*t->evaluate().accuracy, 0.75);
}

fs::path tempDir(const std::string& name) {
  const fs::path p = fs::temp_directory_path() / (name + "-" + std::to_string(::getpid()));
  fs::remove_all(p);
  return p;
}

// A hook with state of its own, to show the synchronizer slot round-trips.
class CountingHook : public StepHook {
 public:
  Status afterStep(int64_t, FlatParameters&) override {
    ++steps_;
    return {};
  }
  void saveState(torch::serialize::OutputArchive& a) override {
    a.write("steps", torch::tensor(steps_));
  }
  Status loadState(torch::serialize::InputArchive& a) override {
    torch::Tensor t;
    a.read("steps", t);
    steps_ = t.item<int64_t>();
    return {};
  }
  int64_t steps_ = 0;
};

// ---- Export --------------------------------------------------------------------

// The exported files give back the trained model: the TorchScript module
// computes the same outputs (the same ops, to float rounding) and the state dict
// holds every parameter and buffer by name. Python's side (torch.load,
// torch.jit.load) is tests/worker/train/export_python_test.py.
TEST(TrainExport, TorchScriptAndStateDictGiveTheModelBack) {
  const auto& data = fashion();
  ASSERT_GT(data.test.size(), 0);
  const torch::Tensor images = data.test.inputs.narrow(0, 0, 64);
  for (const std::string builtin : {"mlp", "cnn", "resnet18", "gpt"}) {
    SCOPED_TRACE(builtin);
    torch::manual_seed(3);
    ModelSpec spec{builtin, ""};
    std::vector<int64_t> shape{1, 28, 28};
    torch::Tensor x = images;
    if (builtin == "resnet18") {
      shape = {3, 32, 32};
      x = torch::randn({8, 3, 32, 32});
    } else if (builtin == "gpt") {
      spec.width = 32;
      spec.layers = 2;
      spec.heads = 4;
      spec.context = 16;
      shape = {16};
      x = torch::randint(0, 50, {4, 16}, torch::kLong);
    }
    auto m = makeModel(spec, shape, builtin == "gpt" ? 50 : 10);
    ASSERT_TRUE(m.ok()) << m.status().toString();
    if (builtin == "resnet18") {
      // Running statistics of their own, as after training (fresh ones are
      // 0 and 1, which would not show them being read).
      torch::NoGradGuard noGrad;
      for (auto& [name, t] : (*m)->namedBuffers()) {
        if (name.ends_with("running_mean")) t.uniform_(-0.5, 0.5);
        if (name.ends_with("running_var")) t.uniform_(0.5, 2.0);
      }
    }
    (*m)->setTraining(false);
    const fs::path dir = tempDir("geo-export-" + builtin);
    auto written = exportModel(**m, dir, "{\"model\": \"test\"}\n");
    ASSERT_TRUE(written.ok()) << written.status().toString();
    EXPECT_TRUE(fs::exists(dir / "model.pt"));
    EXPECT_TRUE(fs::exists(dir / "model.json"));
    EXPECT_FALSE(fs::exists(dir / "model.pt.partial"));
    // The state dict, read back as torch.load would.
    std::ifstream in(dir / "model.pt", std::ios::binary);
    const std::vector<char> bytes{std::istreambuf_iterator<char>(in),
                                  std::istreambuf_iterator<char>()};
    const auto state = torch::pickle_load(bytes).toGenericDict();
    const auto params = (*m)->namedParameters();
    const auto buffers = (*m)->namedBuffers();
    EXPECT_EQ(state.size(), params.size() + buffers.size());
    for (const auto& [name, t] : params) {
      ASSERT_TRUE(state.contains(name)) << name;
      EXPECT_TRUE(torch::equal(state.at(name).toTensor(), t)) << name;
    }
    ASSERT_EQ(written->size(), 3u);
    torch::jit::Module loaded = torch::jit::load((dir / "model.torchscript.pt").string());
    torch::NoGradGuard noGrad;
    const torch::Tensor want = (*m)->forward(x);
    const torch::Tensor got = loaded.forward({x}).toTensor();
    ASSERT_EQ(got.sizes(), want.sizes());
    // The same ops; TorchScript's executor may block them differently, so
    // equal to float rounding rather than bit for bit.
    EXPECT_TRUE(torch::allclose(got, want, 1e-4, 1e-5)) << (got - want).abs().max().item<float>();
    std::vector<std::string> names;
    for (const auto& p : loaded.named_parameters()) names.push_back(p.name);
    EXPECT_EQ(names.size(), params.size());
    if (builtin == "resnet18") {
      // In training mode the module normalizes by the batch, as the C++
      // model does.
      (*m)->setTraining(true);
      loaded.train();
      const torch::Tensor wantTrain = (*m)->forward(x);
      const torch::Tensor gotTrain = loaded.forward({x}).toTensor();
      EXPECT_TRUE(torch::allclose(gotTrain, wantTrain, 1e-4, 1e-5))
          << (gotTrain - wantTrain).abs().max().item<float>();
      EXPECT_FALSE(torch::allclose(gotTrain, got, 1e-3, 1e-3));
    }
    if (builtin == "gpt") {
      // Causal: a later token does not change an earlier position's logits.
      torch::Tensor y = x.clone();
      y.select(1, 15).fill_(7);
      const torch::Tensor changed = loaded.forward({y}).toTensor();
      EXPECT_TRUE(torch::allclose(changed.narrow(1, 0, 15), got.narrow(1, 0, 15), 1e-5, 1e-6));
      // A window longer than the context is refused, naming the key.
      try {
        loaded.forward({torch::zeros({1, 17}, torch::kLong)});
        ADD_FAILURE() << "a window of 17 tokens ran on a context of 16";
      } catch (const std::exception& e) {  // torch::jit::JITException
        EXPECT_NE(std::string(e.what()).find("model.context"), std::string::npos) << e.what();
      }
    }
    fs::remove_all(dir);
  }
  // A folder that cannot be made is named.
  torch::manual_seed(3);
  auto m = makeModel({"mlp", ""}, {1, 28, 28}, 10);
  ASSERT_TRUE(m.ok());
  auto refused = exportModel(**m, "/proc/geotrain-export", "{}");
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("/proc/geotrain-export"), std::string::npos)
      << refused.status().toString();
}

// The mlp's linear layers compute their own backward
// (AccumulatingLinear, model.cc): a weight's gradient is added to the
// gradient tensor it has (which stays the trainer's flat buffer) and made
// where it has none, equal to autograd's to float rounding; biases and
// inputs get theirs as autograd would. (What it saves, the transient
// weight-sized gradient, shows in a worker's peak memory:
// docs/algorithms.md, "Memory".)
TEST(TrainModels, MlpWeightGradientsAreAddedToTheirBuffersInPlace) {
  torch::manual_seed(5);
  auto m = makeModel({"mlp", ""}, {1, 28, 28}, 10);
  ASSERT_TRUE(m.ok());
  const auto params = (*m)->namedParameters();
  ASSERT_EQ(params.size(), 4u);  // fc1 weight, bias, fc2 weight, bias
  const auto x = torch::randn({8, 1, 28, 28});
  const auto y = torch::randint(0, 10, {8});
  // The reference: the same products, autograd's own gradients.
  std::vector<torch::Tensor> ref;
  for (const auto& [name, p] : params) ref.push_back(p.detach().clone().requires_grad_(true));
  {
    auto h = torch::relu(torch::addmm(ref[1], x.flatten(1), ref[0].t()));
    torch::nn::functional::cross_entropy(torch::addmm(ref[3], h, ref[2].t()), y).backward();
  }
  // A hook on a weight sees the gradient autograd would add to it: none
  // reaches it where the layer added its own in place.
  int hooked = 0;
  torch::Tensor w0 = params[0].second;
  w0.register_hook([&hooked](const torch::Tensor&) { ++hooked; });
  for (bool preset : {true, false}) {
    hooked = 0;
    std::vector<const float*> storage;
    for (const auto& [name, p] : params) {
      torch::Tensor p2 = p;
      p2.mutable_grad() = preset ? torch::full_like(p, 0.5f) : torch::Tensor();
      storage.push_back(preset ? p2.grad().data_ptr<float>() : nullptr);
    }
    torch::nn::functional::cross_entropy((*m)->forward(x), y).backward();
    for (size_t i = 0; i < params.size(); ++i) {
      const torch::Tensor& g = params[i].second.grad();
      ASSERT_TRUE(g.defined()) << params[i].first;
      const torch::Tensor expect = preset ? ref[i].grad() + 0.5f : ref[i].grad();
      EXPECT_TRUE(torch::allclose(g, expect, 1e-5, 1e-6))
          << params[i].first << " preset " << preset;
      if (preset && i % 2 == 0) {
        EXPECT_EQ(g.data_ptr<float>(), storage[i])
            << params[i].first << ": its buffer was replaced";
      }
    }
    EXPECT_EQ(hooked, preset ? 0 : 1) << "preset " << preset;
  }
}

// InPlaceSgd takes LibTorch's SGD steps bit for bit (parameters and
// momentum buffers), with weight decay, dampening and Nesterov or not, and
// its state saves and loads as LibTorch's does.
TEST(TrainOptimizer, InPlaceSgdIsLibTorchsSgdBitForBit) {
  for (bool nesterov : {true, false}) {
    torch::manual_seed(9);
    std::vector<torch::Tensor> mine{torch::randn({300}), torch::randn({7, 5})};
    std::vector<torch::Tensor> theirs;
    for (auto& p : mine) {
      p.requires_grad_(true);
      theirs.push_back(p.detach().clone().requires_grad_(true));
    }
    auto options = torch::optim::SGDOptions(0.05).momentum(0.9).weight_decay(1e-3);
    if (nesterov) {
      options.nesterov(true);
    } else {
      options.dampening(0.1);
    }
    InPlaceSgd a(mine, options);
    torch::optim::SGD b(theirs, options);
    for (int step = 0; step < 4; ++step) {
      for (size_t i = 0; i < mine.size(); ++i) {
        const auto g = torch::randn(mine[i].sizes());
        mine[i].mutable_grad() = g.clone();
        theirs[i].mutable_grad() = g.clone();
      }
      a.step();
      b.step();
      for (size_t i = 0; i < mine.size(); ++i) {
        EXPECT_TRUE(torch::equal(mine[i], theirs[i]))
            << "step " << step << " nesterov " << nesterov;
      }
    }
    torch::serialize::OutputArchive saved;
    a.save(saved);
    std::ostringstream bytes;
    saved.save_to(bytes);
    torch::optim::SGD c(theirs, options);
    torch::serialize::InputArchive in;
    std::istringstream from(bytes.str());
    in.load_from(from);
    c.load(in);
    ASSERT_EQ(c.state().size(), mine.size());
  }
}

// Tabular inputs and more than ten outputs: the mlp takes any sample shape;
// the image models say what they need.
TEST(TrainModels, AnyInputShapeForTheMlpImagesForTheOthers) {
  auto m = makeModel({"mlp", ""}, {12}, 37);
  ASSERT_TRUE(m.ok()) << m.status().toString();
  EXPECT_EQ((*m)->forward(torch::zeros({5, 12})).sizes(), (std::vector<int64_t>{5, 37}));
  auto cnn = makeModel({"cnn", ""}, {12}, 3);
  ASSERT_FALSE(cnn.ok());
  EXPECT_NE(cnn.status().message().find("cnn takes images [C, H, W]; the data's samples are [12]"),
            std::string::npos)
      << cnn.status().toString();
}

// The gpt: next-token logits for every position, each depending only on the
// tokens up to it (the causal mask), and the size its keys ask for.
TEST(TrainModels, GptIsCausalAndSizedByItsKeys) {
  torch::manual_seed(5);
  ModelSpec spec{"gpt", ""};
  spec.width = 32;
  spec.layers = 2;
  spec.heads = 4;
  spec.context = 16;
  auto m = makeModel(spec, {16}, 256);
  ASSERT_TRUE(m.ok()) << m.status().toString();
  // Embeddings 256 x 32 + 16 x 32, per block 4 * 32 * 32 * 3 + biases and
  // norms, the head 32 x 256.
  const int64_t block =
      2 * 32 + (32 * 96 + 96) + (32 * 32 + 32) + 2 * 32 + (32 * 128 + 128) + (128 * 32 + 32);
  EXPECT_EQ((*m)->parameterCount(), 256 * 32 + 16 * 32 + 2 * block + 2 * 32 + 32 * 256);
  (*m)->setTraining(false);
  torch::NoGradGuard noGrad;
  const torch::Tensor ids = torch::randint(0, 256, {3, 16}, torch::kLong);
  const torch::Tensor out = (*m)->forward(ids);
  EXPECT_EQ(out.sizes(), (std::vector<int64_t>{3, 16, 256}));
  // Change the last eight tokens: the first eight positions' logits stay.
  torch::Tensor changed = ids.clone();
  changed.narrow(1, 8, 8).fill_(7);
  const torch::Tensor again = (*m)->forward(changed);
  EXPECT_TRUE(torch::allclose(again.narrow(1, 0, 8), out.narrow(1, 0, 8), 1e-5, 1e-6));
  EXPECT_FALSE(torch::allclose(again.narrow(1, 8, 8), out.narrow(1, 8, 8), 1e-5, 1e-6));
  spec.heads = 5;
  auto odd = makeModel(spec, {16}, 256);
  ASSERT_FALSE(odd.ok());
  EXPECT_NE(odd.status().message().find("model.heads: 5 is not allowed"), std::string::npos);
  auto images = makeModel({"gpt", ""}, {1, 28, 28}, 10);
  ASSERT_FALSE(images.ok());
  EXPECT_NE(images.status().message().find("gpt takes token ids"), std::string::npos);
}

TEST(TrainCheckpoint, ResumeGivesBitwiseTheSameParameters) {
  TrainerOptions o;
  o.steps = 60;
  o.optimizer = "sgd";
  o.schedule = "cosine";  // depends on the step: resume must restore it
  o.gradClip = 5;
  CountingHook straightHook;
  auto straight = makeTrainer({"mlp", {}}, o, &straightHook);
  ASSERT_TRUE(straight->run({}).ok());

  // The same run stopped after 30 steps...
  o.checkpointDir = tempDir("geo-resume");
  CountingHook firstHook;
  auto first = makeTrainer({"mlp", {}}, o, &firstHook);
  for (int i = 0; i < 30; ++i) ASSERT_TRUE(first->step().ok());
  ASSERT_TRUE(first->saveCheckpoint().ok());
  first.reset();
  // ...and continued by a new trainer with different initial weights:
  // everything must come from the checkpoint.
  CountingHook secondHook;
  auto second = makeTrainer({"mlp", {}}, o, &secondHook, /*initSeed=*/999);
  auto resumed = second->resume();
  ASSERT_TRUE(resumed.ok()) << resumed.status().toString();
  EXPECT_EQ(*resumed, 30);
  EXPECT_EQ(secondHook.steps_, 30);
  ASSERT_TRUE(second->run({}).ok());
  EXPECT_TRUE(torch::equal(straight->flat().values, second->flat().values));
  EXPECT_EQ(secondHook.steps_, 60);
  fs::remove_all(o.checkpointDir);
}

TEST(TrainCheckpoint, InterruptedWriteNeverReplacesTheLastGoodOne) {
  TrainerOptions o;
  o.steps = 10;
  o.checkpointDir = tempDir("geo-ckpt");
  auto t = makeTrainer({"mlp", {}}, o);
  ASSERT_TRUE(t->run({}).ok());  // ckpt at step 10
  const auto good = t->flat().values.clone();
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(t->step().ok());
  // Crash between writing the temporary file and renaming it.
  t->beforeCheckpointRename = [] { throw std::runtime_error("simulated crash"); };
  EXPECT_THROW((void)t->saveCheckpoint(), std::runtime_error);
  // And a newest "checkpoint" that is garbage (e.g. a torn copy).
  std::ofstream(o.checkpointDir / "ckpt-0000000020.pt") << "not a checkpoint";

  o.steps = 20;
  auto fresh = makeTrainer({"mlp", {}}, o, nullptr, 5);
  auto resumed = fresh->resume();
  ASSERT_TRUE(resumed.ok()) << resumed.status().toString();
  EXPECT_EQ(*resumed, 10);
  EXPECT_TRUE(torch::equal(fresh->flat().values, good));
  fs::remove_all(o.checkpointDir);
}

TEST(TrainCheckpoint, KeepsOnlyTheNewest) {
  TrainerOptions o;
  o.steps = 50;
  o.checkpointInterval = 10;
  o.keepCheckpoints = 2;
  o.checkpointDir = tempDir("geo-keep");
  auto t = makeTrainer({"mlp", {}}, o);
  ASSERT_TRUE(t->run({}).ok());
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(o.checkpointDir)) {
    names.push_back(e.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"ckpt-0000000040.pt", "ckpt-0000000040.pt.sum",
                                             "ckpt-0000000050.pt", "ckpt-0000000050.pt.sum"}));
  fs::remove_all(o.checkpointDir);
}

// Checkpoint integrity: what resume() refuses, and what rotation keeps.

// Collects what the "geo" logger writes while it lives.
class LogCapture {
 public:
  LogCapture() { logger()->sinks().push_back(sink_); }
  ~LogCapture() {
    auto& sinks = logger()->sinks();
    sinks.erase(std::remove(sinks.begin(), sinks.end(), sink_), sinks.end());
  }
  std::string text() {
    sink_->flush();
    return out_.str();
  }

 private:
  std::ostringstream out_;
  std::shared_ptr<spdlog::sinks::ostream_sink_mt> sink_ =
      std::make_shared<spdlog::sinks::ostream_sink_mt>(out_);
};

std::vector<std::string> fileNames(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

std::string readAll(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void writeAll(const fs::path& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

const ModelSpec kMlp{"mlp", {}};

// Writes ckpt-10 and ckpt-20 (mlp, sgd) into `o.checkpointDir`, then lets
// `spoil` write a ckpt-30 that must be refused. A new worker must resume from
// ckpt-20 with a warning naming ckpt-30 and containing `expected`; keeping one
// checkpoint, its next one is kept beside the refused ckpt-30 (which is the
// newest by name), and a third worker resumes from that.
void expectNewestRefused(const std::string& name, const std::function<void(TrainerOptions)>& spoil,
                         const std::string& expected) {
  SCOPED_TRACE(name);
  TrainerOptions o;
  o.steps = 20;
  o.checkpointInterval = 10;
  o.checkpointDir = tempDir(name);
  auto good = makeTrainer(kMlp, o);
  ASSERT_TRUE(good->run({}).ok());
  const auto at20 = good->flat().values.clone();
  good.reset();
  spoil(o);
  ASSERT_TRUE(fs::exists(o.checkpointDir / "ckpt-0000000030.pt"));

  o.steps = 100;
  o.keepCheckpoints = 1;
  LogCapture log;
  auto fresh = makeTrainer(kMlp, o, nullptr, /*initSeed=*/7);
  auto resumed = fresh->resume();
  ASSERT_TRUE(resumed.ok()) << resumed.status().toString();
  EXPECT_EQ(*resumed, 20);
  EXPECT_TRUE(torch::equal(fresh->flat().values, at20));
  const std::string warnings = log.text();
  EXPECT_NE(warnings.find("skipping checkpoint: checkpoint " +
                          (o.checkpointDir / "ckpt-0000000030.pt").string()),
            std::string::npos)
      << warnings;
  EXPECT_NE(warnings.find(expected), std::string::npos) << warnings;
  EXPECT_EQ(warnings.find("resumed from " + (o.checkpointDir / "ckpt-0000000030.pt").string()),
            std::string::npos)
      << warnings;

  ASSERT_TRUE(fresh->step().ok());
  ASSERT_TRUE(fresh->saveCheckpoint().ok());
  const auto at21 = fresh->flat().values.clone();
  fresh.reset();
  EXPECT_EQ(fileNames(o.checkpointDir),
            (std::vector<std::string>{"ckpt-0000000021.pt", "ckpt-0000000021.pt.sum",
                                      "ckpt-0000000030.pt", "ckpt-0000000030.pt.sum"}));
  auto again = makeTrainer(kMlp, o, nullptr, /*initSeed=*/8);
  resumed = again->resume();
  ASSERT_TRUE(resumed.ok()) << resumed.status().toString();
  EXPECT_EQ(*resumed, 21);
  EXPECT_TRUE(torch::equal(again->flat().values, at21));
  fs::remove_all(o.checkpointDir);
}

// The store alone, bytes in and out: newest first, verified when its
// sidecar matches, refused by name when not, rotated to `keep` -- keeping
// one that verifies when none of the newest does.
TEST(CheckpointStore, WritesVerifiesAndRotates) {
  const fs::path dir = fs::temp_directory_path() / ("geo-store-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  CheckpointStore store(dir, 2);
  bool renamed = false;
  ASSERT_TRUE(store.write(10, "ten", [&] { renamed = true; }).ok());
  EXPECT_TRUE(renamed);  // the seam runs between the writes and the renames
  ASSERT_TRUE(store.write(20, "twenty").ok());
  const auto listed = store.list();
  ASSERT_EQ(listed.size(), 2u);
  EXPECT_EQ(listed[0].first, 20);
  EXPECT_EQ(listed[1].first, 10);
  auto read = CheckpointStore::read(listed[0].second);
  ASSERT_TRUE(read.ok()) << read.status().toString();
  EXPECT_EQ(read->bytes, "twenty");
  EXPECT_TRUE(read->verified);
  // Damaged: refused, naming the file.
  writeAll(listed[0].second, "twentY");
  read = CheckpointStore::read(listed[0].second);
  ASSERT_FALSE(read.ok());
  EXPECT_NE(read.status().message().find("ckpt-0000000020.pt is corrupt"), std::string::npos)
      << read.status().message();
  // Rotation keeps the newest two: 10 goes, with its sidecar.
  ASSERT_TRUE(store.write(30, "thirty").ok());
  const auto stepsIn = [&](const CheckpointStore& s) {
    std::vector<int64_t> steps;
    for (const auto& [step, path] : s.list()) steps.push_back(step);
    return steps;
  };
  EXPECT_EQ(stepsIn(store), (std::vector<int64_t>{30, 20}));
  EXPECT_FALSE(fs::exists(dir / "ckpt-0000000010.pt.sum"));
  // A resume that refused 30 (another model, say) and trains on from an
  // older step: with keep 1, the refused 30 is the newest, so the one just
  // written that verifies is kept as well, and the rest go.
  CheckpointStore one(dir, 1);
  one.refuse(dir / "ckpt-0000000030.pt");
  ASSERT_TRUE(one.write(25, "twenty-five").ok());
  EXPECT_EQ(stepsIn(one), (std::vector<int64_t>{30, 25}));
  EXPECT_FALSE(fs::exists(dir / "ckpt-0000000020.pt.sum"));
  fs::remove_all(dir);
}

// A ckpt-30 of the same configuration (another seed), then damaged by `damage`.
std::function<void(TrainerOptions)> damagedNewest(
    const std::function<void(const fs::path&)>& damage) {
  return [damage](TrainerOptions o) {
    o.steps = 30;
    o.checkpointInterval = 30;
    auto other = makeTrainer(kMlp, o, nullptr, /*initSeed=*/3);
    ASSERT_TRUE(other->run({}).ok());
    damage(o.checkpointDir / "ckpt-0000000030.pt");
  };
}

TEST(TrainCheckpointIntegrity, BitFlipsAreRefused) {
  expectNewestRefused("geo-bitflip", damagedNewest([](const fs::path& p) {
                        std::string bytes = readAll(p);
                        for (size_t i = 0; i < 64; ++i) bytes[bytes.size() / 2 + i] ^= '\xff';
                        writeAll(p, bytes);
                      }),
                      "is corrupt: its SHA-256 is");
}

TEST(TrainCheckpointIntegrity, TruncationIsRefused) {
  expectNewestRefused("geo-truncated", damagedNewest([](const fs::path& p) {
                        fs::resize_file(p, fs::file_size(p) / 2);
                      }),
                      "ckpt-0000000030.pt is truncated");
}

TEST(TrainCheckpointIntegrity, ZeroFilledBlockIsRefused) {
  expectNewestRefused("geo-zeroed", damagedNewest([](const fs::path& p) {
                        std::string bytes = readAll(p);
                        const size_t start = bytes.size() / 2 / 4096 * 4096;
                        std::fill_n(bytes.begin() + static_cast<std::ptrdiff_t>(start), 4096, '\0');
                        writeAll(p, bytes);
                      }),
                      "is corrupt: its SHA-256 is");
}

TEST(TrainCheckpointIntegrity, AnotherModelIsRefusedByName) {
  expectNewestRefused(
      "geo-othermodel",
      [](TrainerOptions o) {
        o.steps = 30;
        o.checkpointInterval = 30;
        auto cnn = makeTrainer({"cnn", {}}, o);
        ASSERT_TRUE(cnn->run({}).ok());
      },
      "was written for model 'cnn conv16-conv32-128' with");
}

TEST(TrainCheckpointIntegrity, AnotherOptimizerIsRefusedByName) {
  expectNewestRefused(
      "geo-otheroptimizer",
      [](TrainerOptions o) {
        o.steps = 30;
        o.checkpointInterval = 30;
        o.optimizer = "adam";
        o.lr = 1e-3;
        auto adam = makeTrainer(kMlp, o);
        ASSERT_TRUE(adam->run({}).ok());
      },
      "was written for optimizer adam, this worker uses sgd (training.optimizer)");
}

// Checkpoints of an older version have no checksum file: loaded, with a
// warning. One of those with a NaN in its parameters is refused.
TEST(TrainCheckpointIntegrity, UncheckedCheckpointsLoadWithAWarningUnlessNotFinite) {
  TrainerOptions o;
  o.steps = 20;
  o.checkpointInterval = 10;
  o.checkpointDir = tempDir("geo-legacy");
  auto t = makeTrainer(kMlp, o);
  ASSERT_TRUE(t->run({}).ok());
  const auto at20 = t->flat().values.clone();
  // The last 16 values of the parameters (the output bias) as stored.
  const auto tail = t->flat().values.narrow(0, t->flat().values.numel() - 16, 16).contiguous();
  const std::string pattern(static_cast<const char*>(tail.data_ptr()), 16 * sizeof(float));
  t.reset();
  fs::remove(o.checkpointDir / "ckpt-0000000010.pt.sum");
  fs::remove(o.checkpointDir / "ckpt-0000000020.pt.sum");
  {
    LogCapture log;
    auto fresh = makeTrainer(kMlp, o, nullptr, 7);
    auto resumed = fresh->resume();
    ASSERT_TRUE(resumed.ok()) << resumed.status().toString();
    EXPECT_EQ(*resumed, 20);
    EXPECT_TRUE(torch::equal(fresh->flat().values, at20));
    EXPECT_NE(log.text().find("ckpt-0000000020.pt has no checksum file"), std::string::npos)
        << log.text();
  }
  std::string bytes = readAll(o.checkpointDir / "ckpt-0000000020.pt");
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::string nans(16 * sizeof(float), '\0');
  for (size_t i = 0; i < 16; ++i) std::memcpy(nans.data() + i * sizeof(float), &nan, sizeof nan);
  size_t replaced = 0;
  for (size_t at = bytes.find(pattern); at != std::string::npos; at = bytes.find(pattern, at)) {
    bytes.replace(at, pattern.size(), nans);
    ++replaced;
  }
  ASSERT_GT(replaced, 0u);
  writeAll(o.checkpointDir / "ckpt-0000000020.pt", bytes);
  LogCapture log;
  auto fresh = makeTrainer(kMlp, o, nullptr, 7);
  auto resumed = fresh->resume();
  ASSERT_TRUE(resumed.ok()) << resumed.status().toString();
  EXPECT_EQ(*resumed, 10);
  EXPECT_NE(log.text().find("ckpt-0000000020.pt is corrupt: parameter '"), std::string::npos)
      << log.text();
  EXPECT_TRUE(torch::isfinite(fresh->flat().values).all().item<bool>());
  fs::remove_all(o.checkpointDir);
}

TEST(TrainCheckpointIntegrity, NoneVerifyingIsDataLossNamingTheFolder) {
  TrainerOptions o;
  o.steps = 10;
  o.checkpointDir = tempDir("geo-noneverifies");
  auto t = makeTrainer(kMlp, o);
  ASSERT_TRUE(t->run({}).ok());
  t.reset();
  const fs::path p = o.checkpointDir / "ckpt-0000000010.pt";
  std::string bytes = readAll(p);
  for (size_t i = 0; i < 64; ++i) bytes[bytes.size() / 2 + i] ^= '\xff';
  writeAll(p, bytes);
  auto fresh = makeTrainer(kMlp, o, nullptr, 7);
  auto resumed = fresh->resume();
  ASSERT_FALSE(resumed.ok());
  EXPECT_EQ(resumed.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(resumed.status().message().find("no checkpoint in " + o.checkpointDir.string()),
            std::string::npos)
      << resumed.status().toString();
  EXPECT_NE(resumed.status().message().find("ckpt-0000000010.pt is corrupt"), std::string::npos)
      << resumed.status().toString();
  fs::remove_all(o.checkpointDir);
}

// Sets one gradient to NaN at `step` and the parameter back to a finite
// value after the optimizer step: only the optimizer state is poisoned.
// A peer that answered after its last step and before its final average:
// the job's step is the last one, and the peers count on this worker in the
// final average. The trainer takes no step, runs finish() at once and ends
// holding what it leaves -- the job's final model.
class JoinsAtTheLastStepHook : public StepHook {
 public:
  explicit JoinsAtTheLastStepHook(int64_t jobStep) : jobStep_(jobStep) {}
  StatusOr<JoinResult> join(int64_t, FlatParameters& flat) override {
    flat.values.fill_(0.25f);  // the peer's model at its last step
    return JoinResult{jobStep_, false};
  }
  Status afterBackward(int64_t, FlatParameters&) override {
    ++steps;
    return {};
  }
  Status finish(int64_t s, FlatParameters& flat) override {
    finishedAt.push_back(s);
    flat.values.fill_(0.5f);  // the final average
    return {};
  }
  int64_t steps = 0;
  std::vector<int64_t> finishedAt;

 private:
  int64_t jobStep_;
};

TEST(TrainJoin, AJoinAtTheLastStepTakesPartInTheFinalAverage) {
  TrainerOptions o;
  o.steps = 30;
  o.evalInterval = 0;
  JoinsAtTheLastStepHook hook(/*jobStep=*/30);
  auto t = makeTrainer(kMlp, o, &hook);
  ASSERT_TRUE(t->run([](const StepStats&) {}).ok());
  EXPECT_EQ(hook.steps, 0);
  EXPECT_EQ(hook.finishedAt, (std::vector<int64_t>{30}));
  EXPECT_TRUE(t->arrivedAfterEnd());
  EXPECT_TRUE(t->holdsFinalModel());
  EXPECT_EQ(t->currentStep(), 30);
  EXPECT_TRUE(torch::all(t->flat().values == 0.5f).item<bool>());

  // A step before the last: it trains the rest, then finishes once.
  JoinsAtTheLastStepHook earlier(/*jobStep=*/25);
  auto u = makeTrainer(kMlp, o, &earlier);
  ASSERT_TRUE(u->run([](const StepStats&) {}).ok());
  EXPECT_EQ(earlier.steps, 5);
  EXPECT_EQ(earlier.finishedAt, (std::vector<int64_t>{30}));
  EXPECT_FALSE(u->arrivedAfterEnd());
}

class PoisonOptimizerHook : public StepHook {
 public:
  explicit PoisonOptimizerHook(int64_t step) : step_(step) {}
  Status afterBackward(int64_t step, FlatParameters& flat) override {
    if (step == step_) flat.grads[0] = std::numeric_limits<float>::quiet_NaN();
    return {};
  }
  Status afterStep(int64_t step, FlatParameters& flat) override {
    if (step == step_) flat.values[0] = 0.0f;
    return {};
  }

 private:
  int64_t step_;
};

// A checkpoint folder on a file system that fills up (a tmpfs of 8 MiB):
// the writes that find no space fail, are logged and counted, leave nothing
// behind and no earlier checkpoint touched, and training goes on; once space
// is freed the next write succeeds, and a new worker resumes from it. Needs
// root (mount); skipped elsewhere.
TEST(TrainCheckpoint, AFullDiskCostsACheckpointNotTheJob) {
  if (::geteuid() != 0) GTEST_SKIP() << "mounting a tmpfs needs root";
  const fs::path disk = tempDir("geo-fulldisk");
  fs::create_directories(disk);
  if (std::system(("mount -t tmpfs -o size=8m geo-fulldisk " + disk.string()).c_str()) != 0) {
    fs::remove_all(disk);
    GTEST_SKIP() << "cannot mount a tmpfs on " << disk;
  }
  struct Unmount {
    fs::path path;
    ~Unmount() {
      (void)std::system(("umount " + path.string()).c_str());
      fs::remove_all(path);
    }
  } unmount{disk};

  TrainerOptions o;
  o.steps = 50;
  o.checkpointInterval = 10;
  o.keepCheckpoints = 5;
  o.checkpointDir = disk / "ckpt";
  auto t = makeTrainer(kMlp, o);
  const fs::path filler = disk / "filler";
  // After the checkpoint of step 10, fill the disk; after step 30's, free it.
  t->setAfterCheckpoint([&](int64_t step) {
    if (step == 10) {
      std::ofstream out(filler, std::ios::binary);
      const std::string mib(1 << 20, 'x');
      while (out.write(mib.data(), static_cast<std::streamsize>(mib.size()))) {
      }
    }
    if (step == 30) fs::remove(filler);
  });
  LogCapture log;
  const Status ran = t->run({});
  ASSERT_TRUE(ran.ok()) << ran.toString();
  EXPECT_EQ(t->checkpointFailures(), 2u);  // steps 20 and 30
  const std::string text = log.text();
  EXPECT_NE(text.find("checkpoint for step 20 not written: "), std::string::npos) << text;
  EXPECT_NE(text.find("No space left on device"), std::string::npos) << text;
  EXPECT_NE(text.find("training goes on"), std::string::npos) << text;
  // No temporary left behind; step 10's checkpoint untouched beside the new ones.
  EXPECT_EQ(fileNames(o.checkpointDir),
            (std::vector<std::string>{"ckpt-0000000010.pt", "ckpt-0000000010.pt.sum",
                                      "ckpt-0000000040.pt", "ckpt-0000000040.pt.sum",
                                      "ckpt-0000000050.pt", "ckpt-0000000050.pt.sum"}));
  auto fresh = makeTrainer(kMlp, o, nullptr, 5);
  auto resumed = fresh->resume();
  ASSERT_TRUE(resumed.ok()) << resumed.status().toString();
  EXPECT_EQ(*resumed, 50);
  EXPECT_TRUE(torch::equal(fresh->flat().values, t->flat().values));
}

TEST(TrainCheckpointIntegrity, NonFiniteStateIsNeverWritten) {
  TrainerOptions o;
  o.steps = 100;
  o.checkpointDir = tempDir("geo-nonfinite");
  PoisonOptimizerHook hook(/*step=*/13);
  auto t = makeTrainer(kMlp, o, &hook);
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(t->step().ok());
  ASSERT_TRUE(t->saveCheckpoint().ok());
  const auto written = fileNames(o.checkpointDir);
  ASSERT_EQ(written, (std::vector<std::string>{"ckpt-0000000010.pt", "ckpt-0000000010.pt.sum"}));
  const auto at10 = t->flat().values.clone();

  // Parameters.
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(t->step().ok());
  const float saved = t->flat().values[5].item<float>();
  t->flat().values[5] = std::numeric_limits<float>::infinity();
  Status s = t->saveCheckpoint();
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("checkpoint for step 12 not written: parameter '"), std::string::npos)
      << s.toString();
  EXPECT_EQ(fileNames(o.checkpointDir), written);
  t->flat().values[5] = saved;

  // Optimizer state (the momentum buffer), the parameters finite.
  ASSERT_TRUE(t->step().ok());
  ASSERT_TRUE(t->step().ok());  // step index 13: poisoned
  ASSERT_TRUE(torch::isfinite(t->flat().values).all().item<bool>());
  s = t->saveCheckpoint();
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("checkpoint for step 14 not written: the optimizer's momentum buffer "
                             "of parameter '"),
            std::string::npos)
      << s.toString();
  EXPECT_EQ(fileNames(o.checkpointDir), written);
  t.reset();

  auto fresh = makeTrainer(kMlp, o, nullptr, 7);
  auto resumed = fresh->resume();
  ASSERT_TRUE(resumed.ok()) << resumed.status().toString();
  EXPECT_EQ(*resumed, 10);
  EXPECT_TRUE(torch::equal(fresh->flat().values, at10));
  fs::remove_all(o.checkpointDir);
}

// Records the parameters after every step that is a multiple of `every`.
class SnapshotHook : public StepHook {
 public:
  explicit SnapshotHook(int64_t every) : every_(every) {}
  Status afterStep(int64_t step, FlatParameters& flat) override {
    if ((step + 1) % every_ == 0) snapshots[step + 1] = flat.values.clone();
    stepsDone = step + 1;
    if (onStep) onStep(step + 1);
    // Slower steps leave the low-priority evaluation thread time to finish
    // between two evaluation steps, also on a loaded machine.
    std::this_thread::sleep_for(std::chrono::milliseconds(15));
    return {};
  }
  std::map<int64_t, torch::Tensor> snapshots;
  std::atomic<int64_t> stepsDone{0};
  std::function<void(int64_t)> onStep;  // with the steps done, after each

 private:
  int64_t every_;
};

// The accuracy of an mlp with these flat parameters, evaluated in line: the
// reference for an evaluation made in the background or of a job model.
double accuracyOf(const torch::Tensor& values, const TrainerOptions& o) {
  auto t = makeTrainer({"mlp", {}}, o);
  {
    torch::NoGradGuard noGrad;
    t->flat().values.copy_(values);
  }
  return *t->evaluate().accuracy;
}

// From now on `t` evaluates periodically in the background, on a second mlp.
void evaluateInBackground(Trainer& t) {
  torch::manual_seed(99);  // a different initialisation: overwritten by each snapshot
  auto evalModel = makeModel({"mlp", {}}, {1, 28, 28}, 10);
  ASSERT_TRUE(evalModel.ok());
  ASSERT_TRUE(t.evaluateInBackground(std::move(*evalModel)).ok());
}

// The evaluator on its own: snapshots queue up to the backlog, one more is
// refused and counted, results come oldest first and measure exactly the
// snapshot's values, and abandon() drops the evaluation in flight and the
// snapshots waiting, counting each.
TEST(BackgroundEvaluatorTest, QueuesUpToItsBacklogAndCountsWhatItRefuses) {
  const Data& data = fashion();
  const auto flatOf = [](Model& m) {
    std::vector<torch::Tensor> parts;
    for (const torch::Tensor& p : m.parameters()) parts.push_back(p.detach().reshape({-1}));
    return torch::cat(parts);
  };
  torch::manual_seed(1);
  auto a = makeModel({"mlp", {}}, {1, 28, 28}, 10);
  torch::manual_seed(2);
  auto b = makeModel({"mlp", {}}, {1, 28, 28}, 10);
  torch::manual_seed(3);
  auto evalModel = makeModel({"mlp", {}}, {1, 28, 28}, 10);
  ASSERT_TRUE(a.ok() && b.ok() && evalModel.ok());
  const double accuracyA = *evaluationOf(**a, data.test, torch::kCPU)->accuracy;
  const double accuracyB = *evaluationOf(**b, data.test, torch::kCPU)->accuracy;
  ASSERT_NE(accuracyA, accuracyB);

  // The evaluation thread holds at `gate` before each evaluation.
  std::mutex mu;
  std::condition_variable cv;
  bool open = false;
  int entered = 0;
  std::function<void()> before = [&] {
    std::unique_lock lock(mu);
    ++entered;
    cv.notify_all();
    cv.wait(lock, [&] { return open; });
  };
  const auto awaitEntered = [&](int n) {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return entered >= n; });
  };
  const auto setOpen = [&](bool o) {
    std::lock_guard lock(mu);
    open = o;
    cv.notify_all();
  };
  BackgroundEvaluator evaluator(std::move(*evalModel), &data.test, torch::kCPU, &before, 1);
  EXPECT_TRUE(evaluator.submit(10, flatOf(**a), {}));
  awaitEntered(1);                                      // step 10 in flight
  EXPECT_TRUE(evaluator.submit(20, flatOf(**b), {}));   // waits in the backlog
  EXPECT_FALSE(evaluator.submit(30, flatOf(**a), {}));  // the backlog is full
  EXPECT_EQ(evaluator.skipped(), 1u);
  setOpen(true);
  std::vector<BackgroundEvaluator::Result> results;
  for (auto ready = evaluator.next(); !ready.empty(); ready = evaluator.next()) {
    results.insert(results.end(), ready.begin(), ready.end());
  }
  ASSERT_EQ(results.size(), 2u);
  EXPECT_EQ(results[0].step, 10);
  EXPECT_EQ(results[1].step, 20);
  EXPECT_LE(results[0].takenAt, results[1].takenAt);
  EXPECT_DOUBLE_EQ(*results[0].evaluation.accuracy, accuracyA);
  EXPECT_DOUBLE_EQ(*results[1].evaluation.accuracy, accuracyB);
  EXPECT_TRUE(evaluator.take().empty());

  // Abandoned: the one waiting, and the one in flight (released only once
  // abandon() has dropped the other).
  setOpen(false);
  EXPECT_TRUE(evaluator.submit(40, flatOf(**a), {}));
  awaitEntered(3);
  EXPECT_TRUE(evaluator.submit(50, flatOf(**b), {}));
  std::thread release([&] {
    // abandon() has begun once it has counted the snapshot it dropped.
    while (evaluator.skipped() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    setOpen(true);
  });
  evaluator.abandon();
  release.join();
  EXPECT_TRUE(evaluator.take().empty());
  EXPECT_EQ(evaluator.skipped(), 3u);
}

// A background evaluation measures exactly the parameters of the step it
// names: the same accuracy as a model loaded with that step's parameters
// and evaluated in line.
TEST(TrainBackgroundEval, ReportsTheAccuracyOfTheSnapshotsStep) {
  TrainerOptions o;
  o.steps = 120;
  o.evalInterval = 20;
  o.logInterval = 1000;
  SnapshotHook hook(20);
  auto t = makeTrainer({"mlp", {}}, o, &hook);
  evaluateInBackground(*t);
  std::vector<StepStats> reports;
  ASSERT_TRUE(t->run([&](const StepStats& st) { reports.push_back(st); }).ok());
  int background = 0;
  for (const StepStats& st : reports) {
    if (!st.evalAccuracy) continue;
    ASSERT_TRUE(st.evalStep.has_value());
    EXPECT_LE(*st.evalStep, st.step);
    EXPECT_EQ(*st.evalStep % 20, 0);
    if (*st.evalStep == o.steps) continue;  // the final one, in line
    ++background;
    EXPECT_GE(st.evalAgeSeconds, 0);
    EXPECT_EQ(*st.evalAccuracy, accuracyOf(hook.snapshots.at(*st.evalStep), o))
        << "step " << *st.evalStep;
  }
  EXPECT_EQ(background + static_cast<int>(t->evalsSkipped()), 5);  // steps 20..100
  // With 300 ms between evaluation steps, most finish even on a loaded
  // machine; on an idle one all do.
  EXPECT_GT(background, 0) << "no background evaluation finished";
  ASSERT_FALSE(reports.empty());
  EXPECT_EQ(reports.back().step, o.steps);
  EXPECT_EQ(reports.back().evalStep, o.steps);
}

// A hook that keeps a job model (as dts does): here the parameters of ten
// steps back.
class LaggingJobModelHook final : public SnapshotHook {
 public:
  LaggingJobModelHook() : SnapshotHook(10) {}
  std::optional<JobModel> jobModel() override {
    const int64_t step = stepsDone.load() - 10;
    if (step <= 0) return std::nullopt;
    return JobModel{step, snapshots.at(step).clone()};
  }
};

// A periodic evaluation measures the hook's job model, in line and in the
// background (with a backlog, so that a loaded machine evaluates every
// snapshot, late), and reports that model's step; the final evaluation
// measures the final model, and evaluating the job model in line leaves
// the worker's own training as it was.
TEST(TrainEvaluation, MeasuresTheJobModelWhereTheHookKeepsOne) {
  TrainerOptions o;
  o.steps = 60;
  o.evalInterval = 20;
  o.evalBacklog = 4;
  o.logInterval = 1000;
  SnapshotHook plain(10);
  auto reference = makeTrainer({"mlp", {}}, o, &plain);
  ASSERT_TRUE(reference->run(nullptr).ok());
  for (const bool background : {false, true}) {
    SCOPED_TRACE(background ? "in the background" : "in line");
    LaggingJobModelHook hook;
    auto t = makeTrainer({"mlp", {}}, o, &hook);
    if (background) evaluateInBackground(*t);
    std::vector<StepStats> reports;
    ASSERT_TRUE(t->run([&](const StepStats& st) { reports.push_back(st); }).ok());
    int periodic = 0;
    for (const StepStats& st : reports) {
      if (!st.evalAccuracy) continue;
      ASSERT_TRUE(st.evalStep.has_value());
      if (*st.evalStep == o.steps) {  // the final one: the final model
        EXPECT_EQ(*st.evalAccuracy, *t->evaluate().accuracy);
        continue;
      }
      ++periodic;
      EXPECT_EQ(*st.evalStep % 20, 10) << "not the job model's step";
      if (!background) {
        EXPECT_EQ(*st.evalStep, st.step - 10);
      }
      EXPECT_EQ(*st.evalAccuracy, accuracyOf(hook.snapshots.at(*st.evalStep), o))
          << "step " << *st.evalStep;
    }
    EXPECT_EQ(periodic, 2);  // steps 20 and 40
    EXPECT_TRUE(torch::equal(t->flat().values, reference->flat().values))
        << "evaluating the job model changed this worker's training";
  }
}

// Training never waits for an evaluation: one held on the evaluation thread
// until every step has been taken does not stop the steps (were it in the
// way, this would never end); the evaluations due meanwhile are skipped and
// counted, and the held one, still running at the end, is abandoned (and
// counted) rather than waited for.
TEST(TrainBackgroundEval, NeverBlocksAStepAndSkipsWhileBusy) {
  TrainerOptions o;
  o.steps = 60;
  o.evalInterval = 10;
  o.logInterval = 1000;
  std::atomic<int64_t> stepsDone{0};
  struct Counter : StepHook {
    std::atomic<int64_t>* done = nullptr;
    Status afterStep(int64_t step, FlatParameters&) override {
      done->store(step + 1);
      return {};
    }
  } counter;
  counter.done = &stepsDone;
  auto t = makeTrainer({"mlp", {}}, o, &counter);
  evaluateInBackground(*t);
  std::atomic<int> held{0};
  t->beforeBackgroundEvaluation = [&] {
    ++held;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (stepsDone.load() < o.steps && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  };
  std::vector<StepStats> reports;
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(t->run([&](const StepStats& st) { reports.push_back(st); }).ok());
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(100))
      << "the steps waited for the held evaluation";
  EXPECT_EQ(held.load(), 1);
  // Steps 20, 30, 40 and 50 found step 10's running; step 10's was abandoned.
  EXPECT_EQ(t->evalsSkipped(), 5u);
  ASSERT_FALSE(reports.empty());
  for (const StepStats& st : reports) {
    if (st.evalStep) {
      EXPECT_EQ(*st.evalStep, o.steps) << "only the final evaluation reports";
    }
  }
  EXPECT_EQ(reports.back().evalStep, o.steps);
}

// 60 steps evaluated every 10 in the background with a backlog; the first
// background evaluation is held until every step has been taken, and
// `evaluations` counts those started.
struct HeldEvaluation {
  TrainerOptions o;
  SnapshotHook hook{10};
  std::atomic<int> evaluations{0};
  std::unique_ptr<Trainer> trainer;

  explicit HeldEvaluation(int64_t backlog) {
    o.steps = 60;
    o.evalInterval = 10;
    o.evalBacklog = backlog;
    o.logInterval = 1000;
    trainer = makeTrainer({"mlp", {}}, o, &hook);
    evaluateInBackground(*trainer);
    trainer->beforeBackgroundEvaluation = [this] {
      if (evaluations++ > 0) return;
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
      while (hook.stepsDone.load() < o.steps && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    };
  }
};

// With a backlog, snapshots wait instead of being skipped: the evaluation
// is held until every step has been taken (the steps go on: were they
// blocked, this would never end), and then every interval's snapshot is
// evaluated before the final evaluation, reported oldest first with its own
// step and the accuracy of exactly that step's parameters.
TEST(TrainBackgroundEval, ABacklogEvaluatesEverySnapshotLateButNeverBlocks) {
  HeldEvaluation held(8);
  std::vector<StepStats> reports;
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(held.trainer->run([&](const StepStats& st) { reports.push_back(st); }).ok());
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(100))
      << "the steps waited for the held evaluation";
  EXPECT_EQ(held.trainer->evalsSkipped(), 0u);
  std::vector<int64_t> evaluated;
  for (const StepStats& st : reports) {
    if (!st.evalStep || *st.evalStep == held.o.steps) continue;
    evaluated.push_back(*st.evalStep);
    EXPECT_EQ(st.step, held.o.steps) << "reported before the steps ended";
    EXPECT_EQ(st.samplesPerSecond, 0) << "a late result carries no throughput";
    EXPECT_GT(st.evalAgeSeconds, 0);
    EXPECT_EQ(*st.evalAccuracy, accuracyOf(held.hook.snapshots.at(*st.evalStep), held.o))
        << "step " << *st.evalStep;
  }
  EXPECT_EQ(evaluated, (std::vector<int64_t>{10, 20, 30, 40, 50}));
  ASSERT_FALSE(reports.empty());
  EXPECT_EQ(reports.back().evalStep, held.o.steps);
}

// A full backlog skips (and counts) like no backlog: one held evaluation and
// a backlog of 2 leave steps 40 and 50 skipped; the waiting ones are evaluated.
TEST(TrainBackgroundEval, AFullBacklogSkips) {
  HeldEvaluation held(2);
  // Step 10's evaluation has started (it no longer waits) before step 20's
  // snapshot is taken: the backlog then holds 20 and 30.
  held.hook.onStep = [&](int64_t done) {
    while (done == 11 && held.evaluations.load() == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  };
  std::vector<int64_t> evaluated;
  ASSERT_TRUE(held.trainer
                  ->run([&](const StepStats& st) {
                    if (st.evalStep) evaluated.push_back(*st.evalStep);
                  })
                  .ok());
  EXPECT_EQ(held.trainer->evalsSkipped(), 2u);
  EXPECT_EQ(evaluated, (std::vector<int64_t>{10, 20, 30, 60}));
}

TEST(TrainConfig, ABacklogOutsideItsRangeIsAClearError) {
  TrainerOptions o;
  o.evalBacklog = 1025;
  EXPECT_NE(validateTrainerOptions(o).message().find("evalBacklog 1025 is outside 0..1024"),
            std::string::npos)
      << validateTrainerOptions(o).message();
}

TEST(TrainBackgroundEval, AnotherArchitectureIsRefused) {
  TrainerOptions o;
  o.steps = 10;
  auto t = makeTrainer({"mlp", {}}, o);
  auto cnn = makeModel({"cnn", {}}, {1, 28, 28}, 10);
  ASSERT_TRUE(cnn.ok());
  const Status s = t->evaluateInBackground(std::move(*cnn));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("not the same architecture"), std::string::npos) << s.message();
}

TEST(TrainConfig, BadOptionsAndModelsAreClearErrors) {
  TrainerOptions o;
  o.optimizer = "rmsprop";
  EXPECT_NE(
      validateTrainerOptions(o).message().find("'rmsprop' is not allowed (allowed: sgd, adam)"),
      std::string::npos);
  o = {};
  o.momentum = 1.5;
  EXPECT_NE(validateTrainerOptions(o).message().find("momentum must be in [0, 1)"),
            std::string::npos);
  auto m = makeModel({"vgg", {}}, {1, 28, 28}, 10);
  EXPECT_NE(m.status().message().find("'vgg' is not a model (allowed: mlp, cnn, resnet18"),
            std::string::npos);
  auto missing = makeModel({"", "/nonexistent/model.pt"}, {1, 28, 28}, 10);
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("/nonexistent/model.pt"), std::string::npos);
}

// Every optimizer configuration trains (the loss of the last steps is well
// below the first), including the checkpointed state of Adam.
TEST(TrainOptimizers, AdamAndNesterovSgdTrain) {
  for (const std::string optimizer : {"adam", "sgd"}) {
    TrainerOptions o;
    o.steps = 150;
    o.optimizer = optimizer;
    o.lr = optimizer == "adam" ? 1e-3 : 0.05;
    o.nesterov = optimizer == "sgd";
    o.weightDecay = 1e-4;
    o.warmupSteps = 10;
    auto t = makeTrainer({"mlp", {}}, o);
    const auto [first, lastMean] = lossDrop(*t, o.steps);
    EXPECT_LT(lastMean, 0.4 * first) << optimizer;
  }
}

TEST(TrainSchedule, WarmupCosineAndStep) {
  TrainerOptions o;
  o.lr = 0.1;
  o.steps = 110;
  o.warmupSteps = 10;
  o.schedule = "cosine";
  EXPECT_DOUBLE_EQ(learningRateAt(o, 0), 0.01);
  EXPECT_DOUBLE_EQ(learningRateAt(o, 9), 0.1);
  EXPECT_NEAR(learningRateAt(o, 60), 0.05, 1e-12);
  EXPECT_NEAR(learningRateAt(o, 110), 0.0, 1e-12);
  o.schedule = "step";
  o.warmupSteps = 0;
  o.stepSize = 30;
  EXPECT_NEAR(learningRateAt(o, 29), 0.1, 1e-12);
  EXPECT_NEAR(learningRateAt(o, 30), 0.01, 1e-12);
}

TEST(TrainModels, Resnet18ShapesAndParameterCount) {
  torch::manual_seed(0);
  auto m = makeModel({"resnet18", {}}, {3, 32, 32}, 10);
  ASSERT_TRUE(m.ok());
  const auto out = (*m)->forward(torch::randn({2, 3, 32, 32}));
  EXPECT_EQ(out.sizes(), (std::vector<int64_t>{2, 10}));
  EXPECT_EQ((*m)->parameterCount(), 11173962);  // the CIFAR ResNet-18
}

}  // namespace
}  // namespace geo::train
