#include "worker/sync/state_parity.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <limits>

#include "common/logging.h"
#include "worker/sync/flat_codec.h"

namespace geo::sync::detail {

std::shared_ptr<std::vector<std::byte>> StateParity::encodeReport(const Report& r) {
  // On the wire: the gate, the four projections, the squared norm.
  auto bytes = std::make_shared<std::vector<std::byte>>(kReportBytes);
  std::memcpy(bytes->data(), &r.gate, 8);
  std::memcpy(bytes->data() + 8, r.fingerprint.projections.data(), 32);
  std::memcpy(bytes->data() + 40, &r.fingerprint.squaredNorm, 8);
  return bytes;
}

StateParity::Report StateParity::decodeReport(const std::byte* bytes) {
  Report r;
  std::memcpy(&r.gate, bytes, 8);
  std::memcpy(r.fingerprint.projections.data(), bytes + 8, 32);
  std::memcpy(&r.fingerprint.squaredNorm, bytes + 40, 8);
  return r;
}

uint64_t StateParity::gate(uint64_t round) const {
  const uint64_t h = host_.parityLateRounds(round);
  return repair_ ? h ^ kRepairingGate : h;
}

void StateParity::reset(uint64_t completedThrough) {
  completedThrough_ = completedThrough;
  rounds_.clear();
  ahead_.clear();
  repair_.reset();
}

// After round `round` completed (and left pending_): its fingerprint,
// the job model peers asked for as of it, and ours for a repair.
Status StateParity::afterCompleted(uint64_t round, bool finishing) {
  completedThrough_ = round + 1;
  const bool check = round > 0 && round % kParityEvery == 0 && !finishing;
  const bool asked =
      std::any_of(asks_.begin(), asks_.end(), [&](const Ask& a) { return a.round <= round; });
  const bool mine = repair_ && repair_->round == round && !repair_->own.defined();
  if (!check && !asked && !mine) return {};
  if (group_.size() <= 1 || !host_.parityHasState()) return {};  // no job model yet
  // A check alone needs the fingerprint, not the model, where the host can
  // make it without one.
  std::optional<ParityFingerprint> fingerprint;
  if (check && !asked && !mine) fingerprint = host_.parityFingerprint();
  auto job = fingerprint ? std::nullopt : host_.parityJobModel();
  if (!fingerprint && !job) return {};
  // On the model's device: a GPU worker fingerprints it there, and copies
  // it to the host only for a peer that asked for it or for a repair.
  const torch::Tensor model = job ? job->values.contiguous() : torch::Tensor();
  // The host copy, made once for both a peer's question and a repair.
  torch::Tensor host;
  const auto onHost = [&]() -> const torch::Tensor& {
    if (!host.defined()) host = model.to(torch::kCPU);
    return host;
  };
  if (check) {
    // A round is decided once every peer expected in it has reported; the
    // reports of far peers come a link's time after they complete it,
    // which on fast steps is several rounds. After kKept checks the
    // oldest is decided with what came.
    if (rounds_.size() == kKept) {
      if (!rounds_.front().decided) decide(rounds_.front(), true);
      rounds_.pop_front();
    }
    // While a repair of ours is in flight, our job model is the one found
    // wrong (the repair is applied when the answer is here, often a round
    // or two later): its fingerprint is sent as not comparable, so that
    // peers do not name us again for what is being repaired.
    rounds_.push_back(Round{round,
                            {gate(round), fingerprint ? *fingerprint : tensorFingerprint(model)},
                            std::vector<std::optional<Report>>(group_.size()),
                            false});
    for (auto it = ahead_.begin(); it != ahead_.end();) {
      if (it->round == round) rounds_.back().peers[it->peer] = it->report;
      it = it->round <= round ? ahead_.erase(it) : std::next(it);
    }
    auto bytes = encodeReport(rounds_.back().own);
    GEO_RETURN_IF_ERROR(host_.paritySend(host_.parityPeers(), Control::kParityReport,
                                         static_cast<int64_t>(round), std::move(bytes)));
  }
  if (asked) {
    // The model, then its gate (a peer mid-repair marks its own: the
    // asker then asks again, of a later round).
    auto bytes = tensorBytes(onHost());
    const uint64_t g = gate(round);
    bytes->resize(bytes->size() + sizeof g);
    std::memcpy(bytes->data() + bytes->size() - sizeof g, &g, sizeof g);
    for (auto it = asks_.begin(); it != asks_.end();) {
      if (it->round > round) {
        ++it;
        continue;
      }
      // Asked for a round we passed since (it asked as we completed it):
      // the answer says which round it is of.
      GEO_RETURN_IF_ERROR(host_.paritySendModel(group_.ranks[it->peer], round, bytes));
      it = asks_.erase(it);
    }
  }
  if (mine) {
    repair_->own = onHost();  // the job model is a tensor of our own, not written after
    repair_->ownGate = host_.parityLateRounds(round);
  }
  return {};
}

// Takes the peers' fingerprints, questions and answers; decides the
// round checked last once every peer expected in it has reported; and
// repairs once both job models of the round asked for are here.
Status StateParity::poll(train::FlatParameters& flat) {
  for (size_t i = 0; i < group_.size(); ++i) {
    if (i == group_.self) continue;
    const uint32_t peer = group_.ranks[i];
    for (const transport::Message& m : host_.parityTake(Control::kParityReport, peer)) {
      if (m.payload.size() != kReportBytes) continue;
      const Report r = decodeReport(m.payload.data());
      const uint64_t round = m.header.step;
      const auto kept = std::find_if(rounds_.begin(), rounds_.end(),
                                     [&](const Round& p) { return p.round == round; });
      if (kept != rounds_.end()) {
        kept->peers[i] = r;
      } else if (round >= completedThrough_ && ahead_.size() < 4 * group_.size()) {
        ahead_.push_back({round, i, r});
      }
    }
    for (const transport::Message& m : host_.parityTake(Control::kParityRequest, peer)) {
      uint64_t round = 0;
      if (m.payload.size() != sizeof round) continue;
      std::memcpy(&round, m.payload.data(), sizeof round);
      if (round < completedThrough_) {
        // Passed already: say which round we are at, and it asks again.
        GEO_RETURN_IF_ERROR(host_.paritySend({peer}, Control::kParityState,
                                             static_cast<int64_t>(completedThrough_ - 1),
                                             std::make_shared<std::vector<std::byte>>()));
      } else if (asks_.size() < group_.size()) {
        asks_.push_back({i, round});
      }
    }
  }
  // A large answer comes in parts; those of a peer we no longer ask (an
  // earlier repair, ended) are dropped as they come.
  for (size_t i = 0; i < group_.size(); ++i) {
    if (i != group_.self && (!repair_ || i != repair_->from)) {
      (void)host_.parityTake(Control::kParityStatePart, group_.ranks[i]);
    }
  }
  if (repair_) GEO_RETURN_IF_ERROR(pollRepair(flat));
  for (Round& p : rounds_) {
    if (!p.decided) decide(p, false);
  }
  return {};
}

// Compares our fingerprint of a round checked with the peers' comparable
// ones (same gate); `force`: with those that came. Only a verdict of
// enough workers repairs: the winner's side a majority of the workers
// expected in the round, or every one of them compared (a tie then goes
// to the lowest rank's side). Two reports that differ say nothing of
// which one is wrong.
void StateParity::decide(Round& p, bool force) {
  std::vector<size_t> who{group_.self};
  size_t expected = 1;
  for (size_t i = 0; i < group_.size(); ++i) {
    if (i == group_.self) continue;
    // Whether it reports this round (Host::parityReports).
    const bool awaitedHere = host_.parityReports(i, p.round);
    expected += awaitedHere;
    if (!p.peers[i]) {
      if (!force && awaitedHere) return;  // not all in yet
      continue;
    }
    if (p.peers[i]->gate == p.own.gate) who.push_back(i);
  }
  p.decided = true;
  if (logger()->should_log(spdlog::level::debug)) {
    std::string what;
    for (size_t i = 0; i < group_.size(); ++i) {
      if (i == group_.self) continue;
      what += fmt::format(
          " {}:{}", topology_.describe(group_.ranks[i]),
          !p.peers[i] ? "no report"
          : p.peers[i]->gate != p.own.gate
              ? "not comparable (rounds still open to late contributions, or a repair in flight)"
              : fmt::format("{:.2g} apart",
                            parityDistance(p.own.fingerprint, p.peers[i]->fingerprint)));
    }
    logger()->debug("dts: state parity at round {}{}:{}", p.round, force ? " (due)" : "", what);
  }
  if (who.size() < 2) return;
  std::sort(who.begin(), who.end());  // the verdict's ties go to the lowest rank
  std::vector<ParityFingerprint> prints;
  size_t self = 0;
  for (size_t k = 0; k < who.size(); ++k) {
    if (who[k] == group_.self) self = k;
    prints.push_back(who[k] == group_.self ? p.own.fingerprint : p.peers[who[k]]->fingerprint);
  }
  const ParityVerdict v = parityVerdict(prints, self);
  stats_.parity(who.size() - 1, v.disagreeing.size());
  for (size_t k : v.disagreeing) {
    logger()->warn(
        "dts: state parity: at round {} the job model of {} differs from this worker's "
        "(fingerprints {:.2g} of its norm apart; the tolerance is {:.0e})",
        p.round, topology_.describe(group_.ranks[who[k]]),
        parityDistance(p.own.fingerprint, prints[k]), kParityTolerance);
  }
  if (!v.selfDiffers || repair_) return;
  if (v.sources.size() * 2 <= expected && who.size() < expected) {
    logger()->info(
        "dts: state parity: at round {} this worker's job model differs from {} of the {} "
        "workers expected; too few compared to say which is wrong, the next check decides",
        p.round, v.disagreeing.size(), expected);
    return;
  }
  // The nearest of those that hold the job's model.
  size_t from = who[v.sources.front()];
  double best = 1e9;
  for (const auto& c : host_.parityPeerCounters()) {
    const auto i = group_.indexOf(c.peer);
    if (!i || c.minRttSeconds <= 0 || c.minRttSeconds >= best) continue;
    for (size_t k : v.sources) {
      if (who[k] == *i) from = *i, best = c.minRttSeconds;
    }
  }
  logger()->warn(
      "dts: state parity: this worker's job model differs from the job's at round {} ({} of {} "
      "workers compared hold another); repairing it from {}",
      p.round, v.sources.size(), who.size(), topology_.describe(group_.ranks[from]));
  askForRepair(from, p.round);
}

// Asks `from` for its job model as of a round we have not closed yet (and
// at least `atLeast`): by the time we complete it, its answer is on the
// way. A failed send ends the repair; the next check decides again.
void StateParity::askForRepair(size_t from, uint64_t differedAt, uint64_t atLeast, int retries) {
  const uint64_t round = std::max({host_.parityNextRound() + 1, completedThrough_ + 1, atLeast});
  repair_.emplace();
  repair_->from = from;
  repair_->round = round;
  repair_->differedAt = differedAt;
  repair_->retries = retries;
  auto bytes = std::make_shared<std::vector<std::byte>>(sizeof round);
  std::memcpy(bytes->data(), &round, sizeof round);
  if (const Status s =
          host_.paritySend({group_.ranks[from]}, Control::kParityRequest, 0, std::move(bytes));
      !s.ok()) {
    logger()->warn("dts: state parity: could not ask {} for its job model: {}",
                   topology_.describe(group_.ranks[from]), s.message());
    repair_.reset();
  }
}

Status StateParity::pollRepair(train::FlatParameters& flat) {
  const uint32_t peer = group_.ranks[repair_->from];
  const auto modelBytes = static_cast<size_t>(flat.values.numel()) * 4;
  // The answers here: whole, or put together from their parts (a large
  // model's, sent behind the peer's rounds).
  std::vector<std::pair<uint64_t, transport::Payload>> answers;
  for (transport::Message& m : host_.parityTake(Control::kParityState, peer)) {
    answers.emplace_back(m.header.step, std::move(m.payload));
  }
  for (const transport::Message& m : host_.parityTake(Control::kParityStatePart, peer)) {
    Repair& r = *repair_;
    if (!r.parts) r.parts.emplace(modelBytes + sizeof r.theirGate);
    bool complete = false;
    if (const Status ok = r.parts->add(m.payload.bytes(), complete); !ok.ok()) {
      // The rest of an answer to an earlier question (a retry began this
      // one), or a broken one: the next answer starts at byte 0.
      logger()->debug("dts: state parity: dropped a part of the job model of {}: {}",
                      topology_.describe(peer), ok.message());
      continue;
    }
    if (complete) answers.emplace_back(m.header.step, transport::Payload(r.parts->take()));
  }
  for (const auto& [round, payload] : answers) {
    if (!repair_) break;  // ended by an earlier answer
    Repair& r = *repair_;
    if (payload.size() == 0) {
      // It had completed the round already (it runs ahead): ask for one
      // past where it is.
      if (round < r.round || r.retries >= 3) continue;  // to an earlier question
      askForRepair(r.from, r.differedAt, round + 2, r.retries + 1);
      continue;
    }
    if (round != r.round) continue;  // an answer to an earlier question
    if (payload.size() != modelBytes + sizeof r.theirGate) {
      logger()->warn(
          "dts: state parity: the job model of {} for round {} has {} bytes, expected {} (the "
          "same model everywhere?); the next check decides again",
          topology_.describe(peer), round, payload.size(), modelBytes + sizeof r.theirGate);
      repair_.reset();
      return {};
    }
    std::memcpy(&r.theirGate, payload.data() + modelBytes, sizeof r.theirGate);
    torch::Tensor theirs = torch::empty({flat.values.numel()}, torch::kFloat32);
    std::string reason;
    if (const Status ok = checkedCopy(payload.bytes().first(modelBytes), theirs,
                                      std::numeric_limits<float>::max(), reason);
        !ok.ok()) {
      host_.parityReject(peer, fmt::format("its job model for round {}", round), reason, ok);
      repair_.reset();
      return {};
    }
    r.theirs = std::move(theirs);
  }
  if (!repair_) return {};
  Repair& r = *repair_;
  if (host_.paritySuspected(peer) || completedThrough_ > r.round + 4 * kParityEvery) {
    logger()->warn(
        "dts: state parity: no job model from {} for round {}; the next check decides again",
        topology_.describe(peer), r.round);
    repair_.reset();
    return {};
  }
  if (!r.own.defined() || !r.theirs.defined()) return {};
  if (r.ownGate != r.theirGate) {
    // Not comparable as of that round (a late contribution reached one of
    // us and not yet the other, or the peer was repairing): ask again.
    if (r.retries >= 3) {
      logger()->info(
          "dts: state parity: the job model of {} as of round {} is not comparable with this "
          "worker's (late contributions still open); the next check decides again",
          topology_.describe(peer), r.round);
      repair_.reset();
      return {};
    }
    askForRepair(r.from, r.differedAt, completedThrough_ + 1, r.retries + 1);
    return {};
  }
  // theirs - ours: zero where the two agree to the bit, the difference
  // (and a few units of rounding) where they do not.
  const torch::Tensor delta = r.theirs.view({-1}).sub_(r.own.view({-1}));
  const torch::Tensor size = delta.abs();
  const float largest = size.max().item<float>();
  // Rounding moves a value by a few units in the last place of the
  // values it was computed from (~1e-7 of the model's typical size; a
  // value several times the typical size, by several times that).
  const double typical = r.own.pow(2).mean().sqrt().item<double>();
  const int64_t changed = (size > 1e-4 * typical + 1e-12).sum().item<int64_t>();
  host_.parityRepair(delta, flat);
  // Our fingerprints computed so far predate the repair: they say
  // nothing any more (a round checked after the round asked for, while
  // the answer was on its way, would start a second repair).
  for (Round& p : rounds_) p.decided = true;
  stats_.repaired();
  logger()->warn(
      "dts: state parity: repaired this worker's job model from {}'s as of round {}: {} "
      "value(s) differed beyond rounding, by up to {:.3g}; training goes on",
      topology_.describe(peer), r.round, changed, largest);
  repair_.reset();
  return {};
}

}  // namespace geo::sync::detail
