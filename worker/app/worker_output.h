#pragma once
// What geotrain-worker tells its caller, from its first moment: the progress
// events on stdout (docs/worker-progress.md; `--progress-format jsonl`) and
// the failure that ends it. No LibTorch: geotrain-worker writes these
// before it loads its training library (worker/app/training_library.h).
//
// Threading: Progress::emit may be called from any thread; each line is one
// write and flushed, so lines never interleave.

#include <chrono>
#include <cstdint>

#include "common/exit_codes.h"
#include "common/status.h"
#include "worker/local/worker_event.h"

namespace geo::app {

// Exit codes of geotrain-worker: 2 for a configuration that cannot work
// (retrying it cannot help: the Kubernetes pod failure policy fails the job);
// 75 (EX_TEMPFAIL) when what the worker depends on went away through no
// fault of its own -- a region member whose leader died (a StatusCode
// kAborted failure) -- so that started again it rejoins: the pod failure
// policy replaces it without counting a retry (a member fails each time its
// leader does, and over a long job the leader's failures used up the
// member's retries; `geotrain local --restart-after` does the same).
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;
inline constexpr int kExitUsage = kWorkerExitUsage;
inline constexpr int kExitRejoin = kWorkerExitRejoin;

// Progress output: `--progress-format jsonl` writes one event per line on
// stdout; text writes nothing here (the log lines are the caller's).
class Progress {
 public:
  Progress(bool jsonl, int64_t rank) : jsonl_(jsonl), rank_(rank) {}
  bool jsonl() const { return jsonl_; }
  // Seconds since this Progress was made (the worker's start).
  double elapsed() const;
  // The same for an earlier (or later) moment of this process.
  double secondsAt(std::chrono::steady_clock::time_point t) const;
  // Sets the event's rank and time and writes it (with jsonl only).
  void emit(local::WorkerEvent event) const;

 private:
  bool jsonl_;
  int64_t rank_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

// "geotrain-worker: <message>" on stderr and an error event; returns
// kExitRejoin for a kAborted status, else kExitFailure.
int reportFailure(const Progress* progress, const Status& status);

// The transport's onDisagreement for geotrain-worker: a peer runs other sync
// settings, so this job cannot train. Writes "geotrain-worker: <message>:
// every worker of a job must use the same sync settings" on stderr and as an
// error event, and ends the process at once with kExitUsage (it runs on the
// transport's I/O thread, while the trainer may be blocked on that peer).
[[noreturn]] void refuseDisagreeingPeer(const Progress& progress, const Status& status);

}  // namespace geo::app
