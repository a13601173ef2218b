#pragma once
// Failure detection and the join protocol of a synchronizer's peers
// (Membership, below): who is alive and taking part, read from the
// transport's liveness on the synchronizer's clock (SyncOptions::clock), and
// how a worker that starts while its peers train takes their state.
// docs/membership.md tells the story; tests/worker/sync/membership_test.cc
// runs it in simulated time on the in-memory network.

#include <torch/torch.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "worker/sync/control.h"
#include "worker/sync/synchronizer.h"

namespace geo::sync::detail {

// Who of a set of peers is alive and taking part, from the transport's
// liveness (PeerCounters::silentSeconds: every frame counts, and pings run
// every second from the I/O thread), plus the join protocol by which a
// worker that starts while its peers are training takes their state.
//
// Liveness. A peer heard before is *suspected* once silent for longer than
// the peer time-out (SyncOptions::peerTimeout; auto: max(3 s, 4 x its ping
// RTT + 2 s)); a peer never heard is suspected once the transport has run for
// the start-up grace (the round time-out, at most 20 s), so a job waits for
// its slow starters a while but not for a worker that never comes. A
// suspected peer is heard again the moment any frame of it arrives; it is
// expected again once it delivers a contribution (both sides went on without
// each other and may be rounds apart) -- or, with announced resumes
// (setResumeAnnounced), once it says from which round on it sends them
// (below). A
// straggler is not suspected: its I/O thread keeps answering pings while its
// training thread is slow, so it is waited for (up to the round time-out).
//
// Join protocol (control messages, control.h; every worker runs it once at
// start):
//   joiner -> all peers   kJoinQuery   header.step = its own step;
//                                      payload: its incarnation (random u64)
//   peer -> joiner        kJoinOffer   header.step = the peer's step;
//                                      payload: 1 byte, bit 0 finished,
//                                      bit 1 itself still joining, bit 2
//                                      it saw this joiner (incarnation)
//                                      joining while it joined, bit 3 the
//                                      joiner is behind (below); then the
//                                      peer's incarnation (u64)
//   joiner -> one peer    kJoinFetch   (the nearest by RTT among those
//                                      that found it behind, within a
//                                      round of the furthest of them)
//   peer -> joiner        kJoinState   header.step; payload: the fp32 model,
//                                      then the optimizer's state (bytes)
//   joiner -> all peers   kJoined      header.round field of the payload:
//                                      the first round it contributes to
// A peer finds the sender *behind* when the round the sender contributes to
// next is older than the oldest round the peer has not completed yet (its
// open round: the round in progress, or with DTS the oldest one still
// awaiting contributions) -- the peer completed that round without it. It
// marks the sender *joining*: not expected in any round until its
// Control::kJoined names the first round it contributes to (or, unless
// setServedJoinerAnnounces, until it is served our state, which fixes that
// round). A query for our open round or a
// later one (a common start, a whole-job restart, a worker that starts while
// we still wait for its part of our first round) keeps the sender expected:
// it takes part in that round whatever it does. An offer that reaches the
// joiner after its join is over (the query was held back, by a partition
// or a slow start, until the joiner had started on its own) and says
// "behind" is answered with a kJoined naming the joiner's open round: its
// first announcement may have been lost with a replaced connection, or have
// come before the query, and the peer would otherwise wait for a join that
// never comes, leaving it out of every round. (Judged by our step, a
// worker asking at step 0 while we were at step 1 but still completing round
// 0 -- K = 1, D = 0 -- was taken for a rejoining one: round 0 completed
// without it, and replicas meant to be bitwise equal differed.)
// The joiner adopts a peer's state only when some peer found it behind, none
// is itself still joining, and none saw it joining while joining itself
// (then it is a common start, and the first ones may have taken a few
// steps); it fetches only from a peer that found it behind: one that is
// still completing the joiner's round (a step or so ahead of it) counts on
// its contribution, and its model is not a round's result anyone else
// holds. When no peer answers within the start-up grace, a worker at step 0
// keeps its own (the first of a job to start; the others join it), and one
// resumed from a checkpoint fails, saying so: the job ran without it, so it
// has finished or every other worker is down, and training on alone would
// end with a model no one else holds. (A whole-job restart from
// checkpoints is a common start: the workers answer each other.)
// The end of a job: a worker that has taken its last step answers offers
// with "finished" (setFinishing) and keeps a joiner's request for state until
// its final average is in (setFinalModel); it then sends the job's final
// model alone, as fp32. A joiner that hears only finished peers asks for
// that, and so does one whose state request reaches a finishing peer: both
// end with the job's final model (Joined::finalModel) and take no step. One
// that gets it from nobody fails, saying so.
//
// Announced resumes (DTS). A peer heard again after a partition may
// deliver contributions it sent before the cut (a real network's TCP keeps
// them in its buffers and retransmits them once the path is back), while it
// sent none of the rounds it completed without us meanwhile: taking such a
// late delivery as a sign that every later round will come made a worker
// wait the round time-out for rounds the peer had never sent. So each side,
// on hearing the other again, sends Control::kResume with the oldest round it
// has not completed (it sends its contributions to that round and every
// later one again), asking for the other's; the other answers with its
// own. A peer heard again is expected again only from the round its resume
// names, and is asked again every kResumeAskEvery until it answers.
//
// Suspicion can be one-sided: what b sends a is lost (b's pings queued
// behind its full uplink, a path cut one way) while a still reaches b. a
// suspects b and sends it nothing more; b, hearing a, would wait for a's
// contributions until the path mends or the round time-out. So a worker
// that comes to suspect a peer tells it (Control::kSuspects, naming the
// first round it no longer sends it), and the peer, if it has nothing of
// that round from it, stops waiting for it until its resume -- which it
// sends once it hears the peer again, as after a cut both ways. A notice
// from a peer this worker suspects too, or one it has since delivered that
// round or a later one to (a cut both ways that has healed), changes
// nothing. A resume the peer sent before its latest such notice is stale
// and ignored (each resume carries the count of notices its sender has
// sent us), whatever order the two arrive in: serve() reads notices first,
// and over a congested path both come in one burst. So is a resume naming
// an older round than one taken from the peer's incarnation since, and one
// from an earlier incarnation of the peer (notices and resumes carry it).
//
// Suspicion can also come late to one worker: a peer whose uplink is
// throttled is silent to most, while a ping of its that squeezed through
// keeps one worker hearing it. That worker waited for the peer's
// contributions, and everyone else waited behind its rounds. So a worker
// that comes to suspect a peer also tells its other peers
// (Control::kSuspicionOf), and a worker that more than half of that
// peer's other peers (every one, among four workers) have told so within
// the peer time-out stops waiting for that peer until its resume, as if it
// suspected it (it asks for the resume at once), and tells that peer so as a
// suspecting worker does (Control::kSuspects): its data to the peer may be
// held up behind the peer's clogged uplink while its notices pass, and the
// peer would wait for it. A partial partition (one link cut) is told by one
// worker only, and changes nothing.
//
// Threading: the synchronizer's thread, except addTo(), which may be called
// from any thread (stats()).
class Membership {
 public:
  // `stepsPerRound`: a peer served our state at step s is expected from
  // round s / stepsPerRound on (what its announcement will say).
  // Every time it reads and every wait goes through clockOf(options): a
  // test on a FakeClock and the in-memory transport
  // (transport/memory_transport.h) runs suspicion and the join protocol in
  // simulated time.
  Membership(transport::Transport* transport, const Topology& topology, std::vector<uint32_t> peers,
             const SyncOptions& options, std::string name, int64_t stepsPerRound = 1);
  // The round in progress at step s when rounds do not have a fixed length
  // (DTS with an automatic period); replaces s / stepsPerRound.
  void setRoundOf(std::function<uint64_t(int64_t)> roundOf) { roundOf_ = std::move(roundOf); }
  // The oldest round this worker has not completed yet, when rounds complete
  // after they close (DTS: the first round in flight, else the open one);
  // replaces the round in progress at the step serve() is given. A joiner is
  // behind only if it missed this round (see above).
  void setOpenRound(std::function<uint64_t()> openRound) { openRound_ = std::move(openRound); }
  // Turns announced resumes on (see above); the algorithm then sends its
  // contributions from its oldest open round on again to every peer in
  // Served::heardAgain and Served::resumeAsked.
  void setResumeAnnounced(bool on) { resumeAnnounced_ = on; }
  // Whether a peer we send our state to stays *joining* -- expected in no
  // round -- until its Control::kJoined names the round it contributes
  // from, as it does for every other peer (true), or is expected at once
  // from the round of the step we served it at (false, the default). A
  // synchronous partner needs the latter: a region leader averages its
  // members every step and waits for the joiner from its very first. DTS
  // needs the former: a large model's state takes seconds to cross, the
  // joiner then catches up on the rounds completed meanwhile and
  // contributes from a later round than the one we served it at (Dts::join).
  void setServedJoinerAnnounces(bool on) { servedJoinerAnnounces_ = on; }

