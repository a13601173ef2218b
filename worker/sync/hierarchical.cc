// Hierarchical sync: a region's workers average over the LAN through their
// leader, and only the leaders run the WAN algorithm.

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <map>
#include <thread>
#include <utility>

#include "common/enforce.h"
#include "common/logging.h"
#include "worker/sync/internal.h"

namespace geo::sync::detail {

using transport::CodecId;
using transport::Message;
using transport::MessageKind;

namespace {

// Inside each region: every step the members send their gradient to the
// leader over the LAN; the leader averages (own first, then members in rank
// order), runs the WAN algorithm's gradient hook among leaders (allreduce),
// and sends the result back as fp32, so every replica of a region uses the
// same gradient and, from the same start, holds the same bits. After the
// optimizer step the leader runs the WAN algorithm's parameter hook (dts,
// swarm) and, when it changed the parameters, sends them to its members.
//
// Membership on the LAN: the leader averages over the members it expects --
// not suspected (silent for the peer time-out), not rejoining -- so a dead
// member costs the region a few seconds once, not a time-out per step. A
// restarted member joins through its leader (the leader's model and step)
// and is expected from its first step on. A member whose leader goes away
// cannot train on (the leader holds the region's model and WAN state): it
// fails, naming the leader -- and the leader's reason, when the leader
// stopped on an error (a dead leader of another region: the cause of a
// cascade) -- and rejoins when restarted (as its pod would be).
class Hierarchical final : public Synchronizer {
 public:
  Hierarchical(SyncOptions options, Topology topology, transport::Transport* transport,
               std::unique_ptr<Base> inner)
      : options_(std::move(options)),
        topology_(std::move(topology)),
        transport_(transport),
        inner_(std::move(inner)),
        members_(topology_.regionMembers(topology_.rank())),
        leader_(members_.front()),
        lanMembers_(transport_, topology_, lanPeers(), options_, "hierarchical sync") {
    // A member waits for its leader, which may itself wait up to a timeout
    // for the WAN: give the LAN wait room for that.
    lanTimeout_ = 2 * options_.timeout + std::chrono::milliseconds(30000);
  }

  const geo::Clock& clock() const { return clockOf(options_); }
  double since(geo::Clock::TimePoint t0) const { return secondsSince(clock(), t0); }

  std::string describe() const override {
    return fmt::format("hierarchical: {} workers in region {} ({}); {}", members_.size(),
                       topology_.regionOf(topology_.rank()),
                       isLeader() ? "leader" : fmt::format("led by rank {}", leader_),
                       inner_ ? inner_->describe() : "WAN sync at the leader");
  }

  SyncStats stats() const override {
    SyncStats s = inner_ ? inner_->stats() : SyncStats{};
    const SyncStats lan = lanStats_.snapshot();
    s.waitSeconds += lan.waitSeconds;
    s.codecSeconds += lan.codecSeconds;
    s.encodeSeconds += lan.encodeSeconds;
    s.missing += lan.missing;
    lanMembers_.addTo(s);
    for (const auto& r : lan.rejected) s.rejected.push_back(r);
    return s;
  }

  StatusOr<train::JoinResult> join(int64_t step, train::FlatParameters& flat) override {
    if (isLeader()) {
      return inner_ ? inner_->join(step, flat) : train::JoinResult{step, false};
    }
    auto joined = lanMembers_.join(step, 1, flat.values, &flat);
    if (!joined.ok()) return joined.status();
    if (joined->jobFinished) {
      return train::JoinResult{joined->finalModel ? joined->step : step, true, joined->finalModel};
    }
    GEO_RETURN_IF_ERROR(lanMembers_.announce(static_cast<uint64_t>(joined->step), joined->step));
    return train::JoinResult{joined->step, false};
  }

