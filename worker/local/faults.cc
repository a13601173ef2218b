#include "worker/local/faults.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>

#include "worker/transport/link.h"

namespace geo::local {

namespace {

// The index of `region` in the topology, or an error naming the flag.
StatusOr<int64_t> regionIndex(const Topology& t, const std::string& region, const char* flag,
                              const std::string& value) {
  const auto it = std::find(t.regions.begin(), t.regions.end(), region);
  if (it == t.regions.end()) {
    return invalidArgument(fmt::format("{} {}: '{}' is not a region of this job (regions: {})",
                                       flag, value, region, fmt::join(t.regions, ", ")));
  }
  return static_cast<int64_t>(it - t.regions.begin());
}

StatusOr<double> parseNumber(std::string_view text) {
  double v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || !std::isfinite(v) || v < 0) {
    return invalidArgument("not a non-negative number");
  }
  return v;
}

}  // namespace

bool FaultPlan::anySlow() const {
  return std::any_of(slowdown.begin(), slowdown.end(), [](double f) { return f > 1; });
}

StatusOr<double> parseSeconds(const std::string& text) {
  std::string_view v = text;
  double scale = 1;
  if (v.ends_with("ms")) {
    scale = 1e-3;
    v.remove_suffix(2);
  } else if (v.ends_with("s")) {
    v.remove_suffix(1);
  } else {
    return invalidArgument(fmt::format("'{}' needs a unit: s or ms (e.g. 20s, 1500ms)", text));
  }
  auto n = parseNumber(v);
  if (!n.ok())
    return invalidArgument(fmt::format("'{}' is not a duration (e.g. 20s, 1500ms)", text));
  return *n * scale;
}

