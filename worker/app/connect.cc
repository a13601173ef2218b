#include "worker/app/connect.h"

#include <utility>

#include "common/logging.h"
#include "worker/app/fault_signals.h"
#include "worker/app/transport_setup.h"
#include "worker/transport/zmq_transport.h"

namespace geo::app {

bool needsConnection(const WorkerConfig& c) {
  return c.sync.algorithm != "none" && c.worker.worldSize > 1;
}

StatusOr<Connection> connectToPeers(const WorkerConfig& c, const Progress& progress) {
  Connection connection;
  if (!needsConnection(c)) return connection;
  const auto rank = static_cast<uint32_t>(c.worker.rank);
  auto config = transportConfig(c, rank);
  if (!config.ok()) return config.status();
  config->onDisagreement = [&progress](const Status& s) { refuseDisagreeingPeer(progress, s); };
  size_t peers = 0;
  for (size_t r = 0; r < config->endpoints.size(); ++r) {
    if (r != rank && !config->endpoints[r].empty()) ++peers;
  }
  GEO_RETURN_IF_ERROR(applyTcpInitialWindow(c));
  auto t = transport::makeZmqTransport(std::move(*config));
  if (!t.ok()) return t.status();
  connection.transport = std::move(*t);
  watchFaultSignals(connection.transport.get());
  connection.keyWatcher = std::make_unique<KeyWatcher>(c, rank, connection.transport.get());
  logger()->info("transport: rank {} of {} connecting to {} peer{}", rank, c.worker.worldSize,
                 peers, peers == 1 ? "" : "s");
  return connection;
}

}  // namespace geo::app
