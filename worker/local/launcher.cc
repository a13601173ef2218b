#include "worker/local/launcher.h"

#include <poll.h>
#include <unistd.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <deque>
#include <fstream>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "common/exit_codes.h"
#include "common/keys/keys.h"
#include "common/ports.h"
#include "common/worker_config.h"
#include "worker/local/display.h"
#include "worker/local/faults.h"
#include "worker/local/network.h"
#include "worker/local/outputs.h"
#include "worker/local/plot.h"
#include "worker/local/process.h"
#include "worker/local/progress_csv.h"
#include "worker/local/rank_config.h"
#include "worker/local/run_state.h"
#include "worker/local/signal_watch.h"
#include "worker/local/topology.h"
#include "worker/local/worker_event.h"
#include "worker/wan/netns_network.h"

namespace geo::local {

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr auto kStopGrace = std::chrono::seconds(5);
static_assert(wan::kMostTcpInitialWindow <= kMaxTcpInitialWindow,
              "the namespace network's initial window must be one the workers accept");
constexpr int kPollMillis = 200;
constexpr size_t kLogTailLines = 10;

std::string_view outcomeName(LocalOutcome outcome) {
  switch (outcome) {
    case LocalOutcome::kSucceeded: return "succeeded";
    case LocalOutcome::kFailed: return "failed";
    case LocalOutcome::kInterrupted: return "interrupted";
  }
  return "unknown";
}

// The last `count` lines of a file (reads at most its last 64 KiB).
std::vector<std::string> tailLines(const fs::path& path, size_t count) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return {};
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  const std::streamoff start = std::max<std::streamoff>(0, size - 65536);
  in.seekg(start);
  std::string text(static_cast<size_t>(size - start), '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  std::deque<std::string> lines;
  size_t begin = 0;
  while (begin < text.size()) {
    const size_t nl = std::min(text.find('\n', begin), text.size());
    lines.emplace_back(text, begin, nl - begin);
    if (lines.size() > count) lines.pop_front();
    begin = nl + 1;
  }
  if (start > 0 && lines.size() == count + 1) lines.pop_front();  // maybe a partial first line
  return {lines.begin(), lines.end()};
}

Status writeTextFile(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::trunc);
  out << text;
  out.flush();
  if (!out) return unavailable(fmt::format("cannot write {}", path.string()));
  return {};
}

Status makeFolder(const fs::path& path) {
  std::error_code error;
  fs::create_directories(path, error);
  if (error) {
    return unavailable(
        fmt::format("cannot create the folder {}: {}", path.string(), error.message()));
  }
  return {};
}

struct Worker {
  int64_t rank = 0;
  SpawnSpec spec;
  std::unique_ptr<ChildProcess> process;  // null until spawned (or when spawning failed)
  bool killedByPlan = false;              // --kill: its death is not a failure
  std::optional<double> restartAt;        // --restart-after: launcher time to start it again
  std::optional<size_t> killRecord;       // index in the fault records of its latest kill
  // Its start event came: it takes signals now (before, SIGRTMIN would end it).
  bool started = false;
  int retries = 0;  // restarts after a failure (--restart-after)
};

struct Failure {
  int64_t rank = 0;
  std::string cause;  // "exit code 1", "sent an error event", "could not start: ..."
  bool fromEvent = false;
};

// Runs the spawned workers: one poll(2) loop over their stdout pipes and the
// signalfd; records events, writes the CSV and the launcher log, redraws the
// progress, detects failures and stops everyone.
class JobRunner {
 public:
  // `network`: the namespace WAN (--network netns), which partitions and
  // throttles act on; null: the workers' own emulation, which signals reach.
  JobRunner(const LocalIo& io, RunState& state, CsvWriter& csv, std::ofstream& runLog,
            SignalWatch& signals, std::vector<Worker> workers, FaultPlan plan,
            wan::NetnsNetwork* network)
      : io_(io),
        state_(state),
        csv_(csv),
        runLog_(runLog),
        signals_(signals),
        workers_(std::move(workers)),
        plan_(std::move(plan)),
        network_(network),
        killsDone_(plan_.kills.size(), false),
        partitionState_(plan_.partitions.size(), 0),
        live_(*io.out, io.tty),
        start_(Clock::now()) {}

  const std::vector<FaultRecord>& faultRecords() const { return records_; }

