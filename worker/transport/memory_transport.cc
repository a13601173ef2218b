#include "worker/transport/memory_transport.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <condition_variable>
#include <deque>
#include <limits>
#include <mutex>
#include <optional>
#include <set>

namespace geo::transport {
namespace {

using TimePoint = geo::Clock::TimePoint;
using Duration = geo::Clock::Duration;
constexpr TimePoint kNever = TimePoint::max();

// As many control-lane messages as the real transport keeps for a peer
// that is not connected yet: a peer away for long finds only the latest.
constexpr size_t kMaxLaneQueued = 64;

double seconds(Duration d) {
  return std::chrono::duration<double>(d).count();
}

}  // namespace

struct MemoryNetwork::State {
  struct Msg {
    FrameHeader header;
    Payload payload;
    uint32_t from = 0;
    uint32_t to = 0;
    TimePoint departAt;  // when the uplink has carried it (it leaves once the peer is open)
    TimePoint arriveAt = kNever;
    uint64_t toIncarnation = 0;  // the receiver's incarnation it left for
    uint64_t seq = 0;            // send order: ties at equal times keep it
    uint64_t sentId = 0;         // its acknowledgement record (data only); 0: none
    uint64_t wireBytes() const { return kFrameHeaderBytes + payload.size(); }
  };
  // A data message that left, until the sender hears it acknowledged.
  struct SentRecord {
    uint64_t id = 0;
    uint64_t bytes = 0;
    TimePoint leftAt;
    TimePoint ackAt;  // kNever: lost, never acknowledged
  };
  // The frames of one peer that reach an endpoint: from `first` (the first
  // one's arrival) to `last` (the last one's; kNever while still coming).
  struct Period {
    TimePoint first;
    TimePoint last = kNever;
  };
  // What an endpoint has of, and knows about, one peer.
  struct PeerSide {
    std::deque<Msg> queue;  // data to the peer that has not left yet, oldest first
    std::deque<Msg> lane;   // control-lane messages waiting for the peer to open
    uint64_t queuedBytes = 0;
    uint64_t bytesSent = 0, bytesReceived = 0, messagesSent = 0, messagesReceived = 0;
    // When each connection made again completed (reconnects counts those
    // up to now): see change().
    std::vector<TimePoint> reconnectsAt;
    std::vector<Period> heard;           // the peer's frames reaching us
    std::optional<TimePoint> downSince;  // since when it has not reached us (after it did)
    uint64_t heardIncarnation = 0;       // the peer's incarnation last heard
    std::deque<SentRecord> sent;
    std::optional<TimePoint> lastAck;
    uint64_t ackedBytes = 0;  // of the records acknowledged so far
    // Drops what has not left yet (a cut, a kill, a closed endpoint's
    // linger run out) and returns how many messages went.
    size_t dropQueued() {
      const size_t n = queue.size() + lane.size();
      queue.clear();
      lane.clear();
      queuedBytes = 0;
      return n;
    }
  };
  struct Endpoint {
    bool open = false;
    uint64_t incarnation = 0;  // of the open endpoint, or the last one
    TimePoint openedAt;
    TimePoint closedAt;  // of the last one closed gracefully: its queue lingers
    bool cut = false;
    double uplinkBytesPerSecond = 0;
    TimePoint uplinkFree;
    uint64_t partitionDropped = 0;
    uint64_t framesRejected = 0;
    std::string lastRejectReason;
    std::vector<PeerSide> peers;
    std::deque<Msg> inbox;  // arrived, in arrival order
    uint64_t inboxBytes = 0;
    uint64_t arrived = 0;  // messages put in inbox so far (arrivals())
  };

