#pragma once
// runLocal(): `geotrain local` — a whole multi-region training job as
// processes on this machine, with an emulated WAN between the regions.
//
// Before anything is spawned it checks everything it can: the topology
// (regions, preset, --rtt, --uplink), the worker configuration (defaults,
// --config, --set, flags; then every rank's config with
// validateWorkerConfig), the worker binary, gnuplot when --plot is given, and
// that the run folder is new or empty. A problem there is returned as a
// Status and nothing runs.
//
// Then it writes the run folder:
//   worker-<rank>.yaml     each rank's complete config (re-run one worker with
//                          `geotrain-worker --config worker-<rank>.yaml`)
//   keys/worker-<rank>.key|.pub   a CURVE keypair per rank
//   logs/worker-<rank>.log each worker's stderr; launcher.log: the
//                          launcher's own notes (starts, exits, non-JSON
//                          stdout lines of workers)
//   progress.csv (or --csv), summary.json, and with --plot the PNG plus
//   accuracy.dat / accuracy.gp
// prints a header, starts every worker as
//   <worker-binary> --config <out>/worker-<rank>.yaml --progress-format jsonl
// and follows their JSON lines (worker_event.h) with live progress until all
// have exited.
//
// Outcomes: kSucceeded when every worker exited 0. kFailed when one exited
// non-zero or by a signal, or sent an "error" event: the others get SIGTERM,
// then SIGKILL after 5 s, and the failed rank, its region and local index,
// how it ended, its error message and the last lines of its log go to
// `io.err`. kInterrupted on SIGINT/SIGTERM to the launcher: the same stop
// (a second signal kills at once). In every outcome the summary so far is
// printed and summary.json written, and no worker is left running.
//
// Threading: call from the main thread of a single-threaded process (it
// blocks SIGINT/SIGTERM/SIGCHLD in the calling thread for a signalfd while
// it runs; see signal_watch.h). It does not call exit() and does not throw
// except on a broken invariant (GEO_ENFORCE).

#include <filesystem>
#include <ostream>
#include <string>

#include "common/status.h"
#include "worker/local/options.h"

namespace geo::local {

enum class LocalOutcome { kSucceeded, kFailed, kInterrupted };

// 0, 1, 130.
int exitCodeOf(LocalOutcome outcome);

struct LocalIo {
  std::ostream* out;  // header, progress, summary
  std::ostream* err;  // failures, warnings
  bool tty = false;   // `out` is a terminal: redraw progress in place
};

StatusOr<LocalOutcome> runLocal(const LocalOptions& options, const LocalIo& io);

// --worker-binary as given, else geotrain-worker in the folder of the
// running executable (/proc/self/exe). InvalidArgument, naming the path and
// --worker-binary, when it is not an executable file.
StatusOr<std::filesystem::path> resolveWorkerBinary(const std::string& flag);

// --out as given (made absolute), else runs/<YYYYmmdd-HHMMSS> (local time)
// with -2, -3, ... appended if that exists. InvalidArgument when the folder
// exists and is not empty, or is not a folder.
StatusOr<std::filesystem::path> chooseRunFolder(const std::string& flag);

}  // namespace geo::local
