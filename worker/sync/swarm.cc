// SwarmSGD: decentralized, non-blocking pairwise averaging (ARCHITECTURE.md
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
// reference copies are not saved. A resumed worker instead re-synchronizes
// them once, before its first step: it sends its full fp32 model to every
// peer and takes theirs (all workers of a job resume together).

#include <fmt/format.h>

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

  Status afterStep(int64_t step, train::FlatParameters& flat) override {
    modified_ = false;
    if (group_.size() <= 1) return {};
    init(flat);
    if (resumed_) GEO_RETURN_IF_ERROR(resync(flat));
    const int64_t t = step + 1;
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
      GEO_RETURN_IF_ERROR(serve(steps, flat));
      expireOutstanding();
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    // 2. Tell everyone we start no more exchanges; keep answering until each
    // peer has said the same (it has then no request to us in flight).
    std::vector<uint32_t> to;
    for (size_t i = 0; i < group_.size(); ++i) {
      if (i != group_.self && !absent_(i)) to.push_back(group_.ranks[i]);
    }
    GEO_RETURN_IF_ERROR(sendTo(to, MessageKind::kControl, kFinishedRound, steps, CodecId::kRaw, 0,
                               std::make_shared<std::vector<std::byte>>()));
    for (size_t i = 0; i < group_.size(); ++i) {
      if (i == group_.self || absent_(i)) continue;
      const auto deadline = Clock::now() + options_.timeout;
      while (true) {
        GEO_RETURN_IF_ERROR(serve(steps, flat));
        auto m = transport_->receive(MessageKind::kControl, kFinishedRound, group_.ranks[i],
                                     std::chrono::milliseconds(1));
        if (m.ok()) break;
        if (Clock::now() > deadline) {
          markAbsent(i, fmt::format("{} did not finish its exchanges within {:.3g} s",
                                    topology_.describe(group_.ranks[i]),
                                    std::chrono::duration<double>(options_.timeout).count()));
          break;
        }
      }
    }
    // 3. Agree on the average model.
    std::vector<bool> absent(group_.size());
    for (size_t i = 0; i < group_.size(); ++i) absent[i] = absent_(i);
    return averageModels(flat, absent);
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
    Clock::time_point sentAt;
    bool absent = false;
  };

  bool absent_(size_t i) const { return peers_[i].absent; }

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
    for (const Peer& p : peers_) {
      if (p.outstanding && !p.absent) return true;
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

  void expireOutstanding() {
    for (size_t i = 0; i < group_.size(); ++i) {
      Peer& p = peers_[i];
      if (p.outstanding && Clock::now() - p.sentAt > options_.timeout) {
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
    const auto t0 = Clock::now();
    const torch::Tensor diff = values - p.refOut;
    auto bytes = std::make_shared<const std::vector<std::byte>>(codec_->encode(
        diff, options_.seed, mixStream(3, topology_.rank() * 65536u + group_.ranks[i], p.seqOut),
        nullptr));
    codec_->decodeAccumulate(*bytes, 1.0f, p.refOut);
    stats_.coded(secondsSince(t0));
    stats_.encoded(static_cast<uint64_t>(values.numel()) * 4, bytes->size(), 1);
    return sendTo({group_.ranks[i]}, kind, p.seqOut++, t, codec_->id(),
                  static_cast<uint64_t>(codec_->numel()), bytes);
  }

  Status serve(int64_t t, train::FlatParameters& flat) {
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
        if (static_cast<int64_t>(m->payload.size()) != codec_->encodedBytes()) {
          return dataLoss(fmt::format(
              "swarm: a model from {} has {} bytes, expected {} ({}): do all workers run the "
              "same model and codec?",
              topology_.describe(group_.ranks[i]), m->payload.size(), codec_->encodedBytes(),
              codec_->describe()));
        }
        const auto t0 = Clock::now();
        codec_->decodeAccumulate(m->payload.bytes(), 1.0f, p.refIn);
        stats_.coded(secondsSince(t0));
        ++p.seqIn;
        p.absent = false;
        if (request) {
          // Reply with our model before averaging: both sides then move to
          // (nearly) the same midpoint.
          GEO_RETURN_IF_ERROR(sendModel(i, MessageKind::kGossipReply, t, flat.values));
        } else if (p.outstanding) {
          p.outstanding = false;
          stats_.roundDone(secondsSince(p.sentAt));
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
      if (i != group_.self && !peers_[i].outstanding && !peers_[i].absent) {
        candidates.push_back(i);
      }
    }
    if (candidates.empty()) return {};  // every peer busy: skip this exchange
    std::uniform_int_distribution<size_t> pick(0, candidates.size() - 1);
    const size_t i = candidates[pick(rng_)];
    GEO_RETURN_IF_ERROR(sendModel(i, MessageKind::kGossip, t, flat.values));
    peers_[i].outstanding = true;
    peers_[i].sentAt = Clock::now();
    return {};
  }

  // After a resume: exchange full models so both sides of every pair hold
  // the same reference copies again.
  Status resync(train::FlatParameters& flat) {
    resumed_ = false;
    std::vector<uint32_t> to;
    for (size_t i = 0; i < group_.size(); ++i) {
      if (i != group_.self) to.push_back(group_.ranks[i]);
    }
    GEO_RETURN_IF_ERROR(sendTo(to, MessageKind::kControl, kResyncRound, 0, CodecId::kFp32,
                               static_cast<uint64_t>(flat.values.numel()),
                               tensorBytes(flat.values)));
    for (size_t i = 0; i < group_.size(); ++i) {
      if (i == group_.self) continue;
      auto m = receiveFrom(group_.ranks[i], MessageKind::kControl, kResyncRound, options_.timeout,
                           "model after resuming");
      if (!m.ok()) return Status(m.status().code(), "swarm: " + m.status().message());
      peers_[i].refOut = flat.values.clone();
      copyBytesTo(m->payload.bytes(), peers_[i].refIn);
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
