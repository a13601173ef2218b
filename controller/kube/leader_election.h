#pragma once
// Leader election with a coordination.k8s.io/v1 Lease, as client-go does it.
//
// Candidates share one Lease. A candidate takes it when it is free or when
// its holder has not renewed it for leaseDuration, measured on the
// candidate's own clock from when it last saw the record change (so clock
// skew between machines does not matter). Every write is an update
// conditional on the resourceVersion just read (or a create when there is no
// Lease), so of two candidates racing for it one gets 409 Conflict and loses.
// The leader renews every retryPeriod; if it cannot renew for renewDeadline
// it stops leading. renewDeadline < leaseDuration leaves the margin in which
// a deposed leader notices before anyone else may take over.
//
// Threading: run() blocks on the caller's thread until cancelled; the
// callbacks run on that thread. isLeader() is thread-safe and turns false at
// renewDeadline after the last successful renew even while a call hangs, so
// reconcilers should check it; give the elector a client whose per-call
// timeout is well under renewDeadline. Errors are logged and retried. If
// onStartedLeading throws, the elector logs it, releases the lease and
// returns from run(); onStoppedLeading must not throw.
//
// Time: every duration above, the retry sleeps and the MicroTime stamps
// written into the Lease are read from the elector's Clock
// (common/clock.h), so tests drive an election with a FakeClock.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "common/clock.h"
#include "controller/kube/cancel.h"
#include "controller/kube/client.h"

namespace geo::kube {

// The Lease's spec.
struct LeaseRecord {
  std::string holderIdentity;
  int leaseDurationSeconds = 0;
  std::string acquireTime;  // MicroTime
  std::string renewTime;    // MicroTime
  int leaseTransitions = 0;

  static LeaseRecord fromLease(const nlohmann::json& lease);
  // Sets spec.* of `lease` (other fields are kept).
  void writeTo(nlohmann::json& lease) const;
  friend bool operator==(const LeaseRecord&, const LeaseRecord&) = default;
};

// What `identity` writes next, given the record it read (nullopt: no Lease
// yet) and whether the current holder's lease has expired by its clock;
// nullopt when another live holder has it. Pure: the decision logic.
std::optional<LeaseRecord> nextLeaseRecord(const std::optional<LeaseRecord>& current,
                                           const std::string& identity, bool expired,
                                           int leaseDurationSeconds, const std::string& now);

struct LeaderElectionConfig {
  std::string leaseNamespace;
  std::string leaseName;
  std::string identity;  // unique per candidate: pod name + random suffix
  std::chrono::milliseconds leaseDuration{15000};
  std::chrono::milliseconds renewDeadline{10000};
  std::chrono::milliseconds retryPeriod{2000};
  // On cancel, the leader empties holderIdentity so a standby need not wait.
  bool releaseOnCancel = true;
  std::function<void()> onStartedLeading;
  // Called once after leading ends (renew failure or cancel).
  std::function<void()> onStoppedLeading;
};

class LeaderElector {
 public:
  // GEO_ENFORCE: identity, namespace and name set; 0 < retryPeriod <
  // renewDeadline < leaseDuration. The client and the clock must outlive
  // the elector.
  LeaderElector(KubeClient& client, LeaderElectionConfig config,
                const Clock& clock = systemClock());

  // Campaigns, leads until renewal fails or `cancel`, then returns (call it
  // again to campaign again). Returns at once when cancelled.
  void run(const CancelToken& cancel);

  bool isLeader() const;
  // The holder in the last record read ("" when none or unknown).
  std::string observedLeader() const;

 private:
  // One read-decide-write round; true when this candidate holds the lease.
  bool tryAcquireOrRenew();
  void release();

  KubeClient& client_;
  const LeaderElectionConfig config_;
  const Clock& clock_;
  std::optional<LeaseRecord> observed_;
  Clock::TimePoint observedAt_{};
  std::atomic<int64_t> leaderUntil_{0};  // clock_.now() in ns; 0: not leading
  mutable std::mutex mu_;
  std::string observedHolder_;
};

}  // namespace geo::kube
