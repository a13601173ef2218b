#pragma once
// MemoryNetwork: the Transport contract (transport.h) inside one process, on
// an injected Clock, so that what runs above a transport -- membership,
// suspicion, a rejoin, the final average -- can be tested in simulated time
// (a FakeClock: a 60 s time-out takes no time at all) and without sockets.
// tests/worker/transport/conformance_test.cc runs one suite of the contract
// against both this and ZmqTransport; the real-socket tests stay the
// integration layer.
//
// The model, and why each part is what the ZeroMQ transport does:
//  - Each rank has at most one open endpoint at a time (open(): a worker
//    process, a new incarnation each time). Destroying it closes it
//    gracefully: what it queued for an open peer still leaves, however
//    long its uplink takes, up to `maxDrain` -- as ZeroMQ's transport
//    renews its linger time while its data moves --, and what it queued
//    for a peer that is not open gets `linger` (for the peer to come up).
//    kill() ends it as a killed process ends: its queue is
//    lost at once, what already left still arrives, and its calls return
//    Cancelled from then on.
//  - A message to a peer waits in the sender's queue (bounded by
//    maxQueuedBytesPerPeer: send() waits for room, then DeadlineExceeded)
//    until the shared uplink has carried it (setUplinkRate: WAN peers only)
//    and the peer has an open endpoint; then it leaves and arrives
//    oneWay(from, to) later, into the inbox of the incarnation it left for.
//    One that is in flight when that incarnation ends is lost (delivery is
//    at most once); one still queued goes to the next incarnation, as a
//    connection made to the restarted peer carries what the queue held.
//  - Data messages from one sender to one receiver arrive in the order they
//    were sent. Control-lane messages (SendMeta::controlLane) skip the queue
//    and the uplink and cross the link's delay only: they may overtake data,
//    and keep their order among themselves.
//  - setPartitioned(true) on an endpoint drops every message to or from a
//    rank of another region (Options::regions) that it would send or
//    receive from then on, and the queued ones to them at once; sends still
//    return OK. Counted in that endpoint's partitionDropped.
//  - Liveness: the real transport pings every pingInterval whatever its
//    caller does, so a live peer is heard continuously; here, a peer is
//    heard from oneWay after it became reachable (open, and no partition
//    between the two) until oneWay after it stopped being (its last ping in
//    flight). The round trip (rttSeconds, minRttSeconds) is the two one-way
//    delays, from the first time it is heard. reconnects counts the times
//    this endpoint's connections to the peer are made again, as the real
//    one's do: for each new incarnation of the peer heard after an earlier
//    one, and after a silence longer than the real transport's
//    reconnectAfter (2 s, a partition's end), counted three round trips
//    after the peer became reachable again (the real one's connection is
//    retried by ZeroMQ and then shakes hands over TCP and CURVE, after the
//    peer's own connection has made it heard); what they held is no longer
//    waited for as unacknowledged from that change on.
//  - Acknowledgements: data that arrives is acknowledged oneWay(to, from)
//    later, and cumulatively, as the real receiver's kAck of the latest
//    chunk acknowledges every one before it: a message lost to a partition
//    stays unacknowledged only until a later one is acknowledged (or a
//    reconnect clears it). unackedBytes, unackedSeconds and sinceAckSeconds
//    follow from that.
//  - Not modelled: CURVE keys and the settings a hello compares (updateKeys
//    returns Unimplemented; there is no agreedSettings), chunks, socket
//    buffers, TCP. The bytes counted are those of one header per message and
//    the payload.
//
// Threading: every member of MemoryNetwork and of its transports may be
// called from any thread. The transports' blocking calls wait on the Clock
// (Clock::waitUntil), so a FakeClock's advance() is what moves them on.
// Errors: open() of a rank outside the world or one already open, and
// Options that do not fit the world size, are InvalidArgument or
// FailedPrecondition naming the rank or field.

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/status.h"
#include "worker/transport/transport.h"

