#include "worker/wan/netns_network.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <net/route.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <mutex>
#include <optional>
#include <thread>

#include "common/enforce.h"

namespace geo::wan {

namespace {

constexpr uint32_t kBase = (198u << 24) | (18u << 16);  // 198.18.0.0
constexpr uint32_t kNetmask = 0xfffe0000u;              // /15
constexpr const char* kTunName = "geo0";
// Packets read from one TUN device before the others get a turn.
constexpr int kReadBatch = 64;
// The header a TUN device with IFF_VNET_HDR puts before each packet
// (struct virtio_net_hdr of <linux/virtio_net.h>, which does not compile as
// C++: a field is named `class`). Little-endian on this host, as the
// kernel's legacy virtio-net header is native-endian.
struct VnetHeader {
  uint8_t flags;
  uint8_t gsoType;  // 0: a single packet; else a batch of segments (| 0x80: ECN)
  uint16_t hdrLen;
  uint16_t gsoSize;  // payload bytes per segment
  uint16_t csumStart;
  uint16_t csumOffset;
};
static_assert(sizeof(VnetHeader) == 10);
constexpr uint8_t kGsoNone = 0;
constexpr uint8_t kGsoEcn = 0x80;
// The largest packet a TUN device hands over: 64 KiB of IP, plus the
// virtio-net header that carries a batch's segmentation (offload on).
constexpr size_t kVnetHeaderBytes = sizeof(VnetHeader);
constexpr size_t kMaxPacket = 65536 + kVnetHeaderBytes;

std::string errnoText(int error) {
  return std::strerror(error);
}

class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  ~Fd() { reset(); }
  int get() const { return fd_; }
  void reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

// Runs `fn` on a fresh thread with every signal blocked (the caller's
// signalfd must keep getting them) and waits for it. A thread's network
// namespace is its own: unshare() or setns() there leaves the process's
// other threads where they are.
template <typename F>
void onOwnThread(F&& fn) {
  std::thread t([&] {
    sigset_t all;
    sigfillset(&all);
    ::pthread_sigmask(SIG_BLOCK, &all, nullptr);
    fn();
  });
  t.join();
}

Status setFlagUp(int sock, const char* name) {
  ifreq ifr{};
  std::strncpy(ifr.ifr_name, name, IFNAMSIZ - 1);
  if (::ioctl(sock, SIOCGIFFLAGS, &ifr) != 0) {
    return unavailable(fmt::format("SIOCGIFFLAGS {}: {}", name, errnoText(errno)));
  }
  ifr.ifr_flags = static_cast<short>(ifr.ifr_flags | IFF_UP);
  if (::ioctl(sock, SIOCSIFFLAGS, &ifr) != 0) {
    return unavailable(fmt::format("bringing {} up: {}", name, errnoText(errno)));
  }
  return {};
}

Status setAddress(int sock, const char* name, unsigned long request, uint32_t address) {
  ifreq ifr{};
  std::strncpy(ifr.ifr_name, name, IFNAMSIZ - 1);
  sockaddr_in in{};
  in.sin_family = AF_INET;
  in.sin_addr.s_addr = htonl(address);
  std::memcpy(&ifr.ifr_addr, &in, sizeof in);
  if (::ioctl(sock, request, &ifr) != 0) {
    return unavailable(fmt::format("setting the {} of {}: {}",
                                   request == SIOCSIFADDR ? "address" : "netmask", name,
                                   errnoText(errno)));
  }
  return {};
}

// Writes a sysctl of the calling thread's namespace (/proc/sys/net follows
// the opener's namespace).
Status writeSysctl(const std::string& path, const std::string& value, bool optional = false) {
  std::ofstream out(path);
  if (!out) {
    if (optional) return {};
    return unavailable(fmt::format("cannot open {}", path));
  }
  out << value << "\n";
  out.flush();
  if (!out) return unavailable(fmt::format("cannot write {} to {}", value, path));
  return {};
}

std::string readSysctl(const std::string& path) {
  std::ifstream in(path);
  std::string value;
  std::getline(in, value);
  return value;
}

struct Site {
  Fd ns;
  Fd tun;
};

// On the calling thread: a new namespace with lo up and the TUN device of
// site `index`. The thread stays in the new namespace.
StatusOr<Site> makeSite(size_t index, const WanShape& shape, const NetnsOptions& options,
                        const std::string& congestionControl, bool offload) {
  const std::string where = fmt::format("site {} ({})", index, shape.sites[index]);
  if (::unshare(CLONE_NEWNET) != 0) {
    const int error = errno;
    if (error == EPERM) {
      return Status(StatusCode::kPermissionDenied,
                    fmt::format("{}: creating a network namespace: {} (it needs root: "
                                "CAP_SYS_ADMIN and CAP_NET_ADMIN)",
                                where, errnoText(error)));
    }
    return unavailable(fmt::format("{}: unshare(CLONE_NEWNET): {}", where, errnoText(error)));
  }
  Site site;
  site.ns = Fd(::open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC));
  if (site.ns.get() < 0) {
    return unavailable(fmt::format("{}: opening its namespace: {}", where, errnoText(errno)));
  }
  Fd sock(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (sock.get() < 0) return unavailable(fmt::format("{}: socket(): {}", where, errnoText(errno)));
  GEO_RETURN_IF_ERROR(setFlagUp(sock.get(), "lo").withContext(where));
  // IPv4 only: with IPv6 on, a device that comes up sends router and
  // neighbour solicitations into the WAN. Before the TUN device exists.
  for (const char* conf : {"all", "default"}) {
    GEO_RETURN_IF_ERROR(
        writeSysctl(fmt::format("/proc/sys/net/ipv6/conf/{}/disable_ipv6", conf), "1", true)
            .withContext(where));
  }

  site.tun = Fd(::open("/dev/net/tun", O_RDWR | O_NONBLOCK | O_CLOEXEC));
  if (site.tun.get() < 0) {
    return unavailable(
        fmt::format("{}: opening /dev/net/tun: {} (the kernel needs TUN support: "
                    "modprobe tun)",
                    where, errnoText(errno)));
  }
  ifreq ifr{};
  std::strncpy(ifr.ifr_name, kTunName, IFNAMSIZ - 1);
  ifr.ifr_flags = static_cast<short>(IFF_TUN | IFF_NO_PI | (offload ? IFF_VNET_HDR : 0));
  if (::ioctl(site.tun.get(), TUNSETIFF, &ifr) != 0) {
    return unavailable(fmt::format("{}: creating the TUN device: {}", where, errnoText(errno)));
  }
  if (offload) {
    const int headerBytes = static_cast<int>(kVnetHeaderBytes);
    const unsigned features = TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6 | TUN_F_TSO_ECN;
    if (::ioctl(site.tun.get(), TUNSETVNETHDRSZ, &headerBytes) != 0 ||
        ::ioctl(site.tun.get(), TUNSETOFFLOAD, features) != 0) {
      return unavailable(
          fmt::format("{}: segmentation offload on the TUN device: {}", where, errnoText(errno)));
    }
  }
  ifr = {};
  std::strncpy(ifr.ifr_name, kTunName, IFNAMSIZ - 1);
  ifr.ifr_mtu = options.mtu;
  if (::ioctl(sock.get(), SIOCSIFMTU, &ifr) != 0) {
    return unavailable(fmt::format("{}: MTU {}: {}", where, options.mtu, errnoText(errno)));
  }
  GEO_RETURN_IF_ERROR(
      setAddress(sock.get(), kTunName, SIOCSIFADDR, kBase + static_cast<uint32_t>(index) + 1)
          .withContext(where));
  GEO_RETURN_IF_ERROR(
      setAddress(sock.get(), kTunName, SIOCSIFNETMASK, kNetmask).withContext(where));
  GEO_RETURN_IF_ERROR(setFlagUp(sock.get(), kTunName).withContext(where));

  const std::string maxBuffer = std::to_string(options.tcpMaxBufferBytes);
  GEO_RETURN_IF_ERROR(
      writeSysctl("/proc/sys/net/ipv4/tcp_rmem",
                  fmt::format("4096 {} {}", options.tcpInitialReceiveBytes, maxBuffer))
          .withContext(where));
  GEO_RETURN_IF_ERROR(
      writeSysctl("/proc/sys/net/ipv4/tcp_wmem", "4096 16384 " + maxBuffer).withContext(where));
  if (!congestionControl.empty()) {
    GEO_RETURN_IF_ERROR(
        writeSysctl("/proc/sys/net/ipv4/tcp_congestion_control", congestionControl, true)
            .withContext(where));
  }
  return site;
}

}  // namespace

std::string siteAddress(size_t index) {
  const uint32_t a = kBase + static_cast<uint32_t>(index) + 1;
  return fmt::format("{}.{}.{}.{}", a >> 24, (a >> 16) & 255, (a >> 8) & 255, a & 255);
}

Status checkNetnsAllowed() {
  Status result;
  onOwnThread([&] {
    if (::unshare(CLONE_NEWNET) != 0) {
      result = Status(StatusCode::kPermissionDenied,
                      fmt::format("cannot create a network namespace ({}): the namespace network "
                                  "needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN)",
                                  errnoText(errno)));
      return;
    }
    Fd tun(::open("/dev/net/tun", O_RDWR | O_CLOEXEC));
    if (tun.get() < 0) {
      result =
          unavailable(fmt::format("cannot open /dev/net/tun ({}): the namespace network "
                                  "needs the kernel's TUN devices",
                                  errnoText(errno)));
    }
  });
  return result;
}

// The bytes a packet puts on the wire: itself, or under offload every
// segment of a batch with its own IP and TCP headers. `ip` is the packet
// after any virtio-net header.
size_t wireBytes(const uint8_t* vnet, const uint8_t* ip, size_t ipBytes) {
  if (vnet == nullptr) return ipBytes;
  VnetHeader h;
  std::memcpy(&h, vnet, sizeof h);
  if ((h.gsoType & ~kGsoEcn) == kGsoNone || h.gsoSize == 0) return ipBytes;
  const size_t ipHeader = static_cast<size_t>(ip[0] & 0x0f) * 4;
  if (ipHeader + 13 > ipBytes) return ipBytes;
  const size_t headers = ipHeader + static_cast<size_t>(ip[ipHeader + 12] >> 4) * 4;
  if (headers >= ipBytes) return ipBytes;
  const size_t payload = ipBytes - headers;
  const size_t segments = (payload + h.gsoSize - 1) / h.gsoSize;
  return payload + segments * headers;
}

class NetnsNetwork::Impl {
 public:
  Impl(WanShape shape, std::vector<Site> sites, bool offload)
      : model_(std::move(shape)), sites_(std::move(sites)), offload_(offload) {}

