// ZeroMQ transport. One I/O thread owns every socket: the ROUTER (inbound
// frames), one DEALER per peer (outbound), the ZAP handler and the socket
// monitors. User threads only touch mutex-protected queues and wake the I/O
// thread through an eventfd, so ZeroMQ sockets are never shared.

#include "worker/transport/zmq_transport.h"

#include <fmt/format.h>
#include <sys/eventfd.h>
#include <unistd.h>
#include <zmq.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <thread>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "common/keys/keys.h"
#include "common/logging.h"
#include "worker/transport/assembler.h"
#include "worker/transport/buffer_pool.h"
#include "worker/transport/stripe_assembler.h"
#include "worker/transport/tcp_state.h"

namespace geo::transport {

Payload::Payload(std::vector<std::byte> bytes) {
  auto owned = std::make_shared<const std::vector<std::byte>>(std::move(bytes));
  bytes_ = std::span<const std::byte>(owned->data(), owned->size());
  owner_ = std::move(owned);
}

Payload Payload::copyOf(std::span<const std::byte> bytes) {
  return Payload(std::vector<std::byte>(bytes.begin(), bytes.end()));
}

namespace {

using std::chrono::milliseconds;

constexpr const char* kZapEndpoint = "inproc://zeromq.zap.01";
// How long a disagreement waits at most for this rank's hello to leave for
// the peer before it is reported (checkHello).
constexpr std::chrono::seconds kRefusalGrace{3};
constexpr const char* kZapDomain = "geotrain";
// CONNECTED: a data connection's descriptor (its value), whose kernel state
// the stall rules read (tcp_state.h).
constexpr int kMonitorEvents =
    ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_CONNECTED | ZMQ_EVENT_HANDSHAKE_SUCCEEDED |
    ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
    ZMQ_EVENT_HANDSHAKE_FAILED_AUTH | ZMQ_EVENT_DISCONNECTED;

// Warnings about what peers (or strangers) send are rate-limited, so that a
// hostile or broken client cannot flood the log: the first kLoggedFirst of a
// kind, then every kLoggedEvery-th, each with its running count.
constexpr uint64_t kLoggedFirst = 10;
// Data chunks remembered until acknowledged, per peer (a peer that never
// acknowledges cannot make the list grow without end).
constexpr size_t kMaxUnackedChunks = size_t{1} << 16;
// Connections per peer whose last acknowledgement is repeated with pings:
// its data connections (at most kMaxConnections) and a few replaced ones.
constexpr size_t kMaxAckedStreams = kMaxConnections + 4;
constexpr uint64_t kLoggedEvery = 1000;
// Control-lane messages a peer's queue holds while it has no connection.
constexpr size_t kMaxLaneQueued = 64;
// How soon a control-lane message that found no connection is tried again.
constexpr std::chrono::milliseconds kLaneRetry{10};
// Pings go this often to a peer whose round trip is not known yet, for the
// Closing: how long the linger time may be renewed while our data still
// moves (a large final model or gradient behind a slow uplink). The
// linger time itself (TransportConfig::linger) is what a peer that takes
// nothing more gets.
constexpr std::chrono::minutes kMaxDrainAtClose{5};
// first kFastPingsFor after the start (a peer that is not up by then is
// pinged at the usual interval).
constexpr std::chrono::milliseconds kFirstPingEvery{50};
constexpr std::chrono::seconds kFastPingsFor{30};
// How often a peer's other key is tried at most (key rotation), and how
// soon a connection the peer refused our key on is made again.
constexpr std::chrono::milliseconds kKeyTryEvery{100};
constexpr std::chrono::milliseconds kRefusedRetry{1000};

bool logged(uint64_t n) {
  return n <= kLoggedFirst || n % kLoggedEvery == 0;
}

// Appended to the last line logged before the rate limit takes over.
const char* rateLimitNote(uint64_t n) {
  return n == kLoggedFirst ? " (from now on only every 1000th of these is logged)" : "";
}

std::array<uint8_t, 32> decodeKey(const std::string& z85) {
  std::array<uint8_t, 32> key{};
  zmq_z85_decode(key.data(), z85.c_str());
  return key;
}

// CURVE keys are set in binary (32 bytes), decoded from Z85 here.
template <typename Option>
void setCurveKey(zmq::socket_t& socket, Option option, const std::string& z85) {
  const auto key = decodeKey(z85);
  socket.set(option, zmq::buffer(key.data(), key.size()));
}

// A 32-byte key in Z85 (40 characters).
std::string z85Of(const void* key32) {
  std::array<char, 41> text{};
  zmq_z85_encode(text.data(), static_cast<const uint8_t*>(key32), 32);
  return std::string(text.data(), 40);
}

std::string bytesKey(const void* data, size_t size) {
  return std::string(static_cast<const char*>(data), size);
}

struct Outgoing {
  FrameHeader header;
  Payload payload;
  SteadyClock::time_point release;  // when the first chunk may go
  size_t chunkBytes = kMaxChunkBytes;
  // Under link emulation, when each chunk has crossed the emulated link
  // (chunks arrive one by one, as the bytes of a real link do); empty: all
  // at `release`.
  std::vector<SteadyClock::time_point> chunkRelease;
  // Under link emulation, when the last chunk has left the bottleneck (the
  // uplink or this peer's link rate), before the link's delay: until then
  // the message is queued behind the link, after it in flight on it.
  std::optional<SteadyClock::time_point> departs;
  size_t chunksSent = 0;  // chunks ZeroMQ took so far; the rest go on POLLOUT or when released
  // Its chunks are spread over the peer's data connections (frame.h,
  // kFrameFlagStriped), the last one on the first.
  bool striped = false;

  size_t chunks() const {
    return std::max<size_t>(1, (payload.size() + chunkBytes - 1) / chunkBytes);
  }
};

// Which connection of a socket is meant, as the socket's monitor tells: a
// serial that moves on at each connection and disconnection, odd while a
// connection is up. ZeroMQ takes a message into a connection's pipe until
// the socket itself learns that the connection ended, which may be after
// its monitor said so; a message handed over in between (the serial even)
// is lost with the connection, and no event says so.
struct ConnectionSerial {
  uint64_t value = 0;  // 0: never connected
  bool up() const { return (value & 1) != 0; }
  // Disconnected since it last connected (or its socket was replaced and
  // has not connected yet): what it takes now is lost, or only maybe sent.
  bool knownDown() const { return value > 0 && !up(); }
  void connected() {
    if (!up()) ++value;
  }
  void disconnected() {
    if (up()) ++value;
  }
  void replaced() { value += up() ? 1 : 2; }
  // The connection a message handed over now goes to: a socket that never
  // connected puts it in its first connection's pipe.
  ConnectionSerial stamp() const { return {value == 0 ? 1 : value}; }
};

// A data chunk handed to ZeroMQ, until the peer acknowledges it.
struct SentChunk {
  MessageKind kind;
  uint64_t round = 0;
  uint64_t step = 0;
  uint64_t offset = 0;
  uint64_t payloadBytes = 0;
  uint64_t wireBytes = 0;
  SteadyClock::time_point sentAt;
  // A chunk of a striped payload keeps its header and bytes until it is
  // acknowledged: if its connection drops first, it is sent again on
  // another (the receiver ignores a chunk it has).
  std::optional<FrameHeader> header;
  Payload chunk;
  // Its socket's connection serial when it was handed over (ZeroMQ keeps a
  // connection's order, not a socket's across its connections).
  ConnectionSerial connection;
};

// One of a peer's data connections after the first (TransportConfig::
// connections), which carry chunks of striped payloads only.
struct Stripe {
  std::optional<zmq::socket_t> dealer;
  std::optional<zmq::socket_t> monitor;
  std::deque<SentChunk> unacked;  // oldest first
  std::optional<SteadyClock::time_point> lastAck;
  // Its TCP connection's descriptor while it is up (monitor events), and
  // since when: the kernel vouches only for chunks sent on it.
  int fd = -1;
  SteadyClock::time_point connectedAt{};
  ConnectionSerial connection;
};

// Closes a stripe's sockets, if it has them. Its monitor stops first (an
// event sent while the socket lingers would block ZeroMQ's I/O thread on a
// monitor nobody reads); what the connection holds gets `linger` ms to go.
void closeStripe(Stripe& stripe, int linger) {
  if (stripe.dealer) zmq_socket_monitor(stripe.dealer->handle(), nullptr, 0);
  stripe.monitor.reset();
  stripe.fd = -1;
  stripe.connection.replaced();
  if (stripe.dealer) stripe.dealer->set(zmq::sockopt::linger, linger);
  stripe.dealer.reset();
}

// One event of a socket monitor: its id (ZMQ_EVENT_*) and value (for
// CONNECTED, ACCEPTED and DISCONNECTED, the connection's descriptor).
struct MonitorEvent {
  uint16_t id;
  uint32_t value;
};

// The next event `monitor` holds; nullopt when none is waiting. A malformed
// one is skipped.
std::optional<MonitorEvent> nextMonitorEvent(zmq::socket_t& monitor) {
  while (true) {
    zmq::message_t event;
    if (!monitor.recv(event, zmq::recv_flags::dontwait)) return std::nullopt;
    zmq::message_t address;
    if (event.more()) (void)monitor.recv(address, zmq::recv_flags::none);
    if (event.size() < 6) continue;
    MonitorEvent e;
    std::memcpy(&e.id, event.data(), sizeof e.id);
    std::memcpy(&e.value, static_cast<const char*>(event.data()) + sizeof e.id, sizeof e.value);
    return e;
  }
}

// The port of each endpoint ("tcp://host:port"); 0 where it has none.
std::vector<uint16_t> endpointPorts(const std::vector<std::string>& endpoints) {
  std::vector<uint16_t> ports;
  for (const std::string& endpoint : endpoints) {
    uint16_t port = 0;
    if (const auto colon = endpoint.rfind(':'); colon != std::string::npos) {
      try {
        const int n = std::stoi(endpoint.substr(colon + 1));
        if (n > 0 && n < 65536) port = static_cast<uint16_t>(n);
      } catch (const std::exception&) {
        port = 0;
      }
    }
    ports.push_back(port);
  }
  return ports;
}

// A probe (ping, pong, acknowledgement) waiting out an emulated link's delay.
struct PendingProbe {
  SteadyClock::time_point release;
  FrameHeader header;
  std::vector<std::byte> body;
};

// Whether frames of this kind are data the receiver acknowledges (kAck):
// the warm-up padding too (frame.h).
bool acknowledged(MessageKind kind) {
  return kind == MessageKind::kWarmup ||
         static_cast<uint16_t>(kind) >= static_cast<uint16_t>(MessageKind::kUpdate);
}

struct PeerState {
  mutable std::mutex mu;
  std::condition_variable space;  // signalled when queuedBytes drops
  std::deque<Outgoing> queue;
  uint64_t queuedBytes = 0;
  std::optional<LinkShaper> shaper;
  uint64_t sockets = 0;  // I/O thread: how many times its sockets were made (monitor names)
  // I/O thread: how many times this rank made all its connections to the
  // peer anew (renewConnections); its hellos carry it, so that the peer
  // knows what was in flight on the old ones will not be sent again.
  uint64_t generation = 0;
  // Written by the I/O thread on receipt: the peer's last hello's
  // incarnation and generation (header round and step); unset before one.
  std::optional<std::pair<uint64_t, uint64_t>> lastHello;

  // Written by the I/O thread, read by anyone.
  std::atomic<uint64_t> bytesSent{0};
  std::atomic<uint64_t> bytesReceived{0};
  std::atomic<uint64_t> messagesSent{0};
  std::atomic<uint64_t> messagesReceived{0};
  std::atomic<uint64_t> handshakes{0};
  std::atomic<double> rttSeconds{-1};
  std::atomic<int64_t> lastHeardNs{0};  // steady clock of the last frame; 0: never
  std::atomic<bool> refused{false};     // its hello disagreed: nothing it sends is delivered
  std::atomic<double> minRttSeconds{-1};
  std::atomic<uint64_t> unackedBytes{0};
  std::atomic<int64_t> oldestUnackedNs{0};  // steady clock; 0: nothing unacknowledged
  std::atomic<int64_t> lastAckNs{0};        // steady clock of the last acknowledgement; 0: never
  std::atomic<uint64_t> ackedBytes{0};      // data acknowledged since the start (PeerCounters)
  // For queuedBelowBytes(), read by any thread: the data
  // connection's descriptor (-1: none up), the bytes handed to it since
  // the start, and their count when it connected.
  std::atomic<int> sharedDataFd{-1};
  std::atomic<uint64_t> dataHanded{0};
  std::atomic<uint64_t> dataHandedAtConnect{0};

  // I/O thread only.
  std::optional<zmq::socket_t> dealer;
  std::optional<zmq::socket_t> monitor;
  // The data connection's descriptor while it is up (its monitor's
  // CONNECTED and DISCONNECTED events), -1 otherwise; and whether the stall
  // rules last kept it because its kernel said it carries our data.
  int dataFd = -1;
  SteadyClock::time_point dataConnectedAt{};
  ConnectionSerial dataConnection;
  bool keptCarrying = false;
  bool slowAckLogged = false;           // the debug line of a slow acknowledgement, once a wait
  SteadyClock::time_point keptUntil{};  // the kernel is asked again from then
  bool blocked = false;                 // the DEALER refused the head message: wait for POLLOUT
  // Probes (pings, pongs, acknowledgements) take a connection of their own
  // to the peer's ROUTER, so that nothing queued for the peer -- in our
  // queue, in ZeroMQ's or in the kernel's socket buffer -- delays them: a
  // round trip measures the path, and an acknowledgement says when data
  // arrived, not when a queue ahead of it drained. One that cannot be sent
  // at once (no connection) is dropped; the next one follows soon.
  std::optional<zmq::socket_t> probe;
  // Its monitor, for the descriptor of its connection (probeFd, as dataFd):
  // pings leave on it every ping interval, so its kernel's ACKs say whether
  // the path to the peer works even while no data is outstanding.
  std::optional<zmq::socket_t> probeMonitor;
  int probeFd = -1;
  std::deque<PendingProbe> probes;  // under link emulation, until their release
  // Control-lane messages (SendMeta::controlLane) for the probe connection,
  // oldest first, until it takes them: unlike a probe, one is kept while
  // there is no connection yet (a join's question is asked once). Guarded by
  // `mu`: send() adds from any thread.
  std::deque<PendingProbe> lane;
  std::deque<SentChunk> unacked;  // oldest first
  // The data connections after the first (striping), and the chunks of
  // striped payloads that a dropped connection held, to be sent again.
  std::vector<Stripe> stripes;
  std::deque<SentChunk> resend;
  size_t nextStripe = 0;    // where the next striped chunk is tried first
  std::deque<double> rtts;  // the recent ping round trips
  // Per connection the peer's data came in on: the latest data chunk
  // received, not yet acknowledged; and the latest acknowledged,
  // acknowledged again with every ping (one that was lost with its
  // connection is then made good within a ping interval).
  std::map<uint64_t, FrameHeader> ackDue;
  std::map<uint64_t, FrameHeader> lastAcked;
  std::optional<SteadyClock::time_point> lastReconnect;
  uint64_t silentReconnects = 0;  // since the peer was last heard
  // Key rotation: which of the peer's public keys (ZmqTransport::keys_)
  // the sockets use as its server key; whether a handshake completed on
  // the current connection; and whether one failed before it completed
  // (then the next key is tried, as the peer may have switched to it or
  // not yet).
  size_t serverKey = 0;
  bool handshakeOnSockets = false;
  bool tryNextKey = false;
  bool refusedUs = false;
  std::optional<SteadyClock::time_point> lastKeyTry;
};

class ZmqTransport final : public Transport {
 public:
  explicit ZmqTransport(TransportConfig config)
      : cfg_(std::move(config)),
        limits_{jobIdHash(cfg_.jobId), static_cast<uint32_t>(cfg_.endpoints.size()),
                cfg_.maxPayloadBytes},
        peers_(cfg_.endpoints.size()),
        uplink_(cfg_.uplink),
        kernelTells_(!cfg_.emulatedPartitions && !cfg_.uplink.shaped() &&
                     std::none_of(cfg_.links.begin(), cfg_.links.end(),
                                  [](const LinkProfile& l) { return l.shaped(); })),
        endpointPorts_(endpointPorts(cfg_.endpoints)) {}

