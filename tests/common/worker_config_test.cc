#include "common/worker_config.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace geo {
namespace {

constexpr std::string_view kSource = "test.yaml";

// gtest prints a failing comparison of configs as their YAML.
// NOLINTNEXTLINE(readability-identifier-naming): gtest's name
[[maybe_unused]] void PrintTo(const WorkerConfig& config, std::ostream* os) {
  *os << "\n" << toYaml(config);
}

WorkerConfig parseOk(std::string_view yaml) {
  auto config = parseWorkerConfig(yaml, kSource);
  EXPECT_TRUE(config.ok()) << config.status().toString() << "\n" << yaml;
  return config.ok() ? *config : WorkerConfig{};
}

std::string parseError(std::string_view yaml) {
  auto config = parseWorkerConfig(yaml, kSource);
  EXPECT_FALSE(config.ok()) << "accepted:\n" << yaml;
  if (config.ok()) return "";
  EXPECT_EQ(config.status().code(), StatusCode::kInvalidArgument) << config.status().toString();
  return config.status().message();
}

// A document that sets every key to something other than its default.
constexpr std::string_view kFullDocument = R"(# every key, none at its default
job:
  id: wan-demo
  seed: 7
worker:
  rank: 5
  worldSize: 8
  region: tokyo
  localRank: 1
  regionSize: 4
model:
  builtin: resnet18
dataset:
  name: cifar10
  path: /data/cifar10
  shardIndex: 2
  shardCount: 3
  syntheticSamples: 1000
training:
  steps: 20000
  batchSize: 128
  optimizer: adam
  lr: 3e-4
  momentum: 0
  nesterov: true
  weightDecay: 0.0005
  schedule: step
  warmupSteps: 100
  stepSize: 5000
  stepGamma: 0.5
  gradClip: 1.5
  evalInterval: 0
  logInterval: 10
  device: cuda
  threads: 4
sync:
  algorithm: dts
  period: 4
  delay: 2
  swarmH: 2
  codec: fp16
  bits: 8
  bucket: 1024
  errorFeedback: false
  hierarchical: false
  lanCodec: bf16
  timeoutSeconds: 2.5
transport:
  listen: tcp://0.0.0.0:7100
  peers: [tcp://w0:7000, tcp://w1:7000, tcp://w2:7000, tcp://w3:7000,
          tcp://w4:7000, tcp://w5:7000, tcp://w6:7000, tcp://w7:7000]
  regions: [london, london, london, london, tokyo, tokyo, tokyo, tokyo]
  keyDir: /etc/geotrain/keys
  keyGroupReadable: true
  links:
    london-tokyo: delay=120ms,rate=50mbit
    tokyo-oregon: "delay=50ms,rate=20mbit,burst=64kb"
  uplink: rate=100mbit
checkpoint:
  dir: /ckpt
  interval: 250
  keep: 5
  resume: false
metrics:
  listen: 127.0.0.1:9500
  enabled: false
  lingerSeconds: 15
log:
  level: debug
)";

TEST(WorkerConfig, EmptyDocumentGivesDefaults) {
  const WorkerConfig defaults;
  EXPECT_EQ(parseOk(""), defaults);
  EXPECT_EQ(parseOk("# only a comment\n"), defaults);
  EXPECT_EQ(parseOk("~\n"), defaults);
  EXPECT_EQ(parseOk("training:\nsync:\n"), defaults);              // empty sections
  EXPECT_EQ(parseOk("training:\n  lr:\n  steps: ~\n"), defaults);  // null keeps the default
  EXPECT_TRUE(validateWorkerConfig(defaults).ok());

  EXPECT_EQ(defaults.job.id, "geotrain-local");
  EXPECT_EQ(defaults.job.seed, 42u);
  EXPECT_EQ(defaults.worker.worldSize, 1);
  EXPECT_EQ(defaults.model.builtin, "mlp");
  EXPECT_EQ(defaults.dataset.path, "");  // the data set's Debian folder
  EXPECT_FALSE(defaults.dataset.shardIndex.has_value());
  EXPECT_EQ(defaults.training.lr, 0.05);
  EXPECT_EQ(defaults.sync.period, std::nullopt);  // auto
  EXPECT_EQ(defaults.sync.delay, std::nullopt);   // auto
  EXPECT_EQ(defaults.sync.codec, "qsgd");
  EXPECT_EQ(defaults.transport.listen, "tcp://*:7000");
  EXPECT_EQ(defaults.metrics.listen, "0.0.0.0:9400");
  EXPECT_EQ(defaults.log.level, "info");
}

TEST(WorkerConfig, FullDocumentIsReadAndRoundTrips) {
  const WorkerConfig config = parseOk(kFullDocument);
  EXPECT_EQ(config.job.seed, 7u);
  EXPECT_EQ(config.worker.rank, 5);
  EXPECT_EQ(config.dataset.shardIndex, std::optional<int64_t>(2));
  EXPECT_EQ(config.training.lr, 3e-4);
  EXPECT_EQ(config.training.weightDecay, 0.0005);
  EXPECT_TRUE(config.training.nesterov);
  EXPECT_EQ(config.sync.delay, std::optional<int64_t>(2));
  EXPECT_EQ(config.sync.timeoutSeconds, 2.5);
  ASSERT_EQ(config.transport.peers.size(), 8u);
  EXPECT_EQ(config.transport.peers[7], "tcp://w7:7000");
  EXPECT_EQ(config.transport.links.at("tokyo-oregon"), "delay=50ms,rate=20mbit,burst=64kb");
  EXPECT_EQ(config.transport.regions[4], "tokyo");
  EXPECT_EQ(config.transport.uplink, "rate=100mbit");

  // Every key differs from its default, so a key that toYaml() dropped or
  // the reader ignored would show up here.
  const WorkerConfig defaults;
  EXPECT_NE(config.job, defaults.job);
  EXPECT_NE(config.worker, defaults.worker);
  EXPECT_NE(config.model, defaults.model);
  EXPECT_NE(config.dataset, defaults.dataset);
  EXPECT_NE(config.training, defaults.training);
  EXPECT_NE(config.sync, defaults.sync);
  EXPECT_NE(config.transport, defaults.transport);
  EXPECT_NE(config.checkpoint, defaults.checkpoint);
  EXPECT_NE(config.metrics, defaults.metrics);
  EXPECT_NE(config.log, defaults.log);

  const std::string yaml = toYaml(config);
  EXPECT_EQ(parseOk(yaml), config) << yaml;
  EXPECT_EQ(parseOk(toYaml(defaults)), defaults);
}

TEST(WorkerConfig, RoundTripKeepsAwkwardValues) {
  WorkerConfig config;
  config.job.id = "123";         // would read back as a number unquoted
  config.worker.region = "yes";  // a YAML 1.1 boolean
  config.dataset.path = "null";  // a YAML null
  config.checkpoint.dir = "";    // empty
  config.transport.keyDir = "keys dir/with: colon # and hash";
  config.model.builtin = "";
  config.model.torchscript = "/models/net.pt";
  config.sync.delay = std::nullopt;  // auto
  config.dataset.shardCount = 1;
  config.training.lr = 0.1 + 0.2;  // not the shortest decimal of anything simple
  config.training.weightDecay = 1e-300;
  config.job.seed = UINT64_MAX;
  config.transport.links["a-b"] = "";
  config.transport.links["true"] = "delay=1ms";
  ASSERT_TRUE(validateWorkerConfig(config).ok()) << validateWorkerConfig(config).toString();

  const std::string yaml = toYaml(config);
  EXPECT_EQ(parseOk(yaml), config) << yaml;
  EXPECT_NE(yaml.find("delay: auto"), std::string::npos) << yaml;
  EXPECT_NE(yaml.find("shardIndex: ~"), std::string::npos) << yaml;
  EXPECT_NE(yaml.find("id: \"123\""), std::string::npos) << yaml;
}

TEST(WorkerConfig, AutoDelay) {
  const WorkerConfig config = parseOk("sync:\n  algorithm: dts\n  delay: auto\n");
  EXPECT_FALSE(config.sync.delay.has_value());
  EXPECT_EQ(parseOk("sync:\n  delay: \"auto\"\n").sync.delay, std::nullopt);
  EXPECT_EQ(parseOk("sync:\n  delay: 16\n").sync.delay, std::optional<int64_t>(16));
}

TEST(WorkerConfig, ScalarsAreReadByTheirText) {
  const WorkerConfig config = parseOk(
      "training:\n  lr: \"0.1\"\n  steps: +5\n  nesterov: True\n  momentum: .5\n"
      "job:\n  id: 17\n");
  EXPECT_EQ(config.training.lr, 0.1);
  EXPECT_EQ(config.training.steps, 5);
  EXPECT_TRUE(config.training.nesterov);
  EXPECT_EQ(config.training.momentum, 0.5);
  EXPECT_EQ(config.job.id, "17");
}

TEST(WorkerConfig, ModelKinds) {
  const WorkerConfig script = parseOk("model:\n  torchscript: /m.pt\n");
  EXPECT_EQ(script.model.builtin, "");
  EXPECT_EQ(script.model.torchscript, "/m.pt");
  EXPECT_EQ(parseOk("model:\n  builtin: cnn\n  torchscript: \"\"\n").model.builtin, "cnn");
  EXPECT_EQ(parseOk("model:\n  builtin: \"\"\n  torchscript: /m.pt\n"), script);
}

TEST(WorkerConfig, SyncAlgorithmsRunAlone) {
  // Documented choice: sync with worldSize 1 is allowed (identity rounds).
  for (const char* algorithm : {"none", "allreduce", "dts", "swarm"}) {
    EXPECT_EQ(parseOk(std::string("sync:\n  algorithm: ") + algorithm + "\n").sync.algorithm,
              algorithm);
  }
}

TEST(WorkerConfig, EffectiveShard) {
  WorkerConfig config;
  config.worker.rank = 3;
  config.worker.worldSize = 4;
  EXPECT_EQ(effectiveShardIndex(config), 3);
  EXPECT_EQ(effectiveShardCount(config), 4);
  // A region's own copy: split among the region's workers.
  config.worker.localRank = 1;
  config.worker.regionSize = 2;
  config.dataset.sharding = "region";
  EXPECT_EQ(effectiveShardIndex(config), 1);
  EXPECT_EQ(effectiveShardCount(config), 2);
  // auto, left to a worker run by hand, is the job's split.
  config.dataset.sharding = "auto";
  EXPECT_EQ(effectiveShardIndex(config), 3);
  EXPECT_EQ(effectiveShardCount(config), 4);
  config.dataset.shardIndex = 0;
  config.dataset.shardCount = 1;
  EXPECT_EQ(effectiveShardIndex(config), 0);
  EXPECT_EQ(effectiveShardCount(config), 1);
  EXPECT_EQ(parseOk("dataset:\n  sharding: region\n").dataset.sharding, "region");
}

// ---- Errors ----

struct ErrorCase {
  std::string yaml;
  std::vector<std::string> expected;  // substrings of the message, in any order
};

// NOLINTNEXTLINE(readability-identifier-naming): gtest's name
[[maybe_unused]] void PrintTo(const ErrorCase& c, std::ostream* os) {
  *os << "\n" << c.yaml;
}

class WorkerConfigError : public testing::TestWithParam<ErrorCase> {};

TEST_P(WorkerConfigError, NamesPathValueAndAllowed) {
  const ErrorCase& c = GetParam();
  const std::string message = parseError(c.yaml);
  EXPECT_EQ(message.rfind("test.yaml", 0), 0u) << message;
  for (const std::string& part : c.expected) {
    EXPECT_NE(message.find(part), std::string::npos)
        << "message: " << message << "\nlacks: " << part << "\nyaml:\n"
        << c.yaml;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, WorkerConfigError,
    testing::Values(
        // Unknown keys, with suggestions.
        ErrorCase{"training:\n  lrr: 0.1\n",
                  {"test.yaml:2:3: training.lrr: unknown key",
                   "(allowed: steps, batchSize, optimizer, lr,", "did you mean 'lr'?"}},
        ErrorCase{"trainig:\n  lr: 1\n",
                  {"test.yaml:1:1: trainig: unknown key", "(allowed: job, worker, model,",
                   "did you mean 'training'?"}},
        ErrorCase{"sync:\n  zzz: 1\n", {"sync.zzz: unknown key (allowed: algorithm, period,"}},
        ErrorCase{"metrics:\n  port: 1\n",
                  {"metrics.port: unknown key (allowed: listen, enabled, lingerSeconds)"}},
        ErrorCase{"worker:\n  worldsize: 2\n", {"did you mean 'worldSize'?"}},
        ErrorCase{"training:\n  lr: 1\n  lr: 2\n", {"test.yaml:3:3: training.lr: duplicate key"}},
        ErrorCase{"log:\n  level: info\nlog:\n  level: warn\n",
                  {"test.yaml:3:1: log: duplicate key"}},
        // Bad values: path, the value given, what is allowed.
        ErrorCase{"sync:\n  bits: 3\n",
                  {"test.yaml:2:9: sync.bits: 3 is not allowed (allowed: 2, 4, 8)"}},
        ErrorCase{"training:\n  optimizer: adamw\n",
                  {"training.optimizer: adamw is not allowed (allowed: sgd, adam)"}},
        ErrorCase{"training:\n  lr: -1\n",
                  {"training.lr: -1 is not allowed (allowed: a number > 0)"}},
        ErrorCase{"training:\n  lr: fast\n",
                  {"training.lr: fast is not allowed (allowed: a number > 0)"}},
        ErrorCase{"training:\n  lr: .inf\n", {"training.lr: .inf is not allowed"}},
        ErrorCase{"training:\n  lr: nan\n", {"training.lr: nan is not allowed"}},
        ErrorCase{"training:\n  momentum: 1\n",
                  {"training.momentum: 1 is not allowed (allowed: a number in [0, 1))"}},
        ErrorCase{"training:\n  stepGamma: 0\n",
                  {"training.stepGamma: 0 is not allowed (allowed: a number in (0, 1])"}},
        ErrorCase{"training:\n  weightDecay: -0.1\n",
                  {"training.weightDecay: -0.1 is not allowed (allowed: a number >= 0)"}},
        ErrorCase{"metrics:\n  lingerSeconds: -1\n",
                  {"metrics.lingerSeconds: -1 is not allowed (allowed: a number of seconds in [0, "
                   "1000000])"}},
        ErrorCase{"training:\n  steps: 0\n",
                  {"training.steps: 0 is not allowed (allowed: an integer >= 1)"}},
        ErrorCase{"training:\n  batchSize: 1.5\n",
                  {"training.batchSize: 1.5 is not allowed (allowed: an integer >= 1)"}},
        ErrorCase{"training:\n  steps: 99999999999999999999\n",
                  {"training.steps: 99999999999999999999 is not allowed"}},
        ErrorCase{"training:\n  nesterov: yes\n",
                  {"training.nesterov: yes is not allowed (allowed: true, false)"}},
        ErrorCase{"training:\n  schedule: linear\n",
                  {"training.schedule: linear is not allowed (allowed: constant, cosine, step)"}},
        ErrorCase{"training:\n  device: tpu\n",
                  {"training.device: tpu is not allowed (allowed: auto, cpu, cuda)"}},
        ErrorCase{"training:\n  evalInterval: -1\n", {"training.evalInterval: -1 is not allowed"}},
        ErrorCase{"training:\n  lr: [1]\n",
                  {"training.lr: a sequence is not allowed (allowed: a number > 0)"}},
        ErrorCase{"sync:\n  delay: soon\n",
                  {"sync.delay: soon is not allowed (allowed: an integer >= 0, or auto)"}},
        ErrorCase{"sync:\n  delay: -2\n", {"sync.delay: -2 is not allowed"}},
        ErrorCase{"sync:\n  period: 0\n",
                  {"sync.period: 0 is not allowed (allowed: an integer >= 1, or auto)"}},
        ErrorCase{"sync:\n  algorithm: gossip\n",
                  {"sync.algorithm: gossip is not allowed (allowed: none, allreduce, dts, swarm)"}},
        ErrorCase{"sync:\n  codec: zstd\n",
                  {"sync.codec: zstd is not allowed (allowed: identity, fp16, bf16, qsgd)"}},
        ErrorCase{"sync:\n  lanCodec: qsgd\n",
                  {"sync.lanCodec: qsgd is not allowed (allowed: identity, bf16)"}},
        ErrorCase{"sync:\n  timeoutSeconds: 0\n", {"sync.timeoutSeconds: 0 is not allowed"}},
        ErrorCase{"job:\n  seed: -1\n",
                  {"job.seed: -1 is not allowed (allowed: an integer 0..18446744073709551615)"}},
        ErrorCase{"job:\n  id: \"\"\n",
                  {"job.id: \"\" is not allowed (allowed: 1 to 512 bytes of printable UTF-8 (no "
                   "control characters))"}},
        ErrorCase{"log:\n  level: verbose\n",
                  {"log.level: verbose is not allowed (allowed: trace, debug, info, warn, error, "
                   "critical, off)"}},
        ErrorCase{"model:\n  builtin: vgg\n",
                  {"model.builtin: vgg is not allowed (allowed: mlp, cnn, resnet18, gpt)"}},
        ErrorCase{"dataset:\n  name: imagenet\n",
                  {"dataset.name: imagenet is not allowed (allowed: fashion-mnist, mnist, "
                   "cifar10, synthetic, npy, tokens)"}},
        ErrorCase{"dataset:\n  shardCount: 0\n",
                  {"dataset.shardCount: 0 is not allowed (allowed: an integer >= 1, or null"}},
        ErrorCase{"checkpoint:\n  keep: 0\n", {"checkpoint.keep: 0 is not allowed"}},
        ErrorCase{"checkpoint:\n  interval: 0\n", {"checkpoint.interval: 0 is not allowed"}},
        // Wrong shapes.
        ErrorCase{"training: 5\n",
                  {"test.yaml:1:11: training: a scalar is not allowed (allowed: a mapping of "
                   "steps, batchSize,"}},
        ErrorCase{"- training\n", {"a sequence is not allowed at the top level"}},
        ErrorCase{"transport:\n  peers: {a: b}\n",
                  {"transport.peers: a mapping is not allowed (allowed: a list of endpoints"}},
        ErrorCase{"worker:\n  worldSize: 2\ntransport:\n  peers: [tcp://a:1, [tcp://b:1]]\n",
                  {"test.yaml:4:22: transport.peers[1]: a sequence is not allowed"}},
        ErrorCase{"transport:\n  peers: [\"tcp://a:1 x\"]\n",
                  {"transport.peers[0]: tcp://a:1 x is not allowed"}},
        ErrorCase{"transport:\n  links: [a]\n",
                  {"transport.links: a sequence is not allowed (allowed: a mapping of "
                   "regionA-regionB: link profile"}},
        ErrorCase{"transport:\n  links:\n    london-tokyo: {delay: 1}\n",
                  {"transport.links.london-tokyo: a mapping is not allowed (allowed: a link "
                   "profile string"}},
        ErrorCase{"transport:\n  links:\n    a-b: x\n    a-b: y\n",
                  {"transport.links.a-b: duplicate key"}},
        ErrorCase{"a: 1\n---\nb: 2\n",
                  {"test.yaml: 2 YAML documents is not allowed (allowed: one)"}},
        // Cross-field checks.
        ErrorCase{"worker:\n  rank: 2\n  worldSize: 2\n",
                  {"test.yaml: worker.rank: 2 is not allowed (allowed: 0..1, below "
                   "worker.worldSize = 2)"}},
        ErrorCase{"worker:\n  localRank: 1\n",
                  {"worker.localRank: 1 is not allowed (allowed: 0..0, below worker.regionSize = "
                   "1)"}},
        ErrorCase{"worker:\n  worldSize: 2\n  regionSize: 3\n",
                  {"worker.regionSize: 3 is not allowed (allowed: 1..2, at most worker.worldSize "
                   "= 2)"}},
        ErrorCase{"dataset:\n  shardIndex: 2\n  shardCount: 2\n",
                  {"dataset.shardIndex: 2 is not allowed (allowed: 0..1, below dataset.shardCount "
                   "= 2)"}},
        ErrorCase{"worker:\n  rank: 3\n  worldSize: 4\ndataset:\n  shardCount: 2\n",
                  {"dataset.shardIndex: 3 (derived from worker.rank) is not allowed (allowed: "
                   "0..1"}},
        ErrorCase{"model:\n  builtin: cnn\n  torchscript: /m.pt\n",
                  {"test.yaml:3:3: model: builtin and torchscript are both set (allowed: one of "
                   "them)"}},
        ErrorCase{"model:\n  builtin: \"\"\n",
                  {"model: neither builtin nor torchscript is set (allowed: builtin: mlp, cnn, "
                   "resnet18; or torchscript: a file path)"}},
        ErrorCase{"worker:\n  worldSize: 3\ntransport:\n  peers: [tcp://a:1, tcp://b:1]\n",
                  {"transport.peers: 2 endpoints is not allowed (allowed: none, or one per rank: "
                   "worker.worldSize = 3)"}},
        ErrorCase{"worker:\n  worldSize: 2\ntransport:\n  regions: [a]\n",
                  {"transport.regions: 1 names is not allowed (allowed: none, or one per rank: "
                   "worker.worldSize = 2)"}},
        ErrorCase{"worker:\n  worldSize: 2\n  region: b\ntransport:\n  regions: [a, b]\n",
                  {"worker.region: \"b\" is not allowed (allowed: \"a\", transport.regions[0])"}},
        ErrorCase{"worker:\n  worldSize: 3\n  rank: 2\n  region: a\n  localRank: 0\n"
                  "transport:\n  regions: [a, b, a]\n",
                  {"worker.localRank/regionSize: 0/1 is not allowed (allowed: 1/2, rank 2's "
                   "place among the ranks of region a in transport.regions)"}},
        ErrorCase{"transport:\n  regions: [London]\n",
                  {"test.yaml:2:13: transport.regions[0]: London is not allowed (allowed: a "
                   "region name"}},
        ErrorCase{"dataset:\n  name: npy\n  path: \"\"\n",
                  {"dataset.path: \"\" is not allowed with dataset.name: npy (allowed: the "
                   "folder holding train_x.npy"}},
        ErrorCase{
            "training:\n  loss: hinge\n",
            {"training.loss: hinge is not allowed (allowed: cross-entropy, mse, next-token)"}},
        ErrorCase{"model:\n  classes: -1\n", {"model.classes: -1 is not allowed"}},
        ErrorCase{"dataset:\n  name: tokens\n  path: /data\n",
                  {"training.loss: cross-entropy is not allowed with dataset.name: tokens "
                   "(allowed: next-token)"}},
        ErrorCase{"model:\n  builtin: gpt\n",
                  {"model.builtin: gpt is not allowed with dataset.name: fashion-mnist (allowed: "
                   "tokens"}},
        ErrorCase{"model:\n  builtin: gpt\n  heads: 3\ndataset:\n  name: tokens\n  path: /d\n"
                  "training:\n  loss: next-token\n",
                  {"model.heads: 3 is not allowed (allowed: a divisor of model.width = 128)"}},
        ErrorCase{"dataset:\n  tokenBytes: 3\n", {"dataset.tokenBytes: 3 is not allowed"}},
        ErrorCase{"dataset:\n  name: npy\n  path: /d\n  sharding: region\n",
                  {"model.classes: 0 is not allowed with dataset.sharding: region and "
                   "dataset.name: npy (allowed: the job's class count"}},
        ErrorCase{"dataset:\n  sharding: rack\n",
                  {"dataset.sharding: rack is not allowed (allowed: auto, job, region)"}},
        ErrorCase{"metrics:\n  listen: \"\"\n",
                  {"metrics.listen: \"\" is not allowed (allowed: host:port while "
                   "metrics.enabled is true)"}}));

// Bounds: every count, size and duration has a maximum the runtime can
// honour, checked before anything is allocated or converted for it.
INSTANTIATE_TEST_SUITE_P(
    Bounds, WorkerConfigError,
    testing::Values(
        ErrorCase{"worker:\n  worldSize: 9223372036854775807\n",
                  {"test.yaml:2:14: worker.worldSize: 9223372036854775807 is not allowed "
                   "(allowed: an integer 1..4096)"}},
        ErrorCase{"worker:\n  worldSize: 4097\n",
                  {"worker.worldSize: 4097 is not allowed (allowed: an integer 1..4096)"}},
        ErrorCase{"worker:\n  rank: 4096\n",
                  {"worker.rank: 4096 is not allowed (allowed: an integer 0..4095)"}},
        ErrorCase{"worker:\n  regionSize: 5000\n",
                  {"worker.regionSize: 5000 is not allowed (allowed: an integer 1..4096)"}},
        ErrorCase{"training:\n  threads: 100000\n",
                  {"training.threads: 100000 is not allowed (allowed: an integer 0..1024)"}},
        ErrorCase{"sync:\n  timeoutSeconds: 1e308\n",
                  {"sync.timeoutSeconds: 1e308 is not allowed (allowed: a number of seconds in "
                   "[0.001, 1000000])"}},
        ErrorCase{"sync:\n  timeoutSeconds: 0.0001\n",
                  {"sync.timeoutSeconds: 0.0001 is not allowed (allowed: a number of seconds in "
                   "[0.001, 1000000])"}},
        ErrorCase{"sync:\n  peerTimeoutSeconds: 1e308\n",
                  {"sync.peerTimeoutSeconds: 1e308 is not allowed (allowed: 0 (auto), or a number "
                   "of seconds in [0.001, 1000000])"}},
        ErrorCase{"sync:\n  peerTimeoutSeconds: 0.0005\n",
                  {"sync.peerTimeoutSeconds: 0.0005 is not allowed"}},
        ErrorCase{"metrics:\n  lingerSeconds: 1000001\n",
                  {"metrics.lingerSeconds: 1000001 is not allowed (allowed: a number of seconds "
                   "in [0, 1000000])"}},
        ErrorCase{"dataset:\n  syntheticSamples: 1000001\n",
                  {"dataset.syntheticSamples: 1000001 is not allowed (allowed: an integer "
                   "1..1000000)"}},
        ErrorCase{"sync:\n  bucket: 2147483648\n",
                  {"sync.bucket: 2147483648 is not allowed (allowed: an integer 1..1073741824)"}},
        // Names: what reaches metrics labels and paths.
        ErrorCase{"worker:\n  region: London\n",
                  {"worker.region: London is not allowed (allowed: a region name: lowercase "
                   "letters, digits and '-', starting and ending with a letter or digit, at most "
                   "63 characters)"}},
        ErrorCase{"worker:\n  region: \"eu west\"\n", {"worker.region: eu west is not allowed"}},
        ErrorCase{"job:\n  id: \"line\\nbreak\"\n",
                  {"job.id: line\\x0abreak is not allowed (allowed: 1 to 512 bytes of printable "
                   "UTF-8 (no control characters))"}},
        ErrorCase{"job:\n  id: " + std::string(513, 'j') + "\n",
                  {"job.id: jjjj", "... (513 bytes) is not allowed (allowed: 1 to 512 bytes"}},
        // Shapes and sizes of the document itself.
        ErrorCase{"worker:\n  worldSize: 2\ntransport:\n  peers: [" +
                      [] {
                        std::string items;
                        for (int i = 0; i < 5000; ++i) items += "tcp://h:1,";
                        return items;
                      }() +
                      "]\n",
                  {"test.yaml:4:10: transport.peers: 5000 entries is not allowed (allowed: at "
                   "most 4096, one per rank"}},
        ErrorCase{"training:\n  lr: " + std::string(20000, '[') + std::string(20000, ']') + "\n",
                  {"test.yaml:2:",
                   ": YAML nested more than 32 levels deep is not allowed "
                   "(allowed: at most 32 levels; worker.yaml uses 3)"}},
        ErrorCase{"transport:\n  regions: [" +
                      [] {
                        std::string items;
                        for (int i = 0; i < 70000; ++i) items += "a,";
                        return items;
                      }() +
                      "]\n",
                  {"test.yaml:2:",
                   ": more than 65536 YAML nodes is not allowed (allowed: at "
                   "most 65536;"}}));

TEST(WorkerConfig, BoundsAdmitTheirLimits) {
  WorkerConfig config = parseOk(
      "job:\n  id: team-a/run-7/3f2a9c1e-0b4d-4c8e-9f00-123456789abc\n"
      "worker:\n  rank: 4095\n  worldSize: 4096\n  localRank: 4095\n  regionSize: 4096\n"
      "training:\n  threads: 1024\n"
      "sync:\n  timeoutSeconds: 1000000\n  peerTimeoutSeconds: 0.001\n  bucket: 1073741824\n"
      "metrics:\n  lingerSeconds: 1e6\n"
      "dataset:\n  syntheticSamples: 1000000\n");
  EXPECT_EQ(config.worker.worldSize, 4096);
  EXPECT_EQ(config.sync.timeoutSeconds, 1e6);
  EXPECT_EQ(
      parseOk("sync:\n  timeoutSeconds: 0.001\n  peerTimeoutSeconds: 0\n").sync.timeoutSeconds,
      0.001);
  // job.id is any printable UTF-8, not only ASCII.
  EXPECT_EQ(parseOk("job:\n  id: \"m\xc3\xbcnchen \xe3\x82\xb8\xe3\x83\xa7\xe3\x83\x96\"\n").job.id,
            "m\xc3\xbcnchen \xe3\x82\xb8\xe3\x83\xa7\xe3\x83\x96");
  EXPECT_TRUE(parseOk(std::string("job:\n  id: ") + std::string(512, 'j') + "\n").job.id.size() ==
              512);
}

// Bytes that are not printable UTF-8 never reach a config (job.id is a
// metrics label) nor a message (they go to terminals and logs): messages show
// them as \xNN and cut long values short.
TEST(WorkerConfig, HostileTextIsRefusedAndShownEscaped) {
  WorkerConfig config;
  const std::vector<std::pair<std::string, std::string>> ids = {
      {"a\xff", "a\\xff"},                    // not UTF-8
      {"a\xc0\xaf", "a\\xc0\\xaf"},           // overlong '/'
      {"a\xed\xa0\x80", "a\\xed\\xa0\\x80"},  // a surrogate
      {"a\x1b[2J", "a\\x1b[2J"},              // a terminal escape
      {"a\xc2\x85", "a\\xc2\\x85"},           // C1 control NEL
      {"a\x7f", "a\\x7f"},                    // DEL
  };
  for (const auto& [id, escaped] : ids) {
    const Status status = applyOverride(config, "job.id", id);
    EXPECT_EQ(status.message(), "job.id: " + escaped +
                                    " is not allowed (allowed: 1 to 512 bytes of printable UTF-8 "
                                    "(no control characters))")
        << escaped;
    WorkerConfig direct;
    direct.job.id = id;
    EXPECT_FALSE(validateWorkerConfig(direct).ok()) << escaped;
  }
  EXPECT_EQ(config, WorkerConfig{});

  // Raw bytes in a file: refused or read as printable UTF-8, never kept raw.
  auto parsed = parseWorkerConfig(
      "job:\n  id: a\xff\x1b"
      "b\n",
      kSource);
  if (parsed.ok()) {
    EXPECT_EQ(parsed->job.id.find('\x1b'), std::string::npos);
    EXPECT_EQ(parsed->job.id.find('\xff'), std::string::npos);
  }

  // Keys and values of any length and content are shown escaped and short.
  const std::string message = parseError("training:\n  \"lr\\e[2J\": 1\n");
  EXPECT_NE(message.find("training.lr\\x1b[2J: unknown key"), std::string::npos) << message;
  EXPECT_EQ(message.find('\x1b'), std::string::npos) << message;
  const std::string huge(100000, 'x');
  const std::string longValue = parseError("training:\n  optimizer: " + huge + "\n");
  EXPECT_LT(longValue.size(), 400u) << longValue;
  EXPECT_NE(longValue.find("... (100000 bytes) is not allowed (allowed: sgd, adam)"),
            std::string::npos)
      << longValue;
  const Status longKey = applyOverride(config, "training." + huge, "1");
  EXPECT_LT(longKey.message().size(), 600u);
  const Status peers = applyOverride(config, "transport.peers", [] {
    std::string list;
    for (int i = 0; i < 5000; ++i) list += "tcp://h:1,";
    return list + "tcp://h:1";
  }());
  EXPECT_NE(peers.message().find("(allowed: a list of endpoints such as tcp://host:7000, one per "
                                 "rank, at most 4096)"),
            std::string::npos)
      << peers.message();
}

TEST(WorkerConfig, NestingAtTheLimitIsAShapeErrorNotADepthError) {
  // 2 levels (sections, keys) + 30 brackets = 32: read, then refused by the
  // schema; one more bracket is refused for its depth.
  const std::string ok =
      parseError("transport:\n  peers: " + std::string(30, '[') + std::string(30, ']') + "\n");
  EXPECT_NE(ok.find("transport.peers[0]: a sequence is not allowed"), std::string::npos) << ok;
  const std::string deep =
      parseError("transport:\n  peers: " + std::string(31, '[') + std::string(31, ']') + "\n");
  EXPECT_NE(deep.find("YAML nested more than 32 levels deep"), std::string::npos) << deep;
}

TEST(WorkerConfig, TextOverOneMebibyteIsRefused) {
  std::string text = "# " + std::string(size_t{1} << 20, 'x') + "\n";
  EXPECT_EQ(parseError(text),
            "test.yaml: a worker config of 1048579 bytes is not allowed (allowed: at most 1048576 "
            "bytes, 1 MiB)");
}

TEST(WorkerConfig, SyntaxErrorHasLineAndColumn) {
  const std::string message = parseError("training:\n  lr: 0.1\n  steps: [1, 2\n");
  EXPECT_EQ(message.rfind("test.yaml:4:1: YAML syntax error: ", 0), 0u) << message;
  EXPECT_EQ(parseError("training:\n  lr: 0.1\n  - x\n"),
            "test.yaml:3:3: YAML syntax error: end of map not found");
  EXPECT_EQ(parseError("training:\n  lr: 0.1\n\tsteps: 1\n"),
            "test.yaml:3:1: YAML syntax error: illegal tab when looking for indentation");
}

TEST(WorkerConfig, ValidateChecksFieldsOfConfigsBuiltInCode) {
  WorkerConfig config;
  config.sync.bits = 3;
  EXPECT_EQ(validateWorkerConfig(config).message(),
            "sync.bits: 3 is not allowed (allowed: 2, 4, 8)");
  config = WorkerConfig{};
  config.training.optimizer = "";
  EXPECT_EQ(validateWorkerConfig(config).message(),
            "training.optimizer: \"\" is not allowed (allowed: sgd, adam)");
  config = WorkerConfig{};
  config.transport.peers = {"tcp://a:1", ""};
  config.worker.worldSize = 2;
  EXPECT_EQ(validateWorkerConfig(config).message().rfind(
                "transport.peers: [tcp://a:1, \"\"] is not allowed", 0),
            0u)
      << validateWorkerConfig(config).message();
}

// ---- Overrides ----

TEST(WorkerConfig, OverridesSetValues) {
  WorkerConfig config;
  ASSERT_TRUE(applyOverride(config, "training.lr", "0.1").ok());
  EXPECT_EQ(config.training.lr, 0.1);
  ASSERT_TRUE(applyOverride(config, "sync.delay", "auto").ok());
  EXPECT_EQ(config.sync.delay, std::nullopt);
  ASSERT_TRUE(applyOverride(config, "sync.delay", "16").ok());
  EXPECT_EQ(config.sync.delay, std::optional<int64_t>(16));
  ASSERT_TRUE(applyOverride(config, "sync.period", "auto").ok());
  EXPECT_EQ(config.sync.period, std::nullopt);
  EXPECT_NE(toYaml(config).find("period: auto"), std::string::npos);
  ASSERT_TRUE(applyOverride(config, "sync.period", "2").ok());
  EXPECT_EQ(config.sync.period, std::optional<int64_t>(2));
  ASSERT_TRUE(applyOverride(config, "training.nesterov", "true").ok());
  EXPECT_TRUE(config.training.nesterov);
  ASSERT_TRUE(applyOverride(config, "checkpoint.dir", "").ok());
  EXPECT_EQ(config.checkpoint.dir, "");

  ASSERT_TRUE(applyOverride(config, "transport.peers", "tcp://a:7000, tcp://b:7000").ok());
  EXPECT_EQ(config.transport.peers, (std::vector<std::string>{"tcp://a:7000", "tcp://b:7000"}));
  ASSERT_TRUE(applyOverride(config, "transport.peers", "[tcp://c:7000]").ok());
  EXPECT_EQ(config.transport.peers, std::vector<std::string>{"tcp://c:7000"});
  ASSERT_TRUE(applyOverride(config, "transport.peers", "").ok());
  EXPECT_TRUE(config.transport.peers.empty());
  ASSERT_TRUE(applyOverride(config, "transport.regions", "london, us-east-1").ok());
  EXPECT_EQ(config.transport.regions, (std::vector<std::string>{"london", "us-east-1"}));
  EXPECT_EQ(applyOverride(config, "transport.regions", "london,-x").message(),
            "transport.regions: london,-x is not allowed (allowed: a list of region names "
            "(lowercase DNS labels such as us-east), one per rank, at most 4096)");
  ASSERT_TRUE(applyOverride(config, "transport.uplink", "rate=100mbit").ok());
  EXPECT_EQ(config.transport.uplink, "rate=100mbit");
  ASSERT_TRUE(applyOverride(config, "transport.regions", "").ok());

  ASSERT_TRUE(applyOverride(config, "transport.links.london-tokyo", "delay=50ms,rate=20mbit").ok());
  ASSERT_TRUE(applyOverride(config, "transport.links.tokyo-ohio", "delay=80ms").ok());
  EXPECT_EQ(config.transport.links.at("london-tokyo"), "delay=50ms,rate=20mbit");
  ASSERT_TRUE(applyOverride(config, "transport.links.london-tokyo", "").ok());
  EXPECT_EQ(config.transport.links.size(), 1u);
  ASSERT_TRUE(applyOverride(config, "transport.links", "").ok());
  EXPECT_TRUE(config.transport.links.empty());

  ASSERT_TRUE(applyOverride(config, "dataset.shardIndex", "0").ok());
  EXPECT_EQ(config.dataset.shardIndex, std::optional<int64_t>(0));
  ASSERT_TRUE(applyOverride(config, "dataset.shardIndex", "null").ok());
  EXPECT_EQ(config.dataset.shardIndex, std::nullopt);

  ASSERT_TRUE(applyOverride(config, "model.torchscript", "/m.pt").ok());
  EXPECT_EQ(config.model.builtin, "");
  ASSERT_TRUE(applyOverride(config, "model.builtin", "cnn").ok());
  EXPECT_EQ(config.model.torchscript, "");
  EXPECT_EQ(config.model.builtin, "cnn");
  EXPECT_TRUE(validateWorkerConfig(config).ok()) << validateWorkerConfig(config).toString();
}

TEST(WorkerConfig, OverrideErrorsMatchTheParser) {
  // The same key and value given in YAML and as --set: the same message,
  // less the file position.
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"sync.bits", "3"},          {"training.lr", "-1"},  {"training.lrr", "1"},
      {"training.optimizer", "x"}, {"sync.delay", "soon"}, {"training.nesterov", "yes"},
      {"job.seed", "-1"},          {"worker.region", ""},  {"log.level", "loud"},
      {"dataset.shardCount", "0"},
  };
  for (const auto& [key, value] : cases) {
    WorkerConfig config;
    const WorkerConfig before = config;
    const Status status = applyOverride(config, key, value);
    ASSERT_FALSE(status.ok()) << key << "=" << value;
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(config, before) << "a failed override changed the config";

    const size_t dot = key.find('.');
    const std::string yaml =
        key.substr(0, dot) + ":\n  " + key.substr(dot + 1) + ": \"" + value + "\"\n";
    const std::string parsed = parseError(yaml);
    const size_t pathAt = parsed.find(key.substr(0, dot) + ".");
    ASSERT_NE(pathAt, std::string::npos) << parsed;
    EXPECT_EQ(parsed.substr(pathAt), status.message()) << yaml;
  }
  WorkerConfig config;
  EXPECT_EQ(applyOverride(config, "sync.bits", "3").message(),
            "sync.bits: 3 is not allowed (allowed: 2, 4, 8)");
}

