#pragma once
// `geotrain local --plot FILE.png`: eval accuracy against wall time since
// launch, one line per region (its leader, local index 0), drawn by gnuplot
// (Debian package gnuplot-nox).
//
// findGnuplot() runs at start-up, before any worker is spawned, so a missing
// gnuplot costs nothing. writeAccuracyPlot() writes the data file and the
// gnuplot script next to each other (so the plot can be redrawn or restyled
// by hand), runs gnuplot on the script and waits for it (at most 60 s).
// Errors are Statuses naming the file or program; not thread-safe.

#include <filesystem>
#include <string>
#include <vector>

#include "common/status.h"
#include "worker/local/run_state.h"

namespace geo::local {

// The gnuplot executable on `searchPath` (a PATH value). FailedPrecondition,
// saying to install gnuplot-nox, when there is none.
StatusOr<std::filesystem::path> findGnuplot(const std::string& searchPath);

struct PlotFiles {
  std::filesystem::path png;
  std::filesystem::path data;    // accuracy.dat
  std::filesystem::path script;  // accuracy.gp
  std::filesystem::path log;     // gnuplot's stderr
};

// One data block per region with points, "wall_seconds accuracy_percent"
// lines: the leader's evaluations, then its final test accuracy at its
// "done" time. Returns the names of the regions that got a block, in block
// order (regions without points are left out).
std::vector<std::string> writePlotData(const RunState& state, std::string& data);

// The gnuplot script for blocks of `regions` in `dataPath`, drawn into `png`.
std::string plotScript(const std::vector<std::string>& regions,
                       const std::filesystem::path& dataPath, const std::filesystem::path& png);

// FailedPrecondition when no region has a point to plot.
Status writeAccuracyPlot(const std::filesystem::path& gnuplot, const RunState& state,
                         const PlotFiles& files);

}  // namespace geo::local
