#pragma once
// Data sets of the training runtime: loading (Fashion-MNIST, MNIST, CIFAR-10,
// a generated synthetic set), sharding across the workers of a job, and a
// deterministic batch sampler whose position can be checkpointed.
//
// Errors. loadDataset() never throws for bad input and never crashes on a
// corrupt file: it returns a Status whose message names the file and what was
// expected vs what was found. Programming errors (a bad shard index, a batch
// larger than the data set) are GEO_ENFORCE failures (geo::Error).
//
// Determinism. Everything here is a pure function of its arguments: the
// synthetic set and the sampler use their own explicitly seeded generators and
// never touch LibTorch's global RNG, so two processes (or a process restarted
// from a checkpoint) see exactly the same data in exactly the same order.

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include <torch/types.h>

#include "common/status.h"

namespace geo::train {

// A stream of token ids (dataset "tokens"): a read-only memory map of a
// flat file of little-endian uint16 or uint32 ids, or a part of one.
struct TokenStream {
  std::shared_ptr<const void> mapping;  // keeps the file mapped
  const std::byte* data = nullptr;      // the first token of this part
  int64_t count = 0;                    // tokens in this part
  int64_t tokenBytes = 2;

  int64_t at(int64_t i) const;
  // Tokens [begin, end) of this part, sharing the mapping.
  TokenStream slice(int64_t begin, int64_t end) const;
};

// A data set in memory, ready for training. Both tensors are on the CPU,
// contiguous, and have the same first dimension.
//
// A token data set's training split is a stream instead (`tokens`, with
// `context`): a sample is the window of context + 1 tokens from any position,
// drawn by randomWindowStarts() and cut by tokenWindows(). Its evaluation
// split is materialized: inputs and targets int64 [W, context], targets
// the inputs shifted by one token.
struct TensorDataset {
  // float32 [N, C, H, W]: pixel intensities normalized as (x/255 - mean) / std
  // with fixed per-data-set, per-channel constants (the training set's own
  // statistics; the test split uses the same constants), so the training
  // inputs have mean ~0 and standard deviation ~1 per channel.
  torch::Tensor inputs;
  // Classification: int64 [N], every value in [0, numClasses).
  // Regression (npy with float targets): float32 [N, T], and numClasses = T.
  torch::Tensor targets;
  // The model's outputs: classes, regression targets per sample, or the
  // vocabulary (tokens).
  int64_t numClasses = 10;
  TokenStream tokens;  // a token training split; empty otherwise
  int64_t context = 0;