TEST(WorkerConfig, OverrideKeyErrors) {
  WorkerConfig config;
  EXPECT_EQ(applyOverride(config, "trainig.lr", "1")
                .message()
                .rfind("trainig: unknown key (allowed: job, worker,", 0),
            0u);
  EXPECT_NE(applyOverride(config, "trainig.lr", "1").message().find("did you mean 'training'?"),
            std::string::npos);
  EXPECT_NE(applyOverride(config, "training", "1")
                .message()
                .find("training: a section cannot be set (allowed: one of its keys: steps,"),
            std::string::npos);
  EXPECT_EQ(applyOverride(config, "training.lr.x", "1").message(),
            "training.lr.x: unknown key (training.lr is a value, not a section)");
  EXPECT_NE(applyOverride(config, "transport.links", "delay=1ms")
                .message()
                .find("transport.links: delay=1ms is not allowed"),
            std::string::npos);
  EXPECT_FALSE(applyOverride(config, "transport.links.", "delay=1ms").ok());
  EXPECT_EQ(config, WorkerConfig{});
}

TEST(WorkerConfig, OverridesThenValidate) {
  // A file may rely on overrides for its relations: check fields only, then
  // validate after the last override.
  constexpr std::string_view kYaml = "worker:\n  rank: 3\n";
  EXPECT_FALSE(parseWorkerConfig(kYaml, kSource).ok());
  auto config = parseWorkerConfig(kYaml, kSource, ConfigCheck::kFieldsOnly);
  ASSERT_TRUE(config.ok()) << config.status().toString();
  EXPECT_FALSE(validateWorkerConfig(*config).ok());
  ASSERT_TRUE(applyOverride(*config, "worker.worldSize", "4").ok());
  EXPECT_TRUE(validateWorkerConfig(*config).ok());
  // Field checks still apply with kFieldsOnly.
  EXPECT_FALSE(parseWorkerConfig("sync:\n  bits: 3\n", kSource, ConfigCheck::kFieldsOnly).ok());
}

