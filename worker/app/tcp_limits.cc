#include "worker/app/tcp_limits.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <optional>
#include <sstream>

namespace geo::app {

namespace {

struct Fields {
  int64_t initial = 0, max = 0;
};

// The second and third of the three numbers in a tcp_rmem / tcp_wmem file.
StatusOr<Fields> readFields(const std::string& path) {
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
  return Fields{initial, max};
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
  auto receive = readFields(procSys + "/net/ipv4/tcp_rmem");
  if (!receive.ok()) return receive.status();
  auto send = readFields(procSys + "/net/ipv4/tcp_wmem");
  if (!send.ok()) return send.status();
  return TcpBufferLimits{receive->max, send->max, receive->initial};
}

double windowCeilingBitsPerSecond(int64_t receiveMaxBytes, double rttSeconds, double windowShare) {
  return static_cast<double>(receiveMaxBytes) * windowShare * 8 / rttSeconds;
}

std::string describeWindowCeiling(const TcpBufferLimits& limits, const std::string& peer,
                                  double rttSeconds, int64_t connections) {
  // Twice a 1 Gbit/s link's bandwidth-delay product at this round trip, in
  // whole MiB: what a receive buffer needs for one connection to fill it.
  const double gigabitBuffer = std::ceil(2 * 1e9 / 8 * rttSeconds / (1 << 20));
  const double low = windowCeilingBitsPerSecond(limits.receiveMaxBytes, rttSeconds, 0.5);
  const double high = windowCeilingBitsPerSecond(limits.receiveMaxBytes, rttSeconds, 2.0 / 3);
  connections = std::max<int64_t>(1, connections);
  // The connections that carry 1 Gbit/s under these limits, by the two
  // window shares (geo_fat_pipe_bench: 8 at 6 MiB and 230 ms, 96%).
  const auto gigabitConnections = [](double perConnection) {
    return perConnection > 0 ? static_cast<int64_t>(std::ceil(1e9 / perConnection)) : 0;
  };
  return fmt::format(
      "tcp: one connection over the longest round trip measured ({:.0f} ms, to {}) carries at "
      "most {}{}: TCP receive buffers here may grow to {} (net.ipv4.tcp_rmem), a half to two "
      "thirds of it window, and send buffers to {} (net.ipv4.tcp_wmem); a peer's own limits "
      "bound what it sends here. A 1 Gbit/s link at this round trip needs both maximums at "
      "{:.0f} MiB or more on every worker (docs/kubernetes.md: spec.template.spec.sysctls), or "
      "{} data connections per peer under these limits (transport.connections)",
      rttSeconds * 1e3, peer, rates(low, high),
      connections > 1 ? fmt::format(", its {} data connections (transport.connections) {}",
                                    connections, rates(low * connections, high * connections))
                      : std::string(),
      mebibytes(limits.receiveMaxBytes), mebibytes(limits.sendMaxBytes), gigabitBuffer,
      gigabitConnections(high) == gigabitConnections(low)
          ? std::to_string(gigabitConnections(low))
          : fmt::format("{}-{}", gigabitConnections(high), gigabitConnections(low)));
}

std::optional<std::string> initialWindowWarning(const TcpBufferLimits& limits, int64_t segments) {
  const int64_t window = segments * kSegmentBytes;
  // Half the buffer is window at the least (windowCeilingBitsPerSecond).
  if (segments <= 0 || limits.receiveInitialBytes / 2 >= window) return std::nullopt;
  const int64_t needed = int64_t{1} << static_cast<int>(std::ceil(std::log2(2.0 * window)));
  return fmt::format(
      "tcp: transport.tcpInitialWindow = {} segments ({} KB), but a receive buffer starts at {} "
      "KiB here (net.ipv4.tcp_rmem, second field): a connection to this worker advertises about "
      "{} KB at first, and the peers' first round trips wait for it. Set the second field to at "
      "least {} KiB on every worker (docs/kubernetes.md: spec.template.spec.sysctls)",
      segments, window / 1000, limits.receiveInitialBytes / 1024,
      limits.receiveInitialBytes / 2 / 1000, needed / 1024);
}

}  // namespace geo::app