  Status afterBackward(int64_t step, train::FlatParameters& flat) override {
    ensureCodec(flat);
    const auto round = static_cast<uint64_t>(step) * 2;
    if (!isLeader()) {
      auto bytes = std::make_shared<const std::vector<std::byte>>(
          lan_->encode(flat.grads, options_.seed, mixStream(4, topology_.rank(), round), nullptr));
      GEO_RETURN_IF_ERROR(send({leader_}, MessageKind::kLanReduce, round, step, lan_->id(),
                               static_cast<uint64_t>(lan_->numel()), bytes));
      auto m = fromLeader(round, step, flat,
                          fmt::format("region-average gradient for step {}", step + 1));
      if (!m.ok()) return m.status();
      // Refused: this step uses our own gradient; the leader's next model
      // broadcast brings us back to the region's parameters.
      acceptFromLeader(*m, flat.grads, kMaxContribution,
                       fmt::format("the region-average gradient for step {}", step + 1));
      return {};
    }
    // Gather the gradients of the members expected at this step.
    std::vector<std::optional<Message>> got(members_.size());
    const auto t0 = clock().now();
    const auto deadline = t0 + options_.timeout;
    while (true) {
      auto served = lanMembers_.serve(step, flat.values, false, &flat);
      if (!served.ok()) return served.status();
      // Whatever arrived counts, from a member given up on too (it is then
      // expected again).
      for (size_t i = 1; i < members_.size(); ++i) {
        if (got[i]) continue;
        auto m = transport_->receive(MessageKind::kLanReduce, round, members_[i],
                                     std::chrono::milliseconds(0));
        if (m.ok()) {
          got[i] = std::move(*m);
          lanMembers_.delivered(members_[i], static_cast<uint64_t>(step));
        }
      }
      std::optional<size_t> waitFor;
      for (size_t i = 1; i < members_.size(); ++i) {
        if (!got[i] && lanMembers_.expected(members_[i], static_cast<uint64_t>(step))) {
          waitFor = i;
          break;
        }
      }
      if (!waitFor) break;
      if (clock().now() >= deadline) {
        for (size_t i = 1; i < members_.size(); ++i) {
          if (got[i] || !lanMembers_.expected(members_[i], static_cast<uint64_t>(step))) continue;
          lanMembers_.giveUp(members_[i]);
          logger()->warn(
              "hierarchical sync: no gradient for step {} from {} within {:.3g} s; "
              "the region goes on without it until it delivers again",
              step + 1, topology_.describe(members_[i]),
              std::chrono::duration<double>(options_.timeout).count());
        }
        break;
      }
      const uint32_t member = members_[*waitFor];
      auto m = transport_->receive(MessageKind::kLanReduce, round, member,
                                   std::chrono::milliseconds(20));
      if (!m.ok()) continue;
      got[*waitFor] = std::move(*m);
      lanMembers_.delivered(member, static_cast<uint64_t>(step));
    }
    lanStats_.waited(since(t0));
    // A member's gradient is checked like any contribution: a diverged
    // member is refused, named, and the region averages without it.
    std::vector<torch::Tensor> decoded(members_.size());
    size_t present = 1;
    for (size_t i = 1; i < members_.size(); ++i) {
      if (got[i]) {
        decoded[i] = torch::empty_like(flat.grads);
        std::string reason;
        const Status ok = lan_->decodeChecked(got[i]->payload.bytes(), decoded[i], reason);
        if (!ok.ok()) {
          // Counted and logged (rate-limited); the member still delivers,
          // so it stays expected: a bad gradient is not a missing member.
          lanStats_.rejected(members_[i], reason);
          const uint64_t n = ++refusedFromMember_[members_[i]];
          if (n <= 3 || n % 100 == 0) {
            logger()->warn(
                "hierarchical sync: refused the gradient of member {} for step {} ({}; refusal "
                "#{} from it): {}; the region averages without it",
                topology_.describe(members_[i]), step + 1, reason, n, ok.message());
          }
          got[i].reset();
        }
      }
      if (got[i]) {
        ++present;
      } else {
        lanStats_.missed();
      }
    }
    if (!sum_.defined()) sum_ = torch::zeros_like(flat.grads);
    const float alpha = 1.0f / static_cast<float>(present);
    sum_.copy_(flat.grads);
    sum_.mul_(alpha);
    for (size_t i = 1; i < members_.size(); ++i) {
      if (got[i]) sum_.add_(decoded[i], alpha);
    }
    flat.grads.copy_(sum_);
    if (inner_) GEO_RETURN_IF_ERROR(tellMembersWhy(inner_->afterBackward(step, flat), step));
    current_.clear();
    for (size_t i = 1; i < members_.size(); ++i) {
      if (got[i]) current_.push_back(members_[i]);
    }
    return send(current_, MessageKind::kLanBroadcast, round, step, CodecId::kFp32,
                static_cast<uint64_t>(flat.grads.numel()), tensorBytes(flat.grads));
  }

