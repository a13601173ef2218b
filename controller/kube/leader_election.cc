#include "controller/kube/leader_election.h"

#include <cmath>
#include <exception>

#include "common/enforce.h"
#include "common/logging.h"
#include "controller/kube/kube_time.h"

namespace geo::kube {
namespace {

using nlohmann::json;

std::string stringField(const json& spec, const char* key) {
  const auto it = spec.find(key);
  return it != spec.end() && it->is_string() ? it->get<std::string>() : std::string();
}

int intField(const json& spec, const char* key) {
  const auto it = spec.find(key);
  return it != spec.end() && it->is_number_integer() ? it->get<int>() : 0;
}

int64_t steadyNanos(std::chrono::steady_clock::time_point time) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(time.time_since_epoch()).count();
}

}  // namespace

LeaseRecord LeaseRecord::fromLease(const json& lease) {
  LeaseRecord record;
  const auto spec = lease.find("spec");
  if (spec == lease.end() || !spec->is_object()) return record;
  record.holderIdentity = stringField(*spec, "holderIdentity");
  record.leaseDurationSeconds = intField(*spec, "leaseDurationSeconds");
  record.acquireTime = stringField(*spec, "acquireTime");
  record.renewTime = stringField(*spec, "renewTime");
  record.leaseTransitions = intField(*spec, "leaseTransitions");
  return record;
}

void LeaseRecord::writeTo(json& lease) const {
  json& spec = lease["spec"];
  spec["holderIdentity"] = holderIdentity;
  spec["leaseDurationSeconds"] = leaseDurationSeconds;
  spec["acquireTime"] = acquireTime;
  spec["renewTime"] = renewTime;
  spec["leaseTransitions"] = leaseTransitions;
}

std::optional<LeaseRecord> nextLeaseRecord(const std::optional<LeaseRecord>& current,
                                           const std::string& identity, bool expired,
                                           int leaseDurationSeconds, const std::string& now) {
  LeaseRecord next;
  next.holderIdentity = identity;
  next.leaseDurationSeconds = leaseDurationSeconds;
  next.renewTime = now;
  if (!current) {
    next.acquireTime = now;
    return next;
  }
  const bool mine = current->holderIdentity == identity;
  if (!mine && !current->holderIdentity.empty() && !expired) return std::nullopt;
  if (mine) {
    next.acquireTime = current->acquireTime;
    next.leaseTransitions = current->leaseTransitions;
  } else {
    next.acquireTime = now;
    // A released lease (holder "") taken over still counts as a transition.
    next.leaseTransitions = current->leaseTransitions + 1;
  }
  return next;
}

LeaderElector::LeaderElector(KubeClient& client, LeaderElectionConfig config, const Clock& clock)
    : client_(client), config_(std::move(config)), clock_(clock) {
  GEO_ENFORCE(
      !config_.identity.empty() && !config_.leaseNamespace.empty() && !config_.leaseName.empty(),
      "leader election needs identity, lease namespace and lease name");
  GEO_ENFORCE(config_.retryPeriod.count() > 0 && config_.retryPeriod < config_.renewDeadline &&
                  config_.renewDeadline < config_.leaseDuration,
              "leader election needs 0 < retryPeriod < renewDeadline < leaseDuration (got {} ms, "
              "{} ms, {} ms)",
              config_.retryPeriod.count(), config_.renewDeadline.count(),
              config_.leaseDuration.count());
}

bool LeaderElector::isLeader() const {
  const int64_t until = leaderUntil_.load(std::memory_order_acquire);
  return until != 0 && steadyNanos(clock_.now()) < until;
}

std::string LeaderElector::observedLeader() const {
  std::lock_guard lock(mu_);
  return observedHolder_;
}