  // Reads the transport's liveness; logs and counts every change.
  void refresh();
  // Peers heard again by refresh() since the last call (and forgets them).
  std::vector<uint32_t> takeHeardAgain() { return std::exchange(heardAgain_, {}); }
  // Peers refresh() found newly suspected since the last call (and forgets
  // them): serve() hands them on as Served::suspected.
  std::vector<uint32_t> takeNewlySuspected() { return std::exchange(newlySuspected_, {}); }
  bool suspected(uint32_t peer) const;
  bool joining(uint32_t peer) const;
  // Whether some peer that is heard is in the middle of joining us.
  bool anyJoining() const;
  // Whether `peer`'s contribution to `round` is expected: alive, not
  // joining, and joined at or before that round.
  bool expected(uint32_t peer, uint64_t round) const;
  // Whether `peer` takes part in `round` by what it announced (its join, its
  // resume) and what this worker saw of it (suspected, given up, joining),
  // whatever it delivered since: expected() without the rounds a later
  // delivery passed over. Under DTS's reduce-scatter an owner's mean of one
  // round may come after its part of the next, which moves expected() past
  // the first; the owner still sends that mean.
  bool takesPart(uint32_t peer, uint64_t round) const;
  // A heard peer that did not deliver within the round time-out (a
  // straggler) is marked absent: not waited for until it delivers again.
  void giveUp(uint32_t peer);
  // `peer`'s contribution to `round` arrived. An absent peer is expected
  // again, from `round` on: a peer's contributions leave in round order over
  // one ordered connection, so an earlier round that has not arrived by now
  // was lost (sent while the two were cut off) and is never waited for.
  // Waiting for it was a deadlock: after a partition, survivors waited for
  // rounds the healed peer had completed alone and would never resend.
  void delivered(uint32_t peer, uint64_t round);
  bool absent(uint32_t peer) const;
  // Whether this worker waits for `peer`'s resume (announced resumes): it
  // told us it no longer waits for us (Control::kSuspects), most of the
  // others suspect it, or we heard it again after suspecting it. Neither
  // side counts on the other's rounds until the resumes are exchanged,
  // and each then sends its rounds from the one its resume names again.
  bool awaitingResume(uint32_t peer) const;

