#include "worker/local/progress_csv.h"

#include <fmt/format.h>

#include <cerrno>
#include <cstring>

namespace geo::local {

namespace {

template <typename T>
std::string cell(const std::optional<T>& v) {
  return v ? fmt::format("{}", *v) : std::string();
}

}  // namespace

std::string csvHeader() {
  return "wall_seconds,rank,region,step,loss,samples_per_second,eval_accuracy,eval_step,"
         "eval_loss,wan_sent_bytes,"
         "wan_received_bytes,lan_sent_bytes,lan_received_bytes,payload_bytes,staleness_mean,"
         "staleness_max,delay,applied_updates,missing,event\n";
}

std::string csvRow(double wallSeconds, int64_t rank, std::string_view region,
                   const WorkerEvent& e) {
  const bool evaluated = e.evalAccuracy || e.evalLoss;
  return fmt::format("{:.3f},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}\n",
                     wallSeconds, rank, region, cell(e.step), cell(e.loss),
                     cell(e.samplesPerSecond), cell(e.evalAccuracy),
                     cell(evaluated ? (e.evalStep ? e.evalStep : e.step) : std::nullopt),
                     cell(e.evalLoss), cell(e.bytes.wanSent), cell(e.bytes.wanReceived),
                     cell(e.bytes.lanSent), cell(e.bytes.lanReceived), cell(e.bytes.payload),
                     cell(e.sync.stalenessMean), cell(e.sync.stalenessMax), cell(e.sync.delay),
                     cell(e.sync.appliedUpdates), cell(e.sync.missing), e.name);
}

StatusOr<CsvWriter> CsvWriter::create(const std::filesystem::path& path) {
  std::FILE* file = std::fopen(path.c_str(), "we");
  if (file == nullptr) {
    return invalidArgument(
        fmt::format("--csv {}: cannot create the file: {}", path.string(), std::strerror(errno)));
  }
  CsvWriter writer(path, file);
  GEO_RETURN_IF_ERROR(writer.append(csvHeader()));
  return writer;
}

Status CsvWriter::append(const std::string& row) {
  if (std::fwrite(row.data(), 1, row.size(), file_.get()) != row.size()) {
    return unavailable(fmt::format("writing {}: {}", path_.string(), std::strerror(errno)));
  }
  return {};
}

Status CsvWriter::flush() {
  if (std::fflush(file_.get()) != 0) {
    return unavailable(fmt::format("writing {}: {}", path_.string(), std::strerror(errno)));
  }
  return {};
}

}  // namespace geo::local
