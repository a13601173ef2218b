#include "common/sync_algorithms.h"

#include <fmt/format.h>

#include "common/enforce.h"
#include "common/worker_schema.h"

namespace geo {

const std::vector<SyncAlgorithm>& syncAlgorithms() {
  static const std::vector<SyncAlgorithm> kAlgorithms = {
      {"allreduce", "synchronous data parallelism", {}, false},
      {"dts",
       "delayed and temporally sparse updates",
       {{"period", "period K"}, {"delay", "delay D"}, {"exchange", "exchange"}},
       true},
      {"swarm", "SwarmSGD gossip", {{"swarmH", "H"}}, false},
  };
  return kAlgorithms;
}

const SyncAlgorithm* findSyncAlgorithm(std::string_view name) {
  for (const SyncAlgorithm& a : syncAlgorithms()) {
    if (a.name == name) return &a;
  }
  return nullptr;
}

std::vector<std::string> syncAlgorithmNames() {
  std::vector<std::string> names;
  for (const SyncAlgorithm& a : syncAlgorithms()) names.emplace_back(a.name);
  return names;
}

std::vector<SyncKeyValue> ownSyncKeyValues(const WorkerConfig& config) {
  std::vector<SyncKeyValue> out;
  const SyncAlgorithm* a = findSyncAlgorithm(config.sync.algorithm);
  if (a == nullptr) return out;
  for (const SyncAlgorithmKey& k : a->ownKeys) {
    std::string path = fmt::format("sync.{}", k.key);
    const auto spec = lookupWorkerKey(path);
    GEO_ENFORCE(spec.ok(), "sync algorithm {}: its key {} is not in the schema", a->name, path);
    std::string value = workerKeyYaml(config, **spec);
    out.push_back({std::move(path), k.label, std::move(value)});
  }
  return out;
}

}  // namespace geo
