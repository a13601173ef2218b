#include "common/worker_config.h"

#include <fmt/format.h>
#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <exception>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <limits>
#include <set>
#include <span>
#include <sstream>
#include <system_error>
#include <utility>

#include "common/names.h"
#include "common/sync_algorithms.h"
#include "common/worker_schema.h"

namespace geo {
namespace {

// The schema is one table (schema() below): every key of every section with
// its parser, its rule, its writer and its description (KeySpec). The YAML
// reader, applyOverride(), validateWorkerConfig() and toYaml() all walk that
// table, and workerConfigSchema() (worker_schema.h) hands its descriptions
// to everyone else, so a key, a limit or a message is defined once and
// nothing can drift from it.

// ---- Messages ----------------------------------------------------------------

// The length of the UTF-8 sequence at text[i] when it is one printable
// character: well formed (shortest form, no surrogate, at most U+10FFFF) and
// no C0 or C1 control character or DEL. 0 otherwise.
size_t printableCharLength(std::string_view text, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char first = byte(i);
  if (first < 0x80) return first >= 0x20 && first != 0x7f ? 1 : 0;
  size_t length = 0;
  char32_t code = 0;
  char32_t shortest = 0;
  if ((first & 0xe0) == 0xc0) {
    length = 2;
    code = first & 0x1f;
    shortest = 0x80;
  } else if ((first & 0xf0) == 0xe0) {
    length = 3;
    code = first & 0x0f;
    shortest = 0x800;
  } else if ((first & 0xf8) == 0xf0) {
    length = 4;
    code = first & 0x07;
    shortest = 0x10000;
  } else {
    return 0;
  }
  if (text.size() - i < length) return 0;
  for (size_t k = 1; k < length; ++k) {
    if ((byte(i + k) & 0xc0) != 0x80) return 0;
    code = (code << 6) | (byte(i + k) & 0x3f);
  }
  if (code < shortest || code > 0x10ffff || (code >= 0xd800 && code <= 0xdfff) ||
      (code >= 0x80 && code <= 0x9f)) {
    return 0;
  }
  return length;
}

bool isPrintableUtf8(std::string_view text) {
  for (size_t i = 0; i < text.size();) {
    const size_t length = printableCharLength(text, i);
    if (length == 0) return false;
    i += length;
  }
  return true;
}

// Text from the input as a message shows it: every byte that is not part of
// a printable UTF-8 character as \xNN, and at most about 200 bytes of it.
// Messages reach terminals, log lines and Kubernetes events: a value must not
// carry control sequences or invalid UTF-8 there, nor make a message as
// large as the input.
std::string printable(std::string_view text) {
  constexpr size_t kShownBytes = 200;
  std::string out;
  for (size_t i = 0; i < text.size();) {
    if (out.size() >= kShownBytes) {
      out += fmt::format("... ({} bytes)", text.size());
      break;
    }
    const size_t length = printableCharLength(text, i);
    if (length == 0) {
      out += fmt::format("\\x{:02x}", static_cast<unsigned char>(text[i]));
      ++i;
    } else {
      out.append(text.substr(i, length));
      i += length;
    }
  }
  return out;
}

// A value as shown in a message: printable() of it, and "" for an empty one.
std::string shown(std::string_view text) {
  if (text.empty()) return "\"\"";
  return printable(text);
}

// The one wording of a rejected value, without the key path (the caller
// prefixes it): "3 is not allowed (allowed: 2, 4, 8)".
Status notAllowed(std::string_view shownValue, std::string_view allowed) {
  return invalidArgument(fmt::format("{} is not allowed (allowed: {})", shownValue, allowed));
}

std::string join(const std::vector<std::string_view>& items) {
  return fmt::format("{}", fmt::join(items, ", "));
}

size_t editDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

// "unknown key (allowed: steps, ...); did you mean 'lr'?" The suggestion is
// the closest allowed key within two edits, if any.
std::string unknownKeyDetail(std::string_view key, const std::vector<std::string_view>& allowed) {
  std::string message = fmt::format("unknown key (allowed: {})", join(allowed));
  constexpr size_t kMaxSuggestionDistance = 2;
  size_t best = kMaxSuggestionDistance + 1;
  std::string_view suggestion;
  for (std::string_view candidate : allowed) {
    const size_t distance = editDistance(key, candidate);
    if (distance < best) {
      best = distance;
      suggestion = candidate;
    }
  }
  if (!suggestion.empty()) message += fmt::format("; did you mean '{}'?", suggestion);
  return message;
}

// "worker.yaml:12:3: training.lrr: unknown key (allowed: ...); did you mean 'lr'?"
Status unknownKey(std::string_view prefix, std::string_view path, std::string_view key,
                  const std::vector<std::string_view>& allowed) {
  return invalidArgument(fmt::format("{}{}: {}", prefix, path, unknownKeyDetail(key, allowed)));
}

// ---- Scalars -----------------------------------------------------------------
// Scalars are read by their text alone (plain or quoted alike), with the YAML
// 1.2 core schema's spellings of booleans; numbers are decimal.

template <typename Int>
std::optional<Int> parseInteger(std::string_view text) {
  if (!text.empty() && text.front() == '+') text.remove_prefix(1);
  if (text.empty() || text.front() == '+') return std::nullopt;
  Int value{};
  const char* end = text.data() + text.size();
  auto [next, error] = std::from_chars(text.data(), end, value);
  if (error != std::errc() || next != end) return std::nullopt;
  return value;
}

std::optional<double> parseNumber(std::string_view text) {
  if (!text.empty() && text.front() == '+') text.remove_prefix(1);
  if (text.empty() || text.front() == '+') return std::nullopt;
  double value = 0;
  const char* end = text.data() + text.size();
  auto [next, error] = std::from_chars(text.data(), end, value, std::chars_format::general);
  if (error != std::errc() || next != end || !std::isfinite(value)) return std::nullopt;
  return value;
}

std::optional<bool> parseBool(std::string_view text) {
  if (text == "true" || text == "True" || text == "TRUE") return true;
  if (text == "false" || text == "False" || text == "FALSE") return false;
  return std::nullopt;
}

bool isNullText(std::string_view text) {
  return text.empty() || text == "~" || text == "null" || text == "Null" || text == "NULL";
}

// Strings that a YAML reader would take for something else (a number, a
// boolean in YAML 1.1 or 1.2, null) or that are empty are written double
// quoted; the test errs on the side of quoting.
bool needsQuotes(std::string_view text) {
  if (text.empty() || isNullText(text)) return true;
  const char first = text.front();
  if ((first >= '0' && first <= '9') || first == '+' || first == '-' || first == '.') return true;
  static const std::set<std::string_view> kYamlBooleans = {
      "y",    "Y",    "yes",   "Yes",   "YES",   "n",  "N",  "no", "No",  "NO",  "true",
      "True", "TRUE", "false", "False", "FALSE", "on", "On", "ON", "off", "Off", "OFF"};
  return kYamlBooleans.contains(text);
}

void emitString(YAML::Emitter& out, const std::string& text) {
  if (needsQuotes(text)) out << YAML::DoubleQuoted;
  out << text;
}

// Shortest text that reads back as the same double ({fmt} guarantees the
// round trip).
std::string numberText(double value) {
  return fmt::format("{}", value);
}

const char* nodeKind(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Map: return "a mapping";
    case YAML::NodeType::Sequence: return "a sequence";
    case YAML::NodeType::Null: return "null";
    case YAML::NodeType::Scalar: return "a scalar";
    case YAML::NodeType::Undefined: break;
  }
  return "an undefined node";
}

// "worker.yaml:12:3: " for a node of the document being read.
std::string where(std::string_view source, const YAML::Node& node) {
  const YAML::Mark mark = node.Mark();
  if (mark.is_null()) return fmt::format("{}: ", source);
  return fmt::format("{}:{}:{}: ", source, mark.line + 1, mark.column + 1);
}

// ---- Value types and rules ---------------------------------------------------

// How values of type T are read from text, shown in messages and written,
// and what KeySpec says of them.
template <typename T>
struct ValueType {
  std::function<std::optional<T>(std::string_view)> parse;
  std::function<std::string(const T&)> show;
  std::function<void(YAML::Emitter&, const T&)> emit;
  KeyType type = KeyType::kString;
  bool takesAuto = false;
  bool takesNull = false;
};

// Which values of type T a key admits: `accepts` decides, `allowed` is what
// messages and the docs say, `limits` is the same as data (KeySpec). Each
// rule below makes all three from the same numbers or names.
template <typename T>
struct Rule {
  std::string allowed;
  std::function<bool(const T&)> accepts;
  KeyLimits limits = {};
};

// A key's value as KeySpec hands it out.
KeyValue toKeyValue(int64_t v) {
  return v;
}
KeyValue toKeyValue(uint64_t v) {
  return v;
}
KeyValue toKeyValue(double v) {
  return v;
}
KeyValue toKeyValue(bool v) {
  return v;
}
KeyValue toKeyValue(const std::string& v) {
  return v;
}
KeyValue toKeyValue(const std::optional<int64_t>& v) {
  return v ? KeyValue(*v) : KeyValue();
}
KeyValue toKeyValue(const std::vector<std::string>& v) {
  return v;
}
KeyValue toKeyValue(const std::map<std::string, std::string>& v) {
  return v;
}

ValueType<int64_t> integerType() {
  return {parseInteger<int64_t>, [](const int64_t& v) { return fmt::format("{}", v); },
          [](YAML::Emitter& out, const int64_t& v) { out << fmt::format("{}", v); },
          KeyType::kInteger};
}

ValueType<uint64_t> unsignedType() {
  return {parseInteger<uint64_t>, [](const uint64_t& v) { return fmt::format("{}", v); },
          [](YAML::Emitter& out, const uint64_t& v) { out << fmt::format("{}", v); },
          KeyType::kUnsigned};
}

ValueType<double> numberType() {
  return {parseNumber, numberText,
          [](YAML::Emitter& out, const double& v) { out << numberText(v); }, KeyType::kNumber};
}

ValueType<bool> boolType() {
  return {parseBool, [](const bool& v) { return std::string(v ? "true" : "false"); },
          [](YAML::Emitter& out, const bool& v) { out << (v ? "true" : "false"); },
          KeyType::kBoolean};
}

ValueType<std::string> stringType() {
  return {[](std::string_view text) { return std::optional<std::string>(text); }, shown, emitString,
          KeyType::kString};
}

// dataset.shardIndex / shardCount: null (written ~) means "derive".
ValueType<std::optional<int64_t>> optionalIntegerType() {
  return {[](std::string_view text) -> std::optional<std::optional<int64_t>> {
            if (isNullText(text)) return std::optional<int64_t>();
            auto value = parseInteger<int64_t>(text);
            if (!value) return std::nullopt;
            return std::optional<int64_t>(*value);
          },
          [](const std::optional<int64_t>& v) {
            return v ? fmt::format("{}", *v) : std::string("null");
          },
          [](YAML::Emitter& out, const std::optional<int64_t>& v) {
            if (v) {
              out << fmt::format("{}", *v);
            } else {
              out << YAML::Null;
            }
          },
          KeyType::kInteger,
          /*takesAuto=*/false,
          /*takesNull=*/true};
}

// sync.delay and sync.period: a step count or `auto` (nullopt).
constexpr std::string_view kAuto = "auto";

ValueType<std::optional<int64_t>> delayType() {
  return {[](std::string_view text) -> std::optional<std::optional<int64_t>> {
            if (text == kAuto) return std::optional<int64_t>();
            auto value = parseInteger<int64_t>(text);
            if (!value) return std::nullopt;
            return std::optional<int64_t>(*value);
          },
          [](const std::optional<int64_t>& v) {
            return v ? fmt::format("{}", *v) : std::string(kAuto);
          },
          [](YAML::Emitter& out, const std::optional<int64_t>& v) {
            out << (v ? fmt::format("{}", *v) : std::string(kAuto));
          },
          KeyType::kInteger,
          /*takesAuto=*/true};
}

// --set transport.peers=a,b,c (optionally [a, b, c]); empty: no peers.
std::optional<std::vector<std::string>> parseEndpointList(std::string_view text) {
  auto trim = [](std::string_view s) {
    const auto begin = s.find_first_not_of(" \t");
    if (begin == std::string_view::npos) return std::string_view();
    return s.substr(begin, s.find_last_not_of(" \t") - begin + 1);
  };
  text = trim(text);
  if (text.size() >= 2 && text.front() == '[' && text.back() == ']') {
    text = trim(text.substr(1, text.size() - 2));
  }
  std::vector<std::string> endpoints;
  if (text.empty()) return endpoints;
  size_t start = 0;
  while (true) {
    const size_t comma = text.find(',', start);
    endpoints.emplace_back(trim(text.substr(start, comma - start)));
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return endpoints;
}

bool isEndpoint(const std::string& endpoint) {
  return !endpoint.empty() && endpoint.find_first_of(" \t\n,") == std::string::npos;
}

ValueType<std::vector<std::string>> endpointListType() {
  return {parseEndpointList,
          [](const std::vector<std::string>& v) {
            std::vector<std::string> items;
            items.reserve(v.size());
            for (const std::string& endpoint : v) items.push_back(shown(endpoint));
            return fmt::format("[{}]", fmt::join(items, ", "));
          },
          [](YAML::Emitter& out, const std::vector<std::string>& v) {
            if (v.empty()) {
              out << YAML::Flow << YAML::BeginSeq << YAML::EndSeq;
              return;
            }
            out << YAML::BeginSeq;
            for (const std::string& endpoint : v) emitString(out, endpoint);
            out << YAML::EndSeq;
          },
          KeyType::kStringList};
}

using LinkMap = std::map<std::string, std::string>;

// As a --set value, transport.links takes only "" or {} (remove all links);
// single links are set with transport.links.<name>.
ValueType<LinkMap> linkMapType() {
  return {[](std::string_view text) -> std::optional<LinkMap> {
            if (text.empty() || text == "{}") return LinkMap();
            return std::nullopt;
          },
          [](const LinkMap& v) {
            std::vector<std::string> items;
            for (const auto& [name, profile] : v) {
              items.push_back(fmt::format("{}: {}", shown(name), shown(profile)));
            }
            return fmt::format("{{{}}}", fmt::join(items, ", "));
          },
          [](YAML::Emitter& out, const LinkMap& v) {
            if (v.empty()) {
              out << YAML::Flow << YAML::BeginMap << YAML::EndMap;
              return;
            }
            out << YAML::BeginMap;
            for (const auto& [name, profile] : v) {
              out << YAML::Key;
              emitString(out, name);
              out << YAML::Value;
              emitString(out, profile);
            }
            out << YAML::EndMap;
          },
          KeyType::kStringMap};
}

// KeyLimits of a range; nullopt bounds are open.
KeyLimits range(std::optional<double> minimum, std::optional<double> maximum,
                bool exclusiveMinimum = false, bool exclusiveMaximum = false) {
  KeyLimits limits;
  limits.minimum = minimum;
  limits.maximum = maximum;
  limits.exclusiveMinimum = exclusiveMinimum;
  limits.exclusiveMaximum = exclusiveMaximum;
  return limits;
}

Rule<int64_t> atLeast(int64_t minimum) {
  return {fmt::format("an integer >= {}", minimum),
          [minimum](const int64_t& v) { return v >= minimum; },
          range(static_cast<double>(minimum), std::nullopt)};
}

Rule<int64_t> between(int64_t minimum, int64_t maximum) {
  return {fmt::format("an integer {}..{}", minimum, maximum),
          [minimum, maximum](const int64_t& v) { return v >= minimum && v <= maximum; },
          range(static_cast<double>(minimum), static_cast<double>(maximum))};
}

Rule<int64_t> oneOf(std::vector<int64_t> list) {
  KeyLimits limits;
  for (int64_t v : list) limits.choices.push_back(fmt::format("{}", v));
  return {fmt::format("{}", fmt::join(list, ", ")),
          [list](const int64_t& v) { return std::find(list.begin(), list.end(), v) != list.end(); },
          std::move(limits)};
}

Rule<std::string> oneOf(std::span<const std::string_view> names, bool emptyAllowed = false) {
  std::vector<std::string_view> list(names.begin(), names.end());
  KeyLimits limits;
  limits.choices.assign(names.begin(), names.end());
  limits.emptyAllowed = emptyAllowed;
  return {join(list),
          [list, emptyAllowed](const std::string& v) {
            if (v.empty()) return emptyAllowed;
            return std::find(list.begin(), list.end(), v) != list.end();
          },
          std::move(limits)};
}

Rule<std::string> oneOf(std::initializer_list<std::string_view> names, bool emptyAllowed = false) {
  return oneOf(std::span<const std::string_view>(names.begin(), names.size()), emptyAllowed);
}

// sync.algorithm's values: `none`, then the algorithms (sync_algorithms.h).
std::span<const std::string_view> algorithmValues() {
  static const std::vector<std::string_view> kValues = [] {
    std::vector<std::string_view> v = {"none"};
    for (const SyncAlgorithm& a : syncAlgorithms()) v.push_back(a.name);
    return v;
  }();
  return kValues;
}

// sync.algorithm's doc line: each value and what it is.
std::string algorithmDoc() {
  std::string doc = "`none`: every worker trains alone";
  for (const SyncAlgorithm& a : syncAlgorithms())
    doc += fmt::format("; `{}`: {}", a.name, a.summary);
  return doc + ".";
}

Rule<std::string> anyString() {
  return {"a string", [](const std::string&) { return true; }};
}

Rule<std::string> nonEmptyString() {
  return {"a non-empty string", [](const std::string& v) { return !v.empty(); }};
}

// Region names become metrics labels, link keys and Kubernetes names.
std::string regionNameAllowed() {
  return dnsLabelAllowed("a region name");
}

Rule<std::string> regionName() {
  return {regionNameAllowed(), [](const std::string& v) { return isDnsLabel(v); }};
}

// job.id becomes a metrics label; the controller writes namespace/name/uid.
Rule<std::string> jobIdRule() {
  return {fmt::format("1 to {} bytes of printable UTF-8 (no control characters)", kMaxJobIdBytes),
          [](const std::string& v) {
            return !v.empty() && v.size() <= kMaxJobIdBytes && isPrintableUtf8(v);
          }};
}

// *Seconds keys (kMinSeconds, kMaxSeconds): the runtime counts in int64
// milliseconds. With zeroMeansAuto, 0 is allowed too (and means "auto").
Rule<double> seconds(double minimum, bool zeroMeansAuto = false) {
  KeyLimits limits = range(minimum, kMaxSeconds);
  limits.zeroAllowed = zeroMeansAuto;
  return {fmt::format("{}a number of seconds in [{}, {}]", zeroMeansAuto ? "0 (auto), or " : "",
                      minimum, kMaxSeconds),
          [minimum, zeroMeansAuto](const double& v) {
            return (zeroMeansAuto && v == 0) || (v >= minimum && v <= kMaxSeconds);
          },
          std::move(limits)};
}

Rule<double> above(double minimum) {
  return {fmt::format("a number > {}", minimum), [minimum](const double& v) { return v > minimum; },
          range(minimum, std::nullopt, /*exclusiveMinimum=*/true)};
}

Rule<double> atLeastNumber(double minimum) {
  return {fmt::format("a number >= {}", minimum),
          [minimum](const double& v) { return v >= minimum; }, range(minimum, std::nullopt)};
}

Rule<bool> anyBool() {
  return {"true, false", [](const bool&) { return true; }};
}

// ---- The schema table -----------------------------------------------------------

struct Field {
  // What the key is, for workerConfigSchema(); buildSchema() fills in the
  // section, the path and the default.
  KeySpec spec;
  std::function<KeyValue(const WorkerConfig&)> get;
  // Parses a scalar's text (YAML or --set), checks it and stores it; on error
  // `config` is unchanged and the message lacks the key path.
  std::function<Status(WorkerConfig&, std::string_view)> setText;
  // For keys whose YAML value is a sequence or mapping (peers, links): sets
  // from such a node, reporting errors in full (position and path).
  std::function<Status(WorkerConfig&, const YAML::Node&, std::string_view source,
                       const std::string& path)>
      setCollection;
  // For mapping keys (links): sets or, with an empty value, removes one entry
  // (--set transport.links.<entry>=<value>).
  std::function<Status(WorkerConfig&, const std::string& entry, std::string_view value)> setEntry;
  // Checks the current value; the message lacks the key path.
  std::function<Status(const WorkerConfig&)> check;
  std::function<void(const WorkerConfig&, YAML::Emitter&)> emit;
};

struct Section {
  std::string_view name;
  std::vector<Field> fields;

  const Field* find(std::string_view key) const {
    for (const Field& field : fields) {
      if (field.spec.name == key) return &field;
    }
    return nullptr;
  }
  std::vector<std::string_view> keys() const {
    std::vector<std::string_view> result;
    for (const Field& field : fields) result.push_back(field.spec.name);
    return result;
  }
};

// A key stored at config.*section.*member; `doc` is its line in KeySpec.
// `afterSet` runs after a successful set (model.builtin and
// model.torchscript clear each other).
template <typename S, typename T>
Field makeField(std::string_view key, S WorkerConfig::*section, T S::*member, ValueType<T> type,
                Rule<T> rule, std::string_view doc,
                const std::function<void(WorkerConfig&)>& afterSet = {}) {
  Field field;
  field.spec.name = std::string(key);
  field.spec.type = type.type;
  field.spec.takesAuto = type.takesAuto;
  field.spec.takesNull = type.takesNull;
  field.spec.limits = rule.limits;
  field.spec.allowed = rule.allowed;
  field.spec.doc = std::string(doc);
  field.get = [=](const WorkerConfig& config) { return toKeyValue((config.*section).*member); };
  field.setText = [=](WorkerConfig& config, std::string_view text) -> Status {
    std::optional<T> value = type.parse(text);
    if (!value || !rule.accepts(*value)) return notAllowed(shown(text), rule.allowed);
    (config.*section).*member = std::move(*value);
    if (afterSet) afterSet(config);
    return {};
  };
  field.check = [=](const WorkerConfig& config) -> Status {
    const T& value = (config.*section).*member;
    if (rule.accepts(value)) return {};
    return notAllowed(type.show(value), rule.allowed);
  };
  field.emit = [=](const WorkerConfig& config, YAML::Emitter& out) {
    type.emit(out, (config.*section).*member);
  };
  return field;
}

using W = WorkerConfig;

// A list of strings (YAML sequence, or comma-separated in --set), one per
// rank: at most kMaxWorldSize items, each satisfying `itemOk`; `itemAllowed`
// describes one item.
Field listField(std::string_view key, std::vector<std::string> W::Transport::*member,
                const std::string& listAllowed, const std::string& itemAllowed,
                const std::function<bool(const std::string&)>& itemOk, std::string_view doc) {
  Rule<std::vector<std::string>> rule{listAllowed, [itemOk](const std::vector<std::string>& v) {
                                        return static_cast<int64_t>(v.size()) <= kMaxWorldSize &&
                                               std::all_of(v.begin(), v.end(), itemOk);
                                      }};
  Field field = makeField(key, &W::transport, member, endpointListType(), rule, doc);
  field.setCollection = [=](WorkerConfig& config, const YAML::Node& node, std::string_view source,
                            const std::string& path) -> Status {
    if (!node.IsSequence()) {
      return invalidArgument(fmt::format("{}{}: {} is not allowed (allowed: {})",
                                         where(source, node), path, nodeKind(node), listAllowed));
    }
    if (static_cast<int64_t>(node.size()) > kMaxWorldSize) {
      return invalidArgument(
          fmt::format("{}{}: {} entries is not allowed (allowed: at most {}, one per rank: "
                      "worker.worldSize is at most {})",
                      where(source, node), path, node.size(), kMaxWorldSize, kMaxWorldSize));
    }
    std::vector<std::string> items;
    for (size_t i = 0; i < node.size(); ++i) {
      const YAML::Node item = node[i];
      const std::string itemPath = fmt::format("{}[{}]", path, i);
      if (!item.IsScalar()) {
        return invalidArgument(fmt::format("{}{}: {} is not allowed (allowed: {})",
                                           where(source, item), itemPath, nodeKind(item),
                                           itemAllowed));
      }
      if (!itemOk(item.Scalar())) {
        return invalidArgument(fmt::format("{}{}: {} is not allowed (allowed: {})",
                                           where(source, item), itemPath, shown(item.Scalar()),
                                           itemAllowed));
      }
      items.push_back(item.Scalar());
    }
    config.transport.*member = std::move(items);
    return {};
  };
  return field;
}

Field peersField() {
  return listField(
      "peers", &W::Transport::peers,
      fmt::format("a list of endpoints such as tcp://host:7000, one per rank, at "
                  "most {}",
                  kMaxWorldSize),
      "an endpoint such as tcp://host:7000, without spaces or commas, or none",
      [](const std::string& e) { return e == "none" || isEndpoint(e); },
      "Endpoint of every rank, in rank order: empty, or exactly `worker.worldSize` endpoints "
      "without spaces or commas (entry `rank` is this worker, never `none`). `none`: this worker "
      "never talks to that rank and does not connect to it (under hierarchical sync, another "
      "region's member; a message to it is an error).");
}

Field regionsField() {
  return listField(
      "regions", &W::Transport::regions,
      fmt::format("a list of region names (lowercase DNS labels such as us-east), "
                  "one per rank, at most {}",
                  kMaxWorldSize),
      regionNameAllowed(), [](const std::string& v) { return isDnsLabel(v); },
      "Region of every rank, in rank order: empty, or exactly `worker.worldSize` names. Peers in "
      "another region are across the WAN (`links` and `uplink` apply to them); the first rank of "
      "each region leads it. Entry `rank` must equal `worker.region`, and `worker.localRank` / "
      "`regionSize` must match the list. Empty: all ranks are in `worker.region`.");
}

constexpr std::string_view kLinkAllowed =
    "a mapping of regionA-regionB: link profile such as delay=50ms,rate=20mbit";

Field linksField() {
  Rule<LinkMap> rule{std::string(kLinkAllowed), [](const LinkMap& v) {
                       return std::none_of(v.begin(), v.end(),
                                           [](const auto& link) { return link.first.empty(); });
                     }};
  Field field = makeField(
      "links", &W::transport, &W::Transport::links, linkMapType(), rule,
      "Emulated WAN links between regions, e.g. `london-tokyo: delay=120ms,rate=50mbit`, applied "
      "to traffic from this worker to ranks of the other region (either order of the names). The "
      "worker parses the profiles (`delay=…us/ms/s`, `rate=…bit/kbit/mbit/gbit`, `burst=…b/kb/mb`; "
      "see docs/wan-emulation.md). `--set transport.links.<regionA-regionB>=<profile>` sets one.");
  // As a --set value only "" / {} (remove all links) parse; say how to set
  // one. KeySpec.allowed keeps the YAML form, which the reference lists.
  field.setText = [](WorkerConfig& config, std::string_view text) -> Status {
    if (!text.empty() && text != "{}") {
      return notAllowed(shown(text),
                        "\"\" or {} to remove all links; set one with "
                        "transport.links.<regionA-regionB>");
    }
    config.transport.links.clear();
    return {};
  };
  field.setCollection = [](WorkerConfig& config, const YAML::Node& node, std::string_view source,
                           const std::string& path) -> Status {
    if (!node.IsMap()) {
      return invalidArgument(fmt::format("{}{}: {} is not allowed (allowed: {})",
                                         where(source, node), path, nodeKind(node), kLinkAllowed));
    }
    LinkMap links;
    for (const auto& entry : node) {
      const YAML::Node& name = entry.first;
      const YAML::Node& profile = entry.second;
      if (!name.IsScalar() || name.Scalar().empty()) {
        return invalidArgument(
            fmt::format("{}{}: {} key is not allowed (allowed: {})", where(source, name), path,
                        name.IsScalar() ? "an empty" : nodeKind(name), kLinkAllowed));
      }
      const std::string entryPath = fmt::format("{}.{}", path, printable(name.Scalar()));
      if (links.contains(name.Scalar())) {
        return invalidArgument(fmt::format("{}{}: duplicate key", where(source, name), entryPath));
      }
      if (!profile.IsNull() && !profile.IsScalar()) {
        return invalidArgument(
            fmt::format("{}{}: {} is not allowed (allowed: a link profile string such as "
                        "delay=50ms,rate=20mbit)",
                        where(source, profile), entryPath, nodeKind(profile)));
      }
      links[name.Scalar()] = profile.IsNull() ? std::string() : profile.Scalar();
    }
    config.transport.links = std::move(links);
    return {};
  };
  field.setEntry = [](WorkerConfig& config, const std::string& entry,
                      std::string_view value) -> Status {
    if (value.empty()) {
      config.transport.links.erase(entry);
    } else {
      config.transport.links[entry] = std::string(value);
    }
    return {};
  };
  return field;
}

std::vector<Section> buildSchema() {
  const auto integer = integerType();
  const auto number = numberType();
  const auto boolean = boolType();
  const auto string = stringType();
  const auto optionalInteger = optionalIntegerType();

  auto shardRule = [](int64_t minimum) {
    return Rule<std::optional<int64_t>>{
        fmt::format("an integer >= {}, or null to derive it from the worker", minimum),
        [minimum](const std::optional<int64_t>& v) { return !v || *v >= minimum; },
        range(static_cast<double>(minimum), std::nullopt)};
  };
  const Rule<std::optional<int64_t>> delayRule{
      "an integer >= 0, or auto", [](const std::optional<int64_t>& v) { return !v || *v >= 0; },
      range(0, std::nullopt)};
  const Rule<std::optional<int64_t>> periodRule{
      "an integer >= 1, or auto", [](const std::optional<int64_t>& v) { return !v || *v >= 1; },
      range(1, std::nullopt)};
  const Rule<double> unitInterval{"a number in [0, 1)",
                                  [](const double& v) { return v >= 0 && v < 1; },
                                  range(0, 1, false, /*exclusiveMaximum=*/true)};
  const Rule<double> gammaRule{"a number in (0, 1]",
                               [](const double& v) { return v > 0 && v <= 1; },
                               range(0, 1, /*exclusiveMinimum=*/true)};
  const Rule<uint64_t> seedRule{
      fmt::format("an integer 0..{}", std::numeric_limits<uint64_t>::max()),
      [](const uint64_t&) { return true; }, range(0, std::nullopt)};
  const auto clearTorchscript = [](WorkerConfig& c) {
    if (!c.model.builtin.empty()) c.model.torchscript.clear();
  };
  const auto clearBuiltin = [](WorkerConfig& c) {
    if (!c.model.torchscript.empty()) c.model.builtin.clear();
  };

  std::vector<Section> schema;
  schema.push_back(
      {"job",
       {makeField("id", &W::job, &W::Job::id, string, jobIdRule(),
                  "Job name; its hash is in every frame header, so workers of different jobs never "
                  "mix. It is the `job` label of the metrics."),
        makeField("seed", &W::job, &W::Job::seed, unsignedType(), seedRule,
                  "Seeds model initialization, data order and QSGD's stochastic rounding.")}});
  schema.push_back(
      {"worker",
       {makeField("rank", &W::worker, &W::Worker::rank, integer, between(0, kMaxWorldSize - 1),
                  "Global rank of this worker, below `worker.worldSize`."),
        makeField("worldSize", &W::worker, &W::Worker::worldSize, integer,
                  between(1, kMaxWorldSize), "Number of workers in the job, all regions together."),
        makeField("region", &W::worker, &W::Worker::region, string, regionName(),
                  "Region this worker runs in (`london`, `tokyo`, …); the `region` label of the "
                  "metrics."),
        makeField("localRank", &W::worker, &W::Worker::localRank, integer,
                  between(0, kMaxWorldSize - 1),
                  "Index inside the region, below `worker.regionSize`; 0 is the region leader, the "
                  "only worker that talks across the WAN."),
        makeField("regionSize", &W::worker, &W::Worker::regionSize, integer,
                  between(1, kMaxWorldSize),
                  "Number of workers in this worker's region, at most `worker.worldSize`.")}});
  schema.push_back(
      {"model",
       {makeField("builtin", &W::model, &W::Model::builtin, string,
                  oneOf({"mlp", "cnn", "resnet18", "gpt"}, /*emptyAllowed=*/true),
                  "A built-in architecture; empty when `model.torchscript` is set. `gpt`: a "
                  "decoder-only transformer on token ids (`dataset.name: tokens`).",
                  clearTorchscript),
        makeField("torchscript", &W::model, &W::Model::torchscript, string, anyString(),
                  "A TorchScript model file instead of a built-in one, inside the worker image or "
                  "a mounted volume (docs/data-and-models.md: what it must compute); empty: a "
                  "built-in model.",
                  clearBuiltin),
        makeField("classes", &W::model, &W::Model::classes, integer, between(0, kMaxClasses),
                  "The model's outputs. `0` takes them from the data: 10 for the packaged data "
                  "sets; for `npy`, the largest training label + 1, or the regression targets per "
                  "sample. A label at or above a set count is an error naming the file. For "
                  "`tokens`, the vocabulary (0: 256, bytes, or the largest id + 1)."),
        makeField("width", &W::model, &W::Model::width, integer, between(0, kMaxModelWidth),
                  "The `mlp`'s hidden units and the `gpt`'s embedding width; `0` takes the model's "
                  "default (256, 128)."),
        makeField("layers", &W::model, &W::Model::layers, integer, between(1, kMaxModelLayers),
                  "The `gpt`'s transformer blocks."),
        makeField("heads", &W::model, &W::Model::heads, integer, between(1, kMaxModelLayers),
                  "The `gpt`'s attention heads; they divide its width."),
        makeField("context", &W::model, &W::Model::context, integer, between(1, kMaxContext),
                  "The `gpt`'s context in tokens: the windows of `tokens` it trains and is "
                  "evaluated on.")}});
  schema.push_back(
      {"dataset",
       {makeField("name", &W::dataset, &W::Dataset::name, string,
                  oneOf({"fashion-mnist", "mnist", "cifar10", "synthetic", "npy", "tokens"}),
                  "Data set. `synthetic` generates random samples (tests, benchmarks); `npy` is "
                  "your own arrays, `{train,test}_{x,y}.npy`; `tokens` a corpus as token ids, "
                  "`train.bin` and `val.bin` (docs/data-and-models.md)."),
        makeField("path", &W::dataset, &W::Dataset::path, string, anyString(),
                  "Folder with the data set's files in this region, in the worker's file system; "
                  "`npy` and `tokens` need one. Empty: where the Debian package installs it, "
                  "`/usr/share/datasets/<name>`."),
        makeField(
            "sharding", &W::dataset, &W::Dataset::sharding, string,
            oneOf({"auto", "job", "region"}),
            "How the shards are derived: `job`, one copy of the data for the whole job (shard "
            "`worker.rank` of `worker.worldSize`); `region`, each region has samples of its own "
            "(shard `worker.localRank` of `worker.regionSize`, so the region's workers read all of "
            "its copy); `auto`, decided by the controller (`region` for a region with its own "
            "`dataPath`) or by `geotrain local` (`region` when `dataset.path` contains "
            "`{region}`); a worker run by hand reads `auto` as `job`."),
        makeField("shardIndex", &W::dataset, &W::Dataset::shardIndex, optionalInteger, shardRule(0),
                  "Shard this worker reads, below the shard count; null derives it as "
                  "`dataset.sharding` says."),
        makeField(
            "shardCount", &W::dataset, &W::Dataset::shardCount, optionalInteger, shardRule(1),
            "Number of shards the data is cut into; null derives it as `dataset.sharding` says."),
        makeField("syntheticSamples", &W::dataset, &W::Dataset::syntheticSamples, integer,
                  between(1, kMaxSyntheticSamples),
                  "Size of the `synthetic` data set, generated in memory (3 KiB a sample: 1000000 "
                  "take about 3 GiB)."),
        makeField("tokenBytes", &W::dataset, &W::Dataset::tokenBytes, integer,
                  oneOf(std::vector<int64_t>{2, 4}),
                  "`tokens`: bytes per token id in `train.bin` and `val.bin` (little-endian uint16 "
                  "or uint32).")}});
  schema.push_back(
      {"training",
       {makeField("steps", &W::training, &W::Training::steps, integer, atLeast(1),
                  "Local optimizer steps to run."),
        makeField("batchSize", &W::training, &W::Training::batchSize, integer, atLeast(1),
                  "Samples per step and worker."),
        makeField("optimizer", &W::training, &W::Training::optimizer, string,
                  oneOf({"sgd", "adam"}), "Optimizer; its state stays local to each worker."),
        makeField("lr", &W::training, &W::Training::lr, number, above(0),
                  "Learning rate (peak, after warm-up)."),
        makeField("momentum", &W::training, &W::Training::momentum, number, unitInterval,
                  "SGD momentum (ignored by `adam`)."),
        makeField("nesterov", &W::training, &W::Training::nesterov, boolean, anyBool(),
                  "Nesterov momentum for `sgd`. On by default: it reached the target in a fifth to "
                  "a quarter fewer steps under `allreduce` and `dts` (delayed updates or not), and "
                  "ended higher under `swarm` (docs/benchmarks.md; why: docs/architecture.md §3)."),
        makeField("weightDecay", &W::training, &W::Training::weightDecay, number, atLeastNumber(0),
                  "L2 weight decay."),
        makeField("schedule", &W::training, &W::Training::schedule, string,
                  oneOf({"constant", "cosine", "step"}), "Learning-rate schedule after warm-up."),
        makeField("warmupSteps", &W::training, &W::Training::warmupSteps, integer, atLeast(0),
                  "Linear warm-up from 0 to `lr` over this many steps."),
        makeField("stepSize", &W::training, &W::Training::stepSize, integer, atLeast(1),
                  "`step` schedule: multiply the rate by `stepGamma` every `stepSize` steps."),
        makeField("stepGamma", &W::training, &W::Training::stepGamma, number, gammaRule,
                  "`step` schedule factor."),
        makeField("gradClip", &W::training, &W::Training::gradClip, number, atLeastNumber(0),
                  "Clip the global gradient L2 norm to this; 0 turns clipping off."),
        makeField("evalInterval", &W::training, &W::Training::evalInterval, integer, atLeast(0),
                  "Evaluate every this many steps; 0 evaluates only at the end."),
        makeField(
            "evalBacklog", &W::training, &W::Training::evalBacklog, integer,
            between(0, kMaxEvalBacklog),
            "Snapshots that may wait while the background evaluation runs (each costs a copy of "
            "the parameters); 0 skips a periodic evaluation that finds one running. With a backlog "
            "every snapshot is evaluated, late if need be, and those still waiting at the end are "
            "evaluated (and reported with their own step) before the final evaluation."),
        makeField("logInterval", &W::training, &W::Training::logInterval, integer, atLeast(0),
                  "Log a progress line every this many steps; 0 turns them off."),
        makeField("device", &W::training, &W::Training::device, string,
                  oneOf({"auto", "cpu", "cuda"}),
                  "`auto` uses a GPU when there is one. A TrainingJob's regions whose pods ask for "
                  "`nvidia.com/gpu` get `cuda` for `auto`, and `cuda` needs every region to ask "
                  "for one (docs/kubernetes.md#gpu-workers)."),
        makeField(
            "loss", &W::training, &W::Training::loss, string,
            oneOf({"cross-entropy", "mse", "next-token"}),
            "`cross-entropy` over class logits for integer labels; `mse` (mean squared error) for "
            "float targets, a regression; `next-token`, the cross-entropy of every position's next "
            "token, for `tokens` (and only there). It must fit the data's targets; evaluations "
            "report the test loss with each (for `next-token` the validation loss, also in bits "
            "per token in the log), and the accuracy with `cross-entropy`."),
        makeField("threads", &W::training, &W::Training::threads, integer, between(0, kMaxThreads),
                  "Intra-op CPU threads; 0 keeps the library's default.")}});
  schema.push_back(
      {"sync",
       {makeField("algorithm", &W::sync, &W::Sync::algorithm, string, oneOf(algorithmValues()),
                  algorithmDoc()),
        makeField("period", &W::sync, &W::Sync::period, delayType(), periodRule,
                  "DTS period K: local steps per round; `auto` lets the workers agree at run time "
                  "on the K whose rounds the measured uplink carries in at most half their time "
                  "(starting from 16)."),
        makeField("delay", &W::sync, &W::Sync::delay, delayType(), delayRule,
                  "DTS delay D in steps before a round's average is applied; `auto` picks the "
                  "smallest D that hides the measured link latency."),
        makeField("exchange", &W::sync, &W::Sync::exchange, string,
                  oneOf({"allgather", "reducescatter", "auto"}),
                  "DTS: how a round's contributions meet. `allgather`: each worker's whole "
                  "contribution to every other, one hop, N − 1 payloads up each uplink a round; "
                  "`reducescatter`: each worker's shard s to the worker that owns it, which sends "
                  "the shard's mean to every other, two hops, 2 (N − 1) / N payloads; `auto`: "
                  "all-gather at the start, then whichever of the two the measured uplink, links "
                  "and codec work say reaches the target sooner, agreed from a later round as K "
                  "is. See docs/algorithms.md, \"Reduce-scatter\"."),
        makeField("swarmH", &W::sync, &W::Sync::swarmH, integer, atLeast(1),
                  "SwarmSGD: local steps between two pairwise exchanges."),
        makeField("codec", &W::sync, &W::Sync::codec, string, oneOf(kCodecNames),
                  "Encoding of updates that cross the WAN."),
        makeField("bits", &W::sync, &W::Sync::bits, integer,
                  oneOf(std::vector<int64_t>(kernels::kQsgdBits.begin(), kernels::kQsgdBits.end())),
                  "QSGD bits per value (sign + level)."),
        makeField(
            "bucket", &W::sync, &W::Sync::bucket, integer,
            between(kernels::kQsgdMinBucket, kMaxBucket),
            "QSGD bucket size in values (one scale per bucket). At most 2^30, the most the QSGD "
            "kernels take (their GPU bucket cursor is 32-bit); a larger bucket is refused by this "
            "schema, the `TrainingJob` CRD and `geotrain local`, not when a worker starts."),
        makeField("errorFeedback", &W::sync, &W::Sync::errorFeedback, boolean, anyBool(),
                  "Keep each tensor's quantization residual and add it to the next update."),
        makeField(
            "scaleLrWithDelay", &W::sync, &W::Sync::scaleLrWithDelay, boolean, anyBool(),
            "DTS: when the peers' updates are τ > 4 steps old as they are applied (τ = D under a "
            "fixed D), scale the gradient (for `sgd`, the step size) by max(1/2, 4 / τ); `false` "
            "steps as configured (the published rule). Why: docs/architecture.md §3."),
        makeField("hierarchical", &W::sync, &W::Sync::hierarchical, boolean, anyBool(),
                  "Reduce inside a region to its leader first; only leaders talk across the "
                  "WAN."),
        makeField("lanCodec", &W::sync, &W::Sync::lanCodec, string, oneOf(kLanCodecNames),
                  "Encoding of updates inside a region."),
        makeField(
            "timeoutSeconds", &W::sync, &W::Sync::timeoutSeconds, number, seconds(kMinSeconds),
            "The last resort for a peer that is heard but does not deliver (a straggler): after it "
            "the round goes on without it. Also the start-up grace for a peer never heard (at most "
            "20 s). `allreduce` fails after it, unless the bytes of the gradient are still "
            "arriving (then it waits another). A silent peer is suspected after "
            "`peerTimeoutSeconds` instead. Seconds; the runtime counts whole milliseconds."),
        makeField("peerTimeoutSeconds", &W::sync, &W::Sync::peerTimeoutSeconds, number,
                  seconds(kMinSeconds, /*zeroMeansAuto=*/true),
                  "Silence (no frame, pings included) after which a peer is suspected and nobody "
                  "waits for it, in seconds; `0`: auto, max(3 s, 4 × its ping RTT + 2 s). Pings "
                  "leave every second, so a value under 3 s may suspect a live peer that has "
                  "nothing else to send. See docs/membership.md.")}});
  schema.push_back(
      {"transport",
       {makeField("listen", &W::transport, &W::Transport::listen, string, nonEmptyString(),
                  "ZeroMQ endpoint this worker binds."),
        peersField(), regionsField(),
        makeField("keyDir", &W::transport, &W::Transport::keyDir, string, nonEmptyString(),
                  "Folder with the CURVE key files (`geotrain keygen`): this worker's "
                  "`worker-<rank>.key` and every rank's `worker-<r>.pub`."),
        makeField("keyGroupReadable", &W::transport, &W::Transport::keyGroupReadable, boolean,
                  anyBool(),
                  "Accept a secret key file that its group may read (never others): Kubernetes "
                  "mounts a Secret into a non-root pod as `root:<fsGroup>` mode 0440. Off, the key "
                  "must be owner-only (0600 or 0400)."),
        linksField(),
        makeField("uplink", &W::transport, &W::Transport::uplink, string, anyString(),
                  "Emulated uplink shared by all of this worker's WAN traffic, a link profile such "
                  "as `rate=100mbit`; a message passes the uplink, then its link. Empty: none."),
        makeField(
            "tcpInitialWindow", &W::transport, &W::Transport::tcpInitialWindow, integer,
            between(0, kMaxTcpInitialWindow),
            "Initial congestion and receive windows, in segments, of the TCP connections to the "
            "WAN peers: the worker adds a host route to each (the kernel takes both windows from "
            "the route). A fresh connection otherwise sends 10 segments in its first round trip "
            "and doubles from there, about a second over 230 ms before a round of 0.5 MB crosses "
            "in one, at the start and after every reconnect. Needs CAP_NET_ADMIN in the worker's "
            "network namespace, or routes that carry the windows already: a TrainingJob's pods "
            "get an init container that writes them, as root with NET_ADMIN alone (see "
            "docs/kubernetes.md); `geotrain local --network netns` sets it from the links (689 on "
            "its world preset). `0`: the kernel's. "
            "See docs/wan-emulation.md."),
        makeField("connections", &W::transport, &W::Transport::connections, integer, between(1, 16),
                  "Data connections to each WAN peer; an update or model larger than one chunk "
                  "(64 KiB) is striped over them, and messages still arrive in the order sent. "
                  "One TCP connection keeps at most its receive window in flight, which the "
                  "hosts' `net.ipv4.tcp_rmem` caps (6 MiB by default: 14% of a 1 Gbit/s link at "
                  "230 ms); n connections carry n windows. Raise it where the limits cannot be "
                  "raised; chunks a dropped connection held are sent again on the others. See "
                  "docs/benchmarks.md (a long fat pipe).")}});
  schema.push_back({"checkpoint",
                    {makeField("dir", &W::checkpoint, &W::Checkpoint::dir, string, anyString(),
                               "Where checkpoints go, inside the worker (a mounted volume, to "
                               "survive the pod); empty turns checkpoints off."),
                     makeField("interval", &W::checkpoint, &W::Checkpoint::interval, integer,
                               atLeast(1), "Steps between checkpoints."),
                     makeField("keep", &W::checkpoint, &W::Checkpoint::keep, integer, atLeast(1),
                               "Newest checkpoints kept; older ones are deleted, except the newest "
                               "one that verifies when none of the kept ones does."),
                     makeField("resume", &W::checkpoint, &W::Checkpoint::resume, boolean, anyBool(),
                               "Start from the newest checkpoint in `dir` that verifies and fits "
                               "this worker, if there is one.")}});
  schema.push_back(
      {"output",
       {makeField("path", &W::output, &W::Output::path, string, anyString(),
                  "Where the job's final model goes: `model.pt` (a state dict `torch.load` reads), "
                  "`model.torchscript.pt` (every built-in and TorchScript model) and `model.json` "
                  "(the model, its inputs and their scaling, outputs, task, the step and whether "
                  "it is the final model, test accuracy or loss, model hash), in a mounted volume. "
                  "Written once per region, by its first worker (`worker.localRank` 0; `geotrain "
                  "local`: rank 0 only), each file renamed into place; a failure to write fails "
                  "the worker. Empty writes none. See docs/data-and-models.md."),
        makeField("everyCheckpoint", &W::output, &W::Output::everyCheckpoint, boolean, anyBool(),
                  "Also export every `checkpoint.interval` steps (after that step's checkpoint "
                  "where `checkpoint.dir` is set; without one too), replacing the previous export, "
                  "so that a job that fails leaves its latest model behind: the worker's model at "
                  "that step (under `dts`, its own replica, which the next rounds still correct), "
                  "`model.json` with `\"final\": false` and the step. The final export replaces it "
                  "at the end. A failure to write one is logged and training goes on; the final "
                  "export's failure fails the worker.")}});
  schema.push_back(
      {"metrics",
       {makeField("listen", &W::metrics, &W::Metrics::listen, string, anyString(),
                  "Address (`host:port`) of the Prometheus `/metrics` endpoint; non-empty while "
                  "`metrics.enabled` is `true`."),
        makeField("enabled", &W::metrics, &W::Metrics::enabled, boolean, anyBool(),
                  "Serve `/metrics`."),
        makeField(
            "lingerSeconds", &W::metrics, &W::Metrics::lingerSeconds, number, seconds(0),
            "After a successful run, keep serving the final values this long (seconds) before "
            "exiting, so that the next scrape sees them (set it to the scrape interval).")}});
  schema.push_back(
      {"log",
       {makeField("level", &W::log, &W::Log::level, string,
                  oneOf({"trace", "debug", "info", "warn", "error", "critical", "off"}),
                  "Level of the worker's log on stderr."),
        makeField("format", &W::log, &W::Log::format, string, oneOf({"text", "json"}),
                  "`json`: one object a line (`time`, `level`, `msg`) for log collectors; the "
                  "controller sets it for pods from `spec.log.format`.")}});
  // What only the whole table knows: each key's section, path and default.
  const WorkerConfig defaults;
  for (Section& section : schema) {
    for (Field& field : section.fields) {
      field.spec.section = std::string(section.name);
      field.spec.path = fmt::format("{}.{}", section.name, field.spec.name);
      field.spec.defaultValue = field.get(defaults);
    }
  }
  return schema;
}

const std::vector<Section>& schema() {
  static const std::vector<Section> kSchema = buildSchema();
  return kSchema;
}

const Section* findSection(std::string_view name) {
  for (const Section& section : schema()) {
    if (section.name == name) return &section;
  }
  return nullptr;
}

std::vector<std::string_view> sectionNames() {
  std::vector<std::string_view> names;
  for (const Section& section : schema()) names.push_back(section.name);
  return names;
}

// ---- Reading YAML ----------------------------------------------------------------

Status readSection(const Section& section, const YAML::Node& node, std::string_view source,
                   WorkerConfig& config) {
  std::set<std::string> seen;
  // model.builtin and model.torchscript exclude each other when both are given.
  std::optional<YAML::Node> builtinGiven;
  std::optional<YAML::Node> torchscriptGiven;
  for (const auto& entry : node) {
    const YAML::Node& keyNode = entry.first;
    const YAML::Node& value = entry.second;
    if (!keyNode.IsScalar()) {
      return invalidArgument(fmt::format("{}{}: {} key is not allowed (allowed: {})",
                                         where(source, keyNode), section.name, nodeKind(keyNode),
                                         join(section.keys())));
    }
    const std::string& key = keyNode.Scalar();
    const std::string path = fmt::format("{}.{}", section.name, printable(key));
    const Field* field = section.find(key);
    if (field == nullptr) {
      return unknownKey(where(source, keyNode), path, key, section.keys());
    }
    if (!seen.insert(key).second) {
      return invalidArgument(fmt::format("{}{}: duplicate key", where(source, keyNode), path));
    }
    if (value.IsNull()) continue;  // `key:` or `key: ~` keeps the default
    if (value.IsScalar()) {
      Status status = field->setText(config, value.Scalar());
      if (!status.ok()) {
        return invalidArgument(
            fmt::format("{}{}: {}", where(source, value), path, status.message()));
      }
      if (!value.Scalar().empty()) {
        if (key == "builtin") builtinGiven = keyNode;
        if (key == "torchscript") torchscriptGiven = keyNode;
      }
    } else if (field->setCollection) {
      GEO_RETURN_IF_ERROR(field->setCollection(config, value, source, path));
    } else {
      return invalidArgument(fmt::format("{}{}: {} is not allowed (allowed: {})",
                                         where(source, value), path, nodeKind(value),
                                         field->spec.allowed));
    }
  }
  if (section.name == "model" && builtinGiven && torchscriptGiven) {
    return invalidArgument(
        fmt::format("{}model: builtin and torchscript are both set (allowed: one of them)",
                    where(source, *torchscriptGiven)));
  }
  return {};
}

Status readDocument(const YAML::Node& document, std::string_view source, WorkerConfig& config) {
  if (document.IsNull()) return {};
  if (!document.IsMap()) {
    return invalidArgument(
        fmt::format("{}{} is not allowed at the top level (allowed: a mapping "
                    "of sections: {})",
                    where(source, document), nodeKind(document), join(sectionNames())));
  }
  std::set<std::string> seen;
  for (const auto& entry : document) {
    const YAML::Node& keyNode = entry.first;
    const YAML::Node& value = entry.second;
    if (!keyNode.IsScalar()) {
      return invalidArgument(fmt::format("{}{} key is not allowed (allowed: {})",
                                         where(source, keyNode), nodeKind(keyNode),
                                         join(sectionNames())));
    }
    const std::string& name = keyNode.Scalar();
    const Section* section = findSection(name);
    if (section == nullptr) {
      return unknownKey(where(source, keyNode), printable(name), name, sectionNames());
    }
    if (!seen.insert(name).second) {
      return invalidArgument(fmt::format("{}{}: duplicate key", where(source, keyNode), name));
    }
    if (value.IsNull()) continue;
    if (!value.IsMap()) {
      return invalidArgument(fmt::format("{}{}: {} is not allowed (allowed: a mapping of {})",
                                         where(source, value), name, nodeKind(value),
                                         join(section->keys())));
    }
    GEO_RETURN_IF_ERROR(readSection(*section, value, source, config));
  }
  return {};
}

// The first pass over a text: its YAML events, before yaml-cpp builds a tree
// of them. It refuses nesting and node counts that no worker.yaml needs
// while they cost nothing yet (a tree of a 1 MiB file of one-character list
// items takes about 400 MB; deep nesting, yaml-cpp's recursion) and counts
// the documents.
class ShapeCheck final : public YAML::EventHandler {
 public:
  // Thrown out of the parser (yaml-cpp passes it through) to stop at once.
  struct Exceeded {
    YAML::Mark mark;
    std::string message;
  };

  size_t documents() const { return documents_; }

  void OnDocumentStart(const YAML::Mark&) override { ++documents_; }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark& mark, YAML::anchor_t) override { node(mark); }
  void OnAlias(const YAML::Mark& mark, YAML::anchor_t) override { node(mark); }
  void OnScalar(const YAML::Mark& mark, const std::string&, YAML::anchor_t,
                const std::string&) override {
    node(mark);
  }
  void OnSequenceStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {
    open(mark);
  }
  void OnSequenceEnd() override { --depth_; }
  void OnMapStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {
    open(mark);
  }
  void OnMapEnd() override { --depth_; }

 private:
  void node(const YAML::Mark& mark) {
    if (++nodes_ > kMaxYamlNodes) {
      throw Exceeded{mark,
                     fmt::format("more than {} YAML nodes is not allowed (allowed: at most {}; a "
                                 "worker.yaml lists at most {} peers and {} regions)",
                                 kMaxYamlNodes, kMaxYamlNodes, kMaxWorldSize, kMaxWorldSize)};
    }
  }
  void open(const YAML::Mark& mark) {
    node(mark);
    if (++depth_ > kMaxYamlDepth) {
      throw Exceeded{mark, fmt::format("YAML nested more than {} levels deep is not allowed "
                                       "(allowed: at most {} levels; worker.yaml uses 3)",
                                       kMaxYamlDepth, kMaxYamlDepth)};
    }
  }

  size_t documents_ = 0;
  size_t nodes_ = 0;
  int depth_ = 0;
};

Status syntaxError(std::string_view sourceName, const YAML::ParserException& e) {
  if (e.mark.is_null()) {
    return invalidArgument(fmt::format("{}: YAML syntax error: {}", sourceName, e.msg));
  }
  return invalidArgument(fmt::format("{}:{}:{}: YAML syntax error: {}", sourceName, e.mark.line + 1,
                                     e.mark.column + 1, e.msg));
}

Status tooLarge(std::string_view sourceName, std::string_view size) {
  return invalidArgument(fmt::format(
      "{}: a worker config of {} bytes is not allowed (allowed: at most {} bytes, 1 MiB)",
      sourceName, size, kMaxConfigBytes));
}

StatusOr<WorkerConfig> parse(std::string_view yamlText, std::string_view sourceName,
                             ConfigCheck check) {
  if (yamlText.size() > kMaxConfigBytes) {
    return tooLarge(sourceName, fmt::format("{}", yamlText.size()));
  }
  const std::string text(yamlText);
  try {
    std::istringstream stream(text);
    YAML::Parser parser(stream);
    ShapeCheck shape;
    while (parser.HandleNextDocument(shape)) {
    }
    if (shape.documents() > 1) {
      return invalidArgument(fmt::format("{}: {} YAML documents is not allowed (allowed: one)",
                                         sourceName, shape.documents()));
    }
  } catch (const ShapeCheck::Exceeded& e) {
    return invalidArgument(
        fmt::format("{}:{}:{}: {}", sourceName, e.mark.line + 1, e.mark.column + 1, e.message));
  } catch (const YAML::ParserException& e) {
    return syntaxError(sourceName, e);
  }
  std::vector<YAML::Node> documents;
  try {
    documents = YAML::LoadAll(text);
  } catch (const YAML::ParserException& e) {
    return syntaxError(sourceName, e);
  }
  WorkerConfig config;
  if (!documents.empty()) GEO_RETURN_IF_ERROR(readDocument(documents[0], sourceName, config));
  if (check == ConfigCheck::kFull) {
    Status status = validateWorkerConfig(config);
    if (!status.ok()) return status.withContext(sourceName);
  }
  return config;
}

// ---- Cross-field checks ------------------------------------------------------------

std::optional<ConfigProblem> problem(std::string path, std::string detail) {
  return ConfigProblem{std::move(path), std::move(detail)};
}

std::optional<ConfigProblem> relationProblem(const WorkerConfig& c) {
  const auto& w = c.worker;
  if (w.rank >= w.worldSize) {
    return problem("worker.rank",
                   fmt::format("{} is not allowed (allowed: 0..{}, below worker.worldSize = {})",
                               w.rank, w.worldSize - 1, w.worldSize));
  }
  if (w.regionSize > w.worldSize) {
    return problem("worker.regionSize",
                   fmt::format("{} is not allowed (allowed: 1..{}, at most worker.worldSize = {})",
                               w.regionSize, w.worldSize, w.worldSize));
  }
  if (w.localRank >= w.regionSize) {
    return problem("worker.localRank",
                   fmt::format("{} is not allowed (allowed: 0..{}, below worker.regionSize = {})",
                               w.localRank, w.regionSize - 1, w.regionSize));
  }

  const int64_t shardIndex = effectiveShardIndex(c);
  const int64_t shardCount = effectiveShardCount(c);
  if (shardIndex >= shardCount) {
    return problem(
        "dataset.shardIndex",
        fmt::format("{}{} is not allowed (allowed: 0..{}, below dataset.shardCount{} = "
                    "{})",
                    shardIndex,
                    c.dataset.shardIndex             ? ""
                    : c.dataset.sharding == "region" ? " (derived from worker.localRank)"
                                                     : " (derived from worker.rank)",
                    shardCount - 1,
                    c.dataset.shardCount             ? ""
                    : c.dataset.sharding == "region" ? " (derived from worker.regionSize)"
                                                     : " (derived from worker.worldSize)",
                    shardCount));
  }

  const bool hasBuiltin = !c.model.builtin.empty();
  const bool hasTorchscript = !c.model.torchscript.empty();
  if (hasBuiltin && hasTorchscript) {
    return problem("model", "builtin and torchscript are both set (allowed: one of them)");
  }
  if (!hasBuiltin && !hasTorchscript) {
    return problem(
        "model",
        "neither builtin nor torchscript is set (allowed: builtin: mlp, cnn, resnet18; or "
        "torchscript: a file path)");
  }

  // The Debian packages' data sets have a home (/usr/share/datasets/<name>);
  // a user's own files do not.
  if (c.dataset.path.empty() && c.dataset.name == "npy") {
    return problem("dataset.path",
                   "\"\" is not allowed with dataset.name: npy (allowed: the folder holding "
                   "train_x.npy, train_y.npy, test_x.npy and test_y.npy)");
  }
  if (c.dataset.path.empty() && c.dataset.name == "tokens") {
    return problem("dataset.path",
                   "\"\" is not allowed with dataset.name: tokens (allowed: the folder holding "
                   "train.bin and val.bin)");
  }
  // Every worker must build the same model. With each region reading data
  // of its own, a class count (or vocabulary, or target width) taken from
  // the data could differ between regions, and the workers would then
  // refuse each other's updates all job long: it must be given.
  if (c.dataset.sharding == "region" && c.model.classes == 0 &&
      (c.dataset.name == "npy" || c.dataset.name == "tokens")) {
    return problem(
        "model.classes",
        fmt::format("0 is not allowed with dataset.sharding: region and dataset.name: {} "
                    "(allowed: the job's {} count, 1..{}: each region's data could imply another, "
                    "and every "
                    "worker must build the same model)",
                    c.dataset.name,
                    c.dataset.name == "tokens" ? "vocabulary"
                    : c.training.loss == "mse" ? "targets-per-sample"
                                               : "class",
                    kMaxClasses));
  }
  // Token windows go with the next-token loss and the gpt (or a TorchScript
  // model taking [N, context] token ids), and nothing else with either.
  const bool tokens = c.dataset.name == "tokens";
  if (tokens != (c.training.loss == "next-token")) {
    return problem(
        "training.loss",
        fmt::format("{} is not allowed with dataset.name: {} (allowed: {})", c.training.loss,
                    c.dataset.name, tokens ? "next-token" : "cross-entropy or mse"));
  }
  if (c.model.builtin == "gpt" && !tokens) {
    return problem(
        "model.builtin",
        fmt::format("gpt is not allowed with dataset.name: {} (allowed: tokens; the gpt reads "
                    "token ids)",
                    c.dataset.name));
  }
  if (tokens && !c.model.builtin.empty() && c.model.builtin != "gpt") {
    return problem("model.builtin",
                   fmt::format("{} is not allowed with dataset.name: tokens (allowed: gpt, or a "
                               "TorchScript model)",
                               c.model.builtin));
  }
  if (c.model.builtin == "gpt") {
    const int64_t width = c.model.width > 0 ? c.model.width : 128;
    if (width % c.model.heads != 0) {
      return problem("model.heads",
                     fmt::format("{} is not allowed (allowed: a divisor of model.width = {})",
                                 c.model.heads, width));
    }
  }

  const auto peerCount = static_cast<int64_t>(c.transport.peers.size());
  if (peerCount != 0 && peerCount != w.worldSize) {
    return problem("transport.peers",
                   fmt::format("{} endpoints is not allowed (allowed: none, or one per rank: "
                               "worker.worldSize = {})",
                               peerCount, w.worldSize));
  }
  if (peerCount != 0 && c.transport.peers[static_cast<size_t>(w.rank)] == "none") {
    return problem(fmt::format("transport.peers[{}]", w.rank),
                   "none is not allowed for this worker's own rank (allowed: an endpoint such as "
                   "tcp://host:7000)");
  }

  if (!c.transport.regions.empty()) {
    const auto& regions = c.transport.regions;
    if (static_cast<int64_t>(regions.size()) != w.worldSize) {
      return problem("transport.regions",
                     fmt::format("{} names is not allowed (allowed: none, or one per rank: "
                                 "worker.worldSize = {})",
                                 regions.size(), w.worldSize));
    }
    const std::string& mine = regions[static_cast<size_t>(w.rank)];
    if (mine != w.region) {
      return problem("worker.region",
                     fmt::format("\"{}\" is not allowed (allowed: \"{}\", transport.regions[{}])",
                                 w.region, mine, w.rank));
    }
    const auto before = std::count(regions.begin(), regions.begin() + w.rank, mine);
    const auto total = std::count(regions.begin(), regions.end(), mine);
    if (w.localRank != before || w.regionSize != total) {
      return problem("worker.localRank/regionSize",
                     fmt::format("{}/{} is not allowed (allowed: {}/{}, rank {}'s place "
                                 "among the ranks of region {} in transport.regions)",
                                 w.localRank, w.regionSize, before, total, w.rank, mine));
    }
  }

  if (c.metrics.enabled && c.metrics.listen.empty()) {
    return problem("metrics.listen",
                   "\"\" is not allowed (allowed: host:port while metrics.enabled is true)");
  }
  return {};
}

// Each key's own rule first, in schema order, then the relations.
std::optional<ConfigProblem> firstProblem(const WorkerConfig& config) {
  for (const Section& section : schema()) {
    for (const Field& field : section.fields) {
      Status status = field.check(config);
      if (!status.ok()) return problem(field.spec.path, status.message());
    }
  }
  return relationProblem(config);
}

// ---- Overrides ---------------------------------------------------------------------

Status applyOne(WorkerConfig& config, std::string_view dottedKey, std::string_view value) {
  const size_t dot = dottedKey.find('.');
  const std::string_view sectionName = dottedKey.substr(0, dot);
  const Section* section = findSection(sectionName);
  if (section == nullptr) {
    return unknownKey("", printable(sectionName), sectionName, sectionNames());
  }
  if (dot == std::string_view::npos) {
    return invalidArgument(fmt::format("{}: a section cannot be set (allowed: one of its keys: {})",
                                       sectionName, join(section->keys())));
  }
  const std::string_view rest = dottedKey.substr(dot + 1);
  const size_t subDot = rest.find('.');
  const std::string_view key = rest.substr(0, subDot);
  const std::string path = fmt::format("{}.{}", sectionName, printable(key));
  const Field* field = section->find(key);
  if (field == nullptr) return unknownKey("", path, key, section->keys());

  if (subDot != std::string_view::npos) {
    const std::string entry(rest.substr(subDot + 1));
    if (!field->setEntry) {
      return invalidArgument(fmt::format("{}: unknown key ({} is a value, not a section)",
                                         printable(dottedKey), path));
    }
    if (entry.empty()) {
      return invalidArgument(
          fmt::format("{}: an empty entry name is not allowed (allowed: {}.<name>)",
                      printable(dottedKey), path));
    }
    Status status = field->setEntry(config, entry, value);
    if (!status.ok()) {
      return invalidArgument(fmt::format("{}: {}", printable(dottedKey), status.message()));
    }
    return {};
  }
  Status status = field->setText(config, value);
  if (!status.ok()) return invalidArgument(fmt::format("{}: {}", path, status.message()));
  return {};
}

// The public functions promise not to throw; anything unexpected (allocation
// failure, a yaml-cpp exception not anticipated above) becomes a Status.
template <typename Result, typename Body>
Result noThrow(std::string_view what, Body&& body) {
  try {
    return body();
  } catch (const std::exception& e) {
    return internalError(fmt::format("{}: {}", what, e.what()));
  } catch (...) {
    return internalError(fmt::format("{}: unknown exception", what));
  }
}

}  // namespace