  double now() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }

  LocalOutcome run() {
    spawnAll();
    double lastFlush = 0;
    while ((anyRunning() || restartPending()) && failures_.empty() && interrupts_ == 0) {
      pump(plan_.any() ? 50 : kPollMillis);
      injectFaults(now());
      const double t = now();
      live_.update(state_, t);
      if (t - lastFlush >= 1.0) {
        flushCsv();
        lastFlush = t;
      }
    }
    if (anyRunning()) stopAll();
    end_ = now();
    flushCsv();
    live_.update(state_, end_, /*force=*/true);
    if (interrupts_ > 0) return LocalOutcome::kInterrupted;
    if (!failures_.empty()) return LocalOutcome::kFailed;
    for (const Worker& w : workers_) {
      if (!w.process || !w.process->exitStatus() || !w.process->exitStatus()->success()) {
        // A worker killed by the plan and never restarted is not a failure.
        if (w.killedByPlan && !w.restartAt) continue;
        return LocalOutcome::kFailed;
      }
    }
    return LocalOutcome::kSucceeded;
  }

  double endSeconds() const { return end_; }

  // To io.err: the first failure in detail, then any other seen before the stop.
  void reportFailures() const {
    if (failures_.empty()) return;
    std::ostream& err = *io_.err;
    const Failure& first = failures_.front();
    const RankProgress& p = state_.rank(first.rank);
    const Worker& w = workers_[static_cast<size_t>(first.rank)];
    std::string how = first.cause;
    if (first.fromEvent && w.process && w.process->exitStatus()) {
      how += fmt::format(" (then {})", w.process->exitStatus()->describe());
    }
    err << fmt::format("geotrain local: worker {} (region {}, local index {}) failed: {}\n",
                       first.rank, p.region, p.localIndex, how);
    if (!p.errorMessage.empty()) err << "  error: " << p.errorMessage << "\n";
    const std::vector<std::string> tail = tailLines(w.spec.stderrPath, kLogTailLines);
    if (tail.empty()) {
      err << fmt::format("  its log {} is empty\n", w.spec.stderrPath.string());
    } else {
      err << fmt::format("  last lines of {}:\n", w.spec.stderrPath.string());
      for (const std::string& line : tail) err << "    | " << line << "\n";
    }
    for (size_t i = 1; i < failures_.size(); ++i) {
      const RankProgress& q = state_.rank(failures_[i].rank);
      err << fmt::format("  also failed: worker {} (region {}, local index {}): {}{}\n", q.rank,
                         q.region, q.localIndex, failures_[i].cause,
                         q.errorMessage.empty() ? std::string() : ": " + q.errorMessage);
    }
    if (workers_.size() > 1) err << "geotrain local: stopped the other workers\n";
  }

 private:
  void log(const std::string& line) { runLog_ << fmt::format("[{:9.3f}] {}\n", now(), line); }

  // With --restart-after, a worker that fails (not only one --kill'ed) is
  // started again after the same delay, at most kMaxRetries times: what a
  // Kubernetes Job's per-index retries do. A member whose region leader was
  // killed fails (it cannot train without it) and rejoins this way.
  static constexpr int kMaxRetries = 3;
  bool canRetry(const Worker& w) const {
    return plan_.restartAfterSeconds.has_value() && w.retries < kMaxRetries;
  }
  bool retry(Worker& w, const std::string& cause) {
    if (!canRetry(w)) return false;
    ++w.retries;
    w.restartAt = now() + *plan_.restartAfterSeconds;
    log(fmt::format("worker {} failed ({}); restarting it at {:.1f} s (retry {} of {})", w.rank,
                    cause, *w.restartAt, w.retries, kMaxRetries));
    return true;
  }

  // A worker that exited kWorkerExitRejoin (a member whose region leader died) is
  // started again without counting a retry, as the Kubernetes pod failure
  // policy's Ignore rule for that code does: a member fails each time its
  // leader does, and in a 30-minute churn a member used up its three
  // retries on its leader's deaths, which stopped the job.
  bool restartToRejoin(Worker& w) {
    if (!plan_.restartAfterSeconds) return false;
    w.restartAt = now() + *plan_.restartAfterSeconds;
    log(fmt::format(
        "worker {} lost what it depends on (exit code {}); restarting it at {:.1f} s to rejoin "
        "(not counted against its retries)",
        w.rank, kWorkerExitRejoin, *w.restartAt));
    return true;
  }

  bool restartPending() const {
    for (const Worker& w : workers_) {
      if (w.restartAt) return true;
    }
    return false;
  }

  // Carries out the plan's kills, restarts and partitions that are due.
  void injectFaults(double t) {
    for (size_t i = 0; i < plan_.kills.size(); ++i) {
      const KillFault& k = plan_.kills[i];
      if (killsDone_[i] || t < k.atSeconds) continue;
      killsDone_[i] = true;
      Worker& w = workers_[static_cast<size_t>(k.rank)];
      if (!w.process || !w.process->running()) continue;
      w.killedByPlan = true;
      w.process->signalGroup(SIGKILL);
      FaultRecord r;
      r.kind = "kill";
      r.what = fmt::format("{} (rank {})", k.what, k.rank);
      r.region = state_.rank(k.rank).region;
      r.atSeconds = t;
      records_.push_back(r);
      w.killRecord = records_.size() - 1;
      if (plan_.restartAfterSeconds) w.restartAt = t + *plan_.restartAfterSeconds;
      log(fmt::format(
          "fault: killed worker {} ({}) with SIGKILL{}", k.rank, k.what,
          w.restartAt ? fmt::format("; restarting it at {:.1f} s", *w.restartAt) : std::string()));
    }
    for (Worker& w : workers_) {
      if (!w.restartAt || t < *w.restartAt || (w.process && w.process->running())) continue;
      w.restartAt.reset();
      if (!anyOtherRunning(w.rank)) {
        // The job ended while it was down: started now it could only train
        // alone, or fail (a worker resumed from a checkpoint that hears no
        // peer refuses to train alone). A Kubernetes Job whose other
        // indexes completed is over too.
        log(fmt::format("worker {} not restarted: every other worker has exited (the job is over)",
                        w.rank));
        continue;
      }
      readFrom(w);
      auto child = ChildProcess::spawn(w.spec);
      if (!child.ok()) {
        addFailure({w.rank, "could not restart: " + child.status().message(), false});
        continue;
      }
      w.process = std::move(*child);
      w.killedByPlan = false;
      w.started = false;
      // The restart that ends the kill; a later one (a member restarted to
      // rejoin after its leader died) is not, and took the time to rejoin
      // below zero (-319 s in a 30-minute soak).
      if (w.killRecord && !records_[*w.killRecord].endSeconds) {
        records_[*w.killRecord].endSeconds = t;
      }
      log(fmt::format("fault: worker {} restarted as pid {}", w.rank, w.process->pid()));
    }
    for (size_t i = 0; i < plan_.partitions.size(); ++i) {
      const PartitionFault& p = plan_.partitions[i];
      const int next = t >= p.atSeconds + p.forSeconds ? 2 : t >= p.atSeconds ? 1 : 0;
      while (partitionState_[i] < next) {
        const bool begin = partitionState_[i] == 0;
        ++partitionState_[i];
        const auto& regions = state_.topology().regions;
        const std::string& region = regions[static_cast<size_t>(p.regionIndex)];
        const std::string what =
            p.otherRegionIndex
                ? fmt::format("{}/{}", region, regions[static_cast<size_t>(*p.otherRegionIndex)])
                : region;
        if (network_ != nullptr && p.otherRegionIndex) {
          network_->setLinkCut(static_cast<size_t>(p.regionIndex),
                               static_cast<size_t>(*p.otherRegionIndex), begin);
        } else if (network_ != nullptr) {
          network_->setPartitioned(static_cast<size_t>(p.regionIndex), begin);
        } else {
          for (Worker& w : workers_) {
            if (state_.rank(w.rank).regionIndex != p.regionIndex) continue;
            if (w.process && w.process->running()) {
              w.process->signalGroup(begin ? SIGUSR1 : SIGUSR2);
            }
          }
        }
        if (begin) {
          FaultRecord r;
          r.kind = "partition";
          r.what = what;
          r.region = region;
          if (p.otherRegionIndex) {
            r.otherRegion = regions[static_cast<size_t>(*p.otherRegionIndex)];
          }
          r.atSeconds = t;
          records_.push_back(r);
          partitionRecord_.resize(plan_.partitions.size());
          partitionRecord_[i] = records_.size() - 1;
        } else {
          records_[partitionRecord_[i]].endSeconds = t;
        }
        log(fmt::format("fault: partition of {} {}", what, begin ? "begins" : "ends"));
      }
    }
    injectThrottles(t);
  }

  // Throttles whose time has come: every worker of the region gets the new
  // uplink rate.
  void injectThrottles(double t) {
    for (size_t i = 0; i < plan_.throttles.size(); ++i) {
      const ThrottleFault& f = plan_.throttles[i];
      if (throttlesDone_[i] || t < f.atSeconds) continue;
      throttlesDone_[i] = true;
      const std::string& region = state_.topology().regions[static_cast<size_t>(f.regionIndex)];
      if (network_ != nullptr) {
        network_->setEgressRate(static_cast<size_t>(f.regionIndex),
                                static_cast<double>(f.kbitPerSecond) * 1000);
      }
      for (Worker& w : workers_) {
        if (network_ != nullptr || state_.rank(w.rank).regionIndex != f.regionIndex) continue;
        if (w.started && w.process && w.process->running()) {
          w.process->queueSignal(SIGRTMIN, static_cast<int>(f.kbitPerSecond));
        }
      }
      FaultRecord r;
      r.kind = "throttle";
      r.what = fmt::format("{} uplink {}", region, f.rate);
      r.region = region;
      r.atSeconds = t;
      records_.push_back(r);
      log(fmt::format("fault: uplink of {} now {}", region, f.rate));
    }
  }

  void flushCsv() {
    if (Status s = csv_.flush(); !s.ok() && !csvBroken_) {
      *io_.err << "geotrain local: " << s.message() << "\n";
      csvBroken_ = true;
    }
    runLog_.flush();
  }

  void spawnAll() {
    for (Worker& w : workers_) {
      auto child = ChildProcess::spawn(w.spec);
      if (!child.ok()) {
        log(fmt::format("worker {}: {}", w.rank, child.status().message()));
        addFailure({w.rank, "could not start: " + child.status().message(), false});
        return;
      }
      w.process = std::move(*child);
      log(fmt::format("worker {} started as pid {}: {} {}", w.rank, w.process->pid(),
                      w.spec.program, fmt::join(w.spec.args, " ")));
    }
  }

  // One failure per rank: an "error" event and the exit that follows are one.
  void addFailure(Failure failure) {
    for (const Failure& f : failures_) {
      if (f.rank == failure.rank) return;
    }
    failures_.push_back(std::move(failure));
  }

  bool anyOtherRunning(int64_t rank) const {
    for (const Worker& w : workers_) {
      if (w.rank != rank && w.process && w.process->running()) return true;
    }
    return false;
  }

  bool anyRunning() const {
    for (const Worker& w : workers_) {
      if (w.process && w.process->running()) return true;
    }
    return false;
  }

  // One round: wait up to timeoutMillis for output or a signal, then read
  // all pipes, take the signals and reap the workers that exited.
  void pump(int timeoutMillis) {
    std::vector<pollfd> fds;
    fds.push_back({signals_.fd(), POLLIN, 0});
    for (const Worker& w : workers_) {
      if (w.process && w.process->stdoutFd() >= 0) {
        fds.push_back({w.process->stdoutFd(), POLLIN, 0});
      }
    }
    if (::poll(fds.data(), fds.size(), timeoutMillis) < 0 && errno != EINTR) {
      log(fmt::format("poll(): {}", std::strerror(errno)));
    }
    for (const int signal : signals_.take()) {
      if (signal == SIGINT || signal == SIGTERM) {
        ++interrupts_;
        log(fmt::format("received {}", signalName(signal)));
      }
    }
    for (Worker& w : workers_) readFrom(w);
    for (Worker& w : workers_) {
      if (!w.process || !w.process->running() || !w.process->tryReap()) continue;
      readFrom(w);  // whatever it wrote before exiting is in the pipe now
      const ExitStatus exit = *w.process->exitStatus();
      log(fmt::format("worker {} (pid {}) ended: {}{}", w.rank, w.process->pid(), exit.describe(),
                      w.killedByPlan ? " (killed by --kill)" : ""));
      if (!exit.success() && !stopping_ && !w.killedByPlan) {
        const bool rejoin = !exit.signaled && exit.code == kWorkerExitRejoin;
        if (!(rejoin ? restartToRejoin(w) : retry(w, exit.describe()))) {
          addFailure({w.rank, exit.describe(), false});
        }
      }
    }
  }

  void readFrom(Worker& w) {
    if (!w.process || w.process->stdoutFd() < 0) return;
    std::vector<std::string> lines;
    w.process->readLines(lines);
    for (const std::string& line : lines) handleLine(w.rank, line);
  }

  void handleLine(int64_t rank, const std::string& line) {
    if (line.empty()) return;
    const double t = now();
    auto event = parseWorkerEvent(line);
    if (!event.ok()) {
      log(fmt::format("worker {} stdout ({}): {}", rank, event.status().message(), line));
      return;
    }
    if (event->rank && *event->rank != rank) {
      log(fmt::format("worker {} sent an event for rank {}; counted as rank {}", rank, *event->rank,
                      rank));
    }
    state_.record(rank, t, *event);
    switch (event->kind) {
      case EventKind::kStart: {
        log(fmt::format("worker {} ({}) running: model {}, {} parameters, {} samples, {}", rank,
                        event->region, event->model, event->parameters.value_or(0),
                        event->shardSamples.value_or(0), event->algorithm));
        // A (re)started worker's uplink is as slow as its region's is now.
        Worker& w = workers_[static_cast<size_t>(rank)];
        w.started = true;
        for (size_t i = 0; i < plan_.throttles.size(); ++i) {
          const ThrottleFault& f = plan_.throttles[i];
          if (network_ == nullptr && throttlesDone_[i] &&
              state_.rank(rank).regionIndex == f.regionIndex && w.process) {
            w.process->queueSignal(SIGRTMIN, static_cast<int>(f.kbitPerSecond));
          }
        }
        break;
      }
      case EventKind::kJoined:
        log(fmt::format("worker {} continues from step {}{}", rank, event->step.value_or(0),
                        event->transferred.value_or(false) ? " with a live peer's model" : ""));
        if (Worker& w = workers_[static_cast<size_t>(rank)]; w.killRecord) {
          FaultRecord& r = records_[*w.killRecord];
          if (!r.joinedSeconds && r.endSeconds) {
            r.joinedSeconds = t;
            r.joinedStep = event->step;
            r.stateTransferSeconds = event->stateTransferSeconds;
          }
        }
        break;
      case EventKind::kProgress:
      case EventKind::kDone:
        if (Status s = csv_.append(csvRow(t, rank, state_.rank(rank).region, *event));
            !s.ok() && !csvBroken_) {
          *io_.err << "geotrain local: " << s.message() << "\n";
          csvBroken_ = true;
        }
        if (event->kind == EventKind::kDone) log(fmt::format("worker {} done", rank));
        break;
      case EventKind::kError:
        log(fmt::format("worker {} error: {}", rank, event->message));
        // One that will exit kWorkerExitRejoin is judged by its exit (above).
        if (!stopping_ && !event->rejoin.value_or(false) &&
            !canRetry(workers_[static_cast<size_t>(rank)])) {
          addFailure({rank, "sent an error event", true});
        }
        break;
      case EventKind::kOther: break;
    }
  }

  // SIGTERM to every running worker's group (except those that sent an
  // "error" event, which exit by themselves); up to kStopGrace for them to
  // go, reading their output meanwhile; then SIGKILL. A further SIGINT or
  // SIGTERM to the launcher skips the grace period.
  void stopAll() {
    stopping_ = true;
    log("stopping all workers (SIGTERM)");
    for (Worker& w : workers_) {
      // One that reported an error is on its way out: let it finish its log.
      if (w.process && state_.rank(w.rank).errorMessage.empty()) {
        w.process->signalGroup(SIGTERM);
      }
    }
    const int interruptsBefore = interrupts_;
    const auto deadline = Clock::now() + kStopGrace;
    while (anyRunning() && Clock::now() < deadline && interrupts_ == interruptsBefore) {
      pump(50);
    }
    for (Worker& w : workers_) {
      if (!w.process || !w.process->running()) continue;
      log(fmt::format("worker {} (pid {}) still running: SIGKILL", w.rank, w.process->pid()));
      w.process->signalGroup(SIGKILL);
      const ExitStatus exit = w.process->waitForExit();
      readFrom(w);
      log(fmt::format("worker {} (pid {}) ended: {}", w.rank, w.process->pid(), exit.describe()));
    }
  }

  const LocalIo& io_;
  RunState& state_;
  CsvWriter& csv_;
  std::ofstream& runLog_;
  SignalWatch& signals_;
  std::vector<Worker> workers_;
  FaultPlan plan_;
  wan::NetnsNetwork* network_;
  std::vector<bool> killsDone_;
  std::vector<int> partitionState_;  // 0 before, 1 during, 2 after
  std::vector<bool> throttlesDone_ = std::vector<bool>(plan_.throttles.size(), false);
  std::vector<size_t> partitionRecord_;
  std::vector<FaultRecord> records_;
  LiveProgress live_;
  Clock::time_point start_;
  double end_ = 0;
  std::vector<Failure> failures_;
  int interrupts_ = 0;
  bool stopping_ = false;
  bool csvBroken_ = false;
};

