#include "tests/support/fault_injector.h"

#include <algorithm>

namespace geo::testapi {

void FaultInjector::setLatency(std::chrono::milliseconds latency) {
  std::lock_guard lock(mutex_);
  latency_ = latency;
}

void FaultInjector::failNext(int count, int code, std::string method, std::string pathContains,
                             int retryAfterSeconds) {
  std::lock_guard lock(mutex_);
  failures_.push_back({count, code, std::move(method), std::move(pathContains), retryAfterSeconds});
}

void FaultInjector::conflictNextWrites(std::string resource, std::string ns, std::string name,
                                       int count) {
  std::lock_guard lock(mutex_);
  storms_.push_back({std::move(resource), std::move(ns), std::move(name), count});
}

void FaultInjector::dropWatches() {
  ++watchEpoch_;
}

void FaultInjector::reset() {
  std::lock_guard lock(mutex_);
  latency_ = std::chrono::milliseconds(0);
  failures_.clear();
  storms_.clear();
}

std::chrono::milliseconds FaultInjector::latency() const {
  std::lock_guard lock(mutex_);
  return latency_;
}

std::optional<InjectedFailure> FaultInjector::takeFailure(const std::string& method,
                                                          const std::string& path) {
  std::lock_guard lock(mutex_);
  for (auto& f : failures_) {
    if (f.remaining <= 0) continue;
    if (!f.method.empty() && f.method != method) continue;
    if (path.find(f.pathContains) == std::string::npos) continue;
    --f.remaining;
    InjectedFailure out{f.code, f.retryAfterSeconds};
    std::erase_if(failures_, [](const Failure& x) { return x.remaining <= 0; });
    return out;
  }
  return std::nullopt;
}

bool FaultInjector::takeConflict(const std::string& resource, const std::string& ns,
                                 const std::string& name) {
  std::lock_guard lock(mutex_);
  for (auto& s : storms_) {
    if (s.remaining > 0 && s.resource == resource && s.ns == ns && s.name == name) {
      --s.remaining;
      std::erase_if(storms_, [](const Storm& x) { return x.remaining <= 0; });
      return true;
    }
  }
  return false;
}

}  // namespace geo::testapi
