#pragma once
// The `geotrain local` command line: its flags and help, parsed into
// LocalOptions (worker/local/options.h) with CLI11. The `geotrain` main adds
// it as a subcommand; tests parse with it without running anything.

#include <CLI/CLI.hpp>

#include <functional>

#include "worker/local/options.h"
#include "worker/local/plan.h"

namespace geo::local {

// Adds the `local` subcommand to `app`, writing what it parses into
// `options` (which must outlive `app`), and calls `onParsed` once it has
// parsed a `local` command line (inside app.parse(), as CLI11 callbacks
// run). A single-value flag given twice takes its last value, so a wrapper
// can pass defaults that the user's own flags override. Returns the
// subcommand.
CLI::App* addLocalCommand(CLI::App& app, LocalOptions& options, std::function<void()> onParsed);

// Adds the `plan` subcommand (worker/local/plan.h), the same way: its flags
// into `options`, `onParsed` once a `plan` command line is parsed.
CLI::App* addPlanCommand(CLI::App& app, PlanOptions& options, std::function<void()> onParsed);

}  // namespace geo::local
