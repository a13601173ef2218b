// DTS's reduce-scatter exchange (sync.exchange; dts_impl.h;
// docs/algorithms.md, "Reduce-scatter"): shards, their owners' means, and a
// change of exchange for rounds already closed.

#include "worker/sync/dts_impl.h"

namespace geo::sync::detail {

void Dts::reexchange(const Schedule& e) {
  const bool toShards = e.exchange == Exchange::kReduceScatter;
  for (Pending& p : pending_) {
    if (p.round < e.round || p.sharded == toShards) continue;
    if (!toShards) {
      p.sharded = false;
      p.owesWhole = p.bytes != nullptr && !p.sentWhole;
      stats_.reexchanged();
      continue;
    }
    if (p.anyEarly() || earlyWork_) {
      logger()->warn(
          "dts: round {} was closed before the exchange {} from round {} was heard, and a "
          "contribution to it applied early: it completes as all-gather here, and the peers "
          "wait for this worker's shard until the round's time-out",
          p.round, exchangeName(e.exchange), e.round);
      continue;
    }
    p.sharded = true;
    p.shardIn.assign(group_.size(), std::nullopt);
    p.reducedIn.assign(group_.size(), std::nullopt);
    p.relayedIn.assign(group_.size(), std::nullopt);
    p.sentWhole = p.bytes != nullptr;
    stats_.reexchanged();
  }
}

std::vector<size_t> Dts::lostShards(const Pending& p) const {
  std::vector<size_t> lost;
  for (size_t s = 0; s < group_.size(); ++s) {
    const auto [lo, hi] = shard(s);
    if (s != group_.self && lo < hi && heldMean(p, s) == nullptr && !owns(s, p.round)) {
      lost.push_back(s);
    }
  }
  return lost;
}

Status Dts::sendContribution(Pending& p, const std::vector<uint32_t>& to, bool count) {
  if (!p.sharded) {
    if (count) {
      stats_.encoded(static_cast<uint64_t>(codec_->numel()) * 4, p.bytes->size(), to.size());
    }
    return sendUpdate(to, p.round, p.sendStep, p.bytes);
  }
  for (uint32_t r : to) {
    const auto s = group_.indexOf(r);
    if (!s) continue;
    const auto [lo, hi] = shard(*s);
    if (lo == hi) continue;
    auto bytes =
        std::make_shared<const std::vector<std::byte>>(codec_->rangeEncoding(*p.bytes, lo, hi));
    if (count) stats_.encoded(static_cast<uint64_t>(hi - lo) * 4, bytes->size(), 1);
    GEO_RETURN_IF_ERROR(sendTo({r}, MessageKind::kShard, p.round, p.sendStep, codec_->id(),
                               static_cast<uint64_t>(hi - lo), std::move(bytes)));
  }
  if (p.sentWhole) return {};  // every peer has the whole: every part
  for (const size_t s : lostShards(p)) {
    GEO_RETURN_IF_ERROR(sendParts(p.round, p.sendStep, *p.bytes, p.partTo, s, to));
  }
  return {};
}

// A part's payload: the shard's bounds [lo, hi) as two little-endian u64,
// then the values' encoding in the round's codec (rangeEncoding, the
// bytes a kShard of that shard carries). The frame says kRaw: the bounds
// make it no codec's exact size.
namespace {
constexpr size_t kPartBoundsBytes = 16;

// A part's or a relayed mean's payload: [lo, hi), then `values`.
std::shared_ptr<const std::vector<std::byte>> withBounds(int64_t lo, int64_t hi,
                                                         std::span<const std::byte> values) {
  auto payload = std::make_shared<std::vector<std::byte>>(kPartBoundsBytes + values.size());
  for (size_t k = 0; k < 8; ++k) {
    (*payload)[k] = static_cast<std::byte>(static_cast<uint64_t>(lo) >> (8 * k));
    (*payload)[8 + k] = static_cast<std::byte>(static_cast<uint64_t>(hi) >> (8 * k));
  }
  std::copy(values.begin(), values.end(), payload->begin() + kPartBoundsBytes);
  return payload;
}
}  // namespace

Status Dts::sendParts(uint64_t round, int64_t sendStep, const std::vector<std::byte>& bytes,
                      std::vector<std::vector<bool>>& partTo, size_t s,
                      const std::vector<uint32_t>& to) {
  const auto [lo, hi] = shard(s);
  if (lo == hi) return {};
  std::vector<uint32_t> dest;
  for (uint32_t r : to) {
    const auto j = group_.indexOf(r);
    if (j && *j != group_.self && *j != s && markSent(partTo, *j, s)) dest.push_back(r);
  }
  if (dest.empty()) return {};
  const std::vector<std::byte> part = codec_->rangeEncoding(bytes, lo, hi);
  stats_.encoded(static_cast<uint64_t>(hi - lo) * 4, part.size(), dest.size());
  auto payload = withBounds(lo, hi, part);
  const auto size = static_cast<uint64_t>(payload->size());
  return sendTo(dest, MessageKind::kPart, round, sendStep, CodecId::kRaw, size, std::move(payload));
}

std::span<const std::byte> Dts::partValues(const Message& m) {
  return m.payload.bytes().subspan(kPartBoundsBytes);
}

std::span<const std::byte> Dts::meanValues(const Message& m) {
  return m.header.kind == MessageKind::kRelayed ? partValues(m) : m.payload.bytes();
}

std::optional<size_t> Dts::readBounds(size_t j, uint64_t round, const Message& m,
                                      const char* what) {
  const std::span<const std::byte> bytes = m.payload.bytes();
  const auto refuse = [&](const char* reason, const std::string& why) -> std::optional<size_t> {
    reject(group_.ranks[j], fmt::format("{} of a lost owner's shard for round {}", what, round),
           reason, dataLoss(why));
    return std::nullopt;
  };
  if (bytes.size() < kPartBoundsBytes) {
    return refuse("size", fmt::format("{} bytes cannot hold a shard's bounds ({} bytes)",
                                      bytes.size(), kPartBoundsBytes));
  }
  uint64_t bounds[2] = {0, 0};
  for (size_t k = 0; k < 8; ++k) {
    bounds[0] |= static_cast<uint64_t>(bytes[k]) << (8 * k);
    bounds[1] |= static_cast<uint64_t>(bytes[8 + k]) << (8 * k);
  }
  for (size_t s = 0; s < group_.size(); ++s) {
    const auto [lo, hi] = shard(s);
    if (lo < hi && static_cast<uint64_t>(lo) == bounds[0] &&
        static_cast<uint64_t>(hi) == bounds[1]) {
      // Its owner makes a shard's mean from kShard: no part of it goes to
      // the owner, and none is a sender's own shard (whose mean it sends
      // as kReduced).
      if (s == j || s == group_.self) break;
      return s;
    }
  }
  return refuse("size", fmt::format("values [{}, {}) are no shard here of a member other than "
                                    "the sender and this worker",
                                    bounds[0], bounds[1]));
}

Status Dts::relayMean(Answerable& a, size_t s, size_t j) {
  const Message* mean = heldMean(a, s);
  if (mean == nullptr || j == group_.self || j == s) return {};
  if (!markSent(a.meanTo, j, s)) return {};
  const auto [lo, hi] = shard(s);
  auto payload = withBounds(lo, hi, meanValues(*mean));
  stats_.encoded(static_cast<uint64_t>(hi - lo) * 4, payload->size() - kPartBoundsBytes, 1);
  logger()->debug(
      "dts: {} lost {}, the owner of a shard of round {}, before its mean came: this worker "
      "relays the mean it holds",
      topology_.describe(group_.ranks[j]), topology_.describe(group_.ranks[s]), a.round);
  const auto size = static_cast<uint64_t>(payload->size());
  return sendTo({group_.ranks[j]}, MessageKind::kRelayed, a.round,
                static_cast<int64_t>(mean->header.step), CodecId::kRaw, size, std::move(payload));
}

void Dts::takeRelayed(size_t j, Pending& p) {
  if (j == group_.self) return;
  while (true) {
    auto m = transport_->receive(MessageKind::kRelayed, p.round, group_.ranks[j],
                                 std::chrono::milliseconds(0));
    if (!m.ok()) return;
    membership_.delivered(group_.ranks[j], p.round);
    const std::optional<size_t> s = readBounds(j, p.round, *m, "the mean it relayed");
    if (!s || heldMean(p, *s) != nullptr) continue;
    logger()->debug("dts: {} relayed the mean of {}'s shard of round {}",
                    topology_.describe(group_.ranks[j]), topology_.describe(group_.ranks[*s]),
                    p.round);
    p.relayedIn[*s] = std::move(*m);
  }
}

Status Dts::takeParts(size_t j, Answerable& a,
                      std::vector<std::vector<std::optional<Message>>>* into) {
  if (j == group_.self) return {};
  while (true) {
    auto m = transport_->receive(MessageKind::kPart, a.round, group_.ranks[j],
                                 std::chrono::milliseconds(0));
    if (!m.ok()) return {};
    membership_.delivered(group_.ranks[j], a.round);
    const std::optional<size_t> shard = readBounds(j, a.round, *m, "its part");
    if (!shard) continue;
    const size_t s = *shard;
    // The peer lost s's owner. This worker, if it holds that owner's
    // mean, relays it; if it has that owner still, its part went to the
    // owner alone, and the peer needs it too.
    if (a.bytes != nullptr && !membership_.suspected(group_.ranks[j])) {
      if (heldMean(a, s) != nullptr) {
        GEO_RETURN_IF_ERROR(relayMean(a, s, j));
      } else {
        if (!partSent(a.partTo, j, s)) {
          logger()->debug(
              "dts: {} sent its part of {}'s shard of round {}: this worker's goes to it too",
              topology_.describe(group_.ranks[j]), topology_.describe(group_.ranks[s]), a.round);
        }
        GEO_RETURN_IF_ERROR(
            sendParts(a.round, a.sendStep, *a.bytes, a.partTo, s, {group_.ranks[j]}));
      }
    }
    if (into == nullptr) continue;
    into->resize(group_.size());
    (*into)[j].resize(group_.size());
    if (!(*into)[j][s]) (*into)[j][s] = std::move(*m);
  }
}

Status Dts::sendOwnReduced(const Pending& p, const std::vector<uint32_t>& to) {
  if (!p.sharded || p.ownReduced == nullptr || p.ownReduced->empty() || to.empty()) return {};
  const auto [lo, hi] = shard(group_.self);
  return sendTo(to, MessageKind::kReduced, p.round, p.sendStep, codec_->id(),
                static_cast<uint64_t>(hi - lo), p.ownReduced);
}

Status Dts::exchangeShards() {
  for (Pending& p : pending_) {
    if (!p.sharded && p.owesWhole && p.bytes != nullptr) {
      p.owesWhole = false;
      GEO_RETURN_IF_ERROR(sendUpdate(presentPeers(), p.round, p.sendStep, p.bytes));
    }
    if (!p.sharded || p.bytes == nullptr) continue;
    // A peer's part of a shard: it lost that owner, which this worker may
    // still have, and needs this worker's part too (it went to the owner
    // only).
    for (size_t j = 0; j < group_.size(); ++j) {
      takeRelayed(j, p);
      GEO_RETURN_IF_ERROR(takeParts(j, p, &p.partIn));
    }
    // A mean that came after this worker's part of its shard went to a
    // peer (the owner was lost here, or the peer asked before it came):
    // the peer gets the mean too, so that it applies it as this worker
    // will, if it has not completed the round yet.
    for (size_t s = 0; s < group_.size() && !p.partTo.empty(); ++s) {
      if (heldMean(p, s) == nullptr) continue;
      for (size_t j = 0; j < group_.size(); ++j) {
        if (partSent(p.partTo, j, s)) GEO_RETURN_IF_ERROR(relayMean(p, s, j));
      }
    }
    GEO_RETURN_IF_ERROR(reduceOwn(p));
    const std::vector<size_t> lost = lostShards(p);
    if (!lost.empty() && !p.ownerLostUntil) {
      holdLostOwnerWait(p, clock().now() + options_.timeout);
    }
    if (p.sentWhole || lost.empty()) continue;  // no owner lost, or every peer has the whole
    const auto to = presentPeers();
    const auto sentAny = [&](size_t s) {
      for (size_t j = 0; j < group_.size(); ++j) {
        if (partSent(p.partTo, j, s)) return true;
      }
      return false;
    };
    for (const size_t s : lost) {
      const bool before = sentAny(s);
      GEO_RETURN_IF_ERROR(sendParts(p.round, p.sendStep, *p.bytes, p.partTo, s, to));
      if (before || !sentAny(s)) continue;
      const auto [lo, hi] = shard(s);
      logger()->info(
          "dts: the owner of a shard of round {}, {}, is gone (suspected, finished or "
          "rejoining): this worker's part of it ({} values) goes to every other peer, and each "
          "averages it",
          p.round, topology_.describe(group_.ranks[s]), hi - lo);
    }
  }
  // The same for the rounds completed here last: the peer's part may come
  // after (it found the owner lost at its suspicion, when this worker
  // had that owner's mean already). A sharded round keeps no late entry,
  // so nothing else reads those parts: each is taken from the inbox and
  // answered.
  for (Answerable& a : answerable_) {
    for (size_t j = 0; j < group_.size(); ++j) {
      GEO_RETURN_IF_ERROR(takeParts(j, a, nullptr));
    }
  }
  return {};
}

std::chrono::milliseconds Dts::lostOwnerWait(const Pending& p) const {
  std::chrono::milliseconds timeout{0};
  for (size_t i = 0; i < group_.size(); ++i) {
    if (i != group_.self) timeout = std::max(timeout, membership_.peerTimeout(group_.ranks[i]));
  }
  double rtt = 0;
  for (const auto& c : transport_->peerCounters()) {
    if (group_.indexOf(c.peer) && !membership_.suspected(c.peer)) {
      rtt = std::max(rtt, c.minRttSeconds);
    }
  }
  if (rtt <= 0) return timeout;
  // Our part to each of the others and theirs back, each through an
  // uplink that carries as much to every other peer.
  const double rate = uplink_.rate();
  const size_t n = group_.size();
  double transfer = 0;
  if (rate > 0 && p.bytes != nullptr && n > 2) {
    transfer = 2.0 * static_cast<double>(n - 2) * static_cast<double>(p.bytes->size() / n) / rate;
  }
  const auto wait = std::chrono::milliseconds(std::llround((2 * rtt + transfer + 0.25) * 1e3));
  return std::min(timeout, wait);
}

void Dts::holdLostOwnerWait(Pending& p, geo::Clock::TimePoint deadline) {
  const auto now = clock().now();
  if (p.ownerLostUntil && now < *p.ownerLostUntil) return;
  const bool first = !p.ownerLostUntil;
  // A 64th of one part (a shard's values of a contribution).
  const uint64_t enough = std::max<uint64_t>(
      uint64_t{1} << 16,
      p.bytes != nullptr ? p.bytes->size() / 64 / std::max<size_t>(1, group_.size()) : 0);
  const std::vector<size_t> lost = lostShards(p);
  p.receivedAtLostWait.resize(group_.size(), 0);
  bool arriving = false;
  for (const transport::PeerCounters& c : transport_->peerCounters()) {
    const auto j = group_.indexOf(c.peer);
    if (!j || *j == group_.self) continue;
    const uint64_t before = std::exchange(p.receivedAtLostWait[*j], c.bytesReceived);
    const bool missing = std::any_of(lost.begin(), lost.end(),
                                     [&](size_t s) { return s != *j && !p.hasPart(*j, s); });
    if (first || !missing || !owns(*j, p.round) || membership_.suspected(c.peer)) continue;
    if (c.bytesReceived - before >= enough) {
      arriving = true;
      logger()->debug(
          "dts: round {}: the part of a lost owner's shard from {} is still arriving ({:.1f} MB "
          "from it since the last look); waiting on for it",
          p.round, topology_.describe(c.peer), static_cast<double>(c.bytesReceived - before) / 1e6);
    }
  }
  if (first || arriving) p.ownerLostUntil = std::min(deadline, now + lostOwnerWait(p));
}

Status Dts::peerShard(const Pending& p, size_t j, int64_t lo, torch::Tensor& out,
                      std::string& reason) {
  const int64_t hi = lo + out.numel();
  if (p.sharded && p.shardIn[j] && shard(group_.self) == std::pair{lo, hi}) {
    return codec_->decodeRangeChecked(p.shardIn[j]->payload.bytes(), lo, out, reason);
  }
  if (!p.got[j] && j < p.partIn.size()) {
    for (size_t s = 0; s < p.partIn[j].size(); ++s) {
      if (p.partIn[j][s] && shard(s) == std::pair{lo, hi}) {
        return codec_->decodeRangeChecked(partValues(*p.partIn[j][s]), lo, out, reason);
      }
    }
  }
  if (!p.got[j]) {
    reason = "size";
    return dataLoss(fmt::format("no part of values [{}, {}) came", lo, hi));
  }
  return wholeRange(p.got[j]->payload.bytes(), lo, out, reason);
}

Status Dts::wholeRange(std::span<const std::byte> whole, int64_t lo, torch::Tensor& out,
                       std::string& reason) {
  std::vector<std::byte> part;
  try {
    part = codec_->rangeEncoding(whole, lo, lo + out.numel());
  } catch (const std::exception& e) {
    reason = "size";
    return dataLoss(e.what());
  }
  return codec_->decodeRangeChecked(part, lo, out, reason);
}

bool Dts::weightedMean(const std::vector<torch::Tensor>& q, torch::Tensor& mean) const {
  double total = 0;
  for (size_t j = 0; j < group_.size(); ++j) {
    if (q[j].defined()) total += group_.weights[j];
  }
  if (total == 0) return false;
  mean.zero_();
  for (size_t j = 0; j < group_.size(); ++j) {
    if (q[j].defined()) mean.add_(q[j], static_cast<float>(group_.weights[j] / total));
  }
  return true;
}

std::vector<bool> Dts::shardMean(const Pending& p, const std::vector<size_t>& from, int64_t lo,
                                 torch::Tensor& mean, const char* what) {
  const int64_t n = mean.numel();
  std::vector<torch::Tensor> q(group_.size());
  std::vector<bool> used(group_.size(), false);
  for (size_t j = 0; j < group_.size(); ++j) {
    const bool self = j == group_.self;
    if (!self && std::find(from.begin(), from.end(), j) == from.end()) continue;
    q[j] = torch::zeros({n}, mean.options());
    if (self) {
      codec_->decodeAccumulateRange(*p.bytes, 1.0f, lo, q[j]);
    } else {
      std::string reason;
      if (const Status ok = peerShard(p, j, lo, q[j], reason); !ok.ok()) {
        reject(group_.ranks[j], fmt::format("{} for round {}", what, p.round), reason, ok);
        q[j] = torch::Tensor();
        continue;
      }
    }
    used[j] = true;
  }
  weightedMean(q, mean);
  return used;
}

Status Dts::reduceOwn(Pending& p) {
  if (p.ownReduced != nullptr) return {};
  const size_t self = group_.self;
  std::vector<size_t> from;
  for (size_t j = 0; j < group_.size(); ++j) {
    if (j == self) continue;
    if (p.shardIn[j] || p.got[j]) {
      from.push_back(j);
    } else if (awaited(j, p.round)) {
      return {};  // not yet
    }
  }
  const auto [lo, hi] = shard(self);
  if (lo == hi) {
    p.ownReduced = std::make_shared<const std::vector<std::byte>>();
    return {};
  }
  const auto t0 = clock().now();
  torch::Tensor mean = torch::empty({hi - lo}, base_.options());
  const std::vector<bool> used = shardMean(p, from, lo, mean, "its part of the shard");
  // A contribution missing from this worker's shard counts as missing,
  // once a round, as complete() counts one under all-gather.
  for (size_t j = 0; j < group_.size(); ++j) {
    if (j != self && !used[j]) stats_.missed();
  }
  p.ownReduced = std::make_shared<const std::vector<std::byte>>(
      codec_->encodeRange(mean, lo, options_.seed, mixStream(3, topology_.rank(), p.round)));
  const auto to = presentPeers();
  stats_.encoded(static_cast<uint64_t>(hi - lo) * 4, p.ownReduced->size(), to.size());
  stats_.coded(since(t0));
  return sendOwnReduced(p, to);
}

bool Dts::shardReady(const Pending& p, size_t s) const {
  const auto [lo, hi] = shard(s);
  if (lo == hi) return true;
  if (s == group_.self) return p.ownReduced != nullptr;
  if (heldMean(p, s) != nullptr) return true;
  if (owns(s, p.round)) return false;
  if (p.ownerLostUntil && clock().now() >= *p.ownerLostUntil) return true;
  for (size_t j = 0; j < group_.size(); ++j) {
    if (j != group_.self && j != s && !p.hasPart(j, s) && owns(j, p.round)) return false;
  }
  return true;
}

Status Dts::completeSharded(Pending& p, int64_t t, train::FlatParameters& flat, bool* deferred) {
  const auto t0 = clock().now();
  const auto deadline = t0 + options_.timeout;
  const auto allReady = [&] {
    for (size_t s = 0; s < group_.size(); ++s) {
      if (!shardReady(p, s)) return false;
    }
    return true;
  };
  while (true) {
    // Read before the polls: what comes after them ends the wait below.
    const uint64_t seen = transport_->arrivals();
    GEO_RETURN_IF_ERROR(serveAndResend(t, flat));
    GEO_RETURN_IF_ERROR(pollArrivals());
    if (p.ownerLostUntil) holdLostOwnerWait(p, deadline);
    if (allReady()) break;
    if (deferUntilDue(p, t, t0, deferred)) return {};
    if (clock().now() >= deadline) {
      for (size_t j = 0; j < group_.size(); ++j) {
        if (j == group_.self) continue;
        const auto [lo, hi] = shard(j);
        const bool owes =
            (lo < hi && heldMean(p, j) == nullptr && owns(j, p.round)) ||
            (p.ownReduced == nullptr && !p.shardIn[j] && !p.got[j] && awaited(j, p.round));
        if (!owes) continue;
        membership_.giveUp(group_.ranks[j]);
        logger()->warn(
            "dts: round {} still lacks the part or the shard's mean of {} after {:.3g} s "
            "although it is heard (a straggler?); going on without it",
            p.round, topology_.describe(group_.ranks[j]),
            std::chrono::duration<double>(options_.timeout).count());
      }
      GEO_RETURN_IF_ERROR(pollArrivals());
      break;
    }
    // Parts, means and relayed means of this and the other rounds in
    // flight all count: pollArrivals takes each as it comes. Until one
    // does, the core is left to the workers that compute (polling every
    // 2 ms, 16 regions' waits took a fifth of each worker's CPU on shared
    // cores). The membership's time-outs are looked at every kPoll.
    transport_->awaitArrival(seen, kPoll);
  }
  if (const double waited = since(t0); waited >= 0.05) {
    logger()->debug(
        "dts: waited {:.0f} ms at step {} for the shards of round {} (sent at step "
        "{}, D = {})",
        waited * 1e3, t, p.round, p.sendStep, delay_);
  }
  noteWait(since(t0));
  const auto tDecode = clock().now();
  std::vector<double> lags(group_.size(), std::numeric_limits<double>::quiet_NaN());
  for (size_t s = 0; s < group_.size(); ++s) {
    const auto [lo, hi] = shard(s);
    const int64_t n = hi - lo;
    if (n == 0) continue;
    torch::Tensor mean = sliceBuffer(1, n, flat.values);
    bool have = false;
    if (s == group_.self && p.ownReduced != nullptr) {
      std::string reason;
      have = codec_->decodeRangeChecked(*p.ownReduced, lo, mean, reason).ok();
    } else if (s != group_.self) {
      // The owner's mean as it sent it, else as a peer relayed it (the
      // owner was lost here before it came: the bytes that peer applied).
      for (const std::optional<Message>* held : {&p.reducedIn[s], &p.relayedIn[s]}) {
        if (have || !*held) continue;
        const Message& m = **held;
        const bool relayed = m.header.kind == MessageKind::kRelayed;
        std::string reason;
        const Status ok = codec_->decodeRangeChecked(meanValues(m), lo, mean, reason);
        if (!ok.ok()) {
          reject(m.header.sender,
                 relayed ? fmt::format("the mean of {}'s shard it relayed for round {}",
                                       topology_.describe(group_.ranks[s]), p.round)
                         : fmt::format("its shard's mean for round {}", p.round),
                 reason, ok);
          continue;
        }
        have = true;
        // The owner's close: how old the round is as it is applied here.
        p.applied(t - static_cast<int64_t>(m.header.step));
        stats_.applied(t - static_cast<int64_t>(m.header.step));
        if (!relayed) continue;
        stats_.relayedMean();
        logger()->info(
            "dts: round {}: {}'s mean of its shard applied as {} relayed it ({} was lost here "
            "before its mean came, which had reached that peer)",
            p.round, topology_.describe(group_.ranks[s]), topology_.describe(m.header.sender),
            topology_.describe(group_.ranks[s]));
      }
    }
    if (!have) {
      // Averaged here from the parts that came.
      std::vector<size_t> from;
      for (size_t j = 0; j < group_.size(); ++j) {
        if (j != group_.self && p.hasPart(j, s)) from.push_back(j);
      }
      shardMean(p, from, lo, mean, "the update");
      if (s != group_.self && logger()->should_log(spdlog::level::debug)) {
        std::string without;
        for (size_t j = 0; j < group_.size(); ++j) {
          if (j != group_.self && j != s && !p.hasPart(j, s)) {
            without += " " + topology_.describe(group_.ranks[j]);
          }
        }
        logger()->debug("dts: round {}: {}'s shard averaged here from {} peers' parts{}{}", p.round,
                        topology_.describe(group_.ranks[s]), from.size(),
                        without.empty() ? "" : ", without", without);
      }
    }
    torch::Tensor x = flat.values.narrow(0, lo, n);
    if (p.start.defined()) {
      x.copy_(p.start.narrow(0, lo, n) - mean);
      base_.narrow(0, lo, n).copy_(x);
    } else {
      torch::Tensor correction = sliceBuffer(0, n, flat.values).zero_();
      codec_->decodeAccumulateRange(*p.bytes, 1.0f, lo, correction);
      correction.sub_(mean);
      x.add_(correction);
      base_.narrow(0, lo, n).add_(correction);
    }
  }
  // The lags reported are each peer's part of this worker's shard (or
  // its whole contribution): one hop, as under all-gather, so that both
  // ends' lags of a pair measure its link (LinkLedger); chooseDelay()
  // covers the two hops a round takes.
  for (size_t j = 0; j < group_.size(); ++j) {
    if (j == group_.self) continue;
    const std::optional<Message>& m = p.shardIn[j] ? p.shardIn[j] : p.got[j];
    if (m) lags[j] = std::chrono::duration<double>(m->received - p.sentAt).count();
  }
  stats_.coded(since(tDecode));
  return completed(p, std::move(lags));
}

// A joiner's round of reduce-scatter, the job having completed it while
// the state crossed (catchUp). Each peer applied, shard by shard, the
// owner's mean where the owner took part, and where it did not (this
// joiner owns a shard and was joining) the mean of the parts it got, its
// own among them, in rank order (shardMean): every peer sent its part of
// such a shard to every other peer but the owner (exchangeShards), and to
// this joiner, present but not taking part, its part of the joiner's own
// shard as kShard. Those are the same bytes (one rangeEncoding of the
// same contribution), summed here in the same order.
StatusOr<bool> Dts::catchUpSharded(uint64_t r, train::FlatParameters& flat,
                                   const std::vector<bool>& from,
                                   const std::vector<bool>& reduced) {
  const auto take = [&](MessageKind kind, size_t j) -> std::optional<Message> {
    auto m = transport_->receive(kind, r, group_.ranks[j], std::chrono::milliseconds(0));
    if (!m.ok()) return std::nullopt;  // none sent to this worker, or taken already
    membership_.delivered(group_.ranks[j], r);
    return std::move(*m);
  };
  std::vector<std::optional<Message>> whole(group_.size()), own(group_.size()), mean(group_.size());
  std::vector<std::vector<std::optional<Message>>> parts;
  Answerable none;  // nothing of ours goes: no contribution to r
  none.round = r;
  for (size_t j = 0; j < group_.size(); ++j) {
    if (j == group_.self) continue;
    if (from[j]) {
      whole[j] = take(MessageKind::kUpdate, j);
      own[j] = take(MessageKind::kShard, j);
      GEO_RETURN_IF_ERROR(takeParts(j, none, &parts));
    }
    if (reduced[j]) mean[j] = take(MessageKind::kReduced, j);
  }
  // Peer j's part of shard s [lo, lo + out.numel()), decoded into `out`:
  // false (refused, or none came) leaves it out.
  const auto partOf = [&](size_t j, size_t s, int64_t lo, torch::Tensor& out) {
    std::string reason;
    Status ok = dataLoss("no part came");
    if (s == group_.self && own[j]) {
      ok = codec_->decodeRangeChecked(own[j]->payload.bytes(), lo, out, reason);
    } else if (j < parts.size() && s < parts[j].size() && parts[j][s]) {
      ok = codec_->decodeRangeChecked(partValues(*parts[j][s]), lo, out, reason);
    } else if (whole[j]) {
      ok = wholeRange(whole[j]->payload.bytes(), lo, out, reason);
    } else {
      return false;
    }
    if (!ok.ok()) reject(group_.ranks[j], fmt::format("the update for round {}", r), reason, ok);
    return ok.ok();
  };
  bool any = false;
  for (size_t s = 0; s < group_.size(); ++s) {
    const auto [lo, hi] = shard(s);
    const int64_t n = hi - lo;
    if (n == 0) continue;
    torch::Tensor m = sliceBuffer(1, n, flat.values);
    bool have = false;
    if (mean[s]) {
      std::string reason;
      const Status ok = codec_->decodeRangeChecked(mean[s]->payload.bytes(), lo, m, reason);
      have = ok.ok();
      if (!have)
        reject(group_.ranks[s], fmt::format("its shard's mean for round {}", r), reason, ok);
    }
    if (!have) {
      std::vector<torch::Tensor> q(group_.size());
      for (size_t j = 0; j < group_.size(); ++j) {
        if (j == group_.self || !from[j]) continue;
        q[j] = torch::empty({n}, m.options());
        if (!partOf(j, s, lo, q[j])) q[j] = torch::Tensor();
      }
      // No contribution to this shard: nothing to take off.
      if (!weightedMean(q, m)) continue;
    }
    flat.values.narrow(0, lo, n).sub_(m);
    base_.narrow(0, lo, n).sub_(m);
    any = true;
  }
  if (any) {
    modified_ = true;
    disturbed();
  }
  return any;
}

}  // namespace geo::sync::detail