  Options options;
  const geo::Clock& clock;
  uint64_t jobHash = 0;
  std::mutex mu;
  std::condition_variable changed;
  std::vector<Endpoint> endpoints;
  // Links cut (MemoryNetwork::cutLink, cutOneWay), a way each, as {from, to}.
  std::set<std::pair<uint32_t, uint32_t>> cutWays;
  // Ways whose data is held in the sender's queue (MemoryNetwork::holdData).
  std::set<std::pair<uint32_t, uint32_t>> heldWays;
  std::vector<Msg> inFlight;
  uint64_t nextSeq = 1;
  uint64_t nextSentId = 1;
  uint64_t nextIncarnation = 1;
  Duration reconnectAfter = std::chrono::seconds(2);
  // Until this time nothing is due (no message leaves or arrives, no
  // acknowledgement comes back, no lingering queue is dropped) and no call
  // has changed the state since the last full settle(): settle() before it
  // has nothing to do. Every call that changes what settle() reads calls
  // touch(). Without it every call of every endpoint walked all N^2 pairs:
  // at 64 workers that was half the CPU of a job.
  TimePoint quietUntil = TimePoint::min();
  void touch() { quietUntil = TimePoint::min(); }

  State(Options o, const geo::Clock& c) : options(std::move(o)), clock(c) {}

  uint32_t world() const { return options.worldSize; }
  Duration oneWay(uint32_t from, uint32_t to) const {
    return options.oneWay.empty() ? Duration::zero() : options.oneWay[from][to];
  }
  bool wan(uint32_t a, uint32_t b) const {
    return options.regions.empty() ? a != b : options.regions[a] != options.regions[b];
  }
  bool linkCut(uint32_t a, uint32_t b) const {
    return !cutWays.empty() && cutWays.count({a, b}) > 0;
  }
  bool dataHeld(uint32_t from, uint32_t to) const {
    return !heldWays.empty() && heldWays.count({from, to}) > 0;
  }
  // Whether what `from` sends to `to` is dropped as it is sent: `from` cut
  // off from the other regions, or the link between the two cut.
  bool dropsSend(uint32_t from, uint32_t to) const {
    return (endpoints[from].cut && wan(from, to)) || linkCut(from, to);
  }
  // The same for data: on a way both cut and held it waits in the queue
  // (MemoryNetwork::holdData), where the control lane's is dropped.
  bool dropsData(uint32_t from, uint32_t to) const {
    return dropsSend(from, to) && !dataHeld(from, to);
  }
  // Whether frames from `p` reach `r` now.
  bool reaches(uint32_t p, uint32_t r) const {
    const Endpoint& a = endpoints[p];
    const Endpoint& b = endpoints[r];
    return a.open && b.open && !(wan(p, r) && (a.cut || b.cut)) && !linkCut(p, r);
  }