StatusOr<FaultPlan> makeFaultPlan(const FaultOptions& o, const Topology& t) {
  FaultPlan plan;
  plan.slowdown.assign(static_cast<size_t>(t.worldSize()), 1.0);
  for (const std::string& k : o.kill) {
    const auto at = k.rfind('@');
    if (at == std::string::npos) {
      return invalidArgument(
          fmt::format("--kill {}: expected REGION[:INDEX]@TIME, e.g. tokyo@20s or tokyo:1@20s", k));
    }
    std::string who = k.substr(0, at);
    int64_t index = 0;
    if (const auto colon = who.find(':'); colon != std::string::npos) {
      const std::string idx = who.substr(colon + 1);
      const auto [end, ec] = std::from_chars(idx.data(), idx.data() + idx.size(), index);
      if (ec != std::errc() || end != idx.data() + idx.size() || index < 0 ||
          index >= t.workersPerRegion) {
        return invalidArgument(fmt::format(
            "--kill {}: worker index '{}' is not allowed (allowed: 0..{}, --workers-per-region {})",
            k, idx, t.workersPerRegion - 1, t.workersPerRegion));
      }
      who.resize(colon);
    }
    auto region = regionIndex(t, who, "--kill", k);
    if (!region.ok()) return region.status();
    auto seconds = parseSeconds(k.substr(at + 1));
    if (!seconds.ok())
      return invalidArgument(fmt::format("--kill {}: {}", k, seconds.status().message()));
    plan.kills.push_back({rankOf(t, *region, index), fmt::format("{}:{}", who, index), *seconds});
  }
  if (o.restartAfter) {
    auto seconds = parseSeconds(*o.restartAfter);
    if (!seconds.ok()) {
      return invalidArgument(fmt::format("--restart-after: {}", seconds.status().message()));
    }
    if (o.kill.empty()) return invalidArgument("--restart-after: needs a --kill to restart");
    plan.restartAfterSeconds = *seconds;
  }
  for (const std::string& p : o.partition) {
    const auto at = p.find('@');
    const auto plus = p.find('+', at == std::string::npos ? 0 : at);
    if (at == std::string::npos || plus == std::string::npos) {
      return invalidArgument(
          fmt::format("--partition {}: expected REGION@TIME+DURATION or "
                      "REGION/OTHER@TIME+DURATION, e.g. tokyo@20s+30s or tokyo/sydney@20s+30s",
                      p));
    }
    const std::string regions = p.substr(0, at);
    const auto slash = regions.find('/');
    auto region = regionIndex(t, regions.substr(0, slash), "--partition", p);
    if (!region.ok()) return region.status();
    std::optional<int64_t> other;
    if (slash != std::string::npos) {
      auto o2 = regionIndex(t, regions.substr(slash + 1), "--partition", p);
      if (!o2.ok()) return o2.status();
      if (*o2 == *region) {
        return invalidArgument(fmt::format(
            "--partition {}: REGION/OTHER names the link between two different regions", p));
      }
      other = *o2;
    }
    auto start = parseSeconds(p.substr(at + 1, plus - at - 1));
    auto length = parseSeconds(p.substr(plus + 1));
    if (!start.ok() || !length.ok()) {
      return invalidArgument(
          fmt::format("--partition {}: {}", p, (!start.ok() ? start : length).status().message()));
    }
    if (t.regions.size() < 2) {
      return invalidArgument(
          fmt::format("--partition {}: a job of one region has no WAN to cut", p));
    }
    plan.partitions.push_back({*region, other, *start, *length});
  }
  for (const std::string& s : o.throttle) {
    const auto at = s.find('@');
    const auto eq = s.find('=', at == std::string::npos ? 0 : at);
    if (at == std::string::npos || eq == std::string::npos) {
      return invalidArgument(
          fmt::format("--throttle {}: expected REGION@TIME=RATE, e.g. tokyo@20s=5mbit", s));
    }
    auto region = regionIndex(t, s.substr(0, at), "--throttle", s);
    if (!region.ok()) return region.status();
    auto start = parseSeconds(s.substr(at + 1, eq - at - 1));
    if (!start.ok()) {
      return invalidArgument(fmt::format("--throttle {}: {}", s, start.status().message()));
    }
    const std::string rate = s.substr(eq + 1);
    auto profile = parseUplink(rate);
    if (!profile.ok()) {
      return invalidArgument(fmt::format(
          "--throttle {}: {} is not a rate (allowed: a number with unit bit, kbit, mbit or gbit "
          "per second, e.g. 5mbit; 0 or none for unlimited)",
          s, rate));
    }
    int64_t kbit = 0;
    if (!profile->empty()) {
      const double bytes = transport::parseLinkProfile(*profile)->bytesPerSecond;
      kbit = static_cast<int64_t>(std::llround(bytes * 8 / 1000));
      if (kbit < 1 || kbit > std::numeric_limits<int>::max()) {
        return invalidArgument(fmt::format(
            "--throttle {}: {} is out of range (allowed: 1kbit to 2000gbit, or 0 for unlimited)", s,
            rate));
      }
    }
    if (t.regions.size() < 2) {
      return invalidArgument(
          fmt::format("--throttle {}: a job of one region has no WAN uplink to throttle", s));
    }
    plan.throttles.push_back({*region, *start, kbit, rate});
  }
  for (const std::string& s : o.slow) {
    const auto eq = s.find('=');
    if (eq == std::string::npos || !s.ends_with("x")) {
      return invalidArgument(fmt::format("--slow {}: expected REGION=FACTORx, e.g. oregon=3x", s));
    }
    auto region = regionIndex(t, s.substr(0, eq), "--slow", s);
    if (!region.ok()) return region.status();
    auto factor = parseNumber(std::string_view(s).substr(eq + 1, s.size() - eq - 2));
    if (!factor.ok() || *factor < 1 || *factor > 100) {
      return invalidArgument(
          fmt::format("--slow {}: the factor must be a number from 1 to 100, then x", s));
    }
    for (int64_t i = 0; i < t.workersPerRegion; ++i) {
      plan.slowdown[static_cast<size_t>(rankOf(t, *region, i))] = *factor;
    }
  }
  return plan;
}

}  // namespace geo::local
