#pragma once
// WorkerMetrics: one worker's Prometheus endpoint (docs/architecture.md section 7).
//
// A WorkerMetrics owns a prometheus::Registry and an HTTP exposer serving it
// at http://<listen>/metrics. The training loop pushes numbers into it; the
// Prometheus server pulls them. Every series carries the constant labels
// job, region and rank of this worker (so one `region` selector filters every
// panel of a dashboard alike); geotrain_bytes_sent_total and
// geotrain_bytes_received_total add the other end: peer, peer_region and
// link=wan|lan; geotrain_peer_up adds peer and peer_region.
// The endpoint also serves prometheus-cpp's own exposer_* series (scrapes,
// bytes transferred, latency), without those labels.
//
// Cumulative sources: the transport and synchronizer report running totals
// (PeerCounters, TransportCounters, SyncStats). update*() turns them into
// Prometheus counters and histograms by adding the difference since the
// previous update, so exported counters never decrease. When a total goes
// down (its source was recreated and restarted from zero) the new total is
// taken as the increment, the usual convention for counter resets.
//
// Ownership: start() returns the only owner. Destroying it stops the HTTP
// server first, then frees the registry; references from registry() must not
// outlive it. Stopping the server can block for up to about two seconds (the
// poll interval of the embedded civetweb server).
//
// Threading: update*(), recordStep() and setEvalAccuracy() are meant for the
// training thread but may be called from any thread (they serialise on an
// internal mutex). Scrapes run on prometheus-cpp's HTTP threads and read the
// metrics concurrently; each value is read atomically, a scrape may see one
// update half applied across different series.
//
// Errors: nothing throws. start() returns InvalidArgument for a malformed
// listen address and Unavailable, naming the address, when the HTTP server
// cannot bind it (e.g. the port is in use).
//
// This header and library do not depend on LibTorch: the synchronizer's
// counters come from worker/sync/stats.h, a plain struct without it.

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "worker/sync/stats.h"
#include "worker/transport/transport.h"

namespace prometheus {
class Counter;
class Exposer;
class Gauge;
class Histogram;
class Registry;
template <typename T>
class Family;
}  // namespace prometheus

namespace geo::metrics {

struct WorkerIdentity {
  std::string job;
  std::string region;
  int64_t rank = 0;
};

// One peer of this worker; `wan` selects the link label (wan|lan).
struct PeerInfo {
  uint32_t rank = 0;
  std::string region;
  bool wan = true;
};

// What updateSync() reads: the synchronizer's own counters (cumulative except
// `delay` and `peerUp`), which carry no LibTorch.
using SyncSnapshot = sync::SyncStats;

// Bucket upper bounds of geotrain_update_staleness_steps.
inline const std::vector<double> kStalenessBuckets = {0, 1, 2, 4, 8, 16, 32, 64};

class WorkerMetrics {
 public:
  // Binds `listen` ("host:port", e.g. "0.0.0.0:9400"; port 0 picks a free
  // port, see port()) and starts serving /metrics. `peers` fixes the labels of
  // the per-peer series; a peer reported later that is not listed gets
  // region "unknown" and link "wan".
  static StatusOr<std::unique_ptr<WorkerMetrics>> start(const std::string& listen,
                                                        WorkerIdentity id,
                                                        std::vector<PeerInfo> peers);

  ~WorkerMetrics();
  WorkerMetrics(const WorkerMetrics&) = delete;
  WorkerMetrics& operator=(const WorkerMetrics&) = delete;

  // The port actually bound.
  uint16_t port() const { return port_; }

  // Totals from Transport::peerCounters() / counters(). Peer RTTs below zero
  // (no ping answered yet) leave geotrain_peer_rtt_seconds unset.
  void updateTransport(const std::vector<transport::PeerCounters>& peers,
                       const transport::TransportCounters& c);

  // Totals from Synchronizer::stats(). The staleness histogram's _count
  // follows appliedUpdates; an overflow entry (the last one) is counted in the
  // +Inf bucket; the length of stalenessCounts must not change between
  // updates. Round durations between two updates are observed at their
  // mean, exact when updates come once per step. geotrain_peer_up lists
  // exactly the peers of the latest `s.peerUp`: a peer no longer listed (this
  // worker stopped synchronizing with it) loses its series rather than
  // keeping a stale value; a listed peer not in the start() table gets
  // peer_region "unknown".
  void updateSync(const SyncSnapshot& s);

