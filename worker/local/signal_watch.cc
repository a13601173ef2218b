#include "worker/local/signal_watch.h"

#include <sys/signalfd.h>
#include <unistd.h>

#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <utility>

namespace geo::local {

StatusOr<SignalWatch> SignalWatch::create() {
  sigset_t watched;
  sigemptyset(&watched);
  struct sigaction interrupt {};
  if (::sigaction(SIGINT, nullptr, &interrupt) != 0 || interrupt.sa_handler != SIG_IGN) {
    sigaddset(&watched, SIGINT);
  }
  sigaddset(&watched, SIGTERM);
  sigaddset(&watched, SIGCHLD);
  SignalWatch watch;
  if (const int rc = ::pthread_sigmask(SIG_BLOCK, &watched, &watch.previousMask_); rc != 0) {
    return unavailable(fmt::format("pthread_sigmask(): {}", std::strerror(rc)));
  }
  watch.fd_ = ::signalfd(-1, &watched, SFD_NONBLOCK | SFD_CLOEXEC);
  if (watch.fd_ < 0) {
    const int error = errno;
    ::pthread_sigmask(SIG_SETMASK, &watch.previousMask_, nullptr);
    return unavailable(fmt::format("signalfd(): {}", std::strerror(error)));
  }
  return watch;
}

SignalWatch::SignalWatch(SignalWatch&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), previousMask_(other.previousMask_) {}

SignalWatch::~SignalWatch() {
  if (fd_ < 0) return;
  take();  // pending SIGCHLDs (and a late SIGINT) must not fire on unblock
  ::close(fd_);
  ::pthread_sigmask(SIG_SETMASK, &previousMask_, nullptr);
}

std::vector<int> SignalWatch::take() {
  std::vector<int> signals;
  signalfd_siginfo info{};
  while (true) {
    const ssize_t n = ::read(fd_, &info, sizeof info);
    if (n == static_cast<ssize_t>(sizeof info)) {
      signals.push_back(static_cast<int>(info.ssi_signo));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    return signals;
  }
}

}  // namespace geo::local
