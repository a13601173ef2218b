#pragma once
// PayloadAssembler: puts a payload back together from the chunks it travels
// in (frame.h: one [header][chunk] message per chunk, in order on one
// connection). Each chunk is copied into place as it arrives and its message
// can be let go at once, so a receiver never holds a large payload twice.
//
// Contract:
//  - add() takes a header that decodeFrameHeader accepted (the chunk fits in
//    the payload at its offset, and is empty only if the payload is) and the
//    chunk, owned by the Payload passed in; anything else throws geo::Error.
//  - A payload that is one chunk (offset 0, the whole payload) is handed back
//    as that chunk, without a copy.
//  - A larger one is copied into a buffer from the pool, acquired when its
//    first chunk (offset 0) arrives and sized from the header; it is handed
//    back when its last byte is in.
//  - A sender's chunks must arrive in order, each continuing the payload in
//    progress: same kind, round, step, codec, elementCount and payloadBytes,
//    at the offset where the previous chunk ended. A chunk that does not
//    (a chunk was lost, or the sender restarted mid-payload) is dropped along
//    with the unfinished payload, and a first chunk that arrives while one is
//    unfinished drops the unfinished one; add() says so in `dropped`, once
//    per payload: the later chunks of a payload already dropped are dropped
//    quietly (counted in discardedChunks()) until its sender begins another.
//    Delivery is at most once: a payload is whole or not at all.
//  - One sender's chunks never affect another's, and neither do the chunks
//    of one sender that arrive on another stream (add()'s `stream`: the
//    connection they came in on). A sender may reach the receiver on
//    several connections at once -- its probes on one, its data on another,
//    and after a reconnect the old connection may still deliver what the
//    kernel had buffered -- and each connection's chunks are in order only
//    among themselves. A sender keeps at most kMaxStreams streams with a
//    payload in progress; one more drops the oldest one's.
//  - Not thread-safe: the transport's I/O thread owns it.

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "common/status.h"
#include "worker/transport/buffer_pool.h"
#include "worker/transport/frame.h"
#include "worker/transport/transport.h"

namespace geo::transport {

class PayloadAssembler {
 public:
  // Senders are ranks below `worldSize`; `pool` provides the buffers that
  // payloads of several chunks are copied into.
  PayloadAssembler(uint32_t worldSize, std::shared_ptr<BufferPool> pool);

  struct Added {
    std::optional<Payload> complete;  // the whole payload, once its last chunk is in
    Status dropped;  // not OK when a chunk or an unfinished payload was dropped: why
  };
  Added add(const FrameHeader& header, Payload chunk, uint64_t stream = 0);
  static constexpr size_t kMaxStreams = 4;

  // Payloads begun and not yet complete, and the bytes they will take.
  size_t unfinished() const;
  uint64_t unfinishedBytes() const;
  // Chunks dropped quietly because their payload had been dropped already.
  uint64_t discardedChunks() const { return discarded_; }

 private:
  struct Unfinished {
    FrameHeader header;
    std::shared_ptr<std::byte[]> buffer;
    uint64_t filled = 0;
  };
  struct Stream {
    uint64_t id = 0;
    uint64_t lastUse = 0;  // add() calls so far when it last got a chunk
    std::optional<Unfinished> unfinished;
    std::optional<FrameHeader> dropped;  // the payload whose chunks are being dropped
  };
  // A sender's streams with a payload in progress or being dropped.
  std::vector<std::vector<Stream>> bySender_;
  uint64_t adds_ = 0;
  std::shared_ptr<BufferPool> pool_;
  uint64_t discarded_ = 0;
};

}  // namespace geo::transport
