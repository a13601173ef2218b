#pragma once
// Label and field selectors with the real server's grammar.
//
// Label selectors: comma-separated requirements `k`, `!k`, `k=v`, `k==v`,
// `k!=v`, `k in (a,b)`, `k notin (a,b)`, `k>n`, `k<n`. Field selectors:
// `path=v`, `path==v`, `path!=v` over the fields the kind supports
// (metadata.name and metadata.namespace for every kind). Parsing throws
// ApiError 400 like the server.

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace geo::testapi {

using Json = nlohmann::json;

class LabelSelector {
 public:
  // Empty text selects everything.
  static LabelSelector parse(std::string_view text);
  bool matches(const Json& object) const;
  bool empty() const { return requirements_.empty(); }

 private:
  struct Requirement {
    enum class Op { kExists, kNotExists, kIn, kNotIn, kGt, kLt };
    std::string key;
    Op op;
    std::vector<std::string> values;
  };
  std::vector<Requirement> requirements_;
};

class FieldSelector {
 public:
  // `kind` decides which fields beyond metadata.name/namespace are allowed.
  static FieldSelector parse(std::string_view text, std::string_view kind);
  bool matches(const Json& object) const;
  // The name the selector pins with metadata.name=..., if any.
  std::optional<std::string> exactName() const;

 private:
  struct Requirement {
    std::string path;
    bool equal;
    std::string value;
  };
  std::vector<Requirement> requirements_;
};

}  // namespace geo::testapi
