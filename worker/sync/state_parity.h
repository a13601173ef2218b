#pragma once
// DTS's state parity (docs/membership.md, "State parity"), the part of a
// worker's synchronizer that finds a worker whose job model differs from
// the job's and repairs it from a peer: the fingerprints exchanged every
// kParityEvery rounds, the verdict, the question for a peer's job model and
// the repair. The fingerprints and the verdict are pure (parity.h); this is
// their protocol. It knows nothing of rounds in flight: the synchronizer
// that owns it (Dts) says when a round completed, gives it the job model
// and applies the repair, through StateParity::Host.

#include <torch/torch.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "worker/sync/control.h"
#include "worker/sync/internal.h"
#include "worker/sync/parity.h"
#include "worker/sync/parts.h"
#include "worker/train/trainer.h"
#include "worker/transport/transport.h"

namespace geo::sync::detail {

class StateParity {
 public:
  // What state parity needs of the synchronizer it checks. Called on the
  // training thread, from afterCompleted() and poll() only.
  class Host {
   public:
    virtual ~Host() = default;
    // The job model as of the round completed last (Synchronizer::
    // jobModel), on the model's device; nullopt where there is none yet.
    virtual std::optional<train::JobModel> parityJobModel() = 0;
    // Its fingerprint computed without the whole model, where the host can
    // (a CPU worker: a slice at a time); nullopt: it is taken from
    // parityJobModel(). Called only when parityHasState().
    virtual std::optional<ParityFingerprint> parityFingerprint() = 0;
    // Whether the host has a job model at all (its state is made).
    virtual bool parityHasState() const = 0;
    // A hash of the rounds before `round` still open to late contributions
    // and who was in each: two job models are comparable only where their
    // workers agree on it (parityGate).
    virtual uint64_t parityLateRounds(uint64_t round) const = 0;
    // Whether the peer of group index `i` reports round `round`: it trains,
    // is heard, is not joining and has not finished before it.
    virtual bool parityReports(size_t i, uint64_t round) const = 0;
    // The round this worker closes next (a repair asks for a later one).
    virtual uint64_t parityNextRound() const = 0;
    // Adds `delta` (fp32 on the host: the job's model less this worker's)
    // to the model in `flat` and to whatever the host keeps of it.
    virtual void parityRepair(const torch::Tensor& delta, train::FlatParameters& flat) = 0;
    // The transport, as Base has it: a control message of raw bytes to
    // `to`, the ones of `control` from `peer` already in, the peers not
    // suspected, whether `rank` is, the peers' counters (round trips), and a
    // refused message counted and logged (Base::reject).
    virtual Status paritySend(const std::vector<uint32_t>& to, Control control, int64_t step,
                              std::shared_ptr<const std::vector<std::byte>> bytes) = 0;
    // Our answer to a repair (the job model as of `round` and its gate) to
    // `peer`: one kParityState, or where that large, in kParityStateParts
    // behind our rounds (Membership::sendInParts).
    virtual Status paritySendModel(uint32_t peer, uint64_t round,
                                   std::shared_ptr<const std::vector<std::byte>> bytes) = 0;
    virtual std::vector<transport::Message> parityTake(Control control, uint32_t peer) = 0;
    virtual std::vector<uint32_t> parityPeers() const = 0;
    virtual bool paritySuspected(uint32_t rank) const = 0;
    virtual std::vector<transport::PeerCounters> parityPeerCounters() const = 0;
    virtual void parityReject(uint32_t peer, const std::string& what, const std::string& reason,
                              const Status& why) = 0;
  };

  // `host`, `group`, `topology` and `stats` outlive this object.
  StateParity(Host& host, const Group& group, const Topology& topology, StatsRecorder& stats)
      : host_(host), group_(group), topology_(topology), stats_(stats) {}

  // After round `round` completed: its fingerprint to the peers (every
  // kParityEvery rounds, not while `finishing`), the job model to peers
  // that asked for it as of this round, and ours for a repair in flight.
  Status afterCompleted(uint64_t round, bool finishing);
  // Takes the peers' fingerprints, questions and answers; decides the
  // rounds checked once every peer expected in them has reported; repairs
  // once both job models of the round asked for are here.
  Status poll(train::FlatParameters& flat);
  // The rounds this worker completed were replaced (a state transfer): the
  // checks, questions and repair in flight are void, and `completedThrough`
  // rounds are complete.
  void reset(uint64_t completedThrough);

 private:
  static constexpr uint64_t kReportBytes = 8 + 5 * 8;
  struct Report {
    uint64_t gate = 0;
    ParityFingerprint fingerprint;
  };
  static std::shared_ptr<std::vector<std::byte>> encodeReport(const Report& r);
  static Report decodeReport(const std::byte* bytes);
  // The rounds checked last (at most kKept): our report, the peers' (by
  // group index).
  struct Round {
    uint64_t round = 0;
    Report own;
    std::vector<std::optional<Report>> peers;
    bool decided = false;
  };
  static constexpr size_t kKept = 4;
  // Marks the gate of a report made while a repair was in flight (any
  // other gate is a hash: a collision is as unlikely as any other).
  static constexpr uint64_t kRepairingGate = 0x8f1bbcdcca62c1d6ULL;
  // Peers' reports of rounds we have not completed yet (a peer ahead).
  struct Ahead {
    uint64_t round = 0;
    size_t peer = 0;
    Report report;
  };
  // Our repair in flight: whom we asked, for which round, both models.
  struct Repair {
    size_t from = 0;  // group index
    uint64_t round = 0;
    torch::Tensor own;
    torch::Tensor theirs;
    uint64_t differedAt = 0;  // the round whose check found it
    int retries = 0;
    // Who was in the rounds still open to late contributions as of
    // `round` (gate()), here and there: the difference of two job models
    // is the fault alone only when both completed those rounds with the
    // same contributions; otherwise it holds a late contribution that one
    // of the two applies later, and would be applied twice.
    uint64_t ownGate = 0;
    uint64_t theirGate = 0;
    // A large answer's parts as they come (Control::kParityStatePart),
    // sized for the job model and its gate.
    std::optional<PartsAssembler> parts;
  };
  // Peers waiting for our job model as of a round (by group index).
  struct Ask {
    size_t peer = 0;
    uint64_t round = 0;
  };

  // What a fingerprint of `round` may be compared with (Host::
  // parityLateRounds), marked while a repair of ours is in flight.
  uint64_t gate(uint64_t round) const;
  void decide(Round& p, bool force);
  void askForRepair(size_t from, uint64_t differedAt, uint64_t atLeast = 0, int retries = 0);
  Status pollRepair(train::FlatParameters& flat);

  Host& host_;
  const Group& group_;
  const Topology& topology_;
  StatsRecorder& stats_;
  std::deque<Round> rounds_;
  std::deque<Ahead> ahead_;
  std::optional<Repair> repair_;
  std::vector<Ask> asks_;
  uint64_t completedThrough_ = 0;  // rounds completed so far (the next to complete)
};

}  // namespace geo::sync::detail
