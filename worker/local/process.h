#pragma once
// ChildProcess: one worker process of `geotrain local`, started with
// fork/execv.
//
// The child gets stdin from /dev/null, stdout into a pipe that the parent
// reads (non-blocking, so one poll(2) loop serves every child), and stderr
// appended to a log file. In the child, before exec: it becomes the leader
// of its own process group (so signalGroup() also reaches anything it
// starts, and a Ctrl-C on the terminal reaches only the launcher, which
// forwards it), asks for SIGTERM when the launcher dies
// (PR_SET_PDEATHSIG), gets the signal mask and the SIGINT/SIGTERM/SIGPIPE
// dispositions of a fresh process back, joins SpawnSpec::netnsFd's network
// namespace when one is given, and closes every other descriptor.
// A failed exec is reported through a close-on-exec pipe, so spawn() returns
// its errno as a Status instead of a child that exits 127.
//
// Ownership: the object owns the pipe and the process. Its destructor, if
// the process was not reaped, kills the group (SIGKILL) and reaps it, so no
// path leaves an orphan or a zombie. Not thread-safe; use from one thread.
// Errors are Statuses naming the program and the failed call.

#include <sys/types.h>

#include <csignal>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace geo::local {

// How a process ended.
struct ExitStatus {
  bool signaled = false;
  int code = 0;    // exit code when !signaled; -1: unknown (reaped elsewhere)
  int signal = 0;  // signal number when signaled

  bool success() const { return !signaled && code == 0; }
  // "exit code 1", "signal SIGKILL"
  std::string describe() const;
};

// "SIGTERM"; "signal 77" for numbers without a name.
std::string signalName(int signal);

struct SpawnSpec {
  std::string program;               // path of the executable (no PATH lookup)
  std::vector<std::string> args;     // argv[1..]
  std::filesystem::path stderrPath;  // appended to, created 0644 if missing
  // The signal mask the child starts with (the caller's original mask when
  // it blocks signals for a signalfd); nullptr: empty mask.
  const sigset_t* childSignalMask = nullptr;
  // A network namespace (a descriptor of /proc/.../ns/net) the child joins
  // before exec; -1: the launcher's own. Joining needs CAP_SYS_ADMIN.
  int netnsFd = -1;
};

class ChildProcess {
 public:
  static StatusOr<std::unique_ptr<ChildProcess>> spawn(const SpawnSpec& spec);

  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;
  ~ChildProcess();

  pid_t pid() const { return pid_; }

  // Read end of the stdout pipe for poll(2); -1 once EOF was seen.
  int stdoutFd() const { return stdoutFd_; }

  // Reads everything available without blocking and appends each complete
  // line (without '\n') to `lines`. At EOF a last unterminated line is
  // appended too and the pipe is closed. Returns false once the pipe is
  // closed (EOF or a read error).
  bool readLines(std::vector<std::string>& lines);

  // waitpid(WNOHANG): true once the process was reaped (then exitStatus()).
  bool tryReap();
  // Blocks until the process exits.
  ExitStatus waitForExit();
  const std::optional<ExitStatus>& exitStatus() const { return exit_; }
  bool running() const { return !exit_.has_value(); }

  // kill(-pid, signal) while the process is not reaped; no-op afterwards
  // (its pid may be reused then).
  void signalGroup(int signal);
  // Queues `signal` with `value` for the process itself (sigqueue; a value
  // cannot go to a group). Nothing when it has exited.
  void queueSignal(int signal, int value);

 private:
  ChildProcess(pid_t pid, int stdoutFd) : pid_(pid), stdoutFd_(stdoutFd) {}
  void closeStdout();

  pid_t pid_;
  int stdoutFd_;
  std::string partial_;  // bytes after the last '\n'
  std::optional<ExitStatus> exit_;
};

}  // namespace geo::local
