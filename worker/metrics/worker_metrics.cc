#include "worker/metrics/worker_metrics.h"

#include <prometheus/counter.h>
#include <prometheus/exposer.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <algorithm>
#include <charconv>
#include <exception>
#include <utility>

namespace geo::metrics {
namespace {

// Wide enough for a LAN allreduce (milliseconds) and a WAN round (seconds).
const std::vector<double> kRoundBuckets = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                           1,     2.5,  5,     10,   30,  60};
const std::vector<double> kStepBuckets = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                          0.25,  0.5,    1,     2.5,  5,     10};

// Increment of a cumulative total since `last`, which it then advances. A
// total below `last` means its source restarted from zero.
uint64_t advance(uint64_t now, uint64_t& last) {
  const uint64_t d = now >= last ? now - last : now;
  last = now;
  return d;
}

double advance(double now, double& last) {
  const double d = now >= last ? now - last : now;
  last = now;
  return d;
}

// Index of the bucket (le semantics) that `value` falls in; size() is +Inf.
size_t bucketIndex(const std::vector<double>& bounds, double value) {
  return static_cast<size_t>(std::lower_bound(bounds.begin(), bounds.end(), value) -
                             bounds.begin());
}

Status checkListen(const std::string& listen) {
  const size_t colon = listen.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    return invalidArgument("metrics listen address must be host:port (got '" + listen + "')");
  }
  const char* first = listen.data() + colon + 1;
  const char* end = listen.data() + listen.size();
  unsigned port = 0;
  const auto [ptr, ec] = std::from_chars(first, end, port);
  if (first == end || ec != std::errc() || ptr != end || port > 65535) {
    return invalidArgument("metrics listen address has no valid port (got '" + listen + "')");
  }
  return {};
}

}  // namespace

struct WorkerMetrics::PeerSeries {
  prometheus::Counter* sent = nullptr;
  prometheus::Counter* received = nullptr;
  prometheus::Counter* reconnects = nullptr;
  prometheus::Gauge* rtt = nullptr;  // added on the first RTT sample
  uint64_t lastSent = 0;
  uint64_t lastReceived = 0;
  uint64_t lastReconnects = 0;
};

// The totals seen at the previous update.
struct WorkerMetrics::Last {
  uint64_t refusedKeys = 0;
  uint64_t handshakeFailures = 0;
  uint64_t framesRejected = 0;
  uint64_t checkpointFailures = 0;
  SyncSnapshot sync;
};

WorkerMetrics::WorkerMetrics(WorkerIdentity id, std::vector<PeerInfo> peers)
    : id_(std::move(id)),
      registry_(std::make_shared<prometheus::Registry>()),
      last_(std::make_unique<Last>()) {
  for (auto& p : peers) peerInfo_[p.rank] = std::move(p);
  buildFamilies();
}

WorkerMetrics::~WorkerMetrics() = default;

StatusOr<std::unique_ptr<WorkerMetrics>> WorkerMetrics::start(const std::string& listen,
                                                              WorkerIdentity id,
                                                              std::vector<PeerInfo> peers) {
  if (Status s = checkListen(listen); !s.ok()) return s;
  std::unique_ptr<WorkerMetrics> m(new WorkerMetrics(std::move(id), std::move(peers)));
  try {
    m->exposer_ = std::make_unique<prometheus::Exposer>(listen, /*num_threads=*/2);
  } catch (const std::exception& e) {
    return unavailable("cannot serve metrics on " + listen + ": " + e.what());
  }
  const std::vector<int> ports = m->exposer_->GetListeningPorts();
  if (ports.empty()) return unavailable("cannot serve metrics on " + listen + ": no port bound");
  m->port_ = static_cast<uint16_t>(ports.front());
  m->exposer_->RegisterCollectable(m->registry_);
  return m;
}

