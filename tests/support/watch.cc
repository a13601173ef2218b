// Watch: chunked newline-delimited JSON events from a resourceVersion.

#include <fmt/format.h>

#include "tests/support/server_impl.h"

namespace geo::testapi {

namespace {

std::string param(const httplib::Request& req, const char* name) {
  return req.has_param(name) ? req.get_param_value(name) : "";
}

// One watch stream's state; lives as long as httplib's content provider.
struct WatchState {
  ResourceTypePtr type;
  std::string ns;
  std::string name;  // a watch of one object by path (`.../name?watch=1`)
  LabelSelector labels;
  std::optional<FieldSelector> fields;
  Rendering rendering;
  std::string includeObject;
  bool initialEvents = false;  // resourceVersion unset or "0": start with ADDED for all
  uint64_t cursor = 0;         // every event up to this version has been considered
  bool bookmarks = false;
  bool started = false;
  bool headersSent = false;
  uint64_t epoch = 0;
  std::chrono::steady_clock::time_point deadline;
  std::chrono::steady_clock::time_point lastBookmark;
};

bool selected(const WatchState& w, const Json& object) {
  if (!w.name.empty() && object["metadata"].value("name", "") != w.name) return false;
  return w.labels.matches(object) && (!w.fields || w.fields->matches(object));
}

std::string eventLine(WatchState& w, const std::string& type, Json object) {
  if (type != "ERROR" && type != "BOOKMARK") {
    object["apiVersion"] = w.type->apiVersion();
    if (w.rendering.form == Rendering::Form::kTable) {
      object = toTable(*w.type, Json::array({object}),
                       {{"resourceVersion", object["metadata"].value("resourceVersion", "")}},
                       w.rendering.version, w.includeObject);
      // Column definitions come with the first event only, as on the real server.
      if (w.headersSent) object["columnDefinitions"] = Json::array();
      w.headersSent = true;
    } else if (w.rendering.form == Rendering::Form::kPartialMetadata) {
      object = toPartialMetadata(object, w.rendering.version);
    }
  }
  return Json{{"type", type}, {"object", std::move(object)}}.dump() + "\n";
}

}  // namespace

void TestApiServer::Impl::serveWatch(const httplib::Request& req, httplib::Response& res,
                                     const Target& target) {
  if (param(req, "sendInitialEvents") == "true") {
    throw invalid("meta.k8s.io", "ListOptions", "",
                  Json::array({{{"reason", "FieldValueForbidden"},
                                {"field", "sendInitialEvents"},
                                {"message",
                                 "Forbidden: sendInitialEvents is forbidden for watch "
                                 "unless the WatchList feature gate is enabled"}}}));
  }
  auto w = std::make_shared<WatchState>();
  w->type = target.type;
  w->ns = target.ns;
  w->name = target.name;
  w->labels = LabelSelector::parse(param(req, "labelSelector"));
  if (!param(req, "fieldSelector").empty()) {
    w->fields = FieldSelector::parse(param(req, "fieldSelector"), target.type->kind);
  }
  w->rendering = negotiate(req.get_header_value("Accept"));
  w->includeObject = param(req, "includeObject");
  const std::string rv = param(req, "resourceVersion");
  w->initialEvents = rv.empty() || rv == "0";
  w->cursor = parseResourceVersion(rv);
  w->bookmarks = param(req, "allowWatchBookmarks") == "true";
  w->epoch = faults.watchEpoch();
  auto timeout = options.maxWatchTimeout;
  if (!param(req, "timeoutSeconds").empty()) {
    try {
      timeout = std::min(timeout, std::chrono::seconds(std::stol(param(req, "timeoutSeconds"))));
    } catch (const std::exception&) {
      throw badRequest("invalid timeoutSeconds");
    }
  }
  w->deadline = std::chrono::steady_clock::now() + timeout;
  w->lastBookmark = std::chrono::steady_clock::now();

  res.status = 200;
  // ";stream=watch" (what clients expect of a watch) also keeps cpp-httplib
  // from gzipping the stream, which would hold events back in the deflater.
  res.set_chunked_content_provider(
      "application/json;stream=watch", [this, w](size_t, httplib::DataSink& sink) {
        auto send = [&](const std::string& line) { return sink.write(line.data(), line.size()); };
        if (!w->started) {
          w->started = true;
          if (w->initialEvents) {
            auto [objects, at] = store.snapshot(*w->type, w->ns);
            for (const auto& o : objects) {
              if (selected(*w, o) && !send(eventLine(*w, "ADDED", o))) return false;
            }
            w->cursor = at;
          }
        }
        const auto now = std::chrono::steady_clock::now();
        if (stopping || faults.watchEpoch() != w->epoch) return false;
        if (now >= w->deadline) {
          sink.done();
          return true;
        }
        uint64_t current = 0;
        const auto wait = std::min<std::chrono::milliseconds>(
            std::chrono::milliseconds(100),
            std::chrono::duration_cast<std::chrono::milliseconds>(w->deadline - now));
        const std::string storageKey = w->type->storageKey();
        auto events = store.eventsAfter(w->cursor, wait, &current, storageKey);
        if (!events) {
          const Json status = gone(fmt::format("too old resource version: {} ({})", w->cursor,
                                               store.currentResourceVersion()))
                                  .toStatus();
          send(eventLine(*w, "ERROR", status));
          sink.done();
          return true;
        }
        for (const auto& event : *events) {
          const WatchEvent& e = *event;
          if (e.storageKey != storageKey || (!w->ns.empty() && e.ns != w->ns)) continue;
          const bool now_ = selected(*w, e.object);
          const bool before = e.type == "MODIFIED" && selected(*w, e.previous);
          std::string type = e.type;
          if (e.type == "MODIFIED" && !before) type = "ADDED";
          if (e.type == "MODIFIED" && !now_) type = "DELETED";
          if ((e.type != "MODIFIED" && !now_) || (e.type == "MODIFIED" && !now_ && !before))
            continue;
          if (!send(eventLine(*w, type, e.object))) return false;
        }
        w->cursor = std::max(w->cursor, current);
        if (w->bookmarks && std::chrono::steady_clock::now() - w->lastBookmark >=
                                std::chrono::milliseconds(bookmarkIntervalMs.load())) {
          w->lastBookmark = std::chrono::steady_clock::now();
          const Json bookmark = {{"kind", w->type->kind},
                                 {"apiVersion", w->type->apiVersion()},
                                 {"metadata", {{"resourceVersion", std::to_string(w->cursor)}}}};
          if (!send(eventLine(*w, "BOOKMARK", bookmark))) return false;
        }
        return true;
      });
}

}  // namespace geo::testapi
