#pragma once
// Faults a test switches on for one test apiserver, through C++ calls.
//
// Thread-safe: the test thread arms faults while server threads consume
// them. Every armed fault applies to requests that arrive after the call.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace geo::testapi {

// An error the server answers instead of handling the request.
struct InjectedFailure {
  int code = 500;
  int retryAfterSeconds = 0;  // 429: the Retry-After header
};

class FaultInjector {
 public:
  // Every request waits `latency` before it is handled.
  void setLatency(std::chrono::milliseconds latency);
  // The next `count` requests whose method equals `method` ("" any) and
  // whose path contains `pathContains` fail with `code` (429 answers carry
  // `Retry-After: retryAfterSeconds`, 500 an InternalError Status).
  void failNext(int count, int code, std::string method = "", std::string pathContains = "",
                int retryAfterSeconds = 1);
  // The next `count` writes (PUT, PATCH, and DELETE) of one object answer
  // 409 Conflict, as if another writer always won (a "409 storm").
  void conflictNextWrites(std::string resource, std::string ns, std::string name, int count);
  // Cuts every watch stream open now: the connection closes without the
  // final chunk, as when a load balancer drops it.
  void dropWatches();
  // Clears every fault.
  void reset();

  // Server side: the latency to apply.
  std::chrono::milliseconds latency() const;
  // Server side: the failure for this request, consuming one armed count.
  std::optional<InjectedFailure> takeFailure(const std::string& method, const std::string& path);
  // Server side: whether this write must answer 409, consuming one count.
  bool takeConflict(const std::string& resource, const std::string& ns, const std::string& name);
  // Server side: increases on every dropWatches(); a stream opened at an
  // older value is cut.
  uint64_t watchEpoch() const { return watchEpoch_.load(); }

 private:
  struct Failure {
    int remaining;
    int code;
    std::string method;
    std::string pathContains;
    int retryAfterSeconds;
  };
  struct Storm {
    std::string resource;
    std::string ns;
    std::string name;
    int remaining;
  };

  mutable std::mutex mutex_;
  std::chrono::milliseconds latency_{0};
  std::vector<Failure> failures_;
  std::vector<Storm> storms_;
  std::atomic<uint64_t> watchEpoch_{0};
};

}  // namespace geo::testapi
