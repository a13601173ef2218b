// SwarmSGD: decentralized, non-blocking pairwise averaging (docs/architecture.md
// section 3).
//
// Every H steps a worker picks a peer uniformly at random among those it has
// no exchange in flight with (the region graph is complete), sends its model
// and goes on training. The peer, after its next step, averages
// x_j <- (x_j + x̂_i) / 2 and replies with its own model; the initiator
// averages with the reply whenever it arrives. Nobody waits for more than the
// one peer of an exchange, and only at the end of training.
//
// Models travel as quantized differences to the last copy exchanged: for
// every ordered pair (i -> j) both sides keep the same reference copy c of
// x_i (it starts at the common initial model); i sends Q(x_i - c) and both
// add the decoded difference to c, so j's estimate x̂_i = c tracks x_i and
// quantization errors are corrected by the next difference. Both kinds of
// message (request, reply) of one direction share one sequence number (the
// frame's round), and are applied strictly in that order.
//
// Checkpoints keep the model and optimizer (the trainer's part); the
// reference copies are not saved. A worker that resumed from a checkpoint or
// took a peer's model when joining re-synchronizes them before its first
// step: it sends its full fp32 model to every live peer (Control::kResync, the
// header's step = its step) and takes theirs in the replies
// (Control::kResyncReply). Both ends of a pair then restart its sequence numbers
// at 0 and drop the gossip of the pair's earlier life: the peer drops every
// exchange message of the (re)starting worker (which sends none before its
// resync), the starting worker drops those of the peer older than the reply.
//
// Membership: partners are chosen among peers that are not suspected,
// rejoining or given up on; an exchange in flight with a peer that becomes
// suspected is abandoned at once (the round time-out is the last resort), and
// the next exchange picks another partner.

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <random>
#include <thread>

#include "common/logging.h"
#include "worker/sync/internal.h"

namespace geo::sync::detail {
namespace {

using transport::CodecId;
using transport::Message;
using transport::MessageKind;

class Swarm final : public Base {
 public:
  Swarm(const SyncOptions& o, const Topology& t, transport::Transport* tr, Group g)
      : Base(o, t, tr, std::move(g)),
        peers_(group_.size()),
        rng_(mixStream(o.seed, 0x5a4, topology_.rank())) {}

  std::string describe() const override {
    return fmt::format("swarm among {} workers: exchange every H = {} steps, codec {}",
                       group_.size(), options_.swarmH, options_.codec.name);
  }

  // The reference copies start at the common initial model.
  Status afterBackward(int64_t step, train::FlatParameters& flat) override {
    (void)step;
    if (group_.size() > 1) init(flat);
    return {};
  }

  StatusOr<train::JoinResult> join(int64_t step, train::FlatParameters& flat) override {
    if (group_.size() <= 1) return train::JoinResult{step, false};
    init(flat);
    auto joined = membership_.join(step, options_.swarmH, flat.values, &flat);
    if (!joined.ok()) return joined.status();
    if (joined->jobFinished) {
      return train::JoinResult{joined->finalModel ? joined->step : step, true, joined->finalModel};
    }
    if (resumed_ || joined->transferred) GEO_RETURN_IF_ERROR(resync(joined->step, flat));
    resumed_ = false;
    GEO_RETURN_IF_ERROR(membership_.announce(0, joined->step));
    return train::JoinResult{joined->step, false};
  }

  Status afterStep(int64_t step, train::FlatParameters& flat) override {
    modified_ = false;
    if (group_.size() <= 1) return {};
    init(flat);
    const int64_t t = step + 1;
    sampleUplink();
    GEO_RETURN_IF_ERROR(serveMembership(t, flat, false));
    GEO_RETURN_IF_ERROR(serve(t, flat));
    if (t % options_.swarmH == 0) GEO_RETURN_IF_ERROR(initiate(t, flat));
    expireOutstanding();
    return {};
  }

