#pragma once
// Transport / Peer: how the workers of one job exchange frames.
//
// A Transport is one worker's endpoint in a full mesh of `worldSize` workers
// (ranks 0..worldSize-1). It sends framed messages (worker/transport/frame.h)
// to a peer and lets the caller wait for a message of a given (kind, round),
// optionally from a given sender. Messages from one sender to one receiver
// arrive in order (those on the control lane, SendMeta::controlLane, in an
// order of their own); delivery is at most once (a message in flight when its
// peer dies is lost) -- the synchronizers tolerate missing contributions.
//
// Ownership: send() takes the payload and frees it once the bytes are on the
// wire (no copy on the way). receive() hands out the received buffer (no copy).
//
// Threading: send(), receive() and the counters may be called from any number
// of threads at once. All socket work happens on one I/O thread owned by the
// Transport; destroying the Transport stops it (pending sends get up to the
// configured linger time to leave) and wakes blocked callers.
//
// Errors: nothing throws. send() returns InvalidArgument (bad peer, payload too
// large, a control-lane payload above kMaxControlLaneBytes), DeadlineExceeded (the peer's bounded
// queue stayed full for the whole timeout: backpressure) or Cancelled (closed). receive() returns
// DeadlineExceeded when nothing matched in time, Cancelled when closed.
// Malformed or unauthorised incoming frames and connections never reach
// receive(); they are counted (TransportCounters) and logged, rate-limited:
// the first 10 of each kind, then every 1000th.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "worker/transport/frame.h"

namespace geo::transport {

// An immutable byte buffer with a type-erased owner: a std::vector handed to
// send(), or the ZeroMQ message a frame arrived in.
class Payload {
 public:
  Payload() = default;
  explicit Payload(std::vector<std::byte> bytes);
  Payload(std::shared_ptr<const void> owner, std::span<const std::byte> bytes)
      : owner_(std::move(owner)), bytes_(bytes) {}
  static Payload copyOf(std::span<const std::byte> bytes);

  std::span<const std::byte> bytes() const { return bytes_; }
  const std::byte* data() const { return bytes_.data(); }
  size_t size() const { return bytes_.size(); }
  const std::shared_ptr<const void>& owner() const { return owner_; }

