// Long fat pipe benchmark: how fast one large payload crosses a long, fast
// WAN link between two workers' transports, on the namespace network
// (worker/wan/netns_network.h: two network namespaces, kernel TCP between
// them, every packet through the emulated link). Needs root.
//
//   geo_fat_pipe_bench [--rtt-ms 230] [--rate-mbit 1000] [--size-mib 64]
//                      [--transfers 5] [--gap-s 2] [--queue-ms 100]
//                      [--tcp-buffer-mib 0]
//
// Exit status: 0; 1 when a transfer failed or arrived changed; 77 where
// network namespaces are not allowed (not root); CLI11's codes on a usage error.
//
// Each transfer is one send() of --size-mib from site a to site b (the real
// transport: CURVE, the WAN chunking, ZeroMQ), --gap apart, so that the
// connection idles between transfers as it does between a job's rounds. For
// each it prints the time from send() to the whole payload received, and the
// rate "from the first byte to the last": the payload over that time less the
// one-way delay (the first byte cannot arrive sooner), against the link's
// rate. The first transfer includes TCP's slow start on a fresh connection;
// the later ones show what a connection that has carried a round before does.
//
// Target (issue "When the link is the limit"): one 64 MB transfer over an
// emulated 1 Gbit/s, 230 ms link at >= 90% of the link's rate from first byte
// to last. A link's 1 Gbit/s at 230 ms holds 29 MB in flight: the kernels'
// TCP buffers (net.ipv4.tcp_rmem / tcp_wmem, raised to 32 MiB in the
// namespaces) must hold that.

#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "tests/worker/transport/transport_fixture.h"
#include "worker/transport/zmq_transport.h"
#include "worker/wan/netns_network.h"

using namespace geo;
using Seconds = std::chrono::duration<double>;

