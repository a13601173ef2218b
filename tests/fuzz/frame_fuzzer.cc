// libFuzzer target for decodeFrameHeader (built and run by
// tests/fuzz/run_fuzzers.sh with clang++-14 -fsanitize=fuzzer,address,undefined).
//
// Input layout, chosen so that one input drives every argument and every
// branch of the decoder is reachable, including the accept path:
//   byte  0     flags
//                 bit 0: the chunk size is the header's own payloadBytes
//                        minus its payloadOffset (when that does not wrap;
//                        reaches the elementCount checks); otherwise bytes 2..9
//                 bit 1: maxPayloadBytes is bytes 10..17; otherwise 2^31
//                 bit 2: the expected job hash is the header's own jobHash
//                        field (gets past the job check); otherwise
//                        jobIdHash("fuzz-job")
//   byte  1     worldSize (0..255; 0 rejects every sender)
//   bytes 2..9  chunk size, little-endian
//   bytes 10..17 maxPayloadBytes, little-endian
//   bytes 18..  the header frame, of any length (lengths other than 64 test
//               the size check; ASan catches any read past its end, because
//               the header is copied into a buffer of exactly its size)
// Inputs shorter than 18 bytes are zero-padded control bytes with an empty
// header. The seeds in tests/fuzz/corpus/frame/ follow this layout.
//
// Beyond "no crash, no sanitizer report", an accepted header must re-encode
// to exactly the bytes that were decoded and must agree with the limits;
// anything else aborts, which libFuzzer reports as a crash.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "worker/transport/frame.h"

namespace {

using geo::transport::FrameLimits;
using geo::transport::kFrameHeaderBytes;

constexpr size_t kControlBytes = 18;

uint64_t loadLe64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

void check(bool condition) {
  if (!condition) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  uint8_t control[kControlBytes] = {};
  std::memcpy(control, data, size < kControlBytes ? size : kControlBytes);
  const size_t headerSize = size > kControlBytes ? size - kControlBytes : 0;

  // An exactly-sized heap copy: any out-of-bounds read is an ASan report.
  std::unique_ptr<std::byte[]> header(new std::byte[headerSize == 0 ? 1 : headerSize]);
  if (headerSize > 0) std::memcpy(header.get(), data + kControlBytes, headerSize);
  const std::span<const std::byte> headerSpan(header.get(), headerSize);

  const uint8_t flags = control[0];
  const bool headerHasFields = headerSize >= kFrameHeaderBytes;
  const uint8_t* fields = data + kControlBytes;  // valid when headerHasFields

  FrameLimits limits;
  limits.worldSize = control[1];
  limits.maxPayloadBytes = (flags & 2) != 0 ? loadLe64(control + 10) : uint64_t{1} << 31;
  limits.jobHash = (flags & 4) != 0 && headerHasFields ? loadLe64(fields + 8)
                                                       : geo::transport::jobIdHash("fuzz-job");
  uint64_t chunkBytes = loadLe64(control + 2);
  if ((flags & 1) != 0 && headerHasFields) {
    const uint64_t payloadBytes = loadLe64(fields + 48);
    const uint64_t payloadOffset = loadLe64(fields + 56);
    chunkBytes = payloadOffset <= payloadBytes ? payloadBytes - payloadOffset : 0;
  }

  auto decoded = geo::transport::decodeFrameHeader(headerSpan, chunkBytes, limits);
  if (!decoded.ok()) {
    check(!decoded.status().message().empty());
    return 0;
  }

  const geo::transport::FrameHeader& h = *decoded;
  check(headerSize == kFrameHeaderBytes);
  check(h.payloadOffset <= h.payloadBytes);
  check(chunkBytes <= h.payloadBytes - h.payloadOffset);
  check(chunkBytes > 0 || h.payloadBytes == 0);
  check(h.payloadBytes <= limits.maxPayloadBytes);
  check(h.jobHash == limits.jobHash);
  check(h.sender < limits.worldSize);
  check(geo::transport::isKnownKind(static_cast<uint16_t>(h.kind)));
  check(geo::transport::messageKindName(h.kind) != "unknown");
  check(static_cast<uint16_t>(h.codec) <= geo::transport::kMaxCodecId);

  std::byte again[kFrameHeaderBytes];
  geo::transport::encodeFrameHeader(h, std::span<std::byte, kFrameHeaderBytes>(again));
  check(std::memcmp(again, header.get(), kFrameHeaderBytes) == 0);
  return 0;
}