  ~Impl() { stop(); }

  Status start() {
    epoll_ = Fd(::epoll_create1(EPOLL_CLOEXEC));
    timer_ = Fd(::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC));
    wake_ = Fd(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
    if (epoll_.get() < 0 || timer_.get() < 0 || wake_.get() < 0) {
      return unavailable(fmt::format("the packet thread's descriptors: {}", errnoText(errno)));
    }
    auto watch = [&](int fd, uint64_t tag) {
      epoll_event e{};
      e.events = EPOLLIN;
      e.data.u64 = tag;
      return ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &e) == 0;
    };
    bool ok = watch(timer_.get(), kTimerTag) && watch(wake_.get(), kWakeTag);
    for (size_t i = 0; i < sites_.size(); ++i) ok = ok && watch(sites_[i].tun.get(), i);
    if (!ok) return unavailable(fmt::format("epoll_ctl: {}", errnoText(errno)));
    thread_ = std::thread([this] { run(); });
    return {};
  }

  void stop() {
    if (!thread_.joinable()) return;
    stopping_.store(true);
    const uint64_t one = 1;
    [[maybe_unused]] const ssize_t n = ::write(wake_.get(), &one, sizeof one);
    thread_.join();
  }

  WanModel model_;  // guarded by mu_
  mutable std::mutex mu_;
  std::vector<Site> sites_;
  const bool offload_;
  uint64_t foreign_ = 0;   // guarded by mu_
  uint64_t heldPeak_ = 0;  // guarded by mu_

