#include "worker/app/worker_output.h"

#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <utility>

#include "common/exit_codes.h"

namespace geo::app {

double Progress::elapsed() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

double Progress::secondsAt(std::chrono::steady_clock::time_point t) const {
  return std::chrono::duration<double>(t - start_).count();
}

void Progress::emit(local::WorkerEvent event) const {
  if (!jsonl_) return;
  event.rank = rank_;
  event.time = elapsed();
  const std::string line = local::formatWorkerEvent(event) + "\n";
  std::fwrite(line.data(), 1, line.size(), stdout);
  std::fflush(stdout);
}

int reportFailure(const Progress* progress, const Status& s) {
  std::cerr << "geotrain-worker: " << s.message() << "\n";
  if (progress != nullptr) {
    local::WorkerEvent e;
    e.kind = local::EventKind::kError;
    e.message = s.message();
    if (s.code() == StatusCode::kAborted) e.rejoin = true;
    progress->emit(std::move(e));
  }
  return s.code() == StatusCode::kAborted ? kExitRejoin : kExitFailure;
}

void refuseDisagreeingPeer(const Progress& progress, const Status& s) {
  const Status refused = failedPrecondition(
      fmt::format("{}: every worker of a job must use the same sync settings", s.message()));
  (void)reportFailure(&progress, refused);
  std::cerr.flush();
  std::fflush(stdout);
  // Not exit(): other threads (the trainer, the transport's own I/O thread
  // that runs this) still use what exit's destructors would free.
  std::_Exit(kExitUsage);
}

}  // namespace geo::app
