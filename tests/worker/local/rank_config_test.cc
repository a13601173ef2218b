// Worker configurations of `geotrain local`: the base config from --config,
// --set and the flags, and the per-rank configs. No processes.

#include "worker/local/rank_config.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "common/worker_config.h"

namespace geo::local {
namespace {

namespace fs = std::filesystem;

Topology topology(const std::string& regions, int64_t perRegion) {
  TopologyOptions o;
  o.regions = regions;
  o.workersPerRegion = perRegion;
  auto t = makeTopology(o);
  EXPECT_TRUE(t.ok()) << t.status().toString();
  return *t;
}

RankLayout layout(int64_t world, int64_t threads = 2) {
  RankLayout l;
  l.outDir = "/runs/r1";
  for (int64_t r = 0; r < world; ++r) l.ports.push_back(static_cast<uint16_t>(41000 + r));
  l.threadsPerWorker = threads;
  return l;
}

class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "geo-local-test-XXXXXX").string();
    path_ = ::mkdtemp(pattern.data());
  }
  ~TempDir() { fs::remove_all(path_); }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

TEST(LocalBaseConfig, DefaultsRunDtsWhenNothingChoosesAnAlgorithm) {
  auto c = buildBaseConfig(LocalOptions{});
  ASSERT_TRUE(c.ok()) << c.status().toString();
  EXPECT_EQ(c->sync.algorithm, "dts");
  WorkerConfig expected;
  expected.sync.algorithm = "dts";
  EXPECT_EQ(*c, expected);  // everything else is the schema's default
}

TEST(LocalBaseConfig, ExplicitNoneAndOtherAlgorithmsAreKept) {
  LocalOptions o;
  o.keyFlags = {{"--algorithm", "none"}};
  EXPECT_EQ(buildBaseConfig(o)->sync.algorithm, "none");
  o = LocalOptions{};
  o.sets = {"sync.algorithm=none"};
  EXPECT_EQ(buildBaseConfig(o)->sync.algorithm, "none");
  o = LocalOptions{};
  o.sets = {"sync.algorithm=swarm"};
  EXPECT_EQ(buildBaseConfig(o)->sync.algorithm, "swarm");
}

TEST(LocalBaseConfig, OrderIsFileThenSetThenFlags) {
  TempDir dir;
  const fs::path file = dir.path() / "worker.yaml";
  std::ofstream(file) << "training:\n  lr: 0.2\n  steps: 50\nsync:\n  algorithm: allreduce\n"
                         "  bits: 8\njob:\n  id: my-job\n";
  LocalOptions o;
  o.configFile = file.string();
  o.sets = {"training.lr=0.3", "sync.bits=2", "sync.delay=auto"};
  o.keyFlags = {
      {"--bits", "4"}, {"--period", "16"}, {"--hierarchical", "false"}, {"--threads", "3"}};
  auto c = buildBaseConfig(o);
  ASSERT_TRUE(c.ok()) << c.status().toString();
  EXPECT_EQ(c->training.steps, 50);           // file
  EXPECT_EQ(c->training.lr, 0.3);             // --set over the file
  EXPECT_EQ(c->sync.bits, 4);                 // flag over --set
  EXPECT_EQ(c->sync.algorithm, "allreduce");  // the file's choice stays
  EXPECT_FALSE(c->sync.delay.has_value());    // auto
  EXPECT_EQ(c->sync.period, 16);
  EXPECT_FALSE(c->sync.hierarchical);
  EXPECT_EQ(c->training.threads, 3);
  EXPECT_EQ(c->job.id, "my-job");
}

