#include "worker/app/key_watcher.h"

#include <fmt/format.h>

#include "common/logging.h"
#include "worker/app/transport_setup.h"

namespace geo::app {

KeyWatcher::KeyWatcher(const WorkerConfig& config, uint32_t rank, transport::Transport* transport,
                       std::chrono::milliseconds interval)
    : config_(config), rank_(rank), transport_(transport), interval_(interval) {
  // What transportConfig() gave the transport: each rank's first key.
  if (auto keys = loadKeySet(config_, rank_); keys.ok()) {
    inForce_.secretKey = keys->secretKey;
    for (const auto& list : keys->publicKeys) inForce_.publicKeys.push_back({list.front()});
  }
  poll();
  thread_ = std::thread([this] { run(); });
}

KeyWatcher::~KeyWatcher() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  stop_.notify_all();
  if (thread_.joinable()) thread_.join();
}

uint64_t KeyWatcher::applied() const {
  std::lock_guard lock(mu_);
  return applied_;
}

void KeyWatcher::run() {
  std::unique_lock lock(mu_);
  while (!stop_.wait_for(lock, interval_, [this] { return stopping_; })) {
    lock.unlock();
    poll();
    lock.lock();
  }
}

void KeyWatcher::poll() {
  auto keys = loadKeySet(config_, rank_);
  Status status = keys.ok() ? Status() : keys.status();
  if (keys.ok()) {
    if (keys->secretKey == inForce_.secretKey && keys->publicKeys == inForce_.publicKeys) {
      lastProblem_.clear();
      return;
    }
    status = transport_->updateKeys(*keys);
    if (status.ok()) {
      size_t others = 0;
      for (const auto& list : keys->publicKeys) others += list.size() - 1;
      logger()->info(
          "keys: the key files in {} changed; in force now{}{}", config_.transport.keyDir,
          keys->secretKey != inForce_.secretKey ? ": this worker's new keypair" : "",
          others > 0
              ? fmt::format(" (with {} other key(s) of a rotation in progress admitted)", others)
              : " (no other keys admitted: a rotation is over or none runs)");
      inForce_ = std::move(*keys);
      lastProblem_.clear();
      std::lock_guard lock(mu_);
      ++applied_;
      return;
    }
  }
  if (status.message() != lastProblem_) {
    lastProblem_ = status.message();
    logger()->warn("keys: the key files in {} are not a usable set; the keys in force stay: {}",
                   config_.transport.keyDir, status.message());
  }
}

}  // namespace geo::app
