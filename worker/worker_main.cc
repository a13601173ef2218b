// `geotrain-worker`: one training worker. Reads worker.yaml (every field has
// a default; see docs/worker-config.md), applies command-line overrides,
// loads its shard of the data set, builds the model, connects to its peers
// (sync.algorithm other than none) and trains, printing progress every
// training.logInterval steps: log lines on stderr, or with
// `--progress-format jsonl` one JSON object per line on stdout (the contract
// `geotrain local` reads; see docs/worker-progress.md). Exit code 0 on
// success (also when the job had finished before this worker could rejoin
// it), 1 on a failure (with the reason on stderr), 2 on a usage or
// configuration error (retrying the same configuration cannot help: the
// Kubernetes pod failure policy fails the job on it).
//
// Fault injection for `geotrain local`: SIGUSR1 cuts this worker off from the
// other regions (the emulated links drop everything both ways) until
// SIGUSR2; SIGRTMIN queued with a value sets its emulated WAN uplink to that
// many kbit/s; --emulate-slowdown stretches every step, and
// --emulate-step-time pads every step's compute to a floor.
//
// This file parses the command line, sets up logging, and opens the
// connections to the peers; then it loads the training library, which needs
// LibTorch, and runs the worker there (worker/app/training_library.h says
// why the two parts; the run itself is worker/app/run.h).

#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdint>
#include <exception>
#include <iostream>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/logging.h"
#include "common/worker_config.h"
#include "common/worker_schema.h"
#include "worker/app/connect.h"
#include "worker/app/fault_signals.h"
#include "worker/app/training_library.h"
#include "worker/app/transport_setup.h"
#include "worker/app/worker_output.h"

namespace {

using geo::app::kExitFailure;
using geo::app::kExitOk;
using geo::app::kExitUsage;

const geo::app::Progress* gProgress = nullptr;

// A configuration that cannot work: exit 2, so nobody retries it.
int failConfig(const geo::Status& s) {
  (void)geo::app::reportFailure(gProgress, s);
  return kExitUsage;
}

}  // namespace

