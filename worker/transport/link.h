#pragma once
// User-space WAN emulation: a per-peer one-way delay and a token-bucket
// bandwidth limit, applied by the sender before a frame is handed to ZeroMQ
// (no root, no tc/netem). Used by `geotrain local` and the tests to give each
// pair of emulated regions its own link.

#include <chrono>
#include <cstdint>
#include <string_view>

#include "common/status.h"

namespace geo::transport {

// The real clock, named apart from geo::Clock (the injectable one, which the
// synchronizers and the in-memory network run on): the ZeroMQ transport, its
// link shapers and the WAN emulators move real bytes and wait in
// zmq_poll(), so they run on real time.
using SteadyClock = std::chrono::steady_clock;

struct LinkProfile {
  std::chrono::microseconds oneWayDelay{0};
  double bytesPerSecond = 0;  // 0: unlimited
  uint64_t burstBytes = 64 * 1024;

  bool shaped() const { return oneWayDelay.count() > 0 || bytesPerSecond > 0; }
};

// Parses "delay=50ms,rate=20mbit,burst=64kb" (any subset, any order; empty:
// no emulation). Units: delay us|ms|s; rate bit|kbit|mbit|gbit (per second,
// powers of 1000); burst b|kb|mb (powers of 1024). Errors name the key or
// value and the allowed forms.
StatusOr<LinkProfile> parseLinkProfile(std::string_view spec);

// FIFO link model: a message of `bytes` handed over at `now` leaves the
// sender once the bucket has let through everything before it (serialization
// at bytesPerSecond, with up to burstBytes sent back to back after idle time)
// and arrives oneWayDelay later. schedule() returns that arrival time, at
// which the sender hands it to the socket. Not thread-safe (one per peer,
// used under that peer's lock).
class LinkShaper {
 public:
  explicit LinkShaper(LinkProfile profile) : profile_(profile) {}

  SteadyClock::time_point schedule(uint64_t bytes, SteadyClock::time_point now);
  const LinkProfile& profile() const { return profile_; }
  // A new bandwidth (0: unlimited) for what is scheduled from now on; what
  // was scheduled keeps its times.
  void setRate(double bytesPerSecond) { profile_.bytesPerSecond = bytesPerSecond; }

 private:
  LinkProfile profile_;
  SteadyClock::time_point nextFree_{};  // when the link finishes sending what it has
};

}  // namespace geo::transport