 private:
  static constexpr uint64_t kTimerTag = ~uint64_t{0};
  static constexpr uint64_t kWakeTag = ~uint64_t{0} - 1;

  struct Pending {
    SteadyClock::time_point at;
    uint64_t seq = 0;
    uint32_t src = 0;
    uint32_t dst = 0;
    bool arrived = false;        // past arrive(): written at `at`
    size_t wire = 0;             // the bytes it puts on the wire (WanModel's size)
    std::vector<uint8_t> bytes;  // as read, a virtio-net header first under offload
  };
  // A min-heap on (at, seq): equal times leave in the order they came.
  struct Later {
    bool operator()(const Pending& a, const Pending& b) const {
      return a.at != b.at ? a.at > b.at : a.seq > b.seq;
    }
  };

  void run() {
    sigset_t all;
    sigfillset(&all);
    ::pthread_sigmask(SIG_BLOCK, &all, nullptr);
    ::prctl(PR_SET_TIMERSLACK, 1UL);
    sched_param param{};
    param.sched_priority = 10;
    realtime_ = ::pthread_setschedparam(::pthread_self(), SCHED_FIFO, &param) == 0;
    std::vector<epoll_event> events(sites_.size() + 2);
    std::vector<uint8_t> buffer(kMaxPacket);
    while (!stopping_.load()) {
      const int n = ::epoll_wait(epoll_.get(), events.data(), static_cast<int>(events.size()), -1);
      if (n < 0 && errno != EINTR) break;
      std::lock_guard lock(mu_);
      for (int i = 0; i < n; ++i) {
        const uint64_t tag = events[static_cast<size_t>(i)].data.u64;
        if (tag == kTimerTag) {
          uint64_t expirations;
          [[maybe_unused]] const ssize_t r = ::read(timer_.get(), &expirations, sizeof expirations);
        } else if (tag == kWakeTag) {
          uint64_t value;
          [[maybe_unused]] const ssize_t r = ::read(wake_.get(), &value, sizeof value);
        } else {
          readSite(static_cast<size_t>(tag), buffer);
        }
      }
      release();
      arm();
    }
  }

