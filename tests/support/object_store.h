#pragma once
// The object store behind a test apiserver: Kubernetes semantics for any
// resource in its ResourceRegistry.
//
// One mutex guards everything (objects, the resourceVersion counter, the
// event log), so every write is atomic and resourceVersions come from one
// monotonic counter like etcd's revision. Writes run the real server's
// pipeline: preconditions (resourceVersion, uid), status-subresource
// separation, generation (bumped only when something outside metadata and
// status changes), managedFields, finalizers and deletionTimestamp, and a
// synchronous garbage collector (ownerReferences with background, foreground
// and orphan propagation; namespace and CRD clean-up). Every change appends
// one event to a bounded log that watches read; versions that fell out of
// the log answer 410 Gone. Failures throw ApiError (caught by the HTTP layer).

#include <nlohmann/json.hpp>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tests/support/resource_registry.h"
#include "tests/support/selectors.h"

namespace geo::testapi {

using Json = nlohmann::json;

// Who writes and how, for one request.
struct WriteContext {
  std::string manager;      // field manager (managedFields)
  std::string subresource;  // "" or "status"
  bool dryRun = false;      // run every check, store nothing
};

struct ListOptions {
  LabelSelector labels;
  std::optional<FieldSelector> fields;
  int64_t limit = 0;  // 0: no limit
  std::string continueToken;
};

struct DeleteOptions {
  std::string propagationPolicy;  // "", Background, Foreground, Orphan
  std::optional<std::string> preconditionUid;
  std::optional<std::string> preconditionResourceVersion;
  bool dryRun = false;
};

// One entry of the event log; `previous` is the object before a MODIFIED
// (selector-filtered watches turn it into ADDED or DELETED as needed).
// Entries are immutable once logged and shared (WatchEventPtr) between the
// log and every watch that reads them, so that a watch's read copies
// pointers, not objects.
struct WatchEvent {
  uint64_t resourceVersion = 0;
  std::string storageKey;
  std::string ns;
  std::string type;  // ADDED, MODIFIED, DELETED
  Json object;
  Json previous;
};
using WatchEventPtr = std::shared_ptr<const WatchEvent>;

class ObjectStore {
 public:
  // `retention`: how many events the log keeps; older versions are gone.
  ObjectStore(ResourceRegistry& registry, size_t retention);

  Json create(const ResourceType& type, const std::string& ns, Json object,
              const WriteContext& ctx);
  Json get(const ResourceType& type, const std::string& ns, const std::string& name) const;
  // ns "" lists across namespaces. The answer is a <Kind>List with
  // metadata.resourceVersion and, when paged, metadata.continue.
  Json list(const ResourceType& type, const std::string& ns, const ListOptions& options) const;
  // PUT: `object` replaces the stored one (or its status, for "status").
  Json update(const ResourceType& type, const std::string& ns, const std::string& name, Json object,
              const WriteContext& ctx);
  // Read-modify-write under the store's lock (PATCH, apply): `mutate` gets
  // the stored object (nullptr if there is none) and returns the object to
  // write. With `serverSideApply` the result already carries its
  // managedFields, and an absent object is created (not through /status);
  // otherwise absence is 404 and the write is tracked as an Update.
  // `*created` tells whether the object was created.
  Json modify(const ResourceType& type, const std::string& ns, const std::string& name,
              const WriteContext& ctx, const std::function<Json(const Json* current)>& mutate,
              bool serverSideApply, bool* created);
  // DELETE: marks (finalizers) or removes; answers what the server answers
  // (the object while it is pending, a Status once it is gone).
  Json remove(const ResourceType& type, const std::string& ns, const std::string& name,
              const DeleteOptions& options);
  Json removeCollection(const ResourceType& type, const std::string& ns,
                        const ListOptions& listOptions, const DeleteOptions& options);

  // The objects a watch from "now" starts with, and the version they are at.
  std::pair<std::vector<Json>, uint64_t> snapshot(const ResourceType& type,
                                                  const std::string& ns) const;
  // Events with a version above `fromRv`, waiting up to `wait` for the first.
  // nullopt when `fromRv` fell out of the log (410 Gone). `*currentRv` gets
  // the version every returned event is at or below. With `storageKey`
  // (ResourceType::storageKey()) only that resource's events come back (the
  // wait still ends at the first event of any resource).
  std::optional<std::vector<WatchEventPtr>> eventsAfter(uint64_t fromRv,
                                                        std::chrono::milliseconds wait,
                                                        uint64_t* currentRv,
                                                        const std::string& storageKey = "");
  uint64_t currentResourceVersion() const;
  // Persistence, so that a test apiserver restarted -- even killed -- keeps
  // its objects, as etcd keeps a real one's: from now on every change is
  // written through to `path` (a temporary file renamed over it) before
  // the write that made it returns. Writes the current state at once.
  // Throws geo::Error naming the file when it cannot be written.
  void persistTo(const std::string& path);
  // Replaces the store's objects with those of a file persistTo wrote, and
  // its resourceVersion counter; the CRDs among them register their
  // resources again. The watch history starts empty at the loaded version,
  // so watches and continues from older versions answer 410 Gone, as after
  // a real apiserver's restart. Throws geo::Error naming the file when it
  // cannot be read or is not such a file.
  void load(const std::string& path);
  // Drops every logged event: watches and continues from any older version
  // get 410 (etcd compaction).
  void compact();
  void setRetention(size_t events);
  // Wakes every waiting watch so the server can stop.
  void wakeWatchers();

