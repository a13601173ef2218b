// Server-side printing: meta.k8s.io Table and PartialObjectMetadata answers.

#include <fmt/format.h>

#include <ctime>
#include <regex>

#include "tests/support/server_impl.h"

namespace geo::testapi {

namespace {

// k8s.io/apimachinery/pkg/util/duration.HumanDuration.
std::string humanDuration(long seconds) {
  if (seconds < -1) return "<invalid>";
  if (seconds < 0) return "0s";
  if (seconds < 120) return fmt::format("{}s", seconds);
  const long minutes = seconds / 60;
  if (minutes < 10) {
    return seconds % 60 == 0 ? fmt::format("{}m", minutes)
                             : fmt::format("{}m{}s", minutes, seconds % 60);
  }
  if (minutes < 180) return fmt::format("{}m", minutes);
  const long hours = minutes / 60;
  if (hours < 8) {
    return minutes % 60 == 0 ? fmt::format("{}h", hours)
                             : fmt::format("{}h{}m", hours, minutes % 60);
  }
  if (hours < 48) return fmt::format("{}h", hours);
  if (hours < 24 * 8) {
    return hours % 24 == 0 ? fmt::format("{}d", hours / 24)
                           : fmt::format("{}d{}h", hours / 24, hours % 24);
  }
  if (hours < 24 * 365 * 2) return fmt::format("{}d", hours / 24);
  if (hours < 24 * 365 * 8) {
    return fmt::format("{}y{}d", hours / 24 / 365, (hours / 24) % 365);
  }
  return fmt::format("{}y", hours / 24 / 365);
}

std::string age(const Json& timestamp) {
  if (!timestamp.is_string()) return "<unknown>";
  std::tm tm{};
  if (strptime(timestamp.get<std::string>().c_str(), "%Y-%m-%dT%H:%M:%SZ", &tm) == nullptr) {
    return "<unknown>";
  }
  return humanDuration(long(std::difftime(std::time(nullptr), timegm(&tm))));
}

// The first value a printer column's JSONPath selects: `.a.b`, `[n]`,
// `[?(@.k=="v")]` filters (what CRD printer columns use in practice).
Json evalJsonPath(const Json& root, const std::string& path) {
  static const std::regex kToken(
      R"re(\.([A-Za-z0-9_\-]+)|\[(\d+)\]|\[\?\(@\.([A-Za-z0-9_\-]+)\s*==\s*["']([^"']*)["']\)\])re");
  std::vector<Json> current = {root};
  std::string expr = path;
  if (expr.size() >= 2 && expr.front() == '{' && expr.back() == '}') {
    expr = expr.substr(1, expr.size() - 2);
  }
  for (auto it = std::sregex_iterator(expr.begin(), expr.end(), kToken);
       it != std::sregex_iterator(); ++it) {
    const auto& m = *it;
    std::vector<Json> next;
    for (const auto& node : current) {
      if (m[1].matched && node.is_object() && node.contains(m[1].str())) {
        next.push_back(node[m[1].str()]);
      } else if (m[2].matched && node.is_array() && std::stoul(m[2]) < node.size()) {
        next.push_back(node[std::stoul(m[2])]);
      } else if (m[3].matched && node.is_array()) {
        for (const auto& item : node) {
          if (!item.is_object() || !item.contains(m[3].str())) continue;
          const Json& v = item[m[3].str()];
          const std::string text = v.is_string() ? v.get<std::string>() : v.dump();
          if (text == m[4].str()) next.push_back(item);
        }
      }
    }
    current = std::move(next);
  }
  return current.empty() ? Json() : current.front();
}

Json cellOf(const PrinterColumn& column, const Json& object) {
  const Json v = evalJsonPath(object, column.jsonPath);
  if (v.is_null()) return Json();
  if (column.type == "date") return age(v);
  if (column.type == "integer" && v.is_number()) return v.get<int64_t>();
  if (column.type == "number" && v.is_number()) return v;
  if (column.type == "boolean" && v.is_boolean()) return v;
  return v.is_string() ? v : Json(v.dump());
}

}  // namespace

Json toPartialMetadata(const Json& object, const std::string& version) {
  return {{"kind", "PartialObjectMetadata"},
          {"apiVersion", "meta.k8s.io/" + version},
          {"metadata", object.value("metadata", Json::object())}};
}

Json toTable(const ResourceType& type, const Json& objects, const Json& listMeta,
             const std::string& tableVersion, const std::string& includeObject) {
  std::vector<PrinterColumn> columns = type.printerColumns;
  // A CRD without columns prints its age; built-in kinds print only name and
  // age here (the real server's per-kind columns are not reproduced).
  if (columns.empty()) {
    columns.push_back({"Age", "date", "",
                       "CreationTimestamp is a timestamp representing the "
                       "server time when this object was created.",
                       ".metadata.creationTimestamp", 0});
  }
  Json definitions = Json::array({{{"name", "Name"},
                                   {"type", "string"},
                                   {"format", "name"},
                                   {"description", "Name must be unique within a namespace."},
                                   {"priority", 0}}});
  for (const auto& c : columns) {
    definitions.push_back({{"name", c.name},
                           {"type", c.type},
                           {"format", c.format},
                           {"description", c.description},
                           {"priority", c.priority}});
  }
  Json rows = Json::array();
  for (const auto& o : objects) {
    Json cells = Json::array({o["metadata"].value("name", "")});
    for (const auto& c : columns) cells.push_back(cellOf(c, o));
    Json row = {{"cells", cells}};
    if (includeObject == "Object") {
      row["object"] = o;
    } else if (includeObject != "None") {
      row["object"] = toPartialMetadata(o, tableVersion);
    }
    rows.push_back(std::move(row));
  }
  return {{"kind", "Table"},
          {"apiVersion", "meta.k8s.io/" + tableVersion},
          {"metadata", listMeta},
          {"columnDefinitions", definitions},
          {"rows", rows}};
}

}  // namespace geo::testapi
