// The training runtime end to end on real Fashion-MNIST: convergence of the
// built-in models, a TorchScript model trained from C++, bitwise resume, and
// checkpoints that survive an interrupted write.

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

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
  EXPECT_GE(t->evaluate(), 0.75);
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
  EXPECT_EQ(names, (std::vector<std::string>{"ckpt-0000000040.pt", "ckpt-0000000050.pt"}));
  fs::remove_all(o.checkpointDir);
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
