#pragma once
// WorkerConfig: the schema of worker.yaml, the one configuration of a training
// worker. geotrain-worker and `geotrain local` read it from a file (plus
// `--set key=value` overrides); the controller renders it from a TrainingJob
// into a ConfigMap. Both sides share this file so they cannot disagree on a
// key, a default or a limit. The reference for users is docs/worker-config.md
// (a test keeps it in sync with toYaml()). What each key is (type, range,
// allowed values, default, a line of documentation) can be asked of the
// schema itself: common/worker_schema.h.
//
// The schema is plain structs: every field has a default, so a
// default-constructed WorkerConfig is a valid single-worker job, and an empty
// worker.yaml means exactly that. YAML keys are camelCase (as in Kubernetes)
// and grouped in sections: `training.lr` is key `lr` of section `training`.
//
// Nothing here throws: every failure is a Status (InvalidArgument for bad
// content, NotFound for a missing file) whose message names the full key path,
// the value given and what is allowed, e.g.
//   worker.yaml:12:3: training.lrr: unknown key (allowed: steps, ...); did you mean 'lr'?
//   sync.bits: 3 is not allowed (allowed: 2, 4, 8)
// yaml-cpp stays out of this header on purpose: the controller and the worker
// include it everywhere, and only worker_config.cc needs a YAML parser.

#include <array>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
// The QSGD limits are the kernels' (a header of constants only: common/ still
// links none of our libraries; the header says why it is shaped so).
#include "kernels/qsgd_limits.h"

namespace geo {

// Bounds on what a worker.yaml may ask for. The parser checks them before it
// allocates anything sized by the input, so a hostile or mistyped file fails
// with a message naming the bound instead of exhausting memory or threads
// (docs/worker-config.md lists them with the keys).
//
// Ranks in a job (worker.worldSize, and the entries of transport.peers and
// transport.regions): every worker keeps per-rank state and a connection to
// each peer it talks to.
inline constexpr int64_t kMaxWorldSize = 4096;
// transport.tcpInitialWindow's largest value: 1000 segments of 1448 bytes
// are 1.4 MB sent before the first acknowledgement, more than the queue in
// front of a 100 Mbit/s uplink holds.
inline constexpr int64_t kMaxTcpInitialWindow = 1000;
// training.threads: intra-op threads of one worker.
inline constexpr int64_t kMaxThreads = 1024;
// training.evalBacklog: snapshots waiting for the background evaluation.
inline constexpr int64_t kMaxEvalBacklog = 1024;
// Every *Seconds key: the runtime turns them into milliseconds (int64), so a
// value must be a whole number of them at least (0.001 s) and far from the
// overflow (1e6 s is 11.6 days).
inline constexpr double kMinSeconds = 0.001;
inline constexpr double kMaxSeconds = 1e6;
// dataset.syntheticSamples: the synthetic set is generated in memory, 3 KiB
// a sample (1e6 samples: about 3 GiB).
inline constexpr int64_t kMaxSyntheticSamples = 1000000;
inline constexpr int64_t kMaxClasses = 1 << 20;  // model.classes
// model.width: an mlp of 1 << 18 hidden units on 28x28 inputs has 208M
// parameters, room for the 100M-parameter memory measurement and more.
inline constexpr int64_t kMaxModelWidth = 1 << 18;
inline constexpr int64_t kMaxModelLayers = 256;  // model.layers, model.heads
inline constexpr int64_t kMaxContext = 1 << 16;  // model.context
// sync.codec: the payload codecs (worker/codec's makeCodec builds each of
// them, codec_test checks it); sync.lanCodec: those a region's members may
// send their leader (lossless or bf16).
inline constexpr std::array<std::string_view, 4> kCodecNames = {"identity", "fp16", "bf16", "qsgd"};
inline constexpr std::array<std::string_view, 2> kLanCodecNames = {"identity", "bf16"};
// sync.bucket and sync.bits: exactly what the QSGD kernels accept
// (kernels/qsgd_limits.h), so a value the kernels would refuse is refused
// here, by the controller and by `geotrain local` rather than when a worker
// starts.
inline constexpr int64_t kMaxBucket = kernels::kQsgdMaxBucket;
// `sync.period: auto` starts from this K until the first measurements:
// large enough that a round of 4-bit updates of a small model does not
// wait for a 100 Mbit/s uplink at 1 ms steps (at 4 it did, for the first
// 60-130 steps, a fifth of the time to 85% on the world links); a fast
// link comes down from it after six rounds (docs/architecture.md §3).
inline constexpr int64_t kAutoPeriodStart = 16;
// job.id: printable UTF-8 (it becomes a metrics label), at most this many
// bytes; the controller's namespace/name/uid needs at most 354.
inline constexpr size_t kMaxJobIdBytes = 512;
// The worker.yaml text: its size, how deeply its YAML nests (the schema needs
// 3 levels: sections, keys, list or map entries) and how many YAML nodes it
// has (a file for kMaxWorldSize ranks with links between 64 regions needs
// about 12,500).
inline constexpr size_t kMaxConfigBytes = size_t{1} << 20;
inline constexpr int kMaxYamlDepth = 32;
inline constexpr size_t kMaxYamlNodes = 65536;

// Enumerated fields are strings (what the YAML says, and what the factories
// that consume them — codecs, logging, models — take); the parser and
// validateWorkerConfig() admit only the names documented per field.
struct WorkerConfig {
  struct Job {
    // 1..kMaxJobIdBytes bytes of printable UTF-8 (no control characters): a
    // metrics label; hashed into every frame header.
    std::string id = "geotrain-local";
    uint64_t seed = 42;  // model init, data order and QSGD rounding

