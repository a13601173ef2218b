#pragma once
// Helpers for tests of real transports on the namespace network
// (worker/wan/netns_network.h; root): one transport per site, made inside
// the site's namespace so that its sockets live there, and every pair
// connected before a test measures anything.

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "tests/worker/transport/transport_fixture.h"
#include "worker/wan/netns_network.h"

namespace geo::transport::testing {

// A transport for each of `net`'s sites, rank r in site r, listening on
// port 7000 of the site's address (every site has its own namespace, so
// the same port), with `world`'s keys. `configure` adjusts rank r's config
// (the world's, with its fast pings) before the transport is made. After a
// gtest failure (a transport that could not be made) the vector is empty.
inline std::vector<std::unique_ptr<Transport>> transportsInSites(
    const wan::NetnsNetwork& net, World& world,
    const std::function<void(uint32_t, TransportConfig&)>& configure = {}) {
  const auto sites = static_cast<uint32_t>(net.size());
  for (uint32_t r = 0; r < sites; ++r)
    world.endpoints[r] = "tcp://" + wan::siteAddress(r) + ":7000";
  std::vector<std::unique_ptr<Transport>> t(sites);
  for (uint32_t r = 0; r < sites; ++r) {
    TransportConfig c = world.config(r);
    if (configure) configure(r, c);
    const Status in = net.runIn(r, [&] {
      auto made = makeZmqTransport(c);
      if (!made.ok()) {
        ADD_FAILURE() << "rank " << r << ": " << made.status().toString();
        return;
      }
      t[r] = std::move(*made);
    });
    if (!in.ok() || t[r] == nullptr) {
      ADD_FAILURE() << "no transport in site " << r << ": " << in.toString();
      return {};
    }
  }
  return t;
}

// Every rank sends every other a small update (round 0) and receives every
// other's, so that each data connection is up. False (after a gtest
// failure) where a send or a receive did not complete within `timeout`.
inline bool connectEveryPair(const std::vector<std::unique_ptr<Transport>>& t,
                             std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
  const auto n = static_cast<uint32_t>(t.size());
  for (uint32_t r = 0; r < n; ++r) {
    for (uint32_t d = 0; d < n; ++d) {
      if (d == r) continue;
      const Status s =
          t[r]->send(d, MessageKind::kUpdate, {.round = 0}, Payload(pattern(100, r)), timeout);
      if (!s.ok()) {
        ADD_FAILURE() << "rank " << r << " to " << d << ": " << s.toString();
        return false;
      }
    }
  }
  for (uint32_t d = 0; d < n; ++d) {
    for (uint32_t r = 0; r < n; ++r) {
      if (d == r) continue;
      const auto m = t[d]->receive(MessageKind::kUpdate, 0, r, timeout);
      if (!m.ok()) {
        ADD_FAILURE() << "rank " << d << " from " << r << ": " << m.status().toString();
        return false;
      }
    }
  }
  return true;
}

}  // namespace geo::transport::testing
