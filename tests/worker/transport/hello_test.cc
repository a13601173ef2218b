// The hello: peers compare the settings every rank of a job must share as
// their first frame, and refuse each other when they differ, over real
// loopback sockets; and the comparison itself (frame.h, compareHello).

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "tests/worker/transport/transport_fixture.h"
#include "worker/transport/frame.h"
#include "worker/transport/zmq_transport.h"

namespace geo::transport {
namespace {

using namespace std::chrono_literals;
using testing::pattern;
using testing::World;

constexpr const char* kFourBits = "sync.algorithm = dts\nsync.codec = qsgd\nsync.bits = 4\n";
constexpr const char* kEightBits = "sync.algorithm = dts\nsync.codec = qsgd\nsync.bits = 8\n";

TEST(Hello, EqualSettingsAgree) {
  EXPECT_FALSE(compareHello(encodeHello(kFourBits), kFourBits).has_value());
  EXPECT_FALSE(compareHello(encodeHello(""), "").has_value());
}

TEST(Hello, NamesTheFirstKeyThatDiffers) {
  const auto d = compareHello(encodeHello(kEightBits), kFourBits);
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->key, "sync.bits");
  EXPECT_EQ(d->theirs, "8");
  EXPECT_EQ(d->ours, "4");
}

TEST(Hello, AKeyOnlyOneSideHasIsNotSet) {
  const std::string more = std::string(kFourBits) + "sync.bucket = 512\n";
  auto d = compareHello(encodeHello(kFourBits), more);
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->key, "sync.bucket");
  EXPECT_EQ(d->theirs, "(not set)");
  EXPECT_EQ(d->ours, "512");
  d = compareHello(encodeHello(more), kFourBits);
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->key, "sync.bucket");
  EXPECT_EQ(d->theirs, "512");
  EXPECT_EQ(d->ours, "(not set)");
}

TEST(Hello, APayloadThatIsNoHelloDisagrees) {
  for (const std::string& payload :
       {std::string(), std::string("sync.bits = 4\n"), std::string("settings 0123")}) {
    const auto d = compareHello(payload, kFourBits);
    ASSERT_TRUE(d.has_value()) << payload;
    EXPECT_EQ(d->key, "hello");
  }
}

TEST(Hello, AHashThatDoesNotMatchItsTextDisagrees) {
  std::string hello = encodeHello(kFourBits);
  hello[hello.find(' ') + 1] = hello[hello.find(' ') + 1] == '0' ? '1' : '0';
  EXPECT_TRUE(compareHello(hello, kFourBits).has_value());
}

// What onDisagreement reported.
struct Reports {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::string> messages;

  std::function<void(const Status&)> sink() {
    return [this](const Status& s) {
      std::lock_guard lock(mu);
      messages.push_back(s.message());
      cv.notify_all();
    };
  }
  bool waitFor(size_t n, std::chrono::milliseconds timeout) {
    std::unique_lock lock(mu);
    return cv.wait_for(lock, timeout, [&] { return messages.size() >= n; });
  }
};

TransportConfig withSettings(const World& w, uint32_t rank, const char* settings,
                             Reports& reports) {
  TransportConfig c = w.config(rank);
  c.agreedSettings = settings;
  c.onDisagreement = reports.sink();
  c.rankNames = {"london", "tokyo"};
  return c;
}

TEST(HelloOverSockets, PeersWithDifferentBitsRefuseEachOtherAtConnect) {
  World w(2);
  Reports r0, r1;
  auto t0 = makeZmqTransport(withSettings(w, 0, kFourBits, r0));
  ASSERT_TRUE(t0.ok()) << t0.status().toString();
  auto t1 = makeZmqTransport(withSettings(w, 1, kEightBits, r1));
  ASSERT_TRUE(t1.ok()) << t1.status().toString();

  // Both find out without any update being sent.
  ASSERT_TRUE(r0.waitFor(1, 10s));
  ASSERT_TRUE(r1.waitFor(1, 10s));
  EXPECT_EQ(r0.messages[0], "peer tokyo (rank 1) runs sync.bits = 8, this worker sync.bits = 4");
  EXPECT_EQ(r1.messages[0], "peer london (rank 0) runs sync.bits = 4, this worker sync.bits = 8");

  // A refused peer's frames are not delivered, and counted.
  ASSERT_TRUE((*t1)->send(0, MessageKind::kUpdate, {.round = 1}, Payload(pattern(64, 1)), 1s).ok());
  const auto m = (*t0)->receive(MessageKind::kUpdate, 1, 1, 1500ms);
  EXPECT_EQ(m.status().code(), StatusCode::kDeadlineExceeded) << m.status().toString();
  EXPECT_GT((*t0)->counters().framesRejected, 0u);
  EXPECT_NE((*t0)->counters().lastRejectReason.find("refused for its settings"), std::string::npos)
      << (*t0)->counters().lastRejectReason;
  // Reported once, however many frames follow.
  EXPECT_EQ(r0.messages.size(), 1u);
}

TEST(HelloOverSockets, PeersWithTheSameSettingsExchangeUpdates) {
  World w(2);
  Reports r0, r1;
  auto t0 = makeZmqTransport(withSettings(w, 0, kFourBits, r0));
  ASSERT_TRUE(t0.ok()) << t0.status().toString();
  auto t1 = makeZmqTransport(withSettings(w, 1, kFourBits, r1));
  ASSERT_TRUE(t1.ok()) << t1.status().toString();
  ASSERT_TRUE((*t1)->send(0, MessageKind::kUpdate, {.round = 1}, Payload(pattern(64, 1)), 1s).ok());
  const auto m = (*t0)->receive(MessageKind::kUpdate, 1, 1, 10s);
  EXPECT_TRUE(m.ok()) << m.status().toString();
  EXPECT_FALSE(r0.waitFor(1, 300ms));
  EXPECT_TRUE(r1.messages.empty());
  EXPECT_EQ((*t0)->counters().framesRejected, 0u);
}

}  // namespace
}  // namespace geo::transport
