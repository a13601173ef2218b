#include "worker/transport/initial_window.h"

#include <arpa/inet.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <net/if.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

namespace geo::transport {
namespace {

struct Address {
  int family = AF_INET;
  std::array<uint8_t, 16> bytes{};
  size_t length() const { return family == AF_INET ? 4 : 16; }
  uint8_t prefix() const { return family == AF_INET ? 32 : 128; }
  bool operator<(const Address& o) const {
    return std::pair(family, bytes) < std::pair(o.family, o.bytes);
  }
};

std::string text(const Address& a) {
  char out[INET6_ADDRSTRLEN] = {};
  ::inet_ntop(a.family, a.bytes.data(), out, sizeof out);
  return out;
}

// One rtnetlink request: a header, an rtmsg and its attributes.
class Request {
 public:
  Request(uint16_t type, uint16_t flags, const rtmsg& rt) {
    buf_.resize(NLMSG_LENGTH(sizeof(rtmsg)));
    auto* h = reinterpret_cast<nlmsghdr*>(buf_.data());
    h->nlmsg_type = type;
    h->nlmsg_flags = flags;
    std::memcpy(NLMSG_DATA(h), &rt, sizeof rt);
  }
  void add(uint16_t type, const void* data, size_t bytes) {
    const size_t at = NLMSG_ALIGN(buf_.size());
    buf_.resize(at + RTA_SPACE(bytes));
    auto* a = reinterpret_cast<rtattr*>(buf_.data() + at);
    a->rta_type = type;
    a->rta_len = static_cast<uint16_t>(RTA_LENGTH(bytes));
    std::memcpy(RTA_DATA(a), data, bytes);
  }
  void addU32(uint16_t type, uint32_t value) { add(type, &value, sizeof value); }
  std::vector<uint8_t>& finish(uint32_t seq) {
    auto* h = reinterpret_cast<nlmsghdr*>(buf_.data());
    h->nlmsg_len = static_cast<uint32_t>(buf_.size());
    h->nlmsg_seq = seq;
    return buf_;
  }

 private:
  std::vector<uint8_t> buf_;
};

// The route the kernel chooses for an address, as RTM_GETROUTE answers.
struct Route {
  rtmsg head{};
  uint32_t table = RT_TABLE_MAIN;
  std::optional<int> oif;
  std::vector<uint8_t> gateway, via, prefsrc;
  std::vector<std::pair<uint16_t, uint32_t>> metrics;  // RTAX_*, value
};

class Netlink {
 public:
  static StatusOr<Netlink> open() {
    Netlink n;
    n.fd_ = ::socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE);
    if (n.fd_ < 0) return unavailable(fmt::format("netlink socket: {}", std::strerror(errno)));
    return n;
  }
  Netlink(Netlink&& o) noexcept : fd_(std::exchange(o.fd_, -1)), seq_(o.seq_) {}
  Netlink& operator=(Netlink&&) = delete;
  ~Netlink() {
    if (fd_ >= 0) ::close(fd_);
  }

  // Sends one request and reads its answer: one message for the two
  // requests made here (RTM_GETROUTE's route; RTM_NEWROUTE's
  // acknowledgement, under NLM_F_ACK). An NLMSG_ERROR with a non-zero code
  // comes back as that errno (negative), in `error`.
  Status exchange(Request& request, std::vector<uint8_t>& answer, int& error) {
    error = 0;
    const auto& bytes = request.finish(++seq_);
    sockaddr_nl kernel{};
    kernel.nl_family = AF_NETLINK;
    if (::sendto(fd_, bytes.data(), bytes.size(), 0, reinterpret_cast<sockaddr*>(&kernel),
                 sizeof kernel) < 0) {
      return unavailable(fmt::format("netlink send: {}", std::strerror(errno)));
    }
    answer.assign(1 << 16, 0);
    const ssize_t got = ::recv(fd_, answer.data(), answer.size(), 0);
    if (got < 0) return unavailable(fmt::format("netlink receive: {}", std::strerror(errno)));
    answer.resize(static_cast<size_t>(got));
    auto* h = reinterpret_cast<nlmsghdr*>(answer.data());
    if (!NLMSG_OK(h, static_cast<unsigned>(got)) || h->nlmsg_seq != seq_) {
      return unavailable("netlink: a truncated answer, or one to another request");
    }
    if (h->nlmsg_type == NLMSG_ERROR) {
      const auto* e = static_cast<const nlmsgerr*>(NLMSG_DATA(h));
      error = e->error;
    }
    return {};
  }