  Status finish(int64_t steps, train::FlatParameters& flat) override {
    if (group_.size() <= 1) return {};
    init(flat);
    // 1. Complete our own exchanges, answering others meanwhile.
    while (anyOutstanding()) {
      GEO_RETURN_IF_ERROR(serveMembership(steps, flat, true));
      GEO_RETURN_IF_ERROR(serve(steps, flat));
      expireOutstanding();
      clock().sleepFor(std::chrono::milliseconds(1));
    }
    // 2. Tell everyone we start no more exchanges; keep answering until each
    // peer has said the same (it has then no request to us in flight).
    std::vector<uint32_t> to;
    for (size_t i = 0; i < group_.size(); ++i) {
      if (i != group_.self && !gone(i)) to.push_back(group_.ranks[i]);
    }
    GEO_RETURN_IF_ERROR(sendTo(to, Control::kSwarmFinished, steps, CodecId::kRaw, 0,
                               std::make_shared<std::vector<std::byte>>()));
    for (size_t i = 0; i < group_.size(); ++i) {
      if (i == group_.self || gone(i)) continue;
      const auto deadline = clock().now() + options_.timeout;
      while (true) {
        GEO_RETURN_IF_ERROR(serveMembership(steps, flat, true));
        GEO_RETURN_IF_ERROR(serve(steps, flat));
        auto m = receiveControl(*transport_, Control::kSwarmFinished, group_.ranks[i],
                                std::chrono::milliseconds(1));
        if (m.ok()) break;
        if (gone(i)) break;  // suspected while we waited
        if (clock().now() > deadline) {
          markAbsent(i, fmt::format("{} did not finish its exchanges within {:.3g} s",
                                    topology_.describe(group_.ranks[i]),
                                    std::chrono::duration<double>(options_.timeout).count()));
          break;
        }
      }
    }
    // 3. Agree on the average model among those alive.
    return averageModels(flat, steps);
  }

  Status loadState(torch::serialize::InputArchive& archive) override {
    (void)archive;
    resumed_ = true;
    return {};
  }

 private:
  struct Peer {
    torch::Tensor refOut;  // our model as this peer knows it
    torch::Tensor refIn;   // this peer's model as we know it
    uint64_t seqOut = 0;
    uint64_t seqIn = 0;
    bool outstanding = false;
    geo::Clock::TimePoint sentAt;
    bool absent = false;
  };

  // Not to be exchanged with: given up on, suspected or rejoining.
  bool gone(size_t i) const {
    const uint32_t r = group_.ranks[i];
    return peers_[i].absent || membership_.suspected(r) || membership_.joining(r);
  }

  // A peer that (re)starts: the pair's state is void until its resync.
  void peerRestarted(uint32_t peer) override {
    const auto i = group_.indexOf(peer);
    if (!i) return;
    Peer& p = peers_[*i];
    p.outstanding = false;
    p.absent = false;
  }

  void init(const train::FlatParameters& flat) {
    if (codec_) return;
    ensureCodec(flat);
    for (size_t i = 0; i < group_.size(); ++i) {
      if (i == group_.self) continue;
      peers_[i].refOut = flat.values.clone();
      peers_[i].refIn = flat.values.clone();
    }
  }

  bool anyOutstanding() const {
    for (size_t i = 0; i < peers_.size(); ++i) {
      if (peers_[i].outstanding && !gone(i)) return true;
    }
    return false;
  }

  void markAbsent(size_t i, const std::string& why) {
    Peer& p = peers_[i];
    if (p.absent) return;
    p.absent = true;
    p.outstanding = false;
    stats_.missed();
    logger()->warn("swarm: {}; no more exchanges with it", why);
  }

  // An exchange in flight with a peer that falls silent is abandoned at
  // once; its reply, should it still come, is applied when it arrives.
  void peerSuspected(uint32_t peer) override {
    const auto i = group_.indexOf(peer);
    if (!i || !peers_[*i].outstanding) return;
    peers_[*i].outstanding = false;
    stats_.missed();
    logger()->info("swarm: abandoning the exchange with suspected {}", topology_.describe(peer));
  }

  // An exchange whose reply is later than the round time-out although the
  // peer is heard (a straggler, or one that lost our request): given up on.
  void expireOutstanding() {
    for (size_t i = 0; i < group_.size(); ++i) {
      Peer& p = peers_[i];
      if (p.outstanding && clock().now() - p.sentAt > options_.timeout) {
        markAbsent(
            i, fmt::format("no reply from {} within {:.3g} s", topology_.describe(group_.ranks[i]),
                           std::chrono::duration<double>(options_.timeout).count()));
      }
    }
  }

