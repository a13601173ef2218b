#include "controller/kube/informer.h"

#include <exception>

#include "common/enforce.h"
#include "common/logging.h"
#include "controller/kube/watch.h"

namespace geo::kube {

std::string objectKey(const nlohmann::json& object) {
  std::string ns = metadataField(object, "namespace");
  const std::string name = metadataField(object, "name");
  return ns.empty() ? name : ns + "/" + name;
}

ObjectPtr Store::get(const std::string& key) const {
  std::lock_guard lock(mu_);
  const auto it = objects_.find(key);
  return it == objects_.end() ? nullptr : it->second;
}

std::vector<ObjectPtr> Store::list() const {
  std::lock_guard lock(mu_);
  std::vector<ObjectPtr> out;
  out.reserve(objects_.size());
  for (const auto& [key, object] : objects_) out.push_back(object);
  return out;
}

std::vector<std::string> Store::keys() const {
  std::lock_guard lock(mu_);
  std::vector<std::string> out;
  out.reserve(objects_.size());
  for (const auto& [key, object] : objects_) out.push_back(key);
  return out;
}

size_t Store::size() const {
  std::lock_guard lock(mu_);
  return objects_.size();
}

ObjectPtr Store::upsert(ObjectPtr object) {
  std::string key = objectKey(*object);
  std::lock_guard lock(mu_);
  ObjectPtr& slot = objects_[std::move(key)];
  std::swap(slot, object);
  return object;
}

ObjectPtr Store::erase(const std::string& key) {
  std::lock_guard lock(mu_);
  const auto it = objects_.find(key);
  if (it == objects_.end()) return nullptr;
  ObjectPtr old = std::move(it->second);
  objects_.erase(it);
  return old;
}

std::unordered_map<std::string, ObjectPtr> Store::replace(std::vector<ObjectPtr> objects) {
  std::unordered_map<std::string, ObjectPtr> fresh;
  fresh.reserve(objects.size());
  for (ObjectPtr& object : objects) {
    std::string key = objectKey(*object);
    fresh.emplace(std::move(key), std::move(object));
  }
  std::lock_guard lock(mu_);
  std::swap(objects_, fresh);
  return fresh;
}

Informer::Informer(KubeClient& client, ResourceRef resource, std::string ns,
                   InformerOptions options)
    : client_(client),
      resource_(std::move(resource)),
      ns_(std::move(ns)),
      options_(std::move(options)) {}

Informer::~Informer() {
  stop();
}

void Informer::addHandlers(EventHandlers handlers) {
  GEO_ENFORCE(!started_, "Informer::addHandlers after start()");
  handlers_.push_back(std::move(handlers));
}

void Informer::start() {
  GEO_ENFORCE(!started_, "Informer::start() called twice");
  started_ = true;
  thread_ = std::thread([this] { run(); });
}

void Informer::stop() {
  cancel_.cancel();
  {
    std::lock_guard lock(mu_);
    syncedCv_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
}

bool Informer::waitForSync(std::chrono::milliseconds timeout) const {
  std::unique_lock lock(mu_);
  return syncedCv_.wait_for(lock, timeout, [this] { return hasSynced() || cancel_.cancelled(); }) &&
         hasSynced();
}

std::string Informer::lastResourceVersion() const {
  std::lock_guard lock(mu_);
  return resourceVersion_;
}

void Informer::setResourceVersion(std::string version) {
  std::lock_guard lock(mu_);
  resourceVersion_ = std::move(version);
}

void Informer::dispatch(const std::function<void()>& call, std::string_view what) const {
  try {
    call();
  } catch (const std::exception& e) {
    logger()->error("informer {}: {} handler threw: {}", collectionPath(resource_, ns_), what,
                    e.what());
  } catch (...) {
    logger()->error("informer {}: {} handler threw", collectionPath(resource_, ns_), what);
  }
}

bool Informer::relist() {
  Backoff delays(options_.backoff);
  ListOptions list;
  list.labelSelector = options_.labelSelector;
  list.fieldSelector = options_.fieldSelector;
  list.limit = options_.pageSize;
  while (!cancel_.cancelled()) {
    auto result = listAll(client_, resource_, ns_, list);
    if (!result.ok()) {
      logger()->warn("informer {}: list failed: {}", collectionPath(resource_, ns_),
                     result.error().toStatus().toString());
      if (!cancel_.sleepFor(delays.next())) return false;
      continue;
    }
    std::vector<ObjectPtr> objects;
    objects.reserve(result->items.size());
    for (auto& item : result->items) {
      objects.push_back(std::make_shared<const nlohmann::json>(
          options_.transform ? options_.transform(std::move(item)) : std::move(item)));
    }
    const std::vector<ObjectPtr> current = objects;
    auto previous = store_.replace(std::move(objects));
    setResourceVersion(result->resourceVersion);
    for (const ObjectPtr& object : current) {
      const auto old = previous.find(objectKey(*object));
      for (const EventHandlers& handlers : handlers_) {
        if (old == previous.end()) {
          if (handlers.onAdd) dispatch([&] { handlers.onAdd(*object); }, "add");
        } else if (metadataField(*old->second, "resourceVersion") !=
                   metadataField(*object, "resourceVersion")) {
          if (handlers.onUpdate) {
            dispatch([&] { handlers.onUpdate(*old->second, *object); }, "update");
          }
        }
      }
      if (old != previous.end()) previous.erase(old);
    }
    // What is left was deleted while the informer could not watch.
    for (const auto& [key, object] : previous) {
      for (const EventHandlers& handlers : handlers_) {
        if (handlers.onDelete) dispatch([&] { handlers.onDelete(*object); }, "delete");
      }
    }
    {
      std::lock_guard lock(mu_);
      synced_.store(true, std::memory_order_release);
      syncedCv_.notify_all();
    }
    return true;
  }
  return false;
}

void Informer::onWatchEvent(WatchEvent&& event) {
  if (std::string version = metadataField(event.object, "resourceVersion"); !version.empty()) {
    setResourceVersion(std::move(version));
  }
  if (event.type == WatchEventType::kBookmark) return;
  auto object = std::make_shared<const nlohmann::json>(
      options_.transform ? options_.transform(std::move(event.object)) : std::move(event.object));
  if (event.type == WatchEventType::kDeleted) {
    store_.erase(objectKey(*object));
    for (const EventHandlers& handlers : handlers_) {
      if (handlers.onDelete) dispatch([&] { handlers.onDelete(*object); }, "delete");
    }
    return;
  }
  const ObjectPtr old = store_.upsert(object);
  for (const EventHandlers& handlers : handlers_) {
    if (!old) {
      if (handlers.onAdd) dispatch([&] { handlers.onAdd(*object); }, "add");
    } else if (handlers.onUpdate) {
      dispatch([&] { handlers.onUpdate(*old, *object); }, "update");
    }
  }
}

void Informer::run() {
  // A server that expires every watch at once would otherwise be listed in
  // a tight loop; a watch that lasted a while resets the delay.
  Backoff relistDelays(options_.backoff);
  while (relist()) {
    const auto watchStarted = std::chrono::steady_clock::now();
    WatchOptions watch;
    watch.labelSelector = options_.labelSelector;
    watch.fieldSelector = options_.fieldSelector;
    watch.resourceVersion = lastResourceVersion();
    watch.timeout = options_.watchTimeout;
    const ApiError end = watchWithResume(
        client_, resource_, ns_, watch,
        [this](WatchEvent&& event) { onWatchEvent(std::move(event)); }, cancel_, options_.backoff);
    if (end.isCancelled()) return;
    logger()->info("informer {}: {}; listing again", collectionPath(resource_, ns_),
                   end.toStatus().toString());
    if (std::chrono::steady_clock::now() - watchStarted > std::chrono::seconds(10)) {
      relistDelays.reset();
    } else if (!cancel_.sleepFor(relistDelays.next())) {
      return;
    }
  }
}

}  // namespace geo::kube
