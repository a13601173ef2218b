#pragma once
// Logging through spdlog. Every geotrain binary logs to stderr through one
// named logger ("geo") so a process can change the level in one place.
//
// Use the spdlog API on the returned logger, or the free functions of spdlog
// (geo::initLogging makes "geo" the default logger):
//   spdlog::info("step {} loss {:.4f}", step, loss);

#include <memory>
#include <string_view>

#include <spdlog/spdlog.h>

#include "common/status.h"

namespace geo {

// Creates (once) the "geo" stderr logger, makes it spdlog's default and sets
// its level. `level` is one of trace, debug, info, warn, error, critical, off;
// anything else is an InvalidArgument naming the allowed values. Thread-safe.
Status initLogging(std::string_view level = "info");

// How every line is written: "text" (default; "2026-11-23T12:00:00.000 I
// message", local time) or "json" (one object a line, for log collectors:
// {"time":"2026-11-23T12:00:00.000Z","level":"info","msg":"..."}, UTC, the
// message JSON-escaped). Anything else is an InvalidArgument naming the
// allowed values. Thread-safe.
Status setLogFormat(std::string_view format);

// The "geo" logger (created at level info on first use).
std::shared_ptr<spdlog::logger> logger();

}  // namespace geo
