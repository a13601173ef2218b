#include "tests/support/managed_fields.h"

#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <set>
#include <tuple>
#include <vector>

#include "tests/support/api_error.h"

namespace geo::testapi {

namespace {

using FieldPath = std::vector<std::string>;
using FieldSet = std::set<FieldPath>;

struct Entry {
  std::string manager;
  std::string operation;
  std::string apiVersion;
  std::string time;
  std::string subresource;
  FieldSet fields;
};

// Metadata the server owns; it never shows up in field sets.
bool serverOwnedMetadata(const std::string& key) {
  static const std::set<std::string> kKeys = {"name",
                                              "namespace",
                                              "uid",
                                              "resourceVersion",
                                              "generation",
                                              "selfLink",
                                              "creationTimestamp",
                                              "managedFields",
                                              "deletionTimestamp",
                                              "deletionGracePeriodSeconds",
                                              "generateName"};
  return kKeys.contains(key);
}

// The part of `object` a write to `subresource` may touch.
Json scopedContent(const Json& object, const ResourceType& type, const std::string& subresource) {
  Json out = Json::object();
  if (subresource == "status") {
    if (object.contains("status")) out["status"] = object["status"];
    return out;
  }
  for (const auto& [k, v] : object.items()) {
    if (k == "apiVersion" || k == "kind") continue;
    if (k == "status" && type.statusSubresource) continue;
    if (k == "metadata") {
      Json meta = Json::object();
      for (const auto& [mk, mv] : v.items()) {
        if (!serverOwnedMetadata(mk)) meta[mk] = mv;
      }
      if (!meta.empty()) out["metadata"] = meta;
      continue;
    }
    out[k] = v;
  }
  return out;
}

void collect(const Json& v, FieldPath& path, std::vector<std::string>& names,
             const ResourceType& type, FieldSet& out) {
  if (v.is_object() && !v.empty()) {
    for (const auto& [k, child] : v.items()) {
      path.push_back("f:" + k);
      names.push_back(k);
      collect(child, path, names, type, out);
      names.pop_back();
      path.pop_back();
    }
    return;
  }
  if (v.is_array() && !path.empty()) {
    const ListInfo info = type.listInfo(names);
    // Items are keyed when each has the first key; further keys join when
    // present (the real server defaults them, e.g. protocol: TCP, which
    // this one does not).
    const bool keyed = info.type == ListInfo::Type::kMap && !info.keys.empty() &&
                       std::all_of(v.begin(), v.end(), [&](const Json& item) {
                         return item.is_object() && item.contains(info.keys.front());
                       });
    if (keyed) {
      for (const auto& item : v) {
        Json key = Json::object();
        for (const auto& k : info.keys) {
          if (item.contains(k)) key[k] = item[k];
        }
        path.push_back("k:" + key.dump());
        path.push_back(".");
        out.insert(path);
        path.pop_back();
        collect(item, path, names, type, out);
        path.pop_back();
      }
      return;
    }
    if (info.type == ListInfo::Type::kSet) {
      for (const auto& item : v) {
        path.push_back("v:" + item.dump());
        out.insert(path);
        path.pop_back();
      }
      return;
    }
  }
  out.insert(path);
}

FieldSet fieldsOf(const Json& object, const ResourceType& type, const std::string& subresource) {
  FieldSet out;
  FieldPath path;
  std::vector<std::string> names;
  const Json content = scopedContent(object, type, subresource);
  for (const auto& [k, child] : content.items()) {
    path.push_back("f:" + k);
    names.push_back(k);
    collect(child, path, names, type, out);
    names.pop_back();
    path.pop_back();
  }
  return out;
}

// The item of `list` whose key fields equal `key` (a "k:{...}" element).
Json* findKeyed(Json& list, const Json& key) {
  if (!list.is_array()) return nullptr;
  for (auto& item : list) {
    if (!item.is_object()) continue;
    bool match = true;
    for (const auto& [k, v] : key.items()) match = match && item.contains(k) && item[k] == v;
    if (match) return &item;
  }
  return nullptr;
}

// The value `path` names in `object`; for "." and "v:" elements, whether
// the item exists.
std::optional<Json> valueAt(const Json& object, const FieldPath& path) {
  Json cur = object;
  for (const auto& el : path) {
    if (el == ".") return Json(true);
    if (el.starts_with("f:")) {
      const std::string k = el.substr(2);
      if (!cur.is_object() || !cur.contains(k)) return std::nullopt;
      cur = Json(cur[k]);
    } else if (el.starts_with("k:")) {
      Json* item = findKeyed(cur, Json::parse(el.substr(2)));
      if (item == nullptr) return std::nullopt;
      cur = Json(*item);
    } else if (el.starts_with("v:")) {
      const Json v = Json::parse(el.substr(2));
      if (!cur.is_array() || std::find(cur.begin(), cur.end(), v) == cur.end()) {
        return std::nullopt;
      }
      return Json(true);
    }
  }
  return cur;
}

// Removes the field `path` names from `object`, if it is there.
void removeAt(Json& object, const FieldPath& path) {
  Json* parent = &object;
  for (size_t i = 0; i + 1 < path.size(); ++i) {
    const auto& el = path[i];
    if (i + 2 == path.size() && path.back() == "." && el.starts_with("k:")) {
      const Json key = Json::parse(el.substr(2));
      Json* item = findKeyed(*parent, key);
      if (item != nullptr) parent->erase(static_cast<size_t>(item - &(*parent)[0]));
      return;
    }
    if (el.starts_with("f:")) {
      const std::string k = el.substr(2);
      if (!parent->is_object() || !parent->contains(k)) return;
      parent = &(*parent)[k];
    } else if (el.starts_with("k:")) {
      parent = findKeyed(*parent, Json::parse(el.substr(2)));
      if (parent == nullptr) return;
    }
  }
  const std::string& last = path.back();
  if (last.starts_with("f:") && parent->is_object()) {
    parent->erase(last.substr(2));
  } else if (last.starts_with("v:") && parent->is_array()) {
    const Json v = Json::parse(last.substr(2));
    auto it = std::find(parent->begin(), parent->end(), v);
    if (it != parent->end()) parent->erase(it);
  }
}

Json toFieldsV1(const FieldSet& set) {
  Json trie = Json::object();
  for (const auto& path : set) {
    Json* node = &trie;
    for (const auto& el : path) node = &(*node)[el];
    if (node->is_null()) *node = Json::object();
  }
  return trie;
}

void fromTrie(const Json& node, FieldPath& path, FieldSet& out) {
  if (node.empty() && !path.empty()) {
    out.insert(path);
    return;
  }
  for (const auto& [k, child] : node.items()) {
    path.push_back(k);
    fromTrie(child, path, out);
    path.pop_back();
  }
}

std::vector<Entry> readEntries(const Json& object) {
  std::vector<Entry> entries;
  if (!object.contains("metadata")) return entries;
  for (const auto& e : object["metadata"].value("managedFields", Json::array())) {
    Entry entry{e.value("manager", ""), e.value("operation", ""),   e.value("apiVersion", ""),
                e.value("time", ""),    e.value("subresource", ""), {}};
    FieldPath path;
    fromTrie(e.value("fieldsV1", Json::object()), path, entry.fields);
    entries.push_back(std::move(entry));
  }
  return entries;
}

void writeEntries(Json& object, const std::vector<Entry>& entries) {
  Json list = Json::array();
  for (const auto& e : entries) {
    if (e.fields.empty()) continue;
    Json j = {{"manager", e.manager},       {"operation", e.operation},
              {"apiVersion", e.apiVersion}, {"time", e.time},
              {"fieldsType", "FieldsV1"},   {"fieldsV1", toFieldsV1(e.fields)}};
    if (!e.subresource.empty()) j["subresource"] = e.subresource;
    list.push_back(std::move(j));
  }
  if (list.empty()) {
    object["metadata"].erase("managedFields");
  } else {
    object["metadata"]["managedFields"] = std::move(list);
  }
}

Entry& entryFor(std::vector<Entry>& entries, const std::string& manager,
                const std::string& operation, const std::string& subresource,
                const ResourceType& type, const std::string& now) {
  for (auto& e : entries) {
    if (e.manager == manager && e.operation == operation && e.subresource == subresource) {
      e.apiVersion = type.apiVersion();
      e.time = now;
      return e;
    }
  }
  entries.push_back({manager, operation, type.apiVersion(), now, subresource, {}});
  return entries.back();
}

// Server-side apply's merge: maps merge, map lists merge by key, set lists
// union, anything else is replaced by the applied value.
Json applyMerge(const Json& live, const Json& applied, std::vector<std::string>& names,
                const ResourceType& type) {
  if (live.is_object() && applied.is_object()) {
    Json out = live;
    for (const auto& [k, v] : applied.items()) {
      names.push_back(k);
      if (v.is_null()) {
        out.erase(k);
      } else {
        out[k] = out.contains(k) ? applyMerge(out[k], v, names, type) : v;
      }
      names.pop_back();
    }
    return out;
  }
  if (live.is_array() && applied.is_array()) {
    const ListInfo info = type.listInfo(names);
    if (info.type == ListInfo::Type::kMap && !info.keys.empty()) {
      Json out = live;
      for (const auto& item : applied) {
        Json key = Json::object();
        for (const auto& k : info.keys) {
          if (item.is_object() && item.contains(k)) key[k] = item[k];
        }
        Json* existing = key.empty() ? nullptr : findKeyed(out, key);
        if (existing != nullptr) {
          *existing = applyMerge(*existing, item, names, type);
        } else {
          out.push_back(item);
        }
      }
      return out;
    }
    if (info.type == ListInfo::Type::kSet) {
      Json out = live;
      for (const auto& item : applied) {
        if (std::find(out.begin(), out.end(), item) == out.end()) out.push_back(item);
      }
      return out;
    }
  }
  return applied;
}

std::string pathText(const FieldPath& path) {
  std::string out;
  for (const auto& el : path) {
    if (el == ".") continue;
    // append() rather than operator+: GCC 12 warns falsely (-Wrestrict) on
    // "." + std::string.
    if (el.starts_with("f:")) {
      out.append(".").append(el, 2);
    } else if (el.starts_with("k:") || el.starts_with("v:")) {
      out.append("[").append(el, 2).append("]");
    }
  }
  return out;
}

}  // namespace

void trackUpdate(const Json* old, Json& updated, const ResourceType& type,
                 const std::string& manager, const std::string& subresource,
                 const std::string& now) {
  if (old != nullptr && updated["metadata"].contains("managedFields")) {
    const Json before = old->at("metadata").value("managedFields", Json::array());
    if (updated["metadata"]["managedFields"] != before) {
      if (updated["metadata"]["managedFields"].empty()) updated["metadata"].erase("managedFields");
      return;
    }
  }
  std::vector<Entry> entries = old != nullptr ? readEntries(*old) : std::vector<Entry>{};
  const FieldSet after = fieldsOf(updated, type, subresource);
  FieldSet changed;
  if (old == nullptr) {
    changed = after;
  } else {
    const FieldSet before = fieldsOf(*old, type, subresource);
    for (const auto& p : after) {
      if (!before.contains(p) || valueAt(updated, p) != valueAt(*old, p)) changed.insert(p);
    }
    for (const auto& p : before) {
      if (!after.contains(p)) changed.insert(p);
    }
  }
  if (changed.empty()) {
    writeEntries(updated, entries);
    return;
  }
  for (auto& e : entries) {
    if (e.subresource != subresource) continue;
    for (const auto& p : changed) e.fields.erase(p);
  }
  Entry& mine = entryFor(entries, manager, "Update", subresource, type, now);
  for (const auto& p : changed) {
    if (after.contains(p)) mine.fields.insert(p);
  }
  writeEntries(updated, entries);
}

Json serverSideApply(const Json* live, const Json& applied, const ResourceType& type,
                     const std::string& manager, bool force, const std::string& subresource,
                     const std::string& now) {
  Json base = live != nullptr ? *live : Json::object();
  std::vector<Entry> entries = live != nullptr ? readEntries(*live) : std::vector<Entry>{};
  // The configuration only speaks for the part of the object this endpoint
  // writes: status through /status, everything else through the resource.
  Json config = scopedContent(applied, type, subresource);
  const FieldSet mine = fieldsOf(applied, type, subresource);

  Json causes = Json::array();
  std::vector<std::string> lines;
  for (auto& e : entries) {
    if (e.subresource != subresource || (e.manager == manager && e.operation == "Apply")) continue;
    std::vector<FieldPath> conflicting;
    for (const auto& p : mine) {
      if (e.fields.contains(p) && valueAt(applied, p) != valueAt(base, p)) {
        conflicting.push_back(p);
      }
    }
    if (conflicting.empty()) continue;
    if (force) {
      for (const auto& p : conflicting) e.fields.erase(p);
      continue;
    }
    for (const auto& p : conflicting) {
      const std::string who = fmt::format("conflict with \"{}\"", e.manager);
      const std::string op =
          e.operation == "Update" ? fmt::format(" using {}", e.apiVersion) : std::string();
      causes.push_back(
          {{"reason", "FieldManagerConflict"}, {"message", who + op}, {"field", pathText(p)}});
      lines.push_back(fmt::format("{}{}: {}", who, op, pathText(p)));
    }
  }
  if (!causes.empty()) {
    std::string message = fmt::format("Apply failed with {} conflict{}: ", causes.size(),
                                      causes.size() == 1 ? "" : "s");
    for (size_t i = 0; i < lines.size(); ++i) message += (i ? "\n" : "") + lines[i];
    throw ApiError(409, "Conflict", message, Json{{"causes", causes}});
  }

  const std::vector<Entry> before = entries;
  Entry& own = entryFor(entries, manager, "Apply", subresource, type, now);
  const FieldSet previous = own.fields;
  own.fields = mine;
  // Fields this manager applied before and no longer applies go, unless
  // another manager still owns them. Leaves first, then list items.
  std::vector<FieldPath> dropped;
  for (const auto& p : previous) {
    if (mine.contains(p)) continue;
    const bool ownedElsewhere = std::any_of(entries.begin(), entries.end(), [&](const Entry& e) {
      return &e != &own && e.subresource == subresource && e.fields.contains(p);
    });
    if (!ownedElsewhere) dropped.push_back(p);
  }
  std::stable_partition(dropped.begin(), dropped.end(),
                        [](const FieldPath& p) { return p.back() != "."; });
  for (const auto& p : dropped) removeAt(base, p);

  std::vector<std::string> names;
  Json merged = applyMerge(base, config, names, type);
  if (!merged.contains("apiVersion")) merged["apiVersion"] = applied.value("apiVersion", "");
  if (!merged.contains("kind")) merged["kind"] = applied.value("kind", "");
  if (!merged.contains("metadata")) merged["metadata"] = Json::object();
  if (live == nullptr) {
    for (const char* k : {"name", "namespace", "generateName"}) {
      if (applied.contains("metadata") && applied["metadata"].contains(k)) {
        merged["metadata"][k] = applied["metadata"][k];
      }
    }
  }
  writeEntries(merged, entries);
  // An apply that changes neither the object nor who owns what is a no-op:
  // the real server writes nothing (no new resourceVersion, no event).
  if (live != nullptr) {
    auto sameOwners = [](const std::vector<Entry>& a, const std::vector<Entry>& b) {
      auto key = [](const std::vector<Entry>& v) {
        std::set<std::tuple<std::string, std::string, std::string, FieldSet>> out;
        for (const auto& e : v) {
          if (!e.fields.empty()) out.insert({e.manager, e.operation, e.subresource, e.fields});
        }
        return out;
      };
      return key(a) == key(b);
    };
    Json a = merged;
    Json b = *live;
    a["metadata"].erase("managedFields");
    b["metadata"].erase("managedFields");
    if (a == b && sameOwners(before, entries)) return *live;
  }
  return merged;
}

}  // namespace geo::testapi
