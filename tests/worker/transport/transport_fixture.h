#pragma once
// Helpers for tests over real transports (tests/worker/transport and the
// synchronizer tests in tests/worker/sync): free loopback ports, a keyed world
// of N ranks, and payload patterns.

#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/keys/keys.h"
#include "common/ports.h"
#include "worker/transport/frame.h"
#include "worker/transport/zmq_transport.h"

namespace geo::transport::testing {

// A TCP port on 127.0.0.1 that was free a moment ago, outside the kernel's
// ephemeral range so that no outgoing connection can take it before the
// transport binds it (see common/ports.h).
inline int freePort() {
  return geo::freeLoopbackPort();
}

inline std::string tcp(int port) {
  return "tcp://127.0.0.1:" + std::to_string(port);
}

// A header frame's bytes, as a peer's transport writes them.
inline std::vector<std::byte> headerBytes(const FrameHeader& h) {
  std::vector<std::byte> out(kFrameHeaderBytes);
  encodeFrameHeader(h, std::span<std::byte, kFrameHeaderBytes>(out.data(), kFrameHeaderBytes));
  return out;
}

// The header of a whole raw update of `payloadBytes` from `sender` in job
// "test-job" (World's).
inline FrameHeader validHeader(uint32_t sender, uint64_t round, uint64_t payloadBytes) {
  FrameHeader h;
  h.kind = MessageKind::kUpdate;
  h.jobHash = jobIdHash("test-job");
  h.round = round;
  h.sender = sender;
  h.codec = CodecId::kRaw;
  h.elementCount = payloadBytes;
  h.payloadBytes = payloadBytes;
  return h;
}

// Configs for a world of n ranks on loopback, each with its own keypair.
struct World {
  std::vector<keys::CurveKeyPair> keys;
  std::vector<std::string> endpoints;

  explicit World(size_t n) {
    for (size_t r = 0; r < n; ++r) {
      keys.push_back(keys::generateKeyPair());
      endpoints.push_back(tcp(freePort()));
    }
  }

  TransportConfig config(uint32_t rank) const {
    TransportConfig c;
    c.jobId = "test-job";
    c.rank = rank;
    c.endpoints = endpoints;
    c.secretKey = keys[rank].secretKey;
    for (const auto& k : keys) c.publicKeys.push_back(k.publicKey);
    // Tests use peer time-outs of 0.5-1 s: pings every 200 ms keep a live
    // peer heard within them even while no data flows (a region leader
    // waiting for another region sends its members nothing but pings; with
    // the default 1 s interval a 1 s peer time-out suspected it).
    c.pingInterval = std::chrono::milliseconds(200);
    return c;
  }
};

inline std::vector<std::byte> pattern(size_t size, uint32_t seed) {
  std::vector<std::byte> v(size);
  uint32_t x = seed * 2654435761u + 1;
  for (auto& b : v) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    b = static_cast<std::byte>(x);
  }
  return v;
}

// Whether `a` holds exactly the bytes of `b`.
inline bool sameBytes(std::span<const std::byte> a, const std::vector<std::byte>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size()) == 0);
}

}  // namespace geo::transport::testing