    bool operator==(const Job&) const = default;
  };

  // Where this worker sits in the job. Ranks are global (0..worldSize-1);
  // localRank/regionSize place it inside its region (localRank 0 is the
  // region leader, the only worker that talks across the WAN). Counts are at
  // most kMaxWorldSize; region is a lowercase DNS label (a metrics label).
  struct Worker {
    int64_t rank = 0;
    int64_t worldSize = 1;
    std::string region = "local";
    int64_t localRank = 0;
    int64_t regionSize = 1;

    bool operator==(const Worker&) const = default;
  };

  // Exactly one of the two is non-empty: a built-in architecture
  // (mlp|cnn|resnet18) or a TorchScript file.
  struct Model {
    std::string builtin = "mlp";
    std::string torchscript;
    // Outputs of the model: 0 takes them from the data (the training
    // split's largest label + 1 for cross-entropy, the targets' width for
    // mse); 1..kMaxClasses fixes them (a label at or above it is an error).
    int64_t classes = 0;
    // The built-ins' size. width: the mlp's hidden units and the gpt's
    // embedding (0: the model's default, 256 and 128); gpt only: layers,
    // attention heads (dividing width) and context (tokens it attends over,
    // the length of the windows it trains on).
    int64_t width = 0;
    int64_t layers = 4;
    int64_t heads = 4;
    int64_t context = 128;

    bool operator==(const Model&) const = default;
  };

  struct Dataset {
    std::string name = "fashion-mnist";  // fashion-mnist|mnist|cifar10|synthetic|npy|tokens
    // The folder with the data set's files. Empty: where the Debian package
    // installs it (/usr/share/datasets/<name>); npy needs one.
    std::string path;
    // How the shards are derived when shardIndex/shardCount are not set:
    //   job     one copy of the data for the whole job: shard worker.rank of
    //           worker.worldSize;
    //   region  each region has a copy of its own (its own samples): shard
    //           worker.localRank of worker.regionSize, so that the region's
    //           workers together read all of it;
    //   auto    the controller (or geotrain local) decides: region where a
    //           region has a data path of its own, else job. A worker that
    //           still sees auto (run by hand) takes job.
    std::string sharding = "auto";
    // Which part of the data this worker reads. Not set (nullopt): derived
    // from the worker as `sharding` says; see effectiveShardIndex()/
    // effectiveShardCount().
    std::optional<int64_t> shardIndex;
    std::optional<int64_t> shardCount;
    int64_t syntheticSamples = 60000;  // size of the `synthetic` data set, 1..kMaxSyntheticSamples
    int64_t tokenBytes = 2;            // tokens: bytes per token id in train.bin/val.bin, 2 or 4

