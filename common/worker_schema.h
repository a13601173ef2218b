#pragma once
// The worker.yaml schema as data: one KeySpec per key, in the order toYaml()
// writes them. The same table drives the reader, `--set` (applyOverride),
// validateWorkerConfig() and toYaml() (common/worker_config.cc), so what a
// KeySpec says is what those accept; callers that need to know about a key
// (the controller's TrainingJob decoding, help texts, the CRD) ask it here
// instead of restating types, ranges or allowed values.
//
// Kept apart from worker_config.h so that the many files that only need the
// WorkerConfig struct do not depend on the table's interface.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "common/status.h"
#include "common/worker_config.h"

namespace geo {

// What a key's value is, as YAML (and JSON) write it.
enum class KeyType {
  kInteger,     // a signed 64-bit decimal integer
  kUnsigned,    // an unsigned 64-bit decimal integer (job.seed)
  kNumber,      // a finite double
  kBoolean,     // true or false
  kString,      // any scalar's text
  kStringList,  // a sequence of strings (transport.peers, transport.regions)
  kStringMap,   // a mapping of strings to strings (transport.links)
};

// One key's value. std::monostate is the word `auto` for a key that
// takesAuto, and null for one that takesNull; no key takes both.
using KeyValue = std::variant<std::monostate, int64_t, uint64_t, double, bool, std::string,
                              std::vector<std::string>, std::map<std::string, std::string>>;

// What a key admits beyond its type, as data. `allowed` (in KeySpec) says the
// same in words; both come from one rule in the table, so they agree.
struct KeyLimits {
  // Integer and number keys: bounds, inclusive unless marked exclusive (the
  // schema's integer bounds are below 2^53, so a double holds them exactly).
  std::optional<double> minimum;
  std::optional<double> maximum;
  bool exclusiveMinimum = false;
  bool exclusiveMaximum = false;
  // A number key that also takes 0 below its minimum, meaning "auto"
  // (sync.peerTimeoutSeconds).
  bool zeroAllowed = false;
  // Enumerated keys: every allowed value, as its YAML text, in the order
  // messages list them (strings such as "dts", or integers such as "4").
  std::vector<std::string> choices;
  // An enumerated string key that may also be empty (model.builtin, when
  // model.torchscript is set).
  bool emptyAllowed = false;
};

struct KeySpec {
  std::string section;  // "training"
  std::string name;     // "lr"
  std::string path;     // "training.lr", what messages and --set use
  KeyType type = KeyType::kString;
  bool takesAuto = false;  // also the word `auto` (sync.period, sync.delay)
  bool takesNull = false;  // also null, meaning "derive" (dataset.shardIndex, shardCount)
  KeyLimits limits;
  // What messages say after "allowed: ", e.g. "an integer 1..1073741824".
  // It covers rules KeyLimits does not model (a DNS label, printable UTF-8).
  std::string allowed;
  // The value of a default-constructed WorkerConfig.
  KeyValue defaultValue;
  // One line on what the key does, for help texts and generated schemas.
  std::string doc;
};

// Every key of worker.yaml, section by section in toYaml()'s order.
const std::vector<KeySpec>& workerConfigSchema();

// The section names, in toYaml()'s order.
std::vector<std::string> workerConfigSections();

// The key at `path` ("training.lr"). An unknown section or key is NotFound,
// with the parser's words without the path: "unknown key (allowed: steps,
// batchSize, ...); did you mean 'lr'?" (the section's keys, or the sections
// when the section is unknown).
StatusOr<const KeySpec*> lookupWorkerKey(std::string_view path);

// `key`'s value in `config`.
KeyValue workerKeyValue(const WorkerConfig& config, const KeySpec& key);

// `key`'s value in `config` as toYaml() writes it ("0.05", "~", "\"\"",
// "[]"); a non-empty list or map takes several lines.
std::string workerKeyYaml(const WorkerConfig& config, const KeySpec& key);

// Sets `key` from a scalar's text, read as worker.yaml and --set read it
// (applyOverride's special forms included). On error `config` is unchanged
// and the InvalidArgument names the value and what is allowed but not the
// path ("0 is not allowed (allowed: a number > 0)"), for callers that report
// the path their own way. Relations between keys are not checked.
Status setWorkerKey(WorkerConfig& config, const KeySpec& key, std::string_view text);

// The allowed values of an enumerated key in prose, for help texts: "mlp,
// cnn, resnet18 or gpt". The key must exist and have choices (a bug
// otherwise: GEO_ENFORCE).
std::string workerKeyChoices(std::string_view path);

// A problem validateWorkerConfig() finds, with the key path apart from the
// words, for callers that report per field (the controller). `path` is a key
// ("worker.rank"), an entry ("transport.peers[2]"), a section when the
// problem is between its keys ("model"), or keys written together
// ("worker.localRank/regionSize").
struct ConfigProblem {
  std::string path;
  std::string detail;  // "4 is not allowed (allowed: 0..3, below worker.worldSize = 4)"

  bool operator==(const ConfigProblem&) const = default;
};

// The first problem validateWorkerConfig() would report, or nullopt when the
// config is valid; validateWorkerConfig()'s message is "<path>: <detail>".
// Does not throw: an unexpected failure is a problem with an empty path.
std::optional<ConfigProblem> workerConfigProblem(const WorkerConfig& config);

}  // namespace geo
