#include "controller/api/training_job.h"

#include <fmt/chrono.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <regex>
#include <set>
#include <type_traits>
#include <variant>

#include "common/worker_schema.h"

namespace geo::api {

namespace {

using nlohmann::json;

std::string jsonKind(const json& v) {
  switch (v.type()) {
    case json::value_t::object: return "an object";
    case json::value_t::array: return "a list";
    case json::value_t::string: return "a string";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned: return "an integer";
    case json::value_t::number_float: return "a number";
    default: return "null";
  }
}

// Whether a double is a whole number within int64's range (casting one
// outside it is undefined behaviour).
bool isWholeInt64(double d) {
  constexpr double kTwoTo63 = 9223372036854775808.0;
  return std::trunc(d) == d && d >= -kTwoTo63 && d < kTwoTo63;
}

// Whether a JSON value has the type a worker key takes (the schema's
// KeyType). An integer key also takes a number without a fraction (2.0), as
// some JSON writers put integers. The list and map keys are all in sections
// the spec leaves to the controller, so the spec takes scalars only.
bool hasType(const json& v, KeyType type) {
  switch (type) {
    case KeyType::kInteger:
    case KeyType::kUnsigned:
      return v.is_number_integer() || (v.is_number_float() && isWholeInt64(v.get<double>()));
    case KeyType::kNumber: return v.is_number();
    case KeyType::kBoolean: return v.is_boolean();
    case KeyType::kString: return v.is_string();
    case KeyType::kStringList:
    case KeyType::kStringMap: return false;
  }
  return false;
}
std::string typeName(KeyType type) {
  switch (type) {
    case KeyType::kInteger:
    case KeyType::kUnsigned: return "an integer";
    case KeyType::kNumber: return "a number";
    case KeyType::kBoolean: return "a boolean";
    case KeyType::kString: return "a string";
    case KeyType::kStringList: return "a list of strings";
    case KeyType::kStringMap: return "an object of strings";
  }
  return "";
}

// The text applyOverride() reads for a JSON scalar.
std::string scalarText(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (isWholeInt64(d)) return std::to_string(static_cast<int64_t>(d));
  }
  return v.dump();
}

// A problem validateWorkerConfig() finds in the job's worker config, as a
// FieldError of the spec's field of the same path.
FieldError fromConfigProblem(const ConfigProblem& problem) {
  return {FieldError::Type::kInvalid, problem.path.empty() ? "spec" : "spec." + problem.path,
          problem.detail};
}

// A key's value as the spec writes it: as worker.yaml writes it, the word
// auto included, and a number without a fraction as an integer.
json keyJson(const KeySpec& key, const KeyValue& value) {
  return std::visit(
      [&](const auto& v) -> json {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, std::monostate>) {
          return key.takesAuto ? json("auto") : json(nullptr);
        } else if constexpr (std::is_same_v<T, double>) {
          constexpr double kExactIntegers = 1e15;
          if (std::trunc(v) == v && std::abs(v) < kExactIntegers) {
            return json(static_cast<int64_t>(v));
          }
          return json(v);
        } else {
          return json(v);
        }
      },
      value);
}

// What volume and region names must be (isDnsLabel(), common/names.h), in
// the words of messages.
const std::string& dnsLabelWords() {
  static const std::string words = dnsLabelAllowed("a DNS label");
  return words;
}

// host:port with a port 1..65535 written without leading zeros; the host may
// hold colons (an IPv6 address in brackets) but no whitespace or '/'.
bool isHostPort(const std::string& s) {
  const size_t colon = s.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == s.size()) return false;
  const std::string port = s.substr(colon + 1);
  if (port.find_first_not_of("0123456789") != std::string::npos || port.size() > 5 ||
      port[0] == '0') {
    return false;
  }
  const int p = std::stoi(port);
  return p <= 65535 && s.find_first_of(" \t\n\r\f\v/") == std::string::npos;
}

// A Kubernetes resource.Quantity as storage sizes are written: a decimal
// number and an optional binary (Ki..Ei) or decimal (k, M..E) suffix, > 0.
bool isStorageQuantity(const std::string& s) {
  static const std::regex kQuantity(
      R"(([0-9]+(\.[0-9]*)?|\.[0-9]+)(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?)");
  if (!std::regex_match(s, kQuantity)) return false;
  return s.find_first_of("123456789") < s.find_first_not_of("0123456789.");
}

// Reads the members of one object, reporting unknown ones.
class ObjectReader {
 public:
  ObjectReader(const json& object, std::string path, std::vector<FieldError>& errors)
      : object_(object), path_(std::move(path)), errors_(errors) {}

  // The member `key` when present and not null.
  const json* get(const std::string& key) {
    seen_.insert(key);
    auto it = object_.find(key);
    if (it == object_.end() || it->is_null()) return nullptr;
    return &*it;
  }
  std::string at(const std::string& key) const { return path_ + "." + key; }

  void integer(const std::string& key, int64_t& out, int64_t minimum, int64_t maximum) {
    const json* v = get(key);
    if (v == nullptr) return;
    if (!hasType(*v, KeyType::kInteger) || scalarText(*v).find('.') != std::string::npos) {
      invalid(key, fmt::format("{} is not allowed (allowed: an integer)", v->dump()));
      return;
    }
    const int64_t value =
        v->is_number_float() ? static_cast<int64_t>(v->get<double>()) : v->get<int64_t>();
    if (value < minimum || value > maximum) {
      invalid(key, fmt::format("{} is not allowed (allowed: an integer {})", value,
                               maximum == INT64_MAX ? fmt::format(">= {}", minimum)
                                                    : fmt::format("{}..{}", minimum, maximum)));
      return;
    }
    out = value;
  }
  void optionalInteger(const std::string& key, std::optional<int64_t>& out, int64_t minimum,
                       int64_t maximum = INT64_MAX) {
    if (get(key) == nullptr) return;
    int64_t value = minimum - 1;
    const size_t before = errors_.size();
    integer(key, value, minimum, maximum);
    if (errors_.size() == before) out = value;
  }
  void boolean(const std::string& key, bool& out) {
    const json* v = get(key);
    if (v == nullptr) return;
    if (!v->is_boolean()) {
      invalid(key, fmt::format("{} is not allowed (allowed: true, false)", v->dump()));
      return;
    }
    out = v->get<bool>();
  }
  // A string, checked by `ok` when given.
  void string(const std::string& key, std::string& out, std::string_view allowed = {},
              const std::function<bool(const std::string&)>& ok = {}) {
    const json* v = get(key);
    if (v == nullptr) return;
    if (!v->is_string()) {
      invalid(key, fmt::format("{} is not allowed (allowed: {})", v->dump(),
                               allowed.empty() ? "a string" : allowed));
      return;
    }
    const std::string s = v->get<std::string>();
    if (ok && !ok(s)) {
      invalid(key, fmt::format("{} is not allowed (allowed: {})", json(s).dump(), allowed));
      return;
    }
    out = s;
  }
  void invalid(const std::string& key, std::string detail) {
    errors_.push_back({FieldError::Type::kInvalid, at(key), std::move(detail)});
  }
  void unknownMembers(const std::vector<std::string>& allowed) {
    for (const auto& [key, value] : object_.items()) {
      if (seen_.count(key)) continue;
      std::string list;
      for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
      errors_.push_back(
          {FieldError::Type::kUnknown, at(key), fmt::format("unknown field (allowed: {})", list)});
    }
  }