  // Everything up to `now`: queued messages whose time has come leave, and
  // those in flight arrive (or are lost). Every change of an endpoint's
  // state settles first, so between two calls the state is constant and
  // each message's fate follows from the state alone.
  void settle(TimePoint now) {
    if (now < quietUntil) return;
    for (uint32_t r = 0; r < world(); ++r) {
      Endpoint& e = endpoints[r];
      for (uint32_t p = 0; p < world(); ++p) {
        if (p == r) continue;
        PeerSide& side = e.peers[p];
        const Endpoint& to = endpoints[p];
        const auto leave = [&](Msg& m, TimePoint at) {
          m.arriveAt = at + oneWay(r, p);
          m.toIncarnation = to.incarnation;
          side.bytesSent += m.wireBytes();
          ++side.messagesSent;
          inFlight.push_back(std::move(m));
        };
        // A gracefully closed sender's queue leaves while the uplink carries
        // it to an open peer (up to maxDrain), and for a peer that is not
        // open until its linger is up.
        const TimePoint lingerEnd =
            e.open ? kNever
                   : e.closedAt +
                         (to.open ? std::max(options.linger, options.maxDrain) : options.linger);
        while (!side.lane.empty() && to.open) {
          Msg m = std::move(side.lane.front());
          side.lane.pop_front();
          const TimePoint at = std::max(m.departAt, to.openedAt);
          if (at > lingerEnd) continue;
          leave(m, at);
        }
        while (!side.queue.empty() && to.open && !dataHeld(r, p)) {
          Msg& front = side.queue.front();
          const TimePoint at = std::max(front.departAt, to.openedAt);
          if (at > now) break;
          Msg m = std::move(front);
          side.queue.pop_front();
          side.queuedBytes -= m.wireBytes();
          if (at > lingerEnd) continue;
          m.sentId = nextSentId++;
          side.sent.push_back({m.sentId, m.wireBytes(), at, at + oneWay(r, p) + oneWay(p, r)});
          leave(m, at);
        }
        if (!e.open && now > lingerEnd) {  // what is left never leaves
          side.dropQueued();
        }
      }
    }
    // Arrivals in time order (then send order), so that every inbox stays
    // in arrival order.
    std::sort(inFlight.begin(), inFlight.end(), [](const Msg& a, const Msg& b) {
      return a.arriveAt != b.arriveAt ? a.arriveAt < b.arriveAt : a.seq < b.seq;
    });
    size_t done = 0;
    for (; done < inFlight.size() && inFlight[done].arriveAt <= now; ++done) {
      Msg& m = inFlight[done];
      Endpoint& to = endpoints[m.to];
      const bool alive = to.open && to.incarnation == m.toIncarnation;
      bool delivered = false;
      if (alive && ((wan(m.from, m.to) && to.cut) || linkCut(m.from, m.to))) {
        ++to.partitionDropped;
      } else if (const Status bad = alive ? validate(m) : Status(); !bad.ok()) {
        // What the real receiver's checks refuse never reaches its caller.
        ++to.framesRejected;
        to.lastRejectReason = std::string(bad.message());
      } else if (alive) {
        PeerSide& side = to.peers[m.from];
        side.bytesReceived += m.wireBytes();
        ++side.messagesReceived;
        to.inboxBytes += m.payload.size();
        to.inbox.push_back(std::move(m));
        ++to.arrived;
        delivered = true;
      }
      if (!delivered && inFlight[done].sentId != 0) {
        // Never acknowledged: the sender's record stays until it reconnects.
        for (SentRecord& s : endpoints[inFlight[done].from].peers[inFlight[done].to].sent) {
          if (s.id == inFlight[done].sentId) s.ackAt = kNever;
        }
      }
    }
    inFlight.erase(inFlight.begin(), inFlight.begin() + static_cast<std::ptrdiff_t>(done));
    // Acknowledgements that have come back. They are cumulative, as the
    // real receiver's are (it acknowledges the latest chunk it took, and
    // chunks travel in order): one acknowledges every message sent before
    // it too, those lost to a partition included.
    for (Endpoint& e : endpoints) {
      for (PeerSide& side : e.peers) {
        if (side.sent.empty()) continue;
        size_t acked = 0;
        for (size_t i = 0; i < side.sent.size(); ++i) {
          if (side.sent[i].ackAt > now) continue;
          for (size_t j = acked; j <= i; ++j) {
            // Cumulative: the records before it lost to a partition did not arrive.
            if (side.sent[j].ackAt != kNever) side.ackedBytes += side.sent[j].bytes;
          }
          acked = i + 1;
          side.lastAck = std::max(side.lastAck.value_or(side.sent[i].ackAt), side.sent[i].ackAt);
        }
        if (acked > 0) {
          side.sent.erase(side.sent.begin(),
                          side.sent.begin() + static_cast<std::ptrdiff_t>(acked));
        }
      }
    }
    // Everything due by `now` is done: the next thing happens after it.
    quietUntil = nextEvent();
    for (const Endpoint& e : endpoints) {
      if (e.open) continue;
      for (const PeerSide& side : e.peers) {
        if (!side.queue.empty() || !side.lane.empty()) {
          quietUntil = std::min(quietUntil, e.closedAt + options.linger + Duration(1));
          break;
        }
      }
    }
  }

  // The checks every received header passes in the real transport
  // (decodeFrameHeader): a frame the sender could not have meant -- an
  // element count that does not fit its codec, say -- is refused.
  Status validate(const Msg& m) const {
    std::array<std::byte, kFrameHeaderBytes> bytes;
    encodeFrameHeader(m.header, std::span<std::byte, kFrameHeaderBytes>(bytes));
    const FrameLimits limits{jobHash, world(), options.maxPayloadBytes};
    return decodeFrameHeader(bytes, m.payload.size(), limits).status();
  }

