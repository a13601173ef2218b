#pragma once
// A worker's connections to its peers, made before anything else of the run:
// geotrain-worker opens them before it loads its training library (LibTorch
// and what it depends on take 0.45 s of CPU to load, 0.87-0.91 s when four
// workers start at once on two cores), so that the handshakes
// with far peers -- TCP's, ZeroMQ's greeting and CURVE's, five round trips,
// 1.2 s over 230 ms -- run while it loads. No LibTorch.

#include <memory>

#include "common/status.h"
#include "common/worker_config.h"
#include "worker/app/key_watcher.h"
#include "worker/app/worker_output.h"
#include "worker/transport/transport.h"

namespace geo::app {

// What runWorker trains over. Both null for a worker that exchanges with
// nobody (sync.algorithm none, or a job of one worker).
struct Connection {
  std::unique_ptr<transport::Transport> transport;
  // Re-reads the CURVE key files (docs/security.md); stops before the
  // transport goes (members are destroyed in reverse order).
  std::unique_ptr<KeyWatcher> keyWatcher;
};

// Whether `config`'s worker has peers to connect to.
bool needsConnection(const WorkerConfig& config);

// Sets the initial TCP windows toward the WAN peers (before the first
// connection: they apply to those opened after), starts the ZeroMQ
// transport (it binds, then connects to every peer in the background), the
// fault signals' watcher (prepareFaultSignals must have run) and the key
// watcher. A peer whose sync settings differ ends the process through
// refuseDisagreeingPeer(progress). `progress` must outlive the transport.
// Errors name the setting or endpoint (a bad key file, a port in use).
StatusOr<Connection> connectToPeers(const WorkerConfig& config, const Progress& progress);

}  // namespace geo::app