StatusOr<WorkerConfig> parseWorkerConfig(std::string_view yamlText, std::string_view sourceName,
                                         ConfigCheck check) {
  return noThrow<StatusOr<WorkerConfig>>(sourceName,
                                         [&] { return parse(yamlText, sourceName, check); });
}

StatusOr<WorkerConfig> loadWorkerConfig(const std::filesystem::path& path, ConfigCheck check) {
  return noThrow<StatusOr<WorkerConfig>>(path.string(), [&]() -> StatusOr<WorkerConfig> {
    std::error_code error;
    const auto status = std::filesystem::status(path, error);
    if (status.type() == std::filesystem::file_type::not_found) {
      return notFound(fmt::format("{}: worker config not found", path.string()));
    }
    if (std::filesystem::is_directory(status)) {
      return invalidArgument(
          fmt::format("{}: cannot read worker config: is a directory", path.string()));
    }
    // A regular file's size is known before reading; anything else (a
    // device such as /dev/zero, a pipe) is read up to one byte past the bound.
    if (std::filesystem::is_regular_file(status)) {
      const auto size = std::filesystem::file_size(path, error);
      if (!error && size > kMaxConfigBytes) return tooLarge(path.string(), fmt::format("{}", size));
    }
    std::ifstream file(path, std::ios::binary);
    if (!file) {
      return invalidArgument(
          fmt::format("{}: cannot read worker config: {}", path.string(), std::strerror(errno)));
    }
    std::string text(kMaxConfigBytes + 1, '\0');
    file.read(text.data(), static_cast<std::streamsize>(text.size()));
    if (file.bad()) {
      return invalidArgument(
          fmt::format("{}: cannot read worker config: {}", path.string(), std::strerror(errno)));
    }
    text.resize(static_cast<size_t>(file.gcount()));
    if (text.size() > kMaxConfigBytes) {
      return tooLarge(path.string(), fmt::format("more than {}", kMaxConfigBytes));
    }
    return parse(text, path.string(), check);
  });
}