 private:
  std::shared_ptr<const void> owner_;
  std::span<const std::byte> bytes_;
};

struct Message {
  FrameHeader header;
  Payload payload;
  // When the whole payload had arrived (the I/O thread's steady clock), not
  // when the caller took it: how late a message was, measured to the
  // millisecond whatever the caller's polling interval.
  std::chrono::steady_clock::time_point received{};
};

// Header fields the caller chooses; kind, sender, job hash and payload length
// are filled in by the transport.
struct SendMeta {
  uint64_t round = 0;
  uint64_t step = 0;
  CodecId codec = CodecId::kRaw;
  uint64_t elementCount = 0;  // kRaw: set to the payload size when 0
  // The control lane: the message goes on the connection that carries the
  // probes (pings, pongs, acknowledgements), so nothing queued for the peer
  // delays it -- not our data queue, nor ZeroMQ's, nor the kernel's socket
  // buffer, nor TCP's slow start behind a large payload. The price is order:
  // it may overtake any message sent before it without the flag (messages on
  // the lane keep their order among themselves). For small messages whose
  // meaning does not depend on the data before them (a join's question and
  // answer); at most kMaxControlLaneBytes. Delivery is at most once, as for
  // the rest: it waits in a short queue of its own until the connection is up,
  // and is lost with a connection that fails or under a partition.
  bool controlLane = false;
};
// The largest payload SendMeta::controlLane takes (one chunk, never cut).
inline constexpr size_t kMaxControlLaneBytes = 4096;

// The header send() puts in front of a payload of `payloadBytes`: the
// caller's fields (meta), the kind, the job's hash and the sender's rank; a
// raw payload whose meta names no element count counts its bytes.
inline FrameHeader headerFor(MessageKind kind, const SendMeta& meta, uint64_t jobHash,
                             uint32_t sender, uint64_t payloadBytes) {
  FrameHeader h;
  h.kind = kind;
  h.jobHash = jobHash;
  h.round = meta.round;
  h.step = meta.step;
  h.sender = sender;
  h.codec = meta.codec;
  h.elementCount =
      meta.codec == CodecId::kRaw && meta.elementCount == 0 ? payloadBytes : meta.elementCount;
  h.payloadBytes = payloadBytes;
  return h;
}

inline constexpr uint32_t kAnyPeer = 0xffffffffu;
// Ping round trips PeerCounters::minRttSeconds looks back on.
inline constexpr size_t kMinRttWindow = 16;

struct PeerCounters {
  uint32_t peer = 0;
  uint64_t bytesSent = 0;  // header + payload bytes handed to the socket
  uint64_t bytesReceived = 0;
  uint64_t messagesSent = 0;
  uint64_t messagesReceived = 0;
  uint64_t reconnects = 0;  // connections re-established after the first
  double rttSeconds = -1;   // last ping round trip, -1 before the first
  // The smallest of the recent ping round trips (the last kMinRttWindow):
  // the path's propagation without its queues, as BBR's min_rtt is. Pings
  // travel on a connection of their own, never behind data, so only the
  // network's own queue can delay them, and not for long. -1 before the
  // first.
  double minRttSeconds = -1;
  uint64_t queuedBytes = 0;  // accepted by send(), not yet on the wire
  // Of those, the messages still waiting for the link: not yet taken by
  // ZeroMQ or, under link emulation, not yet through the emulated uplink and
  // link rate (messages past them are in flight on the link's delay).
  uint64_t backlogBytes = 0;
  // Data handed to the network (ZeroMQ, the kernel's socket buffer, the
  // path) that the peer has not acknowledged yet, and how long ago the
  // oldest of it was handed over (0 when none). What queues below the
  // transport -- a socket buffer that took megabytes at once, a slow
  // uplink's queue -- shows here, and nowhere else.
  uint64_t unackedBytes = 0;
  double unackedSeconds = 0;
  // Seconds since the peer last acknowledged data; -1: it never has.
  double sinceAckSeconds = -1;
  // Data the peer has acknowledged since the transport opened (header and
  // payload bytes, as bytesSent counts them): what the path carried, where
  // bytesSent counts what was handed to it. Over a time the path was busy
  // throughout, its growth summed over the peers is the uplink's rate, which
  // a socket buffer's or a queue's contents do not inflate.
  uint64_t ackedBytes = 0;
  // Liveness: every frame from the peer counts, and pings run every
  // pingInterval from the I/O thread whatever the caller does, so a live but
  // busy peer is heard at least that often. silentSeconds is the time since
  // its last frame, or since the transport started when `heard` is false.
  bool heard = false;
  double silentSeconds = 0;
};

struct TransportCounters {
  uint64_t refusedKeys = 0;  // CURVE clients whose key is not allowed (ZAP)
  // Other inbound connections that never completed a handshake: no CURVE, a
  // ZMTP error, closed or timed out half-way, or not ZMTP at all (a port
  // scanner, an HTTP request).
  uint64_t handshakeFailures = 0;
  uint64_t framesRejected = 0;    // malformed / foreign / spoofed frames, broken payloads
  uint64_t partitionDropped = 0;  // frames dropped by an emulated partition (both ways)
  std::string lastRejectReason;
};

// A running transport's CURVE keys, for key rotation without a restart
// (docs/security.md, "Rotating keys").
struct KeySet {
  std::string secretKey;  // this rank's Z85 secret key
  // publicKeys[r]: the Z85 public keys rank r is admitted with, the one it
  // uses now first, then its others (during a rotation's overlap: its next
  // key before it switches, its previous one after). A connection to rank
  // r is made with its first key as r's server key; one whose handshake
  // fails before completing tries r's next key, and so on round the list.
  // publicKeys[rank()][0] is secretKey's public key.
  std::vector<std::vector<std::string>> publicKeys;
};

// What receive() returns for a poll (a timeout of 0) that finds nothing:
// the same constant status from every transport, formatted for no one
// (the synchronizers poll every peer's kinds several times a step).
inline Status nothingWaiting() {
  return Status(StatusCode::kDeadlineExceeded, "transport: nothing waiting (a poll)");
}

class Transport {
 public:
  virtual ~Transport() = default;

  virtual uint32_t rank() const = 0;
  virtual uint32_t worldSize() const = 0;

  // Queues `payload` for `peer` (!= rank()) and returns without waiting for
  // the network, unless the peer's queue is full: then it waits up to
  // `timeout` for room.
  virtual Status send(uint32_t peer, MessageKind kind, const SendMeta& meta, Payload payload,
                      std::chrono::milliseconds timeout) = 0;

