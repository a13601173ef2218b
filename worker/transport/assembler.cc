#include "worker/transport/assembler.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "common/enforce.h"

namespace geo::transport {
namespace {

std::string describe(const FrameHeader& h) {
  return fmt::format("{} payload of round {} from rank {}", messageKindName(h.kind), h.round,
                     h.sender);
}

}  // namespace

PayloadAssembler::PayloadAssembler(uint32_t worldSize, std::shared_ptr<BufferPool> pool)
    : bySender_(worldSize), pool_(std::move(pool)) {
  GEO_ENFORCE(pool_ != nullptr, "PayloadAssembler needs a buffer pool");
}

PayloadAssembler::Added PayloadAssembler::add(const FrameHeader& h, Payload chunk,
                                              uint64_t stream) {
  GEO_ENFORCE(h.sender < bySender_.size(), "sender rank {} is outside the world of {}", h.sender,
              bySender_.size());
  GEO_ENFORCE(h.payloadOffset <= h.payloadBytes && chunk.size() <= h.payloadBytes - h.payloadOffset,
              "a chunk of {} bytes at offset {} does not fit in {} bytes", chunk.size(),
              h.payloadOffset, h.payloadBytes);
  GEO_ENFORCE(chunk.size() > 0 || h.payloadBytes == 0, "an empty chunk of a payload of {} bytes",
              h.payloadBytes);
  Added out;
  ++adds_;
  std::vector<Stream>& streams = bySender_[h.sender];
  auto found =
      std::find_if(streams.begin(), streams.end(), [&](const Stream& s) { return s.id == stream; });
  // A payload of one chunk on a stream with nothing in progress needs no
  // state (probes, small control messages): the common case stays free.
  if (found == streams.end() && h.payloadOffset == 0 && chunk.size() == h.payloadBytes) {
    out.complete = std::move(chunk);
    return out;
  }
  if (found == streams.end()) {
    if (streams.size() >= kMaxStreams) {
      auto oldest =
          std::min_element(streams.begin(), streams.end(),
                           [](const Stream& a, const Stream& b) { return a.lastUse < b.lastUse; });
      if (oldest->unfinished) {
        out.dropped =
            Status(StatusCode::kDataLoss,
                   fmt::format("{} ended after {} of {} bytes: its connection went quiet while the "
                               "sender used {} others",
                               describe(oldest->unfinished->header), oldest->unfinished->filled,
                               oldest->unfinished->header.payloadBytes, kMaxStreams));
      }
      streams.erase(oldest);
    }
    streams.push_back(Stream{stream, adds_, std::nullopt, std::nullopt});
    found = streams.end() - 1;
  }
  Stream& sender = *found;
  sender.lastUse = adds_;
  std::optional<Unfinished>& slot = sender.unfinished;
  // A stream with nothing left in progress or being dropped is forgotten.
  struct Forget {
    std::vector<Stream>& streams;
    uint64_t id;
    ~Forget() {
      std::erase_if(streams,
                    [&](const Stream& s) { return s.id == id && !s.unfinished && !s.dropped; });
    }
  } forget{streams, stream};

  if (h.payloadOffset == 0) {
    sender.dropped.reset();
    if (slot) {
      out.dropped =
          Status(StatusCode::kDataLoss,
                 fmt::format("{} ended after {} of {} bytes: a new payload began",
                             describe(slot->header), slot->filled, slot->header.payloadBytes));
      slot.reset();
    }
    if (chunk.size() == h.payloadBytes) {
      out.complete = std::move(chunk);
      return out;
    }
    slot.emplace(Unfinished{h, pool_->acquire(h.payloadBytes), 0});
  } else if (!slot && sender.dropped && samePayload(*sender.dropped, h)) {
    ++discarded_;  // the rest of a payload that was reported when it broke
    return out;
  } else if (!slot || !samePayload(slot->header, h) || slot->filled != h.payloadOffset) {
    out.dropped = Status(
        StatusCode::kDataLoss,
        slot ? fmt::format("a chunk at offset {} of a {} does not continue the {} in progress "
                           "(next offset {}); both dropped, with the rest of the first",
                           h.payloadOffset, describe(h), describe(slot->header), slot->filled)
             : fmt::format("a chunk at offset {} of a {} arrived with no payload in progress "
                           "(its first chunk was lost); dropped, with the rest of it",
                           h.payloadOffset, describe(h)));
    slot.reset();
    sender.dropped = h;
    return out;
  }

  std::memcpy(slot->buffer.get() + slot->filled, chunk.data(), chunk.size());
  slot->filled += chunk.size();
  if (slot->filled == slot->header.payloadBytes) {
    const std::span<const std::byte> view(slot->buffer.get(), slot->filled);
    out.complete = Payload(std::shared_ptr<const void>(std::move(slot->buffer)), view);
    slot.reset();
  }
  return out;
}

size_t PayloadAssembler::unfinished() const {
  size_t n = 0;
  for (const auto& streams : bySender_) {
    for (const Stream& s : streams) n += s.unfinished.has_value();
  }
  return n;
}

uint64_t PayloadAssembler::unfinishedBytes() const {
  uint64_t n = 0;
  for (const auto& streams : bySender_) {
    for (const Stream& s : streams) n += s.unfinished ? s.unfinished->header.payloadBytes : 0;
  }
  return n;
}

}  // namespace geo::transport
