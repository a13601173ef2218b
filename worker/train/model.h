#pragma once
// Trainable models: the built-in `mlp`, `cnn` (28x28 inputs), `resnet18`
// (CIFAR variant, 32x32) and a user's TorchScript module.
//
// A Model owns its parameters; parameters() returns them in a fixed order
// (the same on every worker, which the synchronizers rely on), and the
// tensors it returns are the live ones: the trainer re-seats them as views of
// one flat buffer (see FlatParameters in trainer.h), so a Model must never
// replace its parameter tensors after construction.
//
// Threading: not thread-safe; one trainer thread uses a Model.
// Errors: makeModel returns a Status (unknown name, unreadable TorchScript
// file, a TorchScript module without parameters); forward() throws
// c10::Error (TORCH_CHECK) on shape mismatches, as LibTorch does.

#include <torch/script.h>
#include <torch/torch.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"

namespace geo::train {

class Model {
 public:
  virtual ~Model() = default;

  virtual torch::Tensor forward(const torch::Tensor& input) = 0;
  // Parameters (trainable) and buffers (e.g. batch-norm statistics), each
  // with a stable name, in a fixed order.
  virtual std::vector<std::pair<std::string, torch::Tensor>> namedParameters() = 0;
  virtual std::vector<std::pair<std::string, torch::Tensor>> namedBuffers() = 0;
  virtual void setTraining(bool on) = 0;
  virtual void to(torch::Device device) = 0;
  virtual std::string describe() const = 0;

  std::vector<torch::Tensor> parameters();
  int64_t parameterCount();

  // Writes / reads parameters and buffers by name. load() copies into the
  // existing tensors (keeping any views the trainer made) and fails with a
  // Status naming the first missing or mis-shaped tensor.
  void save(torch::serialize::OutputArchive& archive);
  Status load(torch::serialize::InputArchive& archive);

  // A TorchScript module computing forward() with a copy of the current
  // parameters and buffers (on the CPU, in eval mode), whose state dict has
  // the names of namedParameters()/namedBuffers(). FailedPrecondition for a
  // model without a TorchScript form (resnet18).
  virtual StatusOr<torch::jit::Module> toTorchScript() {
    return failedPrecondition(describe() + " has no TorchScript form");
  }
};

// Writes the model into `dir` (created if missing) for use outside geotrain:
//   model.pt              the state dict: {name: tensor} for every parameter
//                         and buffer, on the CPU, in a file Python's
//                         torch.load() reads (torch::pickle_save);
//   model.torchscript.pt  the model as TorchScript (torch.jit.load in Python,
//                         torch::jit::load in C++), where it has that form;
//   model.json            `metadata` (what the caller says of the model).
// Each file is written beside its final name and renamed over it, so a
// reader never sees half a file and an earlier export stays whole until the
// new one is. Returns the files written; an error names the file.
StatusOr<std::vector<std::filesystem::path>> exportModel(Model& model,
                                                         const std::filesystem::path& dir,
                                                         const std::string& metadata);

struct ModelSpec {
  std::string builtin = "mlp";        // mlp | cnn | resnet18 | gpt; ignored with torchscript
  std::filesystem::path torchscript;  // a module saved with torch.jit.save
  // The built-ins' size (model.width ...): width 0 is the model's default
  // (mlp 256 hidden units, gpt 128); the rest are the gpt's.
  int64_t width = 0;
  int64_t layers = 4;
  int64_t heads = 4;
  int64_t context = 128;
};

// Builds the model for samples of shape `inputShape` (without the batch
// dimension: [C, H, W] for images, which cnn and resnet18 require; mlp
// flattens any shape) and `numClasses` outputs (class logits, or regression
// targets). A TorchScript model must itself map [N, ...inputShape] to
// [N, numClasses]; the trainer finds a mismatch at its first step.
// Initial weights come from torch's default generator: seed it first
// (torch::manual_seed) for reproducible runs.
StatusOr<std::unique_ptr<Model>> makeModel(const ModelSpec& spec,
                                           const std::vector<int64_t>& inputShape,
                                           int64_t numClasses);

}  // namespace geo::train