  // Applies a change of endpoints' state at `now` (after settle()), and
  // keeps every endpoint's view of its peers' liveness: which frames reach
  // whom changes only here.
  template <typename Change>
  void change(TimePoint now, Change&& apply) {
    touch();
    std::vector<bool> before(size_t{world()} * world());
    std::vector<bool> wasOpen(world()), wasCut(world());
    std::vector<bool> wasLinkCut(size_t{world()} * world());
    std::vector<uint64_t> wasIncarnation(world());
    for (uint32_t p = 0; p < world(); ++p) {
      wasOpen[p] = endpoints[p].open;
      wasCut[p] = endpoints[p].cut;
      wasIncarnation[p] = endpoints[p].incarnation;
      for (uint32_t r = 0; r < world(); ++r) {
        if (p == r) continue;
        before[size_t{p} * world() + r] = reaches(p, r);
        wasLinkCut[size_t{p} * world() + r] = linkCut(p, r);
      }
    }
    apply();
    for (uint32_t p = 0; p < world(); ++p) {
      for (uint32_t r = 0; r < world(); ++r) {
        if (p == r || !endpoints[r].open) continue;
        PeerSide& view = endpoints[r].peers[p];
        const bool was = before[size_t{p} * world() + r] && wasOpen[r] &&
                         wasIncarnation[r] == endpoints[r].incarnation;
        const bool is = reaches(p, r);
        // A change on our side (our cut lifted or set) takes effect at once;
        // one on the peer's side reaches us after the link's delay.
        // A link cut or mended (cutLink) changes both sides at once.
        const bool oursChanged =
            wasCut[r] != endpoints[r].cut || wasLinkCut[size_t{p} * world() + r] != linkCut(p, r);
        const TimePoint at = oursChanged ? now : now + oneWay(p, r);
        if (was && !is) {
          if (!view.heard.empty()) {
            // A period that ends before its first frame arrived had none.
            if (view.heard.back().first > at) {
              view.heard.pop_back();
            } else {
              view.heard.back().last = at;
            }
          }
          view.downSince = at;
        } else if (!was && is) {
          const bool restarted =
              view.heardIncarnation != 0 && view.heardIncarnation != endpoints[p].incarnation;
          const bool longSilence = view.downSince && at - *view.downSince >= reconnectAfter;
          if (restarted || longSilence) {
            // New connections: what the old ones held is gone. The real
            // transport's own connection to the peer completes after the
            // peer is heard again (its frames come over the connection it
            // makes to us): ours is retried by ZeroMQ, then TCP's
            // handshake and CURVE's take about three round trips. So the
            // count moves then, as the synchronizer sees it there.
            view.reconnectsAt.push_back(now + 3 * (oneWay(p, r) + oneWay(r, p)));
            view.sent.erase(std::remove_if(view.sent.begin(), view.sent.end(),
                                           [](const SentRecord& s) { return s.ackAt == kNever; }),
                            view.sent.end());
          }
          view.heard.push_back({at});
          view.heardIncarnation = endpoints[p].incarnation;
          view.downSince.reset();
        }
      }
    }
    clock.notifyAll(changed);
  }

  // When frames from `p` last reached `r` as of `now`; none if never.
  std::optional<TimePoint> lastHeard(uint32_t r, uint32_t p, TimePoint now) const {
    std::optional<TimePoint> out;
    for (const Period& h : endpoints[r].peers[p].heard) {
      if (h.first > now) continue;
      const TimePoint t = std::min(now, h.last);
      if (!out || t > *out) out = t;
    }
    return out;
  }

  // When a caller waiting until `deadline` looks again: at the next time a
  // message may leave or arrive, or an acknowledgement come back (nothing
  // changes before then but by another call, which notifies `changed`).
  TimePoint wakeAt(TimePoint now, TimePoint deadline) {
    settle(now);
    const TimePoint next = quietUntil;
    return next > now ? std::min(next, deadline) : deadline;
  }

