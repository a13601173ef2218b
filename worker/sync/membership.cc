// Membership: liveness from the transport and the join protocol (see
// worker/sync/membership.h for the rules, docs/membership.md for the story).

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <thread>

#include "common/enforce.h"
#include "common/logging.h"
#include "worker/sync/internal.h"
#include "worker/sync/parts.h"

namespace geo::sync::detail {

using transport::CodecId;
using transport::Message;
using transport::MessageKind;

namespace {

// How long one wait for a message lasts before membership is looked at again.
constexpr auto kPoll = std::chrono::milliseconds(20);
// A state over two of these goes in parts behind our rounds (serve,
// pumpStates), at most kStateAhead of them waiting to leave at a time: a
// part on its way holds a round back for a part's time on the uplink
// (0.3 s at 100 Mbit/s), and two keep the link busy between our calls.
constexpr size_t kStatePartBytes = size_t{4} << 20;
constexpr uint64_t kStateAhead = 2;
// Our data for another peer that has yet to leave this machine, above
// which the next part waits: a round's worth, not the pings and
// acknowledgements.
constexpr uint64_t kRoundQueuedBytes = 64 << 10;
// A peer never heard is waited for this long at most (or the round time-out,
// when shorter): a slow starter joins later by state transfer anyway.
constexpr auto kStartGrace = std::chrono::seconds(20);
// A peer heard again that has not said from which round it resumes is asked
// again this often (the question may have been lost with a connection).
constexpr auto kResumeAskEvery = std::chrono::seconds(2);

// A join offer's first byte (membership.h, "Join protocol").
constexpr unsigned kOfferFinished = 1;   // the peer has taken its last step
constexpr unsigned kOfferJoining = 2;    // the peer is itself still joining
constexpr unsigned kOfferCoStarter = 4;  // it saw the joiner joining while it joined
constexpr unsigned kOfferBehind = 8;     // it completed the joiner's next round without it

unsigned offerFlags(const Message& offer) {
  return offer.payload.size() >= 1 ? static_cast<unsigned>(offer.payload.data()[0]) : 0u;
}

double seconds(std::chrono::milliseconds d) {
  return std::chrono::duration<double>(d).count();
}

// Fixed-layout fields, one after another (control.h: ResumePayload).
template <typename... Fields>
std::shared_ptr<std::vector<std::byte>> pack(const Fields&... fields) {
  auto bytes = std::make_shared<std::vector<std::byte>>((sizeof(Fields) + ...));
  std::byte* at = bytes->data();
  ((std::memcpy(at, &fields, sizeof fields), at += sizeof fields), ...);
  return bytes;
}
template <typename... Fields>
bool unpack(std::span<const std::byte> bytes, Fields&... fields) {
  if (bytes.size() != (sizeof(Fields) + ...)) return false;
  const std::byte* at = bytes.data();
  ((std::memcpy(&fields, at, sizeof fields), at += sizeof fields), ...);
  return true;
}

}  // namespace

std::shared_ptr<std::vector<std::byte>> ResumePayload::encode() const {
  const auto ask = static_cast<uint8_t>(askBack ? 1 : 0);
  return pack(round, ask, notices, incarnation);
}

std::optional<ResumePayload> ResumePayload::decode(std::span<const std::byte> bytes) {
  ResumePayload r;
  uint8_t ask = 0;
  if (!unpack(bytes, r.round, ask, r.notices, r.incarnation)) return std::nullopt;
  r.askBack = ask != 0;
  return r;
}

std::shared_ptr<std::vector<std::byte>> SuspectsPayload::encode() const {
  return pack(from, notices, incarnation);
}

std::optional<SuspectsPayload> SuspectsPayload::decode(std::span<const std::byte> bytes) {
  SuspectsPayload r;
  if (!unpack(bytes, r.from, r.notices, r.incarnation)) return std::nullopt;
  return r;
}

Membership::Membership(transport::Transport* transport, const Topology& topology,
                       std::vector<uint32_t> peers, const SyncOptions& options, std::string name,
                       int64_t stepsPerRound)
    : clock_(clockOf(options)),
      transport_(transport),
      topology_(topology),
      peers_(std::move(peers)),
      lives_(peers_.size()),
      options_(options),
      name_(std::move(name)),
      stepsPerRound_(std::max<int64_t>(1, stepsPerRound)),
      incarnation_(
          (uint64_t{std::random_device{}()} << 32) ^ std::random_device{}() ^
          static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count())) {}

double Membership::since(geo::Clock::TimePoint t0) const {
  return secondsSince(clock_, t0);
}

uint64_t Membership::roundAt(int64_t step) const {
  step = std::max<int64_t>(step, 0);
  return roundOf_ ? roundOf_(step) : static_cast<uint64_t>(step / stepsPerRound_);
}

uint64_t Membership::openRound(int64_t step) const {
  return openRound_ ? openRound_() : roundAt(step);
}

const Membership::PeerLife* Membership::find(uint32_t peer) const {
  const auto it = std::find(peers_.begin(), peers_.end(), peer);
  return it == peers_.end() ? nullptr : &lives_[static_cast<size_t>(it - peers_.begin())];
}

Membership::PeerLife& Membership::life(uint32_t peer) {
  const PeerLife* l = find(peer);
  GEO_ENFORCE(l != nullptr, "membership: rank {} is not a peer of this group", peer);
  return const_cast<PeerLife&>(*l);
}

std::chrono::milliseconds Membership::peerTimeout(uint32_t peer) const {
  if (options_.peerTimeout.count() > 0) return options_.peerTimeout;
  const PeerLife* l = find(peer);
  const double rtt = l != nullptr ? std::max(l->rtt, 0.0) : 0.0;
  // Pings leave every second: 3 s is three missed pings; a long link gets
  // room for a few of its round trips on top. The path's round trip, the
  // smallest recent one: a ping that waited out a partition in TCP's
  // buffers came back after seconds, and stretched the time-out to 50 s.
  const double s = std::max(3.0, 4 * rtt + 2.0);
  return std::chrono::milliseconds(static_cast<int64_t>(s * 1000));
}

