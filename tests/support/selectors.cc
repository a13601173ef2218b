#include "tests/support/selectors.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <set>

#include "tests/support/api_error.h"

namespace geo::testapi {

namespace {

std::string trim(std::string_view s) {
  const size_t b = s.find_first_not_of(" \t");
  if (b == std::string_view::npos) return "";
  const size_t e = s.find_last_not_of(" \t");
  return std::string(s.substr(b, e - b + 1));
}

// Splits on commas outside parentheses.
std::vector<std::string> splitTopLevel(std::string_view text) {
  std::vector<std::string> parts;
  int depth = 0;
  std::string cur;
  for (char c : text) {
    if (c == '(') ++depth;
    if (c == ')') --depth;
    if (c == ',' && depth == 0) {
      parts.push_back(trim(cur));
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (!trim(cur).empty() || !parts.empty()) parts.push_back(trim(cur));
  return parts;
}

ApiError selectorError(std::string_view text, std::string_view why) {
  return badRequest(fmt::format("unable to parse requirement: {}: \"{}\"", why, text));
}

std::optional<std::string> labelOf(const Json& object, const std::string& key) {
  const Json* labels = nullptr;
  if (object.contains("metadata") && object["metadata"].contains("labels")) {
    labels = &object["metadata"]["labels"];
  }
  if (labels == nullptr || !labels->is_object() || !labels->contains(key)) return std::nullopt;
  const Json& v = (*labels)[key];
  return v.is_string() ? v.get<std::string>() : v.dump();
}

// The string value at a dotted path, or nullopt.
std::optional<std::string> fieldOf(const Json& object, const std::string& path) {
  const Json* cur = &object;
  size_t pos = 0;
  while (pos <= path.size()) {
    const size_t dot = path.find('.', pos);
    const std::string part = path.substr(pos, dot == std::string::npos ? dot : dot - pos);
    if (!cur->is_object() || !cur->contains(part)) return std::nullopt;
    cur = &(*cur)[part];
    if (dot == std::string::npos) break;
    pos = dot + 1;
  }
  if (cur->is_string()) return cur->get<std::string>();
  if (cur->is_null()) return std::nullopt;
  return cur->dump();
}

}  // namespace

LabelSelector LabelSelector::parse(std::string_view text) {
  LabelSelector sel;
  for (const std::string& part : splitTopLevel(text)) {
    if (part.empty()) throw selectorError(text, "found '', expected: identifier");
    Requirement r;
    const size_t inPos = part.find(" in ");
    const size_t notinPos = part.find(" notin ");
    auto parseSet = [&](size_t from) {
      const size_t open = part.find('(', from);
      const size_t close = part.rfind(')');
      if (open == std::string::npos || close == std::string::npos || close < open) {
        throw selectorError(text, "found '', expected: '('");
      }
      for (const auto& v : splitTopLevel(part.substr(open + 1, close - open - 1))) {
        r.values.push_back(v);
      }
    };
    if (part[0] == '!') {
      r.key = trim(part.substr(1));
      r.op = Requirement::Op::kNotExists;
    } else if (notinPos != std::string::npos) {
      r.key = trim(part.substr(0, notinPos));
      r.op = Requirement::Op::kNotIn;
      parseSet(notinPos);
    } else if (inPos != std::string::npos) {
      r.key = trim(part.substr(0, inPos));
      r.op = Requirement::Op::kIn;
      parseSet(inPos);
    } else if (size_t p = part.find("!="); p != std::string::npos) {
      r.key = trim(part.substr(0, p));
      r.op = Requirement::Op::kNotIn;
      r.values = {trim(part.substr(p + 2))};
    } else if (size_t q = part.find('='); q != std::string::npos) {
      r.key = trim(part.substr(0, q));
      r.op = Requirement::Op::kIn;
      const size_t skip = part.compare(q, 2, "==") == 0 ? 2 : 1;
      r.values = {trim(part.substr(q + skip))};
    } else if (size_t g = part.find_first_of("<>"); g != std::string::npos) {
      r.key = trim(part.substr(0, g));
      r.op = part[g] == '>' ? Requirement::Op::kGt : Requirement::Op::kLt;
      r.values = {trim(part.substr(g + 1))};
    } else {
      r.key = part;
      r.op = Requirement::Op::kExists;
    }
    if (r.key.empty() || r.key.find(' ') != std::string::npos) {
      throw selectorError(text, "invalid label key");
    }
    sel.requirements_.push_back(std::move(r));
  }
  return sel;
}

bool LabelSelector::matches(const Json& object) const {
  for (const auto& r : requirements_) {
    const auto v = labelOf(object, r.key);
    const bool in = v && std::find(r.values.begin(), r.values.end(), *v) != r.values.end();
    switch (r.op) {
      case Requirement::Op::kExists:
        if (!v) return false;
        break;
      case Requirement::Op::kNotExists:
        if (v) return false;
        break;
      case Requirement::Op::kIn:
        if (!in) return false;
        break;
      case Requirement::Op::kNotIn:
        if (in) return false;
        break;
      case Requirement::Op::kGt:
      case Requirement::Op::kLt: {
        if (!v) return false;
        const long lhs = std::strtol(v->c_str(), nullptr, 10);
        const long rhs = std::strtol(r.values[0].c_str(), nullptr, 10);
        if (r.op == Requirement::Op::kGt ? !(lhs > rhs) : !(lhs < rhs)) return false;
        break;
      }
    }
  }
  return true;
}

FieldSelector FieldSelector::parse(std::string_view text, std::string_view kind) {
  // The per-kind field labels of the real server (a subset of them).
  static const std::set<std::string> kCommon = {"metadata.name", "metadata.namespace"};
  std::set<std::string> allowed = kCommon;
  if (kind == "Secret") allowed.insert("type");
  if (kind == "Pod") allowed.insert({"spec.nodeName", "status.phase", "spec.restartPolicy"});
  if (kind == "Event") {
    allowed.insert({"involvedObject.kind", "involvedObject.namespace", "involvedObject.name",
                    "involvedObject.uid", "involvedObject.apiVersion", "reason", "type"});
  }
  FieldSelector sel;
  for (const std::string& part : splitTopLevel(text)) {
    Requirement r;
    size_t p = part.find("!=");
    size_t width = 2;
    r.equal = p == std::string::npos;
    if (r.equal) {
      p = part.find("==");
      if (p == std::string::npos) {
        p = part.find('=');
        width = 1;
      }
    }
    if (p == std::string::npos) {
      throw badRequest(fmt::format("invalid selector: '{}'; can't understand '{}'", text, part));
    }
    r.path = trim(part.substr(0, p));
    r.value = trim(part.substr(p + width));
    if (!allowed.contains(r.path)) {
      throw badRequest(fmt::format("field label not supported: {}", r.path));
    }
    sel.requirements_.push_back(std::move(r));
  }
  return sel;
}

bool FieldSelector::matches(const Json& object) const {
  for (const auto& r : requirements_) {
    const std::string v = fieldOf(object, r.path).value_or("");
    if ((v == r.value) != r.equal) return false;
  }
  return true;
}

std::optional<std::string> FieldSelector::exactName() const {
  for (const auto& r : requirements_) {
    if (r.path == "metadata.name" && r.equal) return r.value;
  }
  return std::nullopt;
}

}  // namespace geo::testapi