Status validateWorkerConfig(const WorkerConfig& config) {
  return noThrow<Status>("validating worker config", [&]() -> Status {
    const std::optional<ConfigProblem> found = firstProblem(config);
    if (!found) return {};
    return invalidArgument(fmt::format("{}: {}", found->path, found->detail));
  });
}

std::optional<ConfigProblem> workerConfigProblem(const WorkerConfig& config) {
  try {
    return firstProblem(config);
  } catch (const std::exception& e) {
    return ConfigProblem{"", fmt::format("validating worker config: {}", e.what())};
  } catch (...) {
    return ConfigProblem{"", "validating worker config: unknown exception"};
  }
}

std::string toYaml(const WorkerConfig& config) {
  YAML::Emitter out;
  out << YAML::Comment("geotrain worker configuration; reference: docs/worker-config.md");
  out << YAML::BeginMap;
  for (const Section& section : schema()) {
    out << YAML::Key << std::string(section.name) << YAML::Value << YAML::BeginMap;
    for (const Field& field : section.fields) {
      out << YAML::Key << field.spec.name << YAML::Value;
      field.emit(config, out);
    }
    out << YAML::EndMap;
  }
  out << YAML::EndMap;
  // The emitter reports misuse through good(); the sequence above is fixed,
  // so a failure here is a bug in this file.
  GEO_ENFORCE(out.good(), "emitting worker.yaml failed: {}", out.GetLastError());
  return std::string(out.c_str()) + "\n";
}

