#include "worker/app/tcp_limits.h"

#include <fmt/format.h>

#include <cmath>
#include <fstream>
#include <sstream>

namespace geo::app {

namespace {

// The third of the three numbers in a tcp_rmem / tcp_wmem file.
StatusOr<int64_t> readMax(const std::string& path) {
  std::ifstream in(path);
  if (!in) return unavailable(fmt::format("{}: cannot be read", path));
  std::string line;
  std::getline(in, line);
  std::istringstream fields(line);
  int64_t min = 0, initial = 0, max = 0;
  if (!(fields >> min >> initial >> max) || max <= 0) {
    return invalidArgument(
        fmt::format("{}: \"{}\" is not three byte counts (minimum, initial, maximum)", path, line));
  }
  return max;
}

std::string mebibytes(int64_t bytes) {
  return fmt::format("{:.3g} MiB", static_cast<double>(bytes) / (1 << 20));
}

// "110-146 Mbit/s", "1.0-1.34 Gbit/s": a range in the unit of its top.
std::string rates(double low, double high) {
  if (high >= 1e9) return fmt::format("{:.3g}-{:.3g} Gbit/s", low / 1e9, high / 1e9);
  return fmt::format("{:.3g}-{:.3g} Mbit/s", low / 1e6, high / 1e6);
}

}  // namespace

StatusOr<TcpBufferLimits> readTcpBufferLimits(const std::string& procSys) {
  auto receive = readMax(procSys + "/net/ipv4/tcp_rmem");
  if (!receive.ok()) return receive.status();
  auto send = readMax(procSys + "/net/ipv4/tcp_wmem");
  if (!send.ok()) return send.status();
  return TcpBufferLimits{*receive, *send};
}

double windowCeilingBitsPerSecond(int64_t receiveMaxBytes, double rttSeconds, double windowShare) {
  return static_cast<double>(receiveMaxBytes) * windowShare * 8 / rttSeconds;
}

std::string describeWindowCeiling(const TcpBufferLimits& limits, const std::string& peer,
                                  double rttSeconds) {
  // Twice a 1 Gbit/s link's bandwidth-delay product at this round trip, in
  // whole MiB: what a receive buffer needs for one connection to fill it.
  const double gigabitBuffer = std::ceil(2 * 1e9 / 8 * rttSeconds / (1 << 20));
  return fmt::format(
      "tcp: one connection over the longest round trip measured ({:.0f} ms, to {}) carries at "
      "most {}: TCP receive buffers here may grow to {} (net.ipv4.tcp_rmem), a half to two "
      "thirds of it window, and send buffers to {} (net.ipv4.tcp_wmem); a peer's own limits "
      "bound what it sends here. A 1 Gbit/s link at this round trip needs both maximums at "
      "{:.0f} MiB or more on every worker (docs/kubernetes.md: spec.template.spec.sysctls)",
      rttSeconds * 1e3, peer,
      rates(windowCeilingBitsPerSecond(limits.receiveMaxBytes, rttSeconds, 0.5),
            windowCeilingBitsPerSecond(limits.receiveMaxBytes, rttSeconds, 2.0 / 3)),
      mebibytes(limits.receiveMaxBytes), mebibytes(limits.sendMaxBytes), gigabitBuffer);
}

}  // namespace geo::app
