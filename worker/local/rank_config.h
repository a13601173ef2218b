#pragma once
// The worker configurations of a `geotrain local` job: one base WorkerConfig
// from the user's inputs, then one WorkerConfig per rank that places the
// worker in the emulated topology. The launcher writes each to
// <out>/worker-<rank>.yaml, so a single worker can be re-run by hand.
//
// Pure functions over values: thread-compatible, no I/O except
// buildBaseConfig reading the --config file. Errors are Statuses; those of
// worker.yaml keys read exactly like worker.yaml errors, prefixed with the
// flag that carried the value ("--bits: sync.bits: 3 is not allowed
// (allowed: 2, 4, 8)").

#include <cstdint>
#include <filesystem>
#include <vector>

#include "common/status.h"
#include "common/worker_config.h"
#include "worker/local/options.h"
#include "worker/local/topology.h"

namespace geo::local {

// WorkerConfig defaults, then options.configFile (fields checked, relations
// not: the launcher sets the per-rank fields later), then options.sets in
// order, then options.keyFlags; then sync.algorithm becomes
// kDefaultAlgorithm if it is still `none` and neither --set nor --algorithm
// named it. Errors: a missing or invalid file (NotFound / InvalidArgument
// naming the path, line and key), a --set without '=', a bad key or value.
StatusOr<WorkerConfig> buildBaseConfig(const LocalOptions& options);

// What the launcher decided for this run, besides the topology.
struct RankLayout {
  std::filesystem::path outDir;  // absolute run folder; keys live in <outDir>/keys
  std::vector<uint16_t> ports;   // loopback port of each rank (index = rank)
  // Loopback port of each rank's /metrics (index = rank); empty: metrics off.
  std::vector<uint16_t> metricsPorts;
  int64_t threadsPerWorker = 1;  // training.threads when the base config leaves it 0
  // The address each rank binds and is reached at (index = rank); empty:
  // 127.0.0.1 for every rank. Under --network netns, its region's address.
  std::vector<std::string> hosts;
  // Whether the transport emulates the WAN (transport.links, .uplink): not
  // when the network below TCP does (--network netns).
  bool emulateLinks = true;
  // transport.tcpInitialWindow when the base config leaves it 0: under
  // --network netns, where each region's namespace is the launcher's own.
  int64_t tcpInitialWindow = 0;
};

// max(1, hardwareCores / workers); hardwareCores 0 (unknown) counts as 1.
int64_t defaultThreadsPerWorker(unsigned hardwareCores, int64_t workers);

// One config per rank (index = rank): the base config with
//   worker.rank/worldSize/region/localRank/regionSize from the topology;
//   transport.listen = transport.peers[rank] = tcp://<host>:<port> (host:
//   layout.hosts[rank], else 127.0.0.1);
//   transport.regions = the region of every rank;
//   with layout.emulateLinks: transport.links["a-b"] = "delay=<rtt/2>us" for
//   every pair of regions in --regions order (a before b) and
//   transport.uplink = topology.uplink (else neither);
//   transport.keyDir = <outDir>/keys;
//   training.threads = layout.threadsPerWorker unless the base sets one;
//   transport.tcpInitialWindow = layout.tcpInitialWindow unless the base
//   sets one;
//   metrics.listen = <host>:<metricsPorts[rank]> (metrics.enabled = false
//   when layout.metricsPorts is empty); checkpoint.dir = <base dir>/rank-<r>
//   when set.
// Requires layout.ports.size() == topology.worldSize() (GEO_ENFORCE).
std::vector<WorkerConfig> makeRankConfigs(const WorkerConfig& base, const Topology& topology,
                                          const RankLayout& layout);

// A Prometheus configuration that scrapes every rank's /metrics (from the
// configs' metrics.listen) every 5 s; honor_labels keeps the workers' own
// job/region/rank labels.
std::string prometheusScrapeConfig(const std::vector<WorkerConfig>& configs,
                                   const std::filesystem::path& outDir);

// validateWorkerConfig() on every rank's config; the first error is returned
// with the file it will be written to ("worker-2.yaml: ...").
Status validateRankConfigs(const std::vector<WorkerConfig>& configs);

}  // namespace geo::local
