#include "controller/kube/events.h"

#include <cctype>
#include <chrono>
#include <exception>

#include <fmt/format.h>

#include "common/logging.h"
#include "controller/kube/kube_time.h"

namespace geo::kube {
namespace {

using nlohmann::json;

// The API server rejects messages over 1 KiB in events.k8s.io; core v1 is
// laxer, but long messages help nobody.
constexpr size_t kMaxMessage = 1024;
// Bounds the aggregation memory; when full it starts over.
constexpr size_t kMaxAggregated = 4096;

std::string_view typeName(EventType type) {
  return type == EventType::kWarning ? "Warning" : "Normal";
}

}  // namespace

ObjectReference ObjectReference::of(const json& object) {
  ObjectReference ref;
  if (object.is_object()) {
    ref.apiVersion = object.value("apiVersion", std::string());
    ref.kind = object.value("kind", std::string());
  }
  ref.ns = metadataField(object, "namespace");
  ref.name = metadataField(object, "name");
  ref.uid = metadataField(object, "uid");
  ref.resourceVersion = metadataField(object, "resourceVersion");
  return ref;
}

json ObjectReference::toJson() const {
  json out = {{"apiVersion", apiVersion}, {"kind", kind}, {"name", name}};
  if (!ns.empty()) out["namespace"] = ns;
  if (!uid.empty()) out["uid"] = uid;
  if (!resourceVersion.empty()) out["resourceVersion"] = resourceVersion;
  return out;
}

bool isCamelCaseReason(std::string_view reason) {
  if (reason.empty() || reason.size() > 128) return false;
  if (std::isupper(static_cast<unsigned char>(reason.front())) == 0) return false;
  for (const char c : reason) {
    if (std::isalnum(static_cast<unsigned char>(c)) == 0) return false;
  }
  return true;
}

EventRecorder::EventRecorder(KubeClient& client, std::string component, std::string instance,
                             size_t maxQueued)
    : client_(client),
      component_(std::move(component)),
      instance_(std::move(instance)),
      maxQueued_(maxQueued),
      thread_([this] { run(); }) {}

EventRecorder::~EventRecorder() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
    cv_.notify_all();
  }
  thread_.join();
}

void EventRecorder::record(const ObjectReference& object, EventType type, std::string_view reason,
                           std::string_view message) noexcept {
  try {
    if (!isCamelCaseReason(reason)) {
      logger()->error("event about {}/{} dropped: reason \"{}\" is not CamelCase", object.ns,
                      object.name, reason);
      return;
    }
    std::lock_guard lock(mu_);
    if (stopping_) return;
    if (queue_.size() >= maxQueued_) {
      logger()->warn("event queue full ({}); dropped {} {} about {}/{}", maxQueued_, typeName(type),
                     reason, object.ns, object.name);
      return;
    }
    std::string text(message.substr(0, kMaxMessage));
    queue_.push_back(Pending{object, type, std::string(reason), std::move(text)});
    cv_.notify_all();
  } catch (...) {
    // Out of memory or a logging failure: the event is lost, the caller is not.
  }
}

void EventRecorder::flush() {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [this] { return queue_.empty() && inFlight_ == 0; });
}

void EventRecorder::run() {
  std::unique_lock lock(mu_);
  while (true) {
    cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, and everything is posted
    Pending event = std::move(queue_.front());
    queue_.pop_front();
    ++inFlight_;
    lock.unlock();
    try {
      post(event);
    } catch (const std::exception& e) {
      logger()->warn("posting event {} about {}/{}: {}", event.reason, event.object.ns,
                     event.object.name, e.what());
    }
    lock.lock();
    --inFlight_;
    cv_.notify_all();
  }
}

void EventRecorder::post(const Pending& event) {
  const auto now = std::chrono::system_clock::now();
  const std::string key =
      fmt::format("{}/{}/{}\x1f{}\x1f{}\x1f{}", event.object.ns, event.object.name,
                  event.object.uid, typeName(event.type), event.reason, event.message);
  // Events of cluster-scoped objects live in "default", as client-go does it.
  const std::string ns = event.object.ns.empty() ? "default" : event.object.ns;
  if (const auto it = posted_.find(key); it != posted_.end()) {
    Posted& posted = it->second;
    const json patch = {{"count", posted.count + 1}, {"lastTimestamp", formatTime(now)}};
    auto patched =
        client_.patch(resources::kEvents, posted.ns, posted.name, PatchType::kMerge, patch);
    if (patched.ok()) {
      ++posted.count;
      return;
    }
    if (!patched.error().isNotFound()) {
      logger()->warn("updating event {}/{}: {}", posted.ns, posted.name,
                     patched.error().toStatus().toString());
      return;
    }
    posted_.erase(it);  // expired on the server: post a new one
  }
  const auto nanos =
      std::chrono::duration_cast<std::chrono::nanoseconds>(now.time_since_epoch()).count();
  const std::string name = fmt::format("{}.{:x}", event.object.name, nanos);
  const json object = {
      {"apiVersion", "v1"},
      {"kind", "Event"},
      {"metadata", {{"name", name}, {"namespace", ns}}},
      {"involvedObject", event.object.toJson()},
      {"reason", event.reason},
      {"message", event.message},
      {"type", typeName(event.type)},
      {"source", {{"component", component_}}},
      {"firstTimestamp", formatTime(now)},
      {"lastTimestamp", formatTime(now)},
      {"count", 1},
      {"reportingComponent", component_},
      {"reportingInstance", instance_},
  };
  auto created = client_.create(resources::kEvents, ns, object);
  if (!created.ok()) {
    logger()->warn("posting event {} about {}/{}: {}", event.reason, event.object.ns,
                   event.object.name, created.error().toStatus().toString());
    return;
  }
  if (posted_.size() >= kMaxAggregated) posted_.clear();
  posted_.emplace(key, Posted{ns, name, 1});
}

}  // namespace geo::kube