  struct Served {
    std::vector<uint32_t> queried;     // peers that (re)started: their old state is void
    std::vector<uint32_t> suspected;   // peers suspected since the last call
    std::vector<uint32_t> heardAgain;  // suspected peers heard again since the last call
    // With announced resumes: peers that heard us again and asked from
    // which round we send; they got our answer.
    std::vector<uint32_t> resumeAsked;
  };

  // Whether a payload of `bytes` goes in parts (sendInParts): over two
  // parts of 4 MiB. One message that large fills the uplink for seconds,
  // and our rounds to the others wait behind it: a 159 MB state held them
  // 10-13 s on the namespace network, an 80 MB repair of state parity's
  // 4.5-6.2 s.
  static bool goesInParts(size_t bytes);
  // Sends `bytes` to `peer` in parts (`part`, worker/sync/parts.h;
  // header.step `step`) behind our rounds: serve() hands on a part only
  // while none of our data for a live other peer waits to leave this
  // machine, and two parts at most wait for `peer` (roomForStatePart). A
  // payload still going to `peer` in the same `part` goes on first (the
  // receiver puts each together in turn). `what` names it in the log. The
  // parts stop if `peer` is suspected.
  void sendInParts(uint32_t peer, Control part, int64_t step,
                   std::shared_ptr<const std::vector<std::byte>> bytes, std::string what);

  // Answers pending queries and fetches (`step`, `values`; `finished` once
  // this worker has completed training) and takes announcements.
  StatusOr<Served> serve(int64_t step, const torch::Tensor& values, bool finished,
                         const train::FlatParameters* flat = nullptr);