  // Takes up to kReadBatch packets from a site's TUN device into the heap.
  void readSite(size_t src, std::vector<uint8_t>& buffer) {
    for (int k = 0; k < kReadBatch; ++k) {
      const ssize_t got = ::read(sites_[src].tun.get(), buffer.data(), buffer.size());
      if (got <= 0) return;
      const auto now = SteadyClock::now();
      const size_t size = static_cast<size_t>(got);
      const size_t skip = offload_ ? kVnetHeaderBytes : 0;
      const uint8_t* ip = buffer.data() + skip;
      if (size < skip + 20 || (ip[0] >> 4) != 4) {
        ++foreign_;
        continue;
      }
      const uint32_t dstAddress = (uint32_t{ip[16]} << 24) | (uint32_t{ip[17]} << 16) |
                                  (uint32_t{ip[18]} << 8) | uint32_t{ip[19]};
      const uint64_t slot = uint64_t{dstAddress} - kBase - 1;
      if (dstAddress <= kBase || slot >= sites_.size() || slot == src) {
        ++foreign_;
        continue;
      }
      const auto dst = static_cast<size_t>(slot);
      const size_t wire = wireBytes(offload_ ? buffer.data() : nullptr, ip, size - skip);
      const WanModel::Answer answer = model_.send(src, dst, wire, now);
      if (answer.fate != Fate::kDelivered) continue;
      Pending p;
      p.at = answer.at;
      p.seq = nextSeq_++;
      p.src = static_cast<uint32_t>(src);
      p.dst = static_cast<uint32_t>(dst);
      p.wire = wire;
      p.bytes.assign(buffer.begin(), buffer.begin() + got);
      heap_.push_back(std::move(p));
      std::push_heap(heap_.begin(), heap_.end(), Later{});
      heldPeak_ = std::max<uint64_t>(heldPeak_, heap_.size());
    }
  }

