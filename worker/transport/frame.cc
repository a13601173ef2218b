#include "worker/transport/frame.h"

#include <fmt/format.h>

#include <utility>
#include <vector>

namespace geo::transport {
namespace {

// Field offsets; the layout table in frame.h is the specification.
constexpr size_t kOffMagic = 0;
constexpr size_t kOffVersion = 4;
constexpr size_t kOffKind = 6;
constexpr size_t kOffJobHash = 8;
constexpr size_t kOffRound = 16;
constexpr size_t kOffStep = 24;
constexpr size_t kOffSender = 32;
constexpr size_t kOffCodec = 36;
constexpr size_t kOffFlags = 38;
constexpr size_t kOffElementCount = 40;
constexpr size_t kOffPayloadBytes = 48;
constexpr size_t kOffPayloadOffset = 56;
static_assert(kOffPayloadOffset + 8 == kFrameHeaderBytes);

// Explicit little-endian packing with shifts: the wire format does not depend
// on the host's byte order or on struct layout, and no unaligned loads happen.
template <typename T>
void storeLe(std::span<std::byte, kFrameHeaderBytes> out, size_t offset, T value) {
  for (size_t i = 0; i < sizeof(T); ++i) {
    out[offset + i] = static_cast<std::byte>((value >> (8 * i)) & 0xFFu);
  }
}

// The caller guarantees offset + sizeof(T) <= bytes.size() (the header size is
// checked before any field is read).
template <typename T>
T loadLe(std::span<const std::byte> bytes, size_t offset) {
  T value = 0;
  for (size_t i = 0; i < sizeof(T); ++i) {
    value = static_cast<T>(value | (static_cast<T>(bytes[offset + i]) << (8 * i)));
  }
  return value;
}

std::string_view codecName(uint16_t codec) {
  switch (codec) {
    case static_cast<uint16_t>(CodecId::kRaw): return "raw";
    case static_cast<uint16_t>(CodecId::kFp32): return "fp32";
    case static_cast<uint16_t>(CodecId::kFp16): return "fp16";
    case static_cast<uint16_t>(CodecId::kBf16): return "bf16";
    case static_cast<uint16_t>(CodecId::kQsgd): return "qsgd";
    default: return "unknown";
  }
}

Status headerError(StatusCode code, std::string message) {
  return Status(code, fmt::format("frame header: {}", message));
}

// The element count must describe the payload exactly (fixed-width codecs) or
// fit in it at the smallest QSGD width of 2 bits per value. Written without
// multiplications so that no elementCount, however large, can overflow.
Status checkElementCount(CodecId codec, uint64_t elementCount, uint64_t payloadBytes) {
  const uint16_t codecValue = static_cast<uint16_t>(codec);
  if (codec == CodecId::kQsgd) {
    static_assert(kMinQsgdBitsPerValue == 2, "4 values per byte below");
    const uint64_t minBytes = elementCount / 4 + (elementCount % 4 != 0 ? 1 : 0);
    if (minBytes > payloadBytes) {
      return headerError(
          StatusCode::kInvalidArgument,
          fmt::format("elementCount {} does not fit in payloadBytes {} for codec {} ({}): "
                      "at 2 bits per value at least {} bytes are needed",
                      elementCount, payloadBytes, codecValue, codecName(codecValue), minBytes));
    }
    return {};
  }
  const uint64_t width = codecValueBytes(codec);
  if (payloadBytes % width != 0 || payloadBytes / width != elementCount) {
    return headerError(
        StatusCode::kInvalidArgument,
        fmt::format("elementCount {} does not match payloadBytes {} for codec {} ({}): "
                    "it must be payloadBytes / {} (= {}{})",
                    elementCount, payloadBytes, codecValue, codecName(codecValue), width,
                    payloadBytes / width,
                    payloadBytes % width != 0
                        ? fmt::format(", and payloadBytes must be a multiple of {}", width)
                        : std::string()));
  }
  return {};
}

}  // namespace

bool isKnownKind(uint16_t kind) {
  switch (kind) {
    case static_cast<uint16_t>(MessageKind::kPing):
    case static_cast<uint16_t>(MessageKind::kPong):
    case static_cast<uint16_t>(MessageKind::kHello):
    case static_cast<uint16_t>(MessageKind::kAck):
    case static_cast<uint16_t>(MessageKind::kWarmup):
    case static_cast<uint16_t>(MessageKind::kKeyNotice):
    case static_cast<uint16_t>(MessageKind::kUpdate):
    case static_cast<uint16_t>(MessageKind::kGossip):
    case static_cast<uint16_t>(MessageKind::kGossipReply):
    case static_cast<uint16_t>(MessageKind::kControl):
    case static_cast<uint16_t>(MessageKind::kLanReduce):
    case static_cast<uint16_t>(MessageKind::kLanBroadcast):
    case static_cast<uint16_t>(MessageKind::kShard):
    case static_cast<uint16_t>(MessageKind::kReduced):
    case static_cast<uint16_t>(MessageKind::kPart):
    case static_cast<uint16_t>(MessageKind::kRelayed): return true;
    default: return false;
  }
}

std::string_view messageKindName(MessageKind kind) {
  switch (kind) {
    case MessageKind::kPing: return "ping";
    case MessageKind::kPong: return "pong";
    case MessageKind::kHello: return "hello";
    case MessageKind::kAck: return "ack";
    case MessageKind::kWarmup: return "warmup";
    case MessageKind::kKeyNotice: return "key-notice";
    case MessageKind::kUpdate: return "update";
    case MessageKind::kGossip: return "gossip";
    case MessageKind::kGossipReply: return "gossip-reply";
    case MessageKind::kControl: return "control";
    case MessageKind::kLanReduce: return "lan-reduce";
    case MessageKind::kLanBroadcast: return "lan-broadcast";
    case MessageKind::kShard: return "shard";
    case MessageKind::kReduced: return "reduced";
    case MessageKind::kPart: return "part";
    case MessageKind::kRelayed: return "relayed";
  }
  return "unknown";
}

uint64_t jobIdHash(std::string_view jobId) {
  uint64_t hash = 0xcbf29ce484222325ull;  // FNV-1a 64-bit offset basis
  for (char c : jobId) {
    hash ^= static_cast<unsigned char>(c);
    hash *= 0x100000001b3ull;  // FNV-1a 64-bit prime
  }
  return hash;
}

void encodeFrameHeader(const FrameHeader& h, std::span<std::byte, kFrameHeaderBytes> out) {
  storeLe<uint32_t>(out, kOffMagic, kFrameMagic);
  storeLe<uint16_t>(out, kOffVersion, kFrameVersion);
  storeLe<uint16_t>(out, kOffKind, static_cast<uint16_t>(h.kind));
  storeLe<uint64_t>(out, kOffJobHash, h.jobHash);
  storeLe<uint64_t>(out, kOffRound, h.round);
  storeLe<uint64_t>(out, kOffStep, h.step);
  storeLe<uint32_t>(out, kOffSender, h.sender);
  storeLe<uint16_t>(out, kOffCodec, static_cast<uint16_t>(h.codec));
  storeLe<uint16_t>(out, kOffFlags, h.flags);
  storeLe<uint64_t>(out, kOffElementCount, h.elementCount);
  storeLe<uint64_t>(out, kOffPayloadBytes, h.payloadBytes);
  storeLe<uint64_t>(out, kOffPayloadOffset, h.payloadOffset);
}

StatusOr<FrameHeader> decodeFrameHeader(std::span<const std::byte> header, uint64_t chunkBytes,
                                        const FrameLimits& limits) {
  // Size first: every later read is in bounds only because of this check.
  if (header.size() != kFrameHeaderBytes) {
    return headerError(StatusCode::kDataLoss,
                       fmt::format("size is {} bytes, expected exactly {} (truncated or not a "
                                   "geotrain header frame)",
                                   header.size(), kFrameHeaderBytes));
  }

  const uint32_t magic = loadLe<uint32_t>(header, kOffMagic);
  if (magic != kFrameMagic) {
    return headerError(StatusCode::kInvalidArgument,
                       fmt::format("magic is {:#010x}, expected {:#010x} (\"GEOT\"): not a "
                                   "geotrain frame",
                                   magic, kFrameMagic));
  }

  // The version is checked before any other field: another version may lay
  // the rest of the header out differently.
  const uint16_t version = loadLe<uint16_t>(header, kOffVersion);
  if (version != kFrameVersion) {
    return headerError(StatusCode::kInvalidArgument,
                       fmt::format("version {} is not supported; this build speaks version {} "
                                   "(are all workers running the same geotrain release?)",
                                   version, kFrameVersion));
  }

  const uint16_t kind = loadLe<uint16_t>(header, kOffKind);
  if (!isKnownKind(kind)) {
    return headerError(
        StatusCode::kInvalidArgument,
        fmt::format(
            "kind {} is not a known message kind (ping=1, pong=2, hello=4, ack=5, warmup=6, "
            "update=16, gossip=17, gossip-reply=18, control=19, "
            "lan-reduce=20, lan-broadcast=21)",
            kind));
  }

  const uint64_t jobHash = loadLe<uint64_t>(header, kOffJobHash);
  if (jobHash != limits.jobHash) {
    return headerError(StatusCode::kPermissionDenied,
                       fmt::format("jobHash {:#018x} does not match this job's {:#018x}: the "
                                   "frame belongs to another training job",
                                   jobHash, limits.jobHash));
  }

  const uint32_t sender = loadLe<uint32_t>(header, kOffSender);
  if (sender >= limits.worldSize) {
    return headerError(StatusCode::kInvalidArgument,
                       fmt::format("sender {} is out of range: ranks must be below the world "
                                   "size {}",
                                   sender, limits.worldSize));
  }

  const uint16_t codec = loadLe<uint16_t>(header, kOffCodec);
  if (codec > kMaxCodecId) {
    return headerError(StatusCode::kInvalidArgument,
                       fmt::format("codec {} is not supported (raw=0, fp32=1, fp16=2, bf16=3, "
                                   "qsgd=4)",
                                   codec));
  }

  const uint16_t flags = loadLe<uint16_t>(header, kOffFlags);
  if ((flags & ~kKnownFrameFlags) != 0) {
    return headerError(StatusCode::kInvalidArgument,
                       fmt::format("flags at offset {} are {:#06x}: only {:#06x} (control lane, "
                                   "striped) are defined",
                                   kOffFlags, flags, kKnownFrameFlags));
  }

  const uint64_t payloadBytes = loadLe<uint64_t>(header, kOffPayloadBytes);
  if (payloadBytes > limits.maxPayloadBytes) {
    return headerError(StatusCode::kInvalidArgument,
                       fmt::format("payloadBytes {} exceeds the limit of {} bytes", payloadBytes,
                                   limits.maxPayloadBytes));
  }
  // Written without an addition, so that no offset, however large, overflows.
  const uint64_t payloadOffset = loadLe<uint64_t>(header, kOffPayloadOffset);
  if (payloadOffset > payloadBytes || chunkBytes > payloadBytes - payloadOffset) {
    return headerError(StatusCode::kDataLoss,
                       fmt::format("a chunk of {} bytes at payloadOffset {} does not fit in "
                                   "payloadBytes {}",
                                   chunkBytes, payloadOffset, payloadBytes));
  }
  if (chunkBytes == 0 && payloadBytes != 0) {
    return headerError(StatusCode::kInvalidArgument,
                       fmt::format("an empty chunk at payloadOffset {} of a payload of {} bytes: "
                                   "only an empty payload has an empty chunk",
                                   payloadOffset, payloadBytes));
  }

  if ((flags & kFrameFlagControlLane) != 0 && chunkBytes != payloadBytes) {
    return headerError(StatusCode::kInvalidArgument,
                       fmt::format("a control-lane frame carries its whole payload in one chunk; "
                                   "this one has {} of {} bytes at payloadOffset {}",
                                   chunkBytes, payloadBytes, payloadOffset));
  }

  if ((flags & kFrameFlagStriped) != 0 &&
      ((flags & kFrameFlagControlLane) != 0 || payloadBytes == 0)) {
    return headerError(StatusCode::kInvalidArgument,
                       fmt::format("flags {:#06x}: a striped chunk belongs to a data payload of at "
                                   "least one byte, never to the control lane (payloadBytes {})",
                                   flags, payloadBytes));
  }

  const uint64_t elementCount = loadLe<uint64_t>(header, kOffElementCount);
  GEO_RETURN_IF_ERROR(checkElementCount(static_cast<CodecId>(codec), elementCount, payloadBytes));

  FrameHeader h;
  h.kind = static_cast<MessageKind>(kind);
  h.jobHash = jobHash;
  h.round = loadLe<uint64_t>(header, kOffRound);
  h.step = loadLe<uint64_t>(header, kOffStep);
  h.sender = sender;
  h.codec = static_cast<CodecId>(codec);
  h.flags = flags;
  h.elementCount = elementCount;
  h.payloadBytes = payloadBytes;
  h.payloadOffset = payloadOffset;
  return h;
}

namespace {

constexpr std::string_view kHelloPrefix = "settings ";

// "key = value" lines in order; a line without " = " is its own key, valueless.
std::vector<std::pair<std::string_view, std::string_view>> settingLines(std::string_view text) {
  std::vector<std::pair<std::string_view, std::string_view>> lines;
  while (!text.empty()) {
    const size_t end = text.find('\n');
    const std::string_view line = text.substr(0, end);
    text = end == std::string_view::npos ? std::string_view() : text.substr(end + 1);
    if (line.empty()) continue;
    const size_t eq = line.find(" = ");
    if (eq == std::string_view::npos) {
      lines.emplace_back(line, std::string_view());
    } else {
      lines.emplace_back(line.substr(0, eq), line.substr(eq + 3));
    }
  }
  return lines;
}

std::optional<std::string_view> valueOf(
    const std::vector<std::pair<std::string_view, std::string_view>>& lines, std::string_view key) {
  for (const auto& [k, v] : lines) {
    if (k == key) return v;
  }
  return std::nullopt;
}

}  // namespace

std::string encodeHello(std::string_view settings) {
  return fmt::format("{}{:016x}\n{}", kHelloPrefix, jobIdHash(settings), settings);
}

std::optional<SettingsDisagreement> compareHello(std::string_view hello,
                                                 std::string_view ourSettings) {
  const size_t firstLine = hello.find('\n');
  if (!hello.starts_with(kHelloPrefix) || firstLine == std::string_view::npos) {
    return SettingsDisagreement{"hello", "no settings", "settings"};
  }
  const std::string_view theirs = hello.substr(firstLine + 1);
  const std::string_view hash = hello.substr(kHelloPrefix.size(), firstLine - kHelloPrefix.size());
  if (hash == fmt::format("{:016x}", jobIdHash(ourSettings)) && theirs == ourSettings) {
    return std::nullopt;
  }
  const auto ourLines = settingLines(ourSettings);
  const auto theirLines = settingLines(theirs);
  const auto shown = [](std::optional<std::string_view> v) {
    return v ? std::string(*v) : std::string("(not set)");
  };
  for (const auto& [key, value] : ourLines) {
    const auto other = valueOf(theirLines, key);
    if (!other || *other != value)
      return SettingsDisagreement{std::string(key), shown(other), std::string(value)};
  }
  for (const auto& [key, value] : theirLines) {
    if (!valueOf(ourLines, key)) {
      return SettingsDisagreement{std::string(key), std::string(value), "(not set)"};
    }
  }
  // Same lines in another order, or a hash that does not match its text.
  return SettingsDisagreement{"settings", std::string(theirs), std::string(ourSettings)};
}

}  // namespace geo::transport