bool LeaderElector::tryAcquireOrRenew() {
  const auto now = clock_.now();
  const std::string nowText = formatMicroTime(clock_.wallNow());
  const int durationSeconds =
      static_cast<int>(std::ceil(std::chrono::duration<double>(config_.leaseDuration).count()));
  auto lease = client_.get(resources::kLeases, config_.leaseNamespace, config_.leaseName);
  if (!lease.ok() && !lease.error().isNotFound()) {
    logger()->warn("leader election {}/{}: {}", config_.leaseNamespace, config_.leaseName,
                   lease.error().toStatus().toString());
    return false;
  }
  std::optional<LeaseRecord> current;
  if (lease.ok()) {
    current = LeaseRecord::fromLease(*lease);
    if (!observed_ || !(*observed_ == *current)) {
      observed_ = current;
      observedAt_ = now;
    }
    std::lock_guard lock(mu_);
    observedHolder_ = current->holderIdentity;
  }
  // The holder's own duration counts; ours if it wrote none.
  const auto holderDuration =
      current && current->leaseDurationSeconds > 0
          ? std::chrono::seconds(current->leaseDurationSeconds)
          : std::chrono::duration_cast<std::chrono::seconds>(config_.leaseDuration);
  const bool expired = current && now >= observedAt_ + holderDuration;
  const auto next = nextLeaseRecord(current, config_.identity, expired, durationSeconds, nowText);
  if (!next) return false;

  ApiResult<json> written = json();
  if (!current) {
    json object = {
        {"apiVersion", "coordination.k8s.io/v1"},
        {"kind", "Lease"},
        {"metadata", {{"name", config_.leaseName}, {"namespace", config_.leaseNamespace}}}};
    next->writeTo(object);
    written = client_.create(resources::kLeases, config_.leaseNamespace, object);
  } else {
    json object = std::move(lease).value();
    next->writeTo(object);
    written = client_.update(resources::kLeases, config_.leaseNamespace, object);
  }
  if (!written.ok()) {
    // Conflict/AlreadyExists: another candidate wrote first; that is the race
    // working as intended, not worth a warning.
    if (written.error().isConflict() || written.error().isAlreadyExists()) {
      logger()->debug("leader election {}/{}: lost a race: {}", config_.leaseNamespace,
                      config_.leaseName, written.error().message);
    } else {
      logger()->warn("leader election {}/{}: {}", config_.leaseNamespace, config_.leaseName,
                     written.error().toStatus().toString());
    }
    return false;
  }
  observed_ = LeaseRecord::fromLease(*written);
  observedAt_ = now;
  {
    std::lock_guard lock(mu_);
    observedHolder_ = config_.identity;
  }
  leaderUntil_.store(steadyNanos(now + config_.renewDeadline), std::memory_order_release);
  return true;
}

void LeaderElector::release() {
  auto lease = client_.get(resources::kLeases, config_.leaseNamespace, config_.leaseName);
  if (!lease.ok() || LeaseRecord::fromLease(*lease).holderIdentity != config_.identity) return;
  LeaseRecord record = LeaseRecord::fromLease(*lease);
  record.holderIdentity.clear();
  // One second: candidates treat the released lease as free at once anyway.
  record.leaseDurationSeconds = 1;
  record.renewTime = formatMicroTime(clock_.wallNow());
  json object = std::move(lease).value();
  record.writeTo(object);
  if (auto written = client_.update(resources::kLeases, config_.leaseNamespace, object);
      !written.ok()) {
    logger()->warn("leader election {}/{}: release failed: {}", config_.leaseNamespace,
                   config_.leaseName, written.error().toStatus().toString());
  }
}

void LeaderElector::run(const CancelToken& cancel) {
  // Campaign: a jittered retry period spreads the candidates' attempts.
  Backoff jitter(BackoffPolicy{config_.retryPeriod, config_.retryPeriod, 1.0, 0.2});
  while (!tryAcquireOrRenew()) {
    if (!cancel.sleepFor(jitter.next(), clock_)) return;
  }
  logger()->info("leader election {}/{}: {} is the leader", config_.leaseNamespace,
                 config_.leaseName, config_.identity);
  if (config_.onStartedLeading) {
    try {
      config_.onStartedLeading();
    } catch (const std::exception& e) {
      // A leader that could not start its work must not hold the lease.
      logger()->error("leader election {}/{}: onStartedLeading threw: {}; stepping down",
                      config_.leaseNamespace, config_.leaseName, e.what());
      leaderUntil_.store(0, std::memory_order_release);
      release();
      return;
    }
  }

  auto lastRenew = clock_.now();
  while (cancel.sleepFor(config_.retryPeriod, clock_)) {
    if (tryAcquireOrRenew()) {
      lastRenew = clock_.now();
    } else if (clock_.now() - lastRenew >= config_.renewDeadline) {
      logger()->warn("leader election {}/{}: {} could not renew within {} ms; stopping",
                     config_.leaseNamespace, config_.leaseName, config_.identity,
                     config_.renewDeadline.count());
      break;
    }
  }
  leaderUntil_.store(0, std::memory_order_release);
  if (cancel.cancelled() && config_.releaseOnCancel) release();
  if (config_.onStoppedLeading) config_.onStoppedLeading();
}

}  // namespace geo::kube