  struct Joined {
    int64_t step = 0;          // the step to continue from
    bool transferred = false;  // the model in `values` came from a peer
    // The job has ended without us: every peer that answered had finished,
    // or the state came from one that had.
    bool jobFinished = false;
    bool finalModel = false;  // `values` hold the job's final model (from a peer that finished)
  };
  // The joiner's side, before the first step: query, wait for offers (all
  // peers, or the grace), fetch from the nearest peer ahead, write the model
  // into `values`. Answers the others' queries meanwhile.
  // `flat`, when given, also carries the optimizer state across (its
  // saveOptimizer / loadOptimizer); the model goes to `values` either way.
  StatusOr<Joined> join(int64_t ownStep, int64_t roundSteps, torch::Tensor& values,
                        train::FlatParameters* flat = nullptr);
  // After join() took a peer's state: every peer has finished meanwhile
  // (the state crossed as the job ended), so this worker takes the job's
  // final model from the nearest that answers, as join() does when every
  // peer answers "finished". Fails, saying so, where none sends it.
  StatusOr<Joined> takeFinalModel(int64_t ownStep, torch::Tensor& values,
                                  train::FlatParameters* flat = nullptr);
  // Tells every peer that this worker contributes from `round` on.
  Status announce(uint64_t round, int64_t step);
  // Training is over: offers say "finished", and a joiner's request for
  // state waits until setFinalModel() (its answer is then the final model).
  void setFinishing() { finishing_ = true; }
  // The values serve() is given are the job's final model from now on.
  void setFinalModel() { final_ = true; }
  // Asks `peer`, which has taken its last step (it said so: a join offer,
  // or its word in the final average), for the job's final model: it
  // answers with Control::kJoinState, the whole model as fp32 alone, once
  // its own final average is in (setFinalModel), as it answers a worker
  // that starts after the end. A worker left out of the final average
  // takes the job's model this way.
  Status askForFinalModel(uint32_t peer, int64_t step) {
    return sendControl(peer, Control::kJoinFetch, step, std::make_shared<std::vector<std::byte>>(),
                       transport::CodecId::kRaw, 0);
  }
  // After the last step: while a peer that is heard is joining, calls
  // `serve` (which answers it, with the final model once setFinalModel()),
  // every 20 ms for up to twice the longest peer time-out. `who` names the
  // joiner in the log ("a peer", "a member").
  Status lingerWhileJoining(const std::function<Status()>& serve, std::string_view who);

  // peerUp, degradedSeconds, rejoins, peerRejoins, state-transfer figures.
  void addTo(SyncStats& stats) const;
  const std::vector<uint32_t>& peers() const { return peers_; }
  std::chrono::milliseconds peerTimeout(uint32_t peer) const;