std::string yamlFor(const WorkerConfig& c, const fs::path& workerBinary, const fs::path& self) {
  return fmt::format(
      "# Written by `geotrain local` for rank {} ({}, local index {}). Run this worker alone "
      "with:\n#   {} --config {}\n{}",
      c.worker.rank, c.worker.region, c.worker.localRank, workerBinary.string(), self.string(),
      toYaml(c));
}

// What each injected fault cost: the others' longest step (their stall),
// the time down and to rejoin of a killed worker, and how much later its
// region finished than the others.
std::vector<FaultSummary> summarizeFaults(const std::vector<FaultRecord>& records,
                                          const RunState& state) {
  std::vector<FaultSummary> out;
  for (const FaultRecord& r : records) {
    FaultSummary f;
    f.kind = r.kind;
    f.what = r.what;
    f.atSeconds = r.atSeconds;
    f.endSeconds = r.endSeconds;
    if (r.kind == "kill" && r.endSeconds) {
      f.downSeconds = *r.endSeconds - r.atSeconds;
      if (r.joinedSeconds) f.rejoinSeconds = *r.joinedSeconds - *r.endSeconds;
      f.rejoinStep = r.joinedStep;
    }
    std::optional<double> regionDone, othersDone;
    for (const RankProgress& p : state.ranks()) {
      const bool inside =
          p.region == r.region || (!r.otherRegion.empty() && p.region == r.otherRegion);
      if (!inside && p.stepSecondsMax) {
        f.othersStallSeconds = std::max(f.othersStallSeconds.value_or(0), *p.stepSecondsMax);
      }
      if (p.doneWallSeconds) {
        auto& done = inside ? regionDone : othersDone;
        done = std::max(done.value_or(0), *p.doneWallSeconds);
      }
    }
    if (regionDone && othersDone) f.finishSkewSeconds = *regionDone - *othersDone;
    out.push_back(std::move(f));
  }
  return out;
}