Status applyOverride(WorkerConfig& config, std::string_view dottedKey, std::string_view value) {
  return noThrow<Status>(printable(dottedKey), [&] { return applyOne(config, dottedKey, value); });
}

Status placeByCompletionIndex(WorkerConfig& config, int64_t index) {
  const auto& regions = config.transport.regions;
  const std::string& region = config.worker.region;
  std::vector<int64_t> ranks;
  if (regions.empty()) {
    for (int64_t r = 0; r < config.worker.worldSize; ++r) ranks.push_back(r);
  } else {
    for (size_t r = 0; r < regions.size(); ++r) {
      if (regions[r] == region) ranks.push_back(static_cast<int64_t>(r));
    }
  }
  if (index < 0 || index >= static_cast<int64_t>(ranks.size())) {
    return invalidArgument(fmt::format(
        "completion index {} is not allowed (allowed: 0..{}: region {} has {} workers in {})",
        index, static_cast<int64_t>(ranks.size()) - 1, region, ranks.size(),
        regions.empty() ? "worker.worldSize" : "transport.regions"));
  }
  config.worker.localRank = index;
  config.worker.rank = ranks[static_cast<size_t>(index)];
  config.worker.regionSize = static_cast<int64_t>(ranks.size());
  return {};
}

std::string printableText(std::string_view text) {
  return printable(text);
}

