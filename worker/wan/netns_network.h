#pragma once
// NetnsNetwork: a WAN of kernel network namespaces, one per site, whose
// packets cross an emulator below TCP (Linux only; root).
//
// Each site gets a network namespace of its own with its loopback up and a
// TUN device `geo0` holding the site's address (siteAddress(): 198.18.0.1,
// 198.18.0.2, ... in 198.18.0.0/15, the range RFC 2544 sets aside for
// network benchmarks) and a route to every other site through it. Every
// packet one site sends to another leaves through its TUN device into one
// packet thread of this process, which asks a WanModel (wan_model.h) what
// happens to it -- lost, dropped by a full queue, or delivered at a time --
// holds it in a time-ordered heap, and writes it into the destination's
// TUN device at that time. So the kernels' TCP stacks see the WAN as a real
// path: retransmissions and their back-off after a cut, socket buffers that
// take a send long before the bytes leave, queues in front of a slow uplink,
// connections that stay half-open through a partition. Traffic inside a
// site (its processes talking over the site's own address or loopback)
// never reaches the emulator.
//
// Processes join a site with setns(namespaceFd(site), CLONE_NEWNET) before
// exec (local::SpawnSpec::netnsFd does it). The namespaces are held only by
// this object's descriptors and the processes in them: nothing is mounted
// under /run/netns, so nothing is left behind when this process dies,
// however it dies.
//
// Each namespace's TCP gets: autotuned buffers up to `tcpMaxBufferBytes`
// (net.ipv4.tcp_rmem/tcp_wmem; by default from the links, as a host tuned
// for them would have: tcpBufferBytesFor) from `tcpInitialReceiveBytes` for a
// receive buffer, IPv6 off, and the congestion control of the
// machine's own namespace (bbr or cubic: whatever
// net.ipv4.tcp_congestion_control says at the start).
//
// The packet thread asks for real-time scheduling (SCHED_FIFO) so that a
// loaded machine does not add its own delays to the emulated ones; where that
// is refused it runs at normal priority and says so (log).
//
// Threading: the setters, counters() and runIn() may be called from any
// thread. Errors are Statuses naming the site and the failed call; one that
// needs root says so.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "worker/wan/wan_model.h"

