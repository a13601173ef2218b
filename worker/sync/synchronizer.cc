// Topology, options, the shared pieces of worker/sync/internal.h, the
// allreduce baseline, the hierarchical wrapper and the factory.

#include "worker/sync/synchronizer.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <map>
#include <numeric>
#include <thread>
#include <utility>

#include "common/enforce.h"
#include "common/logging.h"
#include "common/sync_algorithms.h"
#include "worker/sync/internal.h"

namespace geo::sync {

using transport::CodecId;
using transport::Message;
using transport::MessageKind;

// ---- Topology ----------------------------------------------------------------------

StatusOr<Topology> Topology::make(std::vector<std::string> regions, uint32_t rank) {
  if (regions.empty()) return invalidArgument("topology: no ranks");
  if (rank >= regions.size()) {
    return invalidArgument(
        fmt::format("topology: rank {} is out of range (world size {})", rank, regions.size()));
  }
  for (size_t r = 0; r < regions.size(); ++r) {
    if (regions[r].empty()) {
      return invalidArgument(fmt::format("topology: rank {} has an empty region name", r));
    }
  }
  Topology t;
  t.regions_ = std::move(regions);
  t.rank_ = rank;
  return t;
}

uint32_t Topology::leaderOf(uint32_t r) const {
  const std::string& region = regions_.at(r);
  for (uint32_t i = 0; i < regions_.size(); ++i) {
    if (regions_[i] == region) return i;
  }
  return r;  // unreachable: r itself is in its region
}

std::vector<uint32_t> Topology::regionMembers(uint32_t r) const {
  std::vector<uint32_t> members;
  for (uint32_t i = 0; i < regions_.size(); ++i) {
    if (regions_[i] == regions_.at(r)) members.push_back(i);
  }
  return members;
}

std::vector<uint32_t> Topology::leaders() const {
  std::vector<uint32_t> result;
  for (uint32_t i = 0; i < regions_.size(); ++i) {
    if (leaderOf(i) == i) result.push_back(i);
  }
  return result;
}

std::string Topology::describe(uint32_t r) const {
  return fmt::format("rank {} ({})", r, r < regions_.size() ? regions_[r] : "?");
}

Status validateSyncOptions(const SyncOptions& o) {
  const auto bad = [](std::string_view field, const auto& value, std::string_view allowed) {
    return invalidArgument(
        fmt::format("sync options: {} {} is not allowed (allowed: {})", field, value, allowed));
  };
  if (findSyncAlgorithm(o.algorithm) == nullptr) {
    return bad("algorithm", fmt::format("'{}'", o.algorithm),
               fmt::format("{}", fmt::join(syncAlgorithmNames(), ", ")));
  }
  if (o.period < 1) return bad("period", o.period, ">= 1");
  if (o.delay && *o.delay < 0) return bad("delay", *o.delay, ">= 0, or nullopt for auto");
  if (o.swarmH < 1) return bad("swarmH", o.swarmH, ">= 1");
  if (o.timeout.count() <= 0) return bad("timeout", fmt::format("{} ms", o.timeout.count()), "> 0");
  if (o.maxAutoDelay < 0) return bad("maxAutoDelay", o.maxAutoDelay, ">= 0");
  if (o.maxAutoPeriod < 1) return bad("maxAutoPeriod", o.maxAutoPeriod, ">= 1");
  // The codecs check their own specs, in their own terms.
  GEO_RETURN_IF_ERROR(codec::makeCodec(o.codec).status().withContext("sync options: codec"));
  GEO_RETURN_IF_ERROR(
      codec::makeCodec({.name = o.lanCodec}).status().withContext("sync options: lanCodec"));
  return {};
}

namespace detail {

// ---- Helpers -----------------------------------------------------------------------

double secondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::shared_ptr<std::vector<std::byte>> tensorBytes(const torch::Tensor& t) {
  GEO_ENFORCE(t.is_contiguous() && t.scalar_type() == torch::kFloat32,
              "sync: expected a contiguous fp32 tensor");
  // A device tensor (a GPU worker's model) is copied to the host first.
  const torch::Tensor host = t.device().is_cpu() ? t : t.to(torch::kCPU);
  auto bytes = std::make_shared<std::vector<std::byte>>(static_cast<size_t>(host.numel()) * 4);
  std::memcpy(bytes->data(), host.data_ptr<float>(), bytes->size());
  return bytes;
}

transport::Payload modelPayload(const torch::Tensor& t) {
  GEO_ENFORCE(t.is_contiguous() && t.scalar_type() == torch::kFloat32,
              "sync: expected a contiguous fp32 tensor");
  if (!t.device().is_cpu()) {
    auto bytes = tensorBytes(t);
    const std::span<const std::byte> view(bytes->data(), bytes->size());
    return transport::Payload(std::move(bytes), view);
  }
  // The payload holds the tensor (and so its storage) until the transport
  // lets it go, once its bytes are on the wire.
  auto owner = std::make_shared<const torch::Tensor>(t);
  const std::span<const std::byte> view(static_cast<const std::byte*>(t.data_ptr()),
                                        static_cast<size_t>(t.numel()) * 4);
  return transport::Payload(std::move(owner), view);
}

ParityFingerprint tensorFingerprint(const torch::Tensor& t, bool onDevice) {
  torch::NoGradGuard noGrad;
  const torch::Tensor flat = t.reshape({-1});
  if (t.device().is_cpu() && !onDevice) {
    const torch::Tensor c = flat.to(torch::kFloat32).contiguous();
    return fingerprintOf(c.data_ptr<float>(), static_cast<size_t>(c.numel()));
  }
  // parityClassOf() in int64 tensor ops: the products wrap modulo 2^64 as
  // the uint64 ones do, and a logical right shift is the arithmetic one
  // masked. Chunks of 2 Mi values keep the temporaries at a few 16 MB.
  constexpr int64_t kChunk = int64_t{1} << 21;
  const auto asInt = [](uint64_t v) { return static_cast<int64_t>(v); };
  const auto shiftRight = [](const torch::Tensor& z, int s) {
    return torch::bitwise_right_shift(z, s).bitwise_and_((int64_t{1} << (64 - s)) - 1);
  };
  const auto ints = flat.options().dtype(torch::kInt64);
  // 16 class sums, then Σ v², on the device until the end.
  torch::Tensor sums = torch::zeros({static_cast<int64_t>(kParityClasses) + 1},
                                    flat.options().dtype(torch::kFloat64));
  const int64_t n = flat.numel();
  for (int64_t a = 0; a < n; a += kChunk) {
    const int64_t c = std::min(kChunk, n - a);
    torch::Tensor z = torch::arange(a, a + c, ints).add_(asInt(kParityMixAdd));
    z = z.bitwise_xor(shiftRight(z, 30)).mul_(asInt(kParityMixMul1));
    z = z.bitwise_xor(shiftRight(z, 27)).mul_(asInt(kParityMixMul2));
    z = z.bitwise_xor(shiftRight(z, 31)).bitwise_and_(static_cast<int64_t>(kParityClasses) - 1);
    const torch::Tensor v = flat.narrow(0, a, c).to(torch::kFloat64);
    sums.narrow(0, 0, static_cast<int64_t>(kParityClasses)).index_add_(0, z, v);
    sums.narrow(0, static_cast<int64_t>(kParityClasses), 1).add_(v.square().sum());
  }
  const torch::Tensor host = sums.to(torch::kCPU);
  const double* s = host.data_ptr<double>();
  std::array<double, kParityClasses> classes{};
  std::copy(s, s + kParityClasses, classes.begin());
  return fingerprintOfClasses(classes, s[kParityClasses]);
}

Status sendBuffer(transport::Transport& transport, const Topology& topology,
                  const std::vector<uint32_t>& to, MessageKind kind,
                  const transport::SendMeta& meta,
                  std::shared_ptr<const std::vector<std::byte>> bytes,
                  std::chrono::milliseconds timeout) {
  const std::span<const std::byte> view(bytes->data(), bytes->size());
  for (uint32_t peer : to) {
    const Status s = transport.send(peer, kind, meta, transport::Payload(bytes, view), timeout);
    if (!s.ok()) {
      return Status(s.code(), fmt::format("sending {} for round {} to {}: {}",
                                          transport::messageKindName(kind), meta.round,
                                          topology.describe(peer), s.message()));
    }
  }
  return {};
}

StatusOr<Message> receiveBounded(transport::Transport& transport, const Topology& topology,
                                 uint32_t peer, MessageKind kind, uint64_t round,
                                 std::chrono::milliseconds timeout, const std::string& what,
                                 StatsRecorder& stats) {
  const auto t0 = Clock::now();
  auto m = transport.receive(kind, round, peer, timeout);
  stats.waited(secondsSince(t0));
  if (m.ok()) return m;
  const double seconds = std::chrono::duration<double>(timeout).count();
  if (m.status().code() == StatusCode::kDeadlineExceeded) {
    return deadlineExceeded(fmt::format("no {} from {} within {:.3g} s; is that worker alive?",
                                        what, topology.describe(peer), seconds));
  }
  return Status(m.status().code(), fmt::format("no {} from {}: {}", what, topology.describe(peer),
                                               m.status().message()));
}

// ---- StatsRecorder --------------------------------------------------------------------

void StatsRecorder::applied(int64_t staleness) {
  std::lock_guard lock(mu_);
  staleness = std::max<int64_t>(staleness, 0);
  ++stats_.appliedUpdates;
  stats_.stalenessSum += static_cast<double>(staleness);
  stats_.stalenessMax = std::max(stats_.stalenessMax, staleness);
  const size_t last = stats_.stalenessCounts.size() - 1;
  ++stats_.stalenessCounts[std::min(static_cast<size_t>(staleness), last)];
}

void StatsRecorder::missed(uint64_t n) {
  std::lock_guard lock(mu_);
  stats_.missing += n;
}

void StatsRecorder::waited(double seconds) {
  std::lock_guard lock(mu_);
  stats_.waitSeconds += seconds;
}

void StatsRecorder::coded(double seconds, CodecWork work) {
  std::lock_guard lock(mu_);
  stats_.codecSeconds += seconds;
  if (work == CodecWork::kEncode) stats_.encodeSeconds += seconds;
}

void StatsRecorder::encoded(uint64_t payloadBytes, uint64_t encodedBytes, uint64_t destinations) {
  std::lock_guard lock(mu_);
  stats_.payloadBytes += payloadBytes * destinations;
  stats_.encodedBytes += encodedBytes * destinations;
}

void StatsRecorder::roundDone(double seconds) {
  std::lock_guard lock(mu_);
  ++stats_.rounds;
  stats_.roundSecondsSum += seconds;
  ++stats_.roundSecondsCount;
}

void StatsRecorder::setDelay(int64_t delay) {
  std::lock_guard lock(mu_);
  stats_.delay = delay;
}

void StatsRecorder::setLrScale(double scale) {
  std::lock_guard lock(mu_);
  stats_.lrScale = scale;
}

void StatsRecorder::setPeriod(int64_t period) {
  std::lock_guard lock(mu_);
  stats_.period = period;
}

void StatsRecorder::setLink(double seconds) {
  std::lock_guard lock(mu_);
  stats_.linkSeconds = seconds;
}

void StatsRecorder::setStepSeconds(double seconds) {
  std::lock_guard lock(mu_);
  stats_.stepSeconds = seconds;
}

SyncStats StatsRecorder::snapshot() const {
  std::lock_guard lock(mu_);
  return stats_;
}

void StatsRecorder::merge(const SyncStats& in) {
  std::lock_guard lock(mu_);
  stats_.delay = in.delay;
  stats_.linkSeconds = in.linkSeconds;
  stats_.stepSeconds = in.stepSeconds;
  stats_.period = in.period;
  stats_.rounds += in.rounds;
  stats_.appliedUpdates += in.appliedUpdates;
  stats_.missing += in.missing;
  stats_.stalenessSum += in.stalenessSum;
  stats_.stalenessMax = std::max(stats_.stalenessMax, in.stalenessMax);
  for (size_t i = 0; i < stats_.stalenessCounts.size() && i < in.stalenessCounts.size(); ++i) {
    stats_.stalenessCounts[i] += in.stalenessCounts[i];
  }
  stats_.payloadBytes += in.payloadBytes;
  stats_.encodedBytes += in.encodedBytes;
  stats_.waitSeconds += in.waitSeconds;
  stats_.codecSeconds += in.codecSeconds;
  stats_.encodeSeconds += in.encodeSeconds;
  stats_.roundSecondsSum += in.roundSecondsSum;
  stats_.roundSecondsCount += in.roundSecondsCount;
  stats_.lateApplied += in.lateApplied;
  stats_.lateDropped += in.lateDropped;
  stats_.parityChecks += in.parityChecks;
  stats_.parityMismatches += in.parityMismatches;
  stats_.parityRepairs += in.parityRepairs;
  for (const auto& r : in.rejected) {
    for (uint64_t i = 0; i < r.count; ++i) {
      bool found = false;
      for (auto& mine : stats_.rejected) {
        if (mine.peer == r.peer && mine.reason == r.reason) {
          ++mine.count;
          found = true;
          break;
        }
      }
      if (!found) stats_.rejected.push_back({r.peer, r.reason, 1});
    }
  }
}

void StatsRecorder::rejected(uint32_t peer, const std::string& reason) {
  std::lock_guard lock(mu_);
  for (auto& r : stats_.rejected) {
    if (r.peer == peer && r.reason == reason) {
      ++r.count;
      return;
    }
  }
  stats_.rejected.push_back({peer, reason, 1});
}

void StatsRecorder::late(bool applied) {
  std::lock_guard lock(mu_);
  ++(applied ? stats_.lateApplied : stats_.lateDropped);
}

void StatsRecorder::parity(uint64_t checks, uint64_t mismatches) {
  std::lock_guard lock(mu_);
  stats_.parityChecks += checks;
  stats_.parityMismatches += mismatches;
}

void StatsRecorder::repaired() {
  std::lock_guard lock(mu_);
  ++stats_.parityRepairs;
}

// ---- Base ------------------------------------------------------------------------------

namespace {

std::vector<uint32_t> othersOf(const Group& g) {
  std::vector<uint32_t> out;
  for (size_t i = 0; i < g.size(); ++i) {
    if (i != g.self) out.push_back(g.ranks[i]);
  }
  return out;
}

}  // namespace

Base::Base(SyncOptions options, Topology topology, transport::Transport* transport, Group group)
    : options_(std::move(options)),
      topology_(std::move(topology)),
      transport_(transport),
      group_(std::move(group)),
      membership_(transport_, topology_, othersOf(group_), options_, options_.algorithm,
                  options_.algorithm == "dts" ? options_.period : 1) {}

SyncStats Base::stats() const {
  SyncStats s = stats_.snapshot();
  membership_.addTo(s);
  return s;
}

void Base::reject(uint32_t peer, const std::string& what, const std::string& reason,
                  const Status& why) {
  stats_.rejected(peer, reason);
  const uint64_t n = ++rejectedBy_[peer];
  if (n <= 3 || n % 100 == 0) {
    logger()->warn("{}: refused {} of {} ({}; refusal #{} from it): {}; it counts as missing",
                   options_.algorithm, what, topology_.describe(peer), reason, n, why.message());
  }
}

Status Base::serveMembership(int64_t step, const train::FlatParameters& flat, bool finished) {
  auto served = membership_.serve(step, flat.values, finished, &flat);
  if (!served.ok()) return served.status();
  for (uint32_t p : served->queried) peerRestarted(p);
  for (uint32_t p : served->heardAgain) GEO_RETURN_IF_ERROR(peerHeardAgain(p));
  for (uint32_t p : served->resumeAsked) GEO_RETURN_IF_ERROR(peerHeardAgain(p));
  return {};
}

Status Base::awaitSuspectedPeers(const train::FlatParameters& flat, int64_t steps) {
  const double limit = std::chrono::duration<double>(options_.timeout).count();
  bool logged = false;
  const auto t0 = Clock::now();
  while (true) {
    GEO_RETURN_IF_ERROR(serveMembership(steps, flat, true));
    bool hearsSome = false;
    for (size_t i = 0; i < group_.size(); ++i) {
      hearsSome = hearsSome || (i != group_.self && !membership_.suspected(group_.ranks[i]));
    }
    if (hearsSome) break;
    std::string waiting;
    double longest = 0;
    for (const auto& c : transport_->peerCounters()) {
      if (!group_.indexOf(c.peer) || !membership_.suspected(c.peer) || !c.heard ||
          c.silentSeconds >= limit) {
        continue;
      }
      waiting += fmt::format("{}{} (silent for {:.1f} s)", waiting.empty() ? "" : ", ",
                             topology_.describe(c.peer), c.silentSeconds);
      longest = std::max(longest, c.silentSeconds);
    }
    if (waiting.empty()) break;
    if (!logged) {
      logger()->info(
          "sync: waiting up to {:.1f} s for {} before agreeing on the final model: a partition "
          "may heal (a peer silent for the round time-out, {:.3g} s, is taken for gone)",
          limit - longest, waiting, limit);
      logged = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (logged) stats_.waited(secondsSince(t0));
  return {};
}

StatusOr<Message> Base::awaitFrom(uint32_t peer, MessageKind kind, uint64_t round, int64_t step,
                                  const train::FlatParameters& flat, bool finished,
                                  const std::string& what, std::chrono::milliseconds timeout) {
  const auto t0 = Clock::now();
  const auto deadline = t0 + timeout;
  while (true) {
    GEO_RETURN_IF_ERROR(serveMembership(step, flat, finished));
    if (membership_.suspected(peer) || membership_.joining(peer)) {
      stats_.waited(secondsSince(t0));
      return unavailable(fmt::format("no {} from {}: it is {}", what, topology_.describe(peer),
                                     membership_.joining(peer) ? "rejoining" : "suspected"));
    }
    auto m = transport_->receive(kind, round, peer, std::chrono::milliseconds(20));
    if (m.ok()) {
      stats_.waited(secondsSince(t0));
      return m;
    }
    if (m.status().code() != StatusCode::kDeadlineExceeded) return m.status();
    if (Clock::now() >= deadline) {
      stats_.waited(secondsSince(t0));
      return deadlineExceeded(fmt::format("no {} from {} within {:.3g} s; is that worker alive?",
                                          what, topology_.describe(peer),
                                          std::chrono::duration<double>(timeout).count()));
    }
  }
}

void Base::ensureCodec(const train::FlatParameters& flat) {
  if (codec_) return;
  auto c = codec::makeCodec(options_.codec);
  GEO_ENFORCE(c.ok(), "sync codec: {}", c.status().message());
  std::vector<int64_t> sizes;
  for (const auto& p : flat.params) sizes.push_back(p.numel());
  codec_ = std::make_unique<FlatCodec>(std::shared_ptr<const codec::Codec>(std::move(*c)), sizes,
                                       options_.smallTensorThreshold);
}

Status Base::sendTo(const std::vector<uint32_t>& to, MessageKind kind, uint64_t round, int64_t step,
                    CodecId codec, uint64_t elements,
                    std::shared_ptr<const std::vector<std::byte>> bytes) {
  return sendBuffer(*transport_, topology_, to, kind,
                    {round, static_cast<uint64_t>(step), codec, elements}, std::move(bytes),
                    options_.timeout);
}

Status Base::sendPayload(const std::vector<uint32_t>& to, MessageKind kind, uint64_t round,
                         int64_t step, CodecId codec, uint64_t elements,
                         const transport::Payload& payload) {
  const transport::SendMeta meta{round, static_cast<uint64_t>(step), codec, elements};
  for (uint32_t peer : to) {
    const Status s = transport_->send(peer, kind, meta, payload, options_.timeout);
    if (!s.ok()) {
      return Status(s.code(), fmt::format("sending {} for round {} to {}: {}",
                                          transport::messageKindName(kind), round,
                                          topology_.describe(peer), s.message()));
    }
  }
  return {};
}

std::vector<Message> Base::takeArrived(MessageKind kind, uint64_t round, uint32_t peer) {
  std::vector<Message> out;
  for (auto m = transport_->receive(kind, round, peer, std::chrono::milliseconds(0)); m.ok();
       m = transport_->receive(kind, round, peer, std::chrono::milliseconds(0))) {
    out.push_back(std::move(*m));
  }
  return out;
}

StatusOr<Message> Base::receiveFrom(uint32_t peer, MessageKind kind, uint64_t round,
                                    std::chrono::milliseconds timeout, const std::string& what) {
  return receiveBounded(*transport_, topology_, peer, kind, round, timeout, what, stats_);
}

Status Base::lingerForJoiners(const train::FlatParameters& flat, int64_t steps) {
  // Whatever we hold now is the job's final model: joiners get it.
  membership_.setFinalModel();
  GEO_RETURN_IF_ERROR(serveMembership(steps, flat, true));
  return membership_.lingerWhileJoining([&] { return serveMembership(steps, flat, true); },
                                        "a peer");
}

Status Base::averageModels(train::FlatParameters& flat, int64_t steps) {
  membership_.setFinishing();
  if (group_.size() <= 1) {
    membership_.setFinalModel();
    return {};
  }
  // Announcements already here count: a worker that finished rejoining a
  // moment ago (its kJoinedRound waits in the inbox) takes part; and a peer
  // cut off a moment ago may come back.
  GEO_RETURN_IF_ERROR(awaitSuspectedPeers(flat, steps));
  // Everyone heard and not rejoining takes part (a straggler given up on
  // during training too: it is alive and will send its model).
  const auto alive = [&](size_t i) {
    return i == group_.self ||
           (!membership_.suspected(group_.ranks[i]) && !membership_.joining(group_.ranks[i]));
  };
  size_t coordinator = 0;
  while (!alive(coordinator)) ++coordinator;  // self is alive: terminates
  // The whole model: the parameters and the float buffers (batch norm's
  // running statistics), so that every worker ends with the same one.
  // Memory: a model-sized sum at the coordinator and one peer's model at a
  // time (each is checked and added as it is taken, in rank order), and
  // the model itself goes out without a copy (modelPayload): the peak of a
  // large model's job was here, N + 4 models at the coordinator
  // (docs/algorithms.md, "Memory").
  torch::Tensor whole = train::wholeModel(flat);
  const auto numel = static_cast<uint64_t>(whole.numel());
  const uint64_t modelBytes = numel * 4;
  if (coordinator != group_.self) {
    const uint32_t c = group_.ranks[coordinator];
    stats_.encoded(modelBytes, modelBytes, 1);
    GEO_RETURN_IF_ERROR(sendPayload({c}, MessageKind::kControl, kFinalContributionRound, steps,
                                    CodecId::kFp32, numel, modelPayload(whole)));
    // The coordinator may wait a round time-out for a straggler first.
    auto m = awaitFrom(c, MessageKind::kControl, kFinalAverageRound, steps, flat, true,
                       "final model", 2 * options_.timeout);
    if (!m.ok()) {
      logger()->warn("sync: keeping our own final model: {}", m.status().message());
      stats_.missed();
      return {};
    }
    // The average came after the coordinator had all of our model: what we
    // sent from `whole` has left, and `whole` may take the average.
    std::string reason;
    if (const Status ok =
            checkedCopy(m->payload.bytes(), whole, std::numeric_limits<float>::max(), reason);
        !ok.ok()) {
      reject(c, "the final average", reason, ok);
      logger()->warn("sync: keeping our own final model");
      stats_.missed();
      return {};
    }
    modified_ = true;
    // The coordinator waits for this before it leaves: the average may have
    // queued behind a slow uplink for longer than the transport's linger.
    GEO_RETURN_IF_ERROR(sendTo({c}, MessageKind::kControl, kFinalAckRound, steps, CodecId::kRaw, 0,
                               std::make_shared<std::vector<std::byte>>()));
    return lingerForJoiners(flat, steps);
  }
  // Σ w_i x_i in rank order, each peer's model checked and added as it is
  // taken, then divided by the weight of those that arrived.
  torch::Tensor sum = torch::zeros_like(whole);
  torch::Tensor theirs;  // a peer's model, checked (staged only when unaligned)
  double total = 0;
  std::vector<uint32_t> to;
  for (size_t i = 0; i < group_.size(); ++i) {
    if (i == group_.self) {
      sum.add_(whole, static_cast<float>(group_.weights[i]));
      total += group_.weights[i];
      continue;
    }
    if (!alive(i)) continue;
    auto m = awaitFrom(group_.ranks[i], MessageKind::kControl, kFinalContributionRound, steps, flat,
                       true, "final model", options_.timeout);
    if (!m.ok()) {
      logger()->warn("sync: final average without {}: {}", topology_.describe(group_.ranks[i]),
                     m.status().message());
      stats_.missed();
      continue;
    }
    if (!theirs.defined()) theirs = torch::empty_like(whole);
    std::string reason;
    if (const Status ok =
            checkedCopy(m->payload.bytes(), theirs, std::numeric_limits<float>::max(), reason);
        !ok.ok()) {
      reject(group_.ranks[i], "the final model", reason, ok);
      stats_.missed();
      continue;
    }
    sum.add_(theirs, static_cast<float>(group_.weights[i]));
    total += group_.weights[i];
    to.push_back(group_.ranks[i]);
  }
  theirs = torch::Tensor();
  if (!to.empty()) {
    whole.copy_(sum.mul_(static_cast<float>(1.0 / total)));
    modified_ = true;
  }
  sum = torch::Tensor();
  stats_.encoded(modelBytes, modelBytes, to.size());
  GEO_RETURN_IF_ERROR(sendPayload(to, MessageKind::kControl, kFinalAverageRound, steps,
                                  CodecId::kFp32, numel, modelPayload(whole)));
  // A send is only queued: leaving now would drop an average still waiting
  // for a slow uplink (a whole fp32 model: seconds at a few Mbit/s, beyond
  // the transport's linger), and that worker would end on its own model.
  // So stay until each has acknowledged it, or is suspected (silent: gone).
  for (uint32_t peer : to) {
    auto ack = awaitFrom(peer, MessageKind::kControl, kFinalAckRound, steps, flat, true,
                         "acknowledgement of the final average", options_.timeout);
    if (!ack.ok()) {
      logger()->warn("sync: {} may not have the final average: {}", topology_.describe(peer),
                     ack.status().message());
    }
  }
  return lingerForJoiners(flat, steps);
}

// ---- allreduce ---------------------------------------------------------------------------

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
    const auto t0 = Clock::now();
    auto bytes = std::make_shared<const std::vector<std::byte>>(codec_->encode(
        flat.grads, options_.seed, mixStream(1, topology_.rank(), static_cast<uint64_t>(step)),
        residual_.defined() ? &residual_ : nullptr));
    stats_.coded(secondsSince(t0), StatsRecorder::CodecWork::kEncode);
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
    auto got = gather(step);
    if (!got.ok()) return got.status();
    std::vector<torch::Tensor> decoded(group_.size());
    double total = 0;
    for (size_t i = 0; i < group_.size(); ++i) {
      if (i == group_.self) {
        total += group_.weights[i];
        continue;
      }
      const Message& m = *(*got)[i];
      const auto t1 = Clock::now();
      decoded[i] = torch::empty_like(flat.grads);
      std::string reason;
      const Status ok = codec_->decodeChecked(m.payload.bytes(), decoded[i], reason);
      stats_.coded(secondsSince(t1));
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
    stats_.roundDone(secondsSince(t0));
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
  StatusOr<std::vector<std::optional<Message>>> gather(int64_t step) {
    std::vector<std::optional<Message>> got(group_.size());
    const auto round = static_cast<uint64_t>(step);
    const auto t0 = Clock::now();
    const auto deadline = t0 + options_.timeout;
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
          stats_.waited(secondsSince(t0));
          return Status(m.status().code(),
                        fmt::format("allreduce: no gradient for step {} from {}: {}", step + 1,
                                    topology_.describe(group_.ranks[i]), m.status().message()));
        }
      }
      if (missing.empty()) break;
      if (Clock::now() >= deadline) {
        stats_.waited(secondsSince(t0));
        return missingGradients(step, missing);
      }
      // Whichever comes next (a later poll takes it from the inbox).
      auto m = transport_->receive(MessageKind::kUpdate, round, transport::kAnyPeer,
                                   std::chrono::milliseconds(20));
      if (!m.ok()) continue;
      const auto i = group_.indexOf(m->header.sender);
      if (i && *i != group_.self && !got[*i]) got[*i] = std::move(*m);
    }
    stats_.waited(secondsSince(t0));
    return got;
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
    const auto t0 = Clock::now();
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
      if (Clock::now() >= deadline) {
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
    lanStats_.waited(secondsSince(t0));
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
      auto m = fromLeader(kFinalAverageRound, steps, flat, "final model");
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
    GEO_RETURN_IF_ERROR(send(to, MessageKind::kLanBroadcast, kFinalAverageRound, steps,
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
    const auto t0 = Clock::now();
    while (true) {
      auto served = lanMembers_.serve(step, flat.values, false, &flat);
      if (!served.ok()) return served.status();
      // Its reason first: it may fall silent right after sending it.
      if (auto why = transport_->receive(MessageKind::kControl, kLeaderStoppedRound, leader_,
                                         std::chrono::milliseconds(0));
          why.ok()) {
        lanStats_.waited(secondsSince(t0));
        return aborted(fmt::format(
            "hierarchical sync: no {} from the region leader {}: it stopped (a member cannot "
            "train on without its leader -- restart this worker to rejoin once the leader is "
            "back): {}",
            what, topology_.describe(leader_), printable(why->payload.bytes())));
      }
      if (lanMembers_.suspected(leader_)) {
        lanStats_.waited(secondsSince(t0));
        return aborted(fmt::format(
            "hierarchical sync: no {} from the region leader {}: it is suspected (silent for the "
            "peer time-out); a member cannot train on without its leader -- restart this worker "
            "to rejoin once the leader is back",
            what, topology_.describe(leader_)));
      }
      auto m = transport_->receive(MessageKind::kLanBroadcast, round, leader_,
                                   std::chrono::milliseconds(20));
      if (m.ok()) {
        lanStats_.waited(secondsSince(t0));
        return m;
      }
      if (Clock::now() - t0 > lanTimeout_) {
        lanStats_.waited(secondsSince(t0));
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
      (void)sendBuffer(*transport_, topology_, {m}, MessageKind::kControl,
                       {kLeaderStoppedRound, static_cast<uint64_t>(step), CodecId::kRaw, 0}, bytes,
                       std::chrono::milliseconds(100));
    }
    const auto deadline = Clock::now() + std::chrono::milliseconds(500);
    while (Clock::now() < deadline) {
      bool queued = false;
      for (const auto& c : transport_->peerCounters()) {
        queued = queued || (std::find(to.begin(), to.end(), c.peer) != to.end() &&
                            !lanMembers_.suspected(c.peer) && c.queuedBytes > 0);
      }
      if (!queued) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
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

std::unique_ptr<Base> makeAllreduce(const SyncOptions& o, const Topology& t,
                                    transport::Transport* tr, Group g) {
  return std::make_unique<Allreduce>(o, t, tr, std::move(g));
}

}  // namespace detail

namespace {

// Each algorithm's synchronizer (common/sync_algorithms.h lists them; a test
// checks that every one listed has its factory here).
using Factory = std::unique_ptr<detail::Base> (*)(const SyncOptions&, const Topology&,
                                                  transport::Transport*, detail::Group);
const std::map<std::string, Factory, std::less<>> kFactories = {
    {"allreduce", detail::makeAllreduce},
    {"dts", detail::makeDts},
    {"swarm", detail::makeSwarm},
};

}  // namespace

StatusOr<std::unique_ptr<Synchronizer>> makeSynchronizer(const SyncOptions& options,
                                                         const Topology& topology,
                                                         transport::Transport* transport) {
  GEO_RETURN_IF_ERROR(validateSyncOptions(options));
  if (topology.worldSize() > 1 && transport == nullptr) {
    return invalidArgument("sync: a job of several workers needs a transport");
  }
  if (transport != nullptr &&
      (transport->worldSize() != topology.worldSize() || transport->rank() != topology.rank())) {
    return invalidArgument(fmt::format(
        "sync: the transport is rank {} of {} but the topology says rank {} of {}",
        transport->rank(), transport->worldSize(), topology.rank(), topology.worldSize()));
  }
  // Which ranks run the WAN algorithm, with which weights.
  const std::vector<uint32_t> leaders = topology.leaders();
  const bool hierarchical = options.hierarchical && leaders.size() < topology.worldSize();
  detail::Group group;
  const double world = topology.worldSize();
  if (hierarchical) {
    group.ranks = leaders;
    for (uint32_t r : leaders) group.weights.push_back(topology.regionMembers(r).size() / world);
  } else {
    group.ranks.resize(topology.worldSize());
    std::iota(group.ranks.begin(), group.ranks.end(), 0u);
    group.weights.assign(group.ranks.size(), 1.0 / world);
  }
  const auto self = std::find(group.ranks.begin(), group.ranks.end(), topology.rank());
  group.self = static_cast<size_t>(self - group.ranks.begin());

  std::unique_ptr<detail::Base> inner;
  if (self != group.ranks.end()) {
    const auto make = kFactories.find(options.algorithm);
    if (make == kFactories.end()) {
      return internalError(
          fmt::format("sync: the algorithm '{}' has no synchronizer (sync_algorithms.h lists it, "
                      "synchronizer.cc's kFactories does not)",
                      options.algorithm));
    }
    inner = make->second(options, topology, transport, group);
  }
  if (!hierarchical) return std::unique_ptr<Synchronizer>(std::move(inner));
  return std::unique_ptr<Synchronizer>(
      std::make_unique<detail::Hierarchical>(options, topology, transport, std::move(inner)));
}

}  // namespace geo::sync
