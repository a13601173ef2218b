#pragma once
// BufferPool: recycles the large buffers that received payloads of several
// chunks are reassembled in (PayloadAssembler). A fresh buffer of tens of
// MiB is mapped by malloc and faulted in page by page on first write (16,384
// page faults for 64 MiB, which on a virtual machine cost as much as the
// copy itself; `perf` showed them at a quarter of a receiver's time); a
// recycled one is mapped already. A worker receives payloads of the same
// sizes round after round, so the pool settles at a handful of buffers.
//
// acquire() hands out a buffer of at least `size` bytes, owned by the
// returned shared_ptr; when the last owner lets go, the buffer goes back to
// the pool (or is freed if the pool is full or gone). The pool keeps at
// most `maxBuffers` idle buffers and `maxBytes` idle bytes. Thread-safe;
// buffers may outlive the pool.

#include <cstddef>
#include <memory>
#include <mutex>
#include <vector>

namespace geo::transport {

class BufferPool : public std::enable_shared_from_this<BufferPool> {
 public:
  static std::shared_ptr<BufferPool> create(size_t maxBuffers, size_t maxBytes);

  // Uninitialized bytes; a buffer is reused when its capacity is between
  // `size` and twice `size`.
  std::shared_ptr<std::byte[]> acquire(size_t size);

  size_t idleBuffers() const;
  size_t idleBytes() const;
  // Buffers handed out that came from the pool rather than from malloc.
  size_t reused() const;

 private:
  struct Buffer {
    std::unique_ptr<std::byte[]> data;
    size_t capacity = 0;
  };
  BufferPool(size_t maxBuffers, size_t maxBytes) : maxBuffers_(maxBuffers), maxBytes_(maxBytes) {}
  void release(Buffer buffer);

  const size_t maxBuffers_;
  const size_t maxBytes_;
  mutable std::mutex mu_;
  std::vector<Buffer> idle_;
  size_t idleBytes_ = 0;
  size_t reused_ = 0;
};

}  // namespace geo::transport