// ---- Files ----

class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "worker_config_test.XXXXXX");
    path_ = ::mkdtemp(pattern.data()) ? std::filesystem::path(pattern) : std::filesystem::path();
  }
  ~TempDir() {
    std::error_code ignored;
    if (!path_.empty()) std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

TEST(WorkerConfig, LoadFile) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());

  const auto missing = dir.path() / "missing.yaml";
  auto result = loadWorkerConfig(missing);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), StatusCode::kNotFound);
  EXPECT_NE(result.status().message().find(missing.string()), std::string::npos)
      << result.status().message();

  result = loadWorkerConfig(dir.path());
  ASSERT_FALSE(result.ok());
  EXPECT_NE(result.status().message().find(dir.path().string()), std::string::npos);
  EXPECT_NE(result.status().message().find("is a directory"), std::string::npos);

  const auto good = dir.path() / "worker.yaml";
  std::ofstream(good) << kFullDocument;
  result = loadWorkerConfig(good);
  ASSERT_TRUE(result.ok()) << result.status().toString();
  EXPECT_EQ(*result, parseOk(kFullDocument));

  const auto bad = dir.path() / "bad.yaml";
  std::ofstream(bad) << "sync:\n  bits: 5\n";
  result = loadWorkerConfig(bad);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().message(),
            bad.string() + ":2:9: sync.bits: 5 is not allowed (allowed: 2, 4, 8)");
}