void Membership::refresh() {
  if (transport_ == nullptr || peers_.empty()) return;
  const auto counters = transport_->peerCounters();
  std::lock_guard lock(mu_);
  const auto now = clock_.now();
  const bool degraded =
      std::any_of(lives_.begin(), lives_.end(), [](const PeerLife& l) { return l.suspected; });
  if (lastRefresh_ && degraded) {
    degradedSeconds_ += std::chrono::duration<double>(now - *lastRefresh_).count();
  }
  lastRefresh_ = now;
  const auto grace = std::min<std::chrono::milliseconds>(options_.timeout, kStartGrace);
  for (const auto& c : counters) {
    const auto it = std::find(peers_.begin(), peers_.end(), c.peer);
    if (it == peers_.end()) continue;
    PeerLife& l = lives_[static_cast<size_t>(it - peers_.begin())];
    if (c.minRttSeconds > 0) l.rtt = c.minRttSeconds;
    const double limit = c.heard ? seconds(peerTimeout(c.peer))
                                 : std::max(seconds(grace), seconds(peerTimeout(c.peer)));
    const bool silent = c.silentSeconds > limit;
    if (silent && !l.suspected) {
      l.suspected = true;
      newlySuspected_.push_back(c.peer);
      logger()->warn(
          "{}: {} is suspected: {} for {:.1f} s (limit {:.1f} s); going on without it until it "
          "is heard again",
          name_, topology_.describe(c.peer), c.heard ? "silent" : "never heard", c.silentSeconds,
          limit);
    } else if (!silent && l.suspected) {
      // Both sides went on without each other and may be rounds apart now:
      // it is expected again once it delivers a contribution (it sends to us
      // again from now on), not from a round we would have to guess.
      l.suspected = false;
      l.absent = true;
      l.awaitingResume = resumeAnnounced_;
      l.resumeAsked.reset();
      heardAgain_.push_back(c.peer);
      logger()->info("{}: {} is heard again; expected again once it {}", name_,
                     topology_.describe(c.peer),
                     resumeAnnounced_ ? "says from which round it sends" : "delivers");
    }
  }
}

bool Membership::suspected(uint32_t peer) const {
  const PeerLife* l = find(peer);
  return l != nullptr && l->suspected;
}

bool Membership::joining(uint32_t peer) const {
  const PeerLife* l = find(peer);
  return l != nullptr && l->joining;
}

bool Membership::anyJoining() const {
  return std::any_of(lives_.begin(), lives_.end(),
                     [](const PeerLife& l) { return l.joining && !l.suspected; });
}

bool Membership::expected(uint32_t peer, uint64_t round) const {
  const PeerLife* l = find(peer);
  return l != nullptr && !l->suspected && !l->joining && !l->absent && !l->awaitingResume &&
         round >= l->expectFrom;
}

bool Membership::takesPart(uint32_t peer, uint64_t round) const {
  const PeerLife* l = find(peer);
  return l != nullptr && !l->suspected && !l->joining && !l->absent && !l->awaitingResume &&
         round >= l->announcedFrom;
}

bool Membership::absent(uint32_t peer) const {
  const PeerLife* l = find(peer);
  return l != nullptr && l->absent;
}

bool Membership::awaitingResume(uint32_t peer) const {
  const PeerLife* l = find(peer);
  return l != nullptr && l->awaitingResume;
}

void Membership::giveUp(uint32_t peer) {
  life(peer).absent = true;
}

void Membership::delivered(uint32_t peer, uint64_t round) {
  PeerLife& l = life(peer);
  l.expectFrom = std::max(l.expectFrom, round);
  if (l.absent) {
    l.absent = false;
    logger()->info("{}: {} delivers again", name_, topology_.describe(peer));
  }
}

Status Membership::sendControl(uint32_t to, Control control, int64_t step,
                               std::shared_ptr<const std::vector<std::byte>> bytes, CodecId codec,
                               uint64_t elements) {
  transport::SendMeta meta{roundOf(control), static_cast<uint64_t>(std::max<int64_t>(step, 0)),
                           codec, elements};
  // A join's question, its answers and the request for state take the
  // control lane: a worker's data connection starts with the warm-up
  // padding, which a fresh TCP connection over a long round trip sends in
  // several round trips of slow start, and a running peer's carries its
  // rounds -- behind either, joining cost a second or more across the world.
  // None of them says anything about the data sent before it. So do the
  // notices of suspicion (kSuspects, kSuspicionOf): they are for a peer
  // that hears us while we do not hear it, and the worst of those is one
  // whose own uplink is clogged -- its ACKs lost there, our data connection
  // to it backs off and holds everything we send it, while our pings,
  // which it hears, still get through. Behind our rounds a throttled tokyo
  // learned it was suspected only when the throttle lifted, 14.8 s of
  // waiting, and then so far behind that the others waited 11.8 s for its
  // rounds (docs/benchmarks.md). Overtaking the data is safe: a notice
  // names the first round we no longer send; a resume sent after it but
  // arriving first names a later round, which voids the notice, and a
  // resume sent before it counts fewer notices than the peer has heard,
  // which voids the resume. The state itself, the announcement of the
  // round a joiner contributes from and a resume (which orders a peer's old
  // contributions before its new ones) stay on the data connection.
  meta.controlLane = control == Control::kJoinQuery || control == Control::kJoinOffer ||
                     control == Control::kJoinFetch || control == Control::kSuspects ||
                     control == Control::kSuspicionOf;
  return sendBuffer(*transport_, topology_, {to}, MessageKind::kControl, meta, std::move(bytes),
                    options_.timeout);
}