  bool isTokenStream() const { return tokens.count > 0; }
  // N; for a token stream the window starts, tokens.count - context; 0 for a
  // default-constructed (empty) data set.
  int64_t size() const;
  // Float targets (trained with mse), not class labels.
  bool regression() const;
};

enum class Split { kTrain, kTest };

// "train" / "test".
std::string_view splitName(Split split);

struct DatasetSpec {
  // One of kDatasetNames: "fashion-mnist", "mnist", "cifar10", "synthetic",
  // "npy".
  std::string name = "fashion-mnist";
  // Folder holding the files; empty means defaultDatasetPath(name). Ignored by
  // "synthetic".
  std::filesystem::path path{};
  // "synthetic" only: samples in the training split (the test split has
  // min(10000, max(1, syntheticSamples / 6)), the Fashion-MNIST ratio).
  int64_t syntheticSamples = 60000;
  // "synthetic" only: seeds the generator (train and test use distinct
  // streams derived from it).
  uint64_t seed = 42;
  // Classification: the number of classes (model.classes); 0 takes it from
  // the data (the built-in sets' 10; npy: the largest training label + 1).
  // A label at or above it is an error.
  int64_t classes = 0;
  // "tokens" only: bytes per token id (2 or 4) and the window length.
  int64_t tokenBytes = 2;
  int64_t context = 128;
};

inline constexpr std::string_view kDatasetNames[] = {"fashion-mnist", "mnist", "cifar10",
                                                     "synthetic",     "npy",   "tokens"};
// Windows of a token set's evaluation split (evenly spread over val.bin).
inline constexpr int64_t kEvalWindows = 64;

// Where the Debian dataset packages install a data set:
// /usr/share/datasets/<name> ("fashion-mnist", "mnist", "cifar10"); empty for
// "synthetic" and unknown names.
std::filesystem::path defaultDatasetPath(std::string_view name);

// How the data set's samples reach the model, for a user who feeds the
// exported model inputs of their own: shape and scaling, e.g. for
// fashion-mnist "float32 [N, 1, 28, 28]: (pixel / 255 - 0.2860) / 0.3530".
std::string describeInputs(std::string_view name);

// Loads one split of a data set into memory.
//
// Files (in spec.path; each name is tried as is, then with a ".gz" suffix;
// gzipped files are decompressed on the fly):
//   fashion-mnist, mnist: IDX files {train,t10k}-images-idx3-ubyte and
//     {train,t10k}-labels-idx1-ubyte -> inputs [N, 1, 28, 28].
//   cifar10: the binary version, data_batch_1.bin .. data_batch_5.bin (train)
//     or test_batch.bin (test), directly in spec.path or in its
//     cifar-10-batches-bin/ subfolder; records of 1 label byte + 3072 pixel
//     bytes (1024 R, 1024 G, 1024 B, row-major) -> inputs [N, 3, 32, 32].
//   npy: {train,test}_x.npy and {train,test}_y.npy (numpy.save; see npy.h
//     for the dtypes taken). x: [N, ...] features of any shape the model
//     takes, used as they are (no normalization: scale them as you would in
//     PyTorch); a float32 file is memory-mapped, not copied, other dtypes
//     are converted to float32. y: integer labels [N] (classification,
//     labels in [0, classes)) or float targets [N] or [N, T] (regression).
//   tokens: train.bin and val.bin, flat token ids (uint16 or uint32, as
//     spec.tokenBytes says, little-endian: numpy's tofile() of a "<u2" or
//     "<u4" array), memory-mapped. The vocabulary (numClasses) is
//     spec.classes, else 256 (bytes) or the largest id + 1 if larger; an id
//     at or above spec.classes is an error naming the file and position. The
//     training split is a stream of windows; the test split is kEvalWindows
//     (at most) windows of context + 1 tokens evenly spread over val.bin.
//   synthetic: no files. A deterministic function of (seed, split,
//     syntheticSamples), generated in parallel: each image is 1x28x28 with
//     one Gaussian blob whose position depends on the class (10 positions on
//     a circle, jittered in position, width and brightness), a dimmer blob
//     anywhere, and pixel noise; labels are uniform. Neighbouring classes
//     overlap, so it is learnable but not trivially (an MLP reaches ~88% test
//     accuracy, like Fashion-MNIST). Sample i does not depend on the number
//     of samples, so a smaller set is a prefix of a larger one (same seed).
//
// Errors:
//   InvalidArgument: unknown name (lists the allowed ones), syntheticSamples < 1.
//   NotFound: a file is missing; the message lists every path tried.
//   PermissionDenied: a file exists but may not be read.
//   DataLoss: a file is unreadable or corrupt: a damaged or cut gzip
//     stream, wrong IDX magic number (2051 for images, 2049 for labels),
//     image size other than 28x28, payload shorter (truncated) or longer than
//     the header says, image count != label count, CIFAR file size not a
//     whole number of records, label >= numClasses. The message names the
//     file, what was expected and what was found.
//   ResourceExhausted: out of memory; Internal: LibTorch failed (neither is
//     expected; they exist so that nothing throws out of this function).
//
// Cost: Fashion-MNIST train (60000 images, gzipped) loads in ~0.3 s on one
// core: zlib inflates the bytes into one buffer, then one vectorized,
// multi-threaded pass converts and normalizes them (no per-pixel tensor
// calls). The synthetic set (60000) is generated in ~0.2 s on one core.
StatusOr<TensorDataset> loadDataset(const DatasetSpec& spec, Split split);

// The test split fits the training split: the same sample shape, the same
// kind of target (labels or floats), test labels below the training split's
// class count, as many regression targets. DataLoss naming both otherwise.
Status checkSplitsAgree(const TensorDataset& train, const TensorDataset& test,
                        std::string_view name);

// The starts of `batch` windows for step `step`, uniform in [0, limit):
// a function of (seed, step) alone (a counter-based generator), so a
// resumed worker draws what it would have drawn. int64 [batch].
torch::Tensor randomWindowStarts(uint64_t seed, int64_t step, int64_t batch, int64_t limit);

// The windows of `d`'s token stream at `starts`: inputs int64 [B, context]
// and targets the same windows one token later.
std::pair<torch::Tensor, torch::Tensor> tokenWindows(const TensorDataset& d,
                                                     const torch::Tensor& starts);

// The part of `d` that worker `index` of `count` trains on: element i belongs
// to shard i % count (strided, so every shard sees the same mix of the data
// set's order and the shard sizes differ by at most one: shard `index` has
// ceil((N - index) / count) elements, possibly 0). The shards of 0..count-1
// are disjoint and together hold every element exactly once.
//
// The result owns contiguous copies of its rows (so the full data set can be
// freed), except count == 1, which returns `d` itself (shared tensors).
// A token stream is cut into `count` contiguous parts instead (part
// `index`: tokens [index * n / count, (index + 1) * n / count)), sharing
// the mapping.
// GEO_ENFORCE: count >= 1 and 0 <= index < count.
TensorDataset shard(const TensorDataset& d, int64_t index, int64_t count);

// Draws mini-batches of indices in [0, datasetSize): each epoch is a fresh
// permutation and next() hands out consecutive batchSize-long slices of it.
// Only full batches are returned; when fewer than batchSize indices remain,
// the epoch ends (those indices are skipped for this epoch) and the next one
// starts.
//
// The permutation of epoch e is a Fisher–Yates shuffle of 0..datasetSize-1
// driven by std::mt19937_64 seeded with seed + e (with an unbiased bounded
// draw of our own, not std::uniform_int_distribution, whose output differs
// between standard libraries). It does not depend on earlier epochs, so
// restore() is O(datasetSize) whatever the epoch.
//
// Not thread-safe: one sampler per training loop.
class BatchSampler {
 public:
  // GEO_ENFORCE: 1 <= batchSize <= datasetSize.
  BatchSampler(int64_t datasetSize, int64_t batchSize, uint64_t seed);

  // int64 [batchSize]: the indices of the next batch.
  torch::Tensor next();

  // Where the sampler is: `position` indices of epoch `epoch` have been handed
  // out. Saved in checkpoints.
  struct State {
    int64_t epoch = 0;
    int64_t position = 0;
    bool operator==(const State&) const = default;
  };
  State state() const;
  // Continues from `s`: the batches after restore(s) are exactly those that
  // followed state() == s. GEO_ENFORCE: epoch >= 0, 0 <= position <= datasetSize.
  void restore(const State& s);

  int64_t datasetSize() const { return datasetSize_; }
  int64_t batchSize() const { return batchSize_; }
  // Full batches per epoch: datasetSize / batchSize.
  int64_t batchesPerEpoch() const { return datasetSize_ / batchSize_; }

 private:
  void shuffleFor(int64_t epoch);

  int64_t datasetSize_;
  int64_t batchSize_;
  uint64_t seed_;
  State state_;
  std::vector<int64_t> permutation_;  // of state_.epoch
};

}  // namespace geo::train
