#include "worker/transport/buffer_pool.h"

#include <utility>

namespace geo::transport {

std::shared_ptr<BufferPool> BufferPool::create(size_t maxBuffers, size_t maxBytes) {
  return std::shared_ptr<BufferPool>(new BufferPool(maxBuffers, maxBytes));
}

std::shared_ptr<std::byte[]> BufferPool::acquire(size_t size) {
  Buffer buffer;
  {
    std::lock_guard lock(mu_);
    size_t best = idle_.size();
    for (size_t i = 0; i < idle_.size(); ++i) {
      const size_t c = idle_[i].capacity;
      if (c >= size && c / 2 <= size && (best == idle_.size() || c < idle_[best].capacity)) {
        best = i;
      }
    }
    if (best != idle_.size()) {
      buffer = std::move(idle_[best]);
      idle_.erase(idle_.begin() + static_cast<std::ptrdiff_t>(best));
      idleBytes_ -= buffer.capacity;
      ++reused_;
    }
  }
  if (!buffer.data) {
    buffer.data.reset(new std::byte[size == 0 ? 1 : size]);  // uninitialized
    buffer.capacity = size;
  }
  std::byte* raw = buffer.data.get();
  std::weak_ptr<BufferPool> pool = weak_from_this();
  auto holder = std::make_shared<Buffer>(std::move(buffer));
  return std::shared_ptr<std::byte[]>(raw, [pool, holder](std::byte*) mutable {
    if (auto p = pool.lock()) p->release(std::move(*holder));
    // else: holder's unique_ptr frees it
  });
}

void BufferPool::release(Buffer buffer) {
  std::lock_guard lock(mu_);
  if (idle_.size() >= maxBuffers_ || idleBytes_ + buffer.capacity > maxBytes_) return;  // freed
  idleBytes_ += buffer.capacity;
  idle_.push_back(std::move(buffer));
}

size_t BufferPool::idleBuffers() const {
  std::lock_guard lock(mu_);
  return idle_.size();
}

size_t BufferPool::idleBytes() const {
  std::lock_guard lock(mu_);
  return idleBytes_;
}

size_t BufferPool::reused() const {
  std::lock_guard lock(mu_);
  return reused_;
}

}  // namespace geo::transport