Status Membership::sendResume(uint32_t peer, int64_t step, bool askBack) {
  const uint64_t first = openRound(step);
  PeerLife& l = life(peer);
  if (askBack) l.resumeAsked = clock_.now();
  return sendControl(peer, Control::kResume, step,
                     ResumePayload{first, askBack, l.suspicionsSent, incarnation_}.encode(),
                     CodecId::kRaw, 0);
}

Status Membership::sendSuspects(uint32_t peer, int64_t step) {
  const uint32_t notices = ++life(peer).suspicionsSent;
  return sendControl(peer, Control::kSuspects, step,
                     SuspectsPayload{roundAt(step), notices, incarnation_}.encode(), CodecId::kRaw,
                     0);
}

Status Membership::takeSuspicionNotices(uint32_t reporter, int64_t step) {
  for (auto m = receiveControl(*transport_, Control::kSuspicionOf, reporter,
                               std::chrono::milliseconds(0));
       m.ok(); m = receiveControl(*transport_, Control::kSuspicionOf, reporter,
                                  std::chrono::milliseconds(0))) {
    uint32_t peer = 0;
    uint64_t from = 0;
    if (m->payload.size() != sizeof peer + sizeof from) {
      logger()->warn("{}: ignoring a notice of suspicion from {} with {} bytes (expected {})",
                     name_, topology_.describe(reporter), m->payload.size(),
                     sizeof peer + sizeof from);
      continue;
    }
    std::memcpy(&peer, m->payload.data(), sizeof peer);
    std::memcpy(&from, m->payload.data() + sizeof peer, sizeof from);
    const auto it = std::find(peers_.begin(), peers_.end(), peer);
    // This worker or not a peer of ours (it == end), or a reporter naming itself.
    if (it == peers_.end() || peer == reporter) continue;
    PeerLife& l = lives_[static_cast<size_t>(it - peers_.begin())];
    const auto at = clock_.now();
    // Each reporter's latest; those older than the peer time-out no longer
    // count (the reporter may hear the peer again by now).
    std::erase_if(l.suspectedBy, [&](const PeerLife::Report& r) {
      return r.by == reporter || at - r.at > peerTimeout(peer);
    });
    l.suspectedBy.push_back({reporter, at, from});
    // More than half of our other peers (all of them among four workers):
    // a single cut link is told by one worker.
    if (2 * l.suspectedBy.size() <= peers_.size() - 1) continue;
    uint64_t first = from;
    for (const auto& r : l.suspectedBy) first = std::min(first, r.from);
    const size_t count = l.suspectedBy.size();
    l.suspectedBy.clear();
    // Stale: we suspect it too, await its resume already, or it has
    // delivered that round or a later one to us.
    if (l.suspected || l.awaitingResume || l.expectFrom >= first) continue;
    l.absent = true;
    l.awaitingResume = true;
    logger()->warn(
        "{}: {} of the {} other workers suspect {} (from round {} on) although this worker hears "
        "it; not waited for until it says from which round it sends",
        name_, count, peers_.size() - 1, topology_.describe(peer), first);
    // The peer is told, as a worker that suspects it tells it: it may be
    // waiting for our contributions while our data to it is stuck (our
    // connection backed off behind its clogged uplink, its ACKs lost there,
    // while our pings and this lane still reach it). Untold, a throttled
    // tokyo waited 7.0 s so for oregon, which had stopped waiting for it on
    // the others' word, until it fell silent. The round named is the first
    // we have not sent yet: if the peer has that one or a later one from us
    // by the time the notice arrives, our data gets through and it waits
    // on (the notice is stale there). Counted with the others, so that a
    // resume of ours sent before this notice is void there.
    GEO_RETURN_IF_ERROR(sendSuspects(peer, step));
  }
  return {};
}

