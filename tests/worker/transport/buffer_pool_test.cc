#include "worker/transport/buffer_pool.h"

#include <gtest/gtest.h>

#include <cstring>
#include <thread>
#include <vector>

namespace geo::transport {
namespace {

TEST(BufferPool, ReusesAReleasedBufferOfAFittingSize) {
  auto pool = BufferPool::create(4, size_t{64} << 20);
  std::byte* first = nullptr;
  {
    auto a = pool->acquire(1 << 20);
    first = a.get();
    std::memset(a.get(), 1, 1 << 20);
    EXPECT_EQ(pool->idleBuffers(), 0u);
  }
  EXPECT_EQ(pool->idleBuffers(), 1u);
  EXPECT_EQ(pool->idleBytes(), size_t{1} << 20);
  {
    auto b = pool->acquire((1 << 20) - 100);  // smaller, within 2x: the same buffer
    EXPECT_EQ(b.get(), first);
    EXPECT_EQ(pool->reused(), 1u);
    auto c = pool->acquire(1 << 20);  // the pool is empty again: a fresh one
    EXPECT_NE(c.get(), first);
  }
  EXPECT_EQ(pool->idleBuffers(), 2u);
  // Too large, or more than twice the size asked for: not reused.
  auto big = pool->acquire(size_t{3} << 20);
  auto tiny = pool->acquire(1000);
  EXPECT_EQ(pool->reused(), 1u);
  EXPECT_EQ(pool->idleBuffers(), 2u);
}

TEST(BufferPool, KeepsNoMoreThanItsLimits) {
  auto pool = BufferPool::create(2, size_t{3} << 20);
  {
    std::vector<std::shared_ptr<std::byte[]>> held;
    for (int i = 0; i < 4; ++i) held.push_back(pool->acquire(1 << 20));
  }
  EXPECT_EQ(pool->idleBuffers(), 2u);  // two freed: the count limit
  auto pool2 = BufferPool::create(8, size_t{3} << 20);
  {
    std::vector<std::shared_ptr<std::byte[]>> held;
    for (int i = 0; i < 4; ++i) held.push_back(pool2->acquire(1 << 20));
  }
  EXPECT_EQ(pool2->idleBuffers(), 3u);  // the byte limit
  EXPECT_LE(pool2->idleBytes(), size_t{3} << 20);
}

TEST(BufferPool, BuffersOutliveThePoolAndCrossThreads) {
  std::shared_ptr<std::byte[]> kept;
  {
    auto pool = BufferPool::create(4, size_t{1} << 30);
    kept = pool->acquire(4096);
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&pool] {
        for (int i = 0; i < 200; ++i) {
          auto b = pool->acquire(size_t{1} << 16);
          b[0] = std::byte{1};
        }
      });
    }
    for (auto& t : threads) t.join();
    EXPECT_LE(pool->idleBuffers(), 4u);
  }
  kept[4095] = std::byte{2};  // still valid; freed when `kept` goes (ASan/valgrind clean)
}

}  // namespace
}  // namespace geo::transport
