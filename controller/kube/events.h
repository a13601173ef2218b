#pragma once
// Kubernetes Events (core v1, which `kubectl describe` shows) about the
// controller's objects, with client-side aggregation of repeats.
//
// record() never throws and never waits for the network: it queues the event
// and a thread of the recorder posts it, so a reconcile loop can report
// without risk. Repeats of the same (object, type, reason, message) within the
// recorder's lifetime bump `count` and `lastTimestamp` of the first Event with
// a merge patch instead of creating another (a new Event is created when the
// old one has expired on the server). A full queue drops events with a
// warning; failed posts are logged, never retried beyond the client's own
// retries. Threading: every member is thread-safe. The client must outlive
// the recorder; the destructor posts what is queued, then stops.

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "controller/kube/client.h"

namespace geo::kube {

// core v1 ObjectReference of the object an Event is about.
struct ObjectReference {
  std::string apiVersion;
  std::string kind;
  std::string ns;
  std::string name;
  std::string uid;
  std::string resourceVersion;

  static ObjectReference of(const nlohmann::json& object);
  nlohmann::json toJson() const;
};

enum class EventType { kNormal, kWarning };

// Reasons are short UpperCamelCase words ("InvalidSpec", "RegionDegraded").
bool isCamelCaseReason(std::string_view reason);

class EventRecorder {
 public:
  // `component` is the source (e.g. "geotrain-controller"), `instance` the
  // reporting instance (the pod name).
  EventRecorder(KubeClient& client, std::string component, std::string instance,
                size_t maxQueued = 1000);
  ~EventRecorder();
  EventRecorder(const EventRecorder&) = delete;
  EventRecorder& operator=(const EventRecorder&) = delete;

  // Queues an Event. A reason that is not CamelCase is logged and the event
  // dropped (a bug in the caller, but not worth failing a reconcile over).
  void record(const ObjectReference& object, EventType type, std::string_view reason,
              std::string_view message) noexcept;

  // Blocks until everything queued before the call has been posted.
  void flush();

 private:
  struct Pending {
    ObjectReference object;
    EventType type;
    std::string reason;
    std::string message;
  };
  struct Posted {
    std::string ns;
    std::string name;
    int count = 0;
  };

  void run();
  void post(const Pending& event);

  KubeClient& client_;
  const std::string component_;
  const std::string instance_;
  const size_t maxQueued_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Pending> queue_;
  size_t inFlight_ = 0;
  bool stopping_ = false;
  // Aggregation key -> the Event posted for it (only the recorder's thread).
  std::unordered_map<std::string, Posted> posted_;
  std::thread thread_;
};

}  // namespace geo::kube
