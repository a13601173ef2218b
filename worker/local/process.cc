#include "worker/local/process.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>

#include <cerrno>
#include <cstring>

namespace geo::local {

namespace {

// Tells the parent why the child could not exec, and ends the child.
[[noreturn]] void reportAndExit(int errorPipe, int error) {
  [[maybe_unused]] const ssize_t n = ::write(errorPipe, &error, sizeof error);
  ::_exit(127);
}

// Closes every descriptor above stderr except `keep`.
void closeOthers(int keep) {
  const bool ok = (keep <= STDERR_FILENO + 1 ||
                   ::close_range(STDERR_FILENO + 1, static_cast<unsigned>(keep) - 1, 0) == 0) &&
                  ::close_range(static_cast<unsigned>(keep) + 1, ~0U, 0) == 0;
  if (ok) return;
  const long max = ::sysconf(_SC_OPEN_MAX);  // kernels without close_range (< 5.9)
  for (int fd = STDERR_FILENO + 1; fd < (max > 0 ? max : 65536); ++fd) {
    if (fd != keep) ::close(fd);
  }
}

// Only async-signal-safe calls between fork and exec: the launcher may run
// other threads (spdlog), whose locks the child must not touch.
[[noreturn]] void childExec(const SpawnSpec& spec, char* const* argv, int stdoutWrite, int stderrFd,
                            int devNull, int errorPipe, pid_t parent) {
  // If the launcher runs with 0, 1 or 2 closed, a descriptor below may be
  // one of them; move it up first so the dup2 calls below cannot clobber it.
  auto lift = [](int fd) { return fd > STDERR_FILENO ? fd : ::fcntl(fd, F_DUPFD_CLOEXEC, 3); };
  errorPipe = lift(errorPipe);
  stdoutWrite = lift(stdoutWrite);
  stderrFd = lift(stderrFd);
  devNull = lift(devNull);
  if (::setpgid(0, 0) != 0) reportAndExit(errorPipe, errno);
  if (::prctl(PR_SET_PDEATHSIG, SIGTERM) != 0) reportAndExit(errorPipe, errno);
  if (::getppid() != parent) ::_exit(127);  // the launcher died before prctl
  if (::dup2(devNull, STDIN_FILENO) < 0 || ::dup2(stdoutWrite, STDOUT_FILENO) < 0 ||
      ::dup2(stderrFd, STDERR_FILENO) < 0) {
    reportAndExit(errorPipe, errno);
  }
  if (spec.netnsFd >= 0 && ::setns(spec.netnsFd, CLONE_NEWNET) != 0)
    reportAndExit(errorPipe, errno);
  closeOthers(errorPipe);  // exec closes the error pipe itself (close-on-exec)
  struct sigaction defaults {};
  defaults.sa_handler = SIG_DFL;
  ::sigaction(SIGINT, &defaults, nullptr);
  ::sigaction(SIGTERM, &defaults, nullptr);
  ::sigaction(SIGPIPE, &defaults, nullptr);
  ::sigaction(SIGCHLD, &defaults, nullptr);
  sigset_t empty;
  sigemptyset(&empty);
  ::sigprocmask(SIG_SETMASK, spec.childSignalMask != nullptr ? spec.childSignalMask : &empty,
                nullptr);
  ::execv(argv[0], argv);
  reportAndExit(errorPipe, errno);
}

}  // namespace

std::string signalName(int signal) {
  if (const char* abbrev = ::sigabbrev_np(signal)) return fmt::format("SIG{}", abbrev);
  return fmt::format("signal {}", signal);
}

std::string ExitStatus::describe() const {
  if (signaled) return fmt::format("killed by {}", signalName(signal));
  if (code < 0) return "exit status unknown";
  return fmt::format("exit code {}", code);
}

StatusOr<std::unique_ptr<ChildProcess>> ChildProcess::spawn(const SpawnSpec& spec) {
  auto fail = [&](std::string_view call) {
    return unavailable(
        fmt::format("starting {}: {}: {}", spec.program, call, std::strerror(errno)));
  };
  // Everything the child needs is allocated before fork.
  std::vector<std::string> args;
  args.push_back(spec.program);
  args.insert(args.end(), spec.args.begin(), spec.args.end());
  std::vector<char*> argv;
  argv.reserve(args.size() + 1);
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);

