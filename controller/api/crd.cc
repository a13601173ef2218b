#include "controller/api/crd.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <type_traits>
#include <variant>
#include <vector>

#include "common/enforce.h"
#include "common/worker_schema.h"
#include "controller/api/training_job.h"

namespace geo::api {
namespace {

// A line is folded at the first space past this column where the text
// allows it, as PyYAML folds at its default width (the file's style before it
// was generated); .yamllint warns past 120.
constexpr size_t kFoldColumn = 100;

// What the CRD says of a section as a whole; the keys' lines are the
// schema's.
const std::map<std::string, std::string>& sectionDescriptions() {
  static const std::map<std::string, std::string> descriptions = {
      {"model",
       "The network to train: a built-in architecture or a TorchScript file (exactly one; builtin "
       "defaults to mlp when torchscript is not set)."},
      {"dataset", "The data set; every region reads its own copy."},
      {"training", "The local training loop of every worker."},
      {"sync", "How the regions exchange updates (docs/architecture.md section 3)."},
      {"transport",
       "The workers' connections across the WAN (the controller sets their endpoints, regions and "
       "keys)."},
      {"checkpoint", "Checkpoints of every worker."},
      {"output", "Where the trained model goes."},
      {"log", "Worker logging."},
  };
  return descriptions;
}

// Where a TrainingJob says more than worker.yaml's line: its regions may
// each have a data folder of their own.
const std::map<std::string, std::string>& descriptionOverrides() {
  static const std::map<std::string, std::string> overrides = {
      {"dataset.path",
       "Folder with the data set's files in the worker's file system (regions[].dataPath "
       "overrides it per region); empty takes the Debian package's folder, "
       "/usr/share/datasets/<name> (npy needs one)."},
  };
  return overrides;
}

// The relations between a section's keys that a CRD can state (CEL rules and
// their messages).
struct CelRule {
  std::string rule;
  std::string message;
};
const std::map<std::string, std::vector<CelRule>>& sectionRules() {
  static const std::map<std::string, std::vector<CelRule>> rules = {
      {"model",
       {{"!(has(self.builtin) && self.builtin != '' && has(self.torchscript) && "
         "self.torchscript != '')",
         "set exactly one of builtin and torchscript"},
        {"!(has(self.builtin) && self.builtin == '' && (!has(self.torchscript) || "
         "self.torchscript == ''))",
         "builtin is empty and no torchscript is set"}}},
  };
  return rules;
}

// ---- YAML scalars ------------------------------------------------------------

bool isYamlWord(std::string_view s) {
  std::string lower(s);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  static const std::set<std::string> kWords = {"y",   "n",    "yes",   "no",   "on",
                                               "off", "true", "false", "null", "~"};
  return kWords.contains(lower);
}

// Whether `s` reads back as the same string when written plain (YAML 1.1
// and 1.2 readers alike).
bool plainSafe(std::string_view s) {
  if (s.empty() || isYamlWord(s)) return false;
  if (std::string_view("-?:,[]{}#&*!|>'\"%@` ").find(s.front()) != std::string_view::npos) {
    return false;
  }
  if (s.back() == ':' || s.back() == ' ') return false;
  if (s.find(": ") != std::string_view::npos || s.find(" #") != std::string_view::npos) {
    return false;
  }
  // A number, a date or a time, but not a sentence that starts with one.
  const bool numberLike = std::isdigit(static_cast<unsigned char>(s.front())) != 0 ||
                          s.front() == '+' || s.front() == '.';
  return !(numberLike && s.find(' ') == std::string_view::npos);
}

std::string singleQuoted(std::string_view s) {
  std::string out = "'";
  for (char c : s) {
    out += c;
    if (c == '\'') out += '\'';
  }
  return out + "'";
}

std::string scalar(std::string_view s) {
  return plainSafe(s) ? std::string(s) : singleQuoted(s);
}

// "<key>: <text>" at `indent`, folded at single spaces into lines indented
// `continuation` spaces, where that reads back as the same text: a line
// break inside a plain or single-quoted scalar is one space. A plain scalar
// is not broken before a word that could start something else.
void foldedLine(std::vector<std::string>& lines, int indent, std::string_view key,
                std::string_view text, int continuation) {
  const std::string written = scalar(text);
  const bool quoted = written.front() == '\'';
  std::string line = fmt::format("{:{}}{}: ", "", indent, key);
  size_t start = 0;
  bool mayBreak = false;  // not before the first word
  while (true) {
    const size_t end = std::min(written.find(' ', start), written.size());
    const std::string_view word(written.data() + start, end - start);
    const bool breakable = mayBreak && !word.empty() &&
                           (quoted || std::isalnum(static_cast<unsigned char>(word.front())) != 0 ||
                            word.front() == '(');
    if (breakable && line.size() - 1 > kFoldColumn) {
      line.pop_back();  // the space the break replaces
      lines.push_back(line);
      line.assign(static_cast<size_t>(continuation), ' ');
    }
    line.append(word);
    if (end == written.size()) break;
    line += ' ';
    // Two spaces in a row (an empty word) would not survive a break.
    mayBreak = !word.empty();
    start = end + 1;
  }
  lines.push_back(line);
}

void foldedLine(std::vector<std::string>& lines, int indent, std::string_view key,
                std::string_view text) {
  foldedLine(lines, indent, key, text, indent + 2);
}

// ---- Keys --------------------------------------------------------------------

// A doc line marks code with backticks for the Markdown reference
// (docs/worker-config.md); kubectl explain shows descriptions as plain text.
std::string withoutCodeMarks(std::string_view doc) {
  std::string text(doc);
  std::erase(text, '`');
  return text;
}

std::string bound(const KeySpec& key, double v) {
  if (key.type == KeyType::kInteger || key.type == KeyType::kUnsigned) {
    return fmt::format("{}", static_cast<int64_t>(v));
  }
  return fmt::format("{}", v);
}

// The default as the CRD writes it; nullopt: none.
std::optional<std::string> defaultText(const KeySpec& key, const KeyValue& value) {
  return std::visit(
      [&](const auto& v) -> std::optional<std::string> {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, std::monostate>) {
          if (key.takesAuto) return std::string("auto");
          return std::nullopt;
        } else if constexpr (std::is_same_v<T, bool>) {
          return std::string(v ? "true" : "false");
        } else if constexpr (std::is_same_v<T, std::string>) {
          return scalar(v);
        } else if constexpr (std::is_same_v<T, int64_t> || std::is_same_v<T, uint64_t> ||
                             std::is_same_v<T, double>) {
          return fmt::format("{}", v);
        } else {
          GEO_ENFORCE(false, "{}: the TrainingJob has no list or map keys", key.path);
          return std::nullopt;
        }
      },
      value);
}

void celRules(std::vector<std::string>& lines, int indent, const std::vector<CelRule>& rules) {
  lines.push_back(fmt::format("{:{}}x-kubernetes-validations:", "", indent));
  for (const CelRule& r : rules) {
    // The rule's continuation lines go past the item's mapping (indent + 2).
    foldedLine(lines, indent, "- rule", r.rule, indent + 4);
    foldedLine(lines, indent + 2, "message", r.message);
  }
}

const char* openApiType(KeyType type) {
  switch (type) {
    case KeyType::kInteger:
    case KeyType::kUnsigned: return "integer";
    case KeyType::kNumber: return "number";
    case KeyType::kBoolean: return "boolean";
    case KeyType::kString: return "string";
    case KeyType::kStringList:
    case KeyType::kStringMap: break;
  }
  GEO_ENFORCE(false, "the TrainingJob has no list or map keys");
  return "";
}

void renderKey(std::vector<std::string>& lines, int indent, const KeySpec& key,
               const WorkerConfig& defaults) {
  lines.push_back(fmt::format("{:{}}{}:", "", indent, key.name));
  const int in = indent + 2;
  const KeyLimits& limits = key.limits;
  // An integer or the word auto: OpenAPI has no type for it, a CEL rule
  // checks it.
  if (key.takesAuto) {
    lines.push_back(fmt::format("{:{}}x-kubernetes-int-or-string: true", "", in));
  } else {
    lines.push_back(fmt::format("{:{}}type: {}", "", in, openApiType(key.type)));
  }
  auto description = descriptionOverrides().find(key.path);
  foldedLine(lines, in, "description",
             description == descriptionOverrides().end() ? withoutCodeMarks(key.doc)
                                                         : description->second);
  if (!limits.choices.empty()) {
    lines.push_back(fmt::format("{:{}}enum:", "", in));
    for (const std::string& choice : limits.choices) {
      lines.push_back(
          fmt::format("{:{}}- {}", "", in, key.type == KeyType::kString ? scalar(choice) : choice));
    }
    if (limits.emptyAllowed) lines.push_back(fmt::format("{:{}}- ''", "", in));
  }
  if (!key.takesAuto) {
    // Below the minimum only 0 may be allowed (auto), which a CEL rule adds.
    if (limits.minimum) {
      const double minimum = limits.zeroAllowed ? 0 : *limits.minimum;
      lines.push_back(fmt::format("{:{}}minimum: {}", "", in, bound(key, minimum)));
    }
    if (limits.exclusiveMinimum)
      lines.push_back(fmt::format("{:{}}exclusiveMinimum: true", "", in));
    if (limits.maximum) {
      lines.push_back(fmt::format("{:{}}maximum: {}", "", in, bound(key, *limits.maximum)));
    }
    if (limits.exclusiveMaximum)
      lines.push_back(fmt::format("{:{}}exclusiveMaximum: true", "", in));
  }
  // model.builtin has a default of its own only where torchscript is not
  // set, which a schema default cannot say.
  if (key.path != "model.builtin") {
    if (auto text = defaultText(key, workerKeyValue(defaults, key))) {
      lines.push_back(fmt::format("{:{}}default: {}", "", in, *text));
    }
  }
  if (key.takesAuto) {
    GEO_ENFORCE(limits.minimum.has_value(), "{}: an auto key needs a minimum", key.path);
    celRules(lines, in,
             {{fmt::format("type(self) == int ? self >= {} : self == 'auto'",
                           bound(key, *limits.minimum)),
               key.allowed}});
  } else if (limits.zeroAllowed && limits.minimum) {
    celRules(
        lines, in,
        {{fmt::format("self == 0.0 || self >= {}", bound(key, *limits.minimum)), key.allowed}});
  }
}

}  // namespace

std::string renderCrdWorkerSections(int indent) {
  const WorkerConfig defaults = TrainingJobSpec::defaultWorkerConfig();
  std::vector<std::string> lines;
  for (const std::string& section : workerSpecSections()) {
    lines.push_back(fmt::format("{:{}}{}:", "", indent, section));
    const int in = indent + 2;
    lines.push_back(fmt::format("{:{}}type: object", "", in));
    auto description = sectionDescriptions().find(section);
    GEO_ENFORCE(description != sectionDescriptions().end(), "no CRD description of section {}",
                section);
    foldedLine(lines, in, "description", description->second);
    lines.push_back(fmt::format("{:{}}properties:", "", in));
    for (const KeySpec& key : workerConfigSchema()) {
      if (key.section != section || isControllerOwned(key.path)) continue;
      renderKey(lines, in + 2, key, defaults);
    }
    if (auto rules = sectionRules().find(section); rules != sectionRules().end()) {
      celRules(lines, in, rules->second);
    }
    lines.push_back(fmt::format("{:{}}default: {{}}", "", in));
  }
  std::string out;
  for (const std::string& line : lines) out += line + "\n";
  return out;
}

}  // namespace geo::api
