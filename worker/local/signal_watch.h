#pragma once
// SignalWatch: SIGINT, SIGTERM and SIGCHLD as readable events on a
// descriptor (signalfd), so the launcher's poll(2) loop sees a Ctrl-C or a
// worker's exit without async signal handlers.
//
// create() blocks the three signals in the calling thread and remembers the
// previous mask. A SIGINT that the process inherited as ignored (a
// background job of a non-interactive shell) stays ignored: it is not
// watched, so a Ctrl-C meant for the foreground job does not stop this one.
// Children must start with the previous mask (SpawnSpec::childSignalMask).
// The destructor drains what is pending and restores the mask. Use it from
// the thread that runs the loop, in a process whose other threads block
// these signals too (geotrain's main thread is the only one that runs when
// it starts). Move-only; errors are Statuses naming the call.

#include <csignal>
#include <vector>

#include "common/status.h"

namespace geo::local {

class SignalWatch {
 public:
  static StatusOr<SignalWatch> create();

  SignalWatch(SignalWatch&& other) noexcept;
  SignalWatch& operator=(SignalWatch&&) = delete;
  SignalWatch(const SignalWatch&) = delete;
  SignalWatch& operator=(const SignalWatch&) = delete;
  ~SignalWatch();

  int fd() const { return fd_; }
  const sigset_t& previousMask() const { return previousMask_; }

  // The signals that arrived since the last call (non-blocking; may be empty).
  std::vector<int> take();

 private:
  SignalWatch() = default;

  int fd_ = -1;
  sigset_t previousMask_{};
};

}  // namespace geo::local