StatusOr<Membership::Served> Membership::serve(int64_t step, const torch::Tensor& values,
                                               bool finished, const train::FlatParameters* flat) {
  Served out;
  if (transport_ == nullptr) return out;
  refresh();
  out.suspected = takeNewlySuspected();
  out.heardAgain = takeHeardAgain();
  const auto now = std::chrono::milliseconds(0);
  const uint64_t open = openRound(step);
  if (resumeAnnounced_) {
    // The round in progress is the first one not sent yet: the algorithm
    // sends a suspected peer nothing from it on.
    const uint64_t from = roundAt(step);
    for (const uint32_t p : out.suspected) {
      GEO_RETURN_IF_ERROR(sendSuspects(p, step));
      // The others learn it too: 12 bytes to each, once per suspicion.
      auto notice = std::make_shared<std::vector<std::byte>>(sizeof p + sizeof from);
      std::memcpy(notice->data(), &p, sizeof p);
      std::memcpy(notice->data() + sizeof p, &from, sizeof from);
      for (size_t i = 0; i < peers_.size(); ++i) {
        if (peers_[i] == p || lives_[i].suspected) continue;
        GEO_RETURN_IF_ERROR(
            sendControl(peers_[i], Control::kSuspicionOf, step, notice, CodecId::kRaw, 0));
      }
    }
  }
  for (size_t i = 0; i < peers_.size(); ++i) {
    const uint32_t p = peers_[i];
    PeerLife& l = lives_[i];
    if (resumeAnnounced_) {
      for (auto m = receiveControl(*transport_, Control::kSuspects, p, now); m.ok();
           m = receiveControl(*transport_, Control::kSuspects, p, now)) {
        const auto notice = SuspectsPayload::decode(m->payload.bytes());
        if (!notice) {
          logger()->warn("{}: ignoring a notice of suspicion from {} with {} bytes (expected {})",
                         name_, topology_.describe(p), m->payload.size(), SuspectsPayload::kBytes);
          continue;
        }
        // An earlier process of the peer's: void, and its count too (it may
        // have counted higher, and would void every resume of the new one).
        if (!ofItsProcess(l, notice->incarnation)) {
          logger()->info("{}: ignoring a notice of suspicion sent by an earlier process of {}",
                         name_, topology_.describe(p));
          continue;
        }
        l.suspicionsHeard = std::max(l.suspicionsHeard, notice->notices);
        // Stale: we suspect it too (its resume follows once we hear each
        // other), or it has delivered that round or a later one since.
        if (l.suspected || l.awaitingResume || l.expectFrom >= notice->from) continue;
        l.absent = true;
        l.awaitingResume = true;
        logger()->warn(
            "{}: {} suspects this worker, or most of the others do, and waits for it no more (from "
            "round {} on) although this worker hears it; not waited for until it says from which "
            "round it sends again",
            name_, topology_.describe(p), notice->from);
      }
      GEO_RETURN_IF_ERROR(takeSuspicionNotices(p, step));
      for (auto m = receiveControl(*transport_, Control::kResume, p, now); m.ok();
           m = receiveControl(*transport_, Control::kResume, p, now)) {
        const auto resume = ResumePayload::decode(m->payload.bytes());
        if (!resume) {
          logger()->warn("{}: ignoring a resume of {} with {} bytes (expected {})", name_,
                         topology_.describe(p), m->payload.size(), ResumePayload::kBytes);
          continue;
        }
        const uint64_t first = resume->round;
        // Stale, whatever order it came in: taking a resume sent before the
        // peer came to suspect us (it told us since, and sends us nothing
        // now) made a worker whose uplink was throttled wait for the peer
        // until the throttle lifted -- the resume and the notice that
        // overtook it came in one burst, once its ACKs got through. A
        // worker's oldest open round only grows, so one naming an older
        // round than a resume taken since was overtaken too (an old
        // connection delivering after a new one).
        std::string stale;
        if (!ofItsProcess(l, resume->incarnation)) {
          stale = "sent by an earlier process of it";
        } else if (resume->notices < l.suspicionsHeard) {
          stale =
              "sent before it came to suspect this worker; its resume follows once it hears this "
              "worker again";
        } else if (first < l.resumedFrom) {
          stale = fmt::format("it said round {} since", l.resumedFrom);
        }
        if (!stale.empty()) {
          logger()->info("{}: ignoring a resume of {} from round {}: {}", name_,
                         topology_.describe(p), first, stale);
          continue;
        }
        l.resumedFrom = first;
        if (l.awaitingResume) {
          logger()->info(
              "{}: {} sends its contributions from round {} on; expected again from "
              "then",
              name_, topology_.describe(p), first);
        }
        l.awaitingResume = false;
        l.absent = false;
        l.expectFrom = first;
        l.announcedFrom = first;
        if (resume->askBack) {
          GEO_RETURN_IF_ERROR(sendResume(p, step, false));
          out.resumeAsked.push_back(p);
        }
      }
      const bool heardAgain =
          std::find(out.heardAgain.begin(), out.heardAgain.end(), p) != out.heardAgain.end();
      if (l.awaitingResume && !l.suspected &&
          (heardAgain || !l.resumeAsked || clock_.now() - *l.resumeAsked >= kResumeAskEvery)) {
        GEO_RETURN_IF_ERROR(sendResume(p, step, true));
      }
    }
    for (auto q = receiveControl(*transport_, Control::kJoinQuery, p, now); q.ok();
         q = receiveControl(*transport_, Control::kJoinQuery, p, now)) {
      // Behind -- the round it contributes to next is one we completed
      // without it: it will take a peer's state and announce the round it
      // starts with; until then it is not waited for. Otherwise it takes
      // part in our oldest open round whatever it does (a common start, a
      // whole-job restart), so it stays expected. The oldest open round, not
      // our step: at step 1 with K = 1, D = 0 we are still completing round
      // 0, which a worker asking at step 0 is in time for.
      const bool behind = roundAt(static_cast<int64_t>(q->header.step)) < open;
      // Asking again: a state of ours still on its way is for a process
      // that went, or that asks anew.
      std::erase_if(outgoing_, [&](const OutgoingState& o) { return o.peer == p; });
      l.joining = behind;
      l.suspicionsHeard = 0;  // a new incarnation counts its notices from 0
      l.resumedFrom = 0;      // and its rounds may start again lower
      l.absent = false;
      l.awaitingResume = false;
      out.queried.push_back(p);
      uint64_t itsIncarnation = 0;
      if (q->payload.size() == sizeof itsIncarnation) {
        std::memcpy(&itsIncarnation, q->payload.data(), sizeof itsIncarnation);
      }
      if (itsIncarnation != 0) l.incarnation = itsIncarnation;
      const bool coStarter = coStarters_.contains({p, itsIncarnation});
      auto offer = std::make_shared<std::vector<std::byte>>(1 + sizeof incarnation_);
      // Our verdict travels with the offer: the joiner fetches state only
      // from a peer that does not count on its contribution, so both sides
      // agree on whether it takes part in our open round.
      (*offer)[0] = std::byte{static_cast<unsigned char>(
          (finished || finishing_ ? kOfferFinished : 0) | (inJoin_ ? kOfferJoining : 0) |
          (coStarter ? kOfferCoStarter : 0) | (behind ? kOfferBehind : 0))};
      std::memcpy(offer->data() + 1, &incarnation_, sizeof incarnation_);
      GEO_RETURN_IF_ERROR(
          sendControl(p, Control::kJoinOffer, step, std::move(offer), CodecId::kRaw, 0));
      if (q->header.step > 0 || step > 0) {
        logger()->info("{}: {} starts at step {} and asks to join; we are at step {}{}{}", name_,
                       topology_.describe(p), q->header.step, step,
                       finished ? " and have finished" : "",
                       behind ? fmt::format(" (it is behind: we completed round {} without it)",
                                            roundAt(static_cast<int64_t>(q->header.step)))
                              : std::string());
      }
    }
    // An offer after our join is over answers a query of ours that reached
    // the peer late: a partition or a slow start held it back while we
    // started on our own, and our announcement (kJoined, on the data
    // connection) was lost with a connection replaced meanwhile, or came
    // before the query. A peer that found us behind now marks us joining
    // and waits for an announcement that will not come: it would leave us
    // out of every round, and of the final average, for the rest of the
    // job (and linger for our join at its end). So we announce again the
    // round we contribute from.
    for (auto o = inJoin_ ? StatusOr<Message>(deadlineExceeded("joining"))
                          : receiveControl(*transport_, Control::kJoinOffer, p, now);
         o.ok(); o = receiveControl(*transport_, Control::kJoinOffer, p, now)) {
      if ((offerFlags(*o) & kOfferBehind) == 0) continue;  // it keeps expecting us
      logger()->info(
          "{}: {} answered our start-up query only now and takes us for a joiner; telling it "
          "that we contribute from round {}",
          name_, topology_.describe(p), open);
      auto bytes = std::make_shared<std::vector<std::byte>>(sizeof open);
      std::memcpy(bytes->data(), &open, sizeof open);
      GEO_RETURN_IF_ERROR(
          sendControl(p, Control::kJoined, step, std::move(bytes), CodecId::kRaw, 0));
    }
    // A worker that has taken its last step holds no round's result until
    // the final average is in: a joiner's request for state waits until
    // then (lingerForJoiners answers it), and gets the job's final model.
    const bool deferFetch = finishing_ && !final_;
    for (auto f = deferFetch ? StatusOr<Message>(deadlineExceeded("deferred"))
                             : receiveControl(*transport_, Control::kJoinFetch, p, now);
         f.ok(); f = receiveControl(*transport_, Control::kJoinFetch, p, now)) {
      // The job's final model is the whole model (with batch norm's
      // statistics) where the trainer keeps one.
      auto bytes = tensorBytes(final_ && flat != nullptr ? train::wholeModel(*flat).contiguous()
                                                         : values.contiguous());
      if (final_) {
        // The job's final model alone (fp32, no optimizer: nobody trains
        // on): the joiner knows it by its codec.
        {
          std::lock_guard lock(mu_);
          transferSent_ += bytes->size();
        }
        logger()->info(
            "{}: sending the job's final model to {}, which asks for it (it started after the "
            "end, or the final average was made without it)",
            name_, topology_.describe(p));
        const auto numel = static_cast<uint64_t>(bytes->size() / 4);
        GEO_RETURN_IF_ERROR(
            sendControl(p, Control::kJoinState, step, std::move(bytes), CodecId::kFp32, numel));
        l.joining = false;
        continue;
      }
      if (flat != nullptr && flat->saveOptimizer) {
        const std::string optimizer = flat->saveOptimizer();
        const auto* begin = reinterpret_cast<const std::byte*>(optimizer.data());
        bytes->insert(bytes->end(), begin, begin + optimizer.size());
      }
      {
        std::lock_guard lock(mu_);
        transferSent_ += bytes->size();
        ++peerRejoins_;
      }
      if (goesInParts(bytes->size())) {
        // A large model's state: in parts, behind our rounds. Sent whole,
        // 159 MB filled our uplink for 17 s, and our rounds to the others
        // waited behind it -- they waited 10-13 s for them on the
        // namespace network. The joiner catches up on the rounds it took
        // (Dts::catchUp), so a slower transfer costs nobody a wait.
        logger()->info(
            "{}: sending our model at step {} to {} ({:.2f} MB, in parts of {} MB behind our "
            "rounds)",
            name_, step, topology_.describe(p), static_cast<double>(bytes->size()) / 1e6,
            kStatePartBytes >> 20);
        std::erase_if(outgoing_, [&](const OutgoingState& o) {
          return o.peer == p && o.part == Control::kJoinStatePart;
        });
        sendInParts(p, Control::kJoinStatePart, step, std::move(bytes),
                    fmt::format("our model of step {}", step));
      } else {
        logger()->info("{}: sending our model at step {} to {} ({:.2f} MB)", name_, step,
                       topology_.describe(p), static_cast<double>(bytes->size()) / 1e6);
        // Raw: the model's fp32 values followed by the optimizer's bytes.
        GEO_RETURN_IF_ERROR(
            sendControl(p, Control::kJoinState, step, std::move(bytes), CodecId::kRaw, 0));
      }
      l.absent = false;
      l.awaitingResume = false;
      if (servedJoinerAnnounces_) {
        // Its announcement says from which round on it contributes; until
        // then our rounds complete without it (setServedJoinerAnnounces).
        l.joining = true;
        continue;
      }
      // It continues from our step: expect it from that round on (its
      // announcement will say the same), so a synchronous partner -- a
      // region leader -- waits for it from its very first step.
      l.joining = false;
      l.expectFrom = roundAt(step);
      l.announcedFrom = l.expectFrom;
    }
    for (auto j = receiveControl(*transport_, Control::kJoined, p, now); j.ok();
         j = receiveControl(*transport_, Control::kJoined, p, now)) {
      uint64_t round = 0;
      if (j->payload.size() != sizeof round) {
        logger()->warn("{}: ignoring a join announcement of {} with {} bytes (expected {})", name_,
                       topology_.describe(p), j->payload.size(), sizeof round);
        continue;
      }
      std::memcpy(&round, j->payload.data(), sizeof round);
      l.joining = false;
      l.absent = false;
      l.awaitingResume = false;
      l.expectFrom = round;
      l.announcedFrom = round;
      logger()->debug("{}: {} contributes from round {} (its step {})", name_,
                      topology_.describe(p), round, j->header.step);
    }
  }
  GEO_RETURN_IF_ERROR(pumpStates());
  return out;
}