int main(int argc, char** argv) {
  geo::app::fixMmapThreshold();
  CLI::App app(
      "geotrain-worker: one geotrain training worker.\n"
      "Reads worker.yaml (every key has a default: docs/worker-config.md), applies the\n"
      "overrides given here, trains, and prints progress every training.logInterval steps.");
  std::string configPath;
  std::vector<std::string> sets;
  bool printConfig = false;
  std::string progressFormat = "text";
  app.add_option("--config,-c", configPath, "worker.yaml to read (default: all defaults)")
      ->check(CLI::ExistingFile);
  app.add_option("--set", sets,
                 "Override one key, e.g. --set training.lr=0.1 --set model.builtin=cnn "
                 "(repeatable; same names and checks as worker.yaml)");
  // Shorthands for the keys changed most often; each is a --set. Allowed
  // values come from the schema, so that the help lists what --set takes.
  std::vector<std::pair<std::string, std::string>> shorthand;
  auto addShort = [&](const std::string& flag, const std::string& key, const std::string& help) {
    app.add_option_function<std::string>(
        flag, [&shorthand, key](const std::string& v) { shorthand.emplace_back(key, v); },
        help + " (= --set " + key + "=...)");
  };
  addShort("--model", "model.builtin", "Built-in model: " + geo::workerKeyChoices("model.builtin"));
  addShort("--torchscript", "model.torchscript", "TorchScript model file to train instead");
  addShort("--dataset", "dataset.name", geo::workerKeyChoices("dataset.name"));
  addShort("--data-path", "dataset.path", "Folder with the data set files");
  addShort("--steps", "training.steps", "Optimizer steps");
  addShort("--batch-size", "training.batchSize", "Samples per step");
  addShort("--lr", "training.lr", "Learning rate");
  addShort("--checkpoint-dir", "checkpoint.dir", "Where to write and resume checkpoints");
  addShort("--metrics-listen", "metrics.listen", "host:port of the Prometheus /metrics endpoint");
  addShort("--log-level", "log.level", geo::workerKeyChoices("log.level"));
  addShort("--log-format", "log.format",
           geo::workerKeyChoices("log.format") + " (json: one object a line for log collectors)");
  geo::app::Emulation emulation;
  app.add_option("--emulate-slowdown", emulation.slowdown,
                 "Fault injection: stretch every step to this many times its duration, emulating a "
                 "slower machine (geotrain local --slow)")
      ->check(CLI::Range(1.0, 100.0))
      ->capture_default_str();
  int64_t minStepMs = 0;
  app.add_option("--emulate-step-time", minStepMs,
                 "Emulation: every step's compute lasts at least this many milliseconds, as with "
                 "a larger model (geotrain local --step-time); 0: off")
      ->check(CLI::Range(int64_t{0}, int64_t{60000}))
      ->capture_default_str();
  std::optional<int64_t> completionIndex;
  app.add_option("--completion-index", completionIndex,
                 "Place this worker as the N-th (0-based) of worker.region: sets worker.localRank "
                 "and worker.rank from transport.regions (Kubernetes Indexed Jobs pass "
                 "$(JOB_COMPLETION_INDEX)); applied after --set");
  app.add_flag("--print-config", printConfig, "Print the effective configuration as YAML and exit");
  bool initialWindowOnly = false;
  app.add_flag("--tcp-initial-window-only", initialWindowOnly,
               "Set the initial TCP windows toward the WAN peers (transport.tcpInitialWindow: "
               "host routes, needs CAP_NET_ADMIN) and exit: for a privileged init container, "
               "after which the worker itself, without the capability, finds them set");
  app.add_option("--progress-format", progressFormat,
                 "text: progress as log lines on stderr; jsonl: also one JSON object per line on "
                 "stdout (events start, progress, done, error; see docs/worker-progress.md)")
      ->check(CLI::IsMember({"text", "jsonl"}))
      ->capture_default_str();
  // Before any thread of ours exists (see run.h).
  geo::app::prepareFaultSignals();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? kExitOk : kExitUsage;
  }

  geo::WorkerConfig config;
  if (!configPath.empty()) {
    auto loaded = geo::loadWorkerConfig(configPath, geo::ConfigCheck::kFieldsOnly);
    if (!loaded.ok()) return failConfig(loaded.status());
    config = std::move(*loaded);
  }
  for (const auto& [key, value] : shorthand) {
    if (auto s = geo::applyOverride(config, key, value); !s.ok()) return failConfig(s);
  }
  for (const auto& kv : sets) {
    const auto eq = kv.find('=');
    if (eq == std::string::npos) {
      std::cerr << "geotrain-worker: --set expects key=value, got '" << geo::printableText(kv)
                << "'\n";
      return kExitUsage;
    }
    if (auto s = geo::applyOverride(config, kv.substr(0, eq), kv.substr(eq + 1)); !s.ok()) {
      return failConfig(s);
    }
  }
  if (completionIndex) {
    if (auto s = geo::placeByCompletionIndex(config, *completionIndex); !s.ok()) {
      return failConfig(s.withContext("--completion-index"));
    }
  }
  if (auto s = geo::validateWorkerConfig(config); !s.ok()) return failConfig(s);
  if (printConfig) {
    std::cout << geo::toYaml(config);
    return kExitOk;
  }
  if (initialWindowOnly) {
    if (auto s = geo::initLogging(config.log.level); !s.ok()) return failConfig(s);
    if (auto s = geo::app::applyTcpInitialWindow(config); !s.ok()) {
      std::cerr << "geotrain-worker: " << s.toString() << "\n";
      return kExitFailure;
    }
    return kExitOk;
  }
  const geo::app::Progress progress(progressFormat == "jsonl", config.worker.rank);
  gProgress = &progress;
  try {
    if (auto s = geo::initLogging(config.log.level); !s.ok()) {
      return geo::app::reportFailure(&progress, s);
    }
    if (auto s = geo::setLogFormat(config.log.format); !s.ok()) {
      return geo::app::reportFailure(&progress, s);
    }
    // Before any thread starts: setenv is not safe beside a getenv.
    if (const auto blas = geo::app::chooseBlasKernels()) geo::logger()->info("{}", *blas);
    // First the connections, whose handshakes with far peers take round
    // trips; LibTorch loads meanwhile.
    auto connection = geo::app::connectToPeers(config, progress);
    if (!connection.ok()) return geo::app::reportFailure(&progress, connection.status());
    const auto loading = std::chrono::steady_clock::now();
    auto train = geo::app::loadTrainingLibrary();
    if (!train.ok()) return geo::app::reportFailure(&progress, train.status());
    geo::logger()->info(
        "loaded {} in {:.2f} s", train->path,
        std::chrono::duration<double>(std::chrono::steady_clock::now() - loading).count());
    emulation.minStepTime = std::chrono::milliseconds(minStepMs);
    geo::app::TrainingCall call{&config, &progress, &emulation, &*connection};
    return train->run(&call);
  } catch (const std::exception& e) {
    return geo::app::reportFailure(gProgress, geo::internalError(e.what()));
  }
}