 private:
  Netlink() = default;
  int fd_ = -1;
  uint32_t seq_ = 0;
};

StatusOr<std::optional<Route>> lookup(Netlink& nl, const Address& a) {
  rtmsg rt{};
  rt.rtm_family = static_cast<uint8_t>(a.family);
  rt.rtm_dst_len = a.prefix();
  Request req(RTM_GETROUTE, NLM_F_REQUEST, rt);
  req.add(RTA_DST, a.bytes.data(), a.length());
  std::vector<uint8_t> answer;
  int error = 0;
  GEO_RETURN_IF_ERROR(nl.exchange(req, answer, error));
  if (error == -ENETUNREACH || error == -EHOSTUNREACH) return std::optional<Route>();
  if (error != 0) {
    return unavailable(fmt::format("the route to {}: {}", text(a), std::strerror(-error)));
  }
  auto* h = reinterpret_cast<nlmsghdr*>(answer.data());
  if (h->nlmsg_type != RTM_NEWROUTE) {
    return unavailable(fmt::format("the route to {}: an unexpected answer", text(a)));
  }
  Route r;
  r.head = *static_cast<const rtmsg*>(NLMSG_DATA(h));
  r.table = r.head.rtm_table;
  int left = static_cast<int>(RTM_PAYLOAD(h));
  for (auto* at = RTM_RTA(NLMSG_DATA(h)); RTA_OK(at, left); at = RTA_NEXT(at, left)) {
    const auto* data = static_cast<const uint8_t*>(RTA_DATA(at));
    const size_t bytes = RTA_PAYLOAD(at);
    switch (at->rta_type) {
      case RTA_TABLE: std::memcpy(&r.table, data, sizeof r.table); break;
      case RTA_OIF: {
        int oif = 0;
        std::memcpy(&oif, data, sizeof oif);
        r.oif = oif;
        break;
      }
      case RTA_GATEWAY: r.gateway.assign(data, data + bytes); break;
      case RTA_VIA: r.via.assign(data, data + bytes); break;
      case RTA_PREFSRC: r.prefsrc.assign(data, data + bytes); break;
      case RTA_METRICS: {
        int inner = static_cast<int>(bytes);
        for (auto* m = static_cast<rtattr*>(RTA_DATA(at)); RTA_OK(m, inner);
             m = RTA_NEXT(m, inner)) {
          if (RTA_PAYLOAD(m) != sizeof(uint32_t)) continue;  // RTAX_CC_ALGO is a name
          uint32_t v = 0;
          std::memcpy(&v, RTA_DATA(m), sizeof v);
          r.metrics.emplace_back(m->rta_type, v);
        }
        break;
      }
      default: break;
    }
  }
  return std::optional<Route>(std::move(r));
}

// The two windows a route carries (0: the kernel's).
RouteWindows windowsOf(const Route& route) {
  RouteWindows w;
  for (const auto& [type, value] : route.metrics) {
    if (type == RTAX_INITCWND) w.initcwnd = value;
    if (type == RTAX_INITRWND) w.initrwnd = value;
  }
  return w;
}

StatusOr<std::set<Address>> resolve(const std::string& endpoint) {
  constexpr std::string_view kScheme = "tcp://";
  const auto bad = [&] {
    return invalidArgument(
        fmt::format("{}: not a TCP endpoint (tcp://host:port): only TCP connections have an "
                    "initial window",
                    endpoint));
  };
  if (endpoint.rfind(kScheme, 0) != 0) return bad();
  std::string host = endpoint.substr(kScheme.size());
  const auto colon = host.rfind(':');
  if (colon == std::string::npos || colon == 0) return bad();
  host.resize(colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &found); rc != 0) {
    return unavailable(fmt::format("{}: cannot resolve {}: {}", endpoint, host, gai_strerror(rc)));
  }
  std::set<Address> out;
  for (const addrinfo* i = found; i != nullptr; i = i->ai_next) {
    Address a;
    a.family = i->ai_family;
    if (i->ai_family == AF_INET) {
      const auto* in = reinterpret_cast<const sockaddr_in*>(i->ai_addr);
      std::memcpy(a.bytes.data(), &in->sin_addr, 4);
    } else if (i->ai_family == AF_INET6) {
      const auto* in6 = reinterpret_cast<const sockaddr_in6*>(i->ai_addr);
      std::memcpy(a.bytes.data(), &in6->sin6_addr, 16);
    } else {
      continue;
    }
    out.insert(a);
  }
  ::freeaddrinfo(found);
  return out;
}

