#pragma once
// What `geotrain local` prints on stdout: a header before the workers start,
// live progress while they run, and a summary table at the end. The render
// functions return text (tests compare it); LiveProgress writes to a stream.
//
// Live progress is one line per region: step of its slowest worker / total,
// mean loss, samples/s summed over the region, WAN MB/s sent by the region
// since the previous refresh, staleness mean, the DTS delay in force and the
// latest eval accuracy. On a terminal it is redrawn in place (ANSI cursor-up
// and erase-line) about once a second; otherwise a plain block is appended
// every 10 s so that CI logs stay readable.
//
// Not thread-safe; the stream is borrowed and must outlive LiveProgress.
// Nothing here fails.

#include <filesystem>
#include <ostream>
#include <string>
#include <vector>

#include "common/worker_config.h"
#include "worker/local/run_state.h"
#include "worker/local/topology.h"

namespace geo::local {

// Where a run keeps its files.
struct RunPaths {
  std::filesystem::path outDir;
  std::filesystem::path logsDir;  // worker-<rank>.log
  std::filesystem::path runLog;   // the launcher's own log (non-JSON worker lines, exits)
  std::filesystem::path csv;
  std::filesystem::path summaryJson;
  std::filesystem::path plot;  // empty: no plot
};

// Run folder, the job (algorithm and its parameters, model, steps), the
// topology (regions with their ranks, RTT matrix in ms, uplink) and where
// the logs and the CSV go. `uplinkPerRegion`: the uplink is a region's,
// shared by its workers (--network netns), not each worker's own.
std::string renderHeader(const Topology& topology, const WorkerConfig& base, const RunPaths& paths,
                         bool uplinkPerRegion = false);

// The RTT matrix as a table in milliseconds ("-" on the diagonal).
std::string renderRttMatrix(const Topology& topology);

// One line per region (no newlines); rates use `wanSentBefore` (cumulative
// WAN bytes per region at `secondsSince` seconds ago; empty: since launch).
std::vector<std::string> renderRegionLines(const RunState& state,
                                           const std::vector<uint64_t>& wanSentBefore,
                                           double secondsSince);

class LiveProgress {
 public:
  LiveProgress(std::ostream& out, bool tty) : out_(out), tty_(tty) {}

  // Draws when due (terminal: 1 s after the last draw; otherwise 10 s), or
  // now when `force`.
  void update(const RunState& state, double wallSeconds, bool force = false);

  static constexpr double kTtyRefreshSeconds = 1.0;
  static constexpr double kPlainRefreshSeconds = 10.0;

 private:
  std::ostream& out_;
  bool tty_;
  bool drawn_ = false;
  double lastDraw_ = 0;
  size_t linesOnScreen_ = 0;
  std::vector<uint64_t> wanAtLastDraw_;
};

// The summary table (per region and overall), time to accuracy, and the
// paths of the CSV, the logs, summary.json and the plot.
std::string renderSummary(const RunSummary& summary, const RunPaths& paths);

}  // namespace geo::local