  ~ZmqTransport() override { shutdown(); }

  Status start();

  uint32_t rank() const override { return cfg_.rank; }
  uint32_t worldSize() const override { return limits_.worldSize; }

  Status send(uint32_t peer, MessageKind kind, const SendMeta& meta, Payload payload,
              milliseconds timeout) override;
  StatusOr<Message> receive(MessageKind kind, uint64_t round, uint32_t from,
                            milliseconds timeout) override;
  uint64_t arrivals() const override {
    std::lock_guard lock(inboxMu_);
    return arrived_;
  }
  bool awaitArrival(uint64_t seen, milliseconds timeout) override;
  size_t discard(const std::function<bool(const FrameHeader&)>& match) override;
  void setPartitioned(bool cut) override;
  void setUplinkRate(double bytesPerSecond) override;
  std::vector<PeerCounters> peerCounters() const override;
  uint64_t queuedBelowBytes(uint32_t peer) const override;
  TransportCounters counters() const override;
  Status updateKeys(const KeySet& keys) override;

 private:
  // Key rotation, on the I/O thread: the change handed over by
  // updateKeys(), if any; and new connections to a peer whose handshake
  // failed with one of its keys (with its next key) or that refused ours.
  void applyKeyChange();
  Status applyKeys(const KeySet& keys);
  void retryHandshakes();
  // A peer's kKeyNotice: its connections are made anew with that key.
  void takeKeyNotice(uint32_t peer, const Payload& body);
  // The ZAP allowlist from keys_.
  void admitKeys();
  // Unbinds the ROUTER and binds it again with secretKey_: every
  // connection made to it closes and is made anew.
  Status rebindRouter();
  // Queues a frame; `wait` bounds how long to wait for room (0: fail at once).
  // `first`: ahead of everything queued, and a message already partly sent
  // is dropped (its first chunks went on connections since replaced).
  Status enqueue(uint32_t peer, const FrameHeader& h, Payload payload, milliseconds wait,
                 bool first = false);
  // Whether this rank connects to `peer` (not itself, and it has an endpoint).
  bool reachable(uint32_t peer) const { return peer != cfg_.rank && !cfg_.endpoints[peer].empty(); }
  // Whether traffic with `peer` crosses the emulated WAN uplink.
  bool wanPeer(uint32_t peer) const {
    return peer < cfg_.uplinkPeers.size() && cfg_.uplinkPeers[peer];
  }
  bool cutOff(uint32_t peer) const { return partitioned_ && wanPeer(peer); }
  void wake();
  void shutdown();

  void ioLoop();
  void handleZap();
  void handleInbound();
  void handleMonitor(zmq::socket_t& monitor, PeerState* peer);
  // The probe connection's events: its descriptor (PeerState::probeFd).
  void handleProbeMonitor(PeerState& p);
  // The ROUTER's connections, from its monitor events (see the definition).
  void trackRouterConnection(uint16_t event, uint32_t value);
  void settleRouterConnection(int fd);
  void countClosedJunk();
  void countHandshakeFailure(std::string_view what);
  // Sends the released heads of a peer's queue; returns the next release time.
  std::optional<SteadyClock::time_point> flush(uint32_t peer, SteadyClock::time_point now);
  // Striping (TransportConfig::connections). One [header][chunk] message on
  // `socket`, without waiting: false when ZeroMQ did not take it (no
  // connection, or its queue is full).
  bool sendChunk(zmq::socket_t& socket, const FrameHeader& h, const Payload& chunk);
  // A chunk of a striped payload on whichever of the peer's data
  // connections takes it, trying them round from PeerState::nextStripe (the
  // payload's last chunk: on the first only); recorded as unacknowledged on
  // it. False when none took it.
  bool sendStriped(PeerState& p, const FrameHeader& h, const Payload& chunk,
                   SteadyClock::time_point now);
  // Sends again the chunks that dropped connections held (PeerState::resend);
  // false when a connection refused one (wait for POLLOUT).
  bool flushResend(PeerState& p, SteadyClock::time_point now);
  // The chunks of striped payloads in `unacked` go to PeerState::resend (a
  // connection dropped, or is being replaced); the rest is left.
  void requeueStriped(PeerState& p, std::deque<SentChunk>& unacked);
  // A DEALER to peer r in `socket`, not yet connected: linger and send
  // high-water mark as given, completed connections only, the
  // reconnection and connect timing, CURVE with r's current server key.
  void openDealer(std::optional<zmq::socket_t>& socket, uint32_t r, int linger, int hwm);
  // Makes data connection 1 + i to peer r (a socket, its monitor).
  Status openStripe(uint32_t r, size_t i);
  // Watches `watched`'s `events` from a new monitor socket in `monitor`,
  // at the inproc `endpoint`; before `watched` connects or binds.
  Status openMonitor(zmq::socket_t& watched, const std::string& endpoint, int events,
                     std::optional<zmq::socket_t>& monitor);
  // A stuck extra connection replaced alone, what it held sent again.
  void reopenStripe(uint32_t r, size_t i, const std::string& why);
  void handleStripeMonitor(uint32_t r, size_t i);
  // How many data connections a payload to `peer` may be striped over.
  size_t connectionsTo(uint32_t peer) const {
    return wanPeer(peer) ? std::max<size_t>(1, cfg_.connections) : 1;
  }
  // A whole message received: handled by the transport (hello, probes,
  // acknowledgements) or put in the inbox.
  void deliver(const FrameHeader& header, Payload body);
  // A striped payload given up (StripeAssembler): logged, not counted as a
  // rejected frame -- nothing wrong came in, the rest was lost on the way.
  void noteStripedDrop(const Status& why) {
    logger()->info("transport rank {}: {}", cfg_.rank, why.message());
  }
  void reject(std::string reason);
  void sendPings(SteadyClock::time_point now);
  // A probe to `peer` on its probe connection, after the emulated link's
  // delay where there is one (I/O thread).
  // False when it could not be handed to ZeroMQ (no connection yet).
  bool sendProbe(uint32_t peer, FrameHeader h, std::vector<std::byte> body,
                 SteadyClock::time_point now);
  // False when it could not be handed to ZeroMQ (no connection yet).
  bool writeProbe(uint32_t peer, const FrameHeader& h, const std::vector<std::byte>& body);
  // Probes whose emulated delay is over; returns when the next one is due.
  std::optional<SteadyClock::time_point> flushProbes(SteadyClock::time_point now);
  // One acknowledgement per peer for the data taken from it since the last.
  void sendAcks(SteadyClock::time_point now);
  void takeAck(uint32_t peer, const FrameHeader& h, const Payload& body);
  void publishUnacked(PeerState& p);
  // Fresh connections to peers that went silent (TransportConfig::reconnectAfter).
  void reconnectStalled(SteadyClock::time_point now);
  // The kernel's state of a data connection to peer r (descriptor fd, -1:
  // none known), nullopt when it cannot be read or is not established.
  std::optional<TcpProgress> kernelState(uint32_t r, int fd) const;
  // New connections to `peer`, both of them, on new sockets (openPeerSockets).
  void reconnect(uint32_t peer, const std::string& why);
  // `drainOld`: the old connections are alive (a key change of ours):
  // they get the linger time to deliver what they hold.
  Status openPeerSockets(uint32_t r, bool drainOld = false);
  // openPeerSockets(), then what the old connections held is forgotten
  // (unacknowledged data, a blocked DEALER); false, logged, when it failed.
  bool renewConnections(uint32_t peer, bool drainOld = false);
  // "tokyo (rank 1)", or "rank 1" without rankNames.
  std::string rankName(uint32_t peer) const {
    return peer < cfg_.rankNames.size() && !cfg_.rankNames[peer].empty()
               ? fmt::format("{} (rank {})", cfg_.rankNames[peer], peer)
               : fmt::format("rank {}", peer);
  }
  // Queues this rank's hello for `peer` (when there are agreed settings);
  // `first`: ahead of what is queued (enqueueRawOrSkip).
  void sendHello(uint32_t peer, bool first = false);
  // TransportConfig::warmupBytes of padding to a WAN peer, after its hello.
  void sendWarmup(uint32_t peer);
  // Queues `bytes` as one raw frame of `kind` from this rank, or drops it
  // when the peer's queue is full.
  // `first`: ahead of everything queued (after a message already partly
  // sent, which is dropped: its first chunks went on connections since
  // replaced). `round` and `step` go in its header.
  void enqueueRawOrSkip(uint32_t peer, MessageKind kind, std::vector<std::byte> bytes,
                        bool first = false, uint64_t round = 0, uint64_t step = 0);
  // send() for SendMeta::controlLane: into the peer's lane queue.
  Status enqueueOnLane(uint32_t peer, FrameHeader h, const Payload& payload);
  // Compares a peer's hello with ours; a disagreement refuses the peer.
  void checkHello(uint32_t peer, const Payload& hello);
  void dropQueuedPings();
  // `linger`: how long ZeroMQ may still take to put what it holds for a
  // peer on the wire (zmq_ctx_term waits for it, at most that long).
  void closeSockets(std::chrono::milliseconds linger = std::chrono::milliseconds(0));

  TransportConfig cfg_;
  FrameLimits limits_;
  std::vector<PeerState> peers_;
  std::mutex uplinkMu_;  // taken after a PeerState::mu, never before
  LinkShaper uplink_;
  // Whether the stall rules may ask the kernel (TransportConfig::
  // emulatedPartitions): not where partitions are emulated above it.
  const bool kernelTells_;
  const std::vector<uint16_t> endpointPorts_;  // endpointPorts(cfg_.endpoints)

  zmq::context_t ctx_;
  std::optional<zmq::socket_t> router_;
  std::optional<zmq::socket_t> routerMonitor_;
  std::optional<zmq::socket_t> zap_;
  std::map<std::string, uint32_t> allowedKeys_;  // binary public key -> rank
  std::set<std::string> admittedZ85_;            // the same keys, in Z85
  // The keys in force (I/O thread once it runs): this rank's secret and
  // public key, and every rank's public keys (KeySet::publicKeys).
  std::string secretKey_;
  std::string publicKey_;
  std::vector<std::vector<std::string>> keys_;
  std::string boundAt_;  // the ROUTER's endpoint as bound (for a rebind)
  // A key change handed to the I/O thread, and its outcome.
  struct KeyChange {
    KeySet keys;
    std::promise<Status> done;
  };
  std::mutex keyChangeMu_;
  std::optional<KeyChange> keyChange_;
  int wakeFd_ = -1;
  std::thread io_;
  const SteadyClock::time_point startedAt_ = SteadyClock::now();
  std::atomic<bool> stopping_{false};
  std::atomic<bool> closed_{false};
  std::atomic<bool> partitioned_{false};
  std::atomic<uint64_t> partitionDropped_{0};
  const SteadyClock::time_point started_ = SteadyClock::now();
  // This transport among the incarnations of its rank: a restarted worker's
  // hellos differ from its previous one's.
  const uint64_t incarnation_ =
      std::random_device{}() * (uint64_t{1} << 32) ^ std::random_device{}();

  // Payloads of several chunks are copied into buffers from this pool: at
  // most 4 idle, 256 MiB. The assembler is the I/O thread's.
  std::shared_ptr<BufferPool> reassemblyBuffers_ = BufferPool::create(4, size_t{256} << 20);
  PayloadAssembler assembler_{limits_.worldSize, reassemblyBuffers_};
  // Striped payloads, and the order of each sender's messages around them.
  // A payload that makes no progress for this long is given up: longer
  // than a stuck connection takes to be replaced (2.5 reconnectAfter) and
  // what it held to be sent again.
  StripeAssembler stripes_{
      limits_.worldSize, reassemblyBuffers_,
      cfg_.reconnectAfter.count() > 0 ? 4 * cfg_.reconnectAfter : milliseconds(10000)};

  mutable std::mutex inboxMu_;
  std::condition_variable inboxCv_;
  std::map<std::pair<uint16_t, uint64_t>, std::deque<Message>> inbox_;
  uint64_t inboxBytes_ = 0;
  uint64_t arrived_ = 0;  // messages put in inbox_ so far (arrivals())

  std::atomic<uint64_t> refusedKeys_{0};
  std::atomic<uint64_t> handshakeFailures_{0};

