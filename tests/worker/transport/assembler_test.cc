#include "worker/transport/assembler.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/enforce.h"
#include "tests/worker/transport/transport_fixture.h"

namespace geo::transport {
namespace {

using testing::pattern;
using testing::sameBytes;

FrameHeader headerFor(uint32_t sender, uint64_t round, uint64_t payloadBytes, uint64_t offset = 0) {
  FrameHeader h;
  h.kind = MessageKind::kUpdate;
  h.round = round;
  h.step = 7 * round;
  h.sender = sender;
  h.codec = CodecId::kRaw;
  h.elementCount = payloadBytes;
  h.payloadBytes = payloadBytes;
  h.payloadOffset = offset;
  return h;
}

// The chunk [offset, offset + size) of `payload`, as its own Payload (a copy,
// as a received ZeroMQ message would be).
Payload chunkOf(const std::vector<std::byte>& payload, size_t offset, size_t size) {
  return Payload::copyOf(std::span<const std::byte>(payload).subspan(offset, size));
}

// Expects `added` to report a dropped payload (kDataLoss) whose message
// mentions every string of `mentions`, and to hand nothing back.
void expectDropped(const PayloadAssembler::Added& added, const std::vector<std::string>& mentions) {
  EXPECT_FALSE(added.complete.has_value());
  EXPECT_EQ(added.dropped.code(), StatusCode::kDataLoss);
  for (const auto& m : mentions) {
    EXPECT_NE(added.dropped.message().find(m), std::string::npos)
        << "'" << added.dropped.message() << "' does not mention '" << m << "'";
  }
}

// Feeds `payload` from `sender` in chunks of the given sizes and returns what
// the last add() gave back; every earlier add() must give back nothing.
PayloadAssembler::Added feed(PayloadAssembler& a, uint32_t sender, uint64_t round,
                             const std::vector<std::byte>& payload,
                             const std::vector<size_t>& chunks) {
  size_t offset = 0;
  PayloadAssembler::Added last;
  for (size_t i = 0; i < chunks.size(); ++i) {
    last = a.add(headerFor(sender, round, payload.size(), offset),
                 chunkOf(payload, offset, chunks[i]));
    EXPECT_TRUE(last.dropped.ok()) << last.dropped.toString();
    if (i + 1 < chunks.size()) {
      EXPECT_FALSE(last.complete.has_value()) << "after chunk " << i;
    }
    offset += chunks[i];
  }
  return last;
}

TEST(PayloadAssembler, HandsBackAOneChunkPayloadWithoutACopy) {
  PayloadAssembler a(4, BufferPool::create(4, 1 << 20));
  const auto payload = pattern(1000, 1);
  Payload chunk = chunkOf(payload, 0, 1000);
  const std::byte* data = chunk.data();
  auto added = a.add(headerFor(1, 5, 1000), std::move(chunk));
  ASSERT_TRUE(added.dropped.ok());
  ASSERT_TRUE(added.complete.has_value());
  EXPECT_EQ(added.complete->data(), data);
  EXPECT_TRUE(sameBytes(added.complete->bytes(), payload));
  EXPECT_EQ(a.unfinished(), 0u);
}

TEST(PayloadAssembler, HandsBackAnEmptyPayload) {
  PayloadAssembler a(2, BufferPool::create(4, 1 << 20));
  auto added = a.add(headerFor(0, 1, 0), Payload());
  ASSERT_TRUE(added.dropped.ok());
  ASSERT_TRUE(added.complete.has_value());
  EXPECT_EQ(added.complete->size(), 0u);
}

TEST(PayloadAssembler, JoinsChunksInOrderIntoARecycledBuffer) {
  auto pool = BufferPool::create(4, 1 << 20);
  PayloadAssembler a(4, pool);
  const auto first = pattern(10000, 2);
  // Uneven chunks, the last one short, as the sender cuts them.
  auto added = feed(a, 3, 1, first, {4096, 4096, 1808});
  ASSERT_TRUE(added.complete.has_value());
  EXPECT_TRUE(sameBytes(added.complete->bytes(), first));
  const std::byte* buffer = added.complete->data();
  EXPECT_EQ(a.unfinished(), 0u);
  added.complete.reset();  // the buffer goes back to the pool

  const auto second = pattern(9000, 3);
  added = feed(a, 3, 2, second, {1, 8998, 1});
  ASSERT_TRUE(added.complete.has_value());
  EXPECT_TRUE(sameBytes(added.complete->bytes(), second));
  EXPECT_EQ(added.complete->data(), buffer);
  EXPECT_EQ(pool->reused(), 1u);
}

TEST(PayloadAssembler, KeepsEachSendersPayloadApart) {
  PayloadAssembler a(3, BufferPool::create(4, 1 << 20));
  const auto fromOne = pattern(300, 4);
  const auto fromTwo = pattern(500, 5);
  EXPECT_FALSE(a.add(headerFor(1, 9, 300, 0), chunkOf(fromOne, 0, 100)).complete);
  EXPECT_FALSE(a.add(headerFor(2, 9, 500, 0), chunkOf(fromTwo, 0, 250)).complete);
  EXPECT_EQ(a.unfinished(), 2u);
  EXPECT_EQ(a.unfinishedBytes(), 800u);
  EXPECT_FALSE(a.add(headerFor(1, 9, 300, 100), chunkOf(fromOne, 100, 100)).complete);
  auto two = a.add(headerFor(2, 9, 500, 250), chunkOf(fromTwo, 250, 250));
  auto one = a.add(headerFor(1, 9, 300, 200), chunkOf(fromOne, 200, 100));
  ASSERT_TRUE(one.complete && two.complete);
  EXPECT_TRUE(one.dropped.ok() && two.dropped.ok());
  EXPECT_TRUE(sameBytes(one.complete->bytes(), fromOne));
  EXPECT_TRUE(sameBytes(two.complete->bytes(), fromTwo));
  EXPECT_EQ(a.unfinished(), 0u);
  EXPECT_EQ(a.unfinishedBytes(), 0u);
}

TEST(PayloadAssembler, ANewPayloadDropsTheUnfinishedOne) {
  PayloadAssembler a(2, BufferPool::create(4, 1 << 20));
  const auto old = pattern(100, 6);
  const auto next = pattern(60, 7);
  EXPECT_FALSE(a.add(headerFor(1, 3, 100, 0), chunkOf(old, 0, 40)).complete);
  // The sender restarted: its next payload begins (here whole in one chunk).
  auto added = a.add(headerFor(1, 4, 60, 0), chunkOf(next, 0, 60));
  ASSERT_TRUE(added.complete.has_value());
  EXPECT_TRUE(sameBytes(added.complete->bytes(), next));
  EXPECT_EQ(added.dropped.code(), StatusCode::kDataLoss);
  for (const char* mention :
       {"update payload of round 3 from rank 1", "after 40 of 100 bytes", "a new payload began"}) {
    EXPECT_NE(added.dropped.message().find(mention), std::string::npos) << added.dropped.message();
  }
  EXPECT_EQ(a.unfinished(), 0u);
}

// One sender on two connections (its probes on one, its data on the other;
// or an old connection still delivering after a reconnect): each stream's
// chunks are assembled apart, and a whole message on one does not drop the
// payload in progress on the other.
TEST(PayloadAssembler, KeepsEachStreamOfOneSenderApart) {
  PayloadAssembler a(2, BufferPool::create(4, 1 << 20));
  const auto data = pattern(300, 8);
  const auto old = pattern(200, 9);
  EXPECT_FALSE(a.add(headerFor(1, 5, 300, 0), chunkOf(data, 0, 100), /*stream=*/7).complete);
  EXPECT_FALSE(a.add(headerFor(1, 4, 200, 0), chunkOf(old, 0, 50), /*stream=*/8).complete);
  // A ping on a third stream, whole: handed back, nothing dropped.
  const auto ping = pattern(8, 1);
  auto probe = a.add(headerFor(1, 0, 8, 0), chunkOf(ping, 0, 8), /*stream=*/9);
  ASSERT_TRUE(probe.complete.has_value());
  EXPECT_TRUE(probe.dropped.ok()) << probe.dropped.toString();
  EXPECT_EQ(a.unfinished(), 2u);
  EXPECT_FALSE(a.add(headerFor(1, 5, 300, 100), chunkOf(data, 100, 100), 7).complete);
  auto second = a.add(headerFor(1, 4, 200, 50), chunkOf(old, 50, 150), 8);
  ASSERT_TRUE(second.complete.has_value());
  EXPECT_TRUE(sameBytes(second.complete->bytes(), old));
  auto first = a.add(headerFor(1, 5, 300, 200), chunkOf(data, 200, 100), 7);
  ASSERT_TRUE(first.complete.has_value());
  EXPECT_TRUE(sameBytes(first.complete->bytes(), data));
  EXPECT_EQ(a.unfinished(), 0u);
}

// A sender with more streams in progress than kMaxStreams (connections that
// died mid-payload): the least recently used one's payload is dropped, saying
// so, and memory stays bounded.
TEST(PayloadAssembler, DropsTheOldestStreamBeyondTheLimit) {
  PayloadAssembler a(2, BufferPool::create(8, 1 << 20));
  const auto p = pattern(100, 3);
  for (uint64_t stream = 0; stream < PayloadAssembler::kMaxStreams; ++stream) {
    auto added = a.add(headerFor(1, stream, 100, 0), chunkOf(p, 0, 10), stream);
    EXPECT_TRUE(added.dropped.ok());
  }
  EXPECT_EQ(a.unfinished(), PayloadAssembler::kMaxStreams);
  auto added = a.add(headerFor(1, 99, 100, 0), chunkOf(p, 0, 10), 99);
  expectDropped(added, {"round 0 from rank 1", "its connection went quiet"});
  EXPECT_EQ(a.unfinished(), PayloadAssembler::kMaxStreams);
}

TEST(PayloadAssembler, DropsAChunkWithNoPayloadInProgress) {
  PayloadAssembler a(2, BufferPool::create(4, 1 << 20));
  const auto payload = pattern(100, 8);
  expectDropped(a.add(headerFor(1, 3, 100, 40), chunkOf(payload, 40, 60)),
                {"offset 40", "no payload in progress"});
  EXPECT_EQ(a.unfinished(), 0u);
}

TEST(PayloadAssembler, ALostChunkDropsThePayload) {
  PayloadAssembler a(2, BufferPool::create(4, 1 << 20));
  const auto payload = pattern(300, 9);
  EXPECT_FALSE(a.add(headerFor(1, 3, 300, 0), chunkOf(payload, 0, 100)).complete);
  // [100, 200) never came.
  auto added = a.add(headerFor(1, 3, 300, 200), chunkOf(payload, 200, 100));
  expectDropped(added, {"next offset 100"});
  EXPECT_EQ(a.unfinished(), 0u);
  // What follows is not put together into something that never was sent,
  // and the payload is reported once, not once per chunk.
  added = a.add(headerFor(1, 3, 300, 100), chunkOf(payload, 100, 100));
  EXPECT_FALSE(added.complete.has_value());
  EXPECT_TRUE(added.dropped.ok()) << added.dropped.toString();
  EXPECT_EQ(a.discardedChunks(), 1u);
  // The sender's next payload is put together as usual.
  const auto next = pattern(250, 12);
  added = feed(a, 1, 4, next, {200, 50});
  ASSERT_TRUE(added.complete.has_value());
  EXPECT_TRUE(sameBytes(added.complete->bytes(), next));
  EXPECT_EQ(a.discardedChunks(), 1u);
}

TEST(PayloadAssembler, ReportsABrokenPayloadOnceAndOnlyItsOwnChunksQuietly) {
  PayloadAssembler a(3, BufferPool::create(4, 1 << 20));
  const auto payload = pattern(400, 13);
  // Rank 1's first chunk was lost: one report, then its other chunks go
  // quietly.
  auto added = a.add(headerFor(1, 5, 400, 100), chunkOf(payload, 100, 100));
  expectDropped(added, {"round 5 from rank 1"});
  for (uint64_t offset : {200, 300}) {
    added = a.add(headerFor(1, 5, 400, offset), chunkOf(payload, offset, 100));
    EXPECT_TRUE(added.dropped.ok()) << offset;
    EXPECT_FALSE(added.complete.has_value());
  }
  EXPECT_EQ(a.discardedChunks(), 2u);
  // A chunk of another payload, or from another sender, is not one of them.
  expectDropped(a.add(headerFor(1, 6, 400, 100), chunkOf(payload, 100, 100)),
                {"round 6 from rank 1"});
  expectDropped(a.add(headerFor(2, 5, 400, 100), chunkOf(payload, 100, 100)),
                {"round 5 from rank 2"});
  EXPECT_EQ(a.discardedChunks(), 2u);
}

TEST(PayloadAssembler, AChunkOfAnotherPayloadAtTheRightOffsetIsDropped) {
  PayloadAssembler a(2, BufferPool::create(4, 1 << 20));
  const auto payload = pattern(200, 10);
  // Every field a chunk repeats must match the payload in progress.
  const std::vector<std::pair<std::string, void (*)(FrameHeader&)>> changes = {
      {"round", [](FrameHeader& h) { ++h.round; }},
      {"step", [](FrameHeader& h) { ++h.step; }},
      {"kind", [](FrameHeader& h) { h.kind = MessageKind::kGossip; }},
      {"codec", [](FrameHeader& h) { h.codec = CodecId::kQsgd; }},
      {"elementCount", [](FrameHeader& h) { --h.elementCount; }},
      {"payloadBytes", [](FrameHeader& h) { h.payloadBytes += 10; }},
  };
  for (const auto& [field, change] : changes) {
    EXPECT_FALSE(a.add(headerFor(1, 3, 200, 0), chunkOf(payload, 0, 100)).complete);
    FrameHeader h = headerFor(1, 3, 200, 100);
    change(h);
    SCOPED_TRACE(field);
    expectDropped(a.add(h, chunkOf(payload, 100, 100)), {"does not continue"});
    EXPECT_EQ(a.unfinished(), 0u) << field;
  }
}

TEST(PayloadAssembler, RefusesInputOutsideItsContract) {
  PayloadAssembler a(2, BufferPool::create(4, 1 << 20));
  const auto payload = pattern(10, 11);
  EXPECT_THROW(a.add(headerFor(2, 1, 10), chunkOf(payload, 0, 10)), geo::Error);     // rank 2 of 2
  EXPECT_THROW(a.add(headerFor(1, 1, 10, 5), chunkOf(payload, 0, 10)), geo::Error);  // past the end
  EXPECT_THROW(a.add(headerFor(1, 1, 10, 0), Payload()), geo::Error);                // empty chunk
  EXPECT_THROW(PayloadAssembler(2, nullptr), geo::Error);
}

}  // namespace
}  // namespace geo::transport