TEST(LocalBaseConfig, EveryKeyFlagMapsOntoItsKey) {
  LocalOptions o;
  o.keyFlags = {{"--algorithm", "swarm"},
                {"--period", "4"},
                {"--delay", "2"},
                {"--exchange", "reducescatter"},
                {"--swarm-h", "6"},
                {"--codec", "fp16"},
                {"--bits", "8"},
                {"--hierarchical", "false"},
                {"--timeout-seconds", "7.5"},
                {"--model", "cnn"},
                {"--steps", "123"},
                {"--batch-size", "32"},
                {"--lr", "0.01"},
                {"--eval-interval", "25"},
                {"--threads", "5"}};
  auto c = buildBaseConfig(o);
  ASSERT_TRUE(c.ok()) << c.status().toString();
  EXPECT_EQ(c->sync.algorithm, "swarm");
  EXPECT_EQ(c->sync.period, 4);
  EXPECT_EQ(c->sync.delay, 2);
  EXPECT_EQ(c->sync.exchange, "reducescatter");
  EXPECT_EQ(c->sync.swarmH, 6);
  EXPECT_EQ(c->sync.codec, "fp16");
  EXPECT_EQ(c->sync.bits, 8);
  EXPECT_FALSE(c->sync.hierarchical);
  EXPECT_EQ(c->sync.timeoutSeconds, 7.5);
  EXPECT_EQ(c->model.builtin, "cnn");
  EXPECT_EQ(c->training.steps, 123);
  EXPECT_EQ(c->training.batchSize, 32);
  EXPECT_EQ(c->training.lr, 0.01);
  EXPECT_EQ(c->training.evalInterval, 25);
  EXPECT_EQ(c->training.threads, 5);
  EXPECT_EQ(std::size(kKeyFlags), o.keyFlags.size());  // the test covers every flag
}

TEST(LocalBaseConfig, ErrorsReadLikeWorkerYamlErrorsWithTheFlag) {
  LocalOptions o;
  o.keyFlags = {{"--bits", "3"}};
  auto c = buildBaseConfig(o);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().message(), "--bits: sync.bits: 3 is not allowed (allowed: 2, 4, 8)");

  // A bucket past the QSGD kernels' limit is refused here, not when the
  // workers start.
  o = LocalOptions{};
  o.sets = {"sync.bucket=2147483648"};
  c = buildBaseConfig(o);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().message(),
            "--set sync.bucket=2147483648: sync.bucket: 2147483648 is not allowed (allowed: an "
            "integer 1..1073741824)");

  o = LocalOptions{};
  o.keyFlags = {{"--hierarchical", "maybe"}};
  c = buildBaseConfig(o);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("--hierarchical: sync.hierarchical"), std::string::npos)
      << c.status().message();

  o = LocalOptions{};
  o.sets = {"training.lrr=0.1"};
  c = buildBaseConfig(o);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("--set training.lrr=0.1: training.lrr: unknown key"),
            std::string::npos)
      << c.status().message();

  o = LocalOptions{};
  o.sets = {"training.lr"};
  c = buildBaseConfig(o);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("expected key=value"), std::string::npos);

  o = LocalOptions{};
  o.configFile = "/nonexistent/worker.yaml";
  c = buildBaseConfig(o);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("/nonexistent/worker.yaml"), std::string::npos);
}

TEST(LocalRankConfigs, PlaceEveryRankInTheTopology) {
  const Topology t = topology("london,tokyo,oregon", 2);
  WorkerConfig base;
  base.sync.algorithm = "dts";
  const auto configs = makeRankConfigs(base, t, layout(6));
  ASSERT_EQ(configs.size(), 6u);
  const std::vector<std::string> regions = {"london", "london", "tokyo",
                                            "tokyo",  "oregon", "oregon"};
  for (int64_t r = 0; r < 6; ++r) {
    const WorkerConfig& c = configs[static_cast<size_t>(r)];
    EXPECT_EQ(c.worker.rank, r);
    EXPECT_EQ(c.worker.worldSize, 6);
    EXPECT_EQ(c.worker.region, regions[static_cast<size_t>(r)]);
    EXPECT_EQ(c.worker.localRank, r % 2);
    EXPECT_EQ(c.worker.regionSize, 2);
    EXPECT_EQ(c.transport.listen, "tcp://127.0.0.1:" + std::to_string(41000 + r));
    ASSERT_EQ(c.transport.peers.size(), 6u);
    EXPECT_EQ(c.transport.peers[static_cast<size_t>(r)], c.transport.listen);
    EXPECT_EQ(c.transport.peers[5], "tcp://127.0.0.1:41005");
    EXPECT_EQ(c.transport.regions, regions);
    EXPECT_EQ(c.transport.keyDir, "/runs/r1/keys");
    EXPECT_EQ(c.transport.uplink, "rate=100mbit");
    EXPECT_EQ(c.training.threads, 2);
    EXPECT_FALSE(c.metrics.enabled);
    EXPECT_EQ(c.checkpoint.dir, "");
    EXPECT_EQ(c.sync.algorithm, "dts");
    EXPECT_EQ(c.job.id, "geotrain-local");
    EXPECT_EQ(c.transport.links, configs[0].transport.links);
  }
  // One link per pair of distinct regions, "a-b" in --regions order, one-way delay = RTT/2.
  const std::map<std::string, std::string> links = {{"london-tokyo", "delay=115000us"},
                                                    {"london-oregon", "delay=70000us"},
                                                    {"tokyo-oregon", "delay=50000us"}};
  EXPECT_EQ(configs[0].transport.links, links);
}

