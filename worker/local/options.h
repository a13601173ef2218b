#pragma once
// LocalOptions: everything `geotrain local` takes on its command line, as
// plain values (the CLI fills it; tests build it in code). Nothing here is
// interpreted: rank_config.h turns it into worker configurations and
// launcher.h runs them.
//
// Flags that set a worker.yaml key are kept as text (nullopt = not given) so
// that geo::applyOverride reads them with the same checks and messages as
// worker.yaml. They apply in this order: WorkerConfig defaults, then the
// --config file, then each --set in order, then these flags, then the fields
// the launcher owns per rank (worker.*, transport.listen/peers/regions/
// links/uplink/keyDir, metrics.enabled, checkpoint.dir, training.threads
// when it is 0).

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "worker/local/faults.h"
#include "worker/local/network.h"

namespace geo::local {

// One dedicated flag and the worker.yaml key it sets.
struct KeyFlag {
  const char* flag;  // "--bits"
  const char* key;   // "sync.bits"
};

// The dedicated flags in the order they are applied (after --set).
inline constexpr KeyFlag kKeyFlags[] = {
    {"--algorithm", "sync.algorithm"},
    {"--period", "sync.period"},
    {"--delay", "sync.delay"},
    {"--exchange", "sync.exchange"},
    {"--swarm-h", "sync.swarmH"},
    {"--codec", "sync.codec"},
    {"--bits", "sync.bits"},
    {"--hierarchical", "sync.hierarchical"},
    {"--timeout-seconds", "sync.timeoutSeconds"},
    {"--model", "model.builtin"},
    {"--steps", "training.steps"},
    {"--batch-size", "training.batchSize"},
    {"--lr", "training.lr"},
    {"--eval-interval", "training.evalInterval"},
    {"--threads", "training.threads"},
};

// What --algorithm defaults to when neither the --config file nor --set
// chose an algorithm other than `none` (WorkerConfig's own default, which
// `geotrain local` would otherwise run as independent workers).
inline constexpr const char* kDefaultAlgorithm = "dts";

struct LocalOptions {
  std::string configFile;         // --config; empty: WorkerConfig defaults
  std::vector<std::string> sets;  // --set key=value, in order

  // --<flag> value for each entry of kKeyFlags given on the command line,
  // in kKeyFlags order: {"--bits", "4"}.
  std::vector<std::pair<std::string, std::string>> keyFlags;

  // Topology.
  std::optional<std::string> regions;  // --regions; nullopt: the preset's regions
  int64_t workersPerRegion = 1;
  std::string preset = "world";
  std::vector<std::string> rtt;       // "london-tokyo=230ms", repeatable
  std::optional<std::string> uplink;  // nullopt: the preset's
  // Which network carries the job, and the namespace WAN's own flags
  // (network.h).
  NetworkOptions network;

  // Outputs.
  std::string out;               // run folder; empty: runs/<YYYYmmdd-HHMMSS>
  std::string csv;               // empty: <out>/progress.csv
  std::string plot;              // empty: no plot
  std::string prometheusConfig;  // empty: none; else a Prometheus scrape config is written here

  // Processes.
  std::string workerBinary;  // empty: geotrain-worker next to /proc/self/exe

  // Fault injection (faults.h): --kill, --restart-after, --partition, --slow.
  FaultOptions faults;
  // --step-time: every worker's step computes for at least this long
  // ("20ms"; geotrain-worker --emulate-step-time); nullopt: as fast as it can.
  std::optional<std::string> stepTime;
};

}  // namespace geo::local