    bool operator==(const Dataset&) const = default;
  };

  struct Training {
    int64_t steps = 1000;               // > 0
    int64_t batchSize = 64;             // > 0
    std::string optimizer = "sgd";      // sgd|adam
    double lr = 0.05;                   // > 0
    double momentum = 0.9;              // [0, 1); sgd only
    bool nesterov = true;               // sgd only; why true: docs/architecture.md §3
    double weightDecay = 0;             // >= 0
    std::string schedule = "constant";  // constant|cosine|step
    int64_t warmupSteps = 0;            // >= 0, linear warm-up before the schedule
    int64_t stepSize = 1000;            // >= 1; `step` schedule: lr *= stepGamma every stepSize
    double stepGamma = 0.1;             // (0, 1]
    double gradClip = 0;                // >= 0; max global L2 norm, 0 = off
    int64_t evalInterval = 200;         // >= 0; 0 = evaluate only at the end
    int64_t evalBacklog = 0;            // 0..kMaxEvalBacklog; snapshots waiting for evaluation
    int64_t logInterval = 50;           // >= 0; 0 = no periodic log lines
    std::string device = "auto";        // auto|cpu|cuda
    // cross-entropy (integer labels) | mse (float targets: regression) |
    // next-token (tokens: cross-entropy of each position's next token).
    std::string loss = "cross-entropy";
    int64_t threads = 0;  // 0..kMaxThreads; intra-op threads, 0 = library default

    bool operator==(const Training&) const = default;
  };

  struct Sync {
    std::string algorithm = "none";  // none|allreduce|dts|swarm
    // DTS period K in steps (>= 1). nullopt means `auto`: the workers agree
    // at run time on the K whose rounds the uplink carries comfortably
    // (docs/architecture.md §3), starting from kAutoPeriodStart. Auto by
    // default, as the delay: measured on three emulated WANs, auto K and D
    // reached the target soonest in time, at full utilization
    // (docs/benchmarks.md).
    std::optional<int64_t> period;
    // DTS delay D in steps (>= 0). nullopt means `auto`: the worker derives
    // the smallest D that hides the measured link (docs/architecture.md §3).
    std::optional<int64_t> delay;
    // DTS: how a round's contributions meet, allgather|reducescatter|auto
    // (docs/algorithms.md, "Reduce-scatter").
    std::string exchange = "allgather";
    int64_t swarmH = 4;                 // SwarmSGD local steps between exchanges, >= 1
    std::string codec = "qsgd";         // identity|fp16|bf16|qsgd (WAN updates)
    int64_t bits = 4;                   // kernels::kQsgdBits (2|4|8), qsgd only
    int64_t bucket = 512;               // qsgd bucket size, 1..kMaxBucket
    bool errorFeedback = true;          // keep the quantization residual per tensor
    bool hierarchical = true;           // LAN reduce to the region leader first
    std::string lanCodec = "identity";  // identity|bf16 (inside a region)
    // DTS: when the peers' updates are τ > 4 steps old as they are applied,
    // the gradient is scaled by max(1/2, 4 / τ) (sgd; docs/architecture.md
    // §3); false: as configured.
    bool scaleLrWithDelay = true;
    // [kMinSeconds, kMaxSeconds]; the last resort for a peer that is heard
    // but does not deliver (a straggler).
    double timeoutSeconds = 60;
    // Silence that makes a peer suspected: 0 (auto) or [kMinSeconds, kMaxSeconds].
    double peerTimeoutSeconds = 0;

    bool operator==(const Sync&) const = default;
  };

