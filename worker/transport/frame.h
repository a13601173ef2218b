#pragma once
// The geotrain wire frame: a fixed, versioned 64-byte binary header followed
// by the payload. A payload travels as one or more ZeroMQ messages of two
// frames each, [header][chunk], sent in order on one connection: the chunk at
// byte payloadOffset of a payload of payloadBytes. A payload no larger than
// the sender's chunk size is one message (offset 0, the whole payload; an
// empty payload is one empty chunk); a larger one is cut into chunks of that
// size, each with its own header that differs only in payloadOffset. Senders
// use kMaxChunkBytes, and smaller chunks across the WAN
// (TransportConfig::wanChunkBytes); receivers take any size up to the max.
// The sender slices the payload into chunks without copying it; the
// receiver (PayloadAssembler) copies each chunk into place as it arrives and
// lets the chunk go, so neither end ever holds a large payload twice, and no
// ZeroMQ message is larger than a chunk.
//
// Why chunks are messages rather than frames of one multipart message:
// ZeroMQ delivers a multipart message only once all of its frames are in, so
// a receiver held every frame of a 64 MiB payload (and ZeroMQ allocated them
// all) before it could copy any out; those allocations were freed and faulted
// in again for every payload, a quarter of the receiver's time on a VM
// (geo_transport_bench, docs/wan-emulation.md).
//
// Header layout (little-endian, packed, kFrameHeaderBytes = 64):
//   off size field
//     0    4 magic            kFrameMagic ("GEOT")
//     4    2 version          kFrameVersion
//     6    2 kind             MessageKind
//     8    8 jobHash          jobIdHash(job id): frames of another job are refused
//    16    8 round            synchronization round
//    24    8 step             sender's optimizer step when produced
//    32    4 sender           sender rank, < world size
//    36    2 codec            CodecId of the payload
//    38    2 flags            kFrameFlag* bits (version 3; reserved and 0
//                             in version 2); unknown bits are refused
//    40    8 elementCount     values encoded in the payload
//    48    8 payloadBytes     length of the whole payload
//    56    8 payloadOffset    where this message's chunk starts in the payload
//                             (version 2; reserved and 0 in version 1)
//
// decodeFrameHeader validates every field against what the receiver expects
// and returns a Status that names the field, the value and what was allowed.
// It never reads outside the given bytes and never throws. The code tells the
// caller what kind of failure it was:
//   kDataLoss          the bytes are not what the sender wrote: a header frame
//                      that is not 64 bytes, or a chunk that does not fit in
//                      the payload at its offset;
//   kPermissionDenied  a well-formed frame of another job (jobHash differs);
//   kInvalidArgument   everything else: bad magic, an unsupported version,
//                      kind or codec, an unknown flag, a sender rank
//                      outside the world, payloadBytes above the limit, an
//                      elementCount that does not fit the codec, or an empty
//                      chunk of a payload that is not empty.
// Size, magic and version are checked before anything else, so a frame of
// another protocol version is reported as such rather than as garbage.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "common/status.h"

