// `geotrain local` end to end, as processes: the real geotrain binary runs
// fake_worker.sh (the jsonl protocol with made-up numbers, see that file) as
// its workers. Covers a normal run (summary.json, CSV, configs, keys), a
// failing worker, a worker that dies by a signal, SIGINT/SIGTERM to the
// launcher, a worker that ignores SIGTERM, errors found before anything is
// spawned, --plot, and --help. After every run no worker may be left: each
// fake writes its pid to a file and the test checks them with kill(pid, 0).

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/worker_config.h"

#ifndef GEO_GEOTRAIN_BIN
#error "GEO_GEOTRAIN_BIN must point at the geotrain executable"
#endif
#ifndef GEO_FAKE_WORKER
#error "GEO_FAKE_WORKER must point at fake_worker.sh"
#endif

namespace {

namespace fs = std::filesystem;
using Env = std::vector<std::pair<std::string, std::string>>;

std::string readFile(const fs::path& path) {
  std::ifstream in(path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

struct Result {
  bool finished = false;  // false: still running at the deadline (then killed)
  int exitCode = -1;
  std::string out;
  std::string err;
  double seconds = 0;
};

class LocalProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "geo-local-proc-XXXXXX").string();
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
    pids_ = dir_ / "pids";
  }

  void TearDown() override {
    for (const pid_t pid : workerPids()) ::kill(pid, SIGKILL);  // never leak, even on failure
    std::error_code ignored;
    fs::remove_all(dir_, ignored);
  }