  // Encodes x - refOut for peer i, advances refOut by what the peer will
  // decode, and sends it as `kind`.
  Status sendModel(size_t i, MessageKind kind, int64_t t, const torch::Tensor& values) {
    Peer& p = peers_[i];
    const auto t0 = clock().now();
    const torch::Tensor diff = values - p.refOut;
    if (std::string reason; !checkValues(diff, std::numeric_limits<float>::max(), reason).ok()) {
      return failedPrecondition(fmt::format(
          "swarm: this worker's own model is not finite (training diverged at step {}); stopping "
          "so that it does not reach the other workers",
          t));
    }
    auto bytes = std::make_shared<const std::vector<std::byte>>(codec_->encode(
        diff, options_.seed, mixStream(3, topology_.rank() * 65536u + group_.ranks[i], p.seqOut),
        nullptr));
    codec_->decodeAccumulate(*bytes, 1.0f, p.refOut);
    stats_.coded(since(t0), StatsRecorder::CodecWork::kEncode);
    stats_.encoded(static_cast<uint64_t>(values.numel()) * 4, bytes->size(), 1);
    return sendTo({group_.ranks[i]}, kind, p.seqOut++, t, codec_->id(),
                  static_cast<uint64_t>(codec_->numel()), bytes);
  }

  Status serve(int64_t t, train::FlatParameters& flat) {
    GEO_RETURN_IF_ERROR(answerResyncs(t, flat));
    for (size_t i = 0; i < group_.size(); ++i) {
      if (i == group_.self) continue;
      Peer& p = peers_[i];
      while (true) {
        bool request = true;
        auto m = transport_->receive(MessageKind::kGossip, p.seqIn, group_.ranks[i],
                                     std::chrono::milliseconds(0));
        if (!m.ok()) {
          request = false;
          m = transport_->receive(MessageKind::kGossipReply, p.seqIn, group_.ranks[i],
                                  std::chrono::milliseconds(0));
        }
        if (!m.ok()) break;
        const auto t0 = clock().now();
        torch::Tensor diff = torch::empty_like(p.refIn);
        std::string reason;
        const Status ok = codec_->decodeChecked(m->payload.bytes(), diff, reason);
        stats_.coded(since(t0));
        if (!ok.ok()) {
          // Nothing a peer sends may end this worker or reach its model;
          // without this difference the pair's reference copies disagree, so
          // no more exchanges with it (until it resyncs).
          reject(group_.ranks[i], "a model difference", reason, ok);
          markAbsent(i, fmt::format("refused a model difference of {}",
                                    topology_.describe(group_.ranks[i])));
          break;
        }
        p.refIn.add_(diff);
        ++p.seqIn;
        p.absent = false;
        if (request) {
          // Reply with our model before averaging: both sides then move to
          // (nearly) the same midpoint.
          GEO_RETURN_IF_ERROR(sendModel(i, MessageKind::kGossipReply, t, flat.values));
        } else if (p.outstanding) {
          p.outstanding = false;
          stats_.roundDone(since(p.sentAt));
        }
        flat.values.add_(p.refIn).mul_(0.5f);
        modified_ = true;
        stats_.applied(t - static_cast<int64_t>(m->header.step));
      }
    }
    return {};
  }

  Status initiate(int64_t t, train::FlatParameters& flat) {
    std::vector<size_t> candidates;
    for (size_t i = 0; i < group_.size(); ++i) {
      if (i != group_.self && !peers_[i].outstanding && !gone(i)) candidates.push_back(i);
    }
    if (candidates.empty()) return {};  // every peer busy: skip this exchange
    std::uniform_int_distribution<size_t> pick(0, candidates.size() - 1);
    const size_t i = candidates[pick(rng_)];
    GEO_RETURN_IF_ERROR(sendModel(i, MessageKind::kGossip, t, flat.values));
    peers_[i].outstanding = true;
    peers_[i].sentAt = clock().now();
    return {};
  }

