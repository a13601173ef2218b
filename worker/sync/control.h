#pragma once
// The synchronizers' control messages (not a public interface): their
// kinds, typed, and how one is received.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "common/status.h"
#include "worker/transport/transport.h"

namespace geo::sync::detail {

// The synchronizers' control messages. Each travels as a message of kind
// MessageKind::kControl whose header round is roundOf(its Control), a value
// at or above kFirstControlRound that no algorithm's round reaches (the
// final average inside a region goes as MessageKind::kLanBroadcast with the
// same round). Sending and receiving them goes through the overloads that
// take a Control (Base::sendTo, takeArrived, receiveFrom, awaitFrom;
// receiveControl, Membership::sendControl): a control message cannot be
// mistaken for an algorithm's round, nor one control for another, by a
// number. What each carries is said at its enumerator; the values are the
// wire's and must not change.
enum class Control : uint64_t {
  // The end of training: the coordinator's request for a member's final
  // model (payload: one byte, 1: send it now, 0: wait for a second request,
  // your turn; see Base::averageModels), the member's model (payload: the
  // fp32 model), the coordinator's average of them (payload: the fp32
  // model; empty: it was made without this member, whose model came too
  // late or was refused), and a member's acknowledgement that the average
  // reached it (the coordinator stays until then: a queued send dies with
  // its process).
  kFinalRequest = ~uint64_t{0} - 18,
  kFinalAverage = ~uint64_t{0},
  kFinalContribution = ~uint64_t{0} - 9,
  kFinalAck = ~uint64_t{0} - 11,
  // Swarm: a worker that has taken its last step (payload: none;
  // header.step = its steps); a resync of a pair's models after a restart
  // (payload: the fp32 model) and its reply.
  kSwarmFinished = ~uint64_t{0} - 1,
  kResync = ~uint64_t{0} - 2,
  kResyncReply = ~uint64_t{0} - 8,
  // Membership (membership.h): a joining worker's query, the offers that
  // answer it, its request for state, the state, and its announcement
  // that it contributes from a given round on.
  kJoinQuery = ~uint64_t{0} - 3,
  kJoinOffer = ~uint64_t{0} - 4,
  kJoinFetch = ~uint64_t{0} - 5,
  kJoinState = ~uint64_t{0} - 6,
  kJoined = ~uint64_t{0} - 7,
  // DTS auto delay: after completing round R (header.step = R) a worker
  // tells each peer how late that peer's contribution of R reached it, and
  // its schedule (dts_schedule.cc, reportLags: 96 bytes, whatever the job's
  // size).
  kLagReport = ~uint64_t{0} - 10,
  // Hierarchical sync: a region leader that stops on an error tells its
  // members why (payload: the error message, at most kMaxStopReasonBytes).
  kLeaderStopped = ~uint64_t{0} - 12,
  // Membership with announced resumes (Membership::setResumeAnnounced): a
  // worker that hears a suspected peer again tells it from which round on
  // it sends its contributions (payload: that round, u64; then one byte, 1
  // when the peer is asked to answer with its own; then how many times the
  // sender has told the peer it suspects it, u32: a resume sent before the
  // sender's latest kSuspects is stale; then the sender's incarnation, u64,
  // as in kJoinQuery: one of an earlier process of the sender is void).
  kResume = ~uint64_t{0} - 13,
  // DTS: a worker that has taken its last step tells its peers how many
  // rounds it closed (payload: u64): it sends no contribution to a later
  // one.
  kDtsFinished = ~uint64_t{0} - 14,
  // DTS state parity (parity.h, dts.cc): after completing round R
  // (header.step = R) a worker sends its peers the fingerprint of its job
  // model (payload: the gate, u64, then the fingerprint's five doubles); a
  // worker whose model differs asks one peer for its job model as of a
  // round it names (payload: u64), and the peer answers once it has
  // completed that round (header.step = the round; payload: the fp32 job
  // model), or at once with an empty payload and header.step = the last
  // round it completed when that round is past.
  kParityReport = ~uint64_t{0} - 15,
  kParityRequest = ~uint64_t{0} - 16,
  kParityState = ~uint64_t{0} - 17,
  // The final average handed out in shards (Base::averageModels, a large
  // model to three members or more): the coordinator tells each member the
  // members' order (payload: their ranks, u32 each; member i takes shard
  // i, final_average.h finalShard), then sends each its shard of the
  // average (payload: fp32 values; header.elements: their count), which the
  // member forwards to every other member as it came. A member that has the
  // whole average acknowledges it (kFinalAck) to the coordinator and to
  // every other member, which stay until then: their forwarded shards may
  // still be queued. The coordinator sends the whole average (kFinalAverage)
  // to a member that has not acknowledged it in time, and once a member
  // is suspected (it may have died before it forwarded its shard) its
  // shard again to every member that has not acknowledged
  // (kFinalShardAgain; header.step: the shard's index).
  kFinalOrder = ~uint64_t{0} - 19,
  kFinalShard = ~uint64_t{0} - 20,
  kFinalShardAgain = ~uint64_t{0} - 21,
  // The final average by reduce-scatter (Base::reduceScatterFinal): the
  // coordinator's kFinalRequest names the attempt and the workers' order
  // (reduceScatterRequest); worker q owns shard q (finalShard). Each
  // worker sends shard q of its model to worker q (kFinalScatter), each
  // owner the average of its shard to every other worker (kFinalGather);
  // payloads fp32 values, header.elements their count, header.step the
  // attempt. A worker that holds every shard of the average tells the
  // coordinator (kFinalReduced, payload one byte: 1; 0: it refused a
  // shard, and the average is made again without reduce-scatter), which
  // once all have tells them to take it (kFinalCommit); they acknowledge
  // (kFinalAck). Until then every worker's model is untouched, so that
  // the coordinator may start over (a new kFinalRequest) without a worker
  // suspected in the middle.
  kFinalScatter = ~uint64_t{0} - 22,
  kFinalGather = ~uint64_t{0} - 23,
  kFinalReduced = ~uint64_t{0} - 24,
  kFinalCommit = ~uint64_t{0} - 25,
  // A worker's word that the final average it takes part in is
  // coordinated by a given rank (payload: that rank, u32): its answer to a
  // request from a higher rank, and a worker's to the coordinator it left
  // for a lower one (Base::serveFinalCoordinators). The lowest coordinator
  // wins.
  kFinalFollows = ~uint64_t{0} - 26,
  // The coordinator's word to a worker it counted out of the final average
  // (it suspects it; payload: the ranks of the workers it averages, u32
  // each, itself first): they hold the job's model once the average is
  // in, and the worker asks one of them for it (Base::finalFromFellow). A
  // worker that hears its coordinator while the coordinator does not hear
  // it would otherwise wait for a request that never comes.
  kFinalLeftOut = ~uint64_t{0} - 27,
  // Membership with announced resumes: a worker that has just come to
  // suspect a peer tells it so (payload: the round from which it sends the
  // peer nothing, u64; then how many times it has told the peer so, this
  // time included, u32; then its incarnation, u64), for where suspicion is
  // one-sided -- the peer still hears it and would wait for its
  // contributions (Membership::serve). So does one that stops waiting for a
  // peer on its other peers' word (kSuspicionOf), naming the first round it
  // has not sent yet: its data to the peer may be stuck where its notices
  // pass. Either way the peer waits for it no more until its resume.
  kSuspects = ~uint64_t{0} - 28,
  // Membership with announced resumes: a worker that has just come to
  // suspect a peer tells its other peers too (payload: the peer's rank,
  // u32, then the round from which it sends it nothing, u64). A worker
  // most of whose other peers suspect that peer stops waiting for it,
  // though it does not suspect it itself (Membership::serve).
  kSuspicionOf = ~uint64_t{0} - 29,
  // Membership: a state too large for one message sent in parts behind the
  // sender's rounds (Membership::serve): the whole state's size (u64),
  // this part's offset in it (u64), then the part's bytes; header.step as
  // kJoinState's. The parts of one state go in order on the data
  // connection; the joiner puts them together and treats the whole as a
  // kJoinState of codec kRaw.
  kJoinStatePart = ~uint64_t{0} - 30,
  // State parity: a kParityState answer too large for one message
  // (Membership::goesInParts), in parts behind the sender's rounds as
  // kJoinStatePart's (worker/sync/parts.h); header.step the round, as
  // kParityState's.
  kParityStatePart = ~uint64_t{0} - 31,
};
inline constexpr size_t kMaxStopReasonBytes = 1024;

// Whether a Control::kFinalRequest's payload asks for the model now (else:
// wait for the next request). Anything but the single byte 1 waits.
inline bool finalRequestSaysNow(std::span<const std::byte> payload) {
  return payload.size() == 1 && payload[0] == std::byte{1};
}
// A Control::kFinalRequest that starts attempt `attempt` of a final
// average by reduce-scatter among `order` (ranks, the coordinator's
// first): the byte 2, the attempt (u32), then the ranks (u32 each).
std::shared_ptr<std::vector<std::byte>> reduceScatterRequest(uint32_t attempt,
                                                             const std::vector<uint32_t>& order);
// Whether `payload` is such a request; its attempt and order, unchecked.
bool readReduceScatterRequest(std::span<const std::byte> payload, uint32_t& attempt,
                              std::vector<uint32_t>& order);
// A Control::kFinalFollows naming `rank`, and the rank one names
// (nullopt: not 4 bytes).
std::shared_ptr<std::vector<std::byte>> finalFollowsPayload(uint32_t rank);
std::optional<uint32_t> readFinalFollows(std::span<const std::byte> payload);
// A Control::kFinalLeftOut naming `ranks`, and the ranks one names
// (nullopt: empty, or not whole u32s).
std::shared_ptr<std::vector<std::byte>> finalLeftOutPayload(const std::vector<uint32_t>& ranks);
std::optional<std::vector<uint32_t>> readFinalLeftOut(std::span<const std::byte> payload);
// A wait bounded by the peer's liveness alone (Base::awaitFrom gives up as
// soon as the membership suspects it), not by a time-out.
inline constexpr std::chrono::milliseconds kWhileAlive = std::chrono::hours(24);
// Rounds at or above this are control rounds, never an algorithm's.
inline constexpr uint64_t kFirstControlRound = ~uint64_t{0} - 63;

// The header round that carries `control`.
constexpr uint64_t roundOf(Control control) {
  return static_cast<uint64_t>(control);
}

// Every control message; a new one is added here too, and the check below
// holds them apart and out of the algorithms' rounds at compile time.
inline constexpr Control kControls[] = {
    Control::kFinalAverage,  Control::kFinalContribution,
    Control::kFinalAck,      Control::kSwarmFinished,
    Control::kResync,        Control::kResyncReply,
    Control::kJoinQuery,     Control::kJoinOffer,
    Control::kJoinFetch,     Control::kJoinState,
    Control::kJoined,        Control::kLagReport,
    Control::kLeaderStopped, Control::kResume,
    Control::kDtsFinished,   Control::kParityReport,
    Control::kParityRequest, Control::kParityState,
    Control::kFinalRequest,  Control::kFinalOrder,
    Control::kFinalShard,    Control::kFinalShardAgain,
    Control::kFinalScatter,  Control::kFinalGather,
    Control::kFinalReduced,  Control::kFinalCommit,
    Control::kFinalFollows,  Control::kFinalLeftOut,
    Control::kSuspects,      Control::kSuspicionOf,
    Control::kJoinStatePart, Control::kParityStatePart,
};
constexpr bool controlsAreDistinctControlRounds() {
  for (size_t i = 0; i < std::size(kControls); ++i) {
    if (roundOf(kControls[i]) < kFirstControlRound) return false;
    for (size_t j = 0; j < i; ++j) {
      if (kControls[i] == kControls[j]) return false;
    }
  }
  return true;
}
static_assert(controlsAreDistinctControlRounds(),
              "two control messages share a round, or one is below kFirstControlRound");

// The payloads of Control::kResume and Control::kSuspects, as they travel
// (fields in this order, host byte order, no padding): encode() makes
// one; decode() reads one, nullopt where the size is not kBytes.
struct ResumePayload {
  uint64_t round = 0;        // the sender's oldest open round
  bool askBack = false;      // the receiver is asked to answer with its own
  uint32_t notices = 0;      // the kSuspects the sender has sent the receiver
  uint64_t incarnation = 0;  // the sender's, as its kJoinQuery names it
  static constexpr size_t kBytes = 8 + 1 + 4 + 8;
  std::shared_ptr<std::vector<std::byte>> encode() const;
  static std::optional<ResumePayload> decode(std::span<const std::byte> bytes);
};
struct SuspectsPayload {
  uint64_t from = 0;         // the first round the sender has not sent the receiver (see kSuspects)
  uint32_t notices = 0;      // the kSuspects the sender has sent the receiver, this one included
  uint64_t incarnation = 0;  // the sender's
  static constexpr size_t kBytes = 8 + 4 + 8;
  std::shared_ptr<std::vector<std::byte>> encode() const;
  static std::optional<SuspectsPayload> decode(std::span<const std::byte> bytes);
};

// The next control message `control` from `from` (kAnyPeer: any rank),
// waiting at most `timeout` (0: a poll), as Transport::receive.
inline StatusOr<transport::Message> receiveControl(transport::Transport& transport, Control control,
                                                   uint32_t from,
                                                   std::chrono::milliseconds timeout) {
  return transport.receive(transport::MessageKind::kControl, roundOf(control), from, timeout);
}

}  // namespace geo::sync::detail