TEST(WorkerConfig, LoadReadsAtMostOneMebibyte) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  const auto big = dir.path() / "big.yaml";
  std::ofstream(big) << "# " << std::string(size_t{2} << 20, 'x') << "\n";
  auto result = loadWorkerConfig(big);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(result.status().message(),
            big.string() +
                ": a worker config of 2097155 bytes is not allowed (allowed: at most 1048576 "
                "bytes, 1 MiB)");

  // A device of endless bytes is read up to the bound, not to the end.
  const auto start = std::chrono::steady_clock::now();
  result = loadWorkerConfig("/dev/zero");
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().message(),
            "/dev/zero: a worker config of more than 1048576 bytes is not allowed (allowed: at "
            "most 1048576 bytes, 1 MiB)");
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));

  // Exactly at the bound is read.
  const auto edge = dir.path() / "edge.yaml";
  std::ofstream(edge) << "# " << std::string((size_t{1} << 20) - 3, 'x') << "\n";
  ASSERT_EQ(std::filesystem::file_size(edge), size_t{1} << 20);
  result = loadWorkerConfig(edge);
  EXPECT_TRUE(result.ok()) << result.status().toString();
}

// ---- Documentation ----

std::string readFile(const std::string& path) {
  std::ifstream file(path);
  std::ostringstream text;
  text << file.rdbuf();
  return text.str();
}

