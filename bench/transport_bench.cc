// Loopback transport benchmark: throughput of 64 MiB messages and round-trip
// latency of 64-byte messages, with CURVE encryption and without, in the same
// run (ratios travel between machines; absolute numbers do not).
//
//   geo_transport_bench [--messages 8] [--size-mib 64] [--pings 2000]
//
// Target (issue "Secure transport"): encrypted >= 50% of plaintext throughput.
// Plaintext uses the test-only build of the transport (product builds refuse
// encrypt = false).

#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "tests/worker/transport/transport_fixture.h"
#include "worker/transport/zmq_transport.h"

using namespace geo::transport;
using Seconds = std::chrono::duration<double>;

namespace {

struct Pair {
  std::unique_ptr<Transport> a, b;
};

Pair makePair(bool encrypt) {
  testing::World w(2);
  auto ca = w.config(0);
  auto cb = w.config(1);
  ca.encrypt = cb.encrypt = encrypt;
  ca.pingInterval = cb.pingInterval = std::chrono::milliseconds(0);
  auto a = makeZmqTransport(ca);
  auto b = makeZmqTransport(cb);
  if (!a.ok() || !b.ok()) {
    std::fprintf(stderr, "setup failed: %s %s\n", a.status().toString().c_str(),
                 b.status().toString().c_str());
    std::exit(1);
  }
  return {std::move(*a), std::move(*b)};
}

// GB/s of payload for `messages` messages of `bytes`, best of 3.
double throughput(Pair& p, int messages, size_t bytes, uint64_t& round) {
  const Payload payload(testing::pattern(bytes, 1));  // shared, never copied
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    const uint64_t first = round;
    for (int i = 0; i < messages; ++i) {
      auto st =
          p.a->send(1, MessageKind::kUpdate, {.round = round++}, payload, std::chrono::seconds(60));
      if (!st.ok()) std::fprintf(stderr, "%s\n", st.toString().c_str());
    }
    for (int i = 0; i < messages; ++i) {
      auto m = p.b->receive(MessageKind::kUpdate, first + i, 0, std::chrono::seconds(60));
      if (!m.ok()) std::fprintf(stderr, "%s\n", m.status().toString().c_str());
    }
    const double s = Seconds(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, static_cast<double>(messages) * bytes / s / 1e9);
  }
  return best;
}

// Round-trip times of `pings` 64-byte echoes, sorted.
std::vector<double> roundTrips(Pair& p, int pings, uint64_t& round) {
  std::vector<double> rtt;
  const auto payload = testing::pattern(64, 2);
  for (int i = 0; i < pings; ++i) {
    const uint64_t r = round++;
    const auto t0 = std::chrono::steady_clock::now();
    (void)p.a->send(1, MessageKind::kUpdate, {.round = r}, Payload(payload),
                    std::chrono::seconds(5));
    auto m = p.b->receive(MessageKind::kUpdate, r, 0, std::chrono::seconds(5));
    if (!m.ok()) continue;
    (void)p.b->send(0, MessageKind::kUpdate, {.round = r}, Payload::copyOf(m->payload.bytes()),
                    std::chrono::seconds(5));
    if (!p.a->receive(MessageKind::kUpdate, r, 1, std::chrono::seconds(5)).ok()) continue;
    rtt.push_back(Seconds(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(rtt.begin(), rtt.end());
  return rtt;
}

double percentile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  return sorted[std::min(sorted.size() - 1, static_cast<size_t>(q * sorted.size()))];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("geotrain transport benchmark: loopback throughput and latency, CURVE vs plaintext");
  int messages = 8;
  int sizeMiB = 64;
  int pings = 2000;
  app.add_option("--messages", messages, "messages per throughput repetition")
      ->check(CLI::PositiveNumber);
  app.add_option("--size-mib", sizeMiB, "message size in MiB")->check(CLI::PositiveNumber);
  app.add_option("--pings", pings, "round trips for the latency figures")
      ->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);

  std::printf("%-10s %14s %12s %12s\n", "mode", "GB/s (64 MiB)", "RTT p50 us", "RTT p99 us");
  double gbps[2] = {0, 0};
  for (bool encrypt : {false, true}) {
    Pair p = makePair(encrypt);
    uint64_t round = 0;
    (void)roundTrips(p, 10, round);  // connect and warm up
    const double g = throughput(p, messages, static_cast<size_t>(sizeMiB) << 20, round);
    const auto rtt = roundTrips(p, pings, round);
    gbps[encrypt] = g;
    std::printf("%-10s %14.3f %12.1f %12.1f\n", encrypt ? "curve" : "plaintext", g,
                percentile(rtt, 0.5) * 1e6, percentile(rtt, 0.99) * 1e6);
  }
  std::printf("encrypted / plaintext throughput: %.2fx\n", gbps[1] / gbps[0]);
  return 0;
}
