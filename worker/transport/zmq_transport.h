#pragma once
// The ZeroMQ implementation of Transport: every worker binds one ROUTER socket
// and connects DEALERs to each peer -- one for data (or several, to a WAN
// peer, with TransportConfig::connections) and one for probes; all sockets
// live on one I/O thread.
// Every socket uses CurveZMQ (X25519 key agreement, XSalsa20-Poly1305 for
// every frame, through libsodium); a ZAP handler admits exactly the public keys
// of the job's ranks and tags each connection with its rank, so a frame whose
// header claims another sender is rejected.

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "worker/transport/link.h"
#include "worker/transport/transport.h"

namespace geo::transport {

// The most data connections one peer may be reached on
// (TransportConfig::connections).
inline constexpr size_t kMaxConnections = 16;

struct TransportConfig {
  std::string jobId;  // frames of other jobs are rejected (header job hash)
  uint32_t rank = 0;
  // endpoints[r]: where rank r's ROUTER is reached, e.g. "tcp://10.0.0.5:7000".
  // Empty for a rank other than this one: this rank never connects to it, and
  // send() to it fails (FailedPrecondition). Under hierarchical sync only the
  // region leaders are reachable across regions (a cluster exposes one gateway
  // per region), so another region's members have no endpoint.
  std::vector<std::string> endpoints;
  // Where this rank binds; empty: endpoints[rank]. In a pod: "tcp://*:7000".
  std::string bindEndpoint;

  std::string secretKey;                // this rank's Z85 secret key
  std::vector<std::string> publicKeys;  // publicKeys[r]: rank r's Z85 public key
  // Only honoured by the test-only library geo_transport_plaintext_testonly;
  // in every product build a config with encrypt = false is refused.
  bool encrypt = true;

  // links[r]: emulated link from this rank to rank r (empty: none).
  std::vector<LinkProfile> links;
  // An emulated uplink shared by the traffic to every rank r with
  // uplinkPeers[r] set (the WAN peers): a frame first waits for the uplink,
  // then for its link. Unshaped uplink, or empty uplinkPeers: none.
  LinkProfile uplink;
  std::vector<bool> uplinkPeers;
  // Partitions may be emulated above the sockets (setPartitioned: the fault
  // signals of `geotrain local` without --network netns). A cut peer's
  // kernel then acknowledges what its transport drops, so the stall rules
  // (reconnectAfter) cannot ask the kernel whether a path carries our bytes
  // and go by what the peers say alone. Implied by any emulated link or
  // uplink.
  bool emulatedPartitions = false;

  // Settings every rank must share (frame.h, encodeHello: "key = value"
  // lines), sent as the first frame to each peer and again after each
  // reconnect. A peer whose hello differs is refused: nothing it sends is
  // delivered any more (counted in framesRejected), and onDisagreement is
  // called once, on the I/O thread, with FailedPrecondition "peer <name>
  // (rank r) runs <key> = <theirs>, this worker <key> = <ours>": once this
  // rank's own hello has left for that peer, or after 3 s, so that a caller
  // that ends the process on it still lets the peer learn of it too. Empty: no
  // hello is sent and none is checked (a peer's hello is then ignored).
  std::string agreedSettings;
  std::function<void(const Status&)> onDisagreement;
  // rankNames[r]: how messages name rank r (e.g. its region); empty: "rank r".
  std::vector<std::string> rankNames;

  // The chunk size of payloads to WAN peers (uplinkPeers; at most
  // kMaxChunkBytes, which others get). A receiver hears a peer with every
  // chunk, so on a slow link a large payload in flight keeps its sender
  // alive in the receiver's eyes -- as one 4 MiB chunk, an 8 MB model is 16
  // s of silence at 4 Mbit/s, and its sender would be suspected. 64 KiB is
  // 0.13 s at 4 Mbit/s, and the per-message cost is lost in WAN bandwidth.
  size_t wanChunkBytes = size_t{64} << 10;
  // Data connections to each WAN peer (uplinkPeers), 1..kMaxConnections. A
  // payload of several chunks to such a peer is striped over them
  // (frame.h, kFrameFlagStriped): one TCP connection keeps at most its
  // receive window in flight, which the hosts' buffer limits cap
  // (net.ipv4.tcp_rmem; 6 MiB by default, 14% of a 1 Gbit/s link at 230
  // ms), and n connections carry n windows. Each is one more CURVE
  // handshake and socket at both ends. Messages still arrive in the order
  // sent (StripeAssembler). When one of them drops, or none of its data is
  // acknowledged for 2.5 reconnectAfter while the peer is heard, the chunks
  // it held go again on the others: nothing of a striped payload is lost
  // with one connection. 1: one data connection, as before.
  size_t connections = 1;
  // Padding (kWarmup frames, dropped by the receiver) sent to each WAN peer
  // after the first hello, as the transport starts. A fresh TCP connection
  // starts with a congestion window of 10 packets and doubles it each round
  // trip only while it has data to send: the first rounds' updates (100 KB
  // and more) took 3 round trips, 0.7 s on a 230 ms path, instead of one
  // -- which the automatic delay read as the link and the first seconds of
  // training paid for in staleness. Sent while the job starts (the join,
  // loading the data), the padding opens the window before that. Not after
  // a reconnect: the rounds resent then open it, and on a throttled link
  // padding would hold them back. 0: none.
  uint64_t warmupBytes = 0;
  uint64_t maxQueuedBytesPerPeer = uint64_t{1} << 30;  // send() backpressure
  uint64_t maxInboxBytes = uint64_t{2} << 30;          // stop reading beyond
  uint64_t maxPayloadBytes = uint64_t{1} << 31;        // larger frames are refused
  std::chrono::milliseconds pingInterval{1000};        // 0: no pings (no RTT)
  // A peer heard before that stays silent this long gets fresh connections
  // (ours to it: the data and the probe connection), and again every so
  // long while it stays silent. A connection that lost packets for a while
  // -- a partition, a link down -- resumes only when TCP's retransmission
  // timer fires, which backs off exponentially (after a 30 s cut, up to
  // half a minute more of silence); a new connection is up within a
  // connect. What was in the old connection's buffers is lost (delivery is
  // at most once). The same when the peer is heard but has not
  // acknowledged any of our data for 2.5 times this long while data is
  // outstanding: the data connection alone is stuck. Neither when the
  // connection's kernel says the peer's kernel still acknowledges our bytes
  // (TCP_INFO, tcp_state.h): on a saturated path the peer's pings and
  // acknowledgements come seconds late while our data flows, and replacing
  // the connection would lose what it carries. 0: never.
  std::chrono::milliseconds reconnectAfter{2000};
  // How long one connection attempt may take before it is abandoned and
  // tried again (ZMQ_CONNECT_TIMEOUT): without it a SYN lost in a partition
  // is retried by the kernel for minutes, with the same back-off.
  std::chrono::milliseconds connectTimeout{1000};
  std::chrono::milliseconds linger{2000};  // time queued sends get at shutdown
};

// Binds, connects and starts the I/O thread. Errors (bad config, key files
// that do not match, an endpoint already in use) come back as a Status that
// names the field or endpoint.
StatusOr<std::unique_ptr<Transport>> makeZmqTransport(TransportConfig config);

}  // namespace geo::transport
