// The allreduce baseline: every step, every worker's gradient to every other,
// averaged in rank order from the same bytes everywhere (synchronous data
// parallelism, what DDP does).

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "common/logging.h"
#include "worker/sync/internal.h"

namespace geo::sync::detail {

using transport::CodecId;
using transport::Message;
using transport::MessageKind;

namespace {

// Every step: encode the local gradient, send it to every peer, and replace
// the gradient by the weighted average of all of them, summed in rank order
// from the same bytes on every worker -- so all replicas stay bitwise equal.
class Allreduce final : public Base {
 public:
  using Base::Base;
  std::string describe() const override {
    return fmt::format("allreduce among {} workers", group_.size());
  }

  Status afterBackward(int64_t step, train::FlatParameters& flat) override {
    if (group_.size() <= 1) return {};
    ensureCodec(flat);
    if (options_.errorFeedback && !residual_.defined() && codec_->id() != CodecId::kFp32) {
      residual_ = torch::zeros_like(flat.grads);
    }
    // A checkpoint's residual comes back where it was saved from.
    if (residual_.defined() && residual_.device() != flat.grads.device()) {
      residual_ = residual_.to(flat.grads.device());
    }
    const auto t0 = clock().now();
    auto bytes = std::make_shared<const std::vector<std::byte>>(codec_->encode(
        flat.grads, options_.seed, mixStream(1, topology_.rank(), static_cast<uint64_t>(step)),
        residual_.defined() ? &residual_ : nullptr));
    stats_.coded(since(t0), StatsRecorder::CodecWork::kEncode);
    std::vector<uint32_t> to;
    for (size_t i = 0; i < group_.size(); ++i) {
      if (i != group_.self) to.push_back(group_.ranks[i]);
    }
    stats_.encoded(static_cast<uint64_t>(flat.grads.numel()) * 4, bytes->size(), to.size());
    GEO_RETURN_IF_ERROR(sendTo(to, MessageKind::kUpdate, static_cast<uint64_t>(step), step,
                               codec_->id(), static_cast<uint64_t>(codec_->numel()), bytes));
    if (!sum_.defined()) sum_ = torch::zeros_like(flat.grads);
    // A missing gradient fails the step (fail fast); a malformed or
    // non-finite one is refused and the step averages over the others.
    auto got = gather(step, bytes->size());
    if (!got.ok()) return got.status();
    std::vector<torch::Tensor> decoded(group_.size());
    double total = 0;
    for (size_t i = 0; i < group_.size(); ++i) {
      if (i == group_.self) {
        total += group_.weights[i];
        continue;
      }
      const Message& m = *(*got)[i];
      const auto t1 = clock().now();
      decoded[i] = torch::empty_like(flat.grads);
      std::string reason;
      const Status ok = codec_->decodeChecked(m.payload.bytes(), decoded[i], reason);
      stats_.coded(since(t1));
      if (!ok.ok()) {
        reject(group_.ranks[i], fmt::format("the gradient for step {}", step + 1), reason, ok);
        decoded[i] = torch::Tensor();
        stats_.missed();
        continue;
      }
      total += group_.weights[i];
      stats_.applied(step - static_cast<int64_t>(m.header.step));
    }
    sum_.zero_();
    for (size_t i = 0; i < group_.size(); ++i) {
      const auto alpha = static_cast<float>(group_.weights[i] / total);
      if (i == group_.self) {
        codec_->decodeAccumulate(*bytes, alpha, sum_);
      } else if (decoded[i].defined()) {
        sum_.add_(decoded[i], alpha);
      }
    }
    flat.grads.copy_(sum_);
    stats_.roundDone(since(t0));
    return {};
  }

  void saveState(torch::serialize::OutputArchive& archive) override {
    if (residual_.defined()) archive.write("residual", residual_);
  }
  Status loadState(torch::serialize::InputArchive& archive) override {
    torch::Tensor r;
    if (archive.try_read("residual", r)) residual_ = r.contiguous();
    return {};
  }