  Status afterStep(int64_t step, train::FlatParameters& flat) override {
    const auto round = static_cast<uint64_t>(step) * 2 + 1;
    if (!isLeader()) {
      auto m = fromLeader(round, step, flat, fmt::format("parameters after step {}", step + 1));
      if (!m.ok()) return m.status();
      if (m->payload.size() > 0) {
        acceptFromLeader(*m, flat.values, std::numeric_limits<float>::max(),
                         fmt::format("the parameters after step {}", step + 1));
      }
      return {};
    }
    if (inner_) GEO_RETURN_IF_ERROR(tellMembersWhy(inner_->afterStep(step, flat), step));
    const bool changed = inner_ && inner_->modifiedParameters();
    auto bytes = changed ? tensorBytes(flat.values) : std::make_shared<std::vector<std::byte>>();
    GEO_RETURN_IF_ERROR(send(current_, MessageKind::kLanBroadcast, round, step,
                             changed ? CodecId::kFp32 : CodecId::kRaw,
                             changed ? static_cast<uint64_t>(flat.values.numel()) : 0, bytes));
    // A member that joins now starts from the model after this step.
    auto served = lanMembers_.serve(step + 1, flat.values, false, &flat);
    return served.ok() ? Status() : served.status();
  }

  Status finish(int64_t steps, train::FlatParameters& flat) override {
    torch::Tensor whole = train::wholeModel(flat);  // with batch norm's statistics
    if (!isLeader()) {
      auto m = fromLeader(roundOf(Control::kFinalAverage), steps, flat, "final model");
      if (!m.ok()) return m.status();
      acceptFromLeader(*m, whole, std::numeric_limits<float>::max(), "the final model");
      return {};
    }
    // The end as a member that (re)starts now sees it -- as a flat peer's
    // end: an offer says "finished", and a request for state waits for the
    // final model. Without this, a member restarted while its leader ran
    // the WAN's final average heard nothing, took the leader's exit for a
    // dead job and failed, or joined at the last step and waited for a
    // step the leader never took.
    lanMembers_.setFinishing();
    GEO_RETURN_IF_ERROR(serveFinished(steps, flat));
    if (inner_) GEO_RETURN_IF_ERROR(tellMembersWhy(inner_->finish(steps, flat), steps));
    lanMembers_.setFinalModel();
    GEO_RETURN_IF_ERROR(serveFinished(steps, flat));
    std::vector<uint32_t> to;
    for (size_t i = 1; i < members_.size(); ++i) {
      if (lanMembers_.expected(members_[i], static_cast<uint64_t>(steps)))
        to.push_back(members_[i]);
    }
    GEO_RETURN_IF_ERROR(send(to, MessageKind::kLanBroadcast, roundOf(Control::kFinalAverage), steps,
                             CodecId::kFp32, static_cast<uint64_t>(whole.numel()),
                             tensorBytes(whole)));
    // A member (re)joining as we finish gets the job's final model.
    return lanMembers_.lingerWhileJoining([&] { return serveFinished(steps, flat); }, "a member");
  }

