#include "controller/kube/controller.h"

#include "common/enforce.h"
#include "common/logging.h"

namespace geo::kube {

std::string_view passOutcomeName(PassOutcome outcome) {
  switch (outcome) {
    case PassOutcome::kSuccess: return "success";
    case PassOutcome::kRequeue: return "requeue";
    case PassOutcome::kRetry: return "retry";
    case PassOutcome::kError: return "error";
  }
  return "unknown";
}

Controller::Controller(ControllerOptions options, ReconcileFn reconcile, PassFn onPass,
                       const Clock& clock)
    : options_(std::move(options)),
      reconcile_(std::move(reconcile)),
      onPass_(std::move(onPass)),
      clock_(clock),
      queue_(options_.baseDelay, options_.maxDelay, clock) {
  GEO_ENFORCE(options_.workers >= 1, "a controller needs at least one worker (got {})",
              options_.workers);
  GEO_ENFORCE(static_cast<bool>(reconcile_), "a controller needs a reconcile function");
}

Controller::~Controller() {
  shutdown();
}

void Controller::start() {
  GEO_ENFORCE(workers_.empty(), "Controller::start() called twice");
  for (int w = 0; w < options_.workers; ++w) workers_.emplace_back([this] { work(); });
}

void Controller::shutdown() {
  queue_.shutdown();
  for (std::thread& t : workers_) {
    if (t.joinable()) t.join();
  }
}

void Controller::work() {
  while (const std::optional<std::string> key = queue_.get()) {
    processOne(*key);
    queue_.done(*key);
  }
}

void Controller::processOne(const std::string& key) {
  const Clock::TimePoint start = clock_.now();
  const StatusOr<Requeue> r = reconcile_(key);
  PassOutcome outcome = PassOutcome::kSuccess;
  if (!r.ok()) {
    logger()->warn("{} {}: {}", options_.name, key, r.status().message());
    queue_.addRateLimited(key);
    outcome = PassOutcome::kError;
  } else if (r->retry) {
    queue_.addRateLimited(key);
    outcome = PassOutcome::kRetry;
  } else {
    queue_.forget(key);
    if (r->after) {
      queue_.addAfter(key, *r->after);
      outcome = PassOutcome::kRequeue;
    }
  }
  if (onPass_) onPass_(key, outcome, clock_.now() - start);
}

}  // namespace geo::kube