  TimePoint nextEvent() const {
    TimePoint next = kNever;
    for (const Msg& m : inFlight) next = std::min(next, m.arriveAt);
    for (uint32_t r = 0; r < world(); ++r) {
      const Endpoint& e = endpoints[r];
      for (uint32_t p = 0; p < world(); ++p) {
        if (p == r || !endpoints[p].open || e.peers[p].queue.empty() || dataHeld(r, p)) continue;
        next = std::min(next, std::max(e.peers[p].queue.front().departAt, endpoints[p].openedAt));
      }
      for (const PeerSide& side : e.peers) {
        for (const SentRecord& s : side.sent) next = std::min(next, s.ackAt);
      }
    }
    return next;
  }
};

namespace {

using State = MemoryNetwork::State;

class MemoryTransport final : public Transport {
 public:
  MemoryTransport(std::shared_ptr<State> state, uint32_t rank, uint64_t incarnation)
      : s_(std::move(state)), rank_(rank), incarnation_(incarnation) {}

  ~MemoryTransport() override {
    changeOwn([](State::Endpoint& e, TimePoint now) {
      e.open = false;
      e.closedAt = now;
      e.inbox.clear();
      e.inboxBytes = 0;
    });
  }

  uint32_t rank() const override { return rank_; }
  uint32_t worldSize() const override { return s_->world(); }

  Status send(uint32_t peer, MessageKind kind, const SendMeta& meta, Payload payload,
              std::chrono::milliseconds timeout) override {
    if (peer >= s_->world() || peer == rank_) {
      return invalidArgument(fmt::format(
          "transport: cannot send to rank {} (world size {}, self {})", peer, s_->world(), rank_));
    }
    if (payload.size() > s_->options.maxPayloadBytes) {
      return invalidArgument(fmt::format("transport: payload of {} bytes exceeds the limit of {}",
                                         payload.size(), s_->options.maxPayloadBytes));
    }
    if (meta.controlLane && payload.size() > kMaxControlLaneBytes) {
      return invalidArgument(fmt::format(
          "transport: a control-lane payload of {} bytes exceeds the lane's limit of {}",
          payload.size(), kMaxControlLaneBytes));
    }
    std::unique_lock lock(s_->mu);
    if (!mine()) return Status(StatusCode::kCancelled, "transport: closed");
    TimePoint now = s_->clock.now();
    s_->settle(now);
    State::Endpoint& e = s_->endpoints[rank_];
    if (meta.controlLane ? s_->dropsSend(rank_, peer) : s_->dropsData(rank_, peer)) {
      ++e.partitionDropped;
      return {};
    }
    State::Msg m;
    m.header = headerFor(kind, meta, s_->jobHash, rank_, payload.size());
    m.header.flags = meta.controlLane ? kFrameFlagControlLane : 0;
    m.payload = std::move(payload);
    m.from = rank_;
    m.to = peer;
    m.seq = s_->nextSeq++;
    State::PeerSide& side = e.peers[peer];
    if (meta.controlLane) {
      m.departAt = now;
      if (side.lane.size() >= kMaxLaneQueued) side.lane.pop_front();
      side.lane.push_back(std::move(m));
      s_->touch();
    } else {
      const uint64_t bytes = m.wireBytes();
      const TimePoint deadline = now + timeout;
      // A message larger than the whole queue may go when the queue is empty.
      while (side.queuedBytes != 0 &&
             side.queuedBytes + bytes > s_->options.maxQueuedBytesPerPeer) {
        if (now >= deadline) {
          return deadlineExceeded(fmt::format(
              "transport: send queue to rank {} stayed full for {} ms ({} bytes queued, limit {})",
              peer, timeout.count(), side.queuedBytes, s_->options.maxQueuedBytesPerPeer));
        }
        s_->clock.waitUntil(lock, s_->changed, s_->wakeAt(now, deadline));
        if (!mine()) return Status(StatusCode::kCancelled, "transport: closed");
        now = s_->clock.now();
        s_->settle(now);
        if (s_->dropsData(rank_, peer)) {
          ++e.partitionDropped;
          return {};
        }
      }
      m.departAt = now;
      if (e.uplinkBytesPerSecond > 0 && s_->wan(rank_, peer)) {
        const TimePoint start = std::max(now, e.uplinkFree);
        e.uplinkFree = start + std::chrono::duration_cast<Duration>(std::chrono::duration<double>(
                                   static_cast<double>(bytes) / e.uplinkBytesPerSecond));
        m.departAt = e.uplinkFree;
      }
      side.queuedBytes += bytes;
      side.queue.push_back(std::move(m));
      s_->touch();
    }
    s_->settle(now);
    s_->clock.notifyAll(s_->changed);
    return {};
  }