  // A leader's WAN algorithm knows the job's model; a member keeps none
  // (only rank 0 evaluates periodically, and it leads its region).
  std::optional<train::JobModel> jobModel() override {
    return inner_ ? inner_->jobModel() : std::nullopt;
  }

  void saveState(torch::serialize::OutputArchive& archive) override {
    if (inner_) inner_->saveState(archive);
  }
  Status loadState(torch::serialize::InputArchive& archive) override {
    return inner_ ? inner_->loadState(archive) : Status();
  }

 private:
  bool isLeader() const { return leader_ == topology_.rank(); }
  std::vector<uint32_t> lanPeers() const {
    if (isLeader()) return std::vector<uint32_t>(members_.begin() + 1, members_.end());
    return {leader_};
  }

  void ensureCodec(const train::FlatParameters& flat) {
    if (lan_) return;
    auto c = codec::makeCodec({.name = options_.lanCodec});
    GEO_ENFORCE(c.ok(), "hierarchical sync: lanCodec: {}", c.status().message());
    std::vector<int64_t> sizes;
    for (const auto& p : flat.params) sizes.push_back(p.numel());
    lan_ =
        std::make_unique<FlatCodec>(std::shared_ptr<const codec::Codec>(std::move(*c)), sizes, 0);
  }

  Status send(const std::vector<uint32_t>& to, MessageKind kind, uint64_t round, int64_t step,
              CodecId codec, uint64_t elements,
              std::shared_ptr<const std::vector<std::byte>> bytes) {
    const Status s =
        sendBuffer(*transport_, topology_, to, kind,
                   {round, static_cast<uint64_t>(step), codec, elements}, bytes, options_.timeout);
    return s.ok() ? s : Status(s.code(), "hierarchical sync: " + s.message());
  }

  // The LAN's membership served once, as a worker that has finished.
  Status serveFinished(int64_t steps, const train::FlatParameters& flat) {
    auto served = lanMembers_.serve(steps, flat.values, true, &flat);
    return served.ok() ? Status() : served.status();
  }

  // A member takes what its leader sends only if it is sound (the right size,
  // finite, within `limit`): a leader gone bad must not poison its members
  // either. A refusal is counted and logged (rate-limited); `into` is then
  // left as it was. Returns whether it was taken.
  bool acceptFromLeader(const Message& m, torch::Tensor& into, float limit,
                        const std::string& what) {
    std::string reason;
    const Status ok = checkedCopy(m.payload.bytes(), into, limit, reason);
    if (ok.ok()) return true;
    lanStats_.rejected(leader_, reason);
    const uint64_t n = ++refusedFromLeader_;
    if (n <= 3 || n % 100 == 0) {
      logger()->warn(
          "hierarchical sync: refused {} from the region leader {} ({}; refusal #{}): {}; "
          "keeping our own",
          what, topology_.describe(leader_), reason, n, ok.message());
    }
    return false;
  }

  // A member waits for its leader: bounded by the LAN time-out, and given up
  // at once when the leader is suspected (it cannot train on without it).
  StatusOr<Message> fromLeader(uint64_t round, int64_t step, const train::FlatParameters& flat,
                               const std::string& what) {
    const auto t0 = clock().now();
    while (true) {
      auto served = lanMembers_.serve(step, flat.values, false, &flat);
      if (!served.ok()) return served.status();
      // Its reason first: it may fall silent right after sending it.
      if (auto why = receiveControl(*transport_, Control::kLeaderStopped, leader_,
                                    std::chrono::milliseconds(0));
          why.ok()) {
        lanStats_.waited(since(t0));
        return aborted(fmt::format(
            "hierarchical sync: no {} from the region leader {}: it stopped (a member cannot "
            "train on without its leader -- restart this worker to rejoin once the leader is "
            "back): {}",
            what, topology_.describe(leader_), printable(why->payload.bytes())));
      }
      if (lanMembers_.suspected(leader_)) {
        lanStats_.waited(since(t0));
        return aborted(fmt::format(
            "hierarchical sync: no {} from the region leader {}: it is suspected (silent for the "
            "peer time-out); a member cannot train on without its leader -- restart this worker "
            "to rejoin once the leader is back",
            what, topology_.describe(leader_)));
      }
      auto m = transport_->receive(MessageKind::kLanBroadcast, round, leader_,
                                   std::chrono::milliseconds(20));
      if (m.ok()) {
        lanStats_.waited(since(t0));
        return m;
      }
      if (clock().now() - t0 > lanTimeout_) {
        lanStats_.waited(since(t0));
        return deadlineExceeded(fmt::format(
            "hierarchical sync: no {} from {} within {:.3g} s; is that worker alive?", what,
            topology_.describe(leader_), std::chrono::duration<double>(lanTimeout_).count()));
      }
    }
  }

