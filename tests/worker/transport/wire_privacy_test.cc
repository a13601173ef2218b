// No plaintext on the wire: rank 1 reaches rank 0 through a loopback TCP relay
// that records every byte in transit. A payload carrying a known canary must
// not appear in the recording with CURVE on, and must appear with CURVE off --
// which only this test-only build (geo_transport_plaintext_testonly) allows,
// and which shows that the recording would catch plaintext.

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <mutex>
#include <string>
#include <thread>

#include "tests/worker/transport/transport_fixture.h"
#include "worker/transport/zmq_transport.h"

namespace geo::transport {
namespace {

using namespace std::chrono_literals;

// Accepts connections on `port` and forwards each to `upstreamPort`,
// recording client -> server bytes.
class RecordingRelay {
 public:
  RecordingRelay(int port, int upstreamPort) : upstreamPort_(upstreamPort) {
    listenFd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    ::setsockopt(listenFd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in addr = loopback(port);
    EXPECT_EQ(::bind(listenFd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    EXPECT_EQ(::listen(listenFd_, 8), 0);
    thread_ = std::thread([this] { run(); });
  }
  ~RecordingRelay() {
    stop_ = true;
    thread_.join();
    ::close(listenFd_);
  }
  std::string recorded() {
    std::lock_guard lock(mu_);
    return recorded_;
  }

 private:
  static sockaddr_in loopback(int port) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    return addr;
  }

  void run() {
    std::vector<std::pair<int, int>> pairs;  // (client, upstream)
    char buf[65536];
    while (!stop_) {
      std::vector<pollfd> fds = {{listenFd_, POLLIN, 0}};
      for (auto [c, u] : pairs) {
        fds.push_back({c, POLLIN, 0});
        fds.push_back({u, POLLIN, 0});
      }
      if (::poll(fds.data(), fds.size(), 50) <= 0) continue;
      if (fds[0].revents & POLLIN) {
        const int c = ::accept(listenFd_, nullptr, nullptr);
        const int u = ::socket(AF_INET, SOCK_STREAM, 0);
        sockaddr_in addr = loopback(upstreamPort_);
        if (::connect(u, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
          pairs.emplace_back(c, u);
        } else {
          ::close(c);
          ::close(u);
        }
      }
      for (size_t i = 0; i < pairs.size(); ++i) {
        for (int dir = 0; dir < 2; ++dir) {
          if (!(fds[1 + 2 * i + dir].revents & (POLLIN | POLLHUP))) continue;
          const int from = dir == 0 ? pairs[i].first : pairs[i].second;
          const int to = dir == 0 ? pairs[i].second : pairs[i].first;
          const ssize_t n = ::read(from, buf, sizeof buf);
          if (n <= 0) continue;
          if (dir == 0) {
            std::lock_guard lock(mu_);
            recorded_.append(buf, static_cast<size_t>(n));
          }
          for (ssize_t off = 0; off < n;) {
            const ssize_t w = ::write(to, buf + off, static_cast<size_t>(n - off));
            if (w <= 0) break;
            off += w;
          }
        }
      }
    }
    for (auto [c, u] : pairs) {
      ::close(c);
      ::close(u);
    }
  }

  int listenFd_ = -1;
  int upstreamPort_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::mutex mu_;
  std::string recorded_;
};

std::string sendCanaryThroughRelay(bool encrypt) {
  testing::World w(2);
  const int serverPort = std::stoi(w.endpoints[0].substr(w.endpoints[0].rfind(':') + 1));
  const int relayPort = testing::freePort();
  RecordingRelay relay(relayPort, serverPort);
  auto c0 = w.config(0);
  auto c1 = w.config(1);
  c1.endpoints[0] = testing::tcp(relayPort);  // rank 1 reaches rank 0 via the relay
  c0.encrypt = c1.encrypt = encrypt;
  auto t0 = makeZmqTransport(c0);
  auto t1 = makeZmqTransport(c1);
  EXPECT_TRUE(t0.ok() && t1.ok());
  std::string canary;
  for (int i = 0; i < 1000; ++i) canary += "GEOTRAIN-CANARY-";
  const std::vector<std::byte> payload(
      reinterpret_cast<const std::byte*>(canary.data()),
      reinterpret_cast<const std::byte*>(canary.data()) + canary.size());
  EXPECT_TRUE((*t1)->send(0, MessageKind::kUpdate, {.round = 1}, Payload(payload), 5s).ok());
  auto m = (*t0)->receive(MessageKind::kUpdate, 1, 1, 10s);
  EXPECT_TRUE(m.ok()) << m.status().toString();
  EXPECT_EQ(m->payload.size(), canary.size());
  return relay.recorded();
}

TEST(WirePrivacy, EncryptedTrafficHidesThePayload) {
  const std::string wire = sendCanaryThroughRelay(true);
  EXPECT_GT(wire.size(), 16000u);  // the payload did cross the relay
  EXPECT_EQ(wire.find("GEOTRAIN-CANARY"), std::string::npos);
  EXPECT_EQ(wire.find("CANARY"), std::string::npos);
}

TEST(WirePrivacy, PlaintextWouldBeSeen) {
  const std::string wire = sendCanaryThroughRelay(false);
  EXPECT_NE(wire.find("GEOTRAIN-CANARY-GEOTRAIN-CANARY"), std::string::npos);
}

}  // namespace
}  // namespace geo::transport