int main(int argc, char** argv) {
  CLI::App app(
      "geotrain long fat pipe benchmark: one large payload between two transports over an "
      "emulated WAN link of kernel TCP between network namespaces (root)");
  double rttMs = 230;
  double rateMbit = 1000;
  int sizeMiB = 64;
  int transfers = 5;
  double gapSeconds = 2;
  int bufferMiB = 0;
  double queueMs = 100;
  int connections = 1;
  app.add_option("--rtt-ms", rttMs, "round-trip time of the link in ms (default 230)")
      ->check(CLI::Range(0.0, 10000.0));
  app.add_option("--rate-mbit", rateMbit, "the link's rate each way in Mbit/s (default 1000)")
      ->check(CLI::Range(1.0, 100000.0));
  app.add_option("--size-mib", sizeMiB, "payload size in MiB (default 64)")
      ->check(CLI::Range(1, 1024));
  app.add_option("--transfers", transfers, "transfers, one after another (default 5)")
      ->check(CLI::Range(1, 100));
  app.add_option("--gap-s", gapSeconds, "idle seconds between two transfers (default 2)")
      ->check(CLI::Range(0.0, 600.0));
  app.add_option("--tcp-buffer-mib", bufferMiB,
                 "the most a TCP socket buffer may grow to in the namespaces, MiB "
                 "(net.ipv4.tcp_rmem / tcp_wmem; default 0: twice the link's bandwidth-delay "
                 "product, at least 32)")
      ->check(CLI::Range(0, 1024));
  app.add_option("--queue-ms", queueMs,
                 "the longest a packet waits for the uplink before it is dropped (default 100)")
      ->check(CLI::Range(1.0, 10000.0));
  app.add_option("--connections", connections,
                 "data connections the payload is striped over (transport.connections; default "
                 "1)")
      ->check(CLI::Range(1, static_cast<int>(transport::kMaxConnections)));
  CLI11_PARSE(app, argc, argv);
  const auto rtt = std::chrono::duration_cast<std::chrono::microseconds>(
      std::chrono::duration<double, std::milli>(rttMs));
  const auto gap = std::chrono::duration<double>(gapSeconds);
  if (Status s = wan::checkNetnsAllowed(); !s.ok()) {
    std::fprintf(stderr, "skipped: %s\n", s.message().c_str());
    return 77;  // ctest's SKIP_RETURN_CODE
  }

  const auto oneWay = rtt / 2;
  wan::WanShape shape;
  shape.sites = {"a", "b"};
  shape.oneWay = {{wan::Microseconds(0), oneWay}, {oneWay, wan::Microseconds(0)}};
  shape.site.resize(2);
  for (auto& s : shape.site) {
    s.egressBitsPerSecond = rateMbit * 1e6;
    s.queue = wan::Microseconds(static_cast<int64_t>(queueMs * 1e3));
  }
  wan::NetnsOptions netOptions;
  netOptions.tcpMaxBufferBytes = int64_t{bufferMiB} << 20;
  auto net = wan::NetnsNetwork::create(shape, netOptions);
  if (!net.ok()) {
    std::fprintf(stderr, "namespace network: %s\n", net.status().toString().c_str());
    return 1;
  }

  // Two ranks, one per site, as a job's two region leaders: the test world's
  // keys, with the sites' addresses for endpoints.
  transport::testing::World world(2);
  world.endpoints = {"tcp://" + wan::siteAddress(0) + ":7000",
                     "tcp://" + wan::siteAddress(1) + ":7000"};
  std::vector<std::unique_ptr<transport::Transport>> t(2);
  for (uint32_t r = 0; r < 2; ++r) {
    transport::TransportConfig c = world.config(r);
    c.uplinkPeers = {r != 0, r != 1};
    c.connections = static_cast<size_t>(connections);
    c.links.resize(2);
    c.rankNames = {"a", "b"};
    Status s = (*net)->runIn(r, [&] {
      auto made = transport::makeZmqTransport(c);
      if (made.ok()) {
        t[r] = std::move(*made);
      } else {
        std::fprintf(stderr, "transport %u: %s\n", r, made.status().toString().c_str());
      }
    });
    if (!s.ok() || !t[r]) return 1;
  }

  // Connected (CURVE handshakes done, each side heard the other's hello)
  // before the first transfer, so that its time is TCP's and not the set-up's.
  const auto connectBy = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  const auto heard = [](const transport::Transport& x) {
    const auto c = x.peerCounters();
    return std::all_of(c.begin(), c.end(), [](const auto& p) { return p.heard; });
  };
  while (!(heard(*t[0]) && heard(*t[1]))) {
    if (std::chrono::steady_clock::now() > connectBy) {
      std::fprintf(stderr, "the two transports did not connect within 30 s\n");
      return 1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }

  const size_t bytes = static_cast<size_t>(sizeMiB) << 20;
  const transport::Payload payload(transport::testing::pattern(bytes, 1));
  const double linkBytesPerSecond = rateMbit * 1e6 / 8;
  std::printf(
      "link %.0f Mbit/s, round trip %.0f ms (%.1f MB in flight), queue %.0f ms, TCP buffers "
      "up to %lld MiB, payload %d MiB over %d connection(s)\n",
      rateMbit, Seconds(rtt).count() * 1e3, linkBytesPerSecond * Seconds(rtt).count() / 1e6,
      queueMs,
      static_cast<long long>(
          (bufferMiB > 0 ? int64_t{bufferMiB} << 20 : wan::tcpBufferBytesFor(shape)) >> 20),
      sizeMiB, connections);
  std::printf("%-9s %12s %18s %10s\n", "transfer", "send->recv", "first->last byte", "of link");
  int failures = 0;
  std::vector<double> shares;
  for (int i = 0; i < transfers; ++i) {
    if (i > 0) std::this_thread::sleep_for(gap);
    const auto t0 = std::chrono::steady_clock::now();
    Status s = t[0]->send(1, transport::MessageKind::kUpdate, {.round = static_cast<uint64_t>(i)},
                          payload, std::chrono::seconds(60));
    if (!s.ok()) {
      std::fprintf(stderr, "send %d: %s\n", i, s.toString().c_str());
      ++failures;
      continue;
    }
    auto m = t[1]->receive(transport::MessageKind::kUpdate, static_cast<uint64_t>(i), 0,
                           std::chrono::seconds(120));
    if (!m.ok()) {
      std::fprintf(stderr, "receive %d: %s\n", i, m.status().toString().c_str());
      ++failures;
      continue;
    }
    if (m->payload.size() != bytes ||
        !std::equal(m->payload.bytes().begin(), m->payload.bytes().end(),
                    payload.bytes().begin())) {
      std::fprintf(stderr, "transfer %d: the payload arrived changed\n", i);
      ++failures;
    }
    const double total = Seconds(m->received - t0).count();
    const double body = total - Seconds(oneWay).count();
    const double share = static_cast<double>(bytes) / body / linkBytesPerSecond;
    shares.push_back(share);
    std::printf("%-9d %10.3f s %16.3f s %9.1f%%\n", i + 1, total, body, share * 100);
  }
  if (!shares.empty()) {
    std::printf("best %.1f%% of the link, last %.1f%% (target: >= 90%%)\n",
                *std::max_element(shares.begin(), shares.end()) * 100, shares.back() * 100);
  }
  const auto c = (*net)->counters();
  std::printf("packets a->b %llu, dropped at the uplink's queue %llu, most held at once %llu\n",
              static_cast<unsigned long long>(c.sites[0].packetsSent),
              static_cast<unsigned long long>(c.sites[0].egressDropped),
              static_cast<unsigned long long>(c.heldPeak));
  return failures > 0 ? 1 : 0;
}