  // A leader whose WAN algorithm fails (`why`) tells its members the reason
  // before it stops, then returns `why`. Its members cannot train on
  // without it; "the leader is silent" was all they could say, naming a
  // worker of their own region while the cause -- another region's leader
  // that died, named in `why` -- went unsaid. Best effort: a member that is
  // gone is not waited for, and the notice gets up to half a second to
  // leave (the transport drops what it has not handed to ZeroMQ when the
  // process exits).
  Status tellMembersWhy(Status why, int64_t step) {
    if (why.ok() || members_.size() <= 1) return why;
    const std::string& text = why.message();
    const auto* begin = reinterpret_cast<const std::byte*>(text.data());
    auto bytes = std::make_shared<const std::vector<std::byte>>(
        begin, begin + std::min(text.size(), kMaxStopReasonBytes));
    const std::vector<uint32_t> to(members_.begin() + 1, members_.end());
    for (uint32_t m : to) {
      (void)sendBuffer(
          *transport_, topology_, {m}, MessageKind::kControl,
          {roundOf(Control::kLeaderStopped), static_cast<uint64_t>(step), CodecId::kRaw, 0}, bytes,
          std::chrono::milliseconds(100));
    }
    const auto deadline = clock().now() + std::chrono::milliseconds(500);
    while (clock().now() < deadline) {
      bool queued = false;
      for (const auto& c : transport_->peerCounters()) {
        queued = queued || (std::find(to.begin(), to.end(), c.peer) != to.end() &&
                            !lanMembers_.suspected(c.peer) && c.queuedBytes > 0);
      }
      if (!queued) break;
      clock().sleepFor(std::chrono::milliseconds(10));
    }
    return why;
  }

  // A leader's reason as a member logs it: printable ASCII, bounded (an
  // authenticated peer gone bad must not write control characters or
  // megabytes into our log).
  static std::string printable(std::span<const std::byte> bytes) {
    std::string out;
    for (size_t i = 0; i < bytes.size() && i < kMaxStopReasonBytes; ++i) {
      const auto c = static_cast<unsigned char>(bytes[i]);
      out.push_back(c >= 0x20 && c < 0x7f ? static_cast<char>(c) : '?');
    }
    return out;
  }

  SyncOptions options_;
  Topology topology_;
  transport::Transport* transport_;
  std::unique_ptr<Base> inner_;  // null on members
  std::vector<uint32_t> members_;
  uint32_t leader_;
  std::chrono::milliseconds lanTimeout_;
  std::unique_ptr<FlatCodec> lan_;
  torch::Tensor sum_;
  StatsRecorder lanStats_;
  uint64_t refusedFromLeader_ = 0;
  std::map<uint32_t, uint64_t> refusedFromMember_;
  Membership lanMembers_;
  std::vector<uint32_t> current_;  // members whose gradient this step's average holds
};

}  // namespace

std::unique_ptr<Synchronizer> makeHierarchical(const SyncOptions& o, const Topology& t,
                                               transport::Transport* tr,
                                               std::unique_ptr<Base> inner) {
  return std::make_unique<Hierarchical>(o, t, tr, std::move(inner));
}

}  // namespace geo::sync::detail
