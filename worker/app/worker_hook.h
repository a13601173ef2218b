#pragma once
// WorkerHook: the trainer's StepHook of geotrain-worker, around the
// synchronizer (null for a single worker or sync.algorithm none). It feeds
// the Prometheus metrics once per step (when there are metrics), measures
// the longest step (a stall shows there), and reports a join as a `joined`
// progress event.
//
// Threading: the trainer's thread only, except publish(), which the caller
// may also call after the run.

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "worker/app/progress.h"
#include "worker/app/tcp_limits.h"
#include "worker/metrics/worker_metrics.h"
#include "worker/sync/synchronizer.h"
#include "worker/train/trainer.h"
#include "worker/transport/transport.h"

namespace geo::app {

class WorkerHook final : public train::StepHook {
 public:
  // Any of metrics, sync and transport may be null; none is owned, and each
  // must outlive the hook.
  WorkerHook(metrics::WorkerMetrics* metrics, sync::Synchronizer* sync,
             const transport::Transport* transport, uint64_t batchSize, const Progress& progress)
      : metrics_(metrics),
        sync_(sync),
        transport_(transport),
        batchSize_(batchSize),
        progress_(progress) {}

  StatusOr<train::JoinResult> join(int64_t step, train::FlatParameters& flat) override;
  Status afterBackward(int64_t step, train::FlatParameters& flat) override;
  Status afterStep(int64_t step, train::FlatParameters& flat) override;
  Status finish(int64_t steps, train::FlatParameters& flat) override;
  std::optional<train::JobModel> jobModel() override {
    return sync_ != nullptr ? sync_->jobModel() : std::nullopt;
  }
  void saveState(torch::serialize::OutputArchive& archive) override;
  Status loadState(torch::serialize::InputArchive& archive) override;

  // The trainer reports the loss with its progress (every logInterval steps);
  // the gauge shows the latest reported value.
  void setLoss(double loss) { loss_ = loss; }
  // The longest step so far, after the first (seconds); 0 before the second.
  double longestStep() const { return longestStep_; }
  // The synchronizer's encoding and decoding, and its waits for peers or
  // the uplink, inside the steps taken so far (seconds; not the join's nor
  // the final average's): its counters now, or as finish() began, less
  // those as the first step began. Read between steps (a progress event),
  // not once a step: a reading copies the synchronizer's counters.
  struct InStep {
    double codecSeconds = 0;
    double encodeSeconds = 0;  // of codecSeconds: encoding this worker's updates
    double waitSeconds = 0;
  };
  InStep inStep() const;
  // Sets the transport and synchronizer metrics to `t` (nothing without
  // metrics).
  void publish(const Totals& t);
  // Logs once, when the round trips to the peers heard are known (a few
  // seconds in), what one TCP connection can carry over the longest of them
  // under these buffer limits (tcp_limits.h), and its `connections` to a
  // peer (transport.connections) together; `describe` names a rank.
  void reportTcpCeiling(TcpBufferLimits limits, int64_t connections,
                        std::function<std::string(uint32_t)> describe) {
    tcpLimits_ = limits;
    tcpConnections_ = connections;
    describePeer_ = std::move(describe);
  }

 private:
  metrics::WorkerMetrics* metrics_;
  sync::Synchronizer* sync_;
  const transport::Transport* transport_;
  uint64_t batchSize_;
  const Progress& progress_;
  double loss_ = 0;
  int64_t steps_ = 0;
  double longestStep_ = 0;
  std::chrono::steady_clock::time_point last_ = std::chrono::steady_clock::now();
  void checkTcpCeiling(std::chrono::steady_clock::time_point now);
  std::optional<InStep> atFirstStep_;         // the counters as the first step began
  std::optional<InStep> atFinish_;            // and as finish() began
  std::optional<TcpBufferLimits> tcpLimits_;  // unset: nothing to report
  int64_t tcpConnections_ = 1;
  std::function<std::string(uint32_t)> describePeer_;
  std::chrono::steady_clock::time_point nextTcpCheck_{};
  int tcpChecks_ = 0;
};

}  // namespace geo::app