 private:
  struct PeerLife {
    bool suspected = false;
    bool joining = false;
    bool absent = false;
    // Heard again after a suspicion, its resume not yet heard (announced
    // resumes only); and when we last asked for it.
    bool awaitingResume = false;
    std::optional<geo::Clock::TimePoint> resumeAsked;
    uint64_t expectFrom = 0;
    uint64_t announcedFrom = 0;  // expectFrom as its join or resume set it
    // How many times we told it that we suspect it (Control::kSuspects),
    // and the latest such count it told us. Each resume carries the sender's
    // count: a resume sent before the sender's latest suspicion of us is
    // stale, however the two arrive (over a congested path they come in one
    // burst, and serve() reads a notice before a resume).
    uint32_t suspicionsSent = 0;
    uint32_t suspicionsHeard = 0;
    // Its process's incarnation, from its join query or offer (0: not known
    // yet). Notices and resumes carry their sender's: the count above is
    // its current process's, and a resume of an earlier one is void (a
    // killed worker's kernel still sends what its sockets held).
    uint64_t incarnation = 0;
    // The latest round a resume of its current incarnation named: its
    // oldest open round only grows, so a resume naming an older one was
    // overtaken (an old connection delivering after a new one).
    uint64_t resumedFrom = 0;
    double rtt = -1;
    // The other peers that told us they suspect this one
    // (Control::kSuspicionOf): when, and from which round.
    struct Report {
      uint32_t by = 0;
      geo::Clock::TimePoint at;
      uint64_t from = 0;
    };
    std::vector<Report> suspectedBy;
  };
  // Takes the Control::kSuspicionOf notices from `reporter`, and stops
  // waiting for a peer that more than half of its other peers suspect,
  // telling it so (Control::kSuspects, from the round in progress at
  // `step`). Fails only where a notice cannot be sent.
  Status takeSuspicionNotices(uint32_t reporter, int64_t step);
  // Whether a notice or resume naming `incarnation` comes from the peer's
  // current process (where its incarnation is not known yet, any does).
  static bool ofItsProcess(const PeerLife& l, uint64_t incarnation) {
    return l.incarnation == 0 || incarnation == l.incarnation;
  }
  // Sends our resume (the oldest round we have not completed) to `peer`.
  Status sendResume(uint32_t peer, int64_t step, bool askBack);
  // Tells `peer` that we wait for it no more (Control::kSuspects), from the
  // round in progress at `step` (the first one we have not sent it), and
  // counts the notice (PeerLife::suspicionsSent).
  Status sendSuspects(uint32_t peer, int64_t step);
  // Asks each candidate (indices into peers_) in turn for its state and
  // adopts the first one that arrives and checks out (into `values` and the
  // optimizer); `out` says what came. A candidate suspected meanwhile, or
  // silent for the round time-out, is passed over.
  // A payload sent in parts behind our rounds (sendInParts; a state,
  // Control::kJoinStatePart, which serve() starts where the state is over
  // two parts): each serve() sends on the parts that pumpStates() finds
  // room for.
  struct OutgoingState {
    uint32_t peer = 0;
    int64_t step = 0;
    std::shared_ptr<const std::vector<std::byte>> bytes;
    size_t offset = 0;
    geo::Clock::TimePoint started{};
    Control part = Control::kJoinStatePart;
    std::string what;  // for the log: "our model of step 155"
  };
  Status pumpStates();
  // Sorts indices into peers_ by ping RTT, nearest first.
  void nearestFirst(std::vector<size_t>& candidates) const;
  // Whether the next part of a state for `peer` may go now: less than
  // kStateAhead parts of it still wait to leave this machine, and none of
  // our data for a live other peer does (our rounds go first).
  bool roomForStatePart(uint32_t peer) const;
  Status fetchState(const std::vector<size_t>& candidates, int64_t ownStep,
                    geo::Clock::TimePoint t0, torch::Tensor& values, train::FlatParameters* flat,
                    Joined& out);
  PeerLife& life(uint32_t peer);
  uint64_t roundAt(int64_t step) const;  // the round in progress at `step`
  // The oldest round not completed yet, this worker being at `step`.
  uint64_t openRound(int64_t step) const;
  const PeerLife* find(uint32_t peer) const;
  double since(geo::Clock::TimePoint t0) const;  // seconds on clock_
  Status sendControl(uint32_t to, Control control, int64_t step,
                     std::shared_ptr<const std::vector<std::byte>> bytes, transport::CodecId codec,
                     uint64_t elements);

  const geo::Clock& clock_;
  transport::Transport* transport_;
  Topology topology_;
  std::vector<uint32_t> peers_;
  std::vector<PeerLife> lives_;  // by index in peers_
  SyncOptions options_;
  std::string name_;  // "dts", "hierarchical sync": log prefix
  int64_t stepsPerRound_;
  std::function<uint64_t(int64_t)> roundOf_;  // empty: s / stepsPerRound_
  std::function<uint64_t()> openRound_;       // empty: roundAt(the step served at)
  bool inJoin_ = false;                       // in join(): offers say so
  bool resumeAnnounced_ = false;
  bool servedJoinerAnnounces_ = false;
  bool finishing_ = false;  // setFinishing()
  bool final_ = false;      // setFinalModel()
  // This process's identity in the join protocol (random), and the peers
  // (rank, their identity) that were joining while we joined: a common start.
  uint64_t incarnation_;
  std::set<std::pair<uint32_t, uint64_t>> coStarters_;
  std::vector<uint32_t> heardAgain_;
  std::vector<uint32_t> newlySuspected_;
  std::vector<OutgoingState> outgoing_;
  // Guards what addTo() reads; the synchronizer's thread writes under it
  // and reads without it.
  mutable std::mutex mu_;
  std::optional<geo::Clock::TimePoint> lastRefresh_;
  double degradedSeconds_ = 0;
  uint64_t rejoins_ = 0;
  uint64_t peerRejoins_ = 0;
  uint64_t transferSent_ = 0;
  uint64_t transferReceived_ = 0;
  double transferSeconds_ = 0;
};

}  // namespace geo::sync::detail