bool Membership::roomForStatePart(uint32_t peer) const {
  for (const transport::PeerCounters& c : transport_->peerCounters()) {
    // Not our group's, or gone: its queue says nothing of our rounds (and
    // asking the kernel costs two system calls).
    if (c.peer != peer && (find(c.peer) == nullptr || suspected(c.peer))) continue;
    const uint64_t waiting = c.backlogBytes + transport_->queuedBelowBytes(c.peer);
    if (c.peer == peer ? waiting >= kStateAhead * kStatePartBytes : waiting > kRoundQueuedBytes) {
      return false;
    }
  }
  return true;
}

bool Membership::goesInParts(size_t bytes) {
  return bytes > 2 * kStatePartBytes;
}

void Membership::sendInParts(uint32_t peer, Control part, int64_t step,
                             std::shared_ptr<const std::vector<std::byte>> bytes,
                             std::string what) {
  outgoing_.push_back(
      OutgoingState{peer, step, std::move(bytes), 0, clock_.now(), part, std::move(what)});
}

Status Membership::pumpStates() {
  // One payload at a time per peer and kind, in the order queued.
  std::vector<std::pair<uint32_t, Control>> going;
  for (auto it = outgoing_.begin(); it != outgoing_.end();) {
    OutgoingState& o = *it;
    const PeerLife* l = find(o.peer);
    if (l == nullptr || l->suspected) {
      logger()->warn(
          "{}: stopped sending {} to {} after {:.1f} of {:.1f} MB: it is suspected (it asks "
          "again, or another peer, once it is back)",
          name_, o.what, topology_.describe(o.peer), static_cast<double>(o.offset) / 1e6,
          static_cast<double>(o.bytes->size()) / 1e6);
      it = outgoing_.erase(it);
      continue;
    }
    if (std::find(going.begin(), going.end(), std::pair{o.peer, o.part}) != going.end()) {
      ++it;
      continue;
    }
    while (o.offset < o.bytes->size() && roomForStatePart(o.peer)) {
      const size_t n = std::min(kStatePartBytes, o.bytes->size() - o.offset);
      GEO_RETURN_IF_ERROR(
          sendControl(o.peer, o.part, o.step, makePart(*o.bytes, o.offset, n), CodecId::kRaw, 0));
      o.offset += n;
    }
    if (o.offset < o.bytes->size()) {
      going.emplace_back(o.peer, o.part);
      ++it;
      continue;
    }
    logger()->info("{}: {} handed on to {} in {:.1f} s ({:.2f} MB)", name_, o.what,
                   topology_.describe(o.peer), since(o.started),
                   static_cast<double>(o.bytes->size()) / 1e6);
    it = outgoing_.erase(it);
  }
  return {};
}