// The header's lines for the namespace WAN.
std::string describeNetns(const wan::NetnsNetwork& network) {
  const wan::WanShape& shape = network.shape();
  std::string extra;
  const wan::SiteShape& first = shape.site.front();
  if (first.ingressBitsPerSecond > 0) {
    extra += fmt::format(", downlink {:.4g} Mbit/s", first.ingressBitsPerSecond / 1e6);
  }
  extra += fmt::format(", queue {} ms", first.queue.count() / 1000);
  if (shape.jitter.count() > 0) extra += fmt::format(", jitter {} ms", shape.jitter.count() / 1e3);
  std::string loss;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape.site[i].loss > 0) {
      loss += fmt::format("{}{} {:.3g}%", loss.empty() ? "" : ", ", shape.sites[i],
                          shape.site[i].loss * 100);
    }
  }
  if (!loss.empty()) extra += ", loss " + loss;
  return fmt::format(
      "  netns       each region in its own network namespace ({} ... {}), the WAN emulated "
      "below TCP{}; packet thread {}",
      wan::siteAddress(0), wan::siteAddress(shape.size() - 1), extra,
      network.realtime() ? "real-time (SCHED_FIFO)" : "at normal priority (no SCHED_FIFO)");
}

// What the namespace WAN did to each region's packets, for launcher.log.
std::string wanCountersText(const wan::NetnsNetwork& network) {
  const auto c = network.counters();
  std::string out =
      "wan: per region, packets sent / delivered to it / lost / uplink queue drops "
      "/ downlink queue drops / partitioned\n";
  for (size_t i = 0; i < c.sites.size(); ++i) {
    const wan::SiteCounters& s = c.sites[i];
    out += fmt::format("wan:   {}: {} / {} / {} / {} / {} / {}\n", network.shape().sites[i],
                       s.packetsSent, s.packetsDelivered, s.lost, s.egressDropped, s.ingressDropped,
                       s.partitioned);
  }
  out += fmt::format("wan: most packets held at once {}; foreign packets dropped {}\n", c.heldPeak,
                     c.foreign);
  return out;
}

}  // namespace

