#pragma once
// One training worker's run, from a checked configuration and its open
// connections (connect.h) to its exit code: sets up the device, builds the
// synchronizer, loads the shard and the model, resumes from a checkpoint,
// trains, and reports through `progress` (and log lines on stderr) and the
// Prometheus metrics. geotrain-worker's main parses the command line, sets
// up logging and the fault signals (fault_signals.h), connects, loads its
// training library (training_library.h) and calls this through it.

#include "common/worker_config.h"
#include "worker/app/connect.h"
#include "worker/app/progress.h"
#include "worker/app/training_library.h"

namespace geo::app {

// kExitOk (also when the job had finished before this worker could rejoin
// it), kExitFailure with the reason on stderr and as an error event, or (from
// the transport's thread) kExitUsage when a peer runs other sync settings.
// `connection`: connectToPeers(config, progress)'s result. `emulation`
// stretches or pads every step (geotrain-worker's --emulate-* flags, which
// `geotrain local` passes). Logging is set up by the caller. May throw on a
// bug (GEO_ENFORCE); the caller reports it.
int runWorker(const WorkerConfig& config, const Progress& progress, const Emulation& emulation,
              Connection connection);

}  // namespace geo::app