const std::vector<KeySpec>& workerConfigSchema() {
  static const std::vector<KeySpec> kKeys = [] {
    std::vector<KeySpec> keys;
    for (const Section& section : schema()) {
      for (const Field& field : section.fields) keys.push_back(field.spec);
    }
    return keys;
  }();
  return kKeys;
}

std::vector<std::string> workerConfigSections() {
  std::vector<std::string> names;
  for (const Section& section : schema()) names.emplace_back(section.name);
  return names;
}

namespace {

// The table's entry of `path`, or NotFound with the words of lookupWorkerKey().
StatusOr<const Field*> lookupField(std::string_view path) {
  const size_t dot = path.find('.');
  const std::string_view sectionName = path.substr(0, dot);
  const Section* section = findSection(sectionName);
  if (section == nullptr) return notFound(unknownKeyDetail(sectionName, sectionNames()));
  const std::string_view key = dot == std::string_view::npos ? "" : path.substr(dot + 1);
  const Field* field = section->find(key);
  if (field == nullptr) return notFound(unknownKeyDetail(key, section->keys()));
  return field;
}

const Field& fieldOf(const KeySpec& key) {
  auto field = lookupField(key.path);
  GEO_ENFORCE(field.ok(), "{} is not a key of the worker.yaml schema", key.path);
  return **field;
}

}  // namespace