 private:
  const json& object_;
  std::string path_;
  std::vector<FieldError>& errors_;
  std::set<std::string> seen_;
};

void parseWorkerSection(const std::string& section, const json& value, WorkerConfig& config,
                        std::vector<FieldError>& errors) {
  const std::string path = "spec." + section;
  if (!value.is_object()) {
    errors.push_back({FieldError::Type::kInvalid, path,
                      fmt::format("{} is not allowed (allowed: an object)", jsonKind(value))});
    return;
  }
  for (const auto& [name, v] : value.items()) {
    const std::string dotted = section + "." + name;
    const std::string at = "spec." + section + "." + printableText(name);
    if (v.is_null()) continue;  // absent: the default
    if (const auto why = whyControllerOwned(dotted)) {
      errors.push_back({FieldError::Type::kUnknown, at, fmt::format("unknown field ({})", *why)});
      continue;
    }
    auto key = lookupWorkerKey(dotted);
    if (!key.ok()) {
      errors.push_back({FieldError::Type::kUnknown, at, key.status().message()});
      continue;
    }
    const KeySpec& spec = **key;
    const bool isAuto = spec.takesAuto && v.is_string() && v == "auto";
    if (!isAuto && !hasType(v, spec.type)) {
      errors.push_back({FieldError::Type::kInvalid, at,
                        fmt::format("{} is not allowed (allowed: {}{})", v.dump(),
                                    typeName(spec.type), spec.takesAuto ? ", or auto" : "")});
      continue;
    }
    if (Status s = setWorkerKey(config, spec, scalarText(v)); !s.ok()) {
      errors.push_back({FieldError::Type::kInvalid, at, s.message()});
    }
  }
}

// The pod spec fields of PodOverrides, as spec.template.spec and a region
// name them.
constexpr const char* kPodSpecFields[] = {
    "env",      "volumes",     "volumeMounts", "imagePullSecrets",  "serviceAccountName",
    "affinity", "tolerations", "nodeSelector", "priorityClassName", "resources",
    "sysctls"};

template <size_t kSize>
bool among(std::string_view s, const std::string_view (&list)[kSize]) {
  return std::find(std::begin(list), std::end(list), s) != std::end(list);
}

// An environment variable name as Kubernetes takes it (1.30 and later):
// printable ASCII without '='.
bool isEnvName(const std::string& s) {
  return !s.empty() &&
         std::all_of(s.begin(), s.end(), [](char c) { return c >= 0x20 && c < 0x7f && c != '='; });
}

// A map of strings (labels, annotations, nodeSelector); `reserved` (may be
// empty) names keys the controller keeps for itself.
void readStringMap(ObjectReader& in, const std::string& key,
                   std::map<std::string, std::string>& out,
                   const std::function<bool(std::string_view)>& reserved, std::string_view what) {
  const json* v = in.get(key);
  if (v == nullptr) return;
  if (!v->is_object() ||
      !std::all_of(v->begin(), v->end(), [](const json& item) { return item.is_string(); })) {
    in.invalid(key, "must be an object of string values");
    return;
  }
  bool ok = true;
  for (const auto& [k, value] : v->items()) {
    if (k.empty()) {
      in.invalid(key, "an empty key is not allowed");
      ok = false;
    } else if (reserved && reserved(k)) {
      in.invalid(fmt::format("{}.{}", key, k),
                 fmt::format("{} is not allowed ({}: the controller sets it on the worker pods)",
                             json(k).dump(), what));
      ok = false;
    }
  }
  if (ok) out = v->get<std::map<std::string, std::string>>();
}

bool isSysctlName(const std::string& s) {
  if (s.empty() || s.size() > 253) return false;
  size_t start = 0;
  while (true) {
    const size_t end = s.find_first_of("./", start);
    const std::string_view part(s.data() + start,
                                (end == std::string::npos ? s.size() : end) - start);
    const auto alnum = [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); };
    if (part.empty() || !alnum(part.front()) || !alnum(part.back()) ||
        !std::all_of(part.begin(), part.end(),
                     [&](char c) { return alnum(c) || c == '-' || c == '_'; })) {
      return false;
    }
    if (end == std::string::npos) return true;
    start = end + 1;
  }
}

// A list of objects keyed by the string member `keyField`, each checked by
// `keyOk` (what it allows: `allowed`); `reserved` names the keys the
// worker's pod has already. Duplicate keys are an error.
void readKeyedList(ObjectReader& in, const std::string& key, json& out, const char* keyField,
                   std::string_view allowed, const std::function<bool(const std::string&)>& keyOk,
                   const std::function<bool(const std::string&)>& reserved,
                   std::vector<FieldError>& errors) {
  const json* v = in.get(key);
  if (v == nullptr) return;
  if (!v->is_array()) {
    in.invalid(key, fmt::format("{} is not allowed (allowed: a list of objects)", jsonKind(*v)));
    return;
  }
  const size_t before = errors.size();
  std::set<std::string> seen;
  for (size_t i = 0; i < v->size(); ++i) {
    const json& item = (*v)[i];
    const std::string at = fmt::format("{}[{}]", in.at(key), i);
    if (!item.is_object()) {
      errors.push_back({FieldError::Type::kInvalid, at,
                        fmt::format("{} is not allowed (allowed: an object)", jsonKind(item))});
      continue;
    }
    const std::string field = at + "." + keyField;
    auto k = item.find(keyField);
    if (k == item.end() || k->is_null()) {
      errors.push_back(
          {FieldError::Type::kRequired, field, fmt::format("Required value ({})", allowed)});
      continue;
    }
    if (!k->is_string() || !keyOk(k->get<std::string>())) {
      errors.push_back({FieldError::Type::kInvalid, field,
                        fmt::format("{} is not allowed (allowed: {})", k->dump(), allowed)});
      continue;
    }
    const std::string name = k->get<std::string>();
    if (reserved && reserved(name)) {
      errors.push_back(
          {FieldError::Type::kInvalid, field,
           fmt::format("{} is not allowed (the worker container has it already)", k->dump())});
      continue;
    }
    if (!seen.insert(name).second) {
      errors.push_back(
          {FieldError::Type::kDuplicate, field, fmt::format("Duplicate value: {}", k->dump())});
    }
  }
  if (errors.size() == before) out = *v;
}

