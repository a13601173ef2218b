#include "worker/app/transport_setup.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <algorithm>

#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <utility>

#include "common/keys/keys.h"
#include "common/logging.h"
#include "common/sync_algorithms.h"
#include "worker/transport/initial_window.h"
#include "worker/transport/link.h"

namespace geo::app {
namespace {

// The ranks across the WAN from `self`: those of another region.
std::vector<uint32_t> wanRanks(const std::vector<std::string>& regions, uint32_t self) {
  std::vector<uint32_t> out;
  for (uint32_t r = 0; r < regions.size(); ++r) {
    if (r != self && regions[r] != regions.at(self)) out.push_back(r);
  }
  return out;
}

// Splits a transport.links key "a-b" into two region names of the job (region
// names may contain '-': the split must leave two known names).
std::optional<std::pair<std::string, std::string>> splitLinkKey(
    const std::string& key, const std::set<std::string>& known) {
  for (size_t dash = key.find('-'); dash != std::string::npos; dash = key.find('-', dash + 1)) {
    std::string a = key.substr(0, dash);
    std::string b = key.substr(dash + 1);
    if (known.contains(a) && known.contains(b)) return std::make_pair(a, b);
  }
  return std::nullopt;
}

// A setting as worker.yaml spells it. Overloads, so that a key that changes
// type keeps its spelling (an unset optional is `auto`).
std::string spelled(const std::string& v) {
  return v;
}
std::string spelled(bool v) {
  return v ? "true" : "false";
}
std::string spelled(int64_t v) {
  return std::to_string(v);
}

}  // namespace

std::vector<std::string> rankRegions(const WorkerConfig& c) {
  if (!c.transport.regions.empty()) return c.transport.regions;
  return std::vector<std::string>(static_cast<size_t>(c.worker.worldSize), c.worker.region);
}

std::string agreedSyncSettings(const WorkerConfig& c) {
  const auto& s = c.sync;
  std::string text;
  const auto line = [&text](std::string_view key, const std::string& value) {
    text += fmt::format("{} = {}\n", key, value);
  };
  line("sync.algorithm", spelled(s.algorithm));
  for (const SyncKeyValue& k : ownSyncKeyValues(c)) line(k.path, k.value);
  line("sync.codec", spelled(s.codec));
  if (s.codec == "qsgd") {
    line("sync.bits", spelled(s.bits));
    line("sync.bucket", spelled(s.bucket));
  }
  line("sync.hierarchical", spelled(s.hierarchical));
  if (s.hierarchical) line("sync.lanCodec", spelled(s.lanCodec));
  return text;
}

StatusOr<transport::TransportConfig> transportConfig(const WorkerConfig& c, uint32_t rank) {
  namespace gt = geo::transport;
  const auto world = static_cast<uint32_t>(c.worker.worldSize);
  if (c.transport.peers.empty()) {
    return invalidArgument(fmt::format(
        "transport.peers: empty, but a job of {} workers needs one endpoint per rank", world));
  }
  const std::vector<std::string> regions = rankRegions(c);
  if (rank >= regions.size()) {
    return invalidArgument(fmt::format("worker.rank: {} is not a rank of this job of {} workers",
                                       rank, regions.size()));
  }
  gt::TransportConfig t;
  t.jobId = c.job.id;
  t.rank = rank;
  t.endpoints = c.transport.peers;
  for (auto& e : t.endpoints) {
    if (e == "none") e.clear();  // never connected to (see transport.peers)
  }
  t.bindEndpoint = c.transport.listen;
  // Each rank's key in use; the others of a rotation in progress come with
  // the first KeySet the worker's KeyWatcher hands over.
  auto keySet = loadKeySet(c, rank);
  if (!keySet.ok()) return keySet.status();
  t.secretKey = keySet->secretKey;
  for (const auto& list : keySet->publicKeys) t.publicKeys.push_back(list.front());
  const std::set<std::string> known(regions.begin(), regions.end());
  std::map<std::pair<std::string, std::string>, gt::LinkProfile> links;
  for (const auto& [key, spec] : c.transport.links) {
    const auto pair = splitLinkKey(key, known);
    if (!pair) {
      return invalidArgument(
          fmt::format("transport.links.{}: not two regions of this job joined by '-' (regions: {})",
                      key, fmt::join(known, ", ")));
    }
    auto profile = gt::parseLinkProfile(spec);
    if (!profile.ok()) {
      return invalidArgument(
          fmt::format("transport.links.{}: {}", key, profile.status().message()));
    }
    links[*pair] = *profile;
    links[{pair->second, pair->first}] = *profile;
  }
  auto uplink = gt::parseLinkProfile(c.transport.uplink);
  if (!uplink.ok()) {
    return invalidArgument(fmt::format("transport.uplink: {}", uplink.status().message()));
  }
  t.uplink = *uplink;
  t.links.resize(world);
  t.uplinkPeers.assign(world, false);
  const std::string& mine = regions.at(rank);
  for (const uint32_t r : wanRanks(regions, rank)) {
    t.uplinkPeers[r] = true;
    if (auto it = links.find({mine, regions[r]}); it != links.end()) t.links[r] = it->second;
  }
  t.rankNames = regions;
  t.connections = static_cast<size_t>(c.transport.connections);
  t.agreedSettings = agreedSyncSettings(c);
  // Opens each WAN connection's congestion window to about 170 packets
  // while the job starts: an mlp's 4-bit round (0.1 MB) then crosses in one
  // round trip from the first round on. At 100 Mbit/s it takes 21 ms of
  // uplink per peer, once. Not from a region's member under hierarchical
  // sync (it sends nothing over the WAN) nor without sync.
  const bool member = c.sync.hierarchical && c.worker.localRank != 0 &&
                      std::count(regions.begin(), regions.end(), mine) > 1;
  if (c.sync.algorithm != "none" && !member) t.warmupBytes = 256 << 10;
  return t;
}

}  // namespace geo::app

