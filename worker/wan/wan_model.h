#pragma once
// WanModel: what the emulated WAN does to one IP packet, as a pure function
// of the packet's size, its two sites, the time it was sent and what the
// model has seen before. The namespace network (netns_network.h) asks it for
// every packet that leaves a site's TUN device and holds the packet until the
// time it answers; tests ask it directly with times of their own.
//
// The path of a packet from site s to site d (s != d):
//   1. partition: while s or d is cut off, or the link between the two is
//      (setLinkCut: a partial partition), every packet between them is lost
//      (also one already on its way when the cut begins: checked again on
//      arrival);
//   2. loss: lost with probability loss(s), independently per packet;
//   3. egress of s: a FIFO serializer at egressRate(s) shared by everything
//      s sends (its uplink). A packet leaves once the serializer has sent
//      what was queued before it; one that would wait longer than the
//      site's queue limit is dropped (tail drop, as a router's buffer);
//   4. propagation: the pair's one-way delay, plus a uniform jitter in
//      [0, jitter], never before the previous packet of the same pair (a
//      path's delay varies, its order does not);
//   5. ingress of d: a FIFO serializer at ingressRate(d) shared by
//      everything d receives (its downlink), with the same queue limit.
// Rates of 0 are unlimited (no queue). Delays are one-way and per ordered
// pair, so a path may be asymmetric.
//
// Time is the caller's: every call passes the time it acts at, and answers
// are times on the same clock. Thread-compatible (one owner; the namespace
// network calls it from its one packet thread). Setters take effect for
// packets sent from then on; a rate change keeps the times of packets
// already scheduled.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "common/status.h"

namespace geo::wan {

// Real time, as the packets it carries move in (geo::Clock is the
// injectable clock of the synchronizers).
using SteadyClock = std::chrono::steady_clock;
using Microseconds = std::chrono::microseconds;

struct SiteShape {
  double egressBitsPerSecond = 0;   // uplink; 0: unlimited
  double ingressBitsPerSecond = 0;  // downlink; 0: unlimited
  // The longest a packet may wait in either serializer before it is dropped
  // (a buffer of queue x rate bytes).
  Microseconds queue{100'000};
  double loss = 0;  // probability in [0, 1) that a packet it sends is lost
};

struct WanShape {
  std::vector<std::string> sites;                 // names, for messages
  std::vector<std::vector<Microseconds>> oneWay;  // oneWay[s][d]: s -> d, zero on the diagonal
  std::vector<SiteShape> site;                    // by site index
  Microseconds jitter{0};                         // uniform extra delay in [0, jitter]
  uint64_t seed = 1;                              // loss and jitter draws

  size_t size() const { return sites.size(); }
};

// Checks sizes (oneWay square and as many SiteShapes as sites), delays and
// queues >= 0, rates >= 0 and finite, loss in [0, 1). InvalidArgument naming
// the site or pair.
Status validateShape(const WanShape& shape);

enum class Fate { kDelivered, kLost, kQueueFull, kPartitioned };
const char* fateName(Fate fate);

// Counts of one site's packets (as sender: sent, lost, queueFull at its
// egress, partitioned; as receiver: delivered, and queueFull at its ingress
// counted in ingressDropped).
struct SiteCounters {
  uint64_t packetsSent = 0;
  uint64_t bytesSent = 0;
  uint64_t lost = 0;
  uint64_t egressDropped = 0;
  uint64_t partitioned = 0;
  uint64_t packetsDelivered = 0;
  uint64_t bytesDelivered = 0;
  uint64_t ingressDropped = 0;
};

class WanModel {
 public:
  // Requires validateShape(shape).ok() (GEO_ENFORCE).
  explicit WanModel(WanShape shape);

  struct Answer {
    Fate fate = Fate::kDelivered;
    // kDelivered: when the packet reaches the destination's ingress
    // (send()) or is delivered to the destination (arrive()).
    SteadyClock::time_point at{};
  };

  // A packet of `bytes` that site `src` sends to site `dst` at `now`: lost
  // (partition, loss, a full egress queue) or when it arrives at `dst`.
  // src != dst, both < size() (GEO_ENFORCE).
  Answer send(size_t src, size_t dst, size_t bytes, SteadyClock::time_point now);
  // The packet of send() at the time it arrives (`now`, the time send()
  // answered): lost (partition, a full ingress queue) or when `dst` gets it.
  // With an unlimited ingress that is `now`.
  Answer arrive(size_t src, size_t dst, size_t bytes, SteadyClock::time_point now);
  // Whether arrive() can answer a later time than it is given (an ingress
  // rate is set for `dst`).
  bool shapesIngress(size_t dst) const { return shape_.site[dst].ingressBitsPerSecond > 0; }

  void setPartitioned(size_t site, bool cut);
  bool partitioned(size_t site) const { return cut_[site]; }
  // The link between sites a and b (a != b) only, both ways: each still
  // reaches every other site.
  void setLinkCut(size_t a, size_t b, bool cut);
  bool linkCut(size_t a, size_t b) const { return cutLink_[a][b]; }
  // From now on (0: unlimited).
  void setEgressRate(size_t site, double bitsPerSecond);
  void setIngressRate(size_t site, double bitsPerSecond);

  const WanShape& shape() const { return shape_; }
  const SiteCounters& counters(size_t site) const { return counters_[site]; }

 private:
  // Whether packets between src and dst are lost to a cut: either site
  // cut off, or the link between them.
  bool severed(size_t src, size_t dst) const {
    return cut_[src] || cut_[dst] || cutLink_[src][dst];
  }

  // A FIFO serializer: when a packet of `bytes` handed over at `now` has
  // been sent, or nullopt when it would wait longer than `queue`.
  struct Serializer {
    SteadyClock::time_point nextFree{};  // only compared after max() with now
    std::optional<SteadyClock::time_point> pass(size_t bytes, double bitsPerSecond,
                                                Microseconds queue, SteadyClock::time_point now);
  };

  WanShape shape_;
  std::vector<bool> cut_;
  std::vector<std::vector<bool>> cutLink_;  // [a][b] == [b][a]
  std::vector<Serializer> egress_, ingress_;
  std::vector<std::vector<SteadyClock::time_point>> lastArrival_;  // [src][dst]
  std::vector<SiteCounters> counters_;
  std::mt19937_64 random_;
};

}  // namespace geo::wan