// A number of GPUs as a quantity of an extended resource is written: a
// JSON integer >= 0, or a string of decimal digits; nullopt otherwise.
std::optional<int64_t> gpuCount(const json& v) {
  if (v.is_number_unsigned()) {
    return static_cast<int64_t>(std::min<uint64_t>(v.get<uint64_t>(), INT64_MAX));
  }
  if (v.is_number_integer()) {
    return v.get<int64_t>() >= 0 ? std::optional<int64_t>(v.get<int64_t>()) : std::nullopt;
  }
  if (!v.is_string()) return std::nullopt;
  const std::string s = v.get<std::string>();
  if (s.empty() || s.size() > 18 || s.find_first_not_of("0123456789") != std::string::npos) {
    return std::nullopt;
  }
  return std::stoll(s);
}

// The GPU resources of `resources.limits` and `.requests` are whole numbers.
void checkGpuResources(ObjectReader& in, const json& resources) {
  for (const char* list : {"limits", "requests"}) {
    auto it = resources.find(list);
    if (it == resources.end() || !it->is_object()) continue;
    for (const auto& [name, value] : it->items()) {
      if (isGpuResource(name) && !gpuCount(value)) {
        in.invalid(fmt::format("resources.{}.{}", list, name),
                   fmt::format("{} is not allowed (allowed: a whole number of GPUs, e.g. 1)",
                               value.dump()));
      }
    }
  }
}

// The pod spec fields of PodOverrides from `in` (spec.template.spec, or a
// region).
void readPodFields(ObjectReader& in, PodOverrides& pod, std::vector<FieldError>& errors) {
  readKeyedList(
      in, "env", pod.env, "name", "an environment variable name: printable ASCII without '='",
      isEnvName, [](const std::string& s) { return among(s, kReservedEnv); }, errors);
  readKeyedList(
      in, "volumes", pod.volumes, "name", dnsLabelWords(),
      [](const std::string& s) { return isDnsLabel(s); },
      [](const std::string& s) { return among(s, kReservedVolumes); }, errors);
  readKeyedList(
      in, "volumeMounts", pod.volumeMounts, "mountPath",
      "an absolute path of at most 1024 characters",
      [](const std::string& s) { return !s.empty() && s[0] == '/' && s.size() <= 1024; },
      [](const std::string& s) { return among(s, kReservedMountPaths); }, errors);
  if (pod.volumeMounts.is_array()) {
    for (size_t i = 0; i < pod.volumeMounts.size(); ++i) {
      const json& m = pod.volumeMounts[i];
      auto name = m.find("name");
      if (name == m.end() || !name->is_string() || !isDnsLabel(name->get<std::string>())) {
        errors.push_back(
            {FieldError::Type::kRequired, fmt::format("{}[{}].name", in.at("volumeMounts"), i),
             fmt::format("Required value (the name of a volume: {})", dnsLabelWords())});
      }
    }
  }
  readKeyedList(
      in, "imagePullSecrets", pod.imagePullSecrets, "name",
      "the name of a Secret (a DNS subdomain)",
      [](const std::string& v) { return isDnsSubdomain(v); }, {}, errors);
  // A sysctl name as Kubernetes checks it: dot- or slash-separated parts of
  // lowercase letters, digits, '-' and '_', each starting and ending with a
  // letter or digit, at most 253 characters.
  readKeyedList(in, "sysctls", pod.sysctls, "name",
                "a sysctl name such as net.ipv4.tcp_rmem (lowercase letters, digits, '-' and '_' "
                "in parts joined by '.' or '/', at most 253 characters)",
                isSysctlName, {}, errors);
  if (pod.sysctls.is_array()) {
    for (size_t i = 0; i < pod.sysctls.size(); ++i) {
      auto value = pod.sysctls[i].find("value");
      if (value == pod.sysctls[i].end() || !value->is_string()) {
        errors.push_back({FieldError::Type::kRequired,
                          fmt::format("{}[{}].value", in.at("sysctls"), i),
                          "Required value (a string, e.g. \"4096 131072 67108864\")"});
      }
    }
  }
  in.string("serviceAccountName", pod.serviceAccountName,
            "the name of a ServiceAccount (a DNS subdomain), or empty for the default",
            [](const std::string& s) { return s.empty() || isDnsSubdomain(s); });
  in.string("priorityClassName", pod.priorityClassName,
            "the name of a PriorityClass (a DNS subdomain), or empty for none",
            [](const std::string& s) { return s.empty() || isDnsSubdomain(s); });
  if (const json* v = in.get("affinity")) {
    if (v->is_object()) {
      pod.affinity = *v;
    } else {
      in.invalid("affinity", fmt::format("{} is not allowed (allowed: an object with nodeAffinity, "
                                         "podAffinity, podAntiAffinity)",
                                         jsonKind(*v)));
    }
  }
  if (const json* v = in.get("resources")) {
    if (v->is_object()) {
      pod.resources = *v;
      checkGpuResources(in, *v);
    } else {
      in.invalid("resources", fmt::format("{} is not allowed (allowed: an object with limits "
                                          "and requests)",
                                          jsonKind(*v)));
    }
  }
  readStringMap(in, "nodeSelector", pod.nodeSelector, {}, "");
  if (const json* v = in.get("tolerations")) {
    if (v->is_array() &&
        std::all_of(v->begin(), v->end(), [](const json& item) { return item.is_object(); })) {
      pod.tolerations = *v;
    } else {
      in.invalid("tolerations", "must be a list of tolerations (objects)");
    }
  }
}

// labels and annotations of PodOverrides from `in` (spec.template.metadata,
// or a region).
void readPodMetadata(ObjectReader& in, PodOverrides& pod) {
  readStringMap(in, "labels", pod.labels, isReservedLabel, "a label key of the controller");
  readStringMap(in, "annotations", pod.annotations, isReservedAnnotation,
                "an annotation key of the controller");
}