// sync.bits and sync.bucket admit exactly what the QSGD kernels do
// (kernels/qsgd_limits.h), in the parser, in --set, in a config built in
// code and in the docs' row; a bucket of 2^31 (past the kernels' int32
// bucket cursor) is refused naming the key and the range.
TEST(WorkerConfig, QsgdKeysAdmitExactlyTheKernelLimits) {
  const std::string max = std::to_string(kernels::kQsgdMaxBucket);
  EXPECT_EQ(parseOk("sync:\n  bucket: " + max + "\n").sync.bucket, kernels::kQsgdMaxBucket);
  EXPECT_EQ(parseOk("sync:\n  bucket: 1\n").sync.bucket, kernels::kQsgdMinBucket);
  const std::string range = "(allowed: an integer 1.." + max + ")";
  EXPECT_EQ(parseError("sync:\n  bucket: 0\n"),
            "test.yaml:2:11: sync.bucket: 0 is not allowed " + range);

  WorkerConfig config;
  EXPECT_EQ(applyOverride(config, "sync.bucket", "2147483648").message(),
            "sync.bucket: 2147483648 is not allowed " + range);
  EXPECT_EQ(config.sync.bucket, 512);  // unchanged
  config.sync.bucket = int64_t{1} << 31;
  EXPECT_EQ(validateWorkerConfig(config).message(),
            "sync.bucket: 2147483648 is not allowed " + range);
  config.sync.bucket = kernels::kQsgdMaxBucket;
  EXPECT_TRUE(validateWorkerConfig(config).ok()) << validateWorkerConfig(config).message();

  for (int64_t bits = 0; bits <= 9; ++bits) {
    WorkerConfig c;
    c.sync.bits = bits;
    EXPECT_EQ(validateWorkerConfig(c).ok(), kernels::isQsgdBits(bits)) << "bits " << bits;
  }

  const std::string docs = readFile(GEO_WORKER_CONFIG_DOC);
  const size_t row = docs.find("| `sync.bucket` |");
  ASSERT_NE(row, std::string::npos);
  EXPECT_NE(docs.substr(row, docs.find('\n', row) - row).find("1.." + max), std::string::npos)
      << "docs/worker-config.md: sync.bucket's range is not the kernels' 1.." << max;
}

}  // namespace
}  // namespace geo

