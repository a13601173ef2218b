#pragma once
// Key rotation without a restart (docs/security.md, "Rotating keys"): a
// thread that re-reads the worker's CURVE key files every few seconds and
// hands each new set to the transport (Transport::updateKeys). In
// Kubernetes the files are a Secret and a ConfigMap mounted as a volume,
// which the kubelet replaces when the controller rotates the job's keys.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>

#include "common/worker_config.h"
#include "worker/transport/transport.h"

namespace geo::app {

class KeyWatcher {
 public:
  // Reads the keys at once (a worker started in the middle of a rotation
  // admits the other keys from the start), then every `interval`. A set
  // that does not load (a file half-written by hand, a secret key that is
  // none of its public keys') is logged once and skipped: the keys in force
  // stay until the files agree again. `transport` must outlive the watcher.
  KeyWatcher(const WorkerConfig& config, uint32_t rank, transport::Transport* transport,
             std::chrono::milliseconds interval = std::chrono::seconds(2));
  ~KeyWatcher();  // stops the thread
  KeyWatcher(const KeyWatcher&) = delete;
  KeyWatcher& operator=(const KeyWatcher&) = delete;

  // How many sets were handed to the transport and taken (for tests).
  uint64_t applied() const;

 private:
  void poll();
  void run();

  const WorkerConfig config_;
  const uint32_t rank_;
  transport::Transport* transport_;
  const std::chrono::milliseconds interval_;
  transport::KeySet inForce_;  // what the transport holds (the thread's)
  std::string lastProblem_;    // logged once until another comes
  mutable std::mutex mu_;
  std::condition_variable stop_;
  bool stopping_ = false;
  uint64_t applied_ = 0;
  std::thread thread_;
};

}  // namespace geo::app