StatusOr<Address> numeric(const std::string& address) {
  Address a;
  if (::inet_pton(AF_INET, address.c_str(), a.bytes.data()) == 1) return a;
  a.family = AF_INET6;
  if (::inet_pton(AF_INET6, address.c_str(), a.bytes.data()) == 1) return a;
  return invalidArgument(fmt::format("{}: not a numeric IPv4 or IPv6 address", address));
}

// The host route to `a` through `via`, with the two windows set.
Status addHostRoute(Netlink& nl, const Address& a, const Route& via, uint32_t segments) {
  rtmsg rt{};
  rt.rtm_family = static_cast<uint8_t>(a.family);
  rt.rtm_dst_len = a.prefix();
  rt.rtm_table = static_cast<uint8_t>(via.table < 256 ? via.table : RT_TABLE_UNSPEC);
  rt.rtm_protocol = RTPROT_STATIC;
  rt.rtm_scope = via.gateway.empty() && via.via.empty() ? RT_SCOPE_LINK : RT_SCOPE_UNIVERSE;
  rt.rtm_type = RTN_UNICAST;
  rt.rtm_flags = via.head.rtm_flags & RTNH_F_ONLINK;  // e.g. Calico's next hop 169.254.1.1
  Request req(RTM_NEWROUTE, NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE, rt);
  req.add(RTA_DST, a.bytes.data(), a.length());
  req.addU32(RTA_TABLE, via.table);
  if (via.oif) req.addU32(RTA_OIF, static_cast<uint32_t>(*via.oif));
  if (!via.gateway.empty()) req.add(RTA_GATEWAY, via.gateway.data(), via.gateway.size());
  if (!via.via.empty()) req.add(RTA_VIA, via.via.data(), via.via.size());
  if (!via.prefsrc.empty()) req.add(RTA_PREFSRC, via.prefsrc.data(), via.prefsrc.size());
  // The chosen route's own metrics (an MTU, an advertised MSS) stay; the
  // two windows are ours. (A path MTU the kernel learned for the address
  // comes back as the lookup's MTU and so stays too: smaller packets, never
  // lost ones.)
  std::vector<uint8_t> metrics;
  const auto metric = [&](uint16_t type, uint32_t value) {
    const size_t at = metrics.size();
    metrics.resize(at + RTA_SPACE(sizeof value));
    auto* m = reinterpret_cast<rtattr*>(metrics.data() + at);
    m->rta_type = type;
    m->rta_len = static_cast<uint16_t>(RTA_LENGTH(sizeof value));
    std::memcpy(RTA_DATA(m), &value, sizeof value);
  };
  for (const auto& [type, value] : via.metrics) {
    if (type != RTAX_INITCWND && type != RTAX_INITRWND) metric(type, value);
  }
  metric(RTAX_INITCWND, segments);
  metric(RTAX_INITRWND, segments);
  req.add(RTA_METRICS, metrics.data(), metrics.size());
  std::vector<uint8_t> answer;
  int error = 0;
  GEO_RETURN_IF_ERROR(nl.exchange(req, answer, error));
  if (error == -EPERM || error == -EACCES) {
    return Status(
        StatusCode::kPermissionDenied,
        fmt::format("adding a route to {} with an initial window needs CAP_NET_ADMIN in the "
                    "worker's network namespace (run it as root there, or give it the "
                    "capability); 0 leaves the kernel's window of 10 segments",
                    text(a)));
  }
  if (error != 0) {
    return unavailable(fmt::format("adding a route to {}: {}", text(a), std::strerror(-error)));
  }
  return {};
}

}  // namespace