namespace geo {
namespace {

TEST(WorkerConfig, PlaceByCompletionIndex) {
  WorkerConfig c;
  c.worker.worldSize = 5;
  c.worker.region = "tokyo";
  c.transport.regions = {"london", "london", "tokyo", "tokyo", "tokyo"};
  ASSERT_TRUE(placeByCompletionIndex(c, 2).ok());
  EXPECT_EQ(c.worker.rank, 4);
  EXPECT_EQ(c.worker.localRank, 2);
  EXPECT_EQ(c.worker.regionSize, 3);
  EXPECT_TRUE(validateWorkerConfig(c).ok()) << validateWorkerConfig(c).message();
  const WorkerConfig before = c;
  const Status s = placeByCompletionIndex(c, 3);
  EXPECT_EQ(s.message(),
            "completion index 3 is not allowed (allowed: 0..2: region tokyo has 3 workers in "
            "transport.regions)");
  EXPECT_EQ(c, before);
  // Without transport.regions every rank is in worker.region.
  WorkerConfig flat;
  flat.worker.worldSize = 4;
  ASSERT_TRUE(placeByCompletionIndex(flat, 3).ok());
  EXPECT_EQ(flat.worker.rank, 3);
  EXPECT_EQ(flat.worker.localRank, 3);
  EXPECT_FALSE(placeByCompletionIndex(flat, -1).ok());
}

TEST(WorkerConfig, PeersMayBeNoneExceptThisWorker) {
  WorkerConfig c;
  c.worker.worldSize = 3;
  c.worker.regionSize = 3;
  ASSERT_TRUE(applyOverride(c, "transport.peers", "tcp://a:7000,none,tcp://c:7000").ok());
  EXPECT_TRUE(validateWorkerConfig(c).ok());
  c.worker.rank = 1;
  c.worker.localRank = 1;
  EXPECT_EQ(validateWorkerConfig(c).message(),
            "transport.peers[1]: none is not allowed for this worker's own rank (allowed: an "
            "endpoint such as tcp://host:7000)");
}

}  // namespace
}  // namespace geo