namespace geo::app {

Status applyTcpInitialWindow(const WorkerConfig& config) {
  if (config.transport.tcpInitialWindow <= 0) return {};
  // The peers across the WAN with an endpoint (not `none`), as
  // transportConfig() connects to them.
  if (config.transport.peers.empty()) return {};  // nobody to connect to
  const std::vector<std::string> regions = rankRegions(config);
  const auto self = static_cast<uint32_t>(config.worker.rank);
  if (self >= regions.size() || config.transport.peers.size() != regions.size()) {
    return invalidArgument(fmt::format("transport.peers: {} endpoints and {} regions for rank {}",
                                       config.transport.peers.size(), regions.size(), self));
  }
  std::vector<std::string> endpoints;
  for (const uint32_t r : wanRanks(regions, self)) {
    const std::string& peer = config.transport.peers[r];
    if (!peer.empty() && peer != "none") endpoints.push_back(peer);
  }
  if (endpoints.empty()) return {};
  const auto segments = static_cast<uint32_t>(config.transport.tcpInitialWindow);
  auto routes = transport::setInitialWindow(endpoints, segments);
  if (!routes.ok()) {
    return routes.status().withContext(
        fmt::format("transport.tcpInitialWindow = {}", config.transport.tcpInitialWindow));
  }
  for (const auto& r : *routes) {
    if (!r.unresolved.empty()) {
      logger()->warn("tcp: {}; connections to it open with the kernel's window of 10 segments",
                     r.unresolved);
      continue;
    }
    logger()->info("tcp: connections to {} open with a window of {} segments ({} route to {}{}{})",
                   r.peer, segments, r.alreadySet ? "already on the" : "a new", r.address,
                   r.via.empty() ? "" : " via " + r.via,
                   r.device.empty() ? "" : " dev " + r.device);
  }
  return {};
}

StatusOr<transport::KeySet> loadKeySet(const WorkerConfig& c, uint32_t rank) {
  const std::filesystem::path keyDir = c.transport.keyDir;
  const auto world = static_cast<uint32_t>(c.worker.worldSize);
  transport::KeySet keys;
  auto secret =
      keys::loadSecretKey(keyDir / fmt::format("worker-{}.key", rank),
                          c.transport.keyGroupReadable ? keys::SecretKeyAccess::kOwnerAndGroupRead
                                                       : keys::SecretKeyAccess::kOwnerOnly);
  if (!secret.ok()) return secret.status();
  keys.secretKey = *secret;
  for (uint32_t r = 0; r < world; ++r) {
    std::vector<std::string> list;
    for (const char* suffix : {"", ".next", ".previous"}) {
      const std::filesystem::path file = keyDir / fmt::format("worker-{}{}.pub", r, suffix);
      std::error_code ec;
      if (*suffix != '\0' && !std::filesystem::exists(file, ec)) continue;
      auto pub = keys::loadPublicKey(file);
      if (!pub.ok()) return pub.status();
      if (std::find(list.begin(), list.end(), *pub) == list.end()) list.push_back(*pub);
    }
    keys.publicKeys.push_back(std::move(list));
  }
  // This worker's own public key first: while a rotation replaces the files
  // one by one, the new secret key may come before the new public key.
  auto own = keys::publicKeyOf(keys.secretKey);
  if (!own.ok()) return own.status().withContext(fmt::format("worker-{}.key", rank));
  auto& mine = keys.publicKeys[rank];
  const auto it = std::find(mine.begin(), mine.end(), *own);
  if (it == mine.end()) {
    return invalidArgument(fmt::format(
        "{}: worker-{}.key does not belong to worker-{}.pub, worker-{}.next.pub or "
        "worker-{}.previous.pub (transport.keyDir): each worker's secret key and public key come "
        "from one `geotrain keygen`",
        keyDir.string(), rank, rank, rank, rank));
  }
  std::rotate(mine.begin(), it, it + 1);
  return keys;
}

}  // namespace geo::app
