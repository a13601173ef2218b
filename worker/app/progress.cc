#include "worker/app/progress.h"

#include <algorithm>
#include <cstdio>
#include <string>

namespace geo::app {

Totals readTotals(const sync::Synchronizer* sync, const transport::Transport* transport) {
  Totals t;
  if (sync != nullptr) t.sync = sync->stats();
  if (transport != nullptr) {
    t.peers = transport->peerCounters();
    t.transport = transport->counters();
  }
  return t;
}

void addTotals(local::WorkerEvent& e, const Totals& t, const sync::Topology& topology) {
  uint64_t wanSent = 0, wanReceived = 0, lanSent = 0, lanReceived = 0;
  for (const auto& p : t.peers) {
    const bool lan = topology.sameRegion(p.peer, topology.rank());
    (lan ? lanSent : wanSent) += p.bytesSent;
    (lan ? lanReceived : wanReceived) += p.bytesReceived;
  }
  const sync::SyncStats& s = t.sync;
  const auto whole = [](uint64_t v) { return static_cast<int64_t>(v); };
  e.sync.delay = static_cast<double>(s.delay);
  e.sync.lrScale = s.lrScale;
  e.sync.rounds = whole(s.rounds);
  e.sync.appliedUpdates = whole(s.appliedUpdates);
  e.sync.stalenessMean = s.stalenessMean();
  e.sync.stalenessMax = static_cast<double>(s.stalenessMax);
  e.sync.missing = whole(s.missing);
  e.sync.waitSeconds = s.waitSeconds;
  e.sync.codecSeconds = s.codecSeconds;
  e.sync.peersDown =
      std::count_if(s.peerUp.begin(), s.peerUp.end(), [](const auto& p) { return !p.second; });
  e.sync.degradedSeconds = s.degradedSeconds;
  e.sync.rejoins = whole(s.rejoins);
  e.sync.peerRejoins = whole(s.peerRejoins);
  e.sync.stateTransferBytes = whole(s.stateTransferBytesSent + s.stateTransferBytesReceived);
  e.sync.lateApplied = whole(s.lateApplied);
  e.sync.lateDropped = whole(s.lateDropped);
  e.sync.rejected = whole(s.rejectedTotal());
  e.bytes.wanSent = wanSent;
  e.bytes.wanReceived = wanReceived;
  e.bytes.lanSent = lanSent;
  e.bytes.lanReceived = lanReceived;
  e.bytes.payload = s.payloadBytes;
}

void addTiming(local::WorkerEvent& e, const train::StepTiming& timing, double codecSeconds,
               double encodeSeconds, double waitSeconds) {
  e.stepTime.steps = timing.steps;
  e.stepTime.computeSeconds = timing.computeSeconds;
  e.stepTime.syncSeconds = timing.hookSeconds;
  e.stepTime.codecSeconds = codecSeconds;
  e.stepTime.encodeSeconds = encodeSeconds;
  e.stepTime.waitSeconds = waitSeconds;
}

}  // namespace geo::app
