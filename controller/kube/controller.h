#pragma once
// Controller: the worker loop of a Kubernetes controller, as client-go and
// controller-runtime run it. It owns a WorkQueue (workqueue.h) of object
// keys; informers and other watchers add keys to queue(); `workers` threads
// each take a key, call the reconcile function, and put the key back as its
// answer says:
//
//   - an error Status, or Requeue::retry: again after the key's backoff
//     (addRateLimited: base * 2^failures, capped);
//   - otherwise the backoff is forgotten, and with Requeue::after the key
//     comes back that long after (addAfter); without it, only when someone
//     adds it again.
//
// The queue never hands one key to two workers at once, so the reconcile
// function may assume it is the only pass over its key. Every pass is
// reported to `onPass` (for metrics: its outcome and how long it took on the
// controller's Clock).
//
// Threading: start() once; shutdown() (or the destructor) from any thread
// other than a worker's: the queue stops taking keys, delayed keys are
// dropped, keys already queued are still reconciled, and shutdown() returns
// when every worker has finished. The reconcile function and onPass run on
// the worker threads, concurrently for different keys. Errors: the
// reconcile function's errors are logged (warning) and retried; it must not
// throw.

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "common/status.h"
#include "controller/kube/workqueue.h"

namespace geo::kube {

// What the worker does with a key after a successful pass
// (controller-runtime's reconcile.Result): control only.
struct Requeue {
  // Something failed that another pass may fix (a region that did not
  // answer, a write that conflicted): again after the key's backoff.
  bool retry = false;
  // Look again after this long even if nothing changes (polling what no
  // watch reports); nullopt: only when the key is added again.
  std::optional<std::chrono::milliseconds> after;

  friend bool operator==(const Requeue&, const Requeue&) = default;
};

// How a pass ended, as the metrics label it.
enum class PassOutcome { kSuccess, kRequeue, kRetry, kError };
// "success", "requeue", "retry", "error".
std::string_view passOutcomeName(PassOutcome outcome);

struct ControllerOptions {
  int workers = 2;  // >= 1: keys reconciled at once
  // The queue's backoff for errors and retries (ItemExponentialRateLimiter).
  std::chrono::milliseconds baseDelay{5};
  std::chrono::milliseconds maxDelay{1000 * 1000};
  // Names the controller in its log lines ("trainingjob").
  std::string name = "controller";
};

class Controller {
 public:
  using ReconcileFn = std::function<StatusOr<Requeue>(const std::string& key)>;
  using PassFn =
      std::function<void(const std::string& key, PassOutcome outcome, Clock::Duration took)>;

  // GEO_ENFORCE: options.workers >= 1 and `reconcile` set. `clock` times the
  // queue's delays and the passes, and must outlive the controller; `onPass`
  // may be empty.
  Controller(ControllerOptions options, ReconcileFn reconcile, PassFn onPass = {},
             const Clock& clock = systemClock());
  ~Controller();
  Controller(const Controller&) = delete;
  Controller& operator=(const Controller&) = delete;

  // Where keys are added (add, addAfter); valid for the controller's life.
  WorkQueue& queue() { return queue_; }

  // Starts the workers; call once.
  void start();
  // Drains and stops the workers (see above); idempotent.
  void shutdown();

 private:
  void work();
  void processOne(const std::string& key);

  const ControllerOptions options_;
  const ReconcileFn reconcile_;
  const PassFn onPass_;
  const Clock& clock_;
  WorkQueue queue_;
  std::vector<std::thread> workers_;
};

}  // namespace geo::kube