void WorkerMetrics::buildFamilies() {
  const prometheus::Labels constant = {
      {"job", id_.job}, {"region", id_.region}, {"rank", std::to_string(id_.rank)}};
  auto& reg = *registry_;
  auto counter = [&](const char* name, const char* help) -> prometheus::Counter& {
    return prometheus::BuildCounter().Name(name).Help(help).Labels(constant).Register(reg).Add({});
  };
  auto gauge = [&](const char* name, const char* help) -> prometheus::Gauge& {
    return prometheus::BuildGauge().Name(name).Help(help).Labels(constant).Register(reg).Add({});
  };
  auto histogram = [&](const char* name, const char* help,
                       const std::vector<double>& buckets) -> prometheus::Histogram& {
    return prometheus::BuildHistogram().Name(name).Help(help).Labels(constant).Register(reg).Add(
        {}, buckets);
  };

  bytesSent_ = &prometheus::BuildCounter()
                    .Name("geotrain_bytes_sent_total")
                    .Help("Bytes (frame headers and payloads) sent to a peer")
                    .Labels(constant)
                    .Register(reg);
  bytesReceived_ = &prometheus::BuildCounter()
                        .Name("geotrain_bytes_received_total")
                        .Help("Bytes (frame headers and payloads) received from a peer")
                        .Labels(constant)
                        .Register(reg);
  peerRtt_ = &prometheus::BuildGauge()
                  .Name("geotrain_peer_rtt_seconds")
                  .Help("Last measured round-trip time to a peer")
                  .Labels(constant)
                  .Register(reg);
  reconnects_ = &prometheus::BuildCounter()
                     .Name("geotrain_transport_reconnects_total")
                     .Help("Connections to a peer re-established after the first")
                     .Labels(constant)
                     .Register(reg);
  auto& refused = prometheus::BuildCounter()
                      .Name("geotrain_transport_refused_total")
                      .Help("Peers or frames the transport refused, by reason")
                      .Labels(constant)
                      .Register(reg);
  refusedKeys_ = &refused.Add({{"reason", "key"}});
  handshakeFailures_ = &refused.Add({{"reason", "handshake"}});
  framesRejected_ = &refused.Add({{"reason", "frame"}});

  payloadBytes_ = &counter("geotrain_payload_bytes_total",
                           "Update bytes before encoding (fp32), per destination");
  encodedBytes_ = &counter("geotrain_encoded_bytes_total",
                           "Update bytes after encoding, per destination (payloads only)");
  staleness_ =
      &histogram("geotrain_update_staleness_steps",
                 "Staleness of applied peer updates, in optimizer steps", kStalenessBuckets);
  roundSeconds_ = &histogram("geotrain_sync_round_seconds",
                             "Duration of a synchronization round, send to applied", kRoundBuckets);
  delay_ = &gauge("geotrain_sync_delay_steps", "Delay D used for the latest round, in steps");
  period_ = &gauge("geotrain_sync_period_steps", "DTS period K of the round in progress, in steps");
  lrScale_ = &gauge("geotrain_sync_lr_scale",
                    "DTS: the factor on the gradient under the delay in force (1: none)");
  link_ = &gauge("geotrain_sync_link_seconds",
                 "DTS auto: the slowest link's one-way time measured from both ends");
  uplinkRate_ = &gauge("geotrain_sync_uplink_bytes_per_second",
                       "this worker's uplink rate as measured (0: not measured)");
  rounds_ = &counter("geotrain_sync_rounds_total", "Synchronization rounds completed");
  missing_ = &counter("geotrain_sync_missing_total",
                      "Peer contributions given up on (absent or late peers)");
  waitSeconds_ = &counter("geotrain_sync_wait_seconds_total",
                          "Time the training thread spent blocked waiting for peers");
  codecSeconds_ =
      &counter("geotrain_codec_seconds_total", "Total time spent encoding and decoding updates");

  peerUp_ = &prometheus::BuildGauge()
                 .Name("geotrain_peer_up")
                 .Help(
                     "1 while a peer this worker synchronizes with is live, 0 while it is "
                     "suspected or partitioned")
                 .Labels(constant)
                 .Register(reg);
  degradedSeconds_ = &counter("geotrain_degraded_seconds_total",
                              "Time this worker ran with at least one of its peers suspected");
  rejoins_ = &counter("geotrain_rejoins_total",
                      "Times this worker joined a running job by state transfer from a live peer");
  peerRejoins_ =
      &counter("geotrain_peer_rejoins_total",
               "Times a peer rejoined through this worker (it served the state transfer)");
  auto& transferBytes = prometheus::BuildCounter()
                            .Name("geotrain_state_transfer_bytes_total")
                            .Help("State-transfer bytes (model and step), by direction")
                            .Labels(constant)
                            .Register(reg);
  stateTransferBytesSent_ = &transferBytes.Add({{"direction", "sent"}});
  stateTransferBytesReceived_ = &transferBytes.Add({{"direction", "received"}});
  stateTransferSeconds_ = &counter("geotrain_state_transfer_seconds_total",
                                   "Time spent receiving state transfers (the joiner's side)");
  auto& late = prometheus::BuildCounter()
                   .Name("geotrain_late_updates_total")
                   .Help(
                       "Contributions that arrived after their round had completed without "
                       "them: applied late, or dropped as too old")
                   .Labels(constant)
                   .Register(reg);
  lateApplied_ = &late.Add({{"result", "applied"}});
  lateDropped_ = &late.Add({{"result", "dropped"}});
  parityChecks_ = &counter("geotrain_state_parity_checks_total",
                           "Peers' job-model fingerprints compared with this worker's (dts)");
  parityMismatches_ = &counter("geotrain_state_parity_mismatches_total",
                               "Peers' job-model fingerprints found to differ from this worker's");
  parityRepairs_ = &counter("geotrain_state_repairs_total",
                            "Repairs of this worker's job model from a peer's, after its "
                            "fingerprint differed from the job's");
  rejected_ = &prometheus::BuildCounter()
                   .Name("geotrain_sync_rejected_updates_total")
                   .Help(
                       "Contributions of peers refused before use (treated as missing), by "
                       "peer and reason: size, malformed, non_finite, out_of_range")
                   .Labels(constant)
                   .Register(reg);

  stepSeconds_ =
      &histogram("geotrain_step_seconds", "Wall time of one optimizer step", kStepBuckets);
  trainLoss_ = &gauge("geotrain_train_loss", "Training loss of the latest step");
  trainStep_ = &gauge("geotrain_train_step",
                      "Training steps completed (a resumed worker counts from its checkpoint)");
  evalAccuracy_ = &gauge("geotrain_eval_accuracy", "Accuracy of the latest evaluation (0..1)");
  evalLoss_ = &gauge("geotrain_eval_loss",
                     "Test loss per sample of the latest evaluation (cross-entropy or mse)");
  samples_ = &counter("geotrain_samples_total", "Training samples consumed");
  checkpointFailures_ =
      &counter("geotrain_checkpoint_failures_total",
               "Checkpoint writes that failed (disk full, I/O error, read-only file system); "
               "training went on with the previous checkpoint kept");
}

