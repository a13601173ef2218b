#pragma once
// Which network carries a `geotrain local` job, and the namespace WAN it
// asks for (--network, --loss, --jitter, --downlink, --queue).
//
//   --network userspace  (default) every worker on this machine's loopback;
//                        the transport delays and shapes whole messages
//                        above TCP (transport.links and transport.uplink),
//                        a partition drops them there. Needs no privileges.
//   --network netns      each region's workers in a network namespace of
//                        their own; every packet between regions crosses
//                        worker/wan's emulator below TCP (one-way delay of
//                        half the pair's round trip each way, the region's
//                        uplink and downlink, loss, jitter, partitions), so
//                        the kernels' TCP stacks see a real WAN path. Needs
//                        root (network namespaces and TUN devices).
//
// The uplink differs between the two: under userspace each worker's own
// traffic to other regions is shaped (as transport.uplink has always done);
// under netns a region's uplink is shared by all its workers, as a site's
// link is.
//
// Pure parsing: thread-compatible; errors are InvalidArgument Statuses that
// name the flag, the value and what is allowed.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "worker/local/topology.h"
#include "worker/wan/wan_model.h"

namespace geo::local {

enum class NetworkMode { kUserspace, kNetns };

// "userspace" | "netns".
StatusOr<NetworkMode> parseNetworkMode(std::string_view text);
std::string_view networkModeName(NetworkMode mode);

struct NetworkOptions {
  std::string mode = "userspace";       // --network
  std::vector<std::string> loss;        // --loss [REGION=]PERCENT%, repeatable
  std::optional<std::string> jitter;    // --jitter TIME
  std::optional<std::string> downlink;  // --downlink RATE (every region)
  std::optional<std::string> queue;     // --queue TIME
};

// The most a packet waits in a region's uplink or downlink before it is
// dropped, unless --queue says otherwise.
inline constexpr double kDefaultQueueSeconds = 0.1;

struct NetworkPlan {
  NetworkMode mode = NetworkMode::kUserspace;
  wan::WanShape shape;  // kNetns only: one site per region, in --regions order
};

// Checks the flags against the mode and the topology and, under netns,
// builds the WAN: sites named after the regions, one-way delays of half each
// pair's round trip, every region's uplink (topology.uplink) and
// downlink, queue limit, loss and jitter. The netns-only flags with
// --network userspace are an error that says why.
StatusOr<NetworkPlan> makeNetworkPlan(const NetworkOptions& options, const Topology& topology);

// "1%", "0.5%" or "0.01" -> a probability in [0, 1).
StatusOr<double> parseLoss(std::string_view text);

}  // namespace geo::local