int exitCodeOf(LocalOutcome outcome) {
  switch (outcome) {
    case LocalOutcome::kSucceeded: return 0;
    case LocalOutcome::kFailed: return 1;
    case LocalOutcome::kInterrupted: return 130;
  }
  return 1;
}

StatusOr<fs::path> resolveWorkerBinary(const std::string& flag) {
  std::error_code error;
  fs::path path;
  if (!flag.empty()) {
    path = fs::absolute(flag, error);
  } else {
    const fs::path self = fs::read_symlink("/proc/self/exe", error);
    if (error) {
      return invalidArgument(fmt::format(
          "cannot find the running executable (/proc/self/exe: {}); give --worker-binary PATH",
          error.message()));
    }
    path = self.parent_path() / "geotrain-worker";
  }
  const char* origin =
      flag.empty() ? "the default worker binary (next to geotrain)" : "--worker-binary";
  if (!fs::exists(path, error)) {
    return invalidArgument(fmt::format(
        "{} {} does not exist (build the geotrain-worker target, or give --worker-binary PATH)",
        origin, path.string()));
  }
  if (!fs::is_regular_file(path, error) || ::access(path.c_str(), X_OK) != 0) {
    return invalidArgument(fmt::format("{} {} is not an executable file", origin, path.string()));
  }
  return path;
}