  struct Transport {
    std::string listen = "tcp://*:7000";  // ZeroMQ endpoint this worker binds
    // Empty, or one endpoint per rank (index = rank). `none`: this worker
    // never talks to that rank (under hierarchical sync, another region's
    // member: a cluster exposes only each region's leader).
    std::vector<std::string> peers;
    // regions[r]: the region of rank r (empty, or one per rank). Decides
    // which peers are across the WAN (links and uplink apply to them) and
    // which rank leads each region (its first rank) for hierarchical sync.
    // Empty: every rank is in worker.region.
    std::vector<std::string> regions;
    // CURVE key files (geotrain keygen): this worker's secret key
    // worker-<rank>.key and every rank's public key worker-<r>.pub.
    std::string keyDir = "keys";
    // Accept a secret key file its group can read (not others): Kubernetes
    // mounts Secrets into non-root pods as root:<fsGroup> 0440.
    bool keyGroupReadable = false;
    // "regionA-regionB" -> link profile such as "delay=50ms,rate=20mbit".
    // Only checked to be strings here: common/ cannot depend on worker/, so
    // the worker parses the profiles (geo::transport::parseLinkProfile).
    std::map<std::string, std::string> links;
    // Emulated uplink of this worker shared by all its WAN traffic, a link
    // profile such as "rate=100mbit" (empty: none). Applied before links.
    std::string uplink;
    // Initial congestion and receive windows, in segments, of the TCP
    // connections to the WAN peers (host routes: worker/transport/
    // initial_window.h); 0 leaves the kernel's (10). Needs CAP_NET_ADMIN.
    int64_t tcpInitialWindow = 0;
    // Data connections to each WAN peer that a payload of several chunks is
    // striped over (worker/transport/zmq_transport.h,
    // TransportConfig::connections), 1..16.
    int64_t connections = 1;

    bool operator==(const Transport&) const = default;
  };

  struct Checkpoint {
    std::string dir;         // empty: no checkpoints
    int64_t interval = 500;  // steps between checkpoints, > 0
    int64_t keep = 3;        // newest checkpoints kept, >= 1
    bool resume = true;      // start from the newest checkpoint in dir if any

    bool operator==(const Checkpoint&) const = default;
  };

  // Where the trained job model goes (train/export.h): empty, nowhere; else a
  // folder that receives model.pt (a state dict torch.load reads) and, where
  // the model can be written as TorchScript, model.torchscript.pt.
  struct Output {
    std::string path;
    // Also export every checkpoint.interval steps, replacing the previous
    // export, so a job that dies leaves its latest model behind.
    bool everyCheckpoint = false;

    bool operator==(const Output&) const = default;
  };

  struct Metrics {
    std::string listen = "0.0.0.0:9400";  // host:port of /metrics; non-empty when enabled
    bool enabled = true;
    double lingerSeconds = 0;  // [0, kMaxSeconds]; keep serving /metrics this long after training

    bool operator==(const Metrics&) const = default;
  };

  struct Log {
    std::string level = "info";   // trace|debug|info|warn|error|critical|off
    std::string format = "text";  // text|json (common/logging.h)

    bool operator==(const Log&) const = default;
  };

  Job job;
  Worker worker;
  Model model;
  Dataset dataset;
  Training training;
  Sync sync;
  Transport transport;
  Checkpoint checkpoint;
  Output output;
  Metrics metrics;
  Log log;