  // Everything whose time has come: through the destination's ingress, then
  // into its TUN device.
  void release() {
    while (!heap_.empty() && heap_.front().at <= SteadyClock::now()) {
      std::pop_heap(heap_.begin(), heap_.end(), Later{});
      Pending p = std::move(heap_.back());
      heap_.pop_back();
      if (!p.arrived) {
        const WanModel::Answer answer = model_.arrive(p.src, p.dst, p.wire, p.at);
        if (answer.fate != Fate::kDelivered) continue;
        p.arrived = true;
        if (answer.at > p.at) {
          p.at = answer.at;
          p.seq = nextSeq_++;
          heap_.push_back(std::move(p));
          std::push_heap(heap_.begin(), heap_.end(), Later{});
          continue;
        }
      }
      // A TUN write hands the packet to the destination's stack; a full
      // socket there drops it as a real host would.
      [[maybe_unused]] const ssize_t w =
          ::write(sites_[p.dst].tun.get(), p.bytes.data(), p.bytes.size());
    }
  }

  void arm() {
    itimerspec spec{};
    if (!heap_.empty()) {
      const auto ns =
          std::chrono::duration_cast<std::chrono::nanoseconds>(heap_.front().at.time_since_epoch())
              .count();
      spec.it_value.tv_sec = static_cast<time_t>(ns / 1'000'000'000);
      spec.it_value.tv_nsec = static_cast<long>(ns % 1'000'000'000);
      if (spec.it_value.tv_sec == 0 && spec.it_value.tv_nsec == 0) spec.it_value.tv_nsec = 1;
    }
    ::timerfd_settime(timer_.get(), TFD_TIMER_ABSTIME, &spec, nullptr);
  }

 public:
  std::atomic<bool> realtime_{false};

 private:
  Fd epoll_, timer_, wake_;
  std::thread thread_;
  std::atomic<bool> stopping_{false};
  std::vector<Pending> heap_;
  uint64_t nextSeq_ = 0;
};

namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

// The largest bandwidth-delay product of any path, in bytes: the path's
// round trip times the slower of the sender's uplink and the receiver's
// downlink, a link with no rate counting as 1 Gbit/s.
double largestBandwidthDelayBytes(const WanShape& shape) {
  constexpr double kUnlimited = 1e9;  // bits per second
  const auto rate = [](double bits) { return bits > 0 ? bits : kUnlimited; };
  double most = 0;
  for (size_t s = 0; s < shape.size(); ++s) {
    for (size_t d = 0; d < shape.size(); ++d) {
      if (s == d) continue;
      const double bits = std::min(rate(shape.site[s].egressBitsPerSecond),
                                   rate(shape.site[d].ingressBitsPerSecond));
      const double rtt =
          std::chrono::duration<double>(shape.oneWay[s][d] + shape.oneWay[d][s]).count();
      most = std::max(most, bits / 8 * rtt);
    }
  }
  return most;
}

}  // namespace

int64_t tcpBufferBytesFor(const WanShape& shape) {
  const double most = largestBandwidthDelayBytes(shape);
  const auto wanted = static_cast<int64_t>(std::ceil(2 * most / static_cast<double>(kMiB))) * kMiB;
  return std::clamp<int64_t>(wanted, 32 * kMiB, 1024 * kMiB);
}

int64_t tcpInitialWindowFor(const WanShape& shape) {
  constexpr double kBbrStartupGain = 2.885;  // 2 / ln 2, as Linux's bbr has it
  const double segments =
      std::ceil(largestBandwidthDelayBytes(shape) / kBbrStartupGain / kTcpSegmentBytes);
  return std::clamp<int64_t>(static_cast<int64_t>(segments), kLeastTcpInitialWindow,
                             kMostTcpInitialWindow);
}

int64_t tcpInitialReceiveBytesFor(int64_t segments) {
  const double window =
      2.0 * static_cast<double>(std::max<int64_t>(segments, 1) * kTcpSegmentBytes);
  const auto power = int64_t{1} << static_cast<int>(std::ceil(std::log2(window)));
  return std::max(power, kMiB);
}

StatusOr<std::unique_ptr<NetnsNetwork>> NetnsNetwork::create(WanShape shape, NetnsOptions options) {
  GEO_RETURN_IF_ERROR(validateShape(shape));
  if (options.tcpMaxBufferBytes == 0) options.tcpMaxBufferBytes = tcpBufferBytesFor(shape);
  if (options.tcpInitialReceiveBytes == 0) {
    options.tcpInitialReceiveBytes = tcpInitialReceiveBytesFor(tcpInitialWindowFor(shape));
  }
  options.tcpInitialReceiveBytes =
      std::clamp<int64_t>(options.tcpInitialReceiveBytes, 4096, options.tcpMaxBufferBytes);
  if (options.mtu < 576 || options.mtu > 9000) {
    return invalidArgument(fmt::format("MTU {}: allowed from 576 to 9000", options.mtu));
  }
  if (options.tcpMaxBufferBytes < 65536) {
    return invalidArgument(fmt::format("TCP buffer limit {} bytes: at least 65536 is needed",
                                       options.tcpMaxBufferBytes));
  }
  const std::string congestionControl = readSysctl("/proc/sys/net/ipv4/tcp_congestion_control");
  // Lost packets are single segments: no offload where any site loses some.
  const bool offload =
      options.offload && std::all_of(shape.site.begin(), shape.site.end(),
                                     [](const SiteShape& site) { return site.loss == 0; });
  std::vector<Site> sites;
  for (size_t i = 0; i < shape.size(); ++i) {
    std::optional<StatusOr<Site>> site;
    onOwnThread([&] { site.emplace(makeSite(i, shape, options, congestionControl, offload)); });
    if (!site->ok()) return site->status();
    sites.push_back(std::move(**site));
  }
  auto impl = std::make_unique<Impl>(std::move(shape), std::move(sites), offload);
  GEO_RETURN_IF_ERROR(impl->start());
  return std::unique_ptr<NetnsNetwork>(new NetnsNetwork(std::move(impl)));
}

NetnsNetwork::NetnsNetwork(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
NetnsNetwork::~NetnsNetwork() = default;

size_t NetnsNetwork::size() const {
  return impl_->sites_.size();
}
const WanShape& NetnsNetwork::shape() const {
  return impl_->model_.shape();
}
int NetnsNetwork::namespaceFd(size_t site) const {
  GEO_ENFORCE(site < impl_->sites_.size(), "a site of the network");
  return impl_->sites_[site].ns.get();
}

Status NetnsNetwork::runIn(size_t site, const std::function<void()>& fn) const {
  const int fd = namespaceFd(site);
  Status result;
  onOwnThread([&] {
    if (::setns(fd, CLONE_NEWNET) != 0) {
      result =
          unavailable(fmt::format("joining the namespace of site {}: {}", site, errnoText(errno)));
      return;
    }
    fn();
  });
  return result;
}

void NetnsNetwork::setPartitioned(size_t site, bool cut) {
  std::lock_guard lock(impl_->mu_);
  impl_->model_.setPartitioned(site, cut);
}

void NetnsNetwork::setLinkCut(size_t a, size_t b, bool cut) {
  std::lock_guard lock(impl_->mu_);
  impl_->model_.setLinkCut(a, b, cut);
}

void NetnsNetwork::setEgressRate(size_t site, double bitsPerSecond) {
  std::lock_guard lock(impl_->mu_);
  impl_->model_.setEgressRate(site, bitsPerSecond);
}

void NetnsNetwork::setIngressRate(size_t site, double bitsPerSecond) {
  std::lock_guard lock(impl_->mu_);
  impl_->model_.setIngressRate(site, bitsPerSecond);
}

bool NetnsNetwork::realtime() const {
  return impl_->realtime_.load();
}

bool NetnsNetwork::offload() const {
  return impl_->offload_;
}

NetnsNetwork::Counters NetnsNetwork::counters() const {
  std::lock_guard lock(impl_->mu_);
  Counters c;
  for (size_t i = 0; i < impl_->sites_.size(); ++i) c.sites.push_back(impl_->model_.counters(i));
  c.foreign = impl_->foreign_;
  c.heldPeak = impl_->heldPeak_;
  return c;
}

}  // namespace geo::wan
