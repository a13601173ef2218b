#pragma once
// What the kernel's TCP says of one connection (Linux TCP_INFO), so that the
// transport can tell a connection that is stuck from one that is only slow.
//
// The transport's own acknowledgements of data chunks travel back on the
// peer's probe connection, across the peer's uplink. When that uplink is
// saturated and losing packets (every worker sending a model-sized payload
// to every other at once: allreduce fp32, a state transfer to several
// joiners), a thin flow such as the probes' loses a packet now and then
// that only its retransmission timer recovers, backing off each time: the
// peer's acknowledgements come seconds late while our data connection
// delivers megabytes a second. The peer's kernel acknowledges every
// segment it receives, whatever its process or its uplink queue do, so its
// ACKs say whether our data crosses.

#include <cstdint>
#include <optional>

namespace geo::transport {

struct TcpProgress {
  bool established = false;
  // Bytes the kernel holds for the connection: sent and not yet
  // acknowledged by the peer's kernel (in segments), and not yet sent.
  uint32_t unackedSegments = 0;
  uint32_t notSentBytes = 0;
  // Since the kernel last received an ACK on the connection, and last sent
  // data (a retransmission included) on it.
  double sinceAckSeconds = 0;
  double sinceSendSeconds = 0;
  // Retransmission timeouts in a row without an ACK (the timer's back-off),
  // and the retransmission timer as backed off: the kernel sends again at
  // most this long after it last sent.
  uint32_t backoff = 0;
  double rtoSeconds = 0;
  // Bytes the peer's kernel has acknowledged on the connection since it
  // opened (ZeroMQ's handshake and framing included), and the segment size:
  // with unackedSegments, where a byte handed to the socket stands
  // (queuedAheadBytes).
  uint64_t bytesAcked = 0;
  uint32_t sendMss = 0;
  bool countsBytes = false;  // the kernel fills tcpi_bytes_acked (Linux 4.1 on)

  // The kernel has bytes of ours that the peer's kernel has not acknowledged.
  bool outstanding() const { return unackedSegments > 0 || notSentBytes > 0; }
  // How soon the kernel tries again at the latest: its timer less the time
  // since it last sent (0 when due).
  double retryInSeconds() const {
    return rtoSeconds > sinceSendSeconds ? rtoSeconds - sinceSendSeconds : 0;
  }
};

// The kernel's view of the TCP connection on descriptor `fd`; nullopt when
// `fd` is not a TCP socket whose remote port is `peerPort` (0: any port) --
// a descriptor closed and reused for something else since it was learned --
// or TCP_INFO is not available. Any thread; never blocks.
std::optional<TcpProgress> tcpProgress(int fd, uint16_t peerPort = 0);

// A connection with bytes of ours outstanding whose last ACK is under
// `ackWithinSeconds` old and whose kernel sends again within
// `retryWithinSeconds`: its packets wait in full queues (or were lost in
// them, and the timer has not backed off far), and the peer's kernel
// acknowledges them as they arrive -- a busy path, not a cut one. The rules
// below, and the transport's for a connection unacknowledged while its peer
// is heard, differ only in the bounds.
bool retransmitsSoon(const TcpProgress& k, double ackWithinSeconds, double retryWithinSeconds);

// Whether a connection's kernel contradicts the peer's silence of at least
// `boundSeconds` (the transport's reconnectAfter): the path carries our
// bytes, so the connection is kept rather than replaced (what it holds would
// be lost). The peer's acknowledgements and pings, thin flows across its own
// full uplink, come seconds late on a busy path while its kernel still
// acknowledges our data. A cut path shows as such within about twice the
// bound, as the ACKs stop and the retransmission timer backs off.
//
// The data connection vouches where the peer's kernel acknowledged it
// within the bound, or where it holds bytes of ours and its timer backed
// off at most once (a retransmission lost in a full queue), the last ACK
// less than 4 times the bound old and the next try due within twice the
// bound. TCP's timers do not scale with the bound: at a short one (0.5 s) a
// single time-out on a 100 ms path leaves a second without an ACK. A cut
// path backs off a second time three time-outs after its last ACK (1.3 s at
// a 230 ms round trip without queueing), so at the default bound (2 s) it is
// mostly replaced as soon as without the second clause, and at the latest
// when its timer backs off again.
bool dataVouchesThroughSilence(const TcpProgress& data, double boundSeconds);
// The probe connection (our pings, sent every ping interval whatever the
// peer says) vouches where acknowledged within the bound, or where our pings
// wait in full queues: the last ACK less than twice the bound old, and the
// retransmission due within twice the bound.
bool probeVouchesThroughSilence(const TcpProgress& probe, double boundSeconds);

// Of `handedBytes` handed to the connection since it opened, those that have
// not left yet: neither acknowledged by the peer's kernel nor in flight on
// the path (in ZeroMQ's pipe or the kernel's send buffer, behind what is
// on the path). What a new message queues behind before its first byte
// leaves. ZeroMQ's framing, counted by the kernel and not in `handedBytes`,
// makes it an underestimate by a few dozen bytes a message. 0 where the
// kernel does not count the bytes acknowledged.
uint64_t queuedAheadBytes(const TcpProgress& p, uint64_t handedBytes);

}  // namespace geo::transport