namespace geo::transport {

inline constexpr uint32_t kFrameMagic = 0x544F4547u;  // "GEOT" little-endian
inline constexpr uint16_t kFrameVersion = 3;
// Frame flags (FrameHeader::flags).
// kFrameFlagControlLane: the frame came on the sender's probe connection
// (SendMeta::controlLane), not its data connection, so it is ordered only
// with the sender's other control-lane frames and may overtake data sent
// before it. It is not acknowledged (kAck acknowledges a data connection's
// chunks, in their order). Always a whole payload in one chunk.
inline constexpr uint16_t kFrameFlagControlLane = 1;
// kFrameFlagStriped: a chunk of a payload striped over several of the
// sender's data connections (TransportConfig::connections). Its chunks may
// arrive in any order, each on any of those connections, once or more
// (the sender sends again what a dropped connection held); the receiver
// puts them in place by payloadOffset (StripeAssembler). The payload's last
// chunk (the one that ends at payloadBytes) always travels on the sender's
// first data connection, after every other chunk has been handed to a
// connection: that chunk is the payload's place in the order of the
// sender's messages. Never with the control lane; never an empty payload.
inline constexpr uint16_t kFrameFlagStriped = 2;
inline constexpr uint16_t kKnownFrameFlags = kFrameFlagControlLane | kFrameFlagStriped;
// The largest chunk a sender puts in one message (the last one may be
// shorter). Receivers refuse larger ZeroMQ frames (ZMQ_MAXMSGSIZE). CURVE
// encrypts each message into a buffer of its own, and buffers below glibc's
// 32 MiB mmap ceiling are recycled by malloc instead of being mapped, faulted
// in and unmapped for every message (64 MiB frames ran at half the
// throughput); encrypting one chunk also overlaps sending the previous one.
inline constexpr size_t kMaxChunkBytes = size_t{1} << 22;
inline constexpr size_t kFrameHeaderBytes = 64;

// Message kinds. Values below kFirstUserKind are the transport's own.
enum class MessageKind : uint16_t {
  kPing = 1,  // payload: 8-byte sender timestamp (ns)
  kPong = 2,  // payload: the ping's 8 bytes, echoed
  // The first frame on every connection (and again after a reconnect): the
  // settings every rank must share, compared by the receiver (zmq_transport.h,
  // TransportConfig::agreedSettings). Payload: encodeHello's text.
  kHello = 4,
  // A receiver's acknowledgement of the data it has taken from a sender: the
  // latest chunk received (header round and step; payload: the chunk's kind,
  // payloadOffset and payloadBytes, three little-endian u64). Chunks travel
  // in order, so it acknowledges every chunk before it too.
  kAck = 5,
  // Padding a sender writes to each WAN peer as it starts
  // (TransportConfig::warmupBytes), so that TCP's congestion window has
  // opened before the first rounds need it. The receiver drops it (it is
  // never delivered) and acknowledges it as data, so that the sender sees
  // its data connection move from the start: a first round queued behind
  // the padding shows as crossing, not as silence.
  kWarmup = 6,
  // Key rotation: a sender's new public key (payload: its 40 Z85
  // characters), sent on its probe connection just before its listener
  // takes the new key (Transport::updateKeys), so that the receiver
  // connects to it with that key at once instead of finding it out by a
  // failed handshake (two round trips and more on a far link).
  kKeyNotice = 7,
  kUpdate = 16,        // a (compressed) model update or gradient
  kGossip = 17,        // SwarmSGD pairwise model exchange
  kGossipReply = 18,   // the partner's half of a gossip exchange
  kControl = 19,       // small synchronizer control messages
  kLanReduce = 20,     // hierarchical sync: a member's gradient to its region leader
  kLanBroadcast = 21,  // hierarchical sync: the leader's result back to its members
  // DTS's reduce-scatter exchange (sync.exchange): a worker's contribution
  // to the shard its receiver owns (header.elementCount: the shard's
  // values), and an owner's mean of its shard over the round's
  // contributions, to every other worker.
  kShard = 22,
  kReduced = 23,
  // Reduce-scatter with an owner lost for the round (suspected, finished
  // or joining): a worker's part of that owner's shard, to every other
  // worker but the owner, which each then averages itself. Payload: the
  // shard's bounds [lo, hi) as two little-endian u64, then the part in the
  // round's codec; the frame's codec is kRaw.
  kPart = 24,
  // Reduce-scatter, the answer to a kPart from a worker that holds the
  // lost owner's mean of that shard for the round (the owner's kReduced,
  // or one relayed to it): that mean, so that the worker that lost the
  // owner applies the bytes the others applied rather than averaging the
  // shard itself. Payload: the shard's bounds as kPart's, then the
  // owner's kReduced payload; the frame's step is the owner's (its close
  // of the round) and its codec kRaw.
  kRelayed = 25,
};
inline constexpr uint16_t kMaxMessageKind = 25;
bool isKnownKind(uint16_t kind);
std::string_view messageKindName(MessageKind kind);

// Payload encodings. The ids, and the size each promises for n values, are
// part of the wire protocol, so they live here with the header that carries
// them: this file is the wire-protocol layer that the transport (which checks
// every header before a codec sees its payload) and worker/codec (which
// implements each encoding) both depend on, and it depends on neither
// (docs/architecture.md section 2). A new codec takes the next id here, its
// width in codecValueBytes(), and its encoding in worker/codec.
enum class CodecId : uint16_t {
  kRaw = 0,  // opaque bytes; elementCount == payloadBytes
  kFp32 = 1,
  kFp16 = 2,
  kBf16 = 3,
  kQsgd = 4,  // kernels/qsgd.h layout; bits and bucket size come from the job config
};
inline constexpr uint16_t kMaxCodecId = 4;

// Bytes per value of a fixed-width encoding (a payload of n values is exactly
// n times this); 0 for kQsgd, whose size depends on the job's bits and bucket
// size and is at least kMinQsgdBitsPerValue bits per value.
constexpr uint64_t codecValueBytes(CodecId codec) {
  switch (codec) {
    case CodecId::kRaw: return 1;
    case CodecId::kFp32: return 4;
    case CodecId::kFp16: return 2;
    case CodecId::kBf16: return 2;
    case CodecId::kQsgd: return 0;
  }
  return 0;
}
inline constexpr uint64_t kMinQsgdBitsPerValue = 2;

struct FrameHeader {
  MessageKind kind = MessageKind::kUpdate;
  uint64_t jobHash = 0;
  uint64_t round = 0;
  uint64_t step = 0;
  uint32_t sender = 0;
  CodecId codec = CodecId::kRaw;
  uint16_t flags = 0;  // kFrameFlag* bits
  uint64_t elementCount = 0;
  uint64_t payloadBytes = 0;   // the whole payload
  uint64_t payloadOffset = 0;  // where this message's chunk starts in it
};

// Whether two chunks' headers name the same payload: the fields every chunk
// of one payload repeats unchanged (kind, round, step, codec, element count
// and size), the sender aside.
inline bool samePayload(const FrameHeader& a, const FrameHeader& b) {
  return a.kind == b.kind && a.round == b.round && a.step == b.step && a.codec == b.codec &&
         a.elementCount == b.elementCount && a.payloadBytes == b.payloadBytes;
}

// 64-bit FNV-1a of the job id: cheap, stable across builds and hosts.
uint64_t jobIdHash(std::string_view jobId);

// Writes the 64 header bytes of `h` into `out` (which must hold
// kFrameHeaderBytes).
void encodeFrameHeader(const FrameHeader& h, std::span<std::byte, kFrameHeaderBytes> out);

// What a receiver accepts.
struct FrameLimits {
  uint64_t jobHash = 0;
  uint32_t worldSize = 1;
  uint64_t maxPayloadBytes = uint64_t{1} << 31;
};

// Parses and validates a header frame. `chunkBytes` is the size of the chunk
// that came with it: payloadOffset + chunkBytes must not pass the header's
// payloadBytes, and a chunk is empty only when the payload is.
// For kRaw / kFp32 / kFp16 / kBf16 the element count must match the payload
// size exactly (codecValueBytes: 1, 4, 2, 2 bytes per value); for kQsgd,
// whose exact size depends on the job's bits and bucket size, it must satisfy
// ceil(elementCount * 2 / 8) <= payloadBytes (kMinQsgdBitsPerValue at least).
// Returns the header or an error naming the field, its value and what is
// allowed.
StatusOr<FrameHeader> decodeFrameHeader(std::span<const std::byte> header, uint64_t chunkBytes,
                                        const FrameLimits& limits);

// The hello (MessageKind::kHello) payload: settings that every rank of a job
// must share, as canonical text, one "key = value" line each in an order the
// writer fixes, e.g. "sync.algorithm = dts\nsync.bits = 4\n". On the wire it
// is preceded by one line "settings <hash>" (16 hex digits of FNV-1a over the
// text), so that equal settings are recognised by the hash alone.
std::string encodeHello(std::string_view settings);

// One setting on which two ranks disagree; a value is "(not set)" when that
// side has no line for the key.
struct SettingsDisagreement {
  std::string key;
  std::string theirs;
  std::string ours;
};

// Compares a received hello payload with this rank's settings text: nullopt
// when they agree, else the first disagreeing key in this rank's order (then
// keys only the peer has). A payload that is no hello at all (no "settings"
// line) disagrees on the key "hello". Pure; never throws.
std::optional<SettingsDisagreement> compareHello(std::string_view hello,
                                                 std::string_view ourSettings);

}  // namespace geo::transport