TEST(LocalRankConfigs, EveryGeneratedConfigIsValidAndSurvivesYaml) {
  for (const auto& [regions, perRegion] : std::vector<std::pair<std::string, int64_t>>{
           {"london", 1}, {"london,tokyo,oregon,ohio", 1}, {"ohio,tokyo", 3}}) {
    const Topology t = topology(regions, perRegion);
    WorkerConfig base;
    base.sync.algorithm = "allreduce";
    base.checkpoint.dir = "/ckpt";
    base.output.path = "/model";
    const auto configs = makeRankConfigs(base, t, layout(t.worldSize()));
    ASSERT_TRUE(validateRankConfigs(configs).ok()) << validateRankConfigs(configs).toString();
    for (const WorkerConfig& c : configs) {
      EXPECT_EQ(c.checkpoint.dir, "/ckpt/rank-" + std::to_string(c.worker.rank));
      // One model out: rank 0 writes it (the regions share a file system).
      EXPECT_EQ(c.output.path, c.worker.rank == 0 ? "/model" : "");
      auto back = parseWorkerConfig(toYaml(c), "worker.yaml");
      ASSERT_TRUE(back.ok()) << back.status().toString();
      EXPECT_EQ(*back, c);
    }
  }
}

// "/data/{region}": each region reads its own copy, split among its workers;
// one shared path is split over the whole job.
TEST(LocalRankConfigs, ARegionPlaceholderMakesEachRegionReadItsOwnCopy) {
  const Topology t = topology("london,tokyo", 2);
  WorkerConfig base;
  base.sync.algorithm = "dts";
  base.dataset.name = "npy";
  base.dataset.path = "/data/{region}/npy";
  base.model.classes = 10;  // required: each region's labels could size the model otherwise
  const auto configs = makeRankConfigs(base, t, layout(t.worldSize()));
  ASSERT_TRUE(validateRankConfigs(configs).ok()) << validateRankConfigs(configs).toString();
  for (const WorkerConfig& c : configs) {
    EXPECT_EQ(c.dataset.path, "/data/" + c.worker.region + "/npy");
    EXPECT_EQ(c.dataset.sharding, "region");
    EXPECT_EQ(effectiveShardIndex(c), c.worker.localRank);
    EXPECT_EQ(effectiveShardCount(c), 2);
  }
  base.dataset.path = "/data/shared";
  for (const WorkerConfig& c : makeRankConfigs(base, t, layout(t.worldSize()))) {
    EXPECT_EQ(c.dataset.sharding, "job");
    EXPECT_EQ(effectiveShardIndex(c), c.worker.rank);
    EXPECT_EQ(effectiveShardCount(c), 4);
  }
}