Status Membership::lingerWhileJoining(const std::function<Status()>& serve, std::string_view who) {
  if (!anyJoining()) return {};
  std::chrono::milliseconds longest{0};
  for (uint32_t p : peers_) longest = std::max(longest, peerTimeout(p));
  const auto deadline = clock_.now() + 2 * longest;
  logger()->info("{}: {} is rejoining as we finish; answering it for up to {:.1f} s", name_, who,
                 std::chrono::duration<double>(2 * longest).count());
  while (anyJoining() && clock_.now() < deadline) {
    clock_.sleepFor(kPoll);
    GEO_RETURN_IF_ERROR(serve());
  }
  return {};
}

StatusOr<Membership::Joined> Membership::join(int64_t ownStep, int64_t roundSteps,
                                              torch::Tensor& values, train::FlatParameters* flat) {
  Joined out;
  out.step = ownStep;
  if (transport_ == nullptr || peers_.empty()) return out;
  inJoin_ = true;
  struct Leave {
    bool& flag;
    ~Leave() { flag = false; }
  } leave{inJoin_};
  const auto t0 = clock_.now();
  for (uint32_t p : peers_) {
    auto query = std::make_shared<std::vector<std::byte>>(sizeof incarnation_);
    std::memcpy(query->data(), &incarnation_, sizeof incarnation_);
    GEO_RETURN_IF_ERROR(
        sendControl(p, Control::kJoinQuery, ownStep, std::move(query), CodecId::kRaw, 0));
  }
  struct Offer {
    int64_t step = 0;
    bool finished = false;
    bool joining = false;    // the peer is itself still in this phase
    bool coStarter = false;  // the peer saw us joining while it joined
    bool behind = false;     // the peer completed our next round without us
  };
  std::vector<std::optional<Offer>> offers(peers_.size());
  const auto deadline = t0 + std::min<std::chrono::milliseconds>(
                                 options_.timeout, std::chrono::milliseconds(kStartGrace));
  while (true) {
    auto served = serve(ownStep, values, false, flat);
    if (!served.ok()) return served.status();
    for (size_t i = 0; i < peers_.size(); ++i) {
      if (offers[i]) continue;
      auto m =
          receiveControl(*transport_, Control::kJoinOffer, peers_[i], std::chrono::milliseconds(0));
      if (!m.ok()) continue;
      const unsigned flags = offerFlags(*m);
      offers[i] = Offer{static_cast<int64_t>(m->header.step), (flags & kOfferFinished) != 0,
                        (flags & kOfferJoining) != 0, (flags & kOfferCoStarter) != 0,
                        (flags & kOfferBehind) != 0};
      // A peer still joining as we join started with us: should it ask us
      // later (it heard from us after it had finished joining), we tell it
      // so, and it does not mistake the steps we took since for a restart.
      if (m->payload.size() == 1 + sizeof(uint64_t)) {
        uint64_t itsIncarnation = 0;
        std::memcpy(&itsIncarnation, m->payload.data() + 1, sizeof itsIncarnation);
        if (itsIncarnation != 0) lives_[i].incarnation = itsIncarnation;
        if (offers[i]->joining) coStarters_.insert({peers_[i], itsIncarnation});
      }
    }
    // Done when every peer answered or is known to be away (heard before and
    // silent now); at the latest after the start-up grace.
    bool waiting = false;
    for (size_t i = 0; i < peers_.size(); ++i) {
      if (!offers[i] && !lives_[i].suspected) waiting = true;
    }
    if (!waiting || clock_.now() >= deadline) break;
    clock_.sleepFor(kPoll);
  }

  // The furthest of the peers that found us behind: only they have
  // completed a round we would contribute to.
  int64_t furthest = std::numeric_limits<int64_t>::min();
  size_t answered = 0, finished = 0;
  bool commonStart = false, behind = false;
  for (const auto& o : offers) {
    if (!o) continue;
    ++answered;
    commonStart = commonStart || o->joining || o->coStarter;
    if (o->finished) {
      ++finished;
      continue;
    }
    if (o->behind) {
      behind = true;
      furthest = std::max(furthest, o->step);
    }
  }
  if (answered == 0) {
    if (ownStep > 0) {
      // Resumed from a checkpoint, so the job ran without us: it has
      // finished, or every other worker is down. Training on alone would end
      // with a model no other worker holds.
      return failedPrecondition(fmt::format(
          "{}: no peer answered within {:.1f} s, and this worker resumed at step {}: the job has "
          "finished without it (the workers that finished hold its final model) or every other "
          "worker is down; not training on alone",
          name_, since(t0), ownStep));
    }
    logger()->info("{}: no peer answered within {:.1f} s; starting from our own state (step {})",
                   name_, since(t0), ownStep);
    return out;
  }
  if (finished == answered) {
    // The job has ended: take its final model from a peer that finished
    // (it answers once its final average is in).
    std::vector<size_t> candidates;
    for (size_t i = 0; i < peers_.size(); ++i) {
      if (offers[i] && offers[i]->finished) candidates.push_back(i);
    }
    nearestFirst(candidates);
    logger()->info(
        "{}: every peer that answered ({}) has finished training; asking for the job's "
        "final model",
        name_, answered);
    GEO_RETURN_IF_ERROR(fetchState(candidates, ownStep, t0, values, flat, out));
    if (!out.transferred) {
      return failedPrecondition(fmt::format(
          "{}: the job finished before this worker could rejoin it, and no peer that finished sent "
          "its final model",
          name_));
    }
    out.jobFinished = true;
    return out;
  }
  // Every peer still counts on our part of its oldest open round (it may
  // be a step or so ahead, completing a round we are in time for: its model
  // then is no round's result, and fetching it left us with a model no one
  // else holds while it completed the round without us); or some peer is
  // starting with us (a common start or a whole-job restart, where the
  // first ones may have taken a few steps already: they count on us in
  // their current rounds, and our contributions to rounds they completed
  // are applied late).
  if (!behind || commonStart) return out;

  // Peers that found us behind, within a round of the furthest of them.
  std::vector<size_t> candidates;
  for (size_t i = 0; i < peers_.size(); ++i) {
    if (offers[i] && !offers[i]->finished && offers[i]->behind &&
        offers[i]->step + roundSteps >= furthest) {
      candidates.push_back(i);
    }
  }
  nearestFirst(candidates);
  GEO_RETURN_IF_ERROR(fetchState(candidates, ownStep, t0, values, flat, out));
  if (!out.transferred) {
    logger()->warn("{}: no peer ahead of us sent its state; going on from our own (step {})", name_,
                   ownStep);
  }
  return out;
}

