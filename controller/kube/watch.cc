#include "controller/kube/watch.h"

#include <chrono>

#include <fmt/format.h>

#include "common/logging.h"

namespace geo::kube {

bool LineSplitter::feed(std::string_view chunk,
                        const std::function<void(std::string_view)>& onLine) {
  while (!chunk.empty()) {
    const size_t newline = chunk.find('\n');
    const std::string_view piece = chunk.substr(0, newline);
    if (partial_.size() + piece.size() > maxLine_) {
      partial_.clear();
      return false;
    }
    if (newline == std::string_view::npos) {
      partial_.append(piece);
      return true;
    }
    chunk.remove_prefix(newline + 1);
    // The common case (a whole line inside one chunk) is delivered without a copy.
    std::string_view line = piece;
    if (!partial_.empty()) {
      partial_.append(piece);
      line = partial_;
    }
    if (line.ends_with('\r')) line.remove_suffix(1);
    if (!line.empty()) onLine(line);
    partial_.clear();
  }
  return true;
}

std::string_view watchEventTypeName(WatchEventType type) {
  switch (type) {
    case WatchEventType::kAdded: return "ADDED";
    case WatchEventType::kModified: return "MODIFIED";
    case WatchEventType::kDeleted: return "DELETED";
    case WatchEventType::kBookmark: return "BOOKMARK";
    case WatchEventType::kError: return "ERROR";
  }
  return "ERROR";
}

ApiResult<WatchEvent> parseWatchEvent(std::string_view line) {
  nlohmann::json json = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  const auto bad = [&](std::string_view why) {
    return localError(StatusCode::kDataLoss,
                      fmt::format("bad watch event ({}): {:.200}", why, std::string(line)));
  };
  if (!json.is_object()) return bad("not a JSON object");
  const auto type = json.find("type");
  const auto object = json.find("object");
  if (type == json.end() || !type->is_string()) return bad("no type");
  if (object == json.end() || !object->is_object()) return bad("no object");
  WatchEvent event;
  const std::string& name = type->get_ref<const std::string&>();
  if (name == "ADDED") {
    event.type = WatchEventType::kAdded;
  } else if (name == "MODIFIED") {
    event.type = WatchEventType::kModified;
  } else if (name == "DELETED") {
    event.type = WatchEventType::kDeleted;
  } else if (name == "BOOKMARK") {
    event.type = WatchEventType::kBookmark;
  } else if (name == "ERROR") {
    event.type = WatchEventType::kError;
  } else {
    return bad("unknown type");
  }
  event.object = std::move(*object);
  return event;
}

ApiError watchWithResume(KubeClient& client, const ResourceRef& resource, std::string_view ns,
                         WatchOptions options, const std::function<void(WatchEvent&&)>& onEvent,
                         const CancelToken& cancel, BackoffPolicy backoff) {
  Backoff delays(backoff);
  while (!cancel.cancelled()) {
    const auto started = std::chrono::steady_clock::now();
    bool delivered = false;
    auto result = client.watchOnce(
        resource, ns, options,
        [&](WatchEvent&& event) {
          if (std::string version = metadataField(event.object, "resourceVersion");
              !version.empty()) {
            options.resourceVersion = std::move(version);
          }
          delivered = true;
          onEvent(std::move(event));
        },
        cancel);
    if (!result.ok()) {
      const ApiError& error = result.error();
      if (error.isGone() || error.isCancelled()) return error;
      logger()->warn("watch {} from resourceVersion {}: {}", collectionPath(resource, ns),
                     options.resourceVersion, error.toStatus().toString());
    } else if (delivered || std::chrono::steady_clock::now() - started > std::chrono::seconds(1)) {
      // A stream that ended normally (the server's timeout): resume at once.
      delays.reset();
      continue;
    }
    if (delivered) delays.reset();
    if (!cancel.sleepFor(delays.next())) break;
  }
  return localError(StatusCode::kCancelled, "watch cancelled");
}

}  // namespace geo::kube
