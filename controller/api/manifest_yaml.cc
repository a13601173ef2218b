#include "controller/api/manifest_yaml.h"

#include <exception>
#include <regex>
#include <string>

namespace geo::api {

nlohmann::json yamlNodeToJson(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Null:
    case YAML::NodeType::Undefined: return nlohmann::json();
    case YAML::NodeType::Sequence: {
      nlohmann::json out = nlohmann::json::array();
      for (const auto& child : node) out.push_back(yamlNodeToJson(child));
      return out;
    }
    case YAML::NodeType::Map: {
      nlohmann::json out = nlohmann::json::object();
      for (const auto& kv : node) out[kv.first.as<std::string>()] = yamlNodeToJson(kv.second);
      return out;
    }
    case YAML::NodeType::Scalar: break;
  }
  const std::string s = node.Scalar();
  // Quoted scalars (tag "!") stay strings; plain ones resolve like YAML 1.2's
  // core schema, as sigs.k8s.io/yaml does.
  if (node.Tag() == "!") return s;
  if (s == "null" || s == "~" || s == "Null" || s == "NULL") return nlohmann::json();
  if (s == "true" || s == "True" || s == "TRUE") return true;
  if (s == "false" || s == "False" || s == "FALSE") return false;
  static const std::regex kInt(R"([-+]?[0-9]+)");
  static const std::regex kFloat(R"([-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?)");
  if (std::regex_match(s, kInt)) {
    try {
      return std::stoll(s);
    } catch (const std::exception&) {
      return s;
    }
  }
  if (std::regex_match(s, kFloat)) return std::stod(s);
  return s;
}

}  // namespace geo::api
