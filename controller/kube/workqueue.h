#pragma once
// A work queue of object keys with client-go's semantics.
//
// - Deduplicating: a key added while it waits is queued once; a key added
//   while a worker processes it is queued again when that worker calls
//   done(), so two workers never process the same key at once and no change
//   is lost.
// - Delayed adds (addAfter) and per-key exponential backoff (addRateLimited
//   waits base * 2^failures, capped; forget() resets a key after a success).
// - shutdown(): adds are ignored from then on, delayed keys are dropped, keys
//   already queued are still handed out, and get() returns nullopt once none
//   are left, so workers finish what was pending and exit.
//
// Threading: every member is thread-safe; any number of workers may block in
// get(). Delays are served by whichever worker waits in get() (no thread of
// its own), on the queue's Clock (common/clock.h): a test that gives it a
// FakeClock decides when a delay or backoff is over. Errors: none; keys are
// opaque strings.

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "common/clock.h"

namespace geo::kube {

// Per-key exponential backoff: the n-th consecutive failure of a key waits
// min(max, base * 2^(n-1)). Thread-safe.
class ItemExponentialRateLimiter {
 public:
  explicit ItemExponentialRateLimiter(
      std::chrono::milliseconds base = std::chrono::milliseconds(5),
      std::chrono::milliseconds max = std::chrono::milliseconds(1000 * 1000));

  // The delay for this failure of `key` (and counts it).
  std::chrono::milliseconds when(const std::string& key);
  void forget(const std::string& key);
  int numRequeues(const std::string& key) const;

 private:
  std::chrono::milliseconds base_;
  std::chrono::milliseconds max_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, int> failures_;
};

class WorkQueue {
 public:
  // The backoff of addRateLimited (see ItemExponentialRateLimiter); delays
  // are measured on `clock`, which must outlive the queue.
  explicit WorkQueue(std::chrono::milliseconds baseDelay = std::chrono::milliseconds(5),
                     std::chrono::milliseconds maxDelay = std::chrono::milliseconds(1000 * 1000),
                     const Clock& clock = systemClock());
  WorkQueue(const WorkQueue&) = delete;
  WorkQueue& operator=(const WorkQueue&) = delete;

  void add(const std::string& key);
  // Adds `key` once `delay` has passed; a key already waiting keeps the
  // earlier of the two times.
  void addAfter(const std::string& key, std::chrono::milliseconds delay);
  // addAfter with the key's next backoff delay.
  void addRateLimited(const std::string& key);
  // The key succeeded: its backoff starts again from the base delay.
  void forget(const std::string& key);
  int numRequeues(const std::string& key) const;

  // Blocks until a key is ready and marks it as processing; nullopt after
  // shutdown() once the queue is empty. Every key returned needs a done().
  std::optional<std::string> get();
  // The worker finished `key` (successfully or not).
  void done(const std::string& key);

  void shutdown();
  bool shuttingDown() const;
  // Keys ready to be handed out (not the delayed or processing ones).
  size_t length() const;

 private:
  using TimePoint = Clock::TimePoint;

  void addLocked(const std::string& key);
  // Moves delayed keys that are due into the queue.
  void promoteDueLocked(TimePoint now);

  ItemExponentialRateLimiter limiter_;
  const Clock& clock_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::string> queue_;
  std::unordered_set<std::string> dirty_;       // queued or to be re-queued on done()
  std::unordered_set<std::string> processing_;  // handed out, no done() yet
  std::multimap<TimePoint, std::string> waiting_;
  std::unordered_map<std::string, TimePoint> waitingSince_;  // key -> its time in waiting_
  bool shuttingDown_ = false;
};

}  // namespace geo::kube
