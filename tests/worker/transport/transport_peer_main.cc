// A transport peer in its own process, for restart tests: it echoes back the
// update messages of rounds [first, first + count) that rank 0 sends it, then
// exits 0 (1 on any error).
//
//   transport_peer KEYS_DIR RANK FIRST COUNT ENDPOINT0 ENDPOINT1 ...
// KEYS_DIR holds rank<r>.key / rank<r>.pub for every rank.

#include <cstdio>
#include <cstdlib>
#include <string>

#include "common/keys/keys.h"
#include "worker/transport/zmq_transport.h"

using namespace geo::transport;

int main(int argc, char** argv) {
  if (argc < 6) {
    std::fprintf(stderr, "usage: %s KEYS_DIR RANK FIRST COUNT ENDPOINT...\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  TransportConfig c;
  c.jobId = "test-job";
  c.rank = static_cast<uint32_t>(std::atoi(argv[2]));
  const uint64_t first = std::strtoull(argv[3], nullptr, 10);
  const uint64_t count = std::strtoull(argv[4], nullptr, 10);
  for (int i = 5; i < argc; ++i) c.endpoints.push_back(argv[i]);
  for (size_t r = 0; r < c.endpoints.size(); ++r) {
    auto pub = geo::keys::loadPublicKey(dir + "/rank" + std::to_string(r) + ".pub");
    if (!pub.ok()) {
      std::fprintf(stderr, "%s\n", pub.status().toString().c_str());
      return 1;
    }
    c.publicKeys.push_back(*pub);
  }
  auto secret = geo::keys::loadSecretKey(dir + "/rank" + std::to_string(c.rank) + ".key");
  if (!secret.ok()) {
    std::fprintf(stderr, "%s\n", secret.status().toString().c_str());
    return 1;
  }
  c.secretKey = *secret;
  auto t = makeZmqTransport(c);
  if (!t.ok()) {
    std::fprintf(stderr, "%s\n", t.status().toString().c_str());
    return 1;
  }
  const auto echo = [&](const Message& m) {
    auto st = (*t)->send(0, MessageKind::kUpdate, {.round = m.header.round},
                         Payload::copyOf(m.payload.bytes()), std::chrono::seconds(5));
    if (!st.ok()) std::fprintf(stderr, "%s\n", st.toString().c_str());
    return st.ok();
  };
  for (uint64_t round = first; round < first + count; ++round) {
    auto m = (*t)->receive(MessageKind::kUpdate, round, 0, std::chrono::seconds(30));
    if (!m.ok()) {
      std::fprintf(stderr, "%s\n", m.status().toString().c_str());
      return 1;
    }
    if (!echo(*m)) return 1;
  }
  // Delivery is at most once: an echo sent while the connection back was
  // still coming up may be lost, and rank 0 then sends the round again.
  // Answer such repeats of the last round until rank 0 has been quiet for 3 s.
  const uint64_t last = first + count - 1;
  for (auto m = (*t)->receive(MessageKind::kUpdate, last, 0, std::chrono::seconds(3)); m.ok();
       m = (*t)->receive(MessageKind::kUpdate, last, 0, std::chrono::seconds(3))) {
    if (!echo(*m)) return 1;
  }
  return 0;  // the transport's destructor flushes the echoes before exiting
}
