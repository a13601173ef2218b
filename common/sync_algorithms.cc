#include "common/sync_algorithms.h"

namespace geo {

const std::vector<SyncAlgorithm>& syncAlgorithms() {
  static const std::vector<SyncAlgorithm> kAlgorithms = {
      {"allreduce", "synchronous data parallelism", {}},
      {"dts",
       "delayed and temporally sparse updates",
       {{"period", "period K"}, {"delay", "delay D"}}},
      {"swarm", "SwarmSGD gossip", {{"swarmH", "H"}}},
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

}  // namespace geo