WorkerMetrics::PeerSeries& WorkerMetrics::peerSeries(uint32_t peer) {
  auto it = peerSeries_.find(peer);
  if (it != peerSeries_.end()) return *it->second;
  PeerInfo info{peer, "unknown", true};
  if (auto known = peerInfo_.find(peer); known != peerInfo_.end()) info = known->second;
  const std::string rank = std::to_string(peer);
  const prometheus::Labels link = {
      {"peer", rank}, {"peer_region", info.region}, {"link", info.wan ? "wan" : "lan"}};
  auto series = std::make_unique<PeerSeries>();
  series->sent = &bytesSent_->Add(link);
  series->received = &bytesReceived_->Add(link);
  series->reconnects = &reconnects_->Add({{"peer", rank}});
  return *peerSeries_.emplace(peer, std::move(series)).first->second;
}

void WorkerMetrics::updateTransport(const std::vector<transport::PeerCounters>& peers,
                                    const transport::TransportCounters& c) {
  std::lock_guard lock(mu_);
  for (const auto& p : peers) {
    PeerSeries& s = peerSeries(p.peer);
    s.sent->Increment(static_cast<double>(advance(p.bytesSent, s.lastSent)));
    s.received->Increment(static_cast<double>(advance(p.bytesReceived, s.lastReceived)));
    s.reconnects->Increment(static_cast<double>(advance(p.reconnects, s.lastReconnects)));
    if (p.rttSeconds >= 0) {
      if (s.rtt == nullptr) s.rtt = &peerRtt_->Add({{"peer", std::to_string(p.peer)}});
      s.rtt->Set(p.rttSeconds);
    }
  }
  Last& l = *last_;
  refusedKeys_->Increment(static_cast<double>(advance(c.refusedKeys, l.refusedKeys)));
  handshakeFailures_->Increment(
      static_cast<double>(advance(c.handshakeFailures, l.handshakeFailures)));
  framesRejected_->Increment(static_cast<double>(advance(c.framesRejected, l.framesRejected)));
}