  // I/O thread only: the ROUTER's accepted connections by file descriptor,
  // true once it is known to have completed its handshake.
  std::map<int, bool> routerConnections_;
  uint64_t unattributedSuccesses_ = 0;  // handshakes that succeeded, connection unknown
  uint64_t failuresToClose_ = 0;        // failed handshakes whose disconnect is still due
  uint64_t closedUnknown_ = 0;  // closed in their handshake, perhaps an unattributed success
  std::atomic<uint64_t> framesRejected_{0};
  // I/O thread only. A disagreement is reported once, after this rank's own
  // hello has left for that peer (see checkHello).
  struct PendingRefusal {
    Status status;
    uint32_t peer = 0;
    SteadyClock::time_point deadline;
    std::optional<SteadyClock::time_point> helloLeft;
  };
  bool disagreed_ = false;
  std::optional<PendingRefusal> pendingRefusal_;
  void reportRefusalWhenDue(SteadyClock::time_point now);
  mutable std::mutex rejectMu_;
  std::string lastRejectReason_;
};

Status validate(const TransportConfig& c) {
  const size_t world = c.endpoints.size();
  if (world == 0) return invalidArgument("transport: endpoints is empty (one per rank needed)");
  if (c.rank >= world) {
    return invalidArgument(
        fmt::format("transport: rank {} is out of range: world size is {}", c.rank, world));
  }
  if (c.jobId.empty()) return invalidArgument("transport: jobId must not be empty");
  if (c.endpoints[c.rank].empty() && c.bindEndpoint.empty()) {
    return invalidArgument(fmt::format(
        "transport: endpoints[{}] (this rank) is empty and there is no bind endpoint", c.rank));
  }
  if (!c.links.empty() && c.links.size() != world) {
    return invalidArgument(
        fmt::format("transport: links has {} entries; it must be empty or have one per rank ({})",
                    c.links.size(), world));
  }
  if (!c.uplinkPeers.empty() && c.uplinkPeers.size() != world) {
    return invalidArgument(fmt::format(
        "transport: uplinkPeers has {} entries; it must be empty or have one per rank ({})",
        c.uplinkPeers.size(), world));
  }
  if (c.connections < 1 || c.connections > kMaxConnections) {
    return invalidArgument(
        fmt::format("transport: connections is {}; allowed: 1 to {} data connections per WAN peer",
                    c.connections, kMaxConnections));
  }
  if (c.maxQueuedBytesPerPeer == 0 || c.maxInboxBytes == 0 || c.maxPayloadBytes == 0) {
    return invalidArgument("transport: queue, inbox and payload limits must be > 0");
  }
#if !defined(GEO_TRANSPORT_ALLOW_PLAINTEXT)
  if (!c.encrypt) {
    return invalidArgument(
        "transport: encrypt = false is refused: geotrain never sends plaintext (only a "
        "test-only build can turn CURVE off)");
  }
#endif
  if (!c.encrypt) return {};
  if (c.publicKeys.size() != world) {
    return invalidArgument(
        fmt::format("transport: publicKeys has {} entries, need one per rank ({})",
                    c.publicKeys.size(), world));
  }
  std::set<std::string> seen;
  for (size_t r = 0; r < world; ++r) {
    if (!keys::isZ85Key(c.publicKeys[r])) {
      return invalidArgument(
          fmt::format("transport: publicKeys[{}] is not a 40-character Z85 key", r));
    }
    if (!seen.insert(c.publicKeys[r]).second) {
      return invalidArgument(fmt::format(
          "transport: publicKeys[{}] repeats another rank's key: every worker needs its own "
          "keypair",
          r));
    }
  }
  auto derived = keys::publicKeyOf(c.secretKey);
  if (!derived.ok()) return derived.status().withContext("transport: secretKey");
  if (*derived != c.publicKeys[c.rank]) {
    return invalidArgument(fmt::format(
        "transport: secretKey does not belong to publicKeys[{}] (this rank's public key)", c.rank));
  }
  return {};
}

void ZmqTransport::openDealer(std::optional<zmq::socket_t>& socket, uint32_t r, int linger,
                              int hwm) {
  socket.emplace(ctx_, zmq::socket_type::dealer);
  zmq::socket_t& s = *socket;
  s.set(zmq::sockopt::linger, linger);
  s.set(zmq::sockopt::immediate, 1);
  s.set(zmq::sockopt::sndhwm, hwm);
  s.set(zmq::sockopt::reconnect_ivl, 100);
  s.set(zmq::sockopt::reconnect_ivl_max, 2000);
  if (cfg_.connectTimeout.count() > 0) {
    s.set(zmq::sockopt::connect_timeout, static_cast<int>(cfg_.connectTimeout.count()));
  }
  if (cfg_.encrypt) {
    setCurveKey(s, zmq::sockopt::curve_serverkey, keys_[r][peers_[r].serverKey]);
    setCurveKey(s, zmq::sockopt::curve_publickey, publicKey_);
    setCurveKey(s, zmq::sockopt::curve_secretkey, secretKey_);
  }
}

// Rank r's connections -- the data DEALER (watched by a monitor), the probe
// DEALER and the extra data connections (striping) -- on sockets of their
// own, made anew. Closing a socket ends every connection it had:
// disconnect() and connect() on the same socket left the replaced
// connection up beside the new one (a 30-minute churn soak's workers held
// up to eight connections to one peer, 33 descriptors more at the end than
// at the start).
Status ZmqTransport::openPeerSockets(uint32_t r, bool drainOld) {
  PeerState& p = peers_[r];
  // The old socket's monitor stops before its reader closes: an event it
  // sent after (a disconnect while the socket lingers to deliver what it
  // holds) would block ZeroMQ's I/O thread on a monitor nobody reads, and
  // with it every connection of this worker.
  if (p.dealer) zmq_socket_monitor(p.dealer->handle(), nullptr, 0);
  p.monitor.reset();
  p.dataFd = -1;
  p.sharedDataFd = -1;
  p.dataConnection.replaced();
  // What the old connection held is lost, unless it is alive and given
  // the linger time to deliver it.
  if (p.dealer) {
    p.dealer->set(zmq::sockopt::linger, drainOld ? static_cast<int>(cfg_.linger.count()) : 0);
  }
  if (p.probe && drainOld) p.probe->set(zmq::sockopt::linger, 1000);
  if (p.probe) zmq_socket_monitor(p.probe->handle(), nullptr, 0);
  p.probeMonitor.reset();
  p.probeFd = -1;
  p.dealer.reset();
  p.probe.reset();
  p.handshakeOnSockets = false;
  p.tryNextKey = false;
  p.refusedUs = false;
  // Hand frames only to completed connections: while a peer is away they
  // wait in our bounded queue, where backpressure and counters see them.
  const auto open = [&](std::optional<zmq::socket_t>& socket, int linger, int hwm) {
    openDealer(socket, r, linger, hwm);
  };
  open(p.dealer, static_cast<int>(cfg_.linger.count()), 64);
  open(p.probe, 0, 16);
  zmq::socket_t& d = *p.dealer;
  zmq::socket_t& probe = *p.probe;
  // Each socket's monitor at an inproc endpoint of its own.
  const std::string probeMon = fmt::format("inproc://geo-monitor-peer-{}-{}-probe", r, p.sockets);
  GEO_RETURN_IF_ERROR(
      openMonitor(probe, probeMon, ZMQ_EVENT_CONNECTED | ZMQ_EVENT_DISCONNECTED, p.probeMonitor));
  probe.connect(cfg_.endpoints[r]);
  const std::string mon = fmt::format("inproc://geo-monitor-peer-{}-{}", r, p.sockets++);
  GEO_RETURN_IF_ERROR(openMonitor(d, mon, kMonitorEvents, p.monitor));
  d.connect(cfg_.endpoints[r]);
  for (Stripe& stripe : p.stripes) {
    closeStripe(stripe, drainOld ? static_cast<int>(cfg_.linger.count()) : 0);
  }
  p.stripes.clear();
  p.stripes.resize(connectionsTo(r) - 1);
  // One that cannot be made is left out (the payloads go on the others),
  // and the next renewal makes it again.
  for (size_t i = 0; i < p.stripes.size(); ++i) {
    if (Status s = openStripe(r, i); !s.ok()) {
      logger()->warn("transport rank {}: data connection {} to {} not made: {}", cfg_.rank, i + 2,
                     rankName(r), s.message());
    }
  }
  return {};
}

Status ZmqTransport::openStripe(uint32_t r, size_t i) {
  Stripe& stripe = peers_[r].stripes[i];
  // Half made is not made: both or neither (the I/O loop polls both).
  struct Undo {
    Stripe& s;
    bool done = false;
    ~Undo() {
      if (!done) closeStripe(s, 0);
    }
  } undo{stripe};
  openDealer(stripe.dealer, r, static_cast<int>(cfg_.linger.count()), 64);
  zmq::socket_t& s = *stripe.dealer;
  // Only its connection and drops matter: the first connection's events
  // decide the keys.
  const std::string mon =
      fmt::format("inproc://geo-monitor-peer-{}-{}-stripe-{}", r, peers_[r].sockets++, i);
  GEO_RETURN_IF_ERROR(
      openMonitor(s, mon, ZMQ_EVENT_CONNECTED | ZMQ_EVENT_DISCONNECTED, stripe.monitor));
  s.connect(cfg_.endpoints[r]);
  undo.done = true;
  return {};
}

Status ZmqTransport::openMonitor(zmq::socket_t& watched, const std::string& endpoint, int events,
                                 std::optional<zmq::socket_t>& monitor) {
  if (zmq_socket_monitor(watched.handle(), endpoint.c_str(), events) != 0) {
    return internalError(fmt::format("transport: zmq_socket_monitor: {}", zmq_strerror(errno)));
  }
  monitor.emplace(ctx_, zmq::socket_type::pair);
  monitor->connect(endpoint);
  // The I/O loop polls a monitor by its notification descriptor, which
  // becomes readable when the watched socket's pipe wakes a reader that
  // found it empty; a new pipe's reader has not found it empty yet, so the
  // first events would come without a signal. Asking for the socket's
  // events (no message is taken) looks at the empty pipe.
  (void)monitor->get(zmq::sockopt::events);
  return {};
}

void ZmqTransport::reopenStripe(uint32_t r, size_t i, const std::string& why) {
  PeerState& p = peers_[r];
  Stripe& stripe = p.stripes[i];
  closeStripe(stripe, 0);
  requeueStriped(p, stripe.unacked);
  stripe.lastAck.reset();
  Status s;
  try {
    s = openStripe(r, i);
  } catch (const zmq::error_t& e) {
    s = internalError(e.what());
  }
  if (!s.ok()) {
    logger()->warn("transport rank {}: {}; replacing it failed: {}", cfg_.rank, why, s.message());
    return;
  }
  logger()->info("transport rank {}: {}; a new one, what it held sent again", cfg_.rank, why);
}

void ZmqTransport::handleStripeMonitor(uint32_t r, size_t i) {
  PeerState& p = peers_[r];
  Stripe& stripe = p.stripes[i];
  while (stripe.monitor) {
    const auto event = nextMonitorEvent(*stripe.monitor);
    if (!event) return;
    const auto [id, value] = *event;
    if (id == ZMQ_EVENT_CONNECTED) {
      stripe.fd = static_cast<int>(value);
      stripe.connectedAt = SteadyClock::now();
      stripe.connection.connected();
    }
    // What ZeroMQ held for it is dropped with it (ZMQ_IMMEDIATE), and what
    // the kernel held is lost: all of it goes again on the connections up.
    if (id == ZMQ_EVENT_DISCONNECTED) {
      stripe.fd = -1;
      stripe.connection.disconnected();
      requeueStriped(p, stripe.unacked);
    }
  }
}

Status ZmqTransport::start() {
  try {
    const uint32_t world = limits_.worldSize;
    ctx_.set(zmq::ctxopt::blocky, false);
    if (cfg_.encrypt) {
      // The ZAP handler must be bound before any socket accepts connections.
      zap_.emplace(ctx_, zmq::socket_type::rep);
      zap_->bind(kZapEndpoint);
      secretKey_ = cfg_.secretKey;
      publicKey_ = cfg_.publicKeys[cfg_.rank];
      keys_.clear();
      for (uint32_t r = 0; r < world; ++r) keys_.push_back({cfg_.publicKeys[r]});
      admitKeys();
    }

    router_.emplace(ctx_, zmq::socket_type::router);
    router_->set(zmq::sockopt::linger, 0);
    // No frame a peer sends is larger than a chunk: anything larger is not
    // geotrain's, and ZeroMQ drops the connection before buffering it. The
    // 256 bytes are room for the security mechanism's framing (a CURVE
    // MESSAGE adds 33 bytes to the frame it carries).
    router_->set(zmq::sockopt::maxmsgsize,
                 static_cast<int64_t>(
                     std::max<uint64_t>(kFrameHeaderBytes,
                                        std::min<uint64_t>(cfg_.maxPayloadBytes, kMaxChunkBytes)) +
                     256));
    if (cfg_.encrypt) {
      router_->set(zmq::sockopt::curve_server, 1);
      setCurveKey(*router_, zmq::sockopt::curve_secretkey, secretKey_);
      router_->set(zmq::sockopt::zap_domain, kZapDomain);
    }
    const std::string routerMon = "inproc://geo-monitor-router";
    GEO_RETURN_IF_ERROR(openMonitor(*router_, routerMon, kMonitorEvents, routerMonitor_));
    const std::string& bindAt =
        cfg_.bindEndpoint.empty() ? cfg_.endpoints[cfg_.rank] : cfg_.bindEndpoint;
    try {
      router_->bind(bindAt);
    } catch (const zmq::error_t& e) {
      return unavailable(fmt::format("transport: cannot bind {}: {}", bindAt, e.what()));
    }
    boundAt_ = router_->get(zmq::sockopt::last_endpoint);

    for (uint32_t r = 0; r < world; ++r) {
      if (!reachable(r)) continue;
      PeerState& p = peers_[r];
      if (!cfg_.links.empty() && cfg_.links[r].shaped()) p.shaper.emplace(cfg_.links[r]);
      if (Status opened = openPeerSockets(r); !opened.ok()) return opened;
    }
  } catch (const zmq::error_t& e) {
    return internalError(fmt::format("transport: ZeroMQ setup failed: {}", e.what()));
  }
  wakeFd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wakeFd_ < 0) return internalError(fmt::format("transport: eventfd: {}", strerror(errno)));
  // First in every queue, so that it is the first frame each peer reads from
  // this rank: the peer checks the settings before any update.
  for (uint32_t r = 0; r < limits_.worldSize; ++r) {
    if (!reachable(r)) continue;
    sendHello(r);
    sendWarmup(r);
  }
  io_ = std::thread([this] { ioLoop(); });
  return {};
}

void ZmqTransport::wake() {
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(wakeFd_, &one, sizeof one);
}

void ZmqTransport::shutdown() {
  if (io_.joinable()) {
    stopping_ = true;
    wake();
    io_.join();
  } else {
    closeSockets();
  }
  closed_ = true;
  inboxCv_.notify_all();
  for (auto& p : peers_) {
    std::lock_guard lock(p.mu);
    p.space.notify_all();
  }
  if (wakeFd_ >= 0) ::close(wakeFd_);
  wakeFd_ = -1;
}

Status ZmqTransport::enqueue(uint32_t peer, const FrameHeader& h, Payload payload,
                             milliseconds wait, bool first) {
  if (!reachable(peer)) {
    return failedPrecondition(fmt::format(
        "transport: rank {} has no endpoint at rank {} (transport.peers: none), so it is never "
        "sent to",
        peer, cfg_.rank));
  }
  PeerState& p = peers_[peer];
  const uint64_t bytes = kFrameHeaderBytes + payload.size();
  if (cutOff(peer)) {
    ++partitionDropped_;
    return {};
  }
  {
    std::unique_lock lock(p.mu);
    // A message larger than the whole queue may go when the queue is empty.
    const auto hasRoom = [&] {
      return closed_ || p.queuedBytes == 0 || p.queuedBytes + bytes <= cfg_.maxQueuedBytesPerPeer;
    };
    if (!p.space.wait_for(lock, wait, hasRoom)) {
      return deadlineExceeded(fmt::format(
          "transport: send queue to rank {} stayed full for {} ms ({} bytes queued, limit {})",
          peer, wait.count(), p.queuedBytes, cfg_.maxQueuedBytesPerPeer));
    }
    if (closed_ || stopping_) return Status(StatusCode::kCancelled, "transport: closed");
    Outgoing o;
    o.header = h;
    o.payload = std::move(payload);
    if (wanPeer(peer)) o.chunkBytes = std::clamp<size_t>(cfg_.wanChunkBytes, 1, kMaxChunkBytes);
    o.striped = connectionsTo(peer) > 1 && o.chunks() > 1;
    const auto now = SteadyClock::now();
    o.release = now;
    std::unique_lock<std::mutex> uplinkLock(uplinkMu_, std::defer_lock);
    bool viaUplink = false;
    if (wanPeer(peer)) {
      uplinkLock.lock();
      viaUplink = uplink_.profile().shaped();
    }
    if (viaUplink || p.shaper) {
      // Each chunk (with its header) in turn through the shared uplink,
      // then this peer's link.
      const size_t chunks = o.chunks();
      o.chunkRelease.resize(chunks);
      for (size_t c = 0; c < chunks; ++c) {
        const uint64_t len = std::min<uint64_t>(o.chunkBytes, o.payload.size() - c * o.chunkBytes);
        const uint64_t wire = kFrameHeaderBytes + len;
        auto at = viaUplink ? uplink_.schedule(wire, now) : now;
        o.chunkRelease[c] = p.shaper ? p.shaper->schedule(wire, at) : at;
      }
      o.release = o.chunkRelease.front();
      o.departs = o.chunkRelease.back() -
                  (p.shaper ? p.shaper->profile().oneWayDelay : SteadyClock::duration::zero());
    }
    if (uplinkLock.owns_lock()) uplinkLock.unlock();
    if (first && !p.queue.empty() && p.queue.front().chunksSent > 0) {
      p.queuedBytes -= kFrameHeaderBytes + p.queue.front().payload.size();
      p.queue.pop_front();
      p.space.notify_all();
    }
    if (first) {
      p.queue.push_front(std::move(o));
    } else {
      p.queue.push_back(std::move(o));
    }
    p.queuedBytes += bytes;
  }
  wake();
  return {};
}

Status ZmqTransport::send(uint32_t peer, MessageKind kind, const SendMeta& meta, Payload payload,
                          milliseconds timeout) {
  if (peer >= limits_.worldSize || peer == cfg_.rank) {
    return invalidArgument(fmt::format("transport: cannot send to rank {} (world size {}, self {})",
                                       peer, limits_.worldSize, cfg_.rank));
  }
  if (payload.size() > cfg_.maxPayloadBytes) {
    return invalidArgument(fmt::format("transport: payload of {} bytes exceeds the limit of {}",
                                       payload.size(), cfg_.maxPayloadBytes));
  }
  if (closed_ || stopping_) return Status(StatusCode::kCancelled, "transport: closed");
  const FrameHeader h = headerFor(kind, meta, limits_.jobHash, cfg_.rank, payload.size());
  if (meta.controlLane) return enqueueOnLane(peer, h, payload);
  return enqueue(peer, h, std::move(payload), timeout);
}

Status ZmqTransport::enqueueOnLane(uint32_t peer, FrameHeader h, const Payload& payload) {
  if (payload.size() > kMaxControlLaneBytes) {
    return invalidArgument(
        fmt::format("transport: a control-lane payload of {} bytes exceeds the lane's limit of {}",
                    payload.size(), kMaxControlLaneBytes));
  }
  if (!reachable(peer)) {
    return failedPrecondition(fmt::format(
        "transport: rank {} has no endpoint at rank {} (transport.peers: none), so it is never "
        "sent to",
        peer, cfg_.rank));
  }
  if (cutOff(peer)) {
    ++partitionDropped_;
    return {};
  }
  h.flags |= kFrameFlagControlLane;
  PeerState& p = peers_[peer];
  auto release = SteadyClock::now();
  // Under link emulation it crosses the link's delay, as a probe does.
  if (p.shaper) release += p.shaper->profile().oneWayDelay;
  {
    std::lock_guard lock(p.mu);
    if (closed_ || stopping_) return Status(StatusCode::kCancelled, "transport: closed");
    // A peer away for long: its oldest questions are stale anyway.
    if (p.lane.size() >= kMaxLaneQueued) p.lane.pop_front();
    p.lane.push_back({release, h, {payload.bytes().begin(), payload.bytes().end()}});
  }
  wake();
  return {};
}

StatusOr<Message> ZmqTransport::receive(MessageKind kind, uint64_t round, uint32_t from,
                                        milliseconds timeout) {
  std::unique_lock lock(inboxMu_);
  const auto key = std::make_pair(static_cast<uint16_t>(kind), round);
  std::optional<Message> found;
  const auto take = [&] {
    auto it = inbox_.find(key);
    if (it == inbox_.end()) return false;
    auto& q = it->second;
    for (auto m = q.begin(); m != q.end(); ++m) {
      if (from == kAnyPeer || m->header.sender == from) {
        found = std::move(*m);
        q.erase(m);
        if (q.empty()) inbox_.erase(it);
        return true;
      }
    }
    return false;
  };
  // A poll (timeout 0) only looks: no wait on the condition variable, whose
  // timed wait is a futex call even when the time is already up. The
  // training thread polls several times a step, and on a machine with more
  // busy threads than cores every system call may hand its core to another.
  const bool ready = timeout.count() <= 0
                         ? take() || closed_
                         : inboxCv_.wait_for(lock, timeout, [&] { return take() || closed_; });
  if (!ready) {
    if (timeout.count() <= 0) return nothingWaiting();
    return deadlineExceeded(fmt::format(
        "transport: no {} message for round {} from {} within {} ms", messageKindName(kind), round,
        from == kAnyPeer ? std::string("any rank") : fmt::format("rank {}", from),
        timeout.count()));
  }
  if (!found) return Status(StatusCode::kCancelled, "transport: closed");
  const bool wasFull = inboxBytes_ >= cfg_.maxInboxBytes;
  inboxBytes_ -= found->payload.size();
  lock.unlock();
  // The I/O thread pauses reading on a full inbox and resumes when woken;
  // otherwise a wake would only cost both threads a system call and a
  // turn of its loop.
  if (wasFull) wake();
  return std::move(*found);
}

uint64_t ZmqTransport::queuedBelowBytes(uint32_t peer) const {
  if (peer >= limits_.worldSize || peer == cfg_.rank || !kernelTells_) return 0;
  const PeerState& p = peers_[peer];
  const int fd = p.sharedDataFd;
  if (fd < 0) return 0;
  const auto k = tcpProgress(fd, endpointPorts_[peer]);
  if (!k || !k->established) return 0;
  return queuedAheadBytes(*k, p.dataHanded - p.dataHandedAtConnect);
}

std::vector<PeerCounters> ZmqTransport::peerCounters() const {
  std::vector<PeerCounters> out;
  for (uint32_t r = 0; r < limits_.worldSize; ++r) {
    if (r == cfg_.rank) continue;
    const PeerState& p = peers_[r];
    PeerCounters c;
    c.peer = r;
    c.bytesSent = p.bytesSent;
    c.bytesReceived = p.bytesReceived;
    c.messagesSent = p.messagesSent;
    c.messagesReceived = p.messagesReceived;
    const uint64_t handshakes = p.handshakes;
    c.reconnects = handshakes > 1 ? handshakes - 1 : 0;
    c.rttSeconds = p.rttSeconds;
    c.minRttSeconds = p.minRttSeconds;
    c.unackedBytes = p.unackedBytes;
    const int64_t oldestNs = p.oldestUnackedNs;
    const int64_t ackNs = p.lastAckNs;
    const int64_t nowNs = SteadyClock::now().time_since_epoch().count();
    c.unackedSeconds = oldestNs == 0 ? 0.0 : std::max<double>(0, (nowNs - oldestNs) * 1e-9);
    c.sinceAckSeconds = ackNs == 0 ? -1.0 : std::max<double>(0, (nowNs - ackNs) * 1e-9);
    c.ackedBytes = p.ackedBytes;
    const int64_t heardNs = p.lastHeardNs;
    c.heard = heardNs != 0;
    const auto since = c.heard ? SteadyClock::time_point(SteadyClock::duration(heardNs)) : started_;
    c.silentSeconds =
        std::max(0.0, std::chrono::duration<double>(SteadyClock::now() - since).count());
    {
      std::lock_guard lock(p.mu);
      c.queuedBytes = p.queuedBytes;
      const auto now = SteadyClock::now();
      for (const Outgoing& o : p.queue) {
        if (!o.departs || *o.departs > now) {
          c.backlogBytes += kFrameHeaderBytes + o.payload.size();
        }
      }
    }
    out.push_back(c);
  }
  return out;
}

TransportCounters ZmqTransport::counters() const {
  TransportCounters c;
  c.refusedKeys = refusedKeys_;
  c.handshakeFailures = handshakeFailures_;
  c.framesRejected = framesRejected_;
  c.partitionDropped = partitionDropped_;
  std::lock_guard lock(rejectMu_);
  c.lastRejectReason = lastRejectReason_;
  return c;
}

bool ZmqTransport::awaitArrival(uint64_t seen, milliseconds timeout) {
  std::unique_lock lock(inboxMu_);
  // A look (timeout 0) makes no futex call, as receive's poll makes none.
  if (arrived_ <= seen && timeout.count() > 0) {
    inboxCv_.wait_for(lock, timeout, [&] { return arrived_ > seen || closed_; });
  }
  return arrived_ > seen;
}

size_t ZmqTransport::discard(const std::function<bool(const FrameHeader&)>& match) {
  size_t n = 0;
  {
    std::lock_guard lock(inboxMu_);
    for (auto it = inbox_.begin(); it != inbox_.end();) {
      auto& q = it->second;
      for (auto m = q.begin(); m != q.end();) {
        if (match(m->header)) {
          inboxBytes_ -= m->payload.size();
          m = q.erase(m);
          ++n;
        } else {
          ++m;
        }
      }
      it = q.empty() ? inbox_.erase(it) : std::next(it);
    }
  }
  if (n > 0) wake();  // reading may have paused on a full inbox
  return n;
}

void ZmqTransport::setUplinkRate(double bytesPerSecond) {
  {
    std::lock_guard lock(uplinkMu_);
    uplink_.setRate(std::max(0.0, bytesPerSecond));
  }
  logger()->info("transport rank {}: emulated uplink now {}", cfg_.rank,
                 bytesPerSecond > 0 ? fmt::format("{:.3g} Mbit/s", bytesPerSecond * 8 / 1e6)
                                    : std::string("unlimited"));
}

void ZmqTransport::setPartitioned(bool cut) {
  if (partitioned_.exchange(cut) == cut) return;
  logger()->info("transport rank {}: emulated partition {}", cfg_.rank,
                 cut ? "begins: traffic with other regions is dropped" : "ends");
  if (!cut) return;
  for (uint32_t r = 0; r < limits_.worldSize; ++r) {
    if (!wanPeer(r) || !reachable(r)) continue;
    PeerState& p = peers_[r];
    std::lock_guard lock(p.mu);
    const auto dropped = std::erase_if(p.queue, [&](const Outgoing& o) {
      // A payload partly handed to ZeroMQ goes on: its chunks must not stop.
      if (o.chunksSent != 0) return false;
      p.queuedBytes -= kFrameHeaderBytes + o.payload.size();
      return true;
    });
    partitionDropped_ += dropped;
    p.space.notify_all();
  }
}

void ZmqTransport::reject(std::string reason) {
  const uint64_t n = ++framesRejected_;
  if (logged(n)) {
    logger()->warn("transport rank {}: rejected frame #{}: {}{}", cfg_.rank, n, reason,
                   rateLimitNote(n));
  }
  std::lock_guard lock(rejectMu_);
  lastRejectReason_ = std::move(reason);
}

// ZAP (RFC 27): admit a CURVE client iff its public key is one of the job's,
// and name the connection after that rank (the "User-Id" of its frames).
void ZmqTransport::handleZap() {
  std::vector<zmq::message_t> req;
  if (!zmq::recv_multipart(*zap_, std::back_inserter(req), zmq::recv_flags::dontwait)) return;
  std::string status = "400";
  std::string text = "malformed ZAP request";
  std::string userId;
  if (req.size() >= 7 && req[0].to_string_view() == "1.0" && req[5].to_string_view() == "CURVE" &&
      req[6].size() == 32) {
    auto it = allowedKeys_.find(bytesKey(req[6].data(), req[6].size()));
    if (it != allowedKeys_.end()) {
      status = "200";
      text = "OK";
      // The rank and the key it authenticated with: a key retired later
      // stops the connection's frames (handleInbound).
      userId = fmt::format("{} {}", it->second, z85Of(req[6].data()));
    } else {
      text = "public key not allowed for this job";
    }
  }
  if (status != "200") {
    const uint64_t n = ++refusedKeys_;
    if (logged(n)) {
      logger()->warn("transport rank {}: refused connection #{} from {}: {}{}", cfg_.rank, n,
                     req.size() > 3 ? req[3].to_string() : std::string("?"), text,
                     rateLimitNote(n));
    }
  }
  std::array<zmq::const_buffer, 6> reply = {
      zmq::str_buffer("1.0"),
      zmq::buffer(req.size() > 1 ? req[1].data() : nullptr, req.size() > 1 ? req[1].size() : 0),
      zmq::buffer(status),
      zmq::buffer(text),
      zmq::buffer(userId),
      zmq::str_buffer("")};
  zmq::send_multipart(*zap_, reply);
}

void ZmqTransport::handleInbound() {
  for (int drained = 0; drained < 64; ++drained) {
    {
      std::lock_guard lock(inboxMu_);
      if (inboxBytes_ >= cfg_.maxInboxBytes) return;  // resume after receive()
    }
    std::vector<zmq::message_t> parts;
    std::optional<size_t> got;
    try {
      got = zmq::recv_multipart(*router_, std::back_inserter(parts), zmq::recv_flags::dontwait);
    } catch (const zmq::error_t& e) {
      reject(fmt::format("receive failed: {}", e.what()));
      return;
    }
    if (!got) return;
    if (parts.size() != 3) {
      reject(fmt::format("expected a header frame and a chunk frame, got {} frame(s)",
                         parts.size() - 1));
      continue;
    }
    // Whatever it carries, the connection it came in on completed its handshake.
    settleRouterConnection(zmq_msg_get(parts[1].handle(), ZMQ_SRCFD));
    auto header = decodeFrameHeader(
        std::span<const std::byte>(static_cast<const std::byte*>(parts[1].data()), parts[1].size()),
        parts[2].size(), limits_);
    if (!header.ok()) {
      reject(header.status().message());
      continue;
    }
    if (cfg_.encrypt) {
      // Set by the ZAP handler for the authenticated connection: "<rank>
      // <public key>".
      const char* user = zmq_msg_gets(parts[1].handle(), "User-Id");
      const std::string_view id = user != nullptr ? user : "";
      const size_t space = id.find(' ');
      const std::string_view who = space == std::string_view::npos ? "nobody" : id.substr(0, space);
      if (std::to_string(header->sender) != who) {
        reject(fmt::format("frame claims sender rank {} but the connection authenticated as {}",
                           header->sender, who));
        continue;
      }
      if (!admittedZ85_.count(std::string(id.substr(space + 1)))) {
        reject(
            fmt::format("frame from rank {} on a connection authenticated with a key retired "
                        "since (key rotation)",
                        header->sender));
        continue;
      }
    }
    if (header->sender == cfg_.rank) {
      reject("frame claims to come from this rank");
      continue;
    }
    if (cutOff(header->sender)) {
      ++partitionDropped_;
      continue;
    }
    PeerState& p = peers_[header->sender];
    p.bytesReceived += kFrameHeaderBytes + parts[2].size();
    p.lastHeardNs = SteadyClock::now().time_since_epoch().count();
    p.silentReconnects = 0;

    // The chunk's message is let go as soon as it is copied into place; a
    // payload of one chunk is handed out as is.
    auto msg = std::make_shared<zmq::message_t>(std::move(parts[2]));
    const std::span<const std::byte> view(static_cast<const std::byte*>(msg->data()), msg->size());
    // Each connection is a stream of its own: a sender's probes and data
    // travel on two, and an old connection may still deliver after a
    // reconnect.
    const int srcFd = zmq_msg_get(parts[1].handle(), ZMQ_SRCFD);
    const auto stream = static_cast<uint64_t>(std::max(srcFd, 0));
    // Acknowledgements name each data connection's chunks in their order; a
    // control-lane frame came on another connection.
    if (acknowledged(header->kind) && (header->flags & kFrameFlagControlLane) == 0) {
      p.ackDue[stream] = *header;
    }
    if ((header->flags & kFrameFlagStriped) != 0) {
      auto out = stripes_.addChunk(*header, Payload(std::move(msg), view), SteadyClock::now());
      if (!out.dropped.ok()) noteStripedDrop(out.dropped);
      for (auto& d : out.ready) deliver(d.header, std::move(d.payload));
      continue;
    }
    auto added = assembler_.add(*header, Payload(std::move(msg), view), stream);
    if (!added.dropped.ok()) reject(added.dropped.message());
    if (!added.complete) continue;
    // What came on the sender's first data connection keeps its place
    // among its striped payloads; probes and the control lane do not wait,
    // nor does a hello: the first message on new connections, it says
    // whether what the old ones held is lost (deliver()).
    const bool ordered =
        (header->flags & kFrameFlagControlLane) == 0 && header->kind != MessageKind::kPing &&
        header->kind != MessageKind::kPong && header->kind != MessageKind::kAck &&
        header->kind != MessageKind::kKeyNotice && header->kind != MessageKind::kHello;
    if (!ordered) {
      deliver(*header, std::move(*added.complete));
      continue;
    }
    auto out = stripes_.addOrdered(*header, std::move(*added.complete));
    for (auto& d : out.ready) deliver(d.header, std::move(d.payload));
  }
}

void ZmqTransport::deliver(const FrameHeader& header, Payload body) {
  PeerState& p = peers_[header.sender];
  ++p.messagesReceived;

  if (p.refused) {
    reject(fmt::format("frame from rank {}, refused for its settings", header.sender));
    return;
  }
  if (header.kind == MessageKind::kHello) {
    // Another incarnation of the sender, or its connections made anew: the
    // striped payloads the old ones were carrying will not be completed.
    const std::pair<uint64_t, uint64_t> hello{header.round, header.step};
    if (p.lastHello && *p.lastHello != hello) {
      auto out = stripes_.forget(header.sender);
      if (!out.dropped.ok()) noteStripedDrop(out.dropped);
      for (auto& d : out.ready) deliver(d.header, std::move(d.payload));
    }
    p.lastHello = hello;
    checkHello(header.sender, body);
    return;
  }
  if (header.kind == MessageKind::kWarmup) return;  // padding: its bytes were its purpose
  if (header.kind == MessageKind::kKeyNotice) {
    takeKeyNotice(header.sender, body);
    return;
  }
  if (header.kind == MessageKind::kPing) {
    FrameHeader pong = header;
    pong.kind = MessageKind::kPong;
    pong.sender = cfg_.rank;
    std::vector<std::byte> echo(body.bytes().begin(), body.bytes().end());
    sendProbe(header.sender, pong, std::move(echo), SteadyClock::now());
    return;
  }
  if (header.kind == MessageKind::kPong) {
    int64_t sentNs = 0;
    if (body.size() == sizeof sentNs) {
      std::memcpy(&sentNs, body.data(), sizeof sentNs);
      const int64_t nowNs = SteadyClock::now().time_since_epoch().count();
      if (nowNs >= sentNs) {
        const double rtt = static_cast<double>(nowNs - sentNs) * 1e-9;
        p.rttSeconds = rtt;
        p.rtts.push_back(rtt);
        if (p.rtts.size() > kMinRttWindow) p.rtts.pop_front();
        p.minRttSeconds = *std::min_element(p.rtts.begin(), p.rtts.end());
      }
    }
    return;
  }
  if (header.kind == MessageKind::kAck) {
    takeAck(header.sender, header, body);
    return;
  }
  Message m{header, std::move(body), SteadyClock::now()};
  m.header.flags &= static_cast<uint16_t>(~kFrameFlagStriped);
  {
    std::lock_guard lock(inboxMu_);
    inboxBytes_ += m.payload.size();
    inbox_[{static_cast<uint16_t>(m.header.kind), m.header.round}].push_back(std::move(m));
    ++arrived_;
  }
  inboxCv_.notify_all();
}

void ZmqTransport::handleMonitor(zmq::socket_t& monitor, PeerState* peer) {
  while (true) {
    const auto event = nextMonitorEvent(monitor);
    if (!event) return;
    const auto [id, value] = *event;
    if (peer != nullptr && id == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) peer->handshakeOnSockets = true;
    if (peer != nullptr && id == ZMQ_EVENT_CONNECTED) {
      peer->dataFd = static_cast<int>(value);
      peer->dataHandedAtConnect = peer->dataHanded.load();
      peer->sharedDataFd = peer->dataFd;
      peer->dataConnectedAt = SteadyClock::now();
      peer->dataConnection.connected();
    }
    if (peer != nullptr && !peer->handshakeOnSockets &&
        (id == ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL || id == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL)) {
      // With the wrong server key the peer cannot open our hello and
      // closes the connection: this is all a client sees of it. (A failure
      // of authentication is the peer refusing our key: its own was right.)
      peer->tryNextKey = true;
    }
    // The peer refused our key. ZeroMQ gives up on such a connection for
    // good; the peer may admit the key soon (a rotation reaches workers at
    // different times), so it is made again a while later.
    if (peer != nullptr && id == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) peer->refusedUs = true;
    // The socket reconnects on its own: the next connection has its own
    // handshake to make.
    if (peer != nullptr && id == ZMQ_EVENT_DISCONNECTED) {
      peer->handshakeOnSockets = false;
      peer->dataFd = -1;
      peer->sharedDataFd = -1;
      peer->dataConnection.disconnected();
      // The chunks of striped payloads it held go on the other connections.
      requeueStriped(*peer, peer->unacked);
    }
    if (peer != nullptr && id == ZMQ_EVENT_HANDSHAKE_SUCCEEDED && ++peer->handshakes > 1) {
      // A new connection (the peer restarted, or we reconnected): the new
      // incarnation has not read our hello yet, and what the old connection
      // held is gone.
      sendHello(static_cast<uint32_t>(peer - peers_.data()));
      requeueStriped(*peer, peer->unacked);
      peer->unacked.clear();
      publishUnacked(*peer);
    }
    if (peer == nullptr) trackRouterConnection(id, value);
  }
}

void ZmqTransport::handleProbeMonitor(PeerState& p) {
  while (p.probeMonitor) {
    const auto event = nextMonitorEvent(*p.probeMonitor);
    if (!event) return;
    const auto [id, value] = *event;
    if (id == ZMQ_EVENT_CONNECTED) p.probeFd = static_cast<int>(value);
    if (id == ZMQ_EVENT_DISCONNECTED) p.probeFd = -1;
  }
}

// Counts the ROUTER's connections that never become a peer. ZeroMQ reports a
// failed handshake for most of them, but not for a client that opens with
// bytes that are not ZMTP at all (a port scanner, an HTTP request): those
// only show as accepted, then disconnected. So every accepted connection is
// followed until it closes, by its file descriptor (the value of the
// ACCEPTED and DISCONNECTED events); one that closes before it is known to
// have completed a handshake, without a failure event, is such a junk
// connection.
//
// A success event does not name its connection: it is attributed when only
// one connection is in its handshake, and otherwise when a message names the
// connection (ZMQ_SRCFD; every geotrain peer sends pings). Connections that
// close in their handshake while successes are unattributed may be those
// successes: they are counted only as far as they outnumber them, so a
// junk connection is counted once the successes around it are attributed,
// and a peer that completed its handshake is never counted as junk. A
// failure event comes before the disconnect of its connection, and that
// disconnect is not counted again.
void ZmqTransport::trackRouterConnection(uint16_t event, uint32_t value) {
  const int fd = static_cast<int>(value);
  switch (event) {
    case ZMQ_EVENT_ACCEPTED: routerConnections_[fd] = false; break;
    case ZMQ_EVENT_HANDSHAKE_SUCCEEDED: {
      const auto open = std::count_if(routerConnections_.begin(), routerConnections_.end(),
                                      [](const auto& c) { return !c.second; });
      if (open == 1) {
        std::find_if(routerConnections_.begin(), routerConnections_.end(), [](const auto& c) {
          return !c.second;
        })->second = true;
      } else {
        ++unattributedSuccesses_;
      }
      break;
    }
    case ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL:
      ++failuresToClose_;
      countHandshakeFailure("the client closed or timed out before its handshake completed");
      break;
    case ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL:
      ++failuresToClose_;
      countHandshakeFailure("ZMTP protocol error (not a CURVE client of this job)");
      break;
    case ZMQ_EVENT_HANDSHAKE_FAILED_AUTH:
      ++failuresToClose_;  // counted and logged by the ZAP handler
      break;
    case ZMQ_EVENT_DISCONNECTED: {
      // Its chunks' acknowledgement is no longer repeated with the pings:
      // the sender forgot what it sent on it. (Only the repeat: a new
      // connection may have taken the descriptor, and data already.)
      for (PeerState& p : peers_) p.lastAcked.erase(static_cast<uint64_t>(std::max(fd, 0)));
      const auto it = routerConnections_.find(fd);
      if (it == routerConnections_.end()) break;
      const bool settled = it->second;
      routerConnections_.erase(it);
      if (settled) break;
      if (failuresToClose_ > 0) {
        --failuresToClose_;
      } else {
        ++closedUnknown_;
        countClosedJunk();
      }
      break;
    }
    default: break;
  }
}

void ZmqTransport::settleRouterConnection(int fd) {
  const auto it = routerConnections_.find(fd);
  if (it == routerConnections_.end() || it->second) return;
  it->second = true;
  if (unattributedSuccesses_ > 0) --unattributedSuccesses_;
  countClosedJunk();
}

void ZmqTransport::countClosedJunk() {
  while (closedUnknown_ > unattributedSuccesses_) {
    --closedUnknown_;
    countHandshakeFailure("a connection closed without a ZMTP handshake (not a ZeroMQ client)");
  }
}

void ZmqTransport::countHandshakeFailure(std::string_view what) {
  const uint64_t n = ++handshakeFailures_;
  if (logged(n)) {
    logger()->warn("transport rank {}: failed handshake #{}: {}{}", cfg_.rank, n, what,
                   rateLimitNote(n));
  }
}

std::optional<SteadyClock::time_point> ZmqTransport::flush(uint32_t peer,
                                                           SteadyClock::time_point now) {
  PeerState& p = peers_[peer];
  if (!flushResend(p, now)) {
    p.blocked = true;
    return std::nullopt;
  }
  while (true) {
    Outgoing o;
    {
      std::lock_guard lock(p.mu);
      if (p.queue.empty()) return std::nullopt;
      if (p.queue.front().release > now) return p.queue.front().release;
      o = std::move(p.queue.front());
      p.queue.pop_front();
    }
    const uint64_t bytes = kFrameHeaderBytes + o.payload.size();
    const size_t size = o.payload.size();
    const size_t chunks = o.chunks();
    uint64_t wireBytes = 0;  // headers and chunks ZeroMQ took in this call
    bool sent = true;
    std::optional<SteadyClock::time_point>
        nextChunkAt;  // the next chunk is still on the emulated link
    try {
      // Each chunk is one [header][chunk] message. The chunks of a payload
      // go out in order: nothing else is sent to this peer before its last
      // one (the queue's head stays until then). A striped payload's go
      // over all the peer's data connections, its last one on the first.
      for (; o.chunksSent < chunks; ++o.chunksSent) {
        if (!o.chunkRelease.empty() && o.chunkRelease[o.chunksSent] > now) {
          nextChunkAt = o.chunkRelease[o.chunksSent];
          sent = false;
          break;
        }
        const size_t off = o.chunksSent * o.chunkBytes;
        const size_t len = std::min(o.chunkBytes, size - std::min(size, off));
        FrameHeader h = o.header;
        h.payloadOffset = off;
        // Zero copy: the chunk frame references the payload and keeps its
        // owner alive until ZeroMQ has encrypted and sent it.
        Payload chunk(o.payload.owner(), o.payload.bytes().subspan(off, len));
        if (o.striped) {
          h.flags |= kFrameFlagStriped;
          if (!sendStriped(p, h, chunk, now)) {
            sent = false;
            break;
          }
        } else {
          if (!sendChunk(*p.dealer, h, chunk)) {
            sent = false;  // no live connection or HWM reached
            break;
          }
          p.dataHanded += kFrameHeaderBytes + len;
          if (acknowledged(h.kind)) {
            if (p.unacked.size() >= kMaxUnackedChunks) p.unacked.pop_front();  // never acked
            p.unacked.push_back({h.kind,
                                 h.round,
                                 h.step,
                                 off,
                                 h.payloadBytes,
                                 kFrameHeaderBytes + len,
                                 now,
                                 {},
                                 {},
                                 p.dataConnection.stamp()});
          }
        }
        wireBytes += kFrameHeaderBytes + len;
      }
    } catch (const zmq::error_t& e) {
      logger()->warn("transport rank {}: send to rank {} failed: {}", cfg_.rank, peer, e.what());
      sent = true;  // drop the rest: at-most-once delivery
    }
    publishUnacked(p);
    std::lock_guard lock(p.mu);
    p.bytesSent += wireBytes;
    if (nextChunkAt) {  // the rest when the link has carried it
      o.release = *nextChunkAt;
      p.queue.push_front(std::move(o));
      return nextChunkAt;
    }
    if (!sent) {  // retry the remaining chunks on POLLOUT
      p.queue.push_front(std::move(o));
      p.blocked = true;
      return std::nullopt;
    }
    p.queuedBytes -= bytes;
    p.space.notify_all();
    ++p.messagesSent;
  }
}

bool ZmqTransport::sendChunk(zmq::socket_t& socket, const FrameHeader& h, const Payload& chunk) {
  std::array<std::byte, kFrameHeaderBytes> header;
  encodeFrameHeader(h, std::span<std::byte, kFrameHeaderBytes>(header));
  if (!socket
           .send(zmq::buffer(header.data(), header.size()),
                 zmq::send_flags::sndmore | zmq::send_flags::dontwait)
           .has_value()) {
    return false;
  }
  // Once the first frame is accepted ZeroMQ accepts the whole message.
  auto* keep = new Payload(chunk);
  zmq::message_t body(
      const_cast<std::byte*>(keep->data()), keep->size(),
      [](void*, void* hint) { delete static_cast<Payload*>(hint); }, keep);
  (void)socket.send(body, zmq::send_flags::dontwait);
  return true;
}

bool ZmqTransport::sendStriped(PeerState& p, const FrameHeader& h, const Payload& chunk,
                               SteadyClock::time_point now) {
  const size_t n = 1 + p.stripes.size();
  const bool last = h.payloadOffset + chunk.size() == h.payloadBytes;
  for (size_t tried = 0; tried < (last ? 1 : n); ++tried) {
    const size_t k = last ? 0 : (p.nextStripe + tried) % n;
    zmq::socket_t* socket = k == 0                    ? &*p.dealer
                            : p.stripes[k - 1].dealer ? &*p.stripes[k - 1].dealer
                                                      : nullptr;
    const ConnectionSerial& connection = k == 0 ? p.dataConnection : p.stripes[k - 1].connection;
    // Not to a connection known to have ended: the socket may still take
    // the chunk into the ended connection's pipe, where it would be lost.
    if (socket == nullptr || connection.knownDown() || !sendChunk(*socket, h, chunk)) continue;
    if (k == 0) p.dataHanded += kFrameHeaderBytes + chunk.size();
    if (!last) p.nextStripe = (k + 1) % n;
    std::deque<SentChunk>& unacked = k == 0 ? p.unacked : p.stripes[k - 1].unacked;
    if (unacked.size() >= kMaxUnackedChunks) unacked.pop_front();
    unacked.push_back({h.kind, h.round, h.step, h.payloadOffset, h.payloadBytes,
                       kFrameHeaderBytes + chunk.size(), now, h, chunk, connection.stamp()});
    return true;
  }
  return false;
}

bool ZmqTransport::flushResend(PeerState& p, SteadyClock::time_point now) {
  bool any = false;
  while (!p.resend.empty()) {
    const SentChunk& c = p.resend.front();
    if (!sendStriped(p, *c.header, c.chunk, now)) break;
    p.bytesSent += c.wireBytes;
    p.resend.pop_front();
    any = true;
  }
  if (any) publishUnacked(p);
  return p.resend.empty();
}

void ZmqTransport::requeueStriped(PeerState& p, std::deque<SentChunk>& unacked) {
  for (auto it = unacked.begin(); it != unacked.end();) {
    if (it->header) {
      p.resend.push_back(std::move(*it));
      it = unacked.erase(it);
    } else {
      ++it;
    }
  }
  publishUnacked(p);
}

void ZmqTransport::sendPings(SteadyClock::time_point now) {
  const int64_t ns = now.time_since_epoch().count();
  for (uint32_t r = 0; r < limits_.worldSize; ++r) {
    if (!reachable(r)) continue;
    std::vector<std::byte> stamp(sizeof ns);
    std::memcpy(stamp.data(), &ns, sizeof ns);
    FrameHeader h;
    h.kind = MessageKind::kPing;
    h.jobHash = limits_.jobHash;
    h.sender = cfg_.rank;
    h.elementCount = sizeof ns;
    h.payloadBytes = sizeof ns;
    sendProbe(r, h, std::move(stamp), now);
    for (const auto& [stream, got] : peers_[r].lastAcked) peers_[r].ackDue.try_emplace(stream, got);
  }
  sendAcks(now);
}

bool ZmqTransport::sendProbe(uint32_t peer, FrameHeader h, std::vector<std::byte> body,
                             SteadyClock::time_point now) {
  if (!reachable(peer)) return false;
  if (cutOff(peer)) {
    ++partitionDropped_;
    return true;  // lost on the (emulated) way, as on a real link
  }
  h.jobHash = limits_.jobHash;
  h.sender = cfg_.rank;
  h.elementCount = body.size();
  h.payloadBytes = body.size();
  h.payloadOffset = 0;
  PeerState& p = peers_[peer];
  // Under link emulation a probe crosses the link's delay, but never waits
  // behind the data queued for the link.
  if (p.shaper && p.shaper->profile().oneWayDelay.count() > 0) {
    p.probes.push_back({now + p.shaper->profile().oneWayDelay, h, std::move(body)});
    return true;
  }
  return writeProbe(peer, h, body);
}

bool ZmqTransport::writeProbe(uint32_t peer, const FrameHeader& h,
                              const std::vector<std::byte>& body) {
  PeerState& p = peers_[peer];
  std::array<std::byte, kFrameHeaderBytes> header;
  encodeFrameHeader(h, std::span<std::byte, kFrameHeaderBytes>(header));
  try {
    if (!p.probe
             ->send(zmq::buffer(header.data(), header.size()),
                    zmq::send_flags::sndmore | zmq::send_flags::dontwait)
             .has_value()) {
      return false;  // no connection (yet): the next probe follows soon
    }
    (void)p.probe->send(zmq::buffer(body.data(), body.size()), zmq::send_flags::dontwait);
    p.bytesSent += kFrameHeaderBytes + body.size();
    return true;
  } catch (const zmq::error_t& e) {
    logger()->debug("transport rank {}: probe to rank {} failed: {}", cfg_.rank, peer, e.what());
    return false;
  }
}

std::optional<SteadyClock::time_point> ZmqTransport::flushProbes(SteadyClock::time_point now) {
  std::optional<SteadyClock::time_point> next;
  for (uint32_t r = 0; r < limits_.worldSize; ++r) {
    if (!reachable(r)) continue;
    PeerState& p = peers_[r];
    while (!p.probes.empty() && p.probes.front().release <= now) {
      if (!cutOff(r)) writeProbe(r, p.probes.front().header, p.probes.front().body);
      p.probes.pop_front();
    }
    if (!p.probes.empty())
      next = std::min(next.value_or(p.probes.front().release), p.probes.front().release);
    std::lock_guard lock(p.mu);
    while (!p.lane.empty() && p.lane.front().release <= now) {
      if (cutOff(r)) {
        ++partitionDropped_;
      } else if (!writeProbe(r, p.lane.front().header, p.lane.front().body)) {
        // No connection yet: in order, so the rest wait too. Tried again
        // soon; a connection completes within a few round trips.
        next = std::min(next.value_or(now + kLaneRetry), now + kLaneRetry);
        break;
      } else {
        ++p.messagesSent;
      }
      p.lane.pop_front();
    }
    if (!p.lane.empty() && p.lane.front().release > now)
      next = std::min(next.value_or(p.lane.front().release), p.lane.front().release);
  }
  return next;
}

void ZmqTransport::sendAcks(SteadyClock::time_point now) {
  for (uint32_t r = 0; r < limits_.worldSize; ++r) {
    if (!reachable(r)) continue;
    PeerState& p = peers_[r];
    while (!p.ackDue.empty()) {
      const auto [stream, got] = *p.ackDue.begin();
      FrameHeader h;
      h.kind = MessageKind::kAck;
      h.round = got.round;
      h.step = got.step;
      const uint64_t fields[3] = {static_cast<uint64_t>(got.kind), got.payloadOffset,
                                  got.payloadBytes};
      std::vector<std::byte> body(sizeof fields);
      std::memcpy(body.data(), fields, sizeof fields);
      // Kept until it leaves: a lost acknowledgement would hold the peer's
      // next round back (DTS paces its rounds by them) until more data came.
      if (!sendProbe(r, h, std::move(body), now)) break;
      p.lastAcked[stream] = got;
      // Connections come and go (a stream is a connection's descriptor): the
      // oldest-numbered are forgotten beyond a handful.
      if (p.lastAcked.size() > kMaxAckedStreams) p.lastAcked.erase(p.lastAcked.begin());
      p.ackDue.erase(p.ackDue.begin());
    }
  }
}

void ZmqTransport::takeAck(uint32_t peer, const FrameHeader& h, const Payload& body) {
  uint64_t fields[3];
  if (body.size() != sizeof fields) {
    reject(fmt::format("an acknowledgement from rank {} of {} bytes (expected {})", peer,
                       body.size(), sizeof fields));
    return;
  }
  std::memcpy(fields, body.data(), sizeof fields);
  PeerState& p = peers_[peer];
  // The chunk named is done. Those before it in its list that left on the
  // same connection while it was up arrived before it (a connection keeps
  // its order); the others before it were handed to connections that were
  // ending, and are lost: a striped payload's are sent again, another
  // message's are not (delivery is at most once).
  const auto take = [&](std::deque<SentChunk>& unacked) {
    const auto it = std::find_if(unacked.begin(), unacked.end(), [&](const SentChunk& c) {
      return static_cast<uint64_t>(c.kind) == fields[0] && c.round == h.round && c.step == h.step &&
             c.offset == fields[1] && c.payloadBytes == fields[2];
    });
    if (it == unacked.end()) return false;
    const ConnectionSerial connection = it->connection;
    uint64_t arrivedBytes = it->wireBytes;
    for (auto before = unacked.begin(); before != it; ++before) {
      const bool arrived = connection.up() && before->connection.value == connection.value;
      if (arrived) arrivedBytes += before->wireBytes;
      if (!arrived && before->header) p.resend.push_back(std::move(*before));
    }
    p.ackedBytes += arrivedBytes;
    unacked.erase(unacked.begin(), it + 1);
    return true;
  };
  bool found = take(p.unacked);
  for (size_t i = 0; !found && i < p.stripes.size(); ++i) {
    if (take(p.stripes[i].unacked)) {
      found = true;
      p.stripes[i].lastAck = SteadyClock::now();
    }
  }
  if (!found) return;  // sent on a connection since replaced, or never ours
  p.lastAckNs = SteadyClock::now().time_since_epoch().count();
  p.keptCarrying = false;
  p.slowAckLogged = false;
  publishUnacked(p);
}

void ZmqTransport::publishUnacked(PeerState& p) {
  uint64_t bytes = 0;
  int64_t oldest = 0;
  const auto add = [&](const std::deque<SentChunk>& unacked) {
    for (const SentChunk& c : unacked) bytes += c.wireBytes;
    if (unacked.empty()) return;
    const int64_t at = unacked.front().sentAt.time_since_epoch().count();
    oldest = oldest == 0 ? at : std::min(oldest, at);
  };
  add(p.unacked);
  for (const Stripe& stripe : p.stripes) add(stripe.unacked);
  // Chunks waiting to be sent again were handed to the network once.
  add(p.resend);
  p.unackedBytes = bytes;
  p.oldestUnackedNs = oldest;
}

bool ZmqTransport::renewConnections(uint32_t peer, bool drainOld) {
  Status s;
  try {
    s = openPeerSockets(peer, drainOld);
  } catch (const zmq::error_t& e) {
    s = internalError(e.what());
  }
  if (!s.ok()) {
    logger()->warn("transport rank {}: reconnecting to {} failed: {}", cfg_.rank, rankName(peer),
                   s.message());
    return false;
  }
  // What the old connection held is gone with it (or, drained, no longer
  // ours to acknowledge).
  PeerState& p = peers_[peer];
  p.unacked.clear();
  for (Stripe& stripe : p.stripes) stripe.unacked.clear();
  p.resend.clear();
  publishUnacked(p);
  p.blocked = false;
  // The first message on the new connections says they are new: the peer
  // then stops waiting for the striped payloads whose chunks the old ones
  // held (StripeAssembler::forget).
  ++p.generation;
  sendHello(peer, /*first=*/true);
  return true;
}

void ZmqTransport::reconnect(uint32_t peer, const std::string& why) {
  PeerState& p = peers_[peer];
  if (!renewConnections(peer)) return;
  // The first of a silence at info; the retries while it lasts at debug.
  const bool first = !p.silentReconnects++;
  logger()->log(first ? spdlog::level::info : spdlog::level::debug,
                "transport rank {}: {}; new connections to {}{}", cfg_.rank, why, rankName(peer),
                first ? fmt::format(" (again every {:.1f} s while it stays silent)",
                                    std::chrono::duration<double>(cfg_.reconnectAfter).count())
                      : std::string());
}

std::optional<TcpProgress> ZmqTransport::kernelState(uint32_t r, int fd) const {
  if (fd < 0 || !kernelTells_) return std::nullopt;
  // Checked against the endpoint's port, so that a descriptor reused since
  // its connection closed is not read for it.
  auto state = tcpProgress(fd, endpointPorts_[r]);
  if (!state || !state->established) return std::nullopt;
  return state;
}

// The rules below replace connections that carry nothing: the peer silent
// (a partition, a peer gone), or heard but none of our data acknowledged,
// which after a partition is a connection whose retransmission timer backed
// off for longer than the cut (a new one sends at once). What a replaced
// connection held is lost, though, and on a saturated path that is the
// costly mistake: there the peer's acknowledgements and pings, thin flows
// across its own busy uplink, come seconds late (their lost packets wait for
// a backed-off timer) while our data connection delivers megabytes a second
// (tcp_state.h). So before a connection is replaced for what the peer did
// not say, its kernel is asked whether the peer's kernel still acknowledges
// our bytes on it; one that does is kept.
void ZmqTransport::reconnectStalled(SteadyClock::time_point now) {
  if (cfg_.reconnectAfter.count() <= 0) return;
  const int64_t nowNs = now.time_since_epoch().count();
  for (uint32_t r = 0; r < limits_.worldSize; ++r) {
    if (!reachable(r)) continue;
    PeerState& p = peers_[r];
    if (p.lastReconnect && now - *p.lastReconnect < cfg_.reconnectAfter) continue;
    if (now < p.keptUntil) continue;
    const int64_t heardNs = p.lastHeardNs;
    if (heardNs == 0) continue;  // never heard: ZeroMQ keeps trying on its own
    const double silent = (nowNs - heardNs) * 1e-9;
    const double after = std::chrono::duration<double>(cfg_.reconnectAfter).count();
    // A connection to the peer that the peer's kernel acknowledged within
    // `within` s: the path carries our bytes. `lenient`, for a connection
    // the peer is heard beside (`stuck`: for how long none of our data on
    // it was acknowledged by the peer's process), also one whose kernel
    // has had an ACK and sends again within 4 times the bound
    // (retransmissions lost in full queues, the ACKs themselves lost on the
    // peer's full uplink, the timer backed off a few times: a new
    // connection would send sooner, but lose what the old one holds --
    // for a model-sized payload, far more than the wait), or whose kernel
    // holds nothing of ours (the peer's kernel has all it was given, its
    // process has not acknowledged it yet) for up to 4 times the bound: a
    // process that never does (hung, or dropping what its kernel took) is
    // replaced as before, as is a connection whose timer backed off
    // further (after a partition it may not send for a minute).
    const auto carries = [&](int fd, double within, bool lenient,
                             double stuck = 0) -> std::optional<TcpProgress> {
      auto k = kernelState(r, fd);
      if (!k) return std::nullopt;
      if (k->sinceAckSeconds < within) return k;
      if (!lenient) return std::nullopt;
      if (k->outstanding() ? retransmitsSoon(*k, 4 * within, 4 * within) : stuck < 4 * within) {
        return k;
      }
      return std::nullopt;
    };
    // What the kernel says of a connection, for a message.
    const auto kernelSays = [](const TcpProgress& k) {
      return fmt::format(
          " (its kernel: {} segments unacknowledged, no ACK for {:.1f} s, sends "
          "again within {:.1f} s, backed off {} times)",
          k.unackedSegments, k.sinceAckSeconds, k.retryInSeconds(), k.backoff);
    };
    const int dataFd = p.handshakeOnSockets ? p.dataFd : -1;
    const auto keep = [&](const std::string& what, const TcpProgress& k) {
      p.keptUntil = now + std::chrono::milliseconds(200);
      if (p.keptCarrying) return;
      p.keptCarrying = true;
      logger()->info(
          "transport rank {}: {}, but the kernel says the connection carries our data ({}, the "
          "last ACK from {} {:.1f} s ago{}): the path works (a busy uplink, a paused peer); the "
          "connection is kept",
          cfg_.rank, what,
          k.outstanding() ? fmt::format("{} segments in flight", k.unackedSegments)
                          : std::string("all of it delivered"),
          rankName(r), k.sinceAckSeconds,
          k.outstanding() && k.backoff > 0
              ? fmt::format(", retransmitting again within {:.1f} s", k.retryInSeconds())
              : std::string());
    };
    if (silent >= after) {
      // A silence the kernel contradicts (tcp_state.h): the peer's kernel
      // acknowledges our data, or our pings only wait in full queues.
      const auto data = kernelState(r, dataFd);
      const auto probe = kernelState(r, p.probeFd);
      const bool dataAcked = data && dataVouchesThroughSilence(*data, after);
      const bool probeAcked = probe && probeVouchesThroughSilence(*probe, after);
      if (dataAcked || probeAcked) {
        keep(fmt::format("{} silent for {:.1f} s", rankName(r), silent),
             dataAcked ? *data : *probe);
        continue;
      }
      p.lastReconnect = now;
      reconnect(r, fmt::format("{} silent for {:.1f} s{}{}", rankName(r), silent,
                               data ? "; data" + kernelSays(*data) : std::string(),
                               probe ? "; probe" + kernelSays(*probe) : std::string()));
      continue;
    }
    // An extra data connection whose chunks stay unacknowledged for long
    // while the peer is heard: replaced alone, what it held sent again on
    // the others (a connection can stall alone: its packets lost on one
    // path of several, its retransmission timer backed off).
    for (size_t i = 0; i < p.stripes.size(); ++i) {
      Stripe& stripe = p.stripes[i];
      if (stripe.unacked.empty()) continue;
      const auto since = std::max(stripe.lastAck.value_or(stripe.unacked.front().sentAt),
                                  stripe.unacked.front().sentAt);
      const double stuck = std::chrono::duration<double>(now - since).count();
      if (stuck >= 2.5 * after) {
        // Its kernel vouches for chunks sent on its current connection only.
        const int fd = stripe.unacked.front().sentAt >= stripe.connectedAt ? stripe.fd : -1;
        if (carries(fd, 2.5 * after, /*lenient=*/true, stuck)) {
          p.keptUntil = now + std::chrono::milliseconds(200);
          continue;  // its chunks are acknowledged late, not lost
        }
        reopenStripe(r, i,
                     fmt::format("data connection {} to {} has had nothing acknowledged for "
                                 "{:.1f} s",
                                 i + 2, rankName(r), stuck));
      }
    }
    // Heard (its probes arrive) but none of our data acknowledged for long
    // while some is outstanding: the data connection alone is stuck.
    if (!p.unacked.empty()) {
      const int64_t ackNs = p.lastAckNs;
      const int64_t since =
          std::max<int64_t>(ackNs, p.unacked.front().sentAt.time_since_epoch().count());
      const double stuck = (nowNs - since) * 1e-9;
      // At debug, once a wait: our data unacknowledged for a second while
      // the peer is heard, with what our kernel says of the connection. A
      // peer that waits seconds for our round sees only the wait; a
      // retransmission timer that backed off after a loss in a full queue
      // shows here, on the sender's side.
      if (stuck >= 1.0 && !p.slowAckLogged && logger()->should_log(spdlog::level::debug)) {
        p.slowAckLogged = true;
        const auto data = kernelState(r, dataFd);
        logger()->debug(
            "transport rank {}: our data to {} unacknowledged for {:.1f} s while it "
            "is heard{}",
            cfg_.rank, rankName(r), stuck,
            data ? kernelSays(*data) : std::string(" (no kernel state)"));
      }
      if (stuck >= 2.5 * after) {
        // The kernel vouches for chunks sent on the current connection only:
        // what an earlier one held (ZeroMQ reconnects on its own) is lost.
        const int fd = p.unacked.front().sentAt >= p.dataConnectedAt ? dataFd : -1;
        if (auto k = carries(fd, 2.5 * after, /*lenient=*/true, stuck)) {
          keep(fmt::format("{} heard, but none of our data acknowledged by it for {:.1f} s",
                           rankName(r), stuck),
               *k);
          continue;
        }
        p.lastReconnect = now;
        const auto data = kernelState(r, dataFd);
        reconnect(r, fmt::format("none of our data acknowledged by {} for {:.1f} s although it is "
                                 "heard{}",
                                 rankName(r), stuck, data ? kernelSays(*data) : std::string()));
      }
    }
  }
}

// Every rank's key list not empty, every key Z85 and of one rank only, and
// the secret key's public key this rank's first.
Status validateKeySet(const KeySet& keys, uint32_t rank, size_t world) {
  if (keys.publicKeys.size() != world) {
    return invalidArgument(
        fmt::format("transport: new keys: publicKeys has {} entries, need one list per rank ({})",
                    keys.publicKeys.size(), world));
  }
  std::map<std::string, size_t> owner;
  for (size_t r = 0; r < world; ++r) {
    if (keys.publicKeys[r].empty()) {
      return invalidArgument(fmt::format("transport: new keys: rank {} has no public key", r));
    }
    for (const std::string& k : keys.publicKeys[r]) {
      if (!keys::isZ85Key(k)) {
        return invalidArgument(fmt::format(
            "transport: new keys: a public key of rank {} is not a 40-character Z85 key", r));
      }
      const auto [it, fresh] = owner.emplace(k, r);
      if (!fresh && it->second != r) {
        return invalidArgument(fmt::format(
            "transport: new keys: ranks {} and {} share a public key: every worker needs its own "
            "keypair",
            it->second, r));
      }
    }
  }
  auto derived = keys::publicKeyOf(keys.secretKey);
  if (!derived.ok()) return derived.status().withContext("transport: new keys: secretKey");
  if (*derived != keys.publicKeys[rank].front()) {
    return invalidArgument(fmt::format(
        "transport: new keys: secretKey does not belong to rank {}'s first public key (this "
        "rank's)",
        rank));
  }
  return {};
}

Status ZmqTransport::updateKeys(const KeySet& keys) {
  if (!cfg_.encrypt) {
    return failedPrecondition("transport: keys cannot change on a transport without CURVE");
  }
  GEO_RETURN_IF_ERROR(validateKeySet(keys, cfg_.rank, limits_.worldSize));
  KeySet unique = keys;  // a key listed twice for a rank is one key
  for (auto& list : unique.publicKeys) {
    std::vector<std::string> seen;
    for (const std::string& k : list) {
      if (std::find(seen.begin(), seen.end(), k) == seen.end()) seen.push_back(k);
    }
    list = std::move(seen);
  }
  std::future<Status> done;
  {
    std::lock_guard lock(keyChangeMu_);
    if (keyChange_)
      keyChange_->done.set_value(aborted("transport: replaced by a later key change"));
    keyChange_.emplace();
    keyChange_->keys = std::move(unique);
    done = keyChange_->done.get_future();
  }
  wake();
  // A rebind waits at most a couple of seconds for the port (rebindRouter).
  if (done.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
    return deadlineExceeded("transport: the I/O thread did not take the new keys within 10 s");
  }
  return done.get();
}

void ZmqTransport::applyKeyChange() {
  std::optional<KeyChange> change;
  {
    std::lock_guard lock(keyChangeMu_);
    change.swap(keyChange_);
  }
  if (!change) return;
  if (stopping_) {
    change->done.set_value(unavailable("transport: shutting down"));
    return;
  }
  Status s;
  try {
    s = applyKeys(change->keys);
  } catch (const zmq::error_t& e) {
    s = internalError(fmt::format("transport: applying new keys: {}", e.what()));
  }
  change->done.set_value(std::move(s));
}

Status ZmqTransport::applyKeys(const KeySet& keys) {
  const bool ownChanged = keys.secretKey != secretKey_;
  std::set<std::string> now;
  for (const auto& list : keys.publicKeys) now.insert(list.begin(), list.end());
  size_t retired = 0;
  for (const auto& list : keys_) {
    retired += static_cast<size_t>(std::count_if(
        list.begin(), list.end(), [&](const std::string& k) { return !now.count(k); }));
  }
  size_t added = 0;
  for (size_t r = 0; r < keys_.size(); ++r) {
    for (const std::string& k : keys.publicKeys[r]) {
      added += std::find(keys_[r].begin(), keys_[r].end(), k) == keys_[r].end();
    }
  }
  if (!ownChanged && keys.publicKeys == keys_) return {};
  const std::vector<std::vector<std::string>> before = std::exchange(keys_, keys.publicKeys);
  secretKey_ = keys.secretKey;
  publicKey_ = keys_[cfg_.rank].front();
  admitKeys();
  // Connections to a peer stay while the key they were made with is still
  // one of its keys (a peer that has not switched yet keeps working).
  std::vector<uint32_t> remade;
  for (uint32_t r = 0; r < limits_.worldSize; ++r) {
    if (!reachable(r)) continue;
    PeerState& p = peers_[r];
    if (ownChanged) {
      // Our new public key, on the connection about to close (it gets a
      // moment to deliver it: openPeerSockets' drainOld): the peer
      // connects to our new listener with it at once (kKeyNotice).
      std::vector<std::byte> body(publicKey_.size());
      std::memcpy(body.data(), publicKey_.data(), body.size());
      FrameHeader h;
      h.kind = MessageKind::kKeyNotice;
      h.codec = CodecId::kRaw;
      sendProbe(r, h, std::move(body), SteadyClock::now());
    }
    const std::string& inUse = before[r][std::min(p.serverKey, before[r].size() - 1)];
    const auto it = std::find(keys_[r].begin(), keys_[r].end(), inUse);
    p.serverKey = it == keys_[r].end() ? 0 : static_cast<size_t>(it - keys_[r].begin());
    if (!ownChanged && it != keys_[r].end()) continue;
    // Our old connections stay up a moment to deliver what they hold:
    // the peer still admits our old key until the rotation ends.
    if (!renewConnections(r, ownChanged && it != keys_[r].end())) {
      return unavailable(fmt::format("transport: new connections to {} failed", rankName(r)));
    }
    remade.push_back(r);
  }
  // A CURVE server has one key per listener: a new one is a new listener.
  // A retired key needs none: the frames of a connection made with it are
  // refused from now on (handleInbound), and a new one is refused by ZAP.
  if (ownChanged) GEO_RETURN_IF_ERROR(rebindRouter());
  logger()->info(
      "transport rank {}: keys changed: {} public key(s) admitted anew, {} retired{}{}{}",
      cfg_.rank, added, retired, ownChanged ? "; this worker's own keypair is new" : "",
      remade.empty() ? "" : fmt::format("; new connections to {} peer(s)", remade.size()),
      ownChanged ? "; the listener was made anew with it, and every connection to it is made again"
                 : "");
  return {};
}

void ZmqTransport::admitKeys() {
  allowedKeys_.clear();
  admittedZ85_.clear();
  for (uint32_t r = 0; r < keys_.size(); ++r) {
    for (const std::string& k : keys_[r]) {
      const auto key = decodeKey(k);
      allowedKeys_[bytesKey(key.data(), key.size())] = r;
      admittedZ85_.insert(k);
    }
  }
}

Status ZmqTransport::rebindRouter() {
  // Unbinding closes the listener and, with it, every connection it
  // accepted (they are its children in libzmq): each peer's socket
  // reconnects within its reconnect interval and is authenticated again.
  router_->unbind(boundAt_);
  setCurveKey(*router_, zmq::sockopt::curve_secretkey, secretKey_);
  // The old listening socket is closed by ZeroMQ's own I/O thread, a moment
  // after unbind() returns: until then the port is taken.
  const auto deadline = SteadyClock::now() + std::chrono::seconds(3);
  while (true) {
    try {
      router_->bind(boundAt_);
      return {};
    } catch (const zmq::error_t& e) {
      if (e.num() != EADDRINUSE || SteadyClock::now() >= deadline) {
        return unavailable(fmt::format("transport: cannot bind {} again with the new key: {}",
                                       boundAt_, e.what()));
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

void ZmqTransport::takeKeyNotice(uint32_t peer, const Payload& body) {
  if (!reachable(peer) || keys_.size() <= peer) return;
  const std::string key(reinterpret_cast<const char*>(body.data()), body.size());
  const auto it = std::find(keys_[peer].begin(), keys_[peer].end(), key);
  if (it == keys_[peer].end()) {
    logger()->warn(
        "transport rank {}: {} switched to a key this worker does not admit yet: its next public "
        "key must reach every worker before any switches (docs/security.md, \"Rotating keys\")",
        cfg_.rank, rankName(peer));
    return;
  }
  PeerState& p = peers_[peer];
  const auto index = static_cast<size_t>(it - keys_[peer].begin());
  if (index == p.serverKey && p.handshakeOnSockets) return;
  p.serverKey = index;
  p.lastKeyTry = SteadyClock::now();
  logger()->debug("transport rank {}: {} switched keys; new connections with its new one",
                  cfg_.rank, rankName(peer));
  renewConnections(peer);
}

void ZmqTransport::retryHandshakes() {
  const auto now = SteadyClock::now();
  for (uint32_t r = 0; r < limits_.worldSize; ++r) {
    if (!reachable(r)) continue;
    PeerState& p = peers_[r];
    const bool otherKey = p.tryNextKey && keys_.size() > r && keys_[r].size() > 1;
    p.tryNextKey = otherKey;
    if (!otherKey && !p.refusedUs) continue;
    // Not faster than ZeroMQ's own reconnect interval: while no key works
    // (the peer restarting, or refusing us), the tries stay a trickle.
    if (p.lastKeyTry && now - *p.lastKeyTry < (otherKey ? kKeyTryEvery : kRefusedRetry)) continue;
    p.lastKeyTry = now;
    if (otherKey) {
      p.serverKey = (p.serverKey + 1) % keys_[r].size();
      logger()->debug("transport rank {}: a handshake with {} failed; trying its key #{} of {}",
                      cfg_.rank, rankName(r), p.serverKey + 1, keys_[r].size());
    } else {
      logger()->debug("transport rank {}: {} refused our key; trying again", cfg_.rank,
                      rankName(r));
    }
    p.refusedUs = false;
    renewConnections(r);
  }
}

void ZmqTransport::sendHello(uint32_t peer, bool first) {
  if (cfg_.agreedSettings.empty()) return;
  const std::string text = encodeHello(cfg_.agreedSettings);
  std::vector<std::byte> bytes(text.size());
  std::memcpy(bytes.data(), text.data(), text.size());
  // A hello that finds the queue full (a peer that reads nothing) is
  // skipped: the next reconnect sends another.
  // Its header names this transport's incarnation and how many times its
  // connections to the peer were made anew (StripeAssembler::forget).
  enqueueRawOrSkip(peer, MessageKind::kHello, std::move(bytes), first, incarnation_,
                   peers_[peer].generation);
}

void ZmqTransport::enqueueRawOrSkip(uint32_t peer, MessageKind kind, std::vector<std::byte> bytes,
                                    bool first, uint64_t round, uint64_t step) {
  FrameHeader h;
  h.kind = kind;
  h.jobHash = limits_.jobHash;
  h.sender = cfg_.rank;
  h.round = round;
  h.step = step;
  h.elementCount = bytes.size();
  h.payloadBytes = bytes.size();
  (void)enqueue(peer, h, Payload(std::move(bytes)), milliseconds(0), first);
}

void ZmqTransport::sendWarmup(uint32_t peer) {
  if (cfg_.warmupBytes == 0 || !wanPeer(peer)) return;
  // Best effort, like the hello: a full queue skips it.
  enqueueRawOrSkip(peer, MessageKind::kWarmup, std::vector<std::byte>(cfg_.warmupBytes));
}

void ZmqTransport::checkHello(uint32_t peer, const Payload& hello) {
  if (cfg_.agreedSettings.empty()) return;
  const std::string_view text(reinterpret_cast<const char*>(hello.data()), hello.size());
  const auto disagreement = compareHello(text, cfg_.agreedSettings);
  if (!disagreement) return;
  peers_[peer].refused = true;
  const std::string name = rankName(peer);
  // The peer's text goes into logs: printable ASCII only, and bounded.
  const auto printable = [](std::string_view v) {
    std::string out(v.substr(0, 200));
    for (char& c : out) {
      if (c < 0x20 || c > 0x7e) c = '?';
    }
    return out;
  };
  const Status status = failedPrecondition(fmt::format(
      "peer {} runs {} = {}, this worker {} = {}", name, printable(disagreement->key),
      printable(disagreement->theirs), printable(disagreement->key), disagreement->ours));
  reject(status.message());
  if (disagreed_) return;
  disagreed_ = true;
  logger()->error("transport rank {}: {}", cfg_.rank, status.message());
  // The caller may end the process on the report: first let our own hello
  // reach the peer (its DEALER may not even be connected yet), so that the
  // peer refuses us too rather than training on alone.
  pendingRefusal_ = PendingRefusal{status, peer, SteadyClock::now() + kRefusalGrace, std::nullopt};
}

void ZmqTransport::reportRefusalWhenDue(SteadyClock::time_point now) {
  if (!pendingRefusal_) return;
  PendingRefusal& r = *pendingRefusal_;
  if (!r.helloLeft && peers_[r.peer].handshakes > 0) {
    std::lock_guard lock(peers_[r.peer].mu);
    const bool queued =
        std::any_of(peers_[r.peer].queue.begin(), peers_[r.peer].queue.end(),
                    [](const Outgoing& o) { return o.header.kind == MessageKind::kHello; });
    if (!queued) r.helloLeft = now;
  }
  // Handed to ZeroMQ is not yet on the wire: its I/O thread writes it
  // within moments.
  if (now < r.deadline && (!r.helloLeft || now < *r.helloLeft + milliseconds(300))) return;
  const Status status = r.status;
  pendingRefusal_.reset();
  if (cfg_.onDisagreement) cfg_.onDisagreement(status);
}

void ZmqTransport::dropQueuedPings() {
  for (auto& p : peers_) {
    std::lock_guard lock(p.mu);
    std::erase_if(p.queue, [&](const Outgoing& o) {
      // A payload partly handed to ZeroMQ goes on: its chunks must not stop.
      const bool ping = o.chunksSent == 0 && (o.header.kind == MessageKind::kPing ||
                                              o.header.kind == MessageKind::kPong);
      if (ping) p.queuedBytes -= kFrameHeaderBytes + o.payload.size();
      return ping;
    });
  }
}

void ZmqTransport::ioLoop() {
  const uint32_t world = limits_.worldSize;
  auto nextPing = SteadyClock::now();
  std::optional<SteadyClock::time_point> stopDeadline;
  // Closing: the linger time is renewed while our data still moves -- handed
  // on or acknowledged -- up to drainCap (see below): the peers' bytes still
  // queued and the times of their last acknowledgements, as last seen.
  SteadyClock::time_point drainCap;
  uint64_t queuedAtClose = UINT64_MAX;
  int64_t acksAtClose = 0;
  std::vector<zmq::pollitem_t> items;
  // Each reachable peer as polled: where its monitors' items start (its
  // monitor's, its probe monitor's, then one per stripe).
  struct PolledPeer {
    uint32_t peer;
    size_t monitor;
    size_t stripes;
  };
  std::vector<PolledPeer> polled;
  while (true) {
    auto now = SteadyClock::now();
    if (stopping_ && !stopDeadline) {
      stopDeadline = now + cfg_.linger;
      drainCap = now + std::max<SteadyClock::duration>(cfg_.linger, kMaxDrainAtClose);
      dropQueuedPings();  // only data is worth the linger time
    }
    if (!stopping_ && cfg_.pingInterval.count() > 0 && now >= nextPing) {
      sendPings(now);
      nextPing = now + cfg_.pingInterval;
      // Until every peer's round trip is known, every kFirstPingEvery: a
      // ping sent before the probe connection is up is lost, and the
      // synchronizers size their first rounds' delay from the first round
      // trips (a second late at the start of a job otherwise).
      if (now - startedAt_ < kFastPingsFor) {
        for (uint32_t r = 0; r < world; ++r) {
          if (reachable(r) && peers_[r].rttSeconds < 0) {
            nextPing = std::min(nextPing, now + kFirstPingEvery);
            break;
          }
        }
      }
    }
    if (!stopping_) reportRefusalWhenDue(now);
    if (!stopping_) reconnectStalled(now);
    applyKeyChange();
    // Send whatever is due, and find when the next shaped message is.
    auto next = now + milliseconds(stopping_ ? 100 : pendingRefusal_ ? 50 : 200);
    if (!stopping_ && cfg_.pingInterval.count() > 0) next = std::min(next, nextPing);
    if (auto t = flushProbes(now)) next = std::min(next, *t);
    // Whether anything is still to be handed to ZeroMQ, for any peer (a
    // blocked one included: closing must not take its queue for empty);
    // closing, also what a live peer -- heard within the linger time or two
    // ping intervals: one that has exited is not waited for -- has not
    // acknowledged yet (in ZeroMQ's or the kernel's buffers, or behind a
    // slow uplink), and how far our data has moved (queued, acknowledged).
    bool pending = false;
    uint64_t queued = 0;
    int64_t acks = 0;
    const auto liveWithin = std::max<SteadyClock::duration>(cfg_.linger, 2 * cfg_.pingInterval);
    for (uint32_t r = 0; r < world; ++r) {
      if (!reachable(r)) continue;
      PeerState& p = peers_[r];
      if (!p.blocked) {
        if (auto t = flush(r, now)) next = std::min(next, *t);
      }
      std::lock_guard lock(p.mu);
      pending = pending || !p.queue.empty() || !p.resend.empty();
      if (!stopping_) continue;
      queued += p.queuedBytes;
      acks += p.lastAckNs.load();
      const int64_t heardNs = p.lastHeardNs;
      pending =
          pending || (p.unackedBytes > 0 && heardNs != 0 &&
                      now - SteadyClock::time_point(SteadyClock::duration(heardNs)) <= liveWithin);
    }
    if (stopping_) {
      // The linger time is for a peer that takes nothing more: while our
      // data moves, it starts again (up to drainCap). A fixed 2 s lost the
      // last gradient of an allreduce: 45 MB to each of three peers through
      // a 100 Mbit/s uplink take 11 s, and the peer that did not get it
      // waited for it until its time-out.
      if (queued < queuedAtClose || acks != acksAtClose) {
        queuedAtClose = queued;
        acksAtClose = acks;
        stopDeadline = std::min(drainCap, std::max(*stopDeadline, now + cfg_.linger));
      }
      next = std::min(next, *stopDeadline);
      if (!pending || now >= *stopDeadline) break;
    }

    // What is polled: ZeroMQ sockets only where their own state is wanted
    // (the ROUTER's messages, the ZAP requests, a blocked DEALER's room),
    // and of each monitor (three or more per peer) its notification
    // descriptor alone. zmq_poll asks every ZeroMQ socket in its list for
    // its events on each pass, two passes a call, and each asking costs a
    // poll(2) on that socket's mailbox: with 15 peers, 49 sockets made
    // about 100 system calls a turn of this loop, 9,000 a second in each
    // of sixteen world16 workers, and these loops took 11% of two cores
    // (6% since). A monitor's descriptor is readable while its mailbox
    // holds a command (a new event's among them), and every monitor
    // handler reads its socket until it is empty, which is what lets the
    // next event signal again: no event waits unseen (openMonitor for the
    // first). An idle DEALER's own commands (a reconnection's) are taken
    // at its next send, as ZeroMQ does for any socket not polled.
    items.clear();
    polled.clear();
    bool inboxFull;
    {
      std::lock_guard lock(inboxMu_);
      inboxFull = inboxBytes_ >= cfg_.maxInboxBytes;
    }
    const auto monitorItem = [](zmq::socket_t& monitor) {
      return zmq::pollitem_t{nullptr, monitor.get(zmq::sockopt::fd), ZMQ_POLLIN, 0};
    };
    items.push_back({nullptr, wakeFd_, ZMQ_POLLIN, 0});
    items.push_back({router_->handle(), 0, static_cast<short>(inboxFull ? 0 : ZMQ_POLLIN), 0});
    items.push_back(monitorItem(*routerMonitor_));
    if (zap_) items.push_back({zap_->handle(), 0, ZMQ_POLLIN, 0});
    bool anyBlocked = false;
    for (uint32_t r = 0; r < world; ++r) {
      if (!reachable(r)) continue;
      PeerState& p = peers_[r];
      polled.push_back({r, items.size(), p.stripes.size()});
      items.push_back(monitorItem(*p.monitor));
      items.push_back(monitorItem(*p.probeMonitor));
      // A connection that could not be made (openStripe failed) has no
      // socket: its item polls nothing (a negative descriptor).
      for (Stripe& stripe : p.stripes) {
        items.push_back(stripe.dealer && stripe.monitor ? monitorItem(*stripe.monitor)
                                                        : zmq::pollitem_t{nullptr, -1, 0, 0});
      }
      if (p.blocked) {
        anyBlocked = true;
        items.push_back({p.dealer->handle(), 0, ZMQ_POLLOUT, 0});
        for (Stripe& stripe : p.stripes) {
          if (stripe.dealer && stripe.monitor) {
            items.push_back({stripe.dealer->handle(), 0, ZMQ_POLLOUT, 0});
          }
        }
      }
    }
    const auto wait = std::chrono::duration_cast<milliseconds>(next - SteadyClock::now());
    // A blocked DEALER that never becomes writable (peer gone) is retried
    // every 100 ms as well, so a reconnect is noticed without POLLOUT.
    long timeoutMs = std::max<long>(0, wait.count() + 1);
    if (anyBlocked) timeoutMs = std::min<long>(timeoutMs, 100);
    try {
      zmq::poll(items.data(), items.size(), milliseconds(timeoutMs));
    } catch (const zmq::error_t& e) {
      if (e.num() == EINTR) continue;
      logger()->error("transport rank {}: poll failed: {}", cfg_.rank, e.what());
      break;
    }
    if (items[0].revents & ZMQ_POLLIN) {
      uint64_t drained;
      [[maybe_unused]] ssize_t n = ::read(wakeFd_, &drained, sizeof drained);
    }
    if (zap_ && (items[3].revents & ZMQ_POLLIN)) handleZap();
    if (items[2].revents & ZMQ_POLLIN) handleMonitor(*routerMonitor_, nullptr);
    if (items[1].revents & ZMQ_POLLIN) {
      handleInbound();
      sendAcks(SteadyClock::now());
    }
    for (const PolledPeer& slot : polled) {
      PeerState& p = peers_[slot.peer];
      if (items[slot.monitor].revents & ZMQ_POLLIN) handleMonitor(*p.monitor, &p);
      if (items[slot.monitor + 1].revents & ZMQ_POLLIN) handleProbeMonitor(p);
      // The stripes as polled: a monitor event may replace them.
      for (size_t i = 0; i < slot.stripes && i < p.stripes.size(); ++i) {
        if (items[slot.monitor + 2 + i].revents & ZMQ_POLLIN) handleStripeMonitor(slot.peer, i);
      }
      if (p.blocked) p.blocked = false;  // POLLOUT, a timeout or a reconnect: try again
    }
    if (stripes_.unfinished() > 0) {
      auto expired = stripes_.expire(SteadyClock::now());
      if (!expired.dropped.ok()) noteStripedDrop(expired.dropped);
      for (auto& d : expired.ready) deliver(d.header, std::move(d.payload));
    }
    if (!stopping_) retryHandshakes();
  }
  {
    // A key change that came too late is not applied.
    std::lock_guard lock(keyChangeMu_);
    if (keyChange_) {
      keyChange_->done.set_value(unavailable("transport: shutting down"));
      keyChange_.reset();
    }
  }
  // Our queues are empty, or the linger time is up. ZeroMQ may still hold
  // messages it accepted (a large payload is still being encrypted and
  // written): they get what is left of the linger time, and whatever is
  // still there after it is dropped. Closing with no linger at all lost the
  // last message of a worker that exited right after sending it (a region
  // leader's final model, which its members then waited for in vain).
  const auto left =
      stopDeadline ? std::chrono::duration_cast<milliseconds>(*stopDeadline - SteadyClock::now())
                   : milliseconds(0);
  // What the linger time left unsent is said, per peer: a receiver that
  // waits for it in vain has the reason in the sender's log.
  for (uint32_t r = 0; r < world; ++r) {
    if (!reachable(r)) continue;
    PeerState& p = peers_[r];
    std::lock_guard lock(p.mu);
    if (p.queue.empty() && p.resend.empty()) continue;
    logger()->warn(
        "transport rank {}: closing with {} message(s) ({} bytes) for {} not sent{}: the linger "
        "time ({:.1f} s) ran out",
        cfg_.rank, p.queue.size(), p.queuedBytes, rankName(r),
        p.resend.empty() ? std::string()
                         : fmt::format(" and {} chunk(s) to send again", p.resend.size()),
        std::chrono::duration<double>(cfg_.linger).count());
  }
  closeSockets(std::max(left, milliseconds(0)));
}

// Closes every socket so the context can terminate (a context outliving its
// sockets blocks forever in its destructor). Called on the I/O thread, or on
// the owner's thread when start() failed before the I/O thread existed.
void ZmqTransport::closeSockets(std::chrono::milliseconds linger) {
  for (auto& p : peers_) {
    p.monitor.reset();
    if (p.probe) zmq_socket_monitor(p.probe->handle(), nullptr, 0);
    p.probeMonitor.reset();
    if (p.dealer) p.dealer->set(zmq::sockopt::linger, static_cast<int>(linger.count()));
    p.dealer.reset();
    p.probe.reset();
    for (Stripe& stripe : p.stripes) closeStripe(stripe, static_cast<int>(linger.count()));
  }
  routerMonitor_.reset();
  router_.reset();
  zap_.reset();
}

}  // namespace

StatusOr<std::unique_ptr<Transport>> makeZmqTransport(TransportConfig config) {
  GEO_RETURN_IF_ERROR(validate(config));
  auto t = std::make_unique<ZmqTransport>(std::move(config));
  GEO_RETURN_IF_ERROR(t->start());
  return std::unique_ptr<Transport>(std::move(t));
}

}  // namespace geo::transport