void Membership::nearestFirst(std::vector<size_t>& candidates) const {
  // Unknown RTTs last.
  std::stable_sort(candidates.begin(), candidates.end(), [&](size_t a, size_t b) {
    const double ra = lives_[a].rtt > 0 ? lives_[a].rtt : 1e9;
    const double rb = lives_[b].rtt > 0 ? lives_[b].rtt : 1e9;
    return ra < rb;
  });
}

StatusOr<Membership::Joined> Membership::takeFinalModel(int64_t ownStep, torch::Tensor& values,
                                                        train::FlatParameters* flat) {
  Joined out;
  out.step = ownStep;
  std::vector<size_t> candidates;
  for (size_t i = 0; i < peers_.size(); ++i) {
    if (!lives_[i].suspected) candidates.push_back(i);
  }
  nearestFirst(candidates);
  logger()->info(
      "{}: every peer finished training while our state crossed; asking for the job's final "
      "model",
      name_);
  GEO_RETURN_IF_ERROR(fetchState(candidates, ownStep, clock_.now(), values, flat, out));
  if (!out.transferred || !out.finalModel) {
    return failedPrecondition(fmt::format(
        "{}: the job finished while this worker's state crossed, and no peer that finished sent "
        "its final model",
        name_));
  }
  out.jobFinished = true;
  return out;
}