// spec.template: {metadata: {labels, annotations}, spec: {<kPodSpecFields>}}.
void readPodTemplate(const json& value, PodOverrides& pod, std::vector<FieldError>& errors) {
  const std::string path = "spec.template";
  if (!value.is_object()) {
    errors.push_back({FieldError::Type::kInvalid, path,
                      fmt::format("{} is not allowed (allowed: an object)", jsonKind(value))});
    return;
  }
  ObjectReader in(value, path, errors);
  if (const json* m = in.get("metadata")) {
    if (!m->is_object()) {
      in.invalid("metadata", fmt::format("{} is not allowed (allowed: an object with labels and "
                                         "annotations)",
                                         jsonKind(*m)));
    } else {
      ObjectReader meta(*m, in.at("metadata"), errors);
      readPodMetadata(meta, pod);
      meta.unknownMembers({"labels", "annotations"});
    }
  }
  if (const json* sp = in.get("spec")) {
    if (!sp->is_object()) {
      in.invalid("spec", fmt::format("{} is not allowed (allowed: an object)", jsonKind(*sp)));
    } else {
      ObjectReader ps(*sp, in.at("spec"), errors);
      readPodFields(ps, pod, errors);
      ps.unknownMembers(
          std::vector<std::string>(std::begin(kPodSpecFields), std::end(kPodSpecFields)));
    }
  }
  in.unknownMembers({"metadata", "spec"});
}

Region parseRegion(const json& value, const std::string& path, std::vector<FieldError>& errors) {
  Region r;
  if (!value.is_object()) {
    errors.push_back({FieldError::Type::kInvalid, path,
                      fmt::format("{} is not allowed (allowed: an object)", jsonKind(value))});
    return r;
  }
  ObjectReader in(value, path, errors);
  if (in.get("name") == nullptr) {
    errors.push_back({FieldError::Type::kRequired, in.at("name"),
                      fmt::format("Required value ({})", dnsLabelWords())});
  }
  in.string("name", r.name, dnsLabelWords(), isDnsLabel);
  in.string("cluster", r.cluster, "a member cluster name (a DNS label) or local", isDnsLabel);
  in.integer("replicas", r.replicas, 1, 4096);
  readPodFields(in, r.pod, errors);
  readPodMetadata(in, r.pod);
  in.string("dataPath", r.dataPath);
  if (const json* g = in.get("gateway")) {
    if (!g->is_object()) {
      in.invalid("gateway", fmt::format("{} is not allowed (allowed: an object)", jsonKind(*g)));
    } else {
      ObjectReader gw(*g, in.at("gateway"), errors);
      gw.string("serviceType", r.gateway.serviceType, "ClusterIP, NodePort, LoadBalancer",
                [](const std::string& s) {
                  return s == "ClusterIP" || s == "NodePort" || s == "LoadBalancer";
                });
      gw.integer("port", r.gateway.port, 1, 65535);
      gw.string("endpoint", r.gateway.endpoint, "host:port with a port 1..65535",
                [](const std::string& s) { return s.empty() || isHostPort(s); });
      gw.unknownMembers({"serviceType", "port", "endpoint"});
    }
  }
  std::vector<std::string> allowed = {"name",    "cluster", "replicas",   "dataPath",
                                      "gateway", "labels",  "annotations"};
  allowed.insert(allowed.end(), std::begin(kPodSpecFields), std::end(kPodSpecFields));
  in.unknownMembers(allowed);
  return r;
}

}  // namespace

const std::vector<std::string>& workerSpecSections() {
  static const std::vector<std::string> sections = {"model",     "dataset",    "training", "sync",
                                                    "transport", "checkpoint", "output",   "log"};
  return sections;
}

std::optional<std::string_view> whyControllerOwned(std::string_view path) {
  if (path == "dataset.shardIndex" || path == "dataset.shardCount") {
    return "the controller derives the shards from the worker's place in the job";
  }
  // Of transport, everything but the initial window and the connections
  // per peer is the job's wiring, which the controller derives from the
  // regions and their gateways (or geotrain local's emulation).
  if (path.starts_with("transport.") && path != "transport.tcpInitialWindow" &&
      path != "transport.connections") {
    return "the controller sets the workers' endpoints, regions and keys; of transport, a "
           "TrainingJob sets tcpInitialWindow and connections";
  }
  return std::nullopt;
}

bool isControllerOwned(std::string_view path) {
  return whyControllerOwned(path).has_value();
}

bool isReservedLabel(std::string_view key) {
  return among(key, kReservedLabels) ||
         std::any_of(std::begin(kReservedPrefixes), std::end(kReservedPrefixes),
                     [&](std::string_view p) { return key.substr(0, p.size()) == p; });
}

bool isReservedAnnotation(std::string_view key) {
  return among(key, kReservedAnnotations) ||
         std::any_of(std::begin(kReservedPrefixes), std::end(kReservedPrefixes),
                     [&](std::string_view p) { return key.substr(0, p.size()) == p; });
}

namespace {

// `base` with `over`'s entries merged in by the string member `key`: an
// entry of `over` replaces the one of `base` with the same key in its place,
// the others follow in `over`'s order.
json mergeByKey(const json& base, const json& over, const char* key) {
  json out = base;
  for (const json& item : over) {
    auto same = std::find_if(out.begin(), out.end(), [&](const json& b) {
      return b.value(key, json()) == item.value(key, json());
    });
    if (same != out.end()) {
      *same = item;
    } else {
      out.push_back(item);
    }
  }
  return out;
}

}  // namespace

PodOverrides mergedPod(const PodOverrides& job, const PodOverrides& region) {
  PodOverrides p = job;
  for (const auto& [k, v] : region.labels) p.labels[k] = v;
  for (const auto& [k, v] : region.annotations) p.annotations[k] = v;
  for (const auto& [k, v] : region.nodeSelector) p.nodeSelector[k] = v;
  p.env = mergeByKey(job.env, region.env, "name");
  p.volumes = mergeByKey(job.volumes, region.volumes, "name");
  p.volumeMounts = mergeByKey(job.volumeMounts, region.volumeMounts, "mountPath");
  p.imagePullSecrets = mergeByKey(job.imagePullSecrets, region.imagePullSecrets, "name");
  p.sysctls = mergeByKey(job.sysctls, region.sysctls, "name");
  for (const json& t : region.tolerations) p.tolerations.push_back(t);
  if (!region.serviceAccountName.empty()) p.serviceAccountName = region.serviceAccountName;
  if (!region.priorityClassName.empty()) p.priorityClassName = region.priorityClassName;
  if (!region.affinity.empty()) p.affinity = region.affinity;
  if (!region.resources.empty()) p.resources = region.resources;
  return p;
}