  StatusOr<Message> receive(MessageKind kind, uint64_t round, uint32_t from,
                            std::chrono::milliseconds timeout) override {
    std::unique_lock lock(s_->mu);
    TimePoint now = s_->clock.now();
    const TimePoint deadline = now + timeout;
    while (true) {
      if (!mine()) return Status(StatusCode::kCancelled, "transport: closed");
      s_->settle(now);
      State::Endpoint& e = s_->endpoints[rank_];
      for (auto it = e.inbox.begin(); it != e.inbox.end(); ++it) {
        if (it->header.kind != kind || it->header.round != round) continue;
        if (from != kAnyPeer && it->header.sender != from) continue;
        Message out{it->header, std::move(it->payload), it->arriveAt};
        e.inboxBytes -= out.payload.size();
        e.inbox.erase(it);
        return out;
      }
      if (now >= deadline) {
        if (timeout.count() <= 0) return nothingWaiting();
        return deadlineExceeded(fmt::format(
            "transport: no {} message for round {} from {} within {} ms", messageKindName(kind),
            round, from == kAnyPeer ? std::string("any rank") : fmt::format("rank {}", from),
            timeout.count()));
      }
      s_->clock.waitUntil(lock, s_->changed, s_->wakeAt(now, deadline));
      now = s_->clock.now();
    }
  }

  uint64_t arrivals() const override {
    std::lock_guard lock(s_->mu);
    s_->settle(s_->clock.now());
    return s_->endpoints[rank_].arrived;
  }

  bool awaitArrival(uint64_t seen, std::chrono::milliseconds timeout) override {
    std::unique_lock lock(s_->mu);
    TimePoint now = s_->clock.now();
    const TimePoint deadline = now + timeout;
    while (true) {
      if (!mine()) return false;
      s_->settle(now);
      if (s_->endpoints[rank_].arrived > seen) return true;
      if (now >= deadline) return false;
      s_->clock.waitUntil(lock, s_->changed, s_->wakeAt(now, deadline));
      now = s_->clock.now();
    }
  }

  size_t discard(const std::function<bool(const FrameHeader&)>& match) override {
    std::lock_guard lock(s_->mu);
    if (!mine()) return 0;
    s_->settle(s_->clock.now());
    State::Endpoint& e = s_->endpoints[rank_];
    size_t n = 0;
    for (auto it = e.inbox.begin(); it != e.inbox.end();) {
      if (match(it->header)) {
        e.inboxBytes -= it->payload.size();
        it = e.inbox.erase(it);
        ++n;
      } else {
        ++it;
      }
    }
    return n;
  }

  void setPartitioned(bool cut) override {
    changeOwn([&](State::Endpoint& e, TimePoint) {
      e.cut = cut;
      if (!cut) return;
      for (uint32_t p = 0; p < s_->world(); ++p) {
        if (p == rank_ || !s_->wan(rank_, p)) continue;
        e.partitionDropped += e.peers[p].dropQueued();
      }
    });
  }

  void setUplinkRate(double bytesPerSecond) override {
    std::lock_guard lock(s_->mu);
    if (!mine()) return;
    s_->settle(s_->clock.now());
    s_->endpoints[rank_].uplinkBytesPerSecond = std::max(0.0, bytesPerSecond);
    s_->touch();
  }

