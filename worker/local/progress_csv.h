#pragma once
// The time series CSV of a `geotrain local` run (<out>/progress.csv or
// --csv): a header row, then one row per "progress" or "done" event, in the
// order the launcher received them:
//   wall_seconds,rank,region,step,loss,samples_per_second,eval_accuracy,
//   eval_step,eval_loss,wan_sent_bytes,wan_received_bytes,lan_sent_bytes,lan_received_bytes,
//   payload_bytes,staleness_mean,staleness_max,delay,applied_updates,missing,
//   event
// wall_seconds is the launcher's time since launch; a value the event did
// not carry is an empty cell (eval_accuracy and eval_loss are empty on steps
// without an evaluation, eval_accuracy also on a regression job's); event is the event's name,
// progress or done (a done row follows the last progress row and has the worker's final totals).
// Region names are DNS labels, so no cell needs quoting.
//
// CsvWriter owns its file; not thread-safe; errors are Statuses naming the
// path.

#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>

#include "common/status.h"
#include "worker/local/worker_event.h"

namespace geo::local {

// The header row, with its newline.
std::string csvHeader();

// One row with its newline.
std::string csvRow(double wallSeconds, int64_t rank, std::string_view region,
                   const WorkerEvent& event);

class CsvWriter {
 public:
  // Creates (truncates) the file and writes the header.
  static StatusOr<CsvWriter> create(const std::filesystem::path& path);

  Status append(const std::string& row);
  // Hands buffered rows to the kernel, so the file can be read while the run
  // goes on. The launcher calls it once per display refresh.
  Status flush();

  const std::filesystem::path& path() const { return path_; }

 private:
  struct Closer {
    void operator()(std::FILE* f) const { std::fclose(f); }
  };
  CsvWriter(std::filesystem::path path, std::FILE* file) : path_(std::move(path)), file_(file) {}

  std::filesystem::path path_;
  std::unique_ptr<std::FILE, Closer> file_;
};

}  // namespace geo::local