PodOverrides TrainingJobSpec::podFor(const Region& region) const {
  return mergedPod(podTemplate, region.pod);
}

bool isGpuResource(std::string_view name) {
  return among(name, kGpuResources) ||
         name.substr(0, kGpuResourcePrefix.size()) == kGpuResourcePrefix;
}

bool asksForGpu(const json& resources) {
  if (!resources.is_object()) return false;
  for (const char* list : {"limits", "requests"}) {
    auto it = resources.find(list);
    if (it == resources.end() || !it->is_object()) continue;
    for (const auto& [name, value] : it->items()) {
      if (isGpuResource(name) && gpuCount(value).value_or(0) > 0) return true;
    }
  }
  return false;
}

std::string TrainingJobSpec::deviceFor(const Region& region) const {
  if (worker.training.device == "auto" && asksForGpu(podFor(region).resources)) return "cuda";
  return worker.training.device;
}

std::string FieldError::toString() const {
  return path + ": " + detail;
}

std::string joinErrors(const std::vector<FieldError>& errors) {
  std::string out;
  for (const auto& e : errors) out += (out.empty() ? "" : "; ") + e.toString();
  return out;
}

std::string CheckpointVolume::accessModeFor(int64_t replicas) const {
  if (!accessMode.empty()) return accessMode;
  return replicas == 1 ? "ReadWriteOnce" : "ReadWriteMany";
}

WorkerConfig TrainingJobSpec::defaultWorkerConfig() {
  WorkerConfig c;
  c.sync.algorithm = "dts";
  return c;
}

int64_t TrainingJobSpec::totalReplicas() const {
  int64_t n = 0;
  for (const auto& r : regions) n += r.replicas;
  return n;
}

std::string TrainingJobSpec::dataPath(const Region& region) const {
  return region.dataPath.empty() ? worker.dataset.path : region.dataPath;
}

