#pragma once
// What a DTS worker will hold in host memory, from its configuration and
// model alone, before it trains: docs/algorithms.md ("Memory") as a
// function, and the limit it must fit in. A job whose rounds in flight or
// final average cannot fit is refused at start, naming the figure and the
// knobs, instead of being killed by the kernel hours in.
//
// The estimate is a lower bound: it counts what the design must hold (the
// table's rows) and not the allocator's slack, the activations or
// LibTorch's own buffers, which the measured peaks add (7.9 B for a
// 101M-parameter mlp on two workers, the plan 6.6 B). So a refusal is
// certain; passing the check is no promise.
//
// No LibTorch: the caller passes the counts.

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"

namespace geo::app {

struct MemoryPlanInput {
  int64_t parameters = 0;  // P
  // Values in the largest parameter tensor whose gradient autograd makes
  // whole before adding it (0 for the built-in mlp, whose layers add theirs
  // in place).
  int64_t largestTensor = 0;
  int64_t datasetBytes = 0;  // what the loaded data occupies
  int64_t peers = 1;         // N: workers (or region leaders) that exchange rounds, self included
  std::string optimizer = "sgd";
  double momentum = 0.9;
  std::string codec = "qsgd";  // identity | fp16 | bf16 | qsgd
  int bits = 4;
  std::optional<int64_t> period;  // K; nullopt: auto
  std::optional<int64_t> delay;   // D; nullopt: auto
  // sync.exchange reducescatter: the last four rounds completed are kept,
  // each its own encoded contribution and the shards' means, to answer a
  // peer that lost an owner (sync::detail::Dts::kAnswerable). Under
  // `auto` the plan leaves them out: a lower bound.
  bool reduceScatter = false;
  // Models the background evaluation may hold at once: 0 without periodic
  // evaluation (training.evalInterval 0), else its own model, the
  // snapshot it evaluates and training.evalBacklog snapshots waiting.
  int64_t evaluationModels = 0;
};

struct MemoryPlan {
  // What is held while training, and at the final average (each row: what,
  // bytes), and the larger of the two totals.
  std::vector<std::pair<std::string, int64_t>> training;
  std::vector<std::pair<std::string, int64_t>> atEnd;
  int64_t trainingBytes = 0;
  int64_t endBytes = 0;
  int64_t peakBytes = 0;
  int64_t roundsInFlight = 1;    // R = D / K + 1 with both fixed; 1 (the least) under auto
  bool roundsExact = false;      // false: auto K or D, R is a lower bound
  int64_t evaluationModels = 0;  // MemoryPlanInput's: the background evaluation's rows
};

MemoryPlan planDtsMemory(const MemoryPlanInput& in);

// The bytes this process may use: its cgroup's memory.max (v2) or
// memory.limit_in_bytes (v1), else the machine's MemTotal; nullopt when
// none can be read. `root` is the file system root (tests pass a folder
// laid out like /proc and /sys).
std::optional<int64_t> readMemoryLimit(const std::string& root = "/");

// OK when the plan's peak fits in `limitBytes`; else FailedPrecondition
// naming the peak, its largest rows, the limit and what to change.
Status checkMemoryPlan(const MemoryPlan& plan, int64_t limitBytes);

// "1.2 GB" (decimal units, as the summary's peak RSS).
std::string formatBytes(int64_t bytes);

}  // namespace geo::app
