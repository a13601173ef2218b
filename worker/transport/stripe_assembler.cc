#include "worker/transport/stripe_assembler.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "common/enforce.h"

namespace geo::transport {
namespace {

std::string describe(const FrameHeader& h) {
  return fmt::format("striped {} payload of round {} ({} bytes) from rank {}",
                     messageKindName(h.kind), h.round, h.payloadBytes, h.sender);
}

// Completed payloads remembered per sender, so that a chunk sent again
// after its payload was delivered does not begin a new one.
constexpr size_t kRecent = 16;

}  // namespace

StripeAssembler::StripeAssembler(uint32_t worldSize, std::shared_ptr<BufferPool> pool,
                                 Clock::duration stallLimit)
    : senders_(worldSize), pool_(std::move(pool)), stallLimit_(stallLimit) {
  GEO_ENFORCE(pool_ != nullptr, "StripeAssembler needs a buffer pool");
}

StripeAssembler::Out StripeAssembler::addChunk(const FrameHeader& h, Payload chunk,
                                               Clock::time_point now) {
  GEO_ENFORCE(h.sender < senders_.size(), "sender rank {} is outside the world of {}", h.sender,
              senders_.size());
  GEO_ENFORCE((h.flags & kFrameFlagStriped) != 0, "a chunk without the striped flag");
  GEO_ENFORCE(h.payloadOffset <= h.payloadBytes && chunk.size() > 0 &&
                  chunk.size() <= h.payloadBytes - h.payloadOffset,
              "a chunk of {} bytes at offset {} does not fit in {} bytes", chunk.size(),
              h.payloadOffset, h.payloadBytes);
  Out out;
  Sender& s = senders_[h.sender];
  if (std::any_of(s.recent.begin(), s.recent.end(),
                  [&](const FrameHeader& r) { return samePayload(r, h); })) {
    return out;  // a copy of a chunk of a payload delivered already
  }
  auto it = std::find_if(s.unfinished.begin(), s.unfinished.end(),
                         [&](const Unfinished& u) { return samePayload(u.header, h); });
  if (it == s.unfinished.end()) {
    if (s.unfinished.size() >= kMaxUnfinished) {
      // The one that made no progress the longest.
      const auto oldest = std::min_element(
          s.unfinished.begin(), s.unfinished.end(),
          [](const Unfinished& a, const Unfinished& b) { return a.progress < b.progress; });
      drop(s, static_cast<size_t>(oldest - s.unfinished.begin()),
           fmt::format("more than {} striped payloads unfinished", kMaxUnfinished), out);
    }
    Unfinished u;
    u.header = h;
    u.header.payloadOffset = 0;
    u.buffer = pool_->acquire(h.payloadBytes);
    u.id = nextId_++;
    s.unfinished.push_back(std::move(u));
    it = s.unfinished.end() - 1;
  }
  Unfinished& u = *it;
  if (!u.offsets.insert(h.payloadOffset).second) return out;  // sent again: in already
  std::memcpy(u.buffer.get() + h.payloadOffset, chunk.data(), chunk.size());
  u.filled += chunk.size();
  u.progress = now;
  if (h.payloadOffset + chunk.size() == h.payloadBytes && !u.ordered) {
    u.ordered = true;
    u.header.flags = h.flags;
    s.order.push_back({u.id, std::nullopt});
  }
  if (u.filled < u.header.payloadBytes) return out;
  // Chunks that overlap (a sender whose chunk size changed) would count
  // twice: the payload is whole only when its bytes are, which the offsets
  // cannot tell then; a sender never changes its chunk size within a
  // payload, and one that restarts sends a new payload.
  const auto held =
      std::find_if(s.order.begin(), s.order.end(), [&](const Held& x) { return x.id == u.id; });
  GEO_ENFORCE(held != s.order.end(), "a complete striped payload without its place in the order");
  auto bytes = std::span<const std::byte>(u.buffer.get(), u.header.payloadBytes);
  held->delivery = Delivery{u.header, Payload(std::move(u.buffer), bytes)};
  s.recent.push_back(u.header);
  if (s.recent.size() > kRecent) s.recent.pop_front();
  s.unfinished.erase(it);
  drain(s, out);
  return out;
}

StripeAssembler::Out StripeAssembler::addOrdered(const FrameHeader& h, Payload body) {
  GEO_ENFORCE(h.sender < senders_.size(), "sender rank {} is outside the world of {}", h.sender,
              senders_.size());
  Out out;
  Sender& s = senders_[h.sender];
  if (s.order.empty()) {
    out.ready.push_back({h, std::move(body)});
    return out;
  }
  s.order.push_back({0, Delivery{h, std::move(body)}});
  return out;
}

StripeAssembler::Out StripeAssembler::expire(Clock::time_point now) {
  Out out;
  for (Sender& s : senders_) {
    for (size_t i = 0; i < s.unfinished.size();) {
      const Unfinished& u = s.unfinished[i];
      if (now - u.progress < stallLimit_) {
        ++i;
        continue;
      }
      drop(s, i,
           fmt::format("no chunk of it for {:.1f} s",
                       std::chrono::duration<double>(now - u.progress).count()),
           out);
    }
  }
  return out;
}

StripeAssembler::Out StripeAssembler::forget(uint32_t sender) {
  GEO_ENFORCE(sender < senders_.size(), "sender rank {} is outside the world of {}", sender,
              senders_.size());
  Out out;
  Sender& s = senders_[sender];
  for (size_t i = 0; i < s.unfinished.size();) {
    if (s.unfinished[i].ordered) {
      drop(s, i, "its sender's connections were made anew", out);
    } else {
      ++i;
    }
  }
  return out;
}

void StripeAssembler::drop(Sender& s, size_t index, const std::string& why, Out& out) {
  const Unfinished& u = s.unfinished[index];
  out.dropped = Status(StatusCode::kDataLoss, fmt::format("{} dropped with {} of its bytes in: {}",
                                                          describe(u.header), u.filled, why));
  const uint64_t id = u.id;
  s.unfinished.erase(s.unfinished.begin() + static_cast<std::ptrdiff_t>(index));
  const auto held =
      std::find_if(s.order.begin(), s.order.end(), [&](const Held& x) { return x.id == id; });
  if (held != s.order.end()) s.order.erase(held);
  drain(s, out);
}

void StripeAssembler::drain(Sender& s, Out& out) {
  while (!s.order.empty() && s.order.front().delivery) {
    out.ready.push_back(std::move(*s.order.front().delivery));
    s.order.pop_front();
  }
}

size_t StripeAssembler::unfinished() const {
  size_t n = 0;
  for (const Sender& s : senders_) n += s.unfinished.size();
  return n;
}

uint64_t StripeAssembler::unfinishedBytes() const {
  uint64_t n = 0;
  for (const Sender& s : senders_) {
    for (const Unfinished& u : s.unfinished) n += u.header.payloadBytes;
  }
  return n;
}

bool StripeAssembler::holding() const {
  return std::any_of(senders_.begin(), senders_.end(),
                     [](const Sender& s) { return !s.order.empty(); });
}

}  // namespace geo::transport