  // Starts `geotrain local <args>` with stdout/stderr into files.
  pid_t start(const std::vector<std::string>& args, const Env& env = {}) {
    std::vector<std::string> argv = {GEO_GEOTRAIN_BIN, "local"};
    argv.insert(argv.end(), args.begin(), args.end());
    std::vector<char*> cargv;
    cargv.reserve(argv.size() + 1);
    for (std::string& a : argv) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    const std::string outPath = (dir_ / "stdout").string();
    const std::string errPath = (dir_ / "stderr").string();
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::setenv("GEO_FAKE_PIDS", pids_.c_str(), 1);
      for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
      const int out = ::open(outPath.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      const int err = ::open(errPath.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(out, STDOUT_FILENO);
      ::dup2(err, STDERR_FILENO);
      ::signal(SIGINT, SIG_DFL);
      ::signal(SIGTERM, SIG_DFL);
      sigset_t none;
      sigemptyset(&none);
      ::sigprocmask(SIG_SETMASK, &none, nullptr);
      ::execv(cargv[0], cargv.data());
      ::_exit(127);
    }
    started_ = std::chrono::steady_clock::now();
    return pid;
  }

  Result wait(pid_t pid, double timeoutSeconds) {
    Result r;
    const auto deadline = started_ + std::chrono::duration<double>(timeoutSeconds);
    int status = 0;
    while (true) {
      const pid_t done = ::waitpid(pid, &status, WNOHANG);
      if (done == pid) {
        r.finished = true;
        break;
      }
      if (std::chrono::steady_clock::now() > deadline) {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, &status, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
    r.exitCode = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    r.out = readFile(dir_ / "stdout");
    r.err = readFile(dir_ / "stderr");
    return r;
  }

  Result run(const std::vector<std::string>& args, const Env& env = {}, double timeout = 30) {
    return wait(start(args, env), timeout);
  }

  std::vector<pid_t> workerPids() const {
    std::vector<pid_t> pids;
    for (const std::string& line : lines(readFile(pids_))) {
      if (!line.empty()) pids.push_back(static_cast<pid_t>(std::stol(line)));
    }
    return pids;
  }

  // Waits until `count` workers wrote their pid (they run by then).
  bool waitForWorkers(size_t count, double timeoutSeconds = 10) {
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::duration<double>(timeoutSeconds);
    while (std::chrono::steady_clock::now() < deadline) {
      if (workerPids().size() >= count) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }

  void expectNoWorkerLeft() const {
    const std::vector<pid_t> pids = workerPids();
    EXPECT_FALSE(pids.empty()) << "no worker wrote its pid";
    for (const pid_t pid : pids) {
      errno = 0;
      EXPECT_EQ(::kill(pid, 0), -1) << "worker pid " << pid << " is still alive";
      EXPECT_EQ(errno, ESRCH);
    }
  }

  std::vector<std::string> fakeArgs(const std::string& regions, int perRegion = 1) const {
    return {"--regions",
            regions,
            "--workers-per-region",
            std::to_string(perRegion),
            "--steps",
            "100",
            "--worker-binary",
            GEO_FAKE_WORKER,
            "--out",
            (dir_ / "run").string()};
  }

  fs::path dir_;
  fs::path pids_;
  std::chrono::steady_clock::time_point started_;
};

bool contains(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

TEST_F(LocalProcessTest, NormalRunWritesSummaryCsvConfigsAndKeys) {
  const Result r = run(fakeArgs("london,tokyo", 2));
  ASSERT_TRUE(r.finished);
  ASSERT_EQ(r.exitCode, 0) << r.out << r.err;
  expectNoWorkerLeft();
  EXPECT_EQ(workerPids().size(), 4u);
  const fs::path run = dir_ / "run";
  EXPECT_TRUE(contains(r.out, "run folder  " + run.string())) << r.out;
  EXPECT_TRUE(contains(r.out, "summary (succeeded")) << r.out;
  EXPECT_TRUE(contains(r.out, (run / "progress.csv").string()));

  // Numbers from the fake's events (fake_worker.sh): 10 events per rank,
  // then "done" with the same cumulative counts.
  const auto j = nlohmann::json::parse(readFile(run / "summary.json"));
  EXPECT_EQ(j["outcome"], "succeeded");
  EXPECT_DOUBLE_EQ(j["testAccuracy"].get<double>(), 0.875);
  EXPECT_EQ(j["steps"], 100);
  EXPECT_DOUBLE_EQ(j["stepsPerSecond"].get<double>(), 100.0);  // step 100 at worker time 1.0
  EXPECT_EQ(j["wanSentBytes"], 10000 * (1 + 2 + 3 + 4));
  EXPECT_EQ(j["wanReceivedBytes"], 4 * 9000);
  EXPECT_EQ(j["wanBytes"], 136000);
  EXPECT_EQ(j["lanBytes"], 4 * 200);
  EXPECT_EQ(j["payloadBytes"], 800000);
  EXPECT_DOUBLE_EQ(j["compressionRatio"].get<double>(), 8.0);
  EXPECT_DOUBLE_EQ(j["stalenessMean"].get<double>(), 3.5);  // ranks 2..5, equal weights
  EXPECT_DOUBLE_EQ(j["stalenessMax"].get<double>(), 6.0);
  EXPECT_EQ(j["missing"], 1);
  EXPECT_EQ(j["regions"]["london"]["wanSentBytes"], 30000);
  EXPECT_EQ(j["regions"]["tokyo"]["missing"], 0);
  EXPECT_GT(j["wallSeconds"].get<double>(), 0.0);
  // Rank 0 evaluates 0.72, 0.74, ... : every threshold is reached, in order.
  const auto& tta = j["timeToAccuracy"];
  ASSERT_TRUE(tta["0.80"].is_number() && tta["0.85"].is_number() && tta["0.88"].is_number())
      << tta.dump();
  EXPECT_GT(tta["0.80"].get<double>(), 0.0);
  EXPECT_LE(tta["0.80"].get<double>(), tta["0.85"].get<double>());
  EXPECT_LE(tta["0.85"].get<double>(), tta["0.88"].get<double>());

  // CSV: header + (10 progress + 1 done) per rank.
  const std::vector<std::string> csv = lines(readFile(run / "progress.csv"));
  ASSERT_EQ(csv.size(), 1u + 4 * 11);
  EXPECT_EQ(csv[0].rfind("wall_seconds,rank,region,step,loss,", 0), 0u);
  int rank3Rows = 0;
  for (const std::string& row : csv) {
    if (row.find(",3,tokyo,50,") != std::string::npos) {
      ++rank3Rows;
      // step 50 is event 5: loss 1/5, eval 0.80, bytes 1000*5*4 etc.
      EXPECT_NE(row.find(",3,tokyo,50,0.2,100,0.8,50,,20000,4500,50,50,160000,5,6,4"),
                std::string::npos)
          << row;
    }
  }
  EXPECT_EQ(rank3Rows, 1);

  // Per-rank configs are complete and valid; keys exist with the right modes.
  for (int rank = 0; rank < 4; ++rank) {
    auto c = geo::loadWorkerConfig(run / ("worker-" + std::to_string(rank) + ".yaml"));
    ASSERT_TRUE(c.ok()) << c.status().toString();
    EXPECT_EQ(c->worker.rank, rank);
    EXPECT_EQ(c->worker.region, rank < 2 ? "london" : "tokyo");
    EXPECT_EQ(c->transport.links.at("london-tokyo"), "delay=115000us");
    EXPECT_EQ(c->transport.keyDir, (run / "keys").string());
    const fs::path key = run / "keys" / ("worker-" + std::to_string(rank) + ".key");
    ASSERT_TRUE(fs::exists(key));
    EXPECT_EQ(fs::status(key).permissions() & fs::perms::all,
              fs::perms::owner_read | fs::perms::owner_write);
    EXPECT_TRUE(fs::exists(run / "keys" / ("worker-" + std::to_string(rank) + ".pub")));
    EXPECT_TRUE(contains(readFile(run / "logs" / ("worker-" + std::to_string(rank) + ".log")),
                         "fake worker " + std::to_string(rank) + ": done"));
  }
  // A line that is not JSON is noted in the launcher's log, not fatal.
  EXPECT_TRUE(contains(readFile(run / "logs" / "launcher.log"), "this line is not JSON"));
}

TEST_F(LocalProcessTest, FailingWorkerStopsTheOthersAndIsNamed) {
  const Result r =
      run(fakeArgs("london,tokyo,oregon"),
          {{"GEO_FAKE_FAIL_RANK", "1"}, {"GEO_FAKE_FOREVER", "1"}, {"GEO_FAKE_SLEEP", "0.05"}});
  ASSERT_TRUE(r.finished);
  EXPECT_EQ(r.exitCode, 1) << r.out << r.err;
  EXPECT_LT(r.seconds, 5.0);
  expectNoWorkerLeft();
  EXPECT_EQ(workerPids().size(), 3u);
  EXPECT_TRUE(contains(r.err, "worker 1 (region tokyo, local index 0) failed: sent an error event"))
      << r.err;
  EXPECT_TRUE(contains(r.err, "sent an error event (then exit code 1)")) << r.err;
  EXPECT_TRUE(contains(r.err, "error: fake failure at step 30")) << r.err;
  EXPECT_TRUE(contains(r.err, "| fake: fatal: something broke at step 30")) << r.err;
  EXPECT_TRUE(contains(r.err, "stopped the other workers")) << r.err;
  const auto j = nlohmann::json::parse(readFile(dir_ / "run" / "summary.json"));
  EXPECT_EQ(j["outcome"], "failed");
}

// A worker that exits 75 (a member whose region leader died) is restarted
// without counting a retry: four times in a row -- one more than the retries
// a worker has -- and the job still succeeds. The same four failures with
// exit 1 use the retries up and stop the job.
TEST_F(LocalProcessTest, ARejoiningWorkerIsRestartedWithoutCountingARetry) {
  std::vector<std::string> args = fakeArgs("london,tokyo");
  // --restart-after comes with a --kill; this one is due after the job ends.
  args.insert(args.end(), {"--kill", "london@60s", "--restart-after", "100ms"});
  const auto count = dir_ / "failures";
  // Events 0.2 s apart: rank 0 is still running when rank 1 fails the
  // fourth time (at its first event each time).
  const auto failingFourTimes = [&](const std::string& mode) -> Env {
    return {{"GEO_FAKE_SLEEP", "0.2"},    {"GEO_FAKE_FAIL_AT", "1"},
            {"GEO_FAKE_FAIL_RANK", "1"},  {"GEO_FAKE_FAIL_MODE", mode},
            {"GEO_FAKE_FAIL_TIMES", "4"}, {"GEO_FAKE_FAIL_COUNT", count.string()}};
  };
  Result r = run(args, failingFourTimes("rejoin"));
  ASSERT_TRUE(r.finished);
  EXPECT_EQ(r.exitCode, 0) << r.out << r.err;
  const std::string log = readFile(dir_ / "run" / "logs" / "launcher.log");
  size_t restarts = 0;
  for (size_t at = log.find("not counted against its retries"); at != std::string::npos;
       at = log.find("not counted against its retries", at + 1)) {
    ++restarts;
  }
  EXPECT_EQ(restarts, 4u) << log;
  expectNoWorkerLeft();

  fs::remove_all(dir_ / "run");
  fs::remove(count);
  r = run(args, failingFourTimes("error"));
  ASSERT_TRUE(r.finished);
  EXPECT_EQ(r.exitCode, 1) << r.out << r.err;
  EXPECT_TRUE(contains(readFile(dir_ / "run" / "logs" / "launcher.log"), "retry 3 of 3"));
  expectNoWorkerLeft();
}

TEST_F(LocalProcessTest, WorkerKilledBySignalOrExitingWithoutEventIsAFailure) {
  Result r = run(
      fakeArgs("london,tokyo"),
      {{"GEO_FAKE_FAIL_RANK", "0"}, {"GEO_FAKE_FAIL_MODE", "signal"}, {"GEO_FAKE_FOREVER", "1"}});
  ASSERT_TRUE(r.finished);
  EXPECT_EQ(r.exitCode, 1);
  EXPECT_TRUE(contains(r.err, "worker 0 (region london, local index 0) failed: killed by SIGKILL"))
      << r.err;
  expectNoWorkerLeft();

  fs::remove_all(dir_ / "run");
  fs::remove(pids_);
  r = run(fakeArgs("london,tokyo"),
          {{"GEO_FAKE_FAIL_RANK", "1"}, {"GEO_FAKE_FAIL_MODE", "exit"}, {"GEO_FAKE_FOREVER", "1"}});
  ASSERT_TRUE(r.finished);
  EXPECT_EQ(r.exitCode, 1);
  EXPECT_TRUE(contains(r.err, "worker 1 (region tokyo, local index 0) failed: exit code 3"))
      << r.err;
  expectNoWorkerLeft();
}

TEST_F(LocalProcessTest, SigintStopsEveryWorkerAndExits130) {
  const pid_t pid =
      start(fakeArgs("london,tokyo", 2), {{"GEO_FAKE_FOREVER", "1"}, {"GEO_FAKE_SLEEP", "0.05"}});
  ASSERT_TRUE(waitForWorkers(4));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ASSERT_EQ(::kill(pid, SIGINT), 0);
  const auto signalled = std::chrono::steady_clock::now();
  const Result r = wait(pid, 30);
  ASSERT_TRUE(r.finished);
  EXPECT_EQ(r.exitCode, 130) << r.out << r.err;
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - signalled).count(),
            4.0);
  EXPECT_TRUE(contains(r.err, "interrupted")) << r.err;
  EXPECT_TRUE(contains(r.out, "summary (interrupted")) << r.out;
  expectNoWorkerLeft();
  const auto j = nlohmann::json::parse(readFile(dir_ / "run" / "summary.json"));
  EXPECT_EQ(j["outcome"], "interrupted");
  EXPECT_GT(j["wanSentBytes"].get<int64_t>(), 0);  // the summary so far
}

TEST_F(LocalProcessTest, WorkerIgnoringSigtermIsKilledAfterTheGracePeriod) {
  const pid_t pid =
      start(fakeArgs("london,tokyo"),
            {{"GEO_FAKE_FOREVER", "1"}, {"GEO_FAKE_SLEEP", "0.05"}, {"GEO_FAKE_IGNORE_TERM", "1"}});
  ASSERT_TRUE(waitForWorkers(2));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  ASSERT_EQ(::kill(pid, SIGTERM), 0);
  const auto signalled = std::chrono::steady_clock::now();
  const Result r = wait(pid, 30);
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - signalled).count();
  ASSERT_TRUE(r.finished);
  EXPECT_EQ(r.exitCode, 130) << r.err;
  EXPECT_GE(took, 4.5);
  EXPECT_LT(took, 9.0);
  expectNoWorkerLeft();
  EXPECT_TRUE(contains(readFile(dir_ / "run" / "logs" / "launcher.log"), "SIGKILL"));
}

TEST_F(LocalProcessTest, ProblemsFoundBeforeStartingSpawnNothing) {
  struct Case {
    std::vector<std::string> extra;
    std::string message;
  };
  const fs::path notEmpty = dir_ / "not-empty";
  fs::create_directories(notEmpty);
  std::ofstream(notEmpty / "file") << "x";
  const fs::path badShebang = dir_ / "bad-worker.sh";
  std::ofstream(badShebang) << "#!/nonexistent/interpreter\n";
  fs::permissions(badShebang, fs::perms::owner_all);
  const std::vector<Case> cases = {
      {{"--bits", "3"}, "--bits: sync.bits: 3 is not allowed (allowed: 2, 4, 8)"},
      {{"--regions", "London"}, "--regions: 'London' is not a valid region name"},
      {{"--regions", "london,paris"}, "--rtt london-paris=<time>"},
      {{"--set", "training.lrr=1"}, "training.lrr: unknown key"},
      {{"--uplink", "fast"}, "--uplink fast: not a rate"},
      {{"--step-time", "20"}, "--step-time: '20' needs a unit: s or ms (e.g. 20s, 1500ms)"},
      {{"--step-time", "fastms"}, "--step-time: 'fastms' is not a duration"},
      {{"--step-time", "0ms"}, "--step-time 0ms: allowed from 1ms to 60s"},
      {{"--out", notEmpty.string()}, "the folder exists and is not empty"},
      {{"--worker-binary", (dir_ / "missing").string()}, "does not exist"},
      // Bounds, checked before anything is allocated for them.
      {{"--workers-per-region", "100000"},
       "--workers-per-region 100000: 4 regions x 100000 workers is not allowed (allowed: at most "
       "256 workers in all"},
      {{"--config", "/dev/zero"},
       "--config: /dev/zero: a worker config of more than 1048576 bytes is not allowed (allowed: "
       "at most 1048576 bytes, 1 MiB)"},
      {{"--threads", "100000"},
       "--threads: training.threads: 100000 is not allowed (allowed: an integer 0..1024)"},
      {{"--timeout-seconds", "1e308"},
       "sync.timeoutSeconds: 1e308 is not allowed (allowed: a number of seconds in [0.001, "
       "1000000])"},
      {{"--set", "worker.worldSize=9223372036854775807"},
       "worker.worldSize: 9223372036854775807 is not allowed (allowed: an integer 1..4096)"},
      // Output files, checked before the run folder is made.
      {{"--csv", (dir_ / "missing" / "p.csv").string()},
       "--csv " + (dir_ / "missing" / "p.csv").string() + ": the folder " +
           (dir_ / "missing").string() + " does not exist"},
      {{"--prometheus-config", dir_.string()},
       "--prometheus-config " + dir_.string() + ": is a folder (allowed: a file path)"},
      {{"--csv", (notEmpty / "file" / "p.csv").string()}, "/file is not a folder"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = {"--steps", "100"};
    if (c.extra[0] != "--worker-binary")
      args.insert(args.end(), {"--worker-binary", GEO_FAKE_WORKER});
    if (c.extra[0] != "--out") args.insert(args.end(), {"--out", (dir_ / "run").string()});
    args.insert(args.end(), c.extra.begin(), c.extra.end());
    const Result r = run(args);
    ASSERT_TRUE(r.finished);
    EXPECT_EQ(r.exitCode, 1) << c.message;
    EXPECT_TRUE(contains(r.err, c.message)) << "expected '" << c.message << "' in: " << r.err;
    EXPECT_FALSE(fs::exists(pids_)) << c.message;
    EXPECT_FALSE(fs::exists(dir_ / "run")) << c.message << ": the run folder was created";
  }

  // An executable that cannot be executed: the launcher reports the rank.
  const Result r = run({"--regions", "london,tokyo", "--worker-binary", badShebang.string(),
                        "--out", (dir_ / "run").string()});
  ASSERT_TRUE(r.finished);
  EXPECT_EQ(r.exitCode, 1);
  EXPECT_TRUE(contains(r.err, "worker 0 (region london, local index 0) failed: could not start"))
      << r.err;
  EXPECT_TRUE(contains(r.err, "No such file or directory")) << r.err;
}

// An output that cannot be written leaves no run folder behind, whether the
// check up front finds it or writing it fails later (/dev/full passes every
// check and fails on the write): the same command with the same --out then
// runs.
TEST_F(LocalProcessTest, UnwritableOutputsLeaveNothingBehindAndARerunWorks) {
  const fs::path folder = dir_ / "run";
  std::vector<std::string> args = fakeArgs("london,tokyo");
  std::vector<std::string> bad = args;
  bad.insert(bad.end(), {"--csv", (dir_ / "no-such-folder" / "p.csv").string()});
  Result r = run(bad);
  ASSERT_TRUE(r.finished);
  EXPECT_EQ(r.exitCode, 1) << r.out << r.err;
  EXPECT_TRUE(contains(r.err, "--csv " + (dir_ / "no-such-folder" / "p.csv").string() +
                                  ": the folder " + (dir_ / "no-such-folder").string() +
                                  " does not exist"))
      << r.err;
  EXPECT_FALSE(fs::exists(folder));
  EXPECT_FALSE(fs::exists(pids_));

  if (fs::exists("/dev/full")) {
    bad = args;
    bad.insert(bad.end(), {"--prometheus-config", "/dev/full", "--csv", (dir_ / "p.csv").string()});
    r = run(bad);
    ASSERT_TRUE(r.finished);
    EXPECT_EQ(r.exitCode, 1) << r.out << r.err;
    EXPECT_TRUE(contains(r.err, "cannot write /dev/full")) << r.err;
    EXPECT_FALSE(fs::exists(folder)) << "the half-written run folder was left behind";
    EXPECT_FALSE(fs::exists(dir_ / "p.csv")) << "the CSV the run created was left behind";
    EXPECT_FALSE(fs::exists(pids_));

    // --out that existed (empty) stays, empty.
    fs::create_directory(folder);
    r = run(bad);
    EXPECT_EQ(r.exitCode, 1) << r.out << r.err;
    ASSERT_TRUE(fs::is_directory(folder));
    EXPECT_TRUE(fs::is_empty(folder));
  }

  r = run(args);
  ASSERT_TRUE(r.finished);
  EXPECT_EQ(r.exitCode, 0) << r.out << r.err;
  EXPECT_TRUE(fs::exists(folder / "summary.json"));
  expectNoWorkerLeft();
}

TEST_F(LocalProcessTest, PlotWithoutGnuplotFailsBeforeSpawning) {
  std::vector<std::string> args = fakeArgs("london,tokyo");
  args.insert(args.end(), {"--plot", (dir_ / "acc.png").string()});
  const Result r = run(args, {{"PATH", (dir_ / "empty-path").string()}});
  ASSERT_TRUE(r.finished);
  EXPECT_EQ(r.exitCode, 1);
  EXPECT_TRUE(contains(r.err, "gnuplot-nox")) << r.err;
  EXPECT_FALSE(fs::exists(pids_));
  EXPECT_FALSE(fs::exists(dir_ / "run"));
}

TEST_F(LocalProcessTest, PlotIsDrawnWithGnuplot) {
  if (std::system("command -v gnuplot >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "gnuplot is not installed (Debian package gnuplot-nox)";
  }
  std::vector<std::string> args = fakeArgs("london,tokyo");
  const fs::path png = dir_ / "acc.png";
  args.insert(args.end(), {"--plot", png.string()});
  const Result r = run(args);
  ASSERT_TRUE(r.finished);
  ASSERT_EQ(r.exitCode, 0) << r.err;
  const std::string bytes = readFile(png);
  ASSERT_GT(bytes.size(), 8u);
  EXPECT_EQ(bytes.substr(1, 3), "PNG");
  EXPECT_TRUE(contains(r.out, "plot           " + png.string())) << r.out;
  EXPECT_TRUE(contains(readFile(dir_ / "run" / "accuracy.gp"), "title \"tokyo\""));
}

TEST_F(LocalProcessTest, HelpDocumentsEveryFlagWithItsDefault) {
  const Result r = run({"--help"});
  ASSERT_TRUE(r.finished);
  EXPECT_EQ(r.exitCode, 0);
  for (const char* flag : {"--config",
                           "--set",
                           "--regions",
                           "--workers-per-region",
                           "--algorithm",
                           "--period",
                           "--delay",
                           "--swarm-h",
                           "--codec",
                           "--bits",
                           "--hierarchical",
                           "--steps",
                           "--model",
                           "--batch-size",
                           "--lr",
                           "--eval-interval",
                           "--preset",
                           "--rtt",
                           "--uplink",
                           "--out",
                           "--csv",
                           "--plot",
                           "--threads",
                           "--worker-binary",
                           "--timeout-seconds"}) {
    size_t at = r.out.find(std::string(" ") + flag + " ");
    if (at == std::string::npos) at = r.out.find(std::string(",") + flag + " ");  // -o,--out
    ASSERT_NE(at, std::string::npos) << flag << " missing from:\n" << r.out;
    // The option's entry runs to the next option (a line starting "  -").
    const std::string entry = r.out.substr(at, r.out.find("\n  -", at) - at);
    EXPECT_TRUE(contains(entry, "default") || contains(entry, "=")) << flag << ": " << entry;
  }
  EXPECT_TRUE(contains(r.out, "london,tokyo,oregon,ohio"));
  EXPECT_TRUE(contains(r.out, "Exit status"));
}

}  // namespace