namespace {

// ---- Decoding: each field alone (its type, range, allowed values) ------------

// spec.seed: job.seed of every worker.
void readSeed(ObjectReader& in, WorkerConfig& worker) {
  const json* seed = in.get("seed");
  if (seed == nullptr) return;
  if (seed->is_number_unsigned() || (seed->is_number_integer() && seed->get<int64_t>() >= 0)) {
    worker.job.seed = seed->get<uint64_t>();
  } else {
    in.invalid("seed", fmt::format("{} is not allowed (allowed: an integer >= 0)", seed->dump()));
  }
}

// spec.model, spec.dataset, ...: the worker.yaml sections, key by key.
void readWorkerSections(ObjectReader& in, WorkerConfig& worker, std::vector<FieldError>& errors) {
  for (const std::string& section : workerSpecSections()) {
    if (const json* v = in.get(section)) parseWorkerSection(section, *v, worker, errors);
  }
  // Both given is an error of the section as written, which the config (where
  // one clears the other) can no longer show.
  const json* model = in.get("model");
  if (model == nullptr || !model->is_object()) return;
  auto given = [&](const char* key) {
    auto it = model->find(key);
    return it != model->end() && it->is_string() && !it->get<std::string>().empty();
  };
  if (given("builtin") && given("torchscript")) {
    errors.push_back({FieldError::Type::kInvalid, "spec.model",
                      "both builtin and torchscript are set (allowed: exactly one)"});
  }
}

// spec.regions: 1 to 64 regions with unique names.
void readRegions(ObjectReader& in, std::vector<Region>& out, std::vector<FieldError>& errors) {
  const json* regions = in.get("regions");
  if (regions == nullptr || (regions->is_array() && regions->empty())) {
    errors.push_back({FieldError::Type::kRequired, "spec.regions",
                      "Required value (at least one region: name, cluster, replicas, ...)"});
    return;
  }
  if (!regions->is_array()) {
    in.invalid("regions",
               fmt::format("{} is not allowed (allowed: a list of regions)", jsonKind(*regions)));
    return;
  }
  if (regions->size() > 64) {
    in.invalid("regions",
               fmt::format("{} regions are not allowed (allowed: 1..64)", regions->size()));
    return;
  }
  std::set<std::string> names;
  for (size_t i = 0; i < regions->size(); ++i) {
    const std::string path = fmt::format("spec.regions[{}]", i);
    Region r = parseRegion((*regions)[i], path, errors);
    if (!r.name.empty() && !names.insert(r.name).second) {
      errors.push_back({FieldError::Type::kDuplicate, path + ".name",
                        fmt::format("Duplicate value: {} (region names are unique in a job)",
                                    json(r.name).dump())});
    }
    out.push_back(std::move(r));
  }
}

// spec.runPolicy.
void readRunPolicy(ObjectReader& in, RunPolicy& policy, std::vector<FieldError>& errors) {
  const json* rp = in.get("runPolicy");
  if (rp == nullptr) return;
  if (!rp->is_object()) {
    in.invalid("runPolicy", fmt::format("{} is not allowed (allowed: an object)", jsonKind(*rp)));
    return;
  }
  ObjectReader p(*rp, "spec.runPolicy", errors);
  // The Job fields these become are int32.
  p.integer("backoffLimitPerIndex", policy.backoffLimitPerIndex, 0, INT32_MAX);
  p.optionalInteger("backoffLimit", policy.backoffLimit, 0, INT32_MAX);
  p.optionalInteger("activeDeadlineSeconds", policy.activeDeadlineSeconds, 1);
  p.optionalInteger("ttlSecondsAfterFinished", policy.ttlSecondsAfterFinished, 0);
  p.boolean("suspend", policy.suspend);
  p.unknownMembers({"backoffLimitPerIndex", "backoffLimit", "activeDeadlineSeconds",
                    "ttlSecondsAfterFinished", "suspend"});
}

// spec.checkpointVolume: a size is required.
void readCheckpointVolume(ObjectReader& in, std::optional<CheckpointVolume>& out,
                          std::vector<FieldError>& errors) {
  const json* cv = in.get("checkpointVolume");
  if (cv == nullptr) return;
  if (!cv->is_object()) {
    in.invalid("checkpointVolume",
               fmt::format("{} is not allowed (allowed: an object)", jsonKind(*cv)));
    return;
  }
  CheckpointVolume volume;
  ObjectReader v(*cv, "spec.checkpointVolume", errors);
  const size_t before = errors.size();
  v.string("size", volume.size, "a quantity of storage, e.g. 20Gi or 500M", isStorageQuantity);
  if (errors.size() == before && volume.size.empty()) {
    errors.push_back({FieldError::Type::kRequired, "spec.checkpointVolume.size",
                      "Required value (a quantity of storage, e.g. 20Gi)"});
  }
  v.string("storageClassName", volume.storageClassName,
           "the name of a StorageClass (a DNS subdomain), or empty for the default",
           [](const std::string& s) { return s.empty() || isDnsSubdomain(s); });
  v.string("accessMode", volume.accessMode,
           "ReadWriteOnce, ReadWriteMany, ReadWriteOncePod, or empty for ReadWriteOnce with "
           "one replica and ReadWriteMany with several",
           [](const std::string& s) {
             return s.empty() || s == "ReadWriteOnce" || s == "ReadWriteMany" ||
                    s == "ReadWriteOncePod";
           });
  v.unknownMembers({"size", "storageClassName", "accessMode"});
  out = std::move(volume);
}

// Every field of the spec object, each on its own; unknown fields are errors.
void decodeSpec(const json& specJson, TrainingJobSpec& spec, std::vector<FieldError>& errors) {
  ObjectReader in(specJson, "spec", errors);
  in.string("image", spec.image);
  readSeed(in, spec.worker);
  readWorkerSections(in, spec.worker, errors);
  if (const json* t = in.get("template")) readPodTemplate(*t, spec.podTemplate, errors);
  readRegions(in, spec.regions, errors);
  readRunPolicy(in, spec.runPolicy, errors);
  readCheckpointVolume(in, spec.checkpointVolume, errors);
  in.optionalInteger("ttlSecondsAfterFinished", spec.ttlSecondsAfterFinished, 0);
  std::vector<std::string> allowed = {"image", "seed", "ttlSecondsAfterFinished"};
  allowed.insert(allowed.end(), workerSpecSections().begin(), workerSpecSections().end());
  allowed.insert(allowed.end(), {"template", "regions", "runPolicy", "checkpointVolume"});
  in.unknownMembers(allowed);
}

// ---- Validation: relations between fields, on a spec whose fields are fine ---

// The checkpoint volume is mounted at checkpoint.dir; the packaged data sets
// default to their Debian folder, a user's own files have none.
void checkPaths(const TrainingJobSpec& spec, std::vector<FieldError>& errors) {
  if (spec.checkpointVolume && spec.worker.checkpoint.dir.empty()) {
    errors.push_back({FieldError::Type::kRequired, "spec.checkpoint.dir",
                      "Required value (spec.checkpointVolume is mounted there: set a folder, "
                      "e.g. /checkpoints)"});
  }
  const std::string& name = spec.worker.dataset.name;
  for (size_t i = 0; i < spec.regions.size(); ++i) {
    if ((name == "npy" || name == "tokens") && spec.dataPath(spec.regions[i]).empty()) {
      errors.push_back({FieldError::Type::kRequired, fmt::format("spec.regions[{}].dataPath", i),
                        fmt::format("Required value (dataset {} needs a path: set "
                                    "spec.dataset.path or this)",
                                    name)});
    }
  }
}

// The mounts of `pod` (at `path`) leave the worker's checkpoint folder alone.
void checkCheckpointMount(const TrainingJobSpec& spec, const PodOverrides& pod,
                          const std::string& path, std::vector<FieldError>& errors) {
  const std::string& dir = spec.worker.checkpoint.dir;
  if (dir.empty()) return;
  for (size_t k = 0; k < pod.volumeMounts.size(); ++k) {
    if (pod.volumeMounts[k].value("mountPath", "") != dir) continue;
    errors.push_back({FieldError::Type::kInvalid, fmt::format("{}[{}].mountPath", path, k),
                      fmt::format("{} is not allowed (spec.checkpoint.dir: the worker's "
                                  "checkpoints are mounted there)",
                                  json(dir).dump())});
  }
}

// The pod fields: the checkpoint folder is the worker's own mount, and every
// mount of a region's pods names a volume they have (the job's or the
// region's), else the API server would refuse the region's Job.
void checkVolumeMounts(const TrainingJobSpec& spec, std::vector<FieldError>& errors) {
  checkCheckpointMount(spec, spec.podTemplate, "spec.template.spec.volumeMounts", errors);
  std::set<size_t> jobMountsReported;  // each job-wide mount once, at the first region lacking it
  for (size_t i = 0; i < spec.regions.size(); ++i) {
    const std::string regionMounts = fmt::format("spec.regions[{}].volumeMounts", i);
    checkCheckpointMount(spec, spec.regions[i].pod, regionMounts, errors);
    const PodOverrides pod = spec.podFor(spec.regions[i]);
    auto lacks = [&](const json& mount) {
      const json name = mount.value("name", json());
      return std::none_of(pod.volumes.begin(), pod.volumes.end(),
                          [&](const json& v) { return v.value("name", json()) == name; });
    };
    auto report = [&](const std::string& path, size_t k, const json& mount) {
      errors.push_back({FieldError::Type::kInvalid, fmt::format("{}[{}].name", path, k),
                        fmt::format("{} is not allowed (region {} has no such volume: add it to "
                                    "spec.template.spec.volumes or spec.regions[{}].volumes)",
                                    mount.value("name", json()).dump(), spec.regions[i].name, i)});
    };
    const json& own = spec.regions[i].pod.volumeMounts;
    for (size_t k = 0; k < own.size(); ++k) {
      if (lacks(own[k])) report(regionMounts, k, own[k]);
    }
    const json& shared = spec.podTemplate.volumeMounts;
    for (size_t k = 0; k < shared.size(); ++k) {
      // Replaced by the region's mount at the same path: that one counts.
      const bool replaced = std::any_of(own.begin(), own.end(), [&](const json& m) {
        return m.value("mountPath", "") == shared[k].value("mountPath", "");
      });
      if (!replaced && lacks(shared[k]) && jobMountsReported.insert(k).second) {
        report("spec.template.spec.volumeMounts", k, shared[k]);
      }
    }
  }
}

// A NodePort gateway needs the address the other regions dial.
void checkGateways(const TrainingJobSpec& spec, std::vector<FieldError>& errors) {
  for (size_t i = 0; i < spec.regions.size(); ++i) {
    const Gateway& g = spec.regions[i].gateway;
    if (g.serviceType != "NodePort") continue;
    const std::string path = fmt::format("spec.regions[{}].gateway.endpoint", i);
    if (g.endpoint.empty()) {
      errors.push_back({FieldError::Type::kRequired, path,
                        "Required value (a NodePort gateway needs the address the other regions "
                        "dial: a node's external address and a node port 30000..32767)"});
    } else if (const int port = std::stoi(g.endpoint.substr(g.endpoint.rfind(':') + 1));
               port < 30000 || port > 32767) {
      errors.push_back({FieldError::Type::kInvalid, path,
                        fmt::format("port {} is not allowed for a NodePort gateway (allowed: "
                                    "30000..32767, the Service's nodePort)",
                                    port)});
    }
  }
}

// training.device cuda: a worker of a region without a GPU would fail at
// start (no usable CUDA device), or find a GPU that no scheduler gave it.
void checkDevice(const TrainingJobSpec& spec, std::vector<FieldError>& errors) {
  if (spec.worker.training.device != "cuda") return;
  std::string without;
  for (size_t i = 0; i < spec.regions.size(); ++i) {
    if (asksForGpu(spec.podFor(spec.regions[i]).resources)) continue;
    without += fmt::format("{}{} (spec.regions[{}])", without.empty() ? "" : ", ",
                           spec.regions[i].name, i);
  }
  if (without.empty()) return;
  errors.push_back(
      {FieldError::Type::kInvalid, "spec.training.device",
       fmt::format("cuda is not allowed: the pods of {} ask for no GPU (allowed: auto, which "
                   "is cuda in the regions whose resources ask for nvidia.com/gpu and the CPU "
                   "in the others; cpu; or cuda with resources.limits nvidia.com/gpu: 1 in "
                   "spec.template.spec or in every region)",
                   without)});
}

// How the regions sync: only each region's leader is reachable from the
// others; and the worker config of the job as a whole (one worker per rank
// of the total replicas), as validateWorkerConfig() sees it.
void checkSync(const TrainingJobSpec& spec, std::vector<FieldError>& errors) {
  const bool severalWorkers = std::any_of(spec.regions.begin(), spec.regions.end(),
                                          [](const Region& r) { return r.replicas > 1; });
  if (spec.regions.size() > 1 && severalWorkers && !spec.worker.sync.hierarchical &&
      spec.worker.sync.algorithm != "none") {
    errors.push_back({FieldError::Type::kInvalid, "spec.sync.hierarchical",
                      "false is not allowed when a region has several replicas (allowed: true: "
                      "only each region's leader is reachable from the other regions)"});
  }
  WorkerConfig whole = spec.worker;
  whole.worker.worldSize = spec.totalReplicas();
  whole.worker.region = spec.regions.front().name;
  whole.worker.regionSize = spec.regions.front().replicas;
  const std::string path = spec.dataPath(spec.regions.front());
  whole.dataset.path = path.empty() ? std::string(1, '-') : path;  // empty: checkPaths reports it
  if (const auto problem = workerConfigProblem(whole)) {
    errors.push_back(fromConfigProblem(*problem));
  }
}

// Across fields, on the job as a whole; `spec` is decodeSpec()'s without
// errors (at least one region).
void validateSpec(const TrainingJobSpec& spec, std::vector<FieldError>& errors) {
  checkPaths(spec, errors);
  checkVolumeMounts(spec, errors);
  checkGateways(spec, errors);
  checkDevice(spec, errors);
  checkSync(spec, errors);
}

}  // namespace