TEST(LocalRankConfigs, LauncherOwnedFieldsWinAndThreadsFollowTheBase) {
  const Topology t = topology("london,tokyo", 1);
  WorkerConfig base;
  base.worker.rank = 7;
  base.transport.listen = "tcp://*:9";
  base.transport.links["x-y"] = "delay=1ms";
  base.metrics.enabled = true;
  base.training.threads = 6;
  const auto configs = makeRankConfigs(base, t, layout(2, 3));
  EXPECT_EQ(configs[1].worker.rank, 1);
  EXPECT_EQ(configs[1].transport.listen, "tcp://127.0.0.1:41001");
  EXPECT_EQ(configs[1].transport.links.size(), 1u);
  EXPECT_FALSE(configs[1].metrics.enabled);   // no metrics ports in this layout
  EXPECT_EQ(configs[1].training.threads, 6);  // the base's choice beats the split
}

TEST(LocalRankConfigs, MetricsPortsAndScrapeConfig) {
  const Topology t = topology("london,tokyo", 1);
  RankLayout l = layout(2);
  l.metricsPorts = {42000, 42001};
  const auto configs = makeRankConfigs(WorkerConfig{}, t, l);
  ASSERT_TRUE(validateRankConfigs(configs).ok());
  EXPECT_TRUE(configs[1].metrics.enabled);
  EXPECT_EQ(configs[1].metrics.listen, "127.0.0.1:42001");
  const std::string prom = prometheusScrapeConfig(configs, "/runs/r1");
  EXPECT_NE(prom.find("honor_labels: true"), std::string::npos) << prom;
  EXPECT_NE(prom.find("- targets: ['127.0.0.1:42000']"), std::string::npos) << prom;
  EXPECT_NE(prom.find("- targets: ['127.0.0.1:42001']"), std::string::npos) << prom;
  EXPECT_NE(prom.find("geotrain_worker: 'rank-1'"), std::string::npos) << prom;
}

TEST(LocalRankConfigs, LanPresetAndUnlimitedUplink) {
  TopologyOptions o;
  o.regions = "a,b";
  o.preset = "lan";
  const Topology t = *makeTopology(o);
  const auto configs = makeRankConfigs(WorkerConfig{}, t, layout(2));
  EXPECT_EQ(configs[0].transport.links.at("a-b"), "delay=0us");
  EXPECT_EQ(configs[0].transport.uplink, "");
  EXPECT_TRUE(validateRankConfigs(configs).ok());
}

TEST(LocalRankConfigs, UnderTheNamespaceNetworkEveryRankBindsItsRegionsAddress) {
  const Topology t = topology("london,tokyo", 2);
  RankLayout l = layout(4);
  l.metricsPorts = {42000, 42001, 42002, 42003};
  l.hosts = {"198.18.0.1", "198.18.0.1", "198.18.0.2", "198.18.0.2"};
  l.emulateLinks = false;
  const auto configs = makeRankConfigs(WorkerConfig{}, t, l);
  ASSERT_TRUE(validateRankConfigs(configs).ok()) << validateRankConfigs(configs).toString();
  EXPECT_EQ(configs[2].transport.listen, "tcp://198.18.0.2:41002");
  EXPECT_EQ(configs[2].transport.peers[1], "tcp://198.18.0.1:41001");
  EXPECT_EQ(configs[3].metrics.listen, "198.18.0.2:42003");
  // The WAN below TCP replaces the transport's own emulation.
  EXPECT_TRUE(configs[0].transport.links.empty());
  EXPECT_EQ(configs[0].transport.uplink, "");
}

TEST(LocalRankConfigs, InvalidResultNamesTheRankFile) {
  const Topology t = topology("london,tokyo", 1);
  WorkerConfig base;
  base.dataset.shardIndex = 5;  // >= shardCount (2)
  const Status s = validateRankConfigs(makeRankConfigs(base, t, layout(2)));
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.message().rfind("worker-0.yaml: ", 0), 0u) << s.message();
}

TEST(LocalRankConfigs, ThreadSplit) {
  EXPECT_EQ(defaultThreadsPerWorker(16, 4), 4);
  EXPECT_EQ(defaultThreadsPerWorker(16, 5), 3);
  EXPECT_EQ(defaultThreadsPerWorker(2, 4), 1);
  EXPECT_EQ(defaultThreadsPerWorker(0, 4), 1);
  EXPECT_EQ(defaultThreadsPerWorker(8, 1), 8);
}

}  // namespace
}  // namespace geo::local