  std::vector<PeerCounters> peerCounters() const override {
    std::lock_guard lock(s_->mu);
    std::vector<PeerCounters> out;
    if (!mine()) return out;
    const TimePoint now = s_->clock.now();
    s_->settle(now);
    const State::Endpoint& e = s_->endpoints[rank_];
    for (uint32_t p = 0; p < s_->world(); ++p) {
      if (p == rank_) continue;
      const State::PeerSide& side = e.peers[p];
      PeerCounters c;
      c.peer = p;
      c.bytesSent = side.bytesSent;
      c.bytesReceived = side.bytesReceived;
      c.messagesSent = side.messagesSent;
      c.messagesReceived = side.messagesReceived;
      c.reconnects =
          static_cast<uint64_t>(std::count_if(side.reconnectsAt.begin(), side.reconnectsAt.end(),
                                              [&](TimePoint at) { return at <= now; }));
      c.queuedBytes = side.queuedBytes;
      c.backlogBytes = side.queuedBytes;
      for (const State::SentRecord& s : side.sent) {
        c.unackedBytes += s.bytes;
        c.unackedSeconds = std::max(c.unackedSeconds, seconds(now - s.leftAt));
      }
      c.sinceAckSeconds = side.lastAck ? seconds(now - *side.lastAck) : -1.0;
      c.ackedBytes = side.ackedBytes;
      const auto heard = s_->lastHeard(rank_, p, now);
      c.heard = heard.has_value();
      c.silentSeconds = seconds(now - heard.value_or(e.openedAt));
      if (c.heard) {
        c.rttSeconds = seconds(s_->oneWay(rank_, p) + s_->oneWay(p, rank_));
        c.minRttSeconds = c.rttSeconds;
      }
      out.push_back(c);
    }
    return out;
  }

  TransportCounters counters() const override {
    std::lock_guard lock(s_->mu);
    TransportCounters c;
    if (!mine()) return c;
    const State::Endpoint& e = s_->endpoints[rank_];
    c.partitionDropped = e.partitionDropped;
    c.framesRejected = e.framesRejected;
    c.lastRejectReason = e.lastRejectReason;
    return c;
  }

  Status updateKeys(const KeySet&) override {
    return Status(StatusCode::kUnimplemented,
                  "transport: the in-memory transport has no keys (it is not encrypted)");
  }

 private:
  // Applies `apply(endpoint, now)` to this rank's endpoint as a change of
  // state (State::change), if this object is still that endpoint.
  template <typename Apply>
  void changeOwn(Apply&& apply) {
    std::lock_guard lock(s_->mu);
    if (!mine()) return;
    const TimePoint now = s_->clock.now();
    s_->settle(now);
    s_->change(now, [&] { apply(s_->endpoints[rank_], now); });
  }

  // Whether this object is still its rank's open endpoint (not closed, not
  // killed, not replaced). With s_->mu held.
  bool mine() const {
    const State::Endpoint& e = s_->endpoints[rank_];
    return e.open && e.incarnation == incarnation_;
  }

