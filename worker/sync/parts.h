// A payload too large to go as one message, sent in parts behind the
// sender's rounds (Membership::sendBehindRounds: a joiner's state, state
// parity's answer) and put back together by its receiver.
//
// Each part's payload: the whole payload's size (u64), the part's offset
// in it (u64), then the part's bytes. The parts of one payload go in order
// on one connection.

#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "common/status.h"

namespace geo::sync::detail {

inline constexpr size_t kPartHeaderBytes = 2 * sizeof(uint64_t);

// The part of `whole` at [offset, offset + n), with its header.
inline std::shared_ptr<std::vector<std::byte>> makePart(std::span<const std::byte> whole,
                                                        size_t offset, size_t n) {
  auto part = std::make_shared<std::vector<std::byte>>(kPartHeaderBytes + n);
  const uint64_t total = whole.size(), at = offset;
  std::memcpy(part->data(), &total, sizeof total);
  std::memcpy(part->data() + sizeof total, &at, sizeof at);
  std::memcpy(part->data() + kPartHeaderBytes, whole.data() + offset, n);
  return part;
}

// Puts the parts of one payload back together, in order. Not thread-safe.
class PartsAssembler {
 public:
  // `limit`: the largest whole payload accepted (a part naming a larger
  // one is refused before anything is allocated for it).
  explicit PartsAssembler(uint64_t limit) : limit_(limit) {}

  // Adds one part (its payload, header included). A part at offset 0
  // starts a payload over (the sender began again). Sets `complete` once
  // the last part is in (take() then gives the payload). An error names
  // what was wrong: too short for its header, out of order, another
  // payload's size, over the limit, or past the payload's end; the parts
  // taken so far are then dropped.
  Status add(std::span<const std::byte> part, bool& complete) {
    complete = false;
    if (part.size() < kPartHeaderBytes) {
      return fail(fmt::format("a part of {} bytes (a part's header alone is {})", part.size(),
                              kPartHeaderBytes));
    }
    uint64_t total = 0, offset = 0;
    std::memcpy(&total, part.data(), sizeof total);
    std::memcpy(&offset, part.data() + sizeof total, sizeof offset);
    const auto body = part.subspan(kPartHeaderBytes);
    if (offset == 0) clear();
    if (offset != bytes_.size() || (total_ != 0 && total != total_) || total > limit_ ||
        body.size() > total - offset) {
      return fail(fmt::format("a part at byte {} of {} after {} bytes of {} (at most {})", offset,
                              total, bytes_.size(), total_, limit_));
    }
    if (total_ == 0) bytes_.reserve(total);
    total_ = total;
    bytes_.insert(bytes_.end(), body.begin(), body.end());
    complete = bytes_.size() == total_;
    return {};
  }
  // The whole payload, once complete; the assembler is empty after.
  std::vector<std::byte> take() {
    total_ = 0;
    return std::exchange(bytes_, {});
  }
  uint64_t received() const { return bytes_.size(); }
  uint64_t total() const { return total_; }

 private:
  Status fail(std::string what) {
    clear();
    return dataLoss(std::move(what));
  }
  void clear() {
    bytes_.clear();
    total_ = 0;
  }

  uint64_t limit_;
  uint64_t total_ = 0;
  std::vector<std::byte> bytes_;
};

}  // namespace geo::sync::detail
