#include "worker/local/topology.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <set>
#include <utility>

#include "common/enforce.h"
#include "common/names.h"
#include "common/worker_config.h"
#include "worker/transport/link.h"

namespace geo::local {

namespace {

struct PresetPair {
  std::string_view a;
  std::string_view b;
  int64_t rttMs;
};

constexpr std::array<PresetPair, 6> kWorldRtt = {{
    {"london", "tokyo", 230},
    {"london", "oregon", 140},
    {"london", "ohio", 90},
    {"tokyo", "oregon", 100},
    {"tokyo", "ohio", 160},
    {"oregon", "ohio", 50},
}};

// world16: 16 AWS regions, round trips from cloudping.co's one-year medians
// (docs/data/world16-rtt.csv: the same table, with its source; a test
// checks that the two agree).
constexpr std::array<std::string_view, 16> kWorld16Regions = {
    "virginia", "ohio",      "california", "oregon", "montreal",  "saopaulo", "ireland", "london",
    "paris",    "frankfurt", "stockholm",  "mumbai", "singapore", "tokyo",    "seoul",   "sydney"};
constexpr std::array<PresetPair, 120> kWorld16Rtt = {
    {{"virginia", "ohio", 15},         {"virginia", "california", 64},
     {"virginia", "oregon", 64},       {"virginia", "montreal", 16},
     {"virginia", "saopaulo", 115},    {"virginia", "ireland", 70},
     {"virginia", "london", 78},       {"virginia", "paris", 84},
     {"virginia", "frankfurt", 93},    {"virginia", "stockholm", 112},
     {"virginia", "mumbai", 191},      {"virginia", "singapore", 219},
     {"virginia", "tokyo", 149},       {"virginia", "seoul", 179},
     {"virginia", "sydney", 200},      {"ohio", "california", 53},
     {"ohio", "oregon", 51},           {"ohio", "montreal", 27},
     {"ohio", "saopaulo", 125},        {"ohio", "ireland", 80},
     {"ohio", "london", 88},           {"ohio", "paris", 95},
     {"ohio", "frankfurt", 104},       {"ohio", "stockholm", 123},
     {"ohio", "mumbai", 202},          {"ohio", "singapore", 203},
     {"ohio", "tokyo", 135},           {"ohio", "seoul", 165},
     {"ohio", "sydney", 188},          {"california", "oregon", 22},
     {"california", "montreal", 80},   {"california", "saopaulo", 175},
     {"california", "ireland", 130},   {"california", "london", 148},
     {"california", "paris", 144},     {"california", "frankfurt", 153},
     {"california", "stockholm", 173}, {"california", "mumbai", 231},
     {"california", "singapore", 170}, {"california", "tokyo", 108},
     {"california", "seoul", 133},     {"california", "sydney", 139},
     {"oregon", "montreal", 61},       {"oregon", "saopaulo", 175},
     {"oregon", "ireland", 118},       {"oregon", "london", 129},
     {"oregon", "paris", 135},         {"oregon", "frankfurt", 142},
     {"oregon", "stockholm", 155},     {"oregon", "mumbai", 222},
     {"oregon", "singapore", 161},     {"oregon", "tokyo", 98},
     {"oregon", "seoul", 123},         {"oregon", "sydney", 141},
     {"montreal", "saopaulo", 126},    {"montreal", "ireland", 69},
     {"montreal", "london", 79},       {"montreal", "paris", 86},
     {"montreal", "frankfurt", 93},    {"montreal", "stockholm", 106},
     {"montreal", "mumbai", 192},      {"montreal", "singapore", 215},
     {"montreal", "tokyo", 145},       {"montreal", "seoul", 175},
     {"montreal", "sydney", 198},      {"saopaulo", "ireland", 178},
     {"saopaulo", "london", 187},      {"saopaulo", "paris", 196},
     {"saopaulo", "frankfurt", 204},   {"saopaulo", "stockholm", 223},
     {"saopaulo", "mumbai", 301},      {"saopaulo", "singapore", 327},
     {"saopaulo", "tokyo", 258},       {"saopaulo", "seoul", 288},
     {"saopaulo", "sydney", 312},      {"ireland", "london", 14},
     {"ireland", "paris", 20},         {"ireland", "frankfurt", 27},
     {"ireland", "stockholm", 41},     {"ireland", "mumbai", 126},
     {"ireland", "singapore", 182},    {"ireland", "tokyo", 201},
     {"ireland", "seoul", 232},        {"ireland", "sydney", 256},
     {"london", "paris", 11},          {"london", "frankfurt", 18},
     {"london", "stockholm", 32},      {"london", "mumbai", 117},
     {"london", "singapore", 172},     {"london", "tokyo", 212},
     {"london", "seoul", 242},         {"london", "sydney", 266},
     {"paris", "frankfurt", 12},       {"paris", "stockholm", 32},
     {"paris", "mumbai", 109},         {"paris", "singapore", 167},
     {"paris", "tokyo", 218},          {"paris", "seoul", 249},
     {"paris", "sydney", 280},         {"frankfurt", "stockholm", 23},
     {"frankfurt", "mumbai", 129},     {"frankfurt", "singapore", 161},
     {"frankfurt", "tokyo", 227},      {"frankfurt", "seoul", 231},
     {"frankfurt", "sydney", 252},     {"stockholm", "mumbai", 148},
     {"stockholm", "singapore", 181},  {"stockholm", "tokyo", 247},
     {"stockholm", "seoul", 250},      {"stockholm", "sydney", 272},
     {"mumbai", "singapore", 64},      {"mumbai", "tokyo", 134},
     {"mumbai", "seoul", 134},         {"mumbai", "sydney", 154},
     {"singapore", "tokyo", 71},       {"singapore", "seoul", 74},
     {"singapore", "sydney", 95},      {"tokyo", "seoul", 36},
     {"tokyo", "sydney", 107},         {"seoul", "sydney", 145}}};

std::string_view trim(std::string_view s) {
  while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
  while (!s.empty() && s.back() == ' ') s.remove_suffix(1);
  return s;
}

// "230ms" -> microseconds, through the link-profile unit parser so every
// duration on the command line reads the same.
std::optional<Microseconds> parseDuration(std::string_view text) {
  if (text.empty()) return std::nullopt;
  auto profile = transport::parseLinkProfile(fmt::format("delay={}", text));
  if (!profile.ok()) return std::nullopt;
  return profile->oneWayDelay;
}

}  // namespace

StatusOr<Preset> parsePreset(std::string_view name) {
  if (name == "world") return Preset::kWorld;
  if (name == "world16") return Preset::kWorld16;
  if (name == "lan") return Preset::kLan;
  return invalidArgument(fmt::format("--preset {}: unknown preset (allowed: world, world16, lan)",
                                     printableText(name)));
}

std::string_view presetName(Preset preset) {
  switch (preset) {
    case Preset::kWorld: return "world";
    case Preset::kWorld16: return "world16";
    case Preset::kLan: return "lan";
  }
  return "lan";
}

std::vector<std::string> presetRegions(Preset preset) {
  if (preset == Preset::kWorld16) return {kWorld16Regions.begin(), kWorld16Regions.end()};
  return {"london", "tokyo", "oregon", "ohio"};
}

std::optional<Microseconds> presetRtt(Preset preset, std::string_view a, std::string_view b) {
  if (preset == Preset::kLan) return Microseconds(0);
  const auto find = [&](const auto& table) -> std::optional<Microseconds> {
    for (const PresetPair& p : table) {
      if ((p.a == a && p.b == b) || (p.a == b && p.b == a)) {
        return std::chrono::duration_cast<Microseconds>(std::chrono::milliseconds(p.rttMs));
      }
    }
    return std::nullopt;
  };
  return preset == Preset::kWorld16 ? find(kWorld16Rtt) : find(kWorldRtt);
}

std::string presetUplink(Preset preset) {
  return preset == Preset::kLan ? "" : "rate=100mbit";
}

std::string tooManyRegions(size_t count) {
  return fmt::format(
      "--regions: {} regions is not allowed (allowed: 1 to {}, as geotrain local runs at most {} "
      "workers)",
      count, kMaxLocalWorkers, kMaxLocalWorkers);
}

Status validateRegionNames(const std::vector<std::string>& regions) {
  if (regions.empty()) {
    return invalidArgument(
        "--regions: no region given (allowed: a comma-separated list such as "
        "london,tokyo)");
  }
  if (regions.size() > static_cast<size_t>(kMaxLocalWorkers)) {
    return invalidArgument(tooManyRegions(regions.size()));
  }
  std::set<std::string_view> seen;
  for (const std::string& region : regions) {
    if (!isDnsLabel(region)) {
      return invalidArgument(fmt::format("--regions: '{}' is not a valid region name (allowed: {})",
                                         printableText(region), kDnsLabelRule));
    }
    if (!seen.insert(region).second) {
      return invalidArgument(
          fmt::format("--regions: '{}' is listed twice (region names must be unique)", region));
    }
  }
  return {};
}

StatusOr<std::vector<std::string>> parseRegionList(std::string_view text) {
  const size_t count = static_cast<size_t>(std::count(text.begin(), text.end(), ',')) + 1;
  if (count > static_cast<size_t>(kMaxLocalWorkers)) return invalidArgument(tooManyRegions(count));
  std::vector<std::string> regions;
  if (!trim(text).empty()) {
    while (true) {
      const size_t comma = text.find(',');
      regions.emplace_back(trim(text.substr(0, comma)));
      if (comma == std::string_view::npos) break;
      text.remove_prefix(comma + 1);
    }
  }
  GEO_RETURN_IF_ERROR(validateRegionNames(regions));
  return regions;
}

StatusOr<RttOverride> parseRttOverride(std::string_view text,
                                       const std::vector<std::string>& regions) {
  // Messages quote the flag's value only as printable text.
  const std::string shownText = printableText(text);
  const size_t eq = text.find('=');
  if (eq == std::string_view::npos) {
    return invalidArgument(fmt::format(
        "--rtt {}: expected <regionA>-<regionB>=<round-trip time>, e.g. london-tokyo=230ms",
        shownText));
  }
  const std::string_view pair = text.substr(0, eq);
  const std::string_view value = text.substr(eq + 1);

  auto indexOf = [&](std::string_view name) -> std::optional<size_t> {
    const auto it = std::find(regions.begin(), regions.end(), name);
    if (it == regions.end()) return std::nullopt;
    return static_cast<size_t>(it - regions.begin());
  };
  std::vector<std::pair<size_t, size_t>> splits;
  for (size_t dash = pair.find('-'); dash != std::string_view::npos;
       dash = pair.find('-', dash + 1)) {
    const auto a = indexOf(pair.substr(0, dash));
    const auto b = indexOf(pair.substr(dash + 1));
    if (a && b) splits.emplace_back(*a, *b);
  }
  if (splits.empty()) {
    return invalidArgument(
        fmt::format("--rtt {}: '{}' is not <regionA>-<regionB> with both regions from --regions "
                    "(allowed regions: {})",
                    shownText, printableText(pair), fmt::join(regions, ", ")));
  }
  if (splits.size() > 1) {
    return invalidArgument(fmt::format(
        "--rtt {}: '{}' can be read as more than one pair of regions; rename the regions",
        shownText, printableText(pair)));
  }
  const auto [a, b] = splits.front();
  if (a == b) {
    return invalidArgument(fmt::format(
        "--rtt {}: a region's round trip to itself cannot be set (traffic inside a region is "
        "not shaped); give a pair of two different regions",
        shownText));
  }
  const auto rtt = parseDuration(value);
  if (!rtt) {
    return invalidArgument(fmt::format(
        "--rtt {}: round-trip time '{}' is not valid (allowed: a number >= 0 with unit us, ms or "
        "s, e.g. 230ms)",
        shownText, printableText(value)));
  }
  return RttOverride{a, b, *rtt};
}

StatusOr<std::string> parseUplink(std::string_view text) {
  const std::string_view value = trim(text);
  if (value == "0" || value == "none") return std::string();
  const std::string profile = fmt::format("rate={}", value);
  auto parsed = transport::parseLinkProfile(profile);
  if (value.empty() || !parsed.ok()) {
    return invalidArgument(fmt::format(
        "--uplink {}: not a rate (allowed: a number with unit bit, kbit, mbit or gbit per second, "
        "e.g. 100mbit; 0 or none for unlimited)",
        printableText(text)));
  }
  if (parsed->bytesPerSecond <= 0) return std::string();
  return profile;
}

std::string linkKey(std::string_view a, std::string_view b) {
  return fmt::format("{}-{}", a, b);
}

StatusOr<Topology> makeTopology(const TopologyOptions& options) {
  Topology topology;
  auto preset = parsePreset(options.preset);
  if (!preset.ok()) return preset.status();
  topology.preset = *preset;
  if (options.regions) {
    auto regions = parseRegionList(*options.regions);
    if (!regions.ok()) return regions.status();
    topology.regions = std::move(*regions);
  } else {
    topology.regions = presetRegions(topology.preset);
  }
  if (options.workersPerRegion < 1) {
    return invalidArgument(
        fmt::format("--workers-per-region {}: must be at least 1", options.workersPerRegion));
  }
  // Checked before anything is sized by it (the rank configs list every
  // rank: their size grows with the square of the workers).
  const int64_t regionCount = static_cast<int64_t>(topology.regions.size());
  if (options.workersPerRegion > kMaxLocalWorkers / regionCount) {
    return invalidArgument(fmt::format(
        "--workers-per-region {}: {} regions x {} workers is not allowed (allowed: at most {} "
        "workers in all, each a process on this machine: 1..{} per region with {} regions)",
        options.workersPerRegion, regionCount, options.workersPerRegion, kMaxLocalWorkers,
        kMaxLocalWorkers / regionCount, regionCount));
  }
  topology.workersPerRegion = options.workersPerRegion;

  const size_t n = topology.regions.size();
  std::vector<std::vector<std::optional<Microseconds>>> given(
      n, std::vector<std::optional<Microseconds>>(n));
  for (const std::string& text : options.rtt) {
    auto override = parseRttOverride(text, topology.regions);
    if (!override.ok()) return override.status();
    auto& slot = given[override->regionA][override->regionB];
    if (slot) {
      return invalidArgument(fmt::format(
          "--rtt {}: the pair {} is given more than once (give each pair once)",
          printableText(text),
          linkKey(topology.regions[override->regionA], topology.regions[override->regionB])));
    }
    slot = override->rtt;
    given[override->regionB][override->regionA] = override->rtt;
  }

  std::optional<Microseconds> fallback;
  if (options.defaultRtt) {
    fallback = parseDuration(*options.defaultRtt);
    if (!fallback) {
      return invalidArgument(fmt::format(
          "--default-rtt {}: not a round-trip time (allowed: a number >= 0 with unit us, ms or s, "
          "e.g. 150ms)",
          printableText(*options.defaultRtt)));
    }
  }
  topology.rtt.assign(n, std::vector<Microseconds>(n, Microseconds(0)));
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = i + 1; j < n; ++j) {
      const std::string& a = topology.regions[i];
      const std::string& b = topology.regions[j];
      std::optional<Microseconds> rtt = given[i][j];
      if (!rtt) rtt = presetRtt(topology.preset, a, b);
      if (!rtt) rtt = fallback;
      if (!rtt) {
        return invalidArgument(fmt::format(
            "no round-trip time for the region pair {}: preset {} knows only {}; set it with "
            "--rtt {}=<time> (e.g. --rtt {}=120ms)",
            linkKey(a, b), presetName(topology.preset),
            fmt::join(presetRegions(topology.preset), ", "), linkKey(a, b), linkKey(a, b)));
      }
      topology.rtt[i][j] = topology.rtt[j][i] = *rtt;
    }
  }

  if (options.uplink) {
    auto uplink = parseUplink(*options.uplink);
    if (!uplink.ok()) return uplink.status();
    topology.uplink = std::move(*uplink);
  } else {
    topology.uplink = presetUplink(topology.preset);
  }
  return topology;
}

int64_t rankOf(const Topology& topology, int64_t regionIndex, int64_t localIndex) {
  GEO_ENFORCE(regionIndex >= 0 && regionIndex < static_cast<int64_t>(topology.regions.size()),
              "region index {} out of range", regionIndex);
  GEO_ENFORCE(localIndex >= 0 && localIndex < topology.workersPerRegion,
              "local index {} out of range", localIndex);
  return regionIndex * topology.workersPerRegion + localIndex;
}

RankPlace placeOf(const Topology& topology, int64_t rank) {
  GEO_ENFORCE(rank >= 0 && rank < topology.worldSize(), "rank {} out of range", rank);
  return {rank / topology.workersPerRegion, rank % topology.workersPerRegion};
}

}  // namespace geo::local
