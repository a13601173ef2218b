#pragma once
// The worker's progress events (docs/worker-progress.md): the WorkerEvent of
// worker/local/worker_event.h, filled from the synchronizer's and the
// transport's totals, which Progress (worker_output.h) writes as JSON lines
// on stdout.

#include <chrono>
#include <cstdint>
#include <vector>

#include "common/status.h"
#include "worker/app/worker_output.h"
#include "worker/local/worker_event.h"
#include "worker/metrics/worker_metrics.h"
#include "worker/sync/synchronizer.h"
#include "worker/train/trainer.h"
#include "worker/transport/transport.h"

namespace geo::app {

// One consistent reading of the synchronizer's and the transport's cumulative
// totals: a progress event and the metrics published from the same Totals
// agree to the byte (the transport's pings keep counting in the background).
struct Totals {
  sync::SyncStats sync;
  std::vector<transport::PeerCounters> peers;
  transport::TransportCounters transport;
};

// Either may be null (a single worker has no transport; algorithm none no
// synchronizer): their part of the totals stays zero.
Totals readTotals(const sync::Synchronizer* sync, const transport::Transport* transport);

// Sets the `sync` and `bytes` members of a progress or done event from `t`;
// bytes to and from ranks of this rank's region count as LAN, the rest WAN.
void addTotals(local::WorkerEvent& event, const Totals& t, const sync::Topology& topology);

// Sets the `stepTime` member of a progress or done event: the steps taken
// and where the training thread's time went (train::StepTiming), with the
// synchronizer's encoding and decoding (of which encoding this worker's
// updates) and waiting inside those steps.
void addTiming(local::WorkerEvent& event, const train::StepTiming& timing, double codecSeconds,
               double encodeSeconds, double waitSeconds);

}  // namespace geo::app