 private:
  struct Bucket {
    std::string key;  // ResourceType::storageKey()
    std::string group;
    std::string resource;
    std::string kind;
    std::map<std::pair<std::string, std::string>, Json> objects;  // (ns, name)
  };
  // (storage key, namespace, name). Ordered like a walk of buckets_ and then
  // of each bucket's objects, so sets of keys visit objects in the order the
  // garbage collector has always visited them.
  using ObjectKey = std::tuple<std::string, std::string, std::string>;

  Bucket& bucketLocked(const ResourceType& type);
  Json* findLocked(const std::string& storageKey, const std::string& ns, const std::string& name);
  Json createLocked(const ResourceType& type, const std::string& ns, Json object,
                    const WriteContext& ctx, bool applied);
  Json updateLocked(const ResourceType& type, Json& stored, Json next, const WriteContext& ctx,
                    bool applied);
  Json removeLocked(Bucket& bucket, const std::string& ns, const std::string& name,
                    const DeleteOptions& options);
  // Stores `object` (already at a new version) over the old one and emits.
  void commitLocked(Bucket& bucket, Json object, const Json* previous);
  void eraseLocked(Bucket& bucket, const std::string& ns, const std::string& name);
  // Keep the garbage collector's indexes (below) in step with the objects;
  // commitLocked and eraseLocked, the only places that change a bucket's
  // objects, call them.
  void indexLocked(const ObjectKey& key, const Json& object);
  void unindexLocked(const ObjectKey& key, const Json& object);
  // Dependents of `uid` (objects with an ownerReference to it), in walk order.
  std::vector<ObjectKey> dependentsLocked(const std::string& uid) const;
  Json* objectLocked(const ObjectKey& key, Bucket** bucket);
  void emitLocked(const Bucket& bucket, const std::string& ns, std::string type, Json object,
                  Json previous);
  // Removes `finalizer` from the stored object (deleting it if it was the
  // last one and the object is being deleted).
  void dropFinalizerLocked(Bucket& bucket, const std::string& ns, const std::string& name,
                           const std::string& finalizer);
  // One garbage-collector step; true if it changed something.
  bool collectOnceLocked();
  void collectGarbageLocked();
  // Throws 422 for names, labels or CRDs the real server would refuse.
  void validateLocked(const ResourceType& type, const Json& object) const;

  ResourceRegistry& registry_;
  mutable std::mutex mutex_;
  std::condition_variable eventsChanged_;
  std::map<std::string, Bucket> buckets_;  // by ResourceType::storageKey()
  // Indexes of the garbage collector, which runs after every write: with
  // them a write costs what it touches, not a walk of the whole store (which
  // made every request slower as the store grew). Invariants, under mutex_:
  // - uids_: the uid of every stored object -> its key.
  // - dependents_: owner uid -> keys of the stored objects whose
  //   ownerReferences name it (the owner may be gone).
  // - deleting_: keys of the stored objects with a deletionTimestamp.
  // - orphanCandidates_: a superset of the stored objects that have
  //   ownerReferences, are not being deleted and none of whose owners exists:
  //   an object enters when it is written with ownerReferences or one of its
  //   owners is erased (the only ways to become such an object), and leaves
  //   when the collector finds it is not (or no longer) one.
  std::unordered_map<std::string, ObjectKey> uids_;
  std::unordered_map<std::string, std::set<ObjectKey>> dependents_;
  std::set<ObjectKey> deleting_;
  std::set<ObjectKey> orphanCandidates_;
  uint64_t resourceVersion_ = 1;
  std::deque<WatchEventPtr> log_;
  uint64_t compactedRv_ = 0;
  size_t retention_;
  std::string persistPath_;  // "": memory only
  // Writes every object and the version counter to persistPath_, if set.
  void persistLocked() const;
};

// RFC 3339 UTC with seconds, like metav1.Time.
std::string nowRfc3339();

// A resourceVersion query parameter as a number ("" is 0); 400 if it is not one.
uint64_t parseResourceVersion(const std::string& text);

}  // namespace geo::testapi
