#include "worker/app/worker_hook.h"

#include <algorithm>

#include "common/logging.h"

namespace geo::app {

StatusOr<train::JoinResult> WorkerHook::join(int64_t step, train::FlatParameters& flat) {
  if (sync_ == nullptr) return train::JoinResult{step, false};
  auto joined = sync_->join(step, flat);
  if (joined.ok()) {
    const sync::SyncStats s = sync_->stats();
    local::WorkerEvent e;
    e.kind = local::EventKind::kJoined;
    e.step = joined->step;
    e.fromStep = step;
    e.transferred = s.rejoins > 0;
    e.jobFinished = joined->jobFinished;
    e.stateTransferSeconds = s.stateTransferSeconds;
    progress_.emit(std::move(e));
  }
  last_ = std::chrono::steady_clock::now();
  return joined;
}

namespace {

WorkerHook::InStep codecAndWait(const sync::SyncStats& s) {
  return {s.codecSeconds, s.encodeSeconds, s.waitSeconds};
}

}  // namespace

Status WorkerHook::afterBackward(int64_t step, train::FlatParameters& flat) {
  if (sync_ == nullptr) return {};
  if (!atFirstStep_) atFirstStep_ = codecAndWait(sync_->stats());
  return sync_->afterBackward(step, flat);
}

WorkerHook::InStep WorkerHook::inStep() const {
  if (sync_ == nullptr || !atFirstStep_) return {};
  const InStep end = atFinish_ ? *atFinish_ : codecAndWait(sync_->stats());
  return {end.codecSeconds - atFirstStep_->codecSeconds,
          end.encodeSeconds - atFirstStep_->encodeSeconds,
          end.waitSeconds - atFirstStep_->waitSeconds};
}

Status WorkerHook::afterStep(int64_t step, train::FlatParameters& flat) {
  if (sync_ != nullptr) GEO_RETURN_IF_ERROR(sync_->afterStep(step, flat));
  const auto now = std::chrono::steady_clock::now();
  const double seconds = std::chrono::duration<double>(now - last_).count();
  // The first step includes connection set-up and warm-up.
  if (++steps_ > 1) longestStep_ = std::max(longestStep_, seconds);
  if (metrics_ != nullptr) {
    metrics_->recordStep(seconds, loss_, batchSize_);
    metrics_->setStep(step + 1);
    publish(readTotals(sync_, transport_));
  }
  if (tcpLimits_ && now >= nextTcpCheck_) checkTcpCeiling(now);
  last_ = now;
  return {};
}

void WorkerHook::checkTcpCeiling(std::chrono::steady_clock::time_point now) {
  nextTcpCheck_ = now + std::chrono::seconds(2);
  // Three checks in (4 s and more): the pings have had time to measure the
  // round trips of every peer connected by then.
  if (transport_ == nullptr || ++tcpChecks_ < 3) return;
  double longest = 0;
  uint32_t who = 0;
  for (const auto& p : transport_->peerCounters()) {
    if (!p.heard) continue;            // not connected (another region's member)
    if (p.minRttSeconds <= 0) return;  // not measured yet: the next check
    if (p.minRttSeconds > longest) {
      longest = p.minRttSeconds;
      who = p.peer;
    }
  }
  if (longest <= 0) return;
  logger()->info("{}",
                 describeWindowCeiling(*tcpLimits_, describePeer_(who), longest, tcpConnections_));
  tcpLimits_.reset();
}

Status WorkerHook::finish(int64_t steps, train::FlatParameters& flat) {
  if (sync_ != nullptr) {
    if (atFirstStep_ && !atFinish_) atFinish_ = codecAndWait(sync_->stats());
    GEO_RETURN_IF_ERROR(sync_->finish(steps, flat));
  }
  if (metrics_ != nullptr) publish(readTotals(sync_, transport_));
  return {};
}

void WorkerHook::saveState(torch::serialize::OutputArchive& archive) {
  if (sync_ != nullptr) sync_->saveState(archive);
}

Status WorkerHook::loadState(torch::serialize::InputArchive& archive) {
  return sync_ != nullptr ? sync_->loadState(archive) : Status();
}

void WorkerHook::publish(const Totals& t) {
  if (metrics_ == nullptr) return;
  if (transport_ != nullptr) metrics_->updateTransport(t.peers, t.transport);
  if (sync_ != nullptr) metrics_->updateSync(t.sync);
}

}  // namespace geo::app