  std::shared_ptr<State> s_;
  const uint32_t rank_;
  const uint64_t incarnation_;
};

}  // namespace

StatusOr<std::shared_ptr<MemoryNetwork>> MemoryNetwork::make(Options options,
                                                             const geo::Clock& clock) {
  const uint32_t n = options.worldSize;
  if (n == 0) return invalidArgument("memory network: worldSize must be at least 1");
  if (!options.oneWay.empty()) {
    if (options.oneWay.size() != n) {
      return invalidArgument(fmt::format("memory network: oneWay has {} rows for a world of {}",
                                         options.oneWay.size(), n));
    }
    for (size_t r = 0; r < n; ++r) {
      if (options.oneWay[r].size() != n) {
        return invalidArgument(
            fmt::format("memory network: oneWay[{}] has {} entries for a world of {}", r,
                        options.oneWay[r].size(), n));
      }
      for (size_t p = 0; p < n; ++p) {
        if (options.oneWay[r][p] < Duration::zero()) {
          return invalidArgument(fmt::format("memory network: oneWay[{}][{}] is negative", r, p));
        }
      }
    }
  }
  if (!options.regions.empty() && options.regions.size() != n) {
    return invalidArgument(fmt::format("memory network: regions has {} entries for a world of {}",
                                       options.regions.size(), n));
  }
  auto state = std::make_shared<State>(std::move(options), clock);
  state->jobHash = jobIdHash(state->options.jobId);
  state->endpoints.resize(n);
  for (auto& e : state->endpoints) e.peers.resize(n);
  return std::shared_ptr<MemoryNetwork>(new MemoryNetwork(std::move(state)));
}

StatusOr<std::unique_ptr<Transport>> MemoryNetwork::open(uint32_t rank) {
  std::lock_guard lock(state_->mu);
  if (rank >= state_->world()) {
    return invalidArgument(
        fmt::format("memory network: rank {} is outside the world of {}", rank, state_->world()));
  }
  if (state_->endpoints[rank].open) {
    return failedPrecondition(
        fmt::format("memory network: rank {} is open already (close or kill it first)", rank));
  }
  const TimePoint now = state_->clock.now();
  state_->settle(now);
  const uint64_t incarnation = state_->nextIncarnation++;
  state_->change(now, [&] {
    State::Endpoint& e = state_->endpoints[rank];
    // What the previous incarnation still had queued goes with it, and it
    // starts with no view of its peers.
    e = State::Endpoint{};
    e.peers.resize(state_->world());
    e.open = true;
    e.incarnation = incarnation;
    e.openedAt = now;
    e.uplinkFree = now;
  });
  return std::unique_ptr<Transport>(new MemoryTransport(state_, rank, incarnation));
}

void MemoryNetwork::kill(uint32_t rank) {
  std::lock_guard lock(state_->mu);
  if (rank >= state_->world() || !state_->endpoints[rank].open) return;
  const TimePoint now = state_->clock.now();
  state_->settle(now);
  state_->change(now, [&] {
    State::Endpoint& e = state_->endpoints[rank];
    e.open = false;
    e.closedAt = now - state_->options.linger;  // nothing lingers
    e.inbox.clear();
    e.inboxBytes = 0;
    for (State::PeerSide& side : e.peers) side.dropQueued();
  });
}

void MemoryNetwork::cutWays(const std::vector<std::pair<uint32_t, uint32_t>>& ways, bool cut) {
  std::lock_guard lock(state_->mu);
  for (const auto& [from, to] : ways) {
    if (from >= state_->world() || to >= state_->world() || from == to) return;
  }
  const TimePoint now = state_->clock.now();
  state_->settle(now);
  state_->change(now, [&] {
    for (const auto& [from, to] : ways) {
      if (!cut) {
        state_->cutWays.erase({from, to});
        continue;
      }
      state_->cutWays.insert({from, to});
      State::Endpoint& e = state_->endpoints[from];
      if (to < e.peers.size()) e.partitionDropped += e.peers[to].dropQueued();
    }
  });
}

void MemoryNetwork::cutOneWay(uint32_t from, uint32_t to, bool cut) {
  cutWays({{from, to}}, cut);
}

void MemoryNetwork::holdData(uint32_t from, uint32_t to, bool hold) {
  std::lock_guard lock(state_->mu);
  if (from >= state_->world() || to >= state_->world() || from == to) return;
  const TimePoint now = state_->clock.now();
  state_->settle(now);
  if (hold) {
    state_->heldWays.insert({from, to});
  } else {
    state_->heldWays.erase({from, to});
  }
  // Released data is due now: every waiter settles it as it wakes.
  state_->touch();
  state_->clock.notifyAll(state_->changed);
}

void MemoryNetwork::cutLink(uint32_t a, uint32_t b, bool cut) {
  cutWays({{a, b}, {b, a}}, cut);
}

void MemoryNetwork::setOneWay(uint32_t from, uint32_t to, Duration delay) {
  std::lock_guard lock(state_->mu);
  if (from >= state_->world() || to >= state_->world() || delay < Duration::zero()) return;
  state_->settle(state_->clock.now());
  if (state_->options.oneWay.empty()) {
    state_->options.oneWay.assign(state_->world(),
                                  std::vector<Duration>(state_->world(), Duration::zero()));
  }
  state_->options.oneWay[from][to] = delay;
  state_->touch();
}

}  // namespace geo::transport