  const int stderrFd =
      ::open(spec.stderrPath.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (stderrFd < 0) {
    return unavailable(fmt::format("starting {}: cannot open the log {}: {}", spec.program,
                                   spec.stderrPath.string(), std::strerror(errno)));
  }
  const int devNull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  int out[2] = {-1, -1};
  int err[2] = {-1, -1};
  auto closeAll = [&] {
    for (const int fd : {stderrFd, devNull, out[0], out[1], err[0], err[1]}) {
      if (fd >= 0) ::close(fd);
    }
  };
  if (devNull < 0) {
    Status s = fail("open(/dev/null)");
    closeAll();
    return s;
  }
  if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0) {
    Status s = fail("pipe2()");
    closeAll();
    return s;
  }
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    Status s = fail("fork()");
    closeAll();
    return s;
  }
  if (pid == 0) childExec(spec, argv.data(), out[1], stderrFd, devNull, err[1], parent);

  // Parent. Both sides call setpgid so the group exists whichever runs first.
  ::setpgid(pid, pid);
  ::close(out[1]);
  out[1] = -1;
  ::close(err[1]);
  err[1] = -1;
  ::fcntl(out[0], F_SETFL, ::fcntl(out[0], F_GETFL) | O_NONBLOCK);
  auto child = std::unique_ptr<ChildProcess>(new ChildProcess(pid, out[0]));
  out[0] = -1;

  // EOF: exec succeeded (the pipe was closed on exec). An int: its errno.
  int execError = 0;
  ssize_t n = 0;
  do {
    n = ::read(err[0], &execError, sizeof execError);
  } while (n < 0 && errno == EINTR);
  closeAll();
  if (n == sizeof execError) {
    child->waitForExit();
    return unavailable(
        fmt::format("cannot execute {}: {}", spec.program, std::strerror(execError)));
  }
  return child;
}

ChildProcess::~ChildProcess() {
  if (running()) {
    signalGroup(SIGKILL);
    waitForExit();
  }
  closeStdout();
}

void ChildProcess::closeStdout() {
  if (stdoutFd_ >= 0) ::close(stdoutFd_);
  stdoutFd_ = -1;
}

bool ChildProcess::readLines(std::vector<std::string>& lines) {
  if (stdoutFd_ < 0) return false;
  char buffer[16384];
  while (true) {
    const ssize_t n = ::read(stdoutFd_, buffer, sizeof buffer);
    if (n > 0) {
      partial_.append(buffer, static_cast<size_t>(n));
      size_t start = 0;
      for (size_t nl = partial_.find('\n'); nl != std::string::npos;
           nl = partial_.find('\n', start)) {
        lines.emplace_back(partial_, start, nl - start);
        start = nl + 1;
      }
      partial_.erase(0, start);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
    // EOF or a read error: either way nothing more will come.
    if (!partial_.empty()) lines.push_back(std::move(partial_));
    partial_.clear();
    closeStdout();
    return false;
  }
}

namespace {

ExitStatus fromWaitStatus(int status) {
  ExitStatus s;
  if (WIFSIGNALED(status)) {
    s.signaled = true;
    s.signal = WTERMSIG(status);
  } else {
    s.code = WEXITSTATUS(status);
  }
  return s;
}

ExitStatus unknownExit() {
  ExitStatus s;
  s.code = -1;
  return s;
}

}  // namespace

bool ChildProcess::tryReap() {
  if (exit_) return true;
  int status = 0;
  pid_t r = 0;
  do {
    r = ::waitpid(pid_, &status, WNOHANG);
  } while (r < 0 && errno == EINTR);
  if (r == pid_) {
    exit_ = fromWaitStatus(status);
    return true;
  }
  if (r < 0) {  // ECHILD: someone else reaped it; nothing to wait for
    exit_ = unknownExit();
    return true;
  }
  return false;
}

ExitStatus ChildProcess::waitForExit() {
  if (exit_) return *exit_;
  int status = 0;
  pid_t r = 0;
  do {
    r = ::waitpid(pid_, &status, 0);
  } while (r < 0 && errno == EINTR);
  exit_ = r == pid_ ? fromWaitStatus(status) : unknownExit();
  return *exit_;
}

void ChildProcess::queueSignal(int signal, int value) {
  if (exit_) return;
  sigval v{};
  v.sival_int = value;
  ::sigqueue(pid_, signal, v);
}

void ChildProcess::signalGroup(int signal) {
  if (exit_) return;
  if (::kill(-pid_, signal) != 0) ::kill(pid_, signal);  // group not formed yet
}

}  // namespace geo::local
