// libFuzzer target for PayloadAssembler (built and run by
// tests/fuzz/run_fuzzers.sh with clang++-14 -fsanitize=fuzzer,address,undefined).
//
// The input is a script of chunks, 6 bytes each, that the assembler gets in
// that order, as from a hostile but authenticated peer that may skip, repeat,
// reorder or interleave chunks of several payloads and senders:
//   byte 0       sender (mod 3)
//   byte 1       round (mod 4): payloads of different rounds are different
//   bytes 2..3   payloadBytes (mod 4097), little-endian
//   byte 4       payloadOffset, in 1/256ths of payloadBytes
//   byte 5       chunk size, in 1/256ths of payloadBytes (at least 1 byte,
//                at most what is left after the offset); 255: all that is left
// Every chunk holds the bytes of its payload at its offset, a function of
// (round, payloadBytes, position); so whatever the assembler hands back must
// be exactly those bytes, whatever the order of the chunks it was given. A
// payload handed back with any other byte, or of the wrong size, aborts,
// which libFuzzer reports as a crash; ASan catches any copy out of bounds.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <vector>

#include "worker/transport/assembler.h"

namespace {

using geo::transport::FrameHeader;
using geo::transport::Payload;

constexpr uint32_t kWorld = 3;

std::byte expectedByte(uint64_t round, uint64_t payloadBytes, uint64_t position) {
  return static_cast<std::byte>((position * 31 + round * 7 + payloadBytes) & 0xFF);
}

void check(bool condition) {
  if (!condition) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static auto pool = geo::transport::BufferPool::create(4, 1 << 20);
  geo::transport::PayloadAssembler assembler(kWorld, pool);
  for (size_t at = 0; at + 6 <= size; at += 6) {
    const uint8_t* op = data + at;
    FrameHeader h;
    h.sender = op[0] % kWorld;
    h.round = op[1] % 4;
    h.payloadBytes = (op[2] | (uint64_t{op[3]} << 8)) % 4097;
    h.elementCount = h.payloadBytes;
    h.payloadOffset = h.payloadBytes * op[4] / 256;
    uint64_t chunk = op[5] == 255 ? h.payloadBytes - h.payloadOffset : h.payloadBytes * op[5] / 256;
    if (chunk == 0) chunk = 1;
    if (chunk > h.payloadBytes - h.payloadOffset) chunk = h.payloadBytes - h.payloadOffset;
    if (h.payloadBytes == 0) chunk = 0;
    if (chunk == 0 && h.payloadBytes != 0) continue;  // the decoder refuses these

    // An exactly-sized heap copy: a read past it is an ASan report.
    auto bytes = std::shared_ptr<std::byte[]>(new std::byte[chunk == 0 ? 1 : chunk]);
    for (uint64_t i = 0; i < chunk; ++i) {
      bytes[i] = expectedByte(h.round, h.payloadBytes, h.payloadOffset + i);
    }
    const std::span<const std::byte> view(bytes.get(), chunk);
    auto added = assembler.add(h, Payload(std::shared_ptr<const void>(bytes), view));
    check(added.dropped.ok() || !added.dropped.message().empty());
    if (added.complete) {
      check(added.complete->size() == h.payloadBytes);
      for (uint64_t i = 0; i < h.payloadBytes; ++i) {
        check(added.complete->data()[i] == expectedByte(h.round, h.payloadBytes, i));
      }
    }
    check(assembler.unfinished() <= kWorld);
    check(assembler.unfinishedBytes() <= kWorld * 4096);
  }
  return 0;
}