void WorkerMetrics::updateSync(const SyncSnapshot& s) {
  std::lock_guard lock(mu_);
  SyncSnapshot& l = last_->sync;
  delay_->Set(static_cast<double>(s.delay));
  period_->Set(static_cast<double>(s.period));
  lrScale_->Set(s.lrScale);
  link_->Set(s.linkSeconds);
  uplinkRate_->Set(s.uplinkBytesPerSecond);
  rounds_->Increment(static_cast<double>(advance(s.rounds, l.rounds)));
  missing_->Increment(static_cast<double>(advance(s.missing, l.missing)));
  payloadBytes_->Increment(static_cast<double>(advance(s.payloadBytes, l.payloadBytes)));
  encodedBytes_->Increment(static_cast<double>(advance(s.encodedBytes, l.encodedBytes)));
  waitSeconds_->Increment(advance(s.waitSeconds, l.waitSeconds));
  codecSeconds_->Increment(advance(s.codecSeconds, l.codecSeconds));

  // Staleness: bucket the per-value count increments, one ObserveMultiple.
  if (l.stalenessCounts.size() != s.stalenessCounts.size()) {
    l.stalenessCounts.resize(s.stalenessCounts.size(), 0);
  }
  std::vector<double> increments(kStalenessBuckets.size() + 1, 0.0);
  bool any = false;
  for (size_t v = 0; v < s.stalenessCounts.size(); ++v) {
    const uint64_t d = advance(s.stalenessCounts[v], l.stalenessCounts[v]);
    if (d == 0) continue;
    const bool overflow = v + 1 == s.stalenessCounts.size();
    const size_t bucket = overflow ? kStalenessBuckets.size()
                                   : bucketIndex(kStalenessBuckets, static_cast<double>(v));
    increments[bucket] += static_cast<double>(d);
    any = true;
  }
  const double stalenessSum = advance(s.stalenessSum, l.stalenessSum);
  if (any) staleness_->ObserveMultiple(increments, stalenessSum);

  degradedSeconds_->Increment(advance(s.degradedSeconds, l.degradedSeconds));
  rejoins_->Increment(static_cast<double>(advance(s.rejoins, l.rejoins)));
  peerRejoins_->Increment(static_cast<double>(advance(s.peerRejoins, l.peerRejoins)));
  stateTransferBytesSent_->Increment(
      static_cast<double>(advance(s.stateTransferBytesSent, l.stateTransferBytesSent)));
  stateTransferBytesReceived_->Increment(
      static_cast<double>(advance(s.stateTransferBytesReceived, l.stateTransferBytesReceived)));
  stateTransferSeconds_->Increment(advance(s.stateTransferSeconds, l.stateTransferSeconds));
  lateApplied_->Increment(static_cast<double>(advance(s.lateApplied, l.lateApplied)));
  lateDropped_->Increment(static_cast<double>(advance(s.lateDropped, l.lateDropped)));
  parityChecks_->Increment(static_cast<double>(advance(s.parityChecks, l.parityChecks)));
  parityMismatches_->Increment(
      static_cast<double>(advance(s.parityMismatches, l.parityMismatches)));
  parityRepairs_->Increment(static_cast<double>(advance(s.parityRepairs, l.parityRepairs)));
  updatePeerUp(s.peerUp);
  for (const auto& r : s.rejected) {
    auto key = std::make_pair(r.peer, r.reason);
    auto it = rejectedSeries_.find(key);
    if (it == rejectedSeries_.end()) {
      prometheus::Counter* c =
          &rejected_->Add({{"peer", std::to_string(r.peer)}, {"reason", r.reason}});
      it = rejectedSeries_.emplace(key, std::make_pair(c, uint64_t{0})).first;
    }
    it->second.first->Increment(static_cast<double>(advance(r.count, it->second.second)));
  }

  // Rounds completed since the last update, observed at their mean duration.
  const uint64_t newRounds = advance(s.roundSecondsCount, l.roundSecondsCount);
  const double newRoundSeconds = advance(s.roundSecondsSum, l.roundSecondsSum);
  if (newRounds > 0) {
    std::vector<double> roundIncrements(kRoundBuckets.size() + 1, 0.0);
    roundIncrements[bucketIndex(kRoundBuckets, newRoundSeconds / static_cast<double>(newRounds))] =
        static_cast<double>(newRounds);
    roundSeconds_->ObserveMultiple(roundIncrements, newRoundSeconds);
  }
}