StatusOr<const KeySpec*> lookupWorkerKey(std::string_view path) {
  auto field = lookupField(path);
  if (!field.ok()) return field.status();
  return &(*field)->spec;
}

KeyValue workerKeyValue(const WorkerConfig& config, const KeySpec& key) {
  return fieldOf(key).get(config);
}

std::string workerKeyYaml(const WorkerConfig& config, const KeySpec& key) {
  YAML::Emitter out;
  fieldOf(key).emit(config, out);
  GEO_ENFORCE(out.good(), "emitting {} failed: {}", key.path, out.GetLastError());
  return out.c_str();
}

Status setWorkerKey(WorkerConfig& config, const KeySpec& key, std::string_view text) {
  return noThrow<Status>(key.path, [&] { return fieldOf(key).setText(config, text); });
}

std::string workerKeyChoices(std::string_view path) {
  auto key = lookupWorkerKey(path);
  GEO_ENFORCE(key.ok() && !(*key)->limits.choices.empty(), "{} is not an enumerated key",
              printable(path));
  const std::vector<std::string>& choices = (*key)->limits.choices;
  if (choices.size() == 1) return choices.front();
  return fmt::format("{} or {}", fmt::join(choices.begin(), choices.end() - 1, ", "),
                     choices.back());
}

int64_t effectiveShardIndex(const WorkerConfig& config) {
  const bool region = config.dataset.sharding == "region";
  return config.dataset.shardIndex.value_or(region ? config.worker.localRank : config.worker.rank);
}

int64_t effectiveShardCount(const WorkerConfig& config) {
  const bool region = config.dataset.sharding == "region";
  return config.dataset.shardCount.value_or(region ? config.worker.regionSize
                                                   : config.worker.worldSize);
}

}  // namespace geo