  bool operator==(const WorkerConfig&) const = default;
};

// How much of validateWorkerConfig() parse/load run before returning.
enum class ConfigCheck {
  kFull,        // the result passes validateWorkerConfig()
  kFieldsOnly,  // each field is checked, relations between fields are not:
                // for callers that apply overrides next and validate after
                // the last one (a file may set worker.rank: 3 and rely on
                // --set worker.worldSize=4)
};

// Parses a worker.yaml document over the defaults: keys that are absent, or
// present with a null value (`lr:` or `lr: ~`), keep their default. Plain and
// quoted scalars are read alike (`lr: "0.1"` is 0.1). Errors (InvalidArgument):
// YAML syntax ("<sourceName>:<line>:<column>: YAML syntax error: ..."), more
// than one document, an unknown or duplicate key, a value of the wrong type or
// out of range, both model.builtin and model.torchscript given; each names
// sourceName:line:column and the key path. A text over kMaxConfigBytes, YAML
// nested deeper than kMaxYamlDepth or with more than kMaxYamlNodes nodes is
// refused before it is turned into a tree, with a message naming the bound. Then, with
// ConfigCheck::kFull, the cross-field checks of validateWorkerConfig() (prefixed with sourceName).
StatusOr<WorkerConfig> parseWorkerConfig(std::string_view yamlText, std::string_view sourceName,
                                         ConfigCheck check = ConfigCheck::kFull);

// Reads and parses a file; the path is the sourceName of parse errors. A file
// that is missing is NotFound, one that cannot be read (a directory, no
// permission) is InvalidArgument; both messages name the path. At most
// kMaxConfigBytes are read (a regular file's size is checked first, anything
// else -- /dev/zero, a pipe -- is read up to the bound): a larger one is
// InvalidArgument naming the path and the bound.
StatusOr<WorkerConfig> loadWorkerConfig(const std::filesystem::path& path,
                                        ConfigCheck check = ConfigCheck::kFull);

// Checks every field's range / allowed values (a config built in code never
// went through the parser) and the relations between fields:
//   - worker.rank < worker.worldSize, worker.localRank < worker.regionSize,
//     worker.regionSize <= worker.worldSize;
//   - effective dataset.shardIndex < effective dataset.shardCount;
//   - exactly one of model.builtin and model.torchscript is non-empty;
//   - transport.peers is empty or has worker.worldSize entries;
//   - transport.regions is empty or has worker.worldSize entries, with
//     regions[rank] == worker.region and worker.localRank/regionSize equal
//     to the rank's place among, and the number of, ranks of that region;
//   - dataset.path is non-empty unless dataset.name is synthetic;
//   - metrics.listen is non-empty when metrics.enabled.
// sync.algorithm other than none is allowed with worker.worldSize 1: the
// synchronizer then has no peers and each round is the identity, which keeps
// single-process runs of every algorithm possible (tests, dry runs).
// Returns the first problem found, as InvalidArgument naming the key path.
Status validateWorkerConfig(const WorkerConfig& config);

// Writes every field explicitly, in schema order (null for an unset
// shardIndex/shardCount, `auto` for an automatic delay, [] and {} for empty
// peers and links), so a rendered ConfigMap is complete and readable on its
// own. For every config that passes validateWorkerConfig(),
// parseWorkerConfig(toYaml(c), ...) returns c exactly (doubles are written in
// their shortest round-trip form).
std::string toYaml(const WorkerConfig& config);

// Sets one key from a `--set key=value` flag: dottedKey is a key path
// ("training.lr", "sync.delay", "transport.links.london-tokyo") and value its
// text ("0.1", "auto", "delay=50ms,rate=20mbit"), read like a YAML scalar with
// the same checks and messages as the parser (without a file position).
// Special forms:
//   - transport.peers: comma-separated endpoints (optionally in [ ]); empty
//     clears the list;
//   - transport.links.<regionA-regionB>: sets one link; an empty value removes
//     it; transport.links with an empty value removes all;
//   - dataset.shardIndex / shardCount: "", "~" or "null" unsets (derive);
//   - model.builtin / model.torchscript: a non-empty value clears the other,
//     so an override can switch the model kind.
// On error `config` is unchanged. Relations between fields are not checked
// (overrides are applied one at a time): call validateWorkerConfig() after
// the last one.
Status applyOverride(WorkerConfig& config, std::string_view dottedKey, std::string_view value);

// Places this worker as the `index`-th worker (0-based) of worker.region, for
// the pods of a Kubernetes Indexed Job, which all share one worker.yaml and
// differ only in $(JOB_COMPLETION_INDEX): sets worker.localRank = index,
// worker.rank = the rank of that place in transport.regions (ranks are
// assigned region by region in list order) and worker.regionSize = the
// number of ranks of worker.region. Without transport.regions every
// rank is in worker.region, so worker.rank = index. An index outside the
// region is InvalidArgument naming the region and its size; `config` is then
// unchanged. Call validateWorkerConfig() after.
Status placeByCompletionIndex(WorkerConfig& config, int64_t index);

// `text` as the messages here show a value or key from the input: bytes that
// are not part of a printable UTF-8 character as \xNN (so no control
// sequence or invalid UTF-8 reaches a terminal or log), cut to about 200
// bytes. For callers that quote user input in messages of their own.
std::string printableText(std::string_view text);

// The data shard this worker reads: the configured value, else derived from
// the worker (rank of worldSize).
int64_t effectiveShardIndex(const WorkerConfig& config);
int64_t effectiveShardCount(const WorkerConfig& config);

}  // namespace geo
