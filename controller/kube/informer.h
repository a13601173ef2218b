#pragma once
// Reflector + informer cache: keeps a local copy of one collection (list,
// then watch; list again when the watch's version expires) and tells
// handlers what changed, as client-go's shared informer does.
//
// Ownership: the Informer borrows the client (which must outlive it) and
// owns its thread and Store. Threading: start() runs the reflector on a
// thread of its own; handlers run on that thread, one at a time, in the
// order of the changes, and must not block for long (enqueue a key into a
// WorkQueue). Store reads are thread-safe from anywhere. stop() (and the
// destructor) cancels the watch at once and joins. A handler that throws is
// logged and the informer goes on. Errors are logged and retried with backoff;
// hasSynced() says whether the first full list has been stored.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "controller/kube/backoff.h"
#include "controller/kube/cancel.h"
#include "controller/kube/client.h"

namespace geo::kube {

using ObjectPtr = std::shared_ptr<const nlohmann::json>;

// "namespace/name", or "name" for cluster-scoped objects: the work-queue key.
std::string objectKey(const nlohmann::json& object);

// The cache: objects by key, immutable once stored (a change stores a new
// object), so readers share them without copying. Thread-safe.
class Store {
 public:
  ObjectPtr get(const std::string& key) const;
  std::vector<ObjectPtr> list() const;
  std::vector<std::string> keys() const;
  size_t size() const;

  // The reflector's writes; they return the object replaced (or removed).
  ObjectPtr upsert(ObjectPtr object);
  ObjectPtr erase(const std::string& key);
  // Swaps in a full list; returns the previous contents.
  std::unordered_map<std::string, ObjectPtr> replace(std::vector<ObjectPtr> objects);

 private:
  mutable std::mutex mu_;
  std::unordered_map<std::string, ObjectPtr> objects_;
};

struct EventHandlers {
  std::function<void(const nlohmann::json& object)> onAdd;
  std::function<void(const nlohmann::json& oldObject, const nlohmann::json& newObject)> onUpdate;
  // The last state seen: from the DELETED event, or the cached object when a
  // re-list finds it gone (the final state is then unknown).
  std::function<void(const nlohmann::json& object)> onDelete;
};

struct InformerOptions {
  std::string labelSelector;
  std::string fieldSelector;
  int64_t pageSize = 500;
  std::chrono::seconds watchTimeout{300};
  BackoffPolicy backoff{std::chrono::milliseconds(800), std::chrono::milliseconds(30000)};
  // Applied to every object before it is stored or handed to a handler (as
  // client-go's SetTransform): drop what the owner never reads (managedFields,
  // a Job's pod template) to keep the cache small. Must keep metadata.name,
  // metadata.namespace and metadata.resourceVersion.
  std::function<nlohmann::json(nlohmann::json)> transform;
};

class Informer {
 public:
  // `ns` "" watches all namespaces.
  Informer(KubeClient& client, ResourceRef resource, std::string ns, InformerOptions options = {});
  ~Informer();
  Informer(const Informer&) = delete;
  Informer& operator=(const Informer&) = delete;

  // Before start() only.
  void addHandlers(EventHandlers handlers);
  // Once.
  void start();
  // Idempotent; returns after the thread has exited.
  void stop();

  bool hasSynced() const { return synced_.load(std::memory_order_acquire); }
  // True once synced, false after `timeout` or stop().
  bool waitForSync(std::chrono::milliseconds timeout) const;
  const Store& store() const { return store_; }
  // The resourceVersion of the last list, event or bookmark.
  std::string lastResourceVersion() const;

 private:
  void run();
  // Lists everything and swaps it into the store; false when cancelled.
  bool relist();
  void onWatchEvent(WatchEvent&& event);
  void dispatch(const std::function<void()>& call, std::string_view what) const;
  void setResourceVersion(std::string version);

  KubeClient& client_;
  const ResourceRef resource_;
  const std::string ns_;
  const InformerOptions options_;
  std::vector<EventHandlers> handlers_;
  Store store_;
  CancelToken cancel_;
  std::thread thread_;
  bool started_ = false;  // start() was called (the owner's thread only)
  std::atomic<bool> synced_{false};
  mutable std::mutex mu_;
  mutable std::condition_variable syncedCv_;
  std::string resourceVersion_;
};

}  // namespace geo::kube