 private:
  // Every peer's gradient for `step` (by group index; none for self),
  // awaited from all peers at once up to the round time-out. At the time-out
  // the error names every peer still missing, the one silent longest first.
  // Awaiting them one by one named only the first missing in rank order: a
  // dead worker's gradient and that of a worker that had already stopped
  // because of it (it never got the dead one's previous gradient, which
  // reached us) are both missing, and the one named was the second -- a
  // live worker's error, not the cause.
  // A gradient still arriving is not missing: where every missing peer sent
  // us at least a 64th of a gradient (`payloadBytes`, ours) since the last
  // look -- far more than its pings and acknowledgements -- the wait goes
  // on for another time-out. 80 MB gradients (a 20M-parameter model in
  // fp32) through 100 Mbit/s uplinks shared by three peers took 30 s a step
  // and at times over 60 s, and the job failed with "no gradient ... (silent
  // for 0.0 s); is that worker alive?". A peer whose bytes stopped still
  // fails the step within two time-outs.
  StatusOr<std::vector<std::optional<Message>>> gather(int64_t step, size_t payloadBytes) {
    std::vector<std::optional<Message>> got(group_.size());
    const auto round = static_cast<uint64_t>(step);
    const auto t0 = clock().now();
    auto deadline = t0 + options_.timeout;
    std::vector<uint64_t> heard = bytesReceived();
    const uint64_t progress = std::max<uint64_t>(1, payloadBytes / 64);
    while (true) {
      std::vector<size_t> missing;
      for (size_t i = 0; i < group_.size(); ++i) {
        if (i == group_.self || got[i]) continue;
        auto m = transport_->receive(MessageKind::kUpdate, round, group_.ranks[i],
                                     std::chrono::milliseconds(0));
        if (m.ok()) {
          got[i] = std::move(*m);
        } else if (m.status().code() == StatusCode::kDeadlineExceeded) {
          missing.push_back(i);
        } else {
          stats_.waited(since(t0));
          return Status(m.status().code(),
                        fmt::format("allreduce: no gradient for step {} from {}: {}", step + 1,
                                    topology_.describe(group_.ranks[i]), m.status().message()));
        }
      }
      if (missing.empty()) break;
      if (clock().now() >= deadline) {
        const std::vector<uint64_t> now = bytesReceived();
        const bool arriving = std::all_of(missing.begin(), missing.end(),
                                          [&](size_t i) { return now[i] >= heard[i] + progress; });
        if (!arriving) {
          stats_.waited(since(t0));
          return missingGradients(step, missing);
        }
        std::vector<std::string> who;
        for (const size_t i : missing) who.push_back(topology_.describe(group_.ranks[i]));
        logger()->info(
            "allreduce: the gradients for step {} of {} still arriving after {:.0f} s ({:.1f} MB "
            "each): waiting another {:.3g} s",
            step + 1, fmt::join(who, ", "), since(t0), static_cast<double>(payloadBytes) / 1e6,
            std::chrono::duration<double>(options_.timeout).count());
        heard = now;
        deadline = clock().now() + options_.timeout;
      }
      sampleUplink();
      // Whichever comes next (a later poll takes it from the inbox).
      auto m = transport_->receive(MessageKind::kUpdate, round, transport::kAnyPeer,
                                   std::chrono::milliseconds(20));
      if (!m.ok()) continue;
      const auto i = group_.indexOf(m->header.sender);
      if (i && *i != group_.self && !got[*i]) got[*i] = std::move(*m);
    }
    stats_.waited(since(t0));
    return got;
  }

  // What the transport has received from each group member, by group
  // index (0 for self and for a peer it does not know yet).
  std::vector<uint64_t> bytesReceived() const {
    std::vector<uint64_t> bytes(group_.size(), 0);
    for (const auto& c : transport_->peerCounters()) {
      if (const auto i = group_.indexOf(c.peer)) bytes[*i] = c.bytesReceived;
    }
    return bytes;
  }

  // The time-out's error: the missing peers by how long they have been
  // silent, longest first. When a worker dies, those that had not received
  // its last gradient give up on it and stop, so their gradients go missing
  // at the others too -- but they were heard until they stopped, a round
  // time-out after the dead one fell silent: the dead one comes first.
  Status missingGradients(int64_t step, std::vector<size_t> missing) const {
    // The transport's liveness of each group member, by group index.
    std::vector<std::optional<transport::PeerCounters>> liveness(group_.size());
    for (const auto& c : transport_->peerCounters()) {
      if (const auto i = group_.indexOf(c.peer)) liveness[*i] = c;
    }
    const auto silent = [&](size_t i) { return liveness[i] ? liveness[i]->silentSeconds : -1.0; };
    std::stable_sort(missing.begin(), missing.end(),
                     [&](size_t a, size_t b) { return silent(a) > silent(b); });
    const auto silence = [&](size_t i) -> std::string {
      if (!liveness[i]) return "";
      return fmt::format("{} {:.1f} s", liveness[i]->heard ? "silent for" : "never heard in",
                         liveness[i]->silentSeconds);
    };
    const size_t first = missing.front();
    std::string message = fmt::format(
        "allreduce: no gradient for step {} from {} within {:.3g} s{}; is that worker alive?",
        step + 1, topology_.describe(group_.ranks[first]),
        std::chrono::duration<double>(options_.timeout).count(),
        silence(first).empty() ? "" : " (" + silence(first) + ")");
    if (missing.size() > 1) {
      std::vector<std::string> others;
      for (size_t k = 1; k < missing.size(); ++k) {
        const std::string quiet = silence(missing[k]);
        others.push_back(topology_.describe(group_.ranks[missing[k]]) +
                         (quiet.empty() ? "" : ", " + quiet));
      }
      message += fmt::format(
          " Also missing, heard more recently (a worker stops once it gives up on a dead one): "
          "{}",
          fmt::join(others, "; "));
    }
    return deadlineExceeded(message);
  }

  torch::Tensor residual_;
  torch::Tensor sum_;
};

}  // namespace

std::unique_ptr<Base> makeAllreduce(const SyncOptions& o, const Topology& t,
                                    transport::Transport* tr, Group g) {
  return std::make_unique<Allreduce>(o, t, tr, std::move(g));
}

}  // namespace geo::sync::detail
