#pragma once
// StripeAssembler: the receiving end of payloads striped over several data
// connections (frame.h, kFrameFlagStriped; TransportConfig::connections),
// and the order in which a sender's messages are delivered.
//
// One TCP connection keeps at most its receive window in flight, so on a
// long fat pipe whose hosts' buffer limits cannot be raised one connection
// carries a fraction of the link (docs/benchmarks.md, "One large payload
// over a long fat pipe"). A sender may then spread one payload's chunks over
// several connections; each connection's chunks arrive in order among
// themselves, but not with the other connections'.
//
// Contract:
//  - addChunk() takes a striped chunk (a header that decodeFrameHeader
//    accepted, with kFrameFlagStriped) and copies it into place by its
//    payloadOffset, into a buffer from the pool acquired at the payload's
//    first chunk, whichever that is. A payload is identified by its sender,
//    kind, round, step, codec, element count and size. A chunk that
//    arrives again (the sender sent once more what a dropped connection
//    held) is ignored; so are chunks of a payload completed recently.
//  - A payload is complete when every byte is in. It is delivered in the
//    order of the sender's messages: its last chunk (the one that ends at
//    payloadBytes) travels on the sender's first data connection after
//    every other message sent before the payload, so the arrival of that
//    chunk is the payload's place in that order.
//  - addOrdered() takes a whole message of the sender's first data
//    connection (not striped; not the control lane, not a probe). It is
//    delivered at once unless one of the sender's striped payloads whose
//    last chunk came before it is still incomplete: then it waits behind
//    that payload, and is delivered with it. Messages from one sender are
//    thus delivered in the order sent, as over one connection.
//  - Delivery is at most once: a payload that makes no progress (no new
//    chunk) for `stallLimit` is dropped, with what waits behind it
//    delivered; expire() does that and says so in `dropped`. When the
//    sender's connections are made anew (a new hello, forget()), its
//    payloads whose last chunk came on the old ones are dropped at once:
//    the sender sends nothing of them again. A sender keeps
//    at most kMaxUnfinished striped payloads unfinished; one more drops the
//    oldest. One sender's payloads never affect another's.
//  - Not thread-safe: the transport's I/O thread owns it.

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <set>
#include <vector>

#include "common/status.h"
#include "worker/transport/buffer_pool.h"
#include "worker/transport/frame.h"
#include "worker/transport/transport.h"

namespace geo::transport {

class StripeAssembler {
 public:
  using Clock = std::chrono::steady_clock;

  // Senders are ranks below `worldSize`.
  StripeAssembler(uint32_t worldSize, std::shared_ptr<BufferPool> pool, Clock::duration stallLimit);

  struct Delivery {
    FrameHeader header;  // payloadOffset 0, flags as the last chunk had them
    Payload payload;
  };
  struct Out {
    std::vector<Delivery> ready;  // in the sender's order
    Status dropped;               // not OK: a payload was dropped, and why
  };
  Out addChunk(const FrameHeader& header, Payload chunk, Clock::time_point now);
  Out addOrdered(const FrameHeader& header, Payload body);
  // Drops the payloads that made no progress for stallLimit.
  Out expire(Clock::time_point now);
  // `sender`'s connections were made anew (or it restarted): its payloads
  // that have their place in the order but miss chunks are dropped, and
  // what waited behind them is delivered. Payloads whose last chunk has not
  // come are kept: their chunks may be the first of the new connections'.
  Out forget(uint32_t sender);

  static constexpr size_t kMaxUnfinished = 8;
  // Striped payloads begun and not yet delivered, and the bytes they take.
  size_t unfinished() const;
  uint64_t unfinishedBytes() const;
  // Whether any sender's messages wait behind a striped payload.
  bool holding() const;

 private:
  struct Unfinished {
    FrameHeader header;  // of its first chunk to arrive
    std::shared_ptr<std::byte[]> buffer;
    uint64_t filled = 0;
    std::set<uint64_t> offsets;  // of the chunks in
    Clock::time_point progress;  // when the last new chunk came
    bool ordered = false;        // its last chunk came: it has a place in `order`
    uint64_t id = 0;
  };
  struct Held {
    uint64_t id = 0;  // the striped payload it waits for; 0: a whole message
    std::optional<Delivery> delivery;
  };
  struct Sender {
    std::vector<Unfinished> unfinished;
    std::deque<Held> order;
    std::deque<FrameHeader> recent;  // completed lately: their chunks again are ignored
  };
  void drain(Sender& s, Out& out);
  void drop(Sender& s, size_t index, const std::string& why, Out& out);

  std::vector<Sender> senders_;
  std::shared_ptr<BufferPool> pool_;
  Clock::duration stallLimit_;
  uint64_t nextId_ = 1;
};

}  // namespace geo::transport