ParsedSpec parseSpec(const json& object) {
  ParsedSpec out;
  const json* specJson = nullptr;
  if (object.is_object()) {
    auto it = object.find("spec");
    if (it != object.end() && !it->is_null()) specJson = &*it;
  }
  if (specJson == nullptr) {
    out.errors.push_back({FieldError::Type::kRequired, "spec", "Required value"});
    return out;
  }
  if (!specJson->is_object()) {
    out.errors.push_back(
        {FieldError::Type::kInvalid, "spec",
         fmt::format("{} is not allowed (allowed: an object)", jsonKind(*specJson))});
    return out;
  }
  decodeSpec(*specJson, out.spec, out.errors);
  if (!out.errors.empty()) return out;
  validateSpec(out.spec, out.errors);
  return out;
}

namespace {

// The pod spec fields of `pod`, every one of them (empty when unset).
json podFieldsToJson(const PodOverrides& pod) {
  return {{"env", pod.env},
          {"volumes", pod.volumes},
          {"volumeMounts", pod.volumeMounts},
          {"imagePullSecrets", pod.imagePullSecrets},
          {"serviceAccountName", pod.serviceAccountName},
          {"affinity", pod.affinity},
          {"tolerations", pod.tolerations},
          {"nodeSelector", pod.nodeSelector},
          {"priorityClassName", pod.priorityClassName},
          {"resources", pod.resources},
          {"sysctls", pod.sysctls}};
}

}  // namespace

json specToJson(const TrainingJobSpec& spec) {
  json out = json::object();
  if (!spec.image.empty()) out["image"] = spec.image;
  out["seed"] = spec.worker.job.seed;
  // Every key of the worker sections the spec has, in the schema's order.
  for (const KeySpec& key : workerConfigSchema()) {
    if (std::find(workerSpecSections().begin(), workerSpecSections().end(), key.section) ==
            workerSpecSections().end() ||
        isControllerOwned(key.path)) {
      continue;
    }
    out[key.section][key.name] = keyJson(key, workerKeyValue(spec.worker, key));
  }
  out["template"] = {
      {"metadata",
       {{"labels", spec.podTemplate.labels}, {"annotations", spec.podTemplate.annotations}}},
      {"spec", podFieldsToJson(spec.podTemplate)}};
  json regions = json::array();
  for (const auto& r : spec.regions) {
    json region = podFieldsToJson(r.pod);
    region.update(
        json{{"name", r.name},
             {"cluster", r.cluster},
             {"replicas", r.replicas},
             {"labels", r.pod.labels},
             {"annotations", r.pod.annotations},
             {"gateway", {{"serviceType", r.gateway.serviceType}, {"port", r.gateway.port}}}});
    if (!r.dataPath.empty()) region["dataPath"] = r.dataPath;
    if (!r.gateway.endpoint.empty()) region["gateway"]["endpoint"] = r.gateway.endpoint;
    regions.push_back(std::move(region));
  }
  out["regions"] = std::move(regions);
  json rp = {{"backoffLimitPerIndex", spec.runPolicy.backoffLimitPerIndex},
             {"suspend", spec.runPolicy.suspend}};
  if (spec.runPolicy.backoffLimit) rp["backoffLimit"] = *spec.runPolicy.backoffLimit;
  if (spec.runPolicy.activeDeadlineSeconds) {
    rp["activeDeadlineSeconds"] = *spec.runPolicy.activeDeadlineSeconds;
  }
  if (spec.runPolicy.ttlSecondsAfterFinished) {
    rp["ttlSecondsAfterFinished"] = *spec.runPolicy.ttlSecondsAfterFinished;
  }
  out["runPolicy"] = std::move(rp);
  if (spec.checkpointVolume) {
    json cv = {{"size", spec.checkpointVolume->size}};
    if (!spec.checkpointVolume->storageClassName.empty()) {
      cv["storageClassName"] = spec.checkpointVolume->storageClassName;
    }
    if (!spec.checkpointVolume->accessMode.empty()) {
      cv["accessMode"] = spec.checkpointVolume->accessMode;
    }
    out["checkpointVolume"] = std::move(cv);
  }
  if (spec.ttlSecondsAfterFinished) out["ttlSecondsAfterFinished"] = *spec.ttlSecondsAfterFinished;
  return out;
}

