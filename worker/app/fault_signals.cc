#include "worker/app/fault_signals.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <thread>

namespace geo::app {
namespace {

// What a fault signal said, as the handler passes it to the watching thread.
struct FaultSignal {
  int signal = 0;
  int value = -1;  // SIGRTMIN's queued value (kbit/s), else -1
};

int faultPipe[2] = {-1, -1};  // [0]: the watching thread reads; [1]: handlers write

// Async-signal-safe: one write of a few bytes (atomic below PIPE_BUF; the
// write end does not block, so a full pipe drops the signal rather than
// stall the thread it interrupted).
void onFaultSignal(int signal, siginfo_t* info, void* /*context*/) {
  const int savedErrno = errno;
  FaultSignal f;
  f.signal = signal;
  if (signal == SIGRTMIN && info != nullptr && info->si_code == SI_QUEUE) {
    f.value = info->si_value.sival_int;
  }
  [[maybe_unused]] const ssize_t n = ::write(faultPipe[1], &f, sizeof f);
  errno = savedErrno;
}

// SIGUSR1 / SIGUSR2: a partition's start and end; SIGRTMIN: a new uplink
// rate. (SIGRTMIN is a function call in glibc, hence no constant.)
std::array<int, 3> faultSignalNumbers() {
  return {SIGUSR1, SIGUSR2, SIGRTMIN};
}

sigset_t faultSignals() {
  sigset_t set;
  sigemptyset(&set);
  for (const int signal : faultSignalNumbers()) sigaddset(&set, signal);
  return set;
}

}  // namespace

void prepareFaultSignals() {
  if (faultPipe[0] >= 0 || ::pipe2(faultPipe, O_CLOEXEC) != 0) return;
  ::fcntl(faultPipe[1], F_SETFL, ::fcntl(faultPipe[1], F_GETFL) | O_NONBLOCK);
  struct sigaction action {};
  action.sa_sigaction = onFaultSignal;
  action.sa_flags = SA_SIGINFO | SA_RESTART;
  sigemptyset(&action.sa_mask);
  for (const int signal : faultSignalNumbers()) sigaction(signal, &action, nullptr);
  const sigset_t set = faultSignals();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

void watchFaultSignals(transport::Transport* transport) {
  if (faultPipe[0] < 0) return;
  std::thread([transport] {
    const sigset_t set = faultSignals();
    pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
    while (true) {
      FaultSignal f;
      const ssize_t n = ::read(faultPipe[0], &f, sizeof f);
      if (n < 0 && errno == EINTR) continue;
      if (n != static_cast<ssize_t>(sizeof f)) return;
      if (f.signal == SIGRTMIN) {
        if (f.value >= 0) transport->setUplinkRate(static_cast<double>(f.value) * 1000 / 8);
        continue;
      }
      transport->setPartitioned(f.signal == SIGUSR1);
    }
  }).detach();
}

}  // namespace geo::app
