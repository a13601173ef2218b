#pragma once
// Topology of a `geotrain local` job: which emulated regions exist, how many
// workers each runs, the round-trip time between every pair of regions and
// the WAN uplink of each worker; and where every rank sits in it.
//
// Presets give the regions (when --regions is not given) and the round-trip
// times:
//   world    london, tokyo, oregon, ohio: london-tokyo 230 ms, london-oregon
//            140, london-ohio 90, tokyo-oregon 100, tokyo-ohio 160,
//            oregon-ohio 50; uplink 100mbit
//   world16  16 AWS regions (virginia, ohio, california, oregon, montreal,
//            saopaulo, ireland, london, paris, frankfurt, stockholm, mumbai,
//            singapore, tokyo, seoul, sydney), round trips from cloudping.co's
//            one-year medians (docs/data/world16-rtt.csv, with its source):
//            11 ms (london-paris) to 327 ms (saopaulo-singapore); uplink
//            100mbit
//   lan      london, tokyo, oregon, ohio; every pair 0 ms, no uplink limit
//            (the "zero latency, unlimited bandwidth" reference of the
//            benchmarks)
// `--rtt a-b=<time>` overrides one pair (either order). Traffic inside a
// region is never shaped.
//
// Ranks are assigned region by region in the order of `regions`:
// rank = regionIndex * workersPerRegion + localIndex; localIndex 0 is the
// region's leader.
//
// Plain values and pure functions: thread-compatible, nothing throws. Errors
// are InvalidArgument Statuses that name the flag (--regions, --rtt,
// --uplink, --preset, --workers-per-region), the value and what is allowed.

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace geo::local {

using Microseconds = std::chrono::microseconds;

// Most workers a `geotrain local` job may run, all regions together (so also
// the most regions): each is a process on this machine with its own port,
// metrics port and connections, and the launcher holds every rank's config
// (which lists every rank). makeTopology checks it before allocating
// anything per worker or per region.
inline constexpr int64_t kMaxLocalWorkers = 256;

enum class Preset { kWorld, kWorld16, kLan };

// "world" | "world16" | "lan".
StatusOr<Preset> parsePreset(std::string_view name);
std::string_view presetName(Preset preset);

// The regions a job of the preset has when --regions is not given.
std::vector<std::string> presetRegions(Preset preset);

// The preset's round-trip time between two regions (either order); nullopt
// when the preset does not know the pair (world and world16 know only their
// own regions; lan knows every pair: 0).
std::optional<Microseconds> presetRtt(Preset preset, std::string_view a, std::string_view b);

// The preset's per-worker uplink as a link profile ("rate=100mbit"), or ""
// for unlimited.
std::string presetUplink(Preset preset);

// Region names are lowercase DNS labels (1-63 characters of a-z, 0-9 and
// '-', starting and ending with a letter or digit), unique, at least one and
// at most kMaxLocalWorkers.
Status validateRegionNames(const std::vector<std::string>& regions);

// Splits "london,tokyo" (surrounding spaces ignored) and validates the names;
// more than kMaxLocalWorkers names are refused before any is copied.
StatusOr<std::vector<std::string>> parseRegionList(std::string_view text);

struct RttOverride {
  size_t regionA = 0;  // indices into the region list, regionA != regionB
  size_t regionB = 0;
  Microseconds rtt{0};
};

// Parses one --rtt value, "<regionA>-<regionB>=<time>" with time in us, ms
// or s ("230ms"). Region names may contain '-': the key is split where both
// halves are regions of `regions`; no such split, or more than one, is an
// error naming the regions.
StatusOr<RttOverride> parseRttOverride(std::string_view text,
                                       const std::vector<std::string>& regions);

// Parses --uplink: a rate such as "100mbit" (units bit, kbit, mbit, gbit per
// second) becomes the link profile "rate=100mbit"; "0" and "none" mean
// unlimited and give "".
StatusOr<std::string> parseUplink(std::string_view text);

// "a-b": the key of transport.links for a pair of regions.
std::string linkKey(std::string_view a, std::string_view b);

struct Topology {
  std::vector<std::string> regions;
  int64_t workersPerRegion = 1;
  // rtt[i][j]: round-trip time between regions i and j; symmetric, zero on
  // the diagonal.
  std::vector<std::vector<Microseconds>> rtt;
  std::string uplink;  // every worker's WAN uplink profile; "" = unlimited
  Preset preset = Preset::kWorld;

  int64_t worldSize() const { return static_cast<int64_t>(regions.size()) * workersPerRegion; }
};

struct TopologyOptions {
  std::optional<std::string> regions;  // --regions; nullopt: the preset's
  int64_t workersPerRegion = 1;        // --workers-per-region, >= 1
  std::string preset = "world";        // --preset
  std::vector<std::string> rtt;        // --rtt values, in order
  std::optional<std::string> uplink;   // --uplink; nullopt: the preset's
  // `geotrain plan --default-rtt`: the round trip of every pair that
  // neither the preset nor --rtt gives (a job of 64 regions planned without
  // 2016 --rtt flags); nullopt: such a pair is an error.
  std::optional<std::string> defaultRtt;
};

// Builds the topology: region list, preset times, --rtt overrides (a pair
// given twice is an error), uplink. --workers-per-region is 1 or more, and
// times the number of regions at most kMaxLocalWorkers. Every pair of distinct regions needs a
// time: one that the preset does not know and no --rtt gives is an error
// naming the pair and the --rtt flag that sets it.
StatusOr<Topology> makeTopology(const TopologyOptions& options);

struct RankPlace {
  int64_t regionIndex = 0;
  int64_t localIndex = 0;
};

int64_t rankOf(const Topology& topology, int64_t regionIndex, int64_t localIndex);
RankPlace placeOf(const Topology& topology, int64_t rank);

}  // namespace geo::local
