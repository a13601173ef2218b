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
// other regions until SIGUSR2, and SIGRTMIN queued with a value sets its
// emulated uplink. The caller calls prepareFaultSignals() first thing in
// main; a thread started here takes the signals.

#include <chrono>

#include "common/worker_config.h"
#include "worker/app/progress.h"

namespace geo::app {

// What `geotrain local` emulates on one machine (train::StepEmulation).
struct Emulation {
  double slowdown = 1;                       // >= 1: every step takes this many times as long
  std::chrono::milliseconds minStepTime{0};  // > 0: every step's compute lasts at least this
};

// Installs handlers for the fault signals (SIGUSR1, SIGUSR2, SIGRTMIN) that
// pass them to runWorker's watching thread through a pipe, and blocks them in
// the calling thread, which every thread it starts inherits. A handler, not
// only a mask: threads that libraries start before main (OpenBLAS's pthreads
// build starts its pool when it is loaded) have the signals unblocked, and
// their default action would end the process (a partition once killed a
// worker that way). Call it first thing in main, before any thread of ours.
void prepareFaultSignals();

// kExitOk (also when the job had finished before this worker could rejoin
// it), kExitFailure with the reason on stderr and as an error event, or (from
// the transport's thread) kExitUsage when a peer runs other sync settings.
// `emulation` stretches or pads every step (geotrain-worker's --emulate-*
// flags, which `geotrain local` passes). May throw on a bug (GEO_ENFORCE);
// the caller reports it.
int runWorker(const WorkerConfig& config, const Progress& progress, const Emulation& emulation);

}  // namespace geo::app
