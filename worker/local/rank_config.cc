#include "worker/local/rank_config.h"

#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <string_view>

#include "common/enforce.h"

namespace geo::local {

namespace {

const char* keyOfFlag(std::string_view flag) {
  for (const KeyFlag& f : kKeyFlags) {
    if (flag == f.flag) return f.key;
  }
  return nullptr;
}

}  // namespace

StatusOr<WorkerConfig> buildBaseConfig(const LocalOptions& options) {
  WorkerConfig config;
  if (!options.configFile.empty()) {
    auto loaded = loadWorkerConfig(options.configFile, ConfigCheck::kFieldsOnly);
    if (!loaded.ok()) return loaded.status().withContext("--config");
    config = std::move(*loaded);
  }
  bool algorithmNamed = false;
  for (const std::string& kv : options.sets) {
    const size_t eq = kv.find('=');
    if (eq == std::string::npos) {
      return invalidArgument(fmt::format(
          "--set {}: expected key=value (e.g. --set training.lr=0.1)", printableText(kv)));
    }
    const std::string_view key = std::string_view(kv).substr(0, eq);
    GEO_RETURN_IF_ERROR(applyOverride(config, key, std::string_view(kv).substr(eq + 1))
                            .withContext(fmt::format("--set {}", printableText(kv))));
    algorithmNamed = algorithmNamed || key == "sync.algorithm";
  }
  for (const auto& [flag, value] : options.keyFlags) {
    const char* key = keyOfFlag(flag);
    if (key == nullptr) return internalError(fmt::format("{}: not a flag of geotrain local", flag));
    GEO_RETURN_IF_ERROR(applyOverride(config, key, value).withContext(flag));
    algorithmNamed = algorithmNamed || std::string_view(key) == "sync.algorithm";
  }
  if (!algorithmNamed && config.sync.algorithm == "none") {
    config.sync.algorithm = kDefaultAlgorithm;
  }
  // The gpt reads token ids: --model gpt alone brings the token data set and
  // its loss with it (a data set of images could only be refused).
  if (config.model.builtin == "gpt" && config.dataset.name != "tokens") {
    config.dataset.name = "tokens";
    if (config.training.loss == "cross-entropy") config.training.loss = "next-token";
  }
  return config;
}

int64_t defaultThreadsPerWorker(unsigned hardwareCores, int64_t workers) {
  const int64_t cores = std::max<int64_t>(1, hardwareCores);
  return std::max<int64_t>(1, cores / std::max<int64_t>(1, workers));
}

std::vector<WorkerConfig> makeRankConfigs(const WorkerConfig& base, const Topology& topology,
                                          const RankLayout& layout) {
  const int64_t world = topology.worldSize();
  GEO_ENFORCE_EQ(static_cast<int64_t>(layout.ports.size()), world, "one port per rank");

  GEO_ENFORCE(layout.hosts.empty() || static_cast<int64_t>(layout.hosts.size()) == world,
              "one host per rank, or none");
  const auto host = [&](int64_t r) {
    return layout.hosts.empty() ? std::string("127.0.0.1") : layout.hosts[static_cast<size_t>(r)];
  };
  std::vector<std::string> peers;
  std::vector<std::string> regionOfRank;
  for (int64_t r = 0; r < world; ++r) {
    peers.push_back(fmt::format("tcp://{}:{}", host(r), layout.ports[static_cast<size_t>(r)]));
    regionOfRank.push_back(topology.regions[static_cast<size_t>(placeOf(topology, r).regionIndex)]);
  }
  std::map<std::string, std::string> links;
  for (size_t i = 0; layout.emulateLinks && i < topology.regions.size(); ++i) {
    for (size_t j = i + 1; j < topology.regions.size(); ++j) {
      links[linkKey(topology.regions[i], topology.regions[j])] =
          fmt::format("delay={}us", topology.rtt[i][j].count() / 2);
    }
  }

  std::vector<WorkerConfig> configs;
  configs.reserve(static_cast<size_t>(world));
  for (int64_t r = 0; r < world; ++r) {
    const RankPlace place = placeOf(topology, r);
    WorkerConfig c = base;
    c.worker.rank = r;
    c.worker.worldSize = world;
    c.worker.region = regionOfRank[static_cast<size_t>(r)];
    c.worker.localRank = place.localIndex;
    c.worker.regionSize = topology.workersPerRegion;
    c.transport.listen = peers[static_cast<size_t>(r)];
    c.transport.peers = peers;
    c.transport.regions = regionOfRank;
    c.transport.links = links;
    c.transport.uplink = layout.emulateLinks ? topology.uplink : std::string();
    c.transport.keyDir = (layout.outDir / "keys").string();
    if (c.training.threads == 0) c.training.threads = layout.threadsPerWorker;
    if (c.transport.tcpInitialWindow == 0) c.transport.tcpInitialWindow = layout.tcpInitialWindow;
    c.metrics.enabled = !layout.metricsPorts.empty();
    if (c.metrics.enabled) {
      GEO_ENFORCE_EQ(static_cast<int64_t>(layout.metricsPorts.size()), world,
                     "one metrics port per rank");
      c.metrics.listen = fmt::format("{}:{}", host(r), layout.metricsPorts[static_cast<size_t>(r)]);
    }
    if (!base.checkpoint.dir.empty()) {
      c.checkpoint.dir =
          (std::filesystem::path(base.checkpoint.dir) / fmt::format("rank-{}", r)).string();
    }
    // dataset.path may name each region's own copy ("/data/{region}"): each
    // region's workers then split that copy among themselves.
    const bool perRegion = c.dataset.path.find("{region}") != std::string::npos;
    for (size_t at = c.dataset.path.find("{region}"); at != std::string::npos;
         at = c.dataset.path.find("{region}", at)) {
      c.dataset.path.replace(at, std::string_view("{region}").size(), c.worker.region);
    }
    if (c.dataset.sharding == "auto") c.dataset.sharding = perRegion ? "region" : "job";
    // One model out, from rank 0: every worker ends with the same bytes, and
    // the regions here share one file system (in Kubernetes each region's
    // first worker writes into its own volume).
    if (r != 0) c.output.path.clear();
    configs.push_back(std::move(c));
  }
  return configs;
}

Status validateRankConfigs(const std::vector<WorkerConfig>& configs) {
  for (size_t r = 0; r < configs.size(); ++r) {
    GEO_RETURN_IF_ERROR(
        validateWorkerConfig(configs[r]).withContext(fmt::format("worker-{}.yaml", r)));
  }
  return {};
}

std::string prometheusScrapeConfig(const std::vector<WorkerConfig>& configs,
                                   const std::filesystem::path& outDir) {
  std::string out = fmt::format(
      "# Prometheus scrape configuration for the geotrain local run in {}\n"
      "# (prometheus --config.file=<this file>; the workers serve /metrics while they run).\n"
      "global:\n  scrape_interval: 5s\n"
      "scrape_configs:\n"
      "  - job_name: geotrain-local\n"
      "    honor_labels: true  # keep the workers' job, region and rank labels\n"
      "    static_configs:\n",
      outDir.string());
  for (const WorkerConfig& c : configs) {
    if (!c.metrics.enabled) continue;
    out += fmt::format("      - targets: ['{}']\n        labels: {{geotrain_worker: 'rank-{}'}}\n",
                       c.metrics.listen, c.worker.rank);
  }
  return out;
}

}  // namespace geo::local
