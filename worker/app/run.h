#pragma once
// One training worker's run, from a checked configuration to its exit code:
// sets up logging and the device, connects to the peers (sync.algorithm
// other than none and more than one worker) and refuses peers whose sync
// settings differ, builds the synchronizer, loads the shard and the model,
// resumes from a checkpoint, trains, and reports through `progress` (and log
// lines on stderr) and the Prometheus metrics. geotrain-worker's main parses
// the command line and calls this.
//
// Fault injection for `geotrain local`: SIGUSR1 cuts this worker off from the
// other regions until SIGUSR2. The caller must have blocked both signals in
// every thread (pthread_sigmask before any thread exists): a thread started
// here takes them with sigwait.

#include <chrono>

#include "common/worker_config.h"
#include "worker/app/progress.h"

namespace geo::app {

// What `geotrain local` emulates on one machine (train::TrainerOptions).
struct Emulation {
  double slowdown = 1;                       // >= 1: every step takes this many times as long
  std::chrono::milliseconds minStepTime{0};  // > 0: every step's compute lasts at least this
};

// kExitOk (also when the job had finished before this worker could rejoin
// it), kExitFailure with the reason on stderr and as an error event, or (from
// the transport's thread) kExitUsage when a peer runs other sync settings.
// `emulation` stretches or pads every step (geotrain-worker's --emulate-*
// flags, which `geotrain local` passes). May throw on a bug (GEO_ENFORCE);
// the caller reports it.
int runWorker(const WorkerConfig& config, const Progress& progress, const Emulation& emulation);

}  // namespace geo::app
