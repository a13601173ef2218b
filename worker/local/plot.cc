#include "worker/local/plot.h"

#include <poll.h>
#include <unistd.h>

#include <fmt/format.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <fstream>

#include "worker/local/process.h"

namespace geo::local {

namespace {

// A gnuplot double-quoted string literal.
std::string quoted(const std::string& text) {
  std::string out = "\"";
  for (const char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

Status writeFile(const std::filesystem::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::trunc);
  out << text;
  out.flush();
  if (!out) return unavailable(fmt::format("cannot write {}", path.string()));
  return {};
}

}  // namespace

StatusOr<std::filesystem::path> findGnuplot(const std::string& searchPath) {
  size_t start = 0;
  while (start <= searchPath.size()) {
    const size_t colon = std::min(searchPath.find(':', start), searchPath.size());
    const std::string dir = searchPath.substr(start, colon - start);
    const std::filesystem::path candidate =
        std::filesystem::path(dir.empty() ? "." : dir) / "gnuplot";
    std::error_code error;
    if (std::filesystem::is_regular_file(candidate, error) &&
        ::access(candidate.c_str(), X_OK) == 0) {
      return std::filesystem::absolute(candidate, error);
    }
    start = colon + 1;
  }
  return failedPrecondition(
      "--plot: gnuplot is not on PATH; install it (Debian: apt-get install gnuplot-nox) or leave "
      "out --plot");
}

std::vector<std::string> writePlotData(const RunState& state, std::string& data) {
  std::vector<std::string> regions;
  for (const RankProgress& p : state.ranks()) {
    if (p.localIndex != 0) continue;
    std::vector<EvalPoint> points = p.evals;
    if (p.testAccuracy && p.doneWallSeconds)
      points.push_back({*p.doneWallSeconds, *p.testAccuracy, std::nullopt});
    if (points.empty()) continue;
    if (!regions.empty()) data += "\n\n";  // gnuplot: two blank lines end an index block
    data += fmt::format("# {} (rank {})\n", p.region, p.rank);
    for (const EvalPoint& e : points)
      data += fmt::format("{:.3f} {:.4f}\n", e.wallSeconds, e.accuracy * 100);
    regions.push_back(p.region);
  }
  return regions;
}

std::string plotScript(const std::vector<std::string>& regions,
                       const std::filesystem::path& dataPath, const std::filesystem::path& png) {
  std::string script = fmt::format(
      "set terminal pngcairo size 1000,600 noenhanced\n"
      "set output {}\n"
      "set title \"geotrain local: eval accuracy of each region's leader\"\n"
      "set xlabel \"wall time since launch (s)\"\n"
      "set ylabel \"eval accuracy (%)\"\n"
      "set key bottom right\n"
      "set grid\n"
      "plot ",
      quoted(png.string()));
  for (size_t i = 0; i < regions.size(); ++i) {
    script += fmt::format("{}{} index {} using 1:2 with linespoints title {}",
                          i == 0 ? "" : ", \\\n     ", i == 0 ? quoted(dataPath.string()) : "''", i,
                          quoted(regions[i]));
  }
  return script + "\n";
}

Status writeAccuracyPlot(const std::filesystem::path& gnuplot, const RunState& state,
                         const PlotFiles& files) {
  std::string data;
  const std::vector<std::string> regions = writePlotData(state, data);
  if (regions.empty()) {
    return failedPrecondition(
        fmt::format("--plot {}: no evaluation results to plot (the workers evaluate every "
                    "training.evalInterval steps; see --eval-interval)",
                    files.png.string()));
  }
  GEO_RETURN_IF_ERROR(writeFile(files.data, data));
  GEO_RETURN_IF_ERROR(writeFile(files.script, plotScript(regions, files.data, files.png)));

  SpawnSpec spec;
  spec.program = gnuplot.string();
  spec.args = {files.script.string()};
  spec.stderrPath = files.log;
  auto child = ChildProcess::spawn(spec);
  if (!child.ok()) return child.status();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  std::vector<std::string> ignored;
  while (!(*child)->tryReap()) {
    if (std::chrono::steady_clock::now() > deadline) {
      (*child)->signalGroup(SIGKILL);
      (*child)->waitForExit();
      return deadlineExceeded(
          fmt::format("gnuplot did not finish within 60 s (script {})", files.script.string()));
    }
    pollfd pfd{(*child)->stdoutFd(), POLLIN, 0};
    if (pfd.fd >= 0) {
      ::poll(&pfd, 1, 50);
      (*child)->readLines(ignored);
      ignored.clear();
    } else {
      ::usleep(20000);
    }
  }
  const ExitStatus exit = *(*child)->exitStatus();
  if (!exit.success()) {
    return unavailable(fmt::format("gnuplot failed ({}) on {}; see {}", exit.describe(),
                                   files.script.string(), files.log.string()));
  }
  return {};
}

}  // namespace geo::local
