#pragma once
// The synchronization algorithms a worker can run (sync.algorithm), as data:
// each one's name, what it is in a phrase, and the sync.* keys that only it
// reads. What asks about algorithms asks here -- the worker.yaml schema
// (allowed values and the key's doc line, and from them the help texts, the
// CRD and docs/worker-config.md), the synchronizer's validation, the hello
// that checks a job's workers agree (worker/app/transport_setup.cc) and
// `geotrain local`'s header -- so that adding one is an entry here and its
// synchronizer (its factory in worker/sync/synchronizer.cc, which a test
// checks covers every entry). `none` (each worker trains alone) is a value of
// the key, not an algorithm: it has no synchronizer.

#include <string>
#include <string_view>
#include <vector>

namespace geo {

struct WorkerConfig;

// One of an algorithm's own keys: its name in the sync section ("period")
// and how a one-line summary labels its value ("period K").
struct SyncAlgorithmKey {
  std::string_view key;
  std::string_view label;
};

struct SyncAlgorithm {
  std::string_view name;     // sync.algorithm's value: "dts"
  std::string_view summary;  // "delayed and temporally sparse updates"
  // The sync.* keys it reads that no other algorithm does, in the order a
  // summary lists them. Every worker of a job must agree on them.
  std::vector<SyncAlgorithmKey> ownKeys;
  // Its rounds stay in flight for D steps (sync.delay) after they leave:
  // the worker holds them -- geotrain-worker checks at start that they fit
  // its memory (worker/app/memory_plan.h) -- and its step lines show D.
  bool delayedRounds = false;
};

// Every algorithm, in the order messages list them.
const std::vector<SyncAlgorithm>& syncAlgorithms();

// The algorithm named `name`, or nullptr (`none` included).
const SyncAlgorithm* findSyncAlgorithm(std::string_view name);

// Their names, in that order.
std::vector<std::string> syncAlgorithmNames();

// The own keys of `config`'s algorithm, each with its value as worker.yaml
// writes it ("16", "auto"), in the list's order; none for `none`.
struct SyncKeyValue {
  std::string path;        // "sync.period"
  std::string_view label;  // "period K"
  std::string value;       // "auto"
};
std::vector<SyncKeyValue> ownSyncKeyValues(const WorkerConfig& config);

}  // namespace geo