StatusOr<fs::path> chooseRunFolder(const std::string& flag) {
  std::error_code error;
  if (!flag.empty()) {
    const fs::path path = fs::absolute(flag, error);
    if (fs::exists(path, error)) {
      if (!fs::is_directory(path, error)) {
        return invalidArgument(fmt::format("--out {}: exists and is not a folder", path.string()));
      }
      if (!fs::is_empty(path, error)) {
        return invalidArgument(fmt::format(
            "--out {}: the folder exists and is not empty; give a new or empty folder (each run "
            "writes its own keys, configs and logs)",
            path.string()));
      }
    }
    return path;
  }
  const std::time_t t = std::time(nullptr);
  std::tm local{};
  ::localtime_r(&t, &local);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &local);
  const fs::path base = fs::absolute(fs::path("runs") / stamp, error);
  fs::path path = base;
  for (int i = 2; fs::exists(path, error); ++i) path = fmt::format("{}-{}", base.string(), i);
  return path;
}

StatusOr<LocalOutcome> runLocal(const LocalOptions& options, const LocalIo& io) {
  // ---- Everything that can be checked before touching the disk.
  TopologyOptions topologyOptions;
  topologyOptions.regions = options.regions;
  topologyOptions.workersPerRegion = options.workersPerRegion;
  topologyOptions.preset = options.preset;
  topologyOptions.rtt = options.rtt;
  topologyOptions.uplink = options.uplink;
  auto topology = makeTopology(topologyOptions);
  if (!topology.ok()) return topology.status();
  auto plan = makeFaultPlan(options.faults, *topology);
  if (!plan.ok()) return plan.status();
  auto networkPlan = makeNetworkPlan(options.network, *topology);
  if (!networkPlan.ok()) return networkPlan.status();
  const bool netns = networkPlan->mode == NetworkMode::kNetns;
  for (size_t i = 0; i < plan->partitions.size(); ++i) {
    if (plan->partitions[i].otherRegionIndex && !netns) {
      return invalidArgument(fmt::format(
          "--partition {}: a link between two regions is cut on --network netns only (the "
          "emulation above TCP cuts a region off whole)",
          options.faults.partition[i]));
    }
  }
  if (netns) {
    if (Status allowed = wan::checkNetnsAllowed(); !allowed.ok()) {
      return Status(allowed.code(),
                    fmt::format("--network netns: {}. Run geotrain local as root (e.g. with "
                                "sudo), or leave --network at userspace, the emulation above TCP "
                                "that needs no privileges",
                                allowed.message()));
    }
    if (!options.prometheusConfig.empty()) {
      return invalidArgument(
          "--prometheus-config with --network netns: the workers' /metrics listen inside their "
          "regions' network namespaces, which a Prometheus on this machine cannot reach");
    }
  }
  int64_t stepTimeMs = 0;
  if (options.stepTime) {
    const auto seconds = parseSeconds(*options.stepTime);
    if (!seconds.ok())
      return invalidArgument(fmt::format("--step-time: {}", seconds.status().message()));
    if (*seconds < 1e-3 || *seconds > 60) {
      return invalidArgument(
          fmt::format("--step-time {}: allowed from 1ms to 60s", *options.stepTime));
    }
    stepTimeMs = std::llround(*seconds * 1e3);
  }
  auto base = buildBaseConfig(options);
  if (!base.ok()) return base.status();
  auto workerBinary = resolveWorkerBinary(options.workerBinary);
  if (!workerBinary.ok()) return workerBinary.status();
  std::optional<fs::path> gnuplot;
  fs::path plotPath;
  std::error_code error;
  if (!options.plot.empty()) {
    const char* searchPath = std::getenv("PATH");
    auto found = findGnuplot(searchPath != nullptr ? searchPath : "");
    if (!found.ok()) return found.status();
    gnuplot = *found;
    plotPath = fs::absolute(options.plot, error);
    if (!fs::is_directory(plotPath.parent_path(), error)) {
      return invalidArgument(fmt::format("--plot {}: the folder {} does not exist", options.plot,
                                         plotPath.parent_path().string()));
    }
  }
  auto outDir = chooseRunFolder(options.out);
  if (!outDir.ok()) return outDir.status();

  const int64_t world = topology->worldSize();
  RankLayout layout;
  layout.outDir = *outDir;
  layout.threadsPerWorker = defaultThreadsPerWorker(std::thread::hardware_concurrency(), world);
  layout.ports.assign(static_cast<size_t>(world), 1);  // placeholders: validate before writing
  layout.metricsPorts.assign(static_cast<size_t>(world), 2);
  if (netns) {
    // Every worker binds its region's address; the WAN below TCP replaces
    // the transport's own emulation.
    layout.emulateLinks = false;
    // Hosts tuned for the WAN (docs/wan-emulation.md, "TCP's slow start"):
    // connections between regions open with a window taken from the links
    // (689 segments on the world preset at 100 Mbit/s) instead of 10.
    layout.tcpInitialWindow = wan::tcpInitialWindowFor(networkPlan->shape);
    for (int64_t r = 0; r < world; ++r) {
      layout.hosts.push_back(
          wan::siteAddress(static_cast<size_t>(placeOf(*topology, r).regionIndex)));
    }
  }
  GEO_RETURN_IF_ERROR(validateRankConfigs(makeRankConfigs(*base, *topology, layout)));

  // ---- Files the flags name, possibly outside the run folder: checked before
  // anything is written, so that a bad path leaves no half-made run folder
  // behind (which would block a rerun with the same --out).
  RunPaths paths;
  paths.outDir = *outDir;
  paths.logsDir = *outDir / "logs";
  paths.runLog = paths.logsDir / "launcher.log";
  paths.csv = options.csv.empty() ? *outDir / "progress.csv" : fs::absolute(options.csv, error);
  paths.summaryJson = *outDir / "summary.json";
  if (!options.csv.empty()) GEO_RETURN_IF_ERROR(checkOutputFile("--csv", paths.csv, *outDir));
  fs::path promPath;
  if (!options.prometheusConfig.empty()) {
    promPath = fs::absolute(options.prometheusConfig, error);
    GEO_RETURN_IF_ERROR(checkOutputFile("--prometheus-config", promPath, *outDir));
  }
  if (!options.plot.empty()) GEO_RETURN_IF_ERROR(checkOutputFile("--plot", plotPath, *outDir));

  // ---- The namespace WAN, before anything is written: a failure leaves
  // nothing behind. Its namespaces live as long as it and the workers do.
  std::unique_ptr<wan::NetnsNetwork> network;
  if (netns) {
    auto made = wan::NetnsNetwork::create(networkPlan->shape);
    if (!made.ok()) return made.status().withContext("--network netns");
    network = std::move(*made);
  }

  // ---- The run folder. Until the workers start, an error takes back
  // everything written so far (a file can still fail to be written: a full
  // disk, /dev/full).
  OutputRollback rollback;
  rollback.folder(*outDir);
  GEO_RETURN_IF_ERROR(makeFolder(paths.logsDir));
  rollback.file(paths.csv);
  auto csv = CsvWriter::create(paths.csv);
  if (!csv.ok()) return csv.status();

  // One transport and one metrics port per rank.
  auto ports = PortReservation::reserve(2 * static_cast<size_t>(world));
  if (!ports.ok()) return ports.status();
  const std::vector<uint16_t> all = ports->ports();
  layout.ports.assign(all.begin(), all.begin() + world);
  layout.metricsPorts.assign(all.begin() + world, all.end());
  const std::vector<WorkerConfig> configs = makeRankConfigs(*base, *topology, layout);
  GEO_RETURN_IF_ERROR(validateRankConfigs(configs));

  std::vector<Worker> workers;
  for (int64_t r = 0; r < world; ++r) {
    const fs::path configPath = *outDir / fmt::format("worker-{}.yaml", r);
    GEO_RETURN_IF_ERROR(writeTextFile(
        configPath, yamlFor(configs[static_cast<size_t>(r)], *workerBinary, configPath)));
    GEO_RETURN_IF_ERROR(
        keys::writeKeyPair(keys::generateKeyPair(), *outDir / "keys", fmt::format("worker-{}", r)));
    Worker w;
    w.rank = r;
    w.spec.program = workerBinary->string();
    w.spec.args = {"--config", configPath.string(), "--progress-format", "jsonl"};
    if (const double f = plan->slowdown[static_cast<size_t>(r)]; f > 1) {
      w.spec.args.insert(w.spec.args.end(), {"--emulate-slowdown", fmt::format("{}", f)});
    }
    if (stepTimeMs > 0) {
      w.spec.args.insert(w.spec.args.end(), {"--emulate-step-time", fmt::format("{}", stepTimeMs)});
    }
    w.spec.stderrPath = paths.logsDir / fmt::format("worker-{}.log", r);
    if (network) {
      w.spec.netnsFd = network->namespaceFd(static_cast<size_t>(placeOf(*topology, r).regionIndex));
    }
    workers.push_back(std::move(w));
  }
  std::ofstream runLog(paths.runLog, std::ios::app);
  if (!runLog) return unavailable(fmt::format("cannot write {}", paths.runLog.string()));
  if (!options.plot.empty()) paths.plot = plotPath;

  std::string metricsLines =
      fmt::format("  metrics     http://{}/metrics (rank 0)", configs.front().metrics.listen);
  if (world > 1) {
    metricsLines += fmt::format(" ... :{} (rank {})", layout.metricsPorts.back(), world - 1);
  }
  if (network) {
    metricsLines += " inside the regions' namespaces";
    metricsLines += "\n" + describeNetns(*network);
  }
  if (!options.prometheusConfig.empty()) {
    rollback.file(promPath);
    GEO_RETURN_IF_ERROR(writeTextFile(promPath, prometheusScrapeConfig(configs, *outDir)));
    metricsLines +=
        fmt::format("\n  prometheus  {} (scrape config for all workers)", promPath.string());
  }
  *io.out << renderHeader(*topology, configs.front(), paths, netns) << metricsLines << "\n"
          << std::flush;

  // ---- Run.
  auto signals = SignalWatch::create();
  if (!signals.ok()) return signals.status();
  for (Worker& w : workers) w.spec.childSignalMask = &signals->previousMask();
  RunState state(*topology, base->training.steps);
  rollback.keep();   // from here on the run folder records a run
  ports->release();  // right before the workers bind them
  JobRunner runner(io, state, *csv, runLog, *signals, std::move(workers), *plan, network.get());
  LocalOutcome outcome = runner.run();
  if (network) runLog << wanCountersText(*network) << std::flush;

  // ---- Report: the summary so far, then what went wrong (last, so it stays in view).
  RunSummary summary = state.summarize(runner.endSeconds());
  summary.outcome = std::string(outcomeName(outcome));
  summary.faults = summarizeFaults(runner.faultRecords(), state);
  if (Status s = writeTextFile(paths.summaryJson, summaryJson(summary)); !s.ok()) {
    *io.err << "geotrain local: " << s.message() << "\n";
    if (outcome == LocalOutcome::kSucceeded) outcome = LocalOutcome::kFailed;
  }
  if (gnuplot) {
    PlotFiles files{plotPath, *outDir / "accuracy.dat", *outDir / "accuracy.gp",
                    paths.logsDir / "gnuplot.log"};
    if (Status s = writeAccuracyPlot(*gnuplot, state, files); !s.ok()) {
      *io.err << "geotrain local: " << s.message() << "\n";
      paths.plot.clear();
      if (outcome == LocalOutcome::kSucceeded) outcome = LocalOutcome::kFailed;
    }
  }
  *io.out << "\n" << renderSummary(summary, paths) << std::flush;
  runner.reportFailures();
  if (outcome == LocalOutcome::kInterrupted) {
    *io.err << "geotrain local: interrupted; all workers were stopped\n";
  }
  return outcome;
}

}  // namespace geo::local