  // Resets the pair with peer i to reference copies `mine` (ours, as the
  // peer now knows it) and `theirs`, dropping the pair's earlier exchange
  // messages from the peer older than `fromStep` (all when fromStep < 0).
  // A model that is not the right size or not finite is refused (the pair
  // is left as it was, and the refusal counted).
  bool resetPair(size_t i, const torch::Tensor& mine, std::span<const std::byte> theirs,
                 int64_t fromStep) {
    Peer& p = peers_[i];
    std::string reason;
    if (const Status ok = checkedCopy(theirs, p.refIn, std::numeric_limits<float>::max(), reason);
        !ok.ok()) {
      reject(group_.ranks[i], "a resync model", reason, ok);
      return false;
    }
    p.refOut.copy_(mine);
    p.seqOut = 0;
    p.seqIn = 0;
    p.outstanding = false;
    p.absent = false;
    const uint32_t r = group_.ranks[i];
    transport_->discard([&](const transport::FrameHeader& h) {
      return h.sender == r &&
             (h.kind == MessageKind::kGossip || h.kind == MessageKind::kGossipReply) &&
             (fromStep < 0 || static_cast<int64_t>(h.step) < fromStep);
    });
    return true;
  }

  // Answers resync requests of (re)started peers with our model.
  Status answerResyncs(int64_t t, train::FlatParameters& flat) {
    for (size_t i = 0; i < group_.size(); ++i) {
      if (i == group_.self) continue;
      const uint32_t r = group_.ranks[i];
      for (auto m = receiveControl(*transport_, Control::kResync, r, std::chrono::milliseconds(0));
           m.ok();
           m = receiveControl(*transport_, Control::kResync, r, std::chrono::milliseconds(0))) {
        if (!resetPair(i, flat.values, m->payload.bytes(), -1)) continue;
        GEO_RETURN_IF_ERROR(sendTo({r}, Control::kResyncReply, t, CodecId::kFp32,
                                   static_cast<uint64_t>(flat.values.numel()),
                                   tensorBytes(flat.values)));
      }
    }
    return {};
  }

  // Before the first step after a resume or a join: full models with every
  // live peer, so both sides of each pair hold the same reference copies.
  Status resync(int64_t step, train::FlatParameters& flat) {
    std::vector<size_t> to;
    for (size_t i = 0; i < group_.size(); ++i) {
      if (i != group_.self && !membership_.suspected(group_.ranks[i])) to.push_back(i);
    }
    const auto mine = tensorBytes(flat.values);
    for (size_t i : to) {
      GEO_RETURN_IF_ERROR(sendTo({group_.ranks[i]}, Control::kResync, step, CodecId::kFp32,
                                 static_cast<uint64_t>(flat.values.numel()), mine));
    }
    for (size_t i : to) {
      const uint32_t r = group_.ranks[i];
      const auto deadline = clock().now() + options_.timeout;
      std::optional<Message> reply;
      while (clock().now() < deadline && !membership_.suspected(r)) {
        GEO_RETURN_IF_ERROR(serveMembership(step, flat, false));
        GEO_RETURN_IF_ERROR(answerResyncs(step, flat));
        auto m = receiveFrom(r, Control::kResyncReply, std::chrono::milliseconds(20),
                             "model after (re)starting");
        if (m.ok()) {
          reply = std::move(*m);
          break;
        }
      }
      if (!reply) {
        markAbsent(i, fmt::format("{} did not answer our resync", topology_.describe(r)));
        continue;
      }
      if (!resetPair(i, flat.values, reply->payload.bytes(),
                     static_cast<int64_t>(reply->header.step))) {
        markAbsent(i, fmt::format("the resync answer of {} was refused", topology_.describe(r)));
      }
    }
    return {};
  }

  std::vector<Peer> peers_;
  std::mt19937_64 rng_;
  bool resumed_ = false;
};

}  // namespace

std::unique_ptr<Base> makeSwarm(const SyncOptions& o, const Topology& t, transport::Transport* tr,
                                Group g) {
  return std::make_unique<Swarm>(o, t, tr, std::move(g));
}

}  // namespace geo::sync::detail