StatusOr<std::vector<InitialWindowRoute>> setInitialWindow(
    const std::vector<std::string>& endpoints, uint32_t segments) {
  if (segments == 0 || segments > kMaxTcpInitialWindow) {
    return invalidArgument(fmt::format("an initial window of {} segments: 1 to {} are allowed",
                                       segments, kMaxTcpInitialWindow));
  }
  auto nlOr = Netlink::open();
  if (!nlOr.ok()) return nlOr.status();
  Netlink nl = std::move(*nlOr);
  std::vector<InitialWindowRoute> done;
  std::set<Address> seen;
  for (const std::string& endpoint : endpoints) {
    auto addressesOr = resolve(endpoint);
    if (!addressesOr.ok() && addressesOr.status().code() == StatusCode::kUnavailable) {
      InitialWindowRoute r;
      r.peer = endpoint;
      r.unresolved = addressesOr.status().message();
      done.push_back(std::move(r));
      continue;
    }
    if (!addressesOr.ok()) return addressesOr.status();
    const std::set<Address> addresses = std::move(*addressesOr);
    for (const Address& a : addresses) {
      if (!seen.insert(a).second) continue;
      auto routeOr = lookup(nl, a);
      if (!routeOr.ok()) return routeOr.status();
      const std::optional<Route> route = std::move(*routeOr);
      // No route (it may come later: the windows are the kernel's then),
      // or this host's own address.
      if (!route || route->head.rtm_type != RTN_UNICAST) continue;
      const RouteWindows now = windowsOf(*route);
      InitialWindowRoute r;
      r.peer = endpoint;
      r.address = text(a);
      r.alreadySet = now.initcwnd == segments && now.initrwnd == segments;
      if (!r.alreadySet) GEO_RETURN_IF_ERROR(addHostRoute(nl, a, *route, segments));
      if (!route->gateway.empty()) {
        Address gw;
        gw.family = route->gateway.size() == 4 ? AF_INET : AF_INET6;
        std::memcpy(gw.bytes.data(), route->gateway.data(),
                    std::min<size_t>(16, route->gateway.size()));
        r.via = text(gw);
      }
      if (route->oif) {
        char name[IF_NAMESIZE] = {};
        if (::if_indextoname(static_cast<unsigned>(*route->oif), name) != nullptr) r.device = name;
      }
      done.push_back(std::move(r));
    }
  }
  return done;
}

StatusOr<RouteWindows> routeWindows(const std::string& address) {
  auto aOr = numeric(address);
  if (!aOr.ok()) return aOr.status();
  const Address a = std::move(*aOr);
  auto nlOr = Netlink::open();
  if (!nlOr.ok()) return nlOr.status();
  Netlink nl = std::move(*nlOr);
  auto routeOr = lookup(nl, a);
  if (!routeOr.ok()) return routeOr.status();
  const std::optional<Route> route = std::move(*routeOr);
  if (!route) return unavailable(fmt::format("no route to {}", address));
  return windowsOf(*route);
}

}  // namespace geo::transport