void WorkerMetrics::updatePeerUp(const std::vector<std::pair<uint32_t, bool>>& peerUp) {
  std::map<uint32_t, prometheus::Gauge*> listed;
  for (const auto& [peer, up] : peerUp) {
    prometheus::Gauge*& gauge = listed[peer];
    if (gauge == nullptr) {
      if (auto known = peerUpSeries_.find(peer); known != peerUpSeries_.end()) {
        gauge = known->second;
        peerUpSeries_.erase(known);
      } else {
        auto info = peerInfo_.find(peer);
        gauge = &peerUp_->Add({{"peer", std::to_string(peer)},
                               {"peer_region", info != peerInfo_.end() ? info->second.region
                                                                       : std::string("unknown")}});
      }
    }
    gauge->Set(up ? 1 : 0);
  }
  // What is left was listed before and is not now.
  for (const auto& [peer, gauge] : peerUpSeries_) peerUp_->Remove(gauge);
  peerUpSeries_ = std::move(listed);
}

void WorkerMetrics::recordStep(double seconds, double loss, uint64_t samples) {
  std::lock_guard lock(mu_);
  stepSeconds_->Observe(seconds);
  trainLoss_->Set(loss);
  samples_->Increment(static_cast<double>(samples));
}

void WorkerMetrics::setStep(int64_t stepsCompleted) {
  std::lock_guard lock(mu_);
  trainStep_->Set(static_cast<double>(stepsCompleted));
}

void WorkerMetrics::setEvalAccuracy(double accuracy) {
  std::lock_guard lock(mu_);
  evalAccuracy_->Set(accuracy);
}

void WorkerMetrics::setEvalLoss(double loss) {
  std::lock_guard lock(mu_);
  evalLoss_->Set(loss);
}

void WorkerMetrics::setCheckpointFailures(uint64_t total) {
  std::lock_guard lock(mu_);
  // The trainer's running total; a total that went down (a new trainer)
  // counts from zero again, as update*() do.
  const uint64_t delta =
      total >= last_->checkpointFailures ? total - last_->checkpointFailures : total;
  last_->checkpointFailures = total;
  if (delta > 0) checkpointFailures_->Increment(static_cast<double>(delta));
}

}  // namespace geo::metrics