namespace geo::transport {

class MemoryNetwork {
 public:
  struct Options {
    uint32_t worldSize = 0;
    // The job id whose hash the headers carry (FrameHeader::jobHash).
    std::string jobId = "memory-job";
    // oneWay[from][to]: the delay of the link; empty: no delay anywhere.
    std::vector<std::vector<geo::Clock::Duration>> oneWay;
    // regions[r]: rank r's region, for setPartitioned and the uplink (a WAN
    // peer is one of another region); empty: each rank is a region of its
    // own, as in a job of one worker per region.
    std::vector<std::string> regions;
    uint64_t maxQueuedBytesPerPeer = uint64_t{1} << 30;
    uint64_t maxPayloadBytes = uint64_t{1} << 31;
    // How long a closed endpoint's queue for a peer that is not open may
    // still leave (ZeroMQ's linger), and how long one for an open peer may
    // (ZmqTransport renews the linger while the data moves, to a limit).
    geo::Clock::Duration linger = std::chrono::seconds(2);
    geo::Clock::Duration maxDrain = std::chrono::minutes(5);
  };

  // The clock must outlive the network and every transport it opens.
  static StatusOr<std::shared_ptr<MemoryNetwork>> make(Options options, const geo::Clock& clock);

  // A new incarnation of `rank`'s endpoint. InvalidArgument for a rank
  // outside the world; FailedPrecondition while the rank's last endpoint is
  // still open.
  StatusOr<std::unique_ptr<Transport>> open(uint32_t rank);

  // Ends `rank`'s open endpoint as a killed process ends (see above). No
  // effect when none is open.
  void kill(uint32_t rank);

  // Cuts (or mends) the link between ranks `a` and `b` both ways, the
  // other links of either untouched: a partial partition, where a and b
  // each still reach every other rank. As setPartitioned does for the
  // pair: queued messages between them are dropped at once, those in
  // flight are lost, sends still return OK, and each stops hearing the
  // other at once (and hears it again at once when mended). No effect for
  // a rank outside the world or a == b.
  void cutLink(uint32_t a, uint32_t b, bool cut);
  // The same one way only: what `from` sends to `to` is lost, what `to`
  // sends to `from` passes, so `to` stops hearing `from` while `from` still
  // hears `to`. Suspicion that differs between the two sides, as a real
  // network's full uplink gives it (pings queued behind bulk data on one
  // side only).
  void cutOneWay(uint32_t from, uint32_t to, bool cut);
  // Holds (or releases) what `from` sends `to` as data in `from`'s queue:
  // nothing of it leaves while held, and it leaves in order once released;
  // control-lane messages and liveness pass as before, so each still hears
  // the other. A TCP connection whose retransmission timer backed off while
  // the receiver's own uplink was clogged (its ACKs lost there), beside a
  // probe connection that still gets through: on the namespace network a
  // worker throttled to 32 kbit/s heard its peers' pings for 15 s while
  // their data to it waited. A way cut as well (cutOneWay, cutLink) loses
  // its frames -- liveness, the control lane -- while its data, sent once
  // both are set, waits in the queue: a sender's clogged uplink, its pings
  // lost in the full queue while its rounds wait their turn (on the
  // namespace network, a tokyo throttled to 32 kbit/s, suspected by every
  // peer). No effect for a rank outside the world or from == to.
  void holdData(uint32_t from, uint32_t to, bool hold);

  // The link's one-way delay from now on; messages already in flight keep
  // their arrival times.
  void setOneWay(uint32_t from, uint32_t to, geo::Clock::Duration delay);

  struct State;  // shared with the transports (memory_transport.cc)

 private:
  // Cuts (or mends) each of `ways` ({from, to}); none where one names a
  // rank outside the world or a rank to itself.
  void cutWays(const std::vector<std::pair<uint32_t, uint32_t>>& ways, bool cut);
  explicit MemoryNetwork(std::shared_ptr<State> state) : state_(std::move(state)) {}
  std::shared_ptr<State> state_;
};

}  // namespace geo::transport