  // One optimizer step: its wall time, the loss and the samples it consumed.
  void recordStep(double seconds, double loss, uint64_t samples);
  // Steps completed, counting those before a resume from a checkpoint
  // (geotrain_train_step; the controller reads it into TrainingJob status).
  void setStep(int64_t stepsCompleted);

  void setEvalAccuracy(double accuracy);
  // The latest evaluation's test loss per sample (cross-entropy or mse).
  void setEvalLoss(double loss);
  // The trainer's running total of failed checkpoint writes
  // (geotrain_checkpoint_failures_total).
  void setCheckpointFailures(uint64_t total);

  // For callers that add their own series (they get the constant labels only
  // if they set them).
  prometheus::Registry& registry() { return *registry_; }

 private:
  struct PeerSeries;
  struct Last;

  WorkerMetrics(WorkerIdentity id, std::vector<PeerInfo> peers);
  void buildFamilies();
  // Both require mu_.
  PeerSeries& peerSeries(uint32_t peer);
  void updatePeerUp(const std::vector<std::pair<uint32_t, bool>>& peerUp);

  const WorkerIdentity id_;
  std::map<uint32_t, PeerInfo> peerInfo_;

  // Declared before exposer_ so the server stops before the registry dies.
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  uint16_t port_ = 0;

  std::mutex mu_;
  std::map<uint32_t, std::unique_ptr<PeerSeries>> peerSeries_;
  std::map<uint32_t, prometheus::Gauge*> peerUpSeries_;  // the peers of the latest updateSync()
  std::unique_ptr<Last> last_;

  prometheus::Family<prometheus::Counter>* bytesSent_ = nullptr;
  prometheus::Family<prometheus::Counter>* bytesReceived_ = nullptr;
  prometheus::Family<prometheus::Gauge>* peerRtt_ = nullptr;
  prometheus::Family<prometheus::Counter>* reconnects_ = nullptr;

  prometheus::Counter* refusedKeys_ = nullptr;
  prometheus::Counter* handshakeFailures_ = nullptr;
  prometheus::Counter* framesRejected_ = nullptr;

  prometheus::Counter* payloadBytes_ = nullptr;
  prometheus::Counter* encodedBytes_ = nullptr;
  prometheus::Histogram* staleness_ = nullptr;
  prometheus::Histogram* roundSeconds_ = nullptr;
  prometheus::Gauge* delay_ = nullptr;
  prometheus::Gauge* period_ = nullptr;
  prometheus::Gauge* lrScale_ = nullptr;
  prometheus::Gauge* link_ = nullptr;
  prometheus::Gauge* uplinkRate_ = nullptr;
  prometheus::Counter* rounds_ = nullptr;
  prometheus::Counter* missing_ = nullptr;
  prometheus::Counter* waitSeconds_ = nullptr;
  prometheus::Counter* codecSeconds_ = nullptr;

  prometheus::Family<prometheus::Gauge>* peerUp_ = nullptr;
  prometheus::Counter* degradedSeconds_ = nullptr;
  prometheus::Counter* rejoins_ = nullptr;
  prometheus::Counter* peerRejoins_ = nullptr;
  prometheus::Counter* stateTransferBytesSent_ = nullptr;
  prometheus::Counter* stateTransferBytesReceived_ = nullptr;
  prometheus::Counter* stateTransferSeconds_ = nullptr;
  prometheus::Counter* lateApplied_ = nullptr;
  prometheus::Counter* lateDropped_ = nullptr;
  prometheus::Counter* parityChecks_ = nullptr;
  prometheus::Counter* parityMismatches_ = nullptr;
  prometheus::Counter* parityRepairs_ = nullptr;
  prometheus::Family<prometheus::Counter>* rejected_ = nullptr;
  // (peer, reason) -> its counter and the last total seen.
  std::map<std::pair<uint32_t, std::string>, std::pair<prometheus::Counter*, uint64_t>>
      rejectedSeries_;

  prometheus::Histogram* stepSeconds_ = nullptr;
  prometheus::Gauge* trainLoss_ = nullptr;
  prometheus::Gauge* trainStep_ = nullptr;
  prometheus::Gauge* evalAccuracy_ = nullptr;
  prometheus::Counter* checkpointFailures_ = nullptr;
  prometheus::Gauge* evalLoss_ = nullptr;
  prometheus::Counter* samples_ = nullptr;
};

}  // namespace geo::metrics