  // Waits up to `timeout` for a message of `kind` and `round` from `from`
  // (kAnyPeer: any sender) and removes it from the inbox. A timeout of 0 is
  // a poll: it looks without waiting and costs no system call (the
  // synchronizers poll several times a step, on the training thread). A
  // wait that runs out says DeadlineExceeded naming what it waited for; a
  // poll that finds nothing says DeadlineExceeded and no more (nothing is
  // formatted for it: a wait for a round polls every peer's kinds).
  virtual StatusOr<Message> receive(MessageKind kind, uint64_t round, uint32_t from,
                                    std::chrono::milliseconds timeout) = 0;

  // How many messages have reached the inbox since the transport opened,
  // of any kind. With awaitArrival it makes a wait that wakes on the next
  // arrival: read it, poll what the caller needs, then awaitArrival(read).
  // Whatever came between the read and the wait ends the wait at once, so
  // nothing that arrives after the polls is slept through.
  virtual uint64_t arrivals() const = 0;
  // Waits up to `timeout` until arrivals() exceeds `seen` or the transport
  // closes, and returns whether a message came. Takes nothing from the
  // inbox. A synchronizer that waits on messages of several kinds and
  // rounds at once waits here rather than poll them on a short timer: on
  // a machine with more busy threads than cores the polls take the core
  // from a worker that would compute.
  virtual bool awaitArrival(uint64_t seen, std::chrono::milliseconds timeout) = 0;

  // Removes every inbox message for which `match` returns true and returns
  // how many went. Synchronizers use it for messages they will never ask for
  // (rounds long completed, the traffic of a peer's earlier incarnation), so
  // that the inbox cannot fill with them.
  virtual size_t discard(const std::function<bool(const FrameHeader&)>& match) = 0;

  // Link emulation: while `cut` is true, every frame to or from a rank of
  // another region (TransportConfig::uplinkPeers) is dropped, pings included,
  // as a severed WAN link would lose them; queued frames to them that have
  // not started leaving are dropped at once. Sends still return OK (a sender
  // cannot tell a partition from a slow link). Counted in partitionDropped.
  virtual void setPartitioned(bool cut) = 0;
  // Link emulation: the shared uplink (TransportConfig::uplink) carries
  // `bytesPerSecond` from now on (0: unlimited), as when a WAN link's
  // available bandwidth changes. Frames already scheduled keep their times.
  virtual void setUplinkRate(double bytesPerSecond) = 0;

  // A snapshot of every peer's counters: cheap (no system call), for the
  // training thread's polls several times a step.
  virtual std::vector<PeerCounters> peerCounters() const = 0;

  // Of the data handed to the network for `peer`, the bytes that have not
  // left this machine yet: in ZeroMQ's pipe or the kernel's send buffer,
  // behind what is on the path (the kernel's own count of bytes its peer
  // acknowledged, TCP_INFO; the data connection only, not a striped
  // payload's extra connections). Unlike PeerCounters::unackedBytes it does
  // not wait for the peer's own acknowledgements, which on the peer's
  // saturated uplink come seconds late while our data flows. Asks the
  // kernel (two system calls), so not part of peerCounters(). 0 where the
  // transport cannot tell: no kernel to ask, or the in-memory network,
  // whose queue is PeerCounters::backlogBytes.
  virtual uint64_t queuedBelowBytes(uint32_t peer) const {
    (void)peer;
    return 0;
  }
  virtual TransportCounters counters() const = 0;

  // Replaces the keys (KeySet) without a restart, and returns once they are
  // in force. From then on a connection is admitted only with a key in
  // `keys` (its rank's), and the frames of a connection made earlier with
  // a key no longer there are refused (counted in framesRejected). A new
  // secret key of this rank re-makes the listener, which closes every
  // connection made to it so far (each is made again, with the new key as
  // the server's: the peers are told it first, kKeyNotice), and makes this
  // rank's connections to its peers anew with it (the old ones get the
  // linger time to deliver what they hold). What a connection closed held
  // is lost, as in any reconnect (PeerCounters::reconnects counts them:
  // the synchronizers send their rounds in flight again). InvalidArgument
  // naming the rank and key for a set that is not one key list per rank,
  // a key that is not Z85, a key shared by two ranks, or a secret key whose
  // public key is not this rank's first; the keys in force stay then.
  virtual Status updateKeys(const KeySet& keys) = 0;
};

}  // namespace geo::transport