// --- status ------------------------------------------------------------

bool setCondition(std::vector<Condition>& conditions, Condition c, const std::string& now) {
  for (Condition& existing : conditions) {
    if (existing.type != c.type) continue;
    c.lastTransitionTime = existing.status == c.status ? existing.lastTransitionTime : now;
    if (existing == c) return false;
    existing = std::move(c);
    return true;
  }
  c.lastTransitionTime = now;
  conditions.push_back(std::move(c));
  return true;
}

const Condition* findCondition(const std::vector<Condition>& conditions, std::string_view type) {
  for (const Condition& c : conditions) {
    if (c.type == type) return &c;
  }
  return nullptr;
}

json statusToJson(const TrainingJobStatus& s) {
  json out = {{"observedGeneration", s.observedGeneration}};
  if (!s.state.empty()) out["state"] = s.state;
  if (!s.regionsReady.empty()) out["regionsReady"] = s.regionsReady;
  json conditions = json::array();
  for (const auto& c : s.conditions) {
    conditions.push_back({{"type", c.type},
                          {"status", c.status},
                          {"observedGeneration", c.observedGeneration},
                          {"lastTransitionTime", c.lastTransitionTime},
                          {"reason", c.reason},
                          {"message", c.message}});
  }
  out["conditions"] = std::move(conditions);
  json regions = json::array();
  for (const auto& r : s.regions) {
    json region = {{"name", r.name},           {"ready", r.ready},   {"active", r.active},
                   {"succeeded", r.succeeded}, {"failed", r.failed}, {"reachable", r.reachable},
                   {"started", r.started}};
    if (!r.endpoint.empty()) region["endpoint"] = r.endpoint;
    regions.push_back(std::move(region));
  }
  out["regions"] = std::move(regions);
  json progress = json::object();
  if (s.progress.step) progress["step"] = *s.progress.step;
  if (s.progress.loss) progress["loss"] = *s.progress.loss;
  if (s.progress.accuracy) progress["accuracy"] = *s.progress.accuracy;
  if (s.progress.evalLoss) progress["evalLoss"] = *s.progress.evalLoss;
  out["progress"] = std::move(progress);
  if (!s.startTime.empty()) out["startTime"] = s.startTime;
  if (!s.completionTime.empty()) out["completionTime"] = s.completionTime;
  if (!s.outputPath.empty()) out["outputPath"] = s.outputPath;
  if (s.keyRotation) {
    json k = {{"request", s.keyRotation->request}, {"phase", s.keyRotation->phase}};
    if (!s.keyRotation->phaseSince.empty()) k["phaseSince"] = s.keyRotation->phaseSince;
    out["keyRotation"] = std::move(k);
  }
  return out;
}

TrainingJobStatus statusFromJson(const json& j) {
  TrainingJobStatus s;
  if (!j.is_object()) return s;
  auto str = [](const json& o, const char* key) {
    auto it = o.find(key);
    return it != o.end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  auto integer = [](const json& o, const char* key) -> std::optional<int64_t> {
    auto it = o.find(key);
    if (it == o.end() || !it->is_number_integer()) return std::nullopt;
    return it->get<int64_t>();
  };
  s.state = str(j, "state");
  s.regionsReady = str(j, "regionsReady");
  s.observedGeneration = integer(j, "observedGeneration").value_or(0);
  if (auto it = j.find("conditions"); it != j.end() && it->is_array()) {
    for (const json& c : *it) {
      if (!c.is_object() || str(c, "type").empty()) continue;
      s.conditions.push_back({str(c, "type"), str(c, "status"),
                              integer(c, "observedGeneration").value_or(0),
                              str(c, "lastTransitionTime"), str(c, "reason"), str(c, "message")});
    }
  }
  if (auto it = j.find("regions"); it != j.end() && it->is_array()) {
    for (const json& r : *it) {
      if (!r.is_object() || str(r, "name").empty()) continue;
      RegionStatus rs;
      rs.name = str(r, "name");
      rs.ready = integer(r, "ready").value_or(0);
      rs.active = integer(r, "active").value_or(0);
      rs.succeeded = integer(r, "succeeded").value_or(0);
      rs.failed = integer(r, "failed").value_or(0);
      rs.endpoint = str(r, "endpoint");
      auto reachable = r.find("reachable");
      rs.reachable = reachable == r.end() || !reachable->is_boolean() || reachable->get<bool>();
      // Absent (a status from before the field): not started, so nothing is
      // reported degraded until the region's workers have all been ready once.
      auto started = r.find("started");
      rs.started = started != r.end() && started->is_boolean() && started->get<bool>();
      s.regions.push_back(std::move(rs));
    }
  }
  if (auto it = j.find("progress"); it != j.end() && it->is_object()) {
    s.progress.step = integer(*it, "step");
    if (auto l = it->find("loss"); l != it->end() && l->is_number())
      s.progress.loss = l->get<double>();
    if (auto a = it->find("accuracy"); a != it->end() && a->is_number()) {
      s.progress.accuracy = a->get<double>();
    }
    if (auto e = it->find("evalLoss"); e != it->end() && e->is_number()) {
      s.progress.evalLoss = e->get<double>();
    }
  }
  s.startTime = str(j, "startTime");
  s.completionTime = str(j, "completionTime");
  s.outputPath = str(j, "outputPath");
  if (auto it = j.find("keyRotation"); it != j.end() && it->is_object()) {
    s.keyRotation =
        KeyRotationStatus{str(*it, "request"), str(*it, "phase"), str(*it, "phaseSince")};
  }
  return s;
}

std::string rfc3339Now() {
  return rfc3339(std::chrono::system_clock::now());
}

std::string rfc3339(std::chrono::system_clock::time_point time) {
  const auto seconds = std::chrono::floor<std::chrono::seconds>(time);
  return fmt::format("{:%Y-%m-%dT%H:%M:%SZ}",
                     fmt::gmtime(std::chrono::system_clock::to_time_t(seconds)));
}

}  // namespace geo::api
