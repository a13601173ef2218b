#pragma once
// The watch wire format and a watch that survives reconnects.
//
// A watch answer is a chunked HTTP body of newline-delimited JSON events,
// {"type": ADDED|MODIFIED|DELETED|BOOKMARK|ERROR, "object": {...}}; chunk
// boundaries fall anywhere (inside an event, or between several events), so
// LineSplitter reassembles lines before parseWatchEvent decodes them.

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>

#include "controller/kube/backoff.h"
#include "controller/kube/client.h"

namespace geo::kube {

// Reassembles lines from arbitrary chunks. Not thread-safe (one per stream).
class LineSplitter {
 public:
  explicit LineSplitter(size_t maxLine = size_t{64} << 20) : maxLine_(maxLine) {}

  // Calls `onLine` (without the '\n' or a trailing '\r') for every line the
  // chunk completes, in order; blank lines are skipped; a partial line is kept
  // for the next chunk. False (and nothing kept) when a line would exceed
  // maxLine: the stream is broken and must be dropped.
  bool feed(std::string_view chunk, const std::function<void(std::string_view)>& onLine);

  // Bytes of the unfinished line (nonzero at the end of a stream: truncated).
  size_t buffered() const { return partial_.size(); }

 private:
  size_t maxLine_;
  std::string partial_;
};

// Decodes one line; DataLoss (as an ApiError) when it is not a watch event.
ApiResult<WatchEvent> parseWatchEvent(std::string_view line);

// "ADDED", ...; the wire name of an event type.
std::string_view watchEventTypeName(WatchEventType type);

// Watches from options.resourceVersion for as long as it can, delivering
// every event (bookmarks included, ERROR events excluded) to `onEvent` on the
// calling thread. When a stream ends or breaks it reconnects, resuming from
// the last resourceVersion seen in an event or bookmark: at once after a
// stream that delivered something, else after a jittered exponential
// backoff. Returns only with the reason it cannot go on: isGone() (410 or an
// ERROR event with code 410: list again and watch from the new version) or
// isCancelled(). Other failures (403, 5xx, refused connections) are logged
// and retried, as client-go's reflector does.
ApiError watchWithResume(KubeClient& client, const ResourceRef& resource, std::string_view ns,
                         WatchOptions options, const std::function<void(WatchEvent&&)>& onEvent,
                         const CancelToken& cancel, BackoffPolicy backoff = {});

}  // namespace geo::kube