namespace geo::wan {

struct NetnsOptions {
  int mtu = 1500;
  // Segmentation offload: the TUN devices take TCP's segments in batches of
  // up to 64 KiB (TSO), as a real host's NIC does, and deliver them as one
  // (as GRO would). The model still counts every segment on the wire (its
  // headers included) against the uplink and downlink, and a batch arrives
  // when its last segment would. It costs the kernels and the packet thread
  // a fraction of the per-packet work; what it changes: a batch's first
  // bytes arrive up to one batch's serialization late (TCP sizes its
  // batches to about a millisecond of its pacing rate), and a batch is lost
  // or dropped whole -- so the network turns it off where any site loses
  // packets (SiteShape::loss), and each packet is then a segment.
  bool offload = true;
  // The most a TCP socket's send or receive buffer may grow to; 0: from the
  // shape, tcpBufferBytesFor(shape).
  int64_t tcpMaxBufferBytes = 0;
  // A TCP socket's receive buffer as it starts (tcp_rmem's second field),
  // before autotuning grows it: what its first advertised windows can be.
  // Linux's 128 KiB allows about 64 KB, so a connection opened with a
  // larger initial window (transport.tcpInitialWindow) would wait for the
  // receiver's; 0: from the shape, tcpInitialReceiveBytesFor(
  // tcpInitialWindowFor(shape)), as docs/kubernetes.md has an operator set.
  int64_t tcpInitialReceiveBytes = 0;
};

// The TCP buffer limit a host on these links needs: twice the largest
// bandwidth-delay product of any path (the path's round trip times the
// slower of the sender's uplink and the receiver's downlink), at least
// 32 MiB, at most 1 GiB, in whole MiB. Twice, because Linux advertises a
// half to two thirds of the buffer as receive window (the rest is the
// kernel's bookkeeping per packet): with a 32 MiB buffer one connection
// carried 76% of a 1 Gbit/s, 230 ms link (geo_fat_pipe_bench). Paths with
// no rate limit count as 1 Gbit/s.
int64_t tcpBufferBytesFor(const WanShape& shape);

// A TCP segment's payload at the namespaces' MTU of 1500 (IPv4, timestamps).
inline constexpr int64_t kTcpSegmentBytes = 1448;
// The bounds of tcpInitialWindowFor: the window hosts tuned for the WAN
// opened with before it was taken from the links, and the most
// transport.tcpInitialWindow allows.
inline constexpr int64_t kLeastTcpInitialWindow = 100;
inline constexpr int64_t kMostTcpInitialWindow = 1000;

// The initial congestion window, in segments, that hosts on these links
// open their connections with (geotrain local --network netns gives it to
// every worker as transport.tcpInitialWindow): bbr paces a fresh
// connection at its startup gain (2 / ln 2 = 2.885) times the window per round trip,
// so a window of the largest bandwidth-delay product over 2.885 lets the
// first rounds leave at the path's rate even on the longest round trip.
// Smaller, a worker's rounds queue in its socket buffer at the start
// (100 segments pace at 14.4 Mbit/s over 230 ms: two regions' rounds of the
// mlp were held 0.2-0.4 s each); cubic sends the window at once, a third of
// the product. Between kLeastTcpInitialWindow and kMostTcpInitialWindow
// (the world preset at 100 Mbit/s: 689 segments).
int64_t tcpInitialWindowFor(const WanShape& shape);

// The receive buffer a socket starts with (tcp_rmem's second field) so
// that it advertises an initial window of `segments` at once: Linux
// advertises about half of it, so twice the window, rounded up to a power
// of two, at least 1 MiB.
int64_t tcpInitialReceiveBytesFor(int64_t segments);

// The address of site `index` in every namespace network ("198.18.0.1" for
// site 0). Sites of different networks never see each other, so every network
// uses the same addresses.
std::string siteAddress(size_t index);

// Whether this process may create network namespaces; the error says what is
// missing and how to run instead.
Status checkNetnsAllowed();

class NetnsNetwork {
 public:
  static StatusOr<std::unique_ptr<NetnsNetwork>> create(WanShape shape, NetnsOptions options = {});
  // Stops the packet thread and closes the TUN devices and this object's
  // namespace descriptors (a namespace goes once no process is left in it).
  ~NetnsNetwork();
  NetnsNetwork(const NetnsNetwork&) = delete;
  NetnsNetwork& operator=(const NetnsNetwork&) = delete;

  size_t size() const;
  const WanShape& shape() const;
  // A descriptor of the site's namespace (/proc/.../ns/net), for setns(2).
  int namespaceFd(size_t site) const;

  // Runs `fn` on a new thread that has joined the site's namespace (sockets
  // it opens live there) and waits for it. An error if joining failed.
  Status runIn(size_t site, const std::function<void()>& fn) const;

  void setPartitioned(size_t site, bool cut);
  // The link between two sites only (WanModel::setLinkCut).
  void setLinkCut(size_t a, size_t b, bool cut);
  void setEgressRate(size_t site, double bitsPerSecond);
  void setIngressRate(size_t site, double bitsPerSecond);

  struct Counters {
    std::vector<SiteCounters> sites;
    uint64_t foreign = 0;   // packets to no site, or not IPv4: dropped
    uint64_t heldPeak = 0;  // most packets held at once
  };
  Counters counters() const;
  // Whether the packet thread got real-time scheduling.
  bool realtime() const;
  // Whether segmentation offload is on (NetnsOptions::offload, and no loss).
  bool offload() const;

 private:
  class Impl;
  explicit NetnsNetwork(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace geo::wan
