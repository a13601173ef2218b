#include "worker/local/network.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <charconv>
#include <cmath>

#include "common/worker_config.h"
#include "worker/local/faults.h"
#include "worker/transport/link.h"

namespace geo::local {

namespace {

StatusOr<double> rateBits(std::string_view flag, const std::string& value) {
  auto profile = parseUplink(value);
  if (!profile.ok()) {
    return invalidArgument(fmt::format(
        "{} {}: not a rate (allowed: a number with unit bit, kbit, mbit or gbit per second, e.g. "
        "100mbit; 0 or none for unlimited)",
        flag, printableText(value)));
  }
  if (profile->empty()) return 0.0;
  auto parsed = transport::parseLinkProfile(*profile);
  return parsed.ok() ? parsed->bytesPerSecond * 8 : 0.0;
}

}  // namespace

StatusOr<NetworkMode> parseNetworkMode(std::string_view text) {
  if (text == "userspace") return NetworkMode::kUserspace;
  if (text == "netns") return NetworkMode::kNetns;
  return invalidArgument(fmt::format(
      "--network {}: not a network (allowed: userspace, the emulation above TCP that needs no "
      "privileges; netns, kernel TCP between network namespaces, as root)",
      printableText(text)));
}

std::string_view networkModeName(NetworkMode mode) {
  return mode == NetworkMode::kNetns ? "netns" : "userspace";
}

StatusOr<double> parseLoss(std::string_view text) {
  std::string_view v = text;
  double scale = 1;
  if (v.ends_with("%")) {
    v.remove_suffix(1);
    scale = 0.01;
  }
  double value = 0;
  const auto [end, error] = std::from_chars(v.data(), v.data() + v.size(), value);
  if (v.empty() || error != std::errc() || end != v.data() + v.size() || !std::isfinite(value) ||
      value * scale < 0 || value * scale >= 1) {
    return invalidArgument(fmt::format(
        "'{}' is not a loss rate (allowed: a percentage from 0% up to, not including, 100%, "
        "e.g. 1% or 0.5%, or a probability such as 0.01)",
        printableText(text)));
  }
  return value * scale;
}

StatusOr<NetworkPlan> makeNetworkPlan(const NetworkOptions& options, const Topology& topology) {
  NetworkPlan plan;
  auto mode = parseNetworkMode(options.mode);
  if (!mode.ok()) return mode.status();
  plan.mode = *mode;
  if (plan.mode == NetworkMode::kUserspace) {
    const char* flag = !options.loss.empty() ? "--loss"
                       : options.jitter      ? "--jitter"
                       : options.downlink    ? "--downlink"
                       : options.queue       ? "--queue"
                                             : nullptr;
    if (flag != nullptr) {
      return invalidArgument(fmt::format(
          "{} needs --network netns: the user-space emulation delays whole messages above TCP, "
          "where packets are neither lost, reordered nor queued",
          flag));
    }
    return plan;
  }

  const size_t n = topology.regions.size();
  wan::WanShape& shape = plan.shape;
  shape.sites = topology.regions;
  shape.oneWay.assign(n, std::vector<wan::Microseconds>(n, wan::Microseconds(0)));
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = 0; j < n; ++j) {
      if (i != j) shape.oneWay[i][j] = topology.rtt[i][j] / 2;
    }
  }
  shape.site.assign(n, wan::SiteShape{});
  double uplink = 0;
  if (!topology.uplink.empty()) {
    auto parsed = transport::parseLinkProfile(topology.uplink);
    if (!parsed.ok()) return parsed.status().withContext("--uplink");
    uplink = parsed->bytesPerSecond * 8;
  }
  double downlink = 0;
  if (options.downlink) {
    auto bits = rateBits("--downlink", *options.downlink);
    if (!bits.ok()) return bits.status();
    downlink = *bits;
  }
  double queue = kDefaultQueueSeconds;
  if (options.queue) {
    auto seconds = parseSeconds(*options.queue);
    if (!seconds.ok())
      return invalidArgument(fmt::format("--queue: {}", seconds.status().message()));
    if (*seconds < 1e-3 || *seconds > 60) {
      return invalidArgument(fmt::format(
          "--queue {}: allowed from 1ms to 60s (how long a packet may wait for a region's "
          "uplink or downlink before it is dropped)",
          *options.queue));
    }
    queue = *seconds;
  }
  for (wan::SiteShape& s : shape.site) {
    s.egressBitsPerSecond = uplink;
    s.ingressBitsPerSecond = downlink;
    s.queue = wan::Microseconds(std::llround(queue * 1e6));
  }
  if (options.jitter) {
    auto seconds = parseSeconds(*options.jitter);
    if (!seconds.ok()) {
      return invalidArgument(fmt::format("--jitter: {}", seconds.status().message()));
    }
    if (*seconds > 10)
      return invalidArgument(fmt::format("--jitter {}: at most 10s", *options.jitter));
    shape.jitter = wan::Microseconds(std::llround(*seconds * 1e6));
  }
  std::vector<bool> lossSet(n, false);
  for (const std::string& l : options.loss) {
    const size_t eq = l.find('=');
    const std::string value = eq == std::string::npos ? l : l.substr(eq + 1);
    auto p = parseLoss(value);
    if (!p.ok()) return invalidArgument(fmt::format("--loss {}: {}", l, p.status().message()));
    if (eq == std::string::npos) {
      for (size_t i = 0; i < n; ++i) {
        if (!lossSet[i]) shape.site[i].loss = *p;
      }
      continue;
    }
    const std::string region = l.substr(0, eq);
    size_t i = 0;
    while (i < n && topology.regions[i] != region) ++i;
    if (i == n) {
      return invalidArgument(fmt::format("--loss {}: {} is not a region of --regions ({})", l,
                                         printableText(region), fmt::join(topology.regions, ", ")));
    }
    shape.site[i].loss = *p;
    lossSet[i] = true;
  }
  GEO_RETURN_IF_ERROR(wan::validateShape(shape));
  return plan;
}

}  // namespace geo::local