Status Membership::fetchState(const std::vector<size_t>& candidates, int64_t ownStep,
                              geo::Clock::TimePoint t0, torch::Tensor& values,
                              train::FlatParameters* flat, Joined& out) {
  for (size_t i : candidates) {
    const uint32_t p = peers_[i];
    const auto f0 = clock_.now();
    GEO_RETURN_IF_ERROR(sendControl(p, Control::kJoinFetch, ownStep,
                                    std::make_shared<std::vector<std::byte>>(), CodecId::kRaw, 0));
    // A large state comes in parts (Control::kJoinStatePart); each part
    // that arrives moves the deadline on, since the sender paces them
    // behind its rounds.
    auto fetchDeadline = f0 + options_.timeout;
    std::optional<Message> state;
    // A state is at most the model and the optimizer's two buffers (fp32)
    // and their bookkeeping.
    PartsAssembler parts(4 * static_cast<uint64_t>(values.numel()) * 4 + (64 << 20));
    std::string broken;
    while (clock_.now() < fetchDeadline && broken.empty()) {
      auto served = serve(ownStep, values, false, flat);
      if (!served.ok()) return served.status();
      if (lives_[i].suspected) break;
      for (auto part = receiveControl(*transport_, Control::kJoinStatePart, p,
                                      std::chrono::milliseconds(0));
           part.ok() && !state && broken.empty();
           part = receiveControl(*transport_, Control::kJoinStatePart, p,
                                 std::chrono::milliseconds(0))) {
        bool complete = false;
        if (const Status ok = parts.add(part->payload.bytes(), complete); !ok.ok()) {
          broken = ok.message();
          break;
        }
        fetchDeadline = clock_.now() + options_.timeout;
        if (complete) {
          Message whole;
          whole.header = part->header;
          whole.header.codec = CodecId::kRaw;
          whole.received = part->received;
          whole.payload = transport::Payload(parts.take());
          state = std::move(whole);
        }
      }
      if (state) break;
      auto m = receiveControl(*transport_, Control::kJoinState, p, kPoll);
      if (m.ok()) {
        state = std::move(*m);
        break;
      }
    }
    if (!state) {
      logger()->warn("{}: {} did not send its state{}; trying the next peer", name_,
                     topology_.describe(p),
                     !broken.empty()     ? fmt::format(" (refused {})", broken)
                     : parts.total() > 0 ? fmt::format(" whole ({:.1f} of {:.1f} MB came)",
                                                       static_cast<double>(parts.received()) / 1e6,
                                                       static_cast<double>(parts.total()) / 1e6)
                                         : std::string());
      continue;
    }
    // A peer that finished sends the job's final model alone, as fp32: the
    // whole model (with batch norm's statistics) where we keep one.
    const bool finalModel = state->header.codec == CodecId::kFp32;
    torch::Tensor whole = flat != nullptr ? train::wholeModel(*flat) : values;
    const auto modelBytes = static_cast<size_t>(finalModel ? whole.numel() : values.numel()) * 4;
    if (state->payload.size() < modelBytes || (finalModel && state->payload.size() != modelBytes)) {
      logger()->warn(
          "{}: the state of {} has {} bytes, expected {} {} (the same model everywhere?); trying "
          "the next peer",
          name_, topology_.describe(p), state->payload.size(), finalModel ? "exactly" : "at least",
          modelBytes);
      continue;
    }
    // The model is checked before anything of the state is adopted.
    torch::Tensor model = torch::empty({static_cast<int64_t>(modelBytes / 4)}, torch::kFloat32);
    std::string reason;
    if (const Status ok = checkedCopy(state->payload.bytes().first(modelBytes), model,
                                      std::numeric_limits<float>::max(), reason);
        !ok.ok()) {
      logger()->warn("{}: refused the model of {} ({}): {}; trying the next peer", name_,
                     topology_.describe(p), reason, ok.message());
      continue;
    }
    if (!finalModel && flat != nullptr && flat->loadOptimizer &&
        state->payload.size() > modelBytes) {
      const auto rest = state->payload.bytes().subspan(modelBytes);
      const Status loaded =
          flat->loadOptimizer(std::string(reinterpret_cast<const char*>(rest.data()), rest.size()));
      if (!loaded.ok()) {
        logger()->warn("{}: the state of {}: {}; trying the next peer", name_,
                       topology_.describe(p), loaded.message());
        continue;
      }
    }
    if (finalModel) {
      whole.copy_(model.view(whole.sizes()));
    } else {
      values.copy_(model.view(values.sizes()));
    }
    const double took = since(f0);
    {
      std::lock_guard lock(mu_);
      ++rejoins_;
      transferReceived_ += state->payload.size();
      transferSeconds_ += took;
    }
    out.step = static_cast<int64_t>(state->header.step);
    out.transferred = true;
    out.jobFinished = out.jobFinished || finalModel;
    out.finalModel = finalModel;
    logger()->info(
        "{}: {} at step {} (we were at step {}): took the {} of {} ({:.2f} MB in {:.2f} s, "
        "{:.2f} s after start)",
        name_, finalModel ? "the job had finished" : "joined the running job", out.step, ownStep,
        finalModel ? "final model" : "model", topology_.describe(p),
        static_cast<double>(state->payload.size()) / 1e6, took, since(t0));
    return {};
  }
  return {};
}

Status Membership::announce(uint64_t round, int64_t step) {
  if (transport_ == nullptr) return {};
  auto bytes = std::make_shared<std::vector<std::byte>>(sizeof round);
  std::memcpy(bytes->data(), &round, sizeof round);
  for (uint32_t p : peers_) {
    GEO_RETURN_IF_ERROR(sendControl(p, Control::kJoined, step, bytes, CodecId::kRaw, 0));
  }
  return {};
}

void Membership::addTo(SyncStats& s) const {
  std::lock_guard lock(mu_);
  for (size_t i = 0; i < peers_.size(); ++i) s.peerUp.emplace_back(peers_[i], !lives_[i].suspected);
  s.degradedSeconds += degradedSeconds_;
  s.rejoins += rejoins_;
  s.peerRejoins += peerRejoins_;
  s.stateTransferBytesSent += transferSent_;
  s.stateTransferBytesReceived += transferReceived_;
  s.stateTransferSeconds += transferSeconds_;
}

}  // namespace geo::sync::detail
