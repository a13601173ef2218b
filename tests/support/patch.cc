#include "tests/support/patch.h"

#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <vector>

#include "tests/support/api_error.h"

namespace geo::testapi {

namespace {

using Path = std::vector<std::string>;

bool isDirective(const std::string& key) {
  return !key.empty() && key[0] == '$';
}

// A patch value placed where the target has nothing: its directives mean
// nothing there, so they go.
Json stripDirectives(const Json& v) {
  if (v.is_object()) {
    Json out = Json::object();
    for (const auto& [k, child] : v.items()) {
      if (!isDirective(k) && !child.is_null()) out[k] = stripDirectives(child);
    }
    return out;
  }
  if (v.is_array()) {
    Json out = Json::array();
    for (const auto& child : v) {
      if (child.is_object() && child.value("$patch", "") == "delete") continue;
      out.push_back(stripDirectives(child));
    }
    return out;
  }
  return v;
}

Json smpMap(Json target, const Json& patch, const ResourceType& type, Path& path);

bool sameKey(const Json& a, const Json& b, const std::string& key) {
  return a.is_object() && b.is_object() && a.contains(key) && b.contains(key) && a[key] == b[key];
}

Json smpList(Json target, const Json& patch, const ResourceType& type, Path& path) {
  if (!target.is_array()) target = Json::array();
  for (const auto& p : patch) {
    if (p.is_object() && p.value("$patch", "") == "replace") {
      Json out = Json::array();
      for (const auto& q : patch) {
        if (!(q.is_object() && q.contains("$patch"))) out.push_back(stripDirectives(q));
      }
      return out;
    }
  }
  const ListInfo info = type.listInfo(path);
  if (info.type == ListInfo::Type::kMap && !info.keys.empty()) {
    // Strategic merge patch merges by the first key only (patchMergeKey).
    const std::string& key = info.keys.front();
    for (const auto& p : patch) {
      auto it = std::find_if(target.begin(), target.end(),
                             [&](const Json& t) { return sameKey(t, p, key); });
      if (p.is_object() && p.value("$patch", "") == "delete") {
        if (it != target.end()) target.erase(it);
      } else if (it != target.end() && p.is_object()) {
        *it = smpMap(*it, p, type, path);
      } else {
        target.push_back(stripDirectives(p));
      }
    }
    return target;
  }
  if (info.type == ListInfo::Type::kSet) {
    for (const auto& p : patch) {
      if (std::find(target.begin(), target.end(), p) == target.end()) target.push_back(p);
    }
    return target;
  }
  return stripDirectives(patch);
}

// Reorders `list` as `order` says (items named by their merge key, or the
// values of a primitive list); items the order does not name keep their
// relative order after the named ones.
Json reorder(const Json& list, const Json& order, const ListInfo& info) {
  if (!list.is_array() || !order.is_array()) return list;
  Json out = Json::array();
  std::vector<bool> used(list.size(), false);
  for (const auto& o : order) {
    for (size_t i = 0; i < list.size(); ++i) {
      const bool match = info.type == ListInfo::Type::kMap && !info.keys.empty()
                             ? sameKey(list[i], o, info.keys.front())
                             : list[i] == o;
      if (!used[i] && match) {
        out.push_back(list[i]);
        used[i] = true;
        break;
      }
    }
  }
  for (size_t i = 0; i < list.size(); ++i) {
    if (!used[i]) out.push_back(list[i]);
  }
  return out;
}

Json smpMap(Json target, const Json& patch, const ResourceType& type, Path& path) {
  if (!target.is_object()) target = Json::object();
  const std::string directive = patch.value("$patch", "");
  if (directive == "replace") return stripDirectives(patch);
  if (directive == "delete") return Json();
  if (!directive.empty()) {
    throw ApiError(422, "Invalid", fmt::format("Unknown patch type: {}", directive));
  }
  for (const auto& [k, v] : patch.items()) {
    if (isDirective(k)) continue;
    if (v.is_null()) {
      target.erase(k);
      continue;
    }
    path.push_back(k);
    if (v.is_object()) {
      Json merged = smpMap(target.contains(k) ? target[k] : Json::object(), v, type, path);
      if (merged.is_null()) {
        target.erase(k);
      } else {
        target[k] = std::move(merged);
      }
    } else if (v.is_array()) {
      target[k] = smpList(target.contains(k) ? target[k] : Json::array(), v, type, path);
    } else {
      target[k] = v;
    }
    path.pop_back();
  }
  static const std::string kOrder = "$setElementOrder/";
  static const std::string kDeleteFrom = "$deleteFromPrimitiveList/";
  for (const auto& [k, v] : patch.items()) {
    if (k.starts_with(kDeleteFrom)) {
      const std::string field = k.substr(kDeleteFrom.size());
      if (target.contains(field) && target[field].is_array() && v.is_array()) {
        Json kept = Json::array();
        for (const auto& item : target[field]) {
          if (std::find(v.begin(), v.end(), item) == v.end()) kept.push_back(item);
        }
        target[field] = kept;
      }
    } else if (k.starts_with(kOrder)) {
      const std::string field = k.substr(kOrder.size());
      if (target.contains(field)) {
        path.push_back(field);
        target[field] = reorder(target[field], v, type.listInfo(path));
        path.pop_back();
      }
    }
  }
  if (patch.contains("$retainKeys") && patch["$retainKeys"].is_array()) {
    const Json& keep = patch["$retainKeys"];
    for (auto it = target.begin(); it != target.end();) {
      if (std::find(keep.begin(), keep.end(), it.key()) == keep.end()) {
        it = target.erase(it);
      } else {
        ++it;
      }
    }
  }
  return target;
}

}  // namespace

Json applyJsonPatch(const Json& target, const Json& patch) {
  if (!patch.is_array()) {
    throw badRequest("json: cannot unmarshal object into Go value of type jsonpatch.Patch");
  }
  try {
    return target.patch(patch);
  } catch (const nlohmann::json::exception& e) {
    // The real server answers a patch that does not apply (a failed `test`,
    // a missing path) with 422.
    throw ApiError(422, "Invalid",
                   fmt::format("the server rejected our request due to an error in our request: {}",
                               e.what()));
  }
}

Json applyMergePatch(const Json& target, const Json& patch) {
  if (!patch.is_object()) throw badRequest("merge patch must be a JSON object");
  Json out = target;
  out.merge_patch(patch);
  return out;
}

Json applyStrategicMergePatch(const Json& target, const Json& patch, const ResourceType& type) {
  if (type.custom) {
    throw ApiError(415, "UnsupportedMediaType",
                   "the body of the request was in an unknown format - accepted media types "
                   "include: application/json-patch+json, application/merge-patch+json, "
                   "application/apply-patch+yaml");
  }
  if (!patch.is_object()) throw badRequest("strategic merge patch must be a JSON object");
  Path path;
  Json out = smpMap(target, patch, type, path);
  if (out.is_null()) throw ApiError(422, "Invalid", "a patch may not delete the whole object");
  return out;
}

}  // namespace geo::testapi
