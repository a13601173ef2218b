// Topology, options, the shared pieces of worker/sync/internal.h (Base,
// StatsRecorder, the helpers) and the factory. The algorithms are in files
// of their own: allreduce.cc, dts.cc, swarm.cc, and hierarchical.cc around
// them.

#include "worker/sync/synchronizer.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <string_view>
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

std::string Topology::describe(const std::vector<uint32_t>& ranks) const {
  std::string out;
  for (uint32_t r : ranks) out += (out.empty() ? "" : ", ") + describe(r);
  return out;
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
  if (o.exchange != "allgather" && o.exchange != "reducescatter" && o.exchange != "auto") {
    return bad("exchange", fmt::format("'{}'", o.exchange), "allgather, reducescatter, auto");
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

double secondsSince(const geo::Clock& clock, geo::Clock::TimePoint t0) {
  return std::chrono::duration<double>(clock.now() - t0).count();
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
                                 StatsRecorder& stats, const geo::Clock& clock) {
  const auto t0 = clock.now();
  auto m = transport.receive(kind, round, peer, timeout);
  stats.waited(secondsSince(clock, t0));
  if (m.ok()) return m;
  const double seconds = std::chrono::duration<double>(timeout).count();
  if (m.status().code() == StatusCode::kDeadlineExceeded) {
    return deadlineExceeded(fmt::format("no {} from {} within {:.3g} s; is that worker alive?",
                                        what, topology.describe(peer), seconds));
  }
  return Status(m.status().code(), fmt::format("no {} from {}: {}", what, topology.describe(peer),
                                               m.status().message()));
}

std::shared_ptr<std::vector<std::byte>> reduceScatterRequest(uint32_t attempt,
                                                             const std::vector<uint32_t>& order) {
  auto bytes = std::make_shared<std::vector<std::byte>>(1 + 4 * (1 + order.size()));
  (*bytes)[0] = std::byte{2};
  std::memcpy(bytes->data() + 1, &attempt, 4);
  std::memcpy(bytes->data() + 5, order.data(), 4 * order.size());
  return bytes;
}

bool readReduceScatterRequest(std::span<const std::byte> payload, uint32_t& attempt,
                              std::vector<uint32_t>& order) {
  if (payload.size() < 5 || payload[0] != std::byte{2} || (payload.size() - 5) % 4 != 0) {
    return false;
  }
  std::memcpy(&attempt, payload.data() + 1, 4);
  order.resize((payload.size() - 5) / 4);
  std::memcpy(order.data(), payload.data() + 5, payload.size() - 5);
  return true;
}

std::shared_ptr<std::vector<std::byte>> finalFollowsPayload(uint32_t rank) {
  auto bytes = std::make_shared<std::vector<std::byte>>(4);
  std::memcpy(bytes->data(), &rank, 4);
  return bytes;
}

std::optional<uint32_t> readFinalFollows(std::span<const std::byte> payload) {
  if (payload.size() != 4) return std::nullopt;
  uint32_t rank = 0;
  std::memcpy(&rank, payload.data(), 4);
  return rank;
}

std::shared_ptr<std::vector<std::byte>> finalLeftOutPayload(const std::vector<uint32_t>& ranks) {
  auto bytes = std::make_shared<std::vector<std::byte>>(4 * ranks.size());
  std::memcpy(bytes->data(), ranks.data(), bytes->size());
  return bytes;
}

std::optional<std::vector<uint32_t>> readFinalLeftOut(std::span<const std::byte> payload) {
  if (payload.empty() || payload.size() % 4 != 0) return std::nullopt;
  std::vector<uint32_t> ranks(payload.size() / 4);
  std::memcpy(ranks.data(), payload.data(), payload.size());
  return ranks;
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

void StatsRecorder::setReduceScatter(bool on) {
  std::lock_guard lock(mu_);
  stats_.reduceScatter = on;
}

void StatsRecorder::reexchanged() {
  std::lock_guard lock(mu_);
  ++stats_.reexchangedRounds;
}

void StatsRecorder::relayedMean() {
  std::lock_guard lock(mu_);
  ++stats_.relayedMeans;
}

void StatsRecorder::setLink(double seconds) {
  std::lock_guard lock(mu_);
  stats_.linkSeconds = seconds;
}

void StatsRecorder::setUplinkRate(double bytesPerSecond) {
  std::lock_guard lock(mu_);
  stats_.uplinkBytesPerSecond = bytesPerSecond;
}

void StatsRecorder::setStepSeconds(double seconds) {
  std::lock_guard lock(mu_);
  stats_.stepSeconds = seconds;
}

SyncStats StatsRecorder::snapshot() const {
  std::lock_guard lock(mu_);
  return stats_;
}

double StatsRecorder::codecSeconds() const {
  std::lock_guard lock(mu_);
  return stats_.codecSeconds;
}

void StatsRecorder::merge(const SyncStats& in) {
  std::lock_guard lock(mu_);
  stats_.delay = in.delay;
  stats_.linkSeconds = in.linkSeconds;
  stats_.stepSeconds = in.stepSeconds;
  stats_.period = in.period;
  stats_.rounds += in.rounds;
  stats_.relayedMeans += in.relayedMeans;
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
  stats_.decodedBeside += in.decodedBeside;
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

void StatsRecorder::decodedBeside(uint64_t contributions) {
  std::lock_guard lock(mu_);
  stats_.decodedBeside += contributions;
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

// Shard `r` of a flat model: a view of its values (contiguous, as the
// model is), what is sent and what a shard received is copied into.
// Whether a final average's order of workers names each rank once, `me`
// among them, and only ranks `allowed` says may take part.
template <typename Allowed>
bool validFinalOrder(const std::vector<uint32_t>& ranks, uint32_t me, Allowed allowed) {
  return std::count(ranks.begin(), ranks.end(), me) == 1 &&
         std::all_of(ranks.begin(), ranks.end(), [&](uint32_t r) {
           return allowed(r) && std::count(ranks.begin(), ranks.end(), r) == 1;
         });
}

torch::Tensor shardOf(const torch::Tensor& whole, const ShardRange& r) {
  return whole.narrow(0, static_cast<int64_t>(r.offset), static_cast<int64_t>(r.length));
}

std::vector<uint32_t> othersOf(const Group& g) {
  std::vector<uint32_t> out;
  for (size_t i = 0; i < g.size(); ++i) {
    if (i != g.self) out.push_back(g.ranks[i]);
  }
  return out;
}

}  // namespace

Base::Base(SyncOptions options, Topology topology, transport::Transport* transport, Group group,
           int64_t stepsPerRound)
    : options_(std::move(options)),
      topology_(std::move(topology)),
      transport_(transport),
      group_(std::move(group)),
      membership_(transport_, topology_, othersOf(group_), options_, options_.algorithm,
                  stepsPerRound) {}

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
  for (uint32_t p : served->suspected) peerSuspected(p);
  for (uint32_t p : served->queried) peerRestarted(p);
  for (uint32_t p : served->heardAgain) GEO_RETURN_IF_ERROR(peerHeardAgain(p));
  for (uint32_t p : served->resumeAsked) GEO_RETURN_IF_ERROR(peerHeardAgain(p));
  if (final_) GEO_RETURN_IF_ERROR(serveFinalCoordinators(step));
  return {};
}

Status Base::serveFinalCoordinators(int64_t step) {
  FinalCoordination& f = *final_;
  const auto below = [&](size_t i) { return i < f.following && (!f.to || i < *f.to); };
  for (size_t i = 0; i < group_.size(); ++i) {
    if (i == group_.self) continue;
    const uint32_t r = group_.ranks[i];
    // A coordinator that counted this worker out, naming who it averages.
    for (auto m =
             receiveControl(*transport_, Control::kFinalLeftOut, r, std::chrono::milliseconds(0));
         m.ok();
         m = receiveControl(*transport_, Control::kFinalLeftOut, r, std::chrono::milliseconds(0))) {
      const auto ranks = readFinalLeftOut(m->payload.bytes());
      std::vector<size_t> fellows;
      for (uint32_t named : ranks.value_or(std::vector<uint32_t>{})) {
        const auto index = group_.indexOf(named);
        if (!index || *index == group_.self) {
          fellows.clear();
          break;
        }
        fellows.push_back(*index);
      }
      if (fellows.empty() || fellows[0] != i) {
        logger()->warn(
            "sync: {} says it counted this worker out of the final average, but names no workers "
            "of this group without it, itself first ({} bytes): ignored",
            topology_.describe(r), m->payload.size());
        continue;
      }
      if (i != f.following && !(f.switchable && below(i))) continue;  // not ours to follow
      for (size_t k : fellows) {
        if (k != i) f.says[k] = i;
      }
      f.leftOutBy = i;
      if (i != f.following) {
        f.to = i;
        f.request.reset();
      }
    }
    if (i == f.following) continue;  // the one followed: its own waits
    // Once a request from the one to follow is kept, its later ones (a new
    // attempt, the go-ahead) stay where followFinal takes them.
    while (!(f.to == i && f.request)) {
      auto m = receiveControl(*transport_, Control::kFinalRequest, r, std::chrono::milliseconds(0));
      if (!m.ok()) break;
      if (i > f.following) {
        // It coordinates because it suspects the one we follow (or us):
        // it follows that one too once it hears that we do.
        GEO_RETURN_IF_ERROR(sendTo({r}, Control::kFinalFollows, step, CodecId::kRaw, 0,
                                   finalFollowsPayload(group_.ranks[f.following])));
      } else if (f.switchable && (below(i) || (f.to == i && !f.request))) {
        // (Where `to` came from a worker's word, its own request is kept.)
        f.to = i;
        f.request = std::move(*m);
      } else if (!f.switchable) {
        logger()->warn(
            "sync: {} asks for this worker's final model after it took {}'s average: the two may "
            "end with different models",
            topology_.describe(r),
            f.following == group_.self ? std::string("its own")
                                       : topology_.describe(group_.ranks[f.following]));
      }
    }
    for (auto m =
             receiveControl(*transport_, Control::kFinalFollows, r, std::chrono::milliseconds(0));
         m.ok();
         m = receiveControl(*transport_, Control::kFinalFollows, r, std::chrono::milliseconds(0))) {
      const auto named = readFinalFollows(m->payload.bytes());
      const auto index = named ? group_.indexOf(*named) : std::nullopt;
      if (!index) {
        logger()->warn(
            "sync: {} names no worker of this group as the final average's coordinator "
            "({} bytes): ignored",
            topology_.describe(r), m->payload.size());
        continue;
      }
      f.says[i] = *index;
      if (f.switchable && *index != group_.self && below(*index)) {
        f.to = *index;
        f.request.reset();
      }
    }
  }
  // A member that suspects its coordinator may be left out of its average
  // (the coordinator suspects it too, and counted it out: seen on the
  // namespace network, a partial partition as the job ended). Its fellows
  // hold the job's model once that average is in, and linger only until
  // then: so one is asked now, not once the coordinator has been silent
  // for the round time-out. Where this worker is counted in after all, the
  // fellow's answer is one model's bytes for nothing.
  const bool countedOut = f.leftOutBy == f.following;
  if (f.following != group_.self && !f.model) {
    if (f.fellow()) {
      auto m = receiveControl(*transport_, Control::kJoinState, group_.ranks[*f.fellow()],
                              std::chrono::milliseconds(0));
      if (m.ok()) f.model = std::move(*m);
    }
    if (!f.model && (countedOut || membership_.suspected(group_.ranks[f.following])) &&
        (!f.fellow() || membership_.suspected(group_.ranks[*f.fellow()]))) {
      GEO_RETURN_IF_ERROR(askFellowForFinal(step).status());
    }
  }
  if (f.to && f.switchable) {
    return aborted(
        fmt::format("{} coordinates the final average", topology_.describe(group_.ranks[*f.to])));
  }
  if (f.fromFellow || !f.switchable) return {};
  if (countedOut) {
    return aborted(fmt::format("{} counted this worker out of the final average",
                               topology_.describe(group_.ranks[f.following])));
  }
  // A fellow holds the job's model while the coordinator has not asked for
  // ours: its average was made without this worker (a coordinator waits
  // for every member's model, or part, before it has an average).
  if (f.model && !f.requested) {
    return aborted(fmt::format("{} sent the job's final model before {} asked for this worker's",
                               topology_.describe(group_.ranks[*f.fellow()]),
                               topology_.describe(group_.ranks[f.following])));
  }
  return {};
}

StatusOr<bool> Base::askFellowForFinal(int64_t step) {
  FinalCoordination& f = *final_;
  double nearest = std::numeric_limits<double>::infinity();
  std::optional<size_t> pick;
  const auto counters = transport_->peerCounters();
  for (size_t i = 0; i < group_.size(); ++i) {
    const uint32_t r = group_.ranks[i];
    if (i == group_.self || i == f.following || f.says[i] != f.following ||
        membership_.suspected(r) || std::ranges::find(f.fellowsAsked, i) != f.fellowsAsked.end()) {
      continue;
    }
    double rtt = 1e9;  // unknown: after every known one, in rank order
    for (const auto& c : counters) {
      if (c.peer == r && c.minRttSeconds >= 0) rtt = c.minRttSeconds;
    }
    if (rtt < nearest) {
      nearest = rtt;
      pick = i;
    }
  }
  const bool countedOut = f.leftOutBy == f.following;
  const uint32_t c = group_.ranks[f.following];
  if (!pick && countedOut && !membership_.suspected(c) &&
      std::ranges::find(f.fellowsAsked, f.following) == f.fellowsAsked.end()) {
    pick = f.following;  // it averaged alone: it holds the job's model
  }
  if (!pick) return false;
  logger()->info(
      "sync: asking {} for the job's final model: {}", topology_.describe(group_.ranks[*pick]),
      *pick == f.following ? std::string("it counted this worker out of its final average")
      : countedOut ? fmt::format("{} counted this worker out of its final average, which it "
                                 "takes part in",
                                 topology_.describe(c))
                   : fmt::format("it follows {}, which this worker suspects (its average may "
                                 "be made without this worker)",
                                 topology_.describe(c)));
  GEO_RETURN_IF_ERROR(membership_.askForFinalModel(group_.ranks[*pick], step));
  f.fellowsAsked.push_back(*pick);
  return true;
}

Status Base::finalFromFellow(uint32_t c, const train::FlatParameters& flat, int64_t steps,
                             torch::Tensor& whole) {
  FinalCoordination& f = *final_;
  // Its own waits serve membership: no Aborted for being counted out, or
  // for the answer it waits for.
  struct Waiting {
    bool& flag;
    ~Waiting() { flag = false; }
  } waiting{f.fromFellow};
  f.fromFellow = true;
  if (!f.model && (!f.fellow() || membership_.suspected(group_.ranks[*f.fellow()]))) {
    auto asked = askFellowForFinal(steps);
    if (!asked.ok()) return asked.status();
  }
  if (!f.model && !f.fellow()) {
    return notFound(fmt::format("no worker heard said that it follows {}", topology_.describe(c)));
  }
  const auto t0 = clock().now();
  const auto deadline = t0 + options_.timeout;
  while (!f.model) {
    const Status served = serveMembership(steps, flat, true);
    if (f.model) break;
    if (!served.ok()) return served;
    const uint32_t fellow = group_.ranks[*f.fellow()];
    if (membership_.suspected(fellow)) {
      auto asked = askFellowForFinal(steps);
      if (!asked.ok()) return asked.status();
      if (!*asked) {
        return notFound(fmt::format(
            "{}, asked for the job's final model, is suspected, and no other worker heard "
            "follows {}",
            topology_.describe(fellow), topology_.describe(c)));
      }
      continue;
    }
    if (clock().now() >= deadline) {
      return notFound(fmt::format(
          "{}, asked for the job's final model, did not send it within {:.3g} s (it may have "
          "failed its own final average)",
          topology_.describe(fellow), std::chrono::duration<double>(options_.timeout).count()));
    }
    clock().sleepFor(std::chrono::milliseconds(20));
  }
  stats_.waited(since(t0));
  const uint32_t from = group_.ranks[*f.fellow()];
  const Message& m = *f.model;
  if (m.header.codec != CodecId::kFp32) {
    // A worker that has not taken its last step sends its training state:
    // not possible from one that said whom it follows, but never taken for
    // the job's model.
    return dataLoss(fmt::format(
        "sync: {} sent its training state where the job's final model was asked for: this "
        "worker's model is not the job's final model",
        topology_.describe(from)));
  }
  f.switchable = false;  // `whole` may be written now, and holds the job's model after
  GEO_RETURN_IF_ERROR(takeFinal(m, whole, from, "the job's final model"));
  modified_ = true;
  return {};
}

std::string Base::finalCoordinatorGone(uint32_t c) const {
  if (membership_.joining(c)) return "it is rejoining";
  if (!membership_.suspected(c)) return {};
  const double limit = std::chrono::duration<double>(options_.timeout).count();
  for (const auto& counters : transport_->peerCounters()) {
    if (counters.peer == c && counters.silentSeconds >= limit) {
      return fmt::format("it is suspected and silent for {:.1f} s (sync.timeoutSeconds {:.3g} s)",
                         counters.silentSeconds, limit);
    }
  }
  return {};
}

Status Base::awaitSuspectedPeers(const train::FlatParameters& flat, int64_t steps) {
  const double limit = std::chrono::duration<double>(options_.timeout).count();
  bool logged = false;
  const auto t0 = clock().now();
  // When the first peer was heard again after we heard none: a partition
  // healing. The others cut off with us come back over the next second or
  // two (each side's new connections and pings take turns), and a worker
  // that chose the final average's coordinator among the first to return
  // alone coordinated one average while the rest, a lower rank among them,
  // made another: two final models (seen on the namespace network, sixteen
  // regions: tokyo finished alone in an 8 s cut, heard sydney first, asked
  // it for its model, while virginia waited for tokyo's; both gave up after
  // the round time-out). So the others get up to one peer time-out more,
  // 5 s at least: a transport renews its connections to a silent peer
  // every 2 s and pings every second, and a peer whose path healed with
  // the first one's was heard within 1.9-2.2 s of it on sixteen regions.
  std::optional<Clock::TimePoint> healed;
  constexpr std::chrono::milliseconds kLeastGrace{5000};
  std::chrono::milliseconds grace{0};
  while (true) {
    GEO_RETURN_IF_ERROR(serveMembership(steps, flat, true));
    bool hearsSome = false;
    for (size_t i = 0; i < group_.size(); ++i) {
      hearsSome = hearsSome || (i != group_.self && !membership_.suspected(group_.ranks[i]));
    }
    if (hearsSome && !logged) break;  // never cut off: no wait
    std::string waiting;
    double longest = 0;
    grace = kLeastGrace;
    for (const auto& c : transport_->peerCounters()) {
      if (!group_.indexOf(c.peer) || !membership_.suspected(c.peer) || !c.heard ||
          c.silentSeconds >= limit) {
        continue;
      }
      waiting += fmt::format("{}{} (silent for {:.1f} s)", waiting.empty() ? "" : ", ",
                             topology_.describe(c.peer), c.silentSeconds);
      longest = std::max(longest, c.silentSeconds);
      grace = std::max(grace, membership_.peerTimeout(c.peer));
    }
    if (waiting.empty()) break;
    if (!logged) {
      logger()->info(
          "sync: waiting up to {:.1f} s for {} before agreeing on the final model: a partition "
          "may heal (a peer silent for the round time-out, {:.3g} s, is taken for gone)",
          limit - longest, waiting, limit);
      logged = true;
    }
    if (hearsSome) {
      if (!healed) {
        healed = clock().now();
        logger()->info(
            "sync: a peer is heard again; waiting up to {:.1f} s more for {} before agreeing on "
            "the final model (the others cut off with this worker may be on their way back)",
            std::chrono::duration<double>(grace).count(), waiting);
      }
      if (clock().now() >= *healed + grace) {
        logger()->warn(
            "sync: {} not heard again within {:.1f} s of the first peer: the final average goes "
            "on without them",
            waiting, std::chrono::duration<double>(grace).count());
        break;
      }
    }
    clock().sleepFor(std::chrono::milliseconds(20));
  }
  if (logged) stats_.waited(since(t0));
  return {};
}

StatusOr<Message> Base::awaitFrom(uint32_t peer, MessageKind kind, uint64_t round, int64_t step,
                                  const train::FlatParameters& flat, bool finished,
                                  const std::string& what, std::chrono::milliseconds timeout,
                                  Patience patience) {
  const auto t0 = clock().now();
  const auto deadline = t0 + timeout;
  while (true) {
    GEO_RETURN_IF_ERROR(serveMembership(step, flat, finished));
    const std::string gone = patience == Patience::kCoordinator ? finalCoordinatorGone(peer)
                             : membership_.joining(peer)        ? "it is rejoining"
                             : membership_.suspected(peer)      ? "it is suspected"
                                                                : "";
    if (!gone.empty()) {
      stats_.waited(since(t0));
      return unavailable(fmt::format("no {} from {}: {}", what, topology_.describe(peer), gone));
    }
    auto m = transport_->receive(kind, round, peer, std::chrono::milliseconds(20));
    if (m.ok()) {
      stats_.waited(since(t0));
      return m;
    }
    if (m.status().code() != StatusCode::kDeadlineExceeded) return m.status();
    if (clock().now() >= deadline) {
      stats_.waited(since(t0));
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
  return receiveBounded(*transport_, topology_, peer, kind, round, timeout, what, stats_, clock());
}

Status Base::lingerForJoiners(const train::FlatParameters& flat, int64_t steps) {
  // Whatever we hold now is the job's final model: joiners get it.
  membership_.setFinalModel();
  GEO_RETURN_IF_ERROR(serveMembership(steps, flat, true));
  return membership_.lingerWhileJoining([&] { return serveMembership(steps, flat, true); },
                                        "a peer");
}

Status Base::pauseServing(double seconds, int64_t steps, const train::FlatParameters& flat) {
  const auto until = clock().now() + std::chrono::duration_cast<geo::Clock::Duration>(
                                         std::chrono::duration<double>(seconds));
  while (clock().now() < until) {
    GEO_RETURN_IF_ERROR(serveMembership(steps, flat, true));
    clock().sleepFor(std::chrono::milliseconds(2));
  }
  return {};
}

void Base::sampleUplink() {
  const auto now = clock().now();
  if (!lastUplinkSample_ || now - *lastUplinkSample_ >= kUplinkSampleEvery) {
    lastUplinkSample_ = now;
    uint64_t left = 0, queued = 0;
    for (const auto& c : transport_->peerCounters()) {
      if (!group_.indexOf(c.peer)) continue;
      const uint64_t below = transport_->queuedBelowBytes(c.peer);
      left += c.bytesSent > below ? c.bytesSent - below : 0;
      queued += c.backlogBytes + below;
    }
    busyUplink_.sample(now, left, queued);
  }
  // Every call: the one place the stats learn the rate, whichever measure
  // it comes from (DTS's changes at a round's sending or close).
  stats_.setUplinkRate(wayRate());
}

double Base::wayRate(std::string* source) const {
  if (const double rate = uplinkBytesPerSecond(); rate > 0) {
    if (source) *source = uplinkRateSource();
    return rate;
  }
  const double busy = busyUplink_.bytesPerSecond();
  if (source) {
    *source = busy > 0 ? fmt::format("what left this machine over the {:.1f} s it held data back",
                                     busyUplink_.busySeconds())
                       : std::string("nothing");
  }
  return busy;
}

double Base::farthestOneWaySeconds(const std::vector<uint32_t>& peers) const {
  double farthest = 0;
  for (const auto& c : transport_->peerCounters()) {
    if (std::find(peers.begin(), peers.end(), c.peer) != peers.end()) {
      farthest = std::max(farthest, c.minRttSeconds / 2);
    }
  }
  return farthest;
}

Status Base::sendAverageInShards(const std::vector<uint32_t>& to, int64_t steps,
                                 const train::FlatParameters& flat, const torch::Tensor& whole) {
  const auto numel = static_cast<uint64_t>(whole.numel());
  const uint64_t modelBytes = numel * 4;
  auto order = std::make_shared<std::vector<std::byte>>(to.size() * sizeof(uint32_t));
  std::memcpy(order->data(), to.data(), order->size());
  GEO_RETURN_IF_ERROR(sendTo(to, Control::kFinalOrder, steps, CodecId::kRaw, 0, order));
  // One shard after another, at the rate the uplink was seen to carry the
  // rounds (a burst overflows its queue, as sendAverage says): the first
  // member forwards its shard while the next ones leave.
  const double rate = uplinkBytesPerSecond();
  for (size_t i = 0; i < to.size(); ++i) {
    const ShardRange r = finalShard(numel, to.size(), i);
    if (i > 0 && rate > 0) {
      GEO_RETURN_IF_ERROR(pauseServing(
          static_cast<double>(finalShard(numel, to.size(), i - 1).length * 4) / rate, steps, flat));
    }
    GEO_RETURN_IF_ERROR(sendPayload({to[i]}, Control::kFinalShard, steps, CodecId::kFp32, r.length,
                                    modelPayload(shardOf(whole, r))));
  }
  // Each member acknowledges once it has every shard. One that has not by
  // then -- a member gone before it forwarded its shard, or one that never
  // does -- gets the whole average from here, as without shards. How long
  // the shards may take: three times what they should on the uplinks as
  // measured (the coordinator's model's worth, then the last member's
  // forwards), and the hops; without a rate, the round time-out.
  const double latency = farthestOneWaySeconds(to);
  const auto patience =
      rate > 0 ? std::chrono::duration_cast<geo::Clock::Duration>(std::chrono::duration<double>(
                     3 * 2 * static_cast<double>(modelBytes) / rate + 4 * latency + 1))
               : std::chrono::duration_cast<geo::Clock::Duration>(options_.timeout);
  std::vector<uint32_t> pending = to;
  std::vector<bool> resent(to.size(), false);
  bool sentWhole = false;
  auto deadline = clock().now() + patience;
  while (!pending.empty()) {
    GEO_RETURN_IF_ERROR(serveMembership(steps, flat, true));
    std::erase_if(pending, [&](uint32_t peer) {
      return receiveControl(*transport_, Control::kFinalAck, peer, std::chrono::milliseconds(0))
          .ok();
    });
    // A member suspected is not waited for. It may have died before it
    // forwarded its shard, or only be silent behind the average's bytes
    // (pings come late on a full uplink): its shard goes again from here
    // to every member still without the whole average (a shard they have
    // already is ignored), and they get the whole average unless they
    // acknowledge within what the shards should take from now.
    std::erase_if(pending, [&](uint32_t peer) {
      if (!membership_.suspected(peer)) return false;
      logger()->warn("sync: {} may not have the final average: it is suspected",
                     topology_.describe(peer));
      if (!sentWhole) deadline = std::min(deadline, clock().now() + patience / 3);
      return true;
    });
    for (size_t i = 0; i < to.size() && !sentWhole && !pending.empty(); ++i) {
      if (resent[i] || !membership_.suspected(to[i])) continue;
      resent[i] = true;
      const ShardRange r = finalShard(numel, to.size(), i);
      logger()->info(
          "sync: sending {}'s shard of the final average to the {} member(s) without "
          "the whole average: it is suspected, and may not have forwarded it",
          topology_.describe(to[i]), pending.size());
      stats_.encoded(r.length * 4, r.length * 4, pending.size());
      GEO_RETURN_IF_ERROR(sendPayload(pending, Control::kFinalShardAgain, static_cast<int64_t>(i),
                                      CodecId::kFp32, r.length, modelPayload(shardOf(whole, r))));
    }
    if (pending.empty()) break;
    const bool late = clock().now() >= deadline;
    if (!sentWhole && late) {
      sentWhole = true;
      logger()->warn(
          "sync: the final average's shards did not all reach {} in time (a member that did not "
          "forward its shard): sending {} the whole average",
          topology_.describe(pending), pending.size() == 1 ? "it" : "them");
      stats_.encoded(modelBytes, modelBytes, pending.size());
      GEO_RETURN_IF_ERROR(sendAverage(pending, steps, flat, whole));
      deadline = clock().now() + std::chrono::duration_cast<geo::Clock::Duration>(options_.timeout);
    } else if (sentWhole && late) {
      for (uint32_t peer : pending) {
        logger()->warn(
            "sync: {} may not have the final average: no acknowledgement within {:.1f} s",
            topology_.describe(peer), std::chrono::duration<double>(options_.timeout).count());
      }
      break;
    }
    clock().sleepFor(std::chrono::milliseconds(2));
  }
  return {};
}

FinalAverageWay Base::finalWay(const std::vector<uint32_t>& to, uint64_t modelBytes,
                               bool reduceScatter, bool explain) const {
  std::optional<FinalAverageWay> way = options_.finalWay;
  if (const char* forced = std::getenv("GEO_SYNC_FINAL"); !way && forced != nullptr) {
    const std::string_view f(forced);
    if (f == "whole") way = FinalAverageWay::kWhole;
    if (f == "shards") way = FinalAverageWay::kShards;
    if (f == "reduce-scatter") way = FinalAverageWay::kReduceScatter;
  }
  std::string source;
  const double measuredRate = wayRate(&source);
  const bool measured = measuredRate > 0;
  const double rate = measured ? measuredRate : kUnmeasuredUplinkBytesPerSecond;
  const double latency = farthestOneWaySeconds(to);
  const bool chosen = !way;
  if (!way) {
    way = finalAverageWay(to.size(), modelBytes, rate, latency, options_.finalModelsInFlightBytes);
  }
  if (explain && !to.empty()) {
    // What the choice went by, so that a slow final average can be traced
    // to the rate it assumed.
    const auto reckon = [&](FinalAverageWay w) {
      return finalAverageSeconds(w, to.size(), modelBytes, rate, latency);
    };
    logger()->info(
        "sync: the final average {} {}: {} models of {:.1f} MB, uplink {:.3g} MB/s ({}), farthest "
        "worker {:.0f} ms one way; reckoned {:.1f} s whole, {:.1f} s in shards, {:.1f} s by "
        "reduce-scatter",
        chosen ? "chosen" : "set", finalAverageWayName(*way), to.size() + 1,
        static_cast<double>(modelBytes) / 1e6, rate / 1e6,
        measured ? "measured from " + source : std::string("not measured: 1 Gbit/s assumed"),
        latency * 1e3, reckon(FinalAverageWay::kWhole), reckon(FinalAverageWay::kShards),
        reckon(FinalAverageWay::kReduceScatter));
  }
  if (*way == FinalAverageWay::kReduceScatter && (!reduceScatter || to.empty())) {
    // Started over: in shards or whole, as the rule says for those.
    return shardFinalAverage(to.size(), modelBytes, rate, latency) ? FinalAverageWay::kShards
                                                                   : FinalAverageWay::kWhole;
  }
  return *way;
}

StatusOr<bool> Base::reduceScatterFinal(uint32_t c, uint32_t attempt,
                                        const std::vector<uint32_t>& order, int64_t steps,
                                        const train::FlatParameters& flat, torch::Tensor& whole,
                                        std::optional<Message>& next) {
  const auto numel = static_cast<uint64_t>(whole.numel());
  const uint64_t modelBytes = numel * 4;
  const size_t n = order.size();
  const uint32_t me = topology_.rank();
  const bool coordinator = me == c;
  const auto p = static_cast<size_t>(std::find(order.begin(), order.end(), me) - order.begin());
  GEO_ENFORCE(p < n && order[0] == c, "sync: reduce-scatter among workers without this one");
  const ShardRange mine = finalShard(numel, n, p);
  // Its messages' header.step: the attempt and its coordinator, so that a
  // worker that changed coordinators (serveFinalCoordinators) takes no
  // shard of another's attempt of the same number.
  const auto tag = static_cast<int64_t>((uint64_t{c} << 32) | attempt);
  std::vector<uint32_t> others;
  for (uint32_t r : order) {
    if (r != me) others.push_back(r);
  }
  // Sends wait their turn: one leaves per its time at the rate our uplink
  // was seen to carry the rounds (a burst of copies overflows the uplink's
  // queue, as sendAverage says), our shards of the model first, to the
  // owners after us in the order (each owner then takes one worker's
  // shard at a time, from a different uplink each), then our average.
  struct Send {
    uint32_t to;
    Control control;
    uint64_t elements;
    transport::Payload payload;
  };
  std::deque<Send> sends;
  for (size_t k = 1; k < n; ++k) {
    const size_t q = (p + k) % n;
    if (options_.finalMembersSilent && !coordinator) break;
    const ShardRange r = finalShard(numel, n, q);
    sends.push_back({order[q], Control::kFinalScatter, r.length, modelPayload(shardOf(whole, r))});
  }
  stats_.encoded(modelBytes - mine.length * 4, modelBytes - mine.length * 4, 1);
  const double rate = uplinkBytesPerSecond();
  auto nextSend = clock().now();
  const auto sendDue = [&]() -> Status {
    while (!sends.empty() && clock().now() >= nextSend) {
      Send s = std::move(sends.front());
      sends.pop_front();
      GEO_RETURN_IF_ERROR(
          sendPayload({s.to}, s.control, tag, CodecId::kFp32, s.elements, s.payload));
      if (options_.finalDiesMidway) {
        return Status(
            StatusCode::kCancelled,
            "sync: died in the middle of the final average (SyncOptions::finalDiesMidway)");
      }
      if (rate > 0) {
        nextSend = clock().now() +
                   std::chrono::duration_cast<geo::Clock::Duration>(
                       std::chrono::duration<double>(static_cast<double>(s.elements * 4) / rate));
      }
    }
    return {};
  };
  // The next message of `control` from `from` of this attempt; those of an
  // earlier one are dropped.
  const auto take = [&](Control control, uint32_t from) -> std::optional<Message> {
    for (auto m = receiveControl(*transport_, control, from, std::chrono::milliseconds(0)); m.ok();
         m = receiveControl(*transport_, control, from, std::chrono::milliseconds(0))) {
      if (m->header.step == static_cast<uint64_t>(tag)) return std::move(*m);
    }
    return std::nullopt;
  };
  std::vector<double> weight(n);
  for (size_t q = 0; q < n; ++q) weight[q] = group_.weights[*group_.indexOf(order[q])];
  std::vector<std::optional<Message>> parts(n);     // of our shard, from each worker
  std::vector<std::optional<Message>> averages(n);  // of each shard, from its owner
  size_t partsMissing = n - 1;
  size_t averagesMissing = n - 1;
  torch::Tensor ours;  // the average of our shard
  bool refused = false;
  bool toldCoordinator = false;
  // Our shard's average: Σ w_q x_q in the order's (the coordinator's
  // first, scaled by its weight when the second is added, the others
  // added where their messages hold them), times 1 / Σ w_q: the float
  // operations of the whole average (averageModels), on this shard.
  const auto average = [&]() -> Status {
    const torch::Tensor own = shardOf(whole, mine);
    torch::Tensor staging;
    ours = torch::empty({static_cast<int64_t>(mine.length)}, whole.options());
    double total = weight[0];
    for (size_t q = 0; q < n; ++q) {
      std::string reason;
      Status ok;
      if (q == 0) {
        if (p == 0) {
          ours.copy_(own);
        } else {
          ok = checkedCopy(parts[q]->payload.bytes(), ours, std::numeric_limits<float>::max(),
                           reason);
        }
      } else {
        total += weight[q];
        const float scaleFirst = q == 1 ? static_cast<float>(weight[0]) : 1.0f;
        if (q == p) {
          if (scaleFirst != 1.0f) ours.mul_(scaleFirst);
          ours.add_(own, static_cast<float>(weight[q]));
        } else {
          ok = checkedAdd(parts[q]->payload.bytes(), static_cast<float>(weight[q]), ours,
                          std::numeric_limits<float>::max(), reason, staging, scaleFirst);
        }
      }
      if (!ok.ok()) {
        reject(order[q], fmt::format("shard {} of {} of its final model", p + 1, n), reason, ok);
        stats_.missed();
        return ok;
      }
      parts[q].reset();  // let go as it is added
    }
    ours.mul_(static_cast<float>(1.0 / total));
    return {};
  };
  const double latency = farthestOneWaySeconds(others);
  const auto patience =
      rate > 0 ? std::chrono::duration_cast<geo::Clock::Duration>(std::chrono::duration<double>(
                     3 * 2 * static_cast<double>(modelBytes) * static_cast<double>(n - 1) /
                         static_cast<double>(n) / rate +
                     4 * latency + 1))
               : std::chrono::duration_cast<geo::Clock::Duration>(options_.timeout);
  const auto deadline = clock().now() + patience;
  std::vector<bool> reduced(n, false);  // the coordinator's: who holds every shard
  const auto t0 = clock().now();
  while (true) {
    GEO_RETURN_IF_ERROR(serveMembership(steps, flat, true));
    GEO_RETURN_IF_ERROR(sendDue());
    if (!coordinator) {
      if (const std::string gone = finalCoordinatorGone(c); !gone.empty()) {
        return unavailable(fmt::format("no final model from {}: {}", topology_.describe(c), gone));
      }
      if (auto m =
              receiveControl(*transport_, Control::kFinalRequest, c, std::chrono::milliseconds(0));
          m.ok()) {
        next = std::move(*m);
        return false;
      }
    }
    for (size_t q = 0; q < n; ++q) {
      if (q == p || refused) continue;
      if (!parts[q]) {
        if ((parts[q] = take(Control::kFinalScatter, order[q]))) --partsMissing;
      }
      if (!averages[q]) {
        if ((averages[q] = take(Control::kFinalGather, order[q]))) {
          --averagesMissing;
          if (averages[q]->payload.size() != finalShard(numel, n, q).length * 4) {
            std::string reason = "size";
            reject(order[q], fmt::format("shard {} of {} of the final average", q + 1, n), reason,
                   dataLoss("the wrong size"));
            refused = true;
          }
        }
      }
    }
    if (!refused && partsMissing == 0 && !ours.defined()) {
      if (!average().ok()) {
        refused = true;
      } else {
        for (size_t k = 1; k < n; ++k) {
          const size_t q = (p + k) % n;
          sends.push_back({order[q], Control::kFinalGather, mine.length, modelPayload(ours)});
        }
        stats_.encoded(mine.length * 4, mine.length * 4, n - 1);
        GEO_RETURN_IF_ERROR(sendDue());
      }
    }
    const bool complete = !refused && ours.defined() && averagesMissing == 0 && sends.empty();
    if (!coordinator && !toldCoordinator && (complete || refused)) {
      toldCoordinator = true;
      GEO_RETURN_IF_ERROR(sendTo({c}, Control::kFinalReduced, tag, CodecId::kRaw, 0,
                                 std::make_shared<std::vector<std::byte>>(
                                     1, std::byte{complete ? uint8_t{1} : uint8_t{0}})));
    }
    // Take it: the coordinator's word, or our own once every worker holds
    // every shard.
    bool commit = false;
    if (coordinator) {
      for (size_t q = 1; q < n; ++q) {
        if (reduced[q]) continue;
        if (auto m = take(Control::kFinalReduced, order[q])) {
          if (m->payload.size() == 1 && m->payload.bytes()[0] == std::byte{1}) {
            reduced[q] = true;
          } else {
            logger()->warn(
                "sync: {} refused a shard of the final average: taking it again "
                "without reduce-scatter",
                topology_.describe(order[q]));
            refused = true;
          }
        }
      }
      std::string why;
      for (uint32_t r : others) {
        if (membership_.suspected(r) || membership_.joining(r)) {
          why = fmt::format("{} is {}", topology_.describe(r),
                            membership_.joining(r) ? "rejoining" : "suspected");
        }
      }
      if (refused) why = "a shard was refused";
      if (why.empty() && clock().now() >= deadline) {
        why = fmt::format("not every worker held every shard within {:.1f} s",
                          std::chrono::duration<double>(patience).count());
      }
      if (!why.empty()) {
        logger()->warn("sync: the final average by reduce-scatter starts over: {}", why);
        return false;
      }
      commit =
          complete && std::all_of(reduced.begin() + 1, reduced.end(), [](bool b) { return b; });
      if (commit) {
        final_->switchable = false;
        GEO_RETURN_IF_ERROR(sendTo(others, Control::kFinalCommit, tag, CodecId::kRaw, 0,
                                   std::make_shared<std::vector<std::byte>>()));
      }
    } else if (complete) {
      commit = take(Control::kFinalCommit, c).has_value();
      if (commit) final_->switchable = false;
    }
    if (commit) {
      for (size_t q = 0; q < n; ++q) {
        torch::Tensor into = shardOf(whole, finalShard(numel, n, q));
        if (q == p) {
          into.copy_(ours);
        } else {
          GEO_RETURN_IF_ERROR(
              takeFinal(*averages[q], into, order[q],
                        fmt::format("shard {} of {} of the final average", q + 1, n)));
        }
      }
      modified_ = true;
      stats_.waited(since(t0));
      if (!coordinator) {
        GEO_RETURN_IF_ERROR(sendTo({c}, Control::kFinalAck, steps, CodecId::kRaw, 0,
                                   std::make_shared<std::vector<std::byte>>()));
      }
      return true;
    }
    clock().sleepFor(std::chrono::milliseconds(2));
  }
}

void Base::awaitFinalAcks(const std::vector<uint32_t>& to, int64_t steps,
                          const train::FlatParameters& flat) {
  for (uint32_t peer : to) {
    auto ack = awaitFrom(peer, Control::kFinalAck, steps, flat, true,
                         "acknowledgement of the final average", options_.timeout);
    if (!ack.ok()) {
      logger()->warn("sync: {} may not have the final average: {}", topology_.describe(peer),
                     ack.status().message());
    }
  }
}

Status Base::takeFinal(const Message& m, torch::Tensor& into, uint32_t from,
                       const std::string& what) {
  std::string reason;
  if (const Status ok =
          checkedCopy(m.payload.bytes(), into, std::numeric_limits<float>::max(), reason);
      !ok.ok()) {
    reject(from, what, reason, ok);
    stats_.missed();
    return dataLoss(fmt::format(
        "sync: {} from {} was refused ({}): this worker's model is not the job's final model", what,
        topology_.describe(from), reason));
  }
  return {};
}

StatusOr<std::optional<Message>> Base::awaitFinalAverage(uint32_t c, int64_t steps,
                                                         const train::FlatParameters& flat,
                                                         torch::Tensor& whole,
                                                         std::vector<uint32_t>& order) {
  const auto numel = static_cast<uint64_t>(whole.numel());
  const uint32_t me = topology_.rank();
  const auto t0 = clock().now();
  std::vector<bool> have;
  size_t missing = 0;
  size_t self = 0;
  // The members' order, once it is here (it comes before any shard of the
  // coordinator's, and before the whole average, on one connection).
  const auto takeOrder = [&]() -> Status {
    if (!order.empty()) return {};
    auto m = receiveControl(*transport_, Control::kFinalOrder, c, std::chrono::milliseconds(0));
    if (!m.ok()) return {};
    const auto bytes = m->payload.bytes();
    std::vector<uint32_t> ranks(bytes.size() / sizeof(uint32_t));
    std::memcpy(ranks.data(), bytes.data(), ranks.size() * sizeof(uint32_t));
    const auto mine = std::find(ranks.begin(), ranks.end(), me);
    const bool valid =
        bytes.size() % sizeof(uint32_t) == 0 &&
        validFinalOrder(ranks, me, [&](uint32_t r) { return r < topology_.worldSize() && r != c; });
    if (!valid) {
      return dataLoss(fmt::format(
          "sync: the final average's order of members from {} is malformed ({} bytes: ranks of "
          "this job, each once, this worker's among them, expected): this worker's model is not "
          "the job's final model",
          topology_.describe(c), bytes.size()));
    }
    order = std::move(ranks);
    self = static_cast<size_t>(mine - order.begin());
    have.assign(order.size(), false);
    missing = order.size();
    return {};
  };
  // Shard i of the average, checked, into its place in `whole`.
  const auto takeShard = [&](size_t i, uint32_t from, const Message& m) -> Status {
    final_->switchable = false;  // `whole` takes the average's bytes from here on
    torch::Tensor part = shardOf(whole, finalShard(numel, order.size(), i));
    GEO_RETURN_IF_ERROR(takeFinal(
        m, part, from, fmt::format("shard {} of {} of the final average", i + 1, order.size())));
    have[i] = true;
    --missing;
    return {};
  };
  while (true) {
    GEO_RETURN_IF_ERROR(serveMembership(steps, flat, true));
    if (const std::string gone = finalCoordinatorGone(c); !gone.empty()) {
      stats_.waited(since(t0));
      return unavailable(fmt::format("no final model from {}: {}", topology_.describe(c), gone));
    }
    GEO_RETURN_IF_ERROR(takeOrder());
    if (auto m =
            receiveControl(*transport_, Control::kFinalAverage, c, std::chrono::milliseconds(0));
        m.ok()) {
      final_->switchable = false;
      stats_.waited(since(t0));
      return std::optional<Message>(std::move(*m));
    }
    // The coordinator's copy of a suspected member's shard (header.step:
    // its index), in place of the member's own.
    for (auto m = receiveControl(*transport_, Control::kFinalShardAgain, c,
                                 std::chrono::milliseconds(0));
         m.ok() && !order.empty(); m = receiveControl(*transport_, Control::kFinalShardAgain, c,
                                                      std::chrono::milliseconds(0))) {
      const uint64_t i = m->header.step;
      if (i >= order.size() || have[i]) continue;
      GEO_RETURN_IF_ERROR(takeShard(i, c, *m));
    }
    for (size_t i = 0; i < order.size(); ++i) {
      if (have[i]) continue;
      const uint32_t from = i == self ? c : order[i];
      auto m =
          receiveControl(*transport_, Control::kFinalShard, from, std::chrono::milliseconds(0));
      if (!m.ok()) continue;
      GEO_RETURN_IF_ERROR(takeShard(i, from, *m));
      if (i != self || options_.finalMembersSilent) continue;
      const ShardRange r = finalShard(numel, order.size(), i);
      // Ours: to every other member, as it came, one copy per shard's time
      // at the rate our uplink was seen to carry.
      const double rate = uplinkBytesPerSecond();
      std::vector<uint32_t> others;
      for (size_t j = 0; j < order.size(); ++j) {
        if (j != self) others.push_back(order[j]);
      }
      stats_.encoded(r.length * 4, r.length * 4, others.size());
      for (size_t k = 0; k < others.size(); ++k) {
        if (k > 0 && rate > 0) {
          GEO_RETURN_IF_ERROR(pauseServing(static_cast<double>(r.length * 4) / rate, steps, flat));
        }
        GEO_RETURN_IF_ERROR(sendPayload({others[k]}, Control::kFinalShard, steps, CodecId::kFp32,
                                        r.length, m->payload));
      }
    }
    if (!order.empty() && missing == 0) {
      stats_.waited(since(t0));
      return std::optional<Message>();
    }
    clock().sleepFor(std::chrono::milliseconds(2));
  }
}

Status Base::sendAverage(std::vector<uint32_t> to, int64_t steps, const train::FlatParameters& flat,
                         const torch::Tensor& whole) {
  const auto numel = static_cast<uint64_t>(whole.numel());
  const double rate = uplinkBytesPerSecond();
  if (rate <= 0 || to.size() < 2) {
    return sendPayload(to, Control::kFinalAverage, steps, CodecId::kFp32, numel,
                       modelPayload(whole));
  }
  // Sent to every peer at once, the copies left as fast as each connection
  // was paced (bbr's start-up: 2.89 times its estimate each) and overflowed
  // the uplink's queue: on the namespace network every run lost about a
  // fifth of their bytes at the coordinator, and the members had the
  // average after 0.7-1.3 s instead of 0.3-0.4 (docs/wan-emulation.md, "The final
  // average's burst"). So one copy leaves per model's time at the rate the
  // uplink was seen to carry the rounds, the farthest peer first; the last
  // one leaves when it would have behind the others anyway. Joins are
  // served meanwhile.
  std::vector<double> rtt(topology_.worldSize(), -1.0);  // by rank; -1: not measured
  for (const auto& c : transport_->peerCounters()) rtt[c.peer] = c.minRttSeconds;
  std::stable_sort(to.begin(), to.end(), [&](uint32_t a, uint32_t b) { return rtt[a] > rtt[b]; });
  const double gap = static_cast<double>(numel * 4) / rate;
  for (size_t k = 0; k < to.size(); ++k) {
    if (k > 0) GEO_RETURN_IF_ERROR(pauseServing(gap, steps, flat));
    GEO_RETURN_IF_ERROR(sendPayload({to[k]}, Control::kFinalAverage, steps, CodecId::kFp32, numel,
                                    modelPayload(whole)));
  }
  logger()->debug("sync: the final average left for {} peers {:.0f} ms apart ({:.1f} MB/s)",
                  to.size(), gap * 1e3, rate / 1e6);
  return {};
}

Status Base::averageModels(train::FlatParameters& flat, int64_t steps) {
  membership_.setFinishing();
  if (group_.size() <= 1) {
    membership_.setFinalModel();
    return {};
  }
  // Announcements already here count: a worker that finished rejoining a
  // moment ago (its Control::kJoined waits in the inbox) takes part; and a peer
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
  // Alone at the end, with peers that took their last step before us and
  // are gone: they made the job's final average without us (we fell behind
  // them by more than the round time-out), and ours would be a model nobody
  // else holds. (Peers that died without finishing leave the survivor's
  // model the job's.)
  size_t othersAlive = 0;
  std::vector<std::string> finishedWithoutUs;
  for (size_t i = 0; i < group_.size(); ++i) {
    if (i == group_.self) continue;
    if (alive(i)) ++othersAlive;
    if (!alive(i) && peerFinished(i))
      finishedWithoutUs.push_back(topology_.describe(group_.ranks[i]));
  }
  if (othersAlive == 0 && !finishedWithoutUs.empty()) {
    stats_.missed();
    return unavailable(fmt::format(
        "sync: {} took {} last step before this worker and {} gone: the job's final average was "
        "made without it, and this worker's model is not the job's final model (it fell behind "
        "the others by more than sync.timeoutSeconds); the workers that finished hold the job's "
        "model",
        fmt::join(finishedWithoutUs, ", "), finishedWithoutUs.size() == 1 ? "its" : "their",
        finishedWithoutUs.size() == 1 ? "is" : "are"));
  }
  // The whole model: the parameters and the float buffers (batch norm's
  // running statistics), so that every worker ends with the same one.
  // Memory: the coordinator sums in its own model's storage and holds at
  // most finalModelsInFlight() peers' models at a time (each is checked and
  // added where its message holds it, as it is taken, in rank order), and
  // the model itself goes out without a copy (modelPayload). A member sends
  // its model only when asked: pushed as soon as each member finished, a
  // large model's copies reached a coordinator still taking its last steps
  // with all of its rounds' state, and were its peak (docs/algorithms.md,
  // "Memory").
  torch::Tensor whole = train::wholeModel(flat);
  // Its time is logged: a whole fp32 model crosses the WAN twice, seconds
  // for a large one at the end of the job (docs/benchmarks.md).
  const auto t0 = clock().now();
  // Who coordinates is each worker's own choice, from what its membership
  // suspects as it finishes; on full uplinks those views differ (a peer
  // silent for the peer time-out behind the average's own bytes). Two
  // coordinators then made two averages, and a worker ended with success
  // on a model of its own (seen on the namespace network, 2 Mbit/s
  // uplinks: tokyo suspected london as it finished, coordinated, and waited
  // for members that followed london while london waited for tokyo). So
  // the lowest coordinator wins: whoever learns of one below the one it
  // follows -- its request, or a worker's word that it follows it
  // (serveFinalCoordinators) -- follows that one instead, as long as its
  // own model is untouched, and tells the one it left.
  final_.emplace();
  final_->following = coordinator;
  final_->says.resize(group_.size());
  std::optional<Message> asked;  // a request already taken, from the coordinator followed
  while (true) {
    const Status s = final_->following == group_.self
                         ? coordinateFinal(flat, steps, whole, t0)
                         : followFinal(group_.ranks[final_->following], std::move(asked), flat,
                                       steps, whole, t0);
    if (s.ok() || !final_->to) {
      final_.reset();
      return s;
    }
    const size_t left = final_->following;
    const size_t to = *final_->to;
    asked = std::move(final_->request);
    logger()->warn(
        "sync: {} coordinates the final average too ({}): this worker follows it instead of {}",
        topology_.describe(group_.ranks[to]),
        asked                     ? "its request came"
        : final_->leftOutBy == to ? "it counted this worker out"
                                  : "a worker follows it",
        left == group_.self ? "coordinating" : topology_.describe(group_.ranks[left]));
    // The one left, or the members this worker asked, follow it too.
    std::vector<uint32_t> tell = final_->asked;
    if (left != group_.self) tell = {group_.ranks[left]};
    std::erase(tell, group_.ranks[to]);
    const Status told = sendTo(tell, Control::kFinalFollows, steps, CodecId::kRaw, 0,
                               finalFollowsPayload(group_.ranks[to]));
    final_->following = to;
    final_->to.reset();
    final_->request.reset();
    final_->asked.clear();
    final_->requested = false;
    if (!told.ok()) {
      final_.reset();
      return told;
    }
  }
}

Status Base::followFinal(uint32_t c, std::optional<Message> request, train::FlatParameters& flat,
                         int64_t steps, torch::Tensor& whole, Clock::TimePoint t0) {
  const auto numel = static_cast<uint64_t>(whole.numel());
  const uint64_t modelBytes = numel * 4;
  const double megabytes = static_cast<double>(modelBytes) / 1e6;
  const auto unavailableFrom = [&](const Status& why) -> Status {
    if (final_->to) return why;  // a coordinator below this one: averageModels follows it
    // The coordinator made the average without us (it suspected us as it
    // finished, or we fell behind the others by more than the round
    // time-out) or is gone. A fellow that took its average holds the
    // job's model.
    const Status fellow = finalFromFellow(c, flat, steps, whole);
    if (fellow.ok()) {
      logger()->warn(
          "sync: the job's final model from {} in {:.2f} s: {} made the final average without "
          "this worker ({})",
          topology_.describe(group_.ranks[*final_->fellow()]), since(t0), topology_.describe(c),
          why.message());
      return lingerForJoiners(flat, steps);
    }
    if (final_->to || fellow.code() == StatusCode::kDataLoss) return fellow;
    // Nobody sent it. Our model is not the job's: a worker that ended on it
    // with success would hand out a model no other worker holds.
    stats_.missed();
    return unavailable(fmt::format(
        "sync: no final average from {} ({}), and no job's final model from a worker that "
        "follows it ({}): this worker's model is not the job's final model (it fell behind the "
        "others by more than sync.timeoutSeconds, or the coordinator is gone); the workers that "
        "finished hold the job's model",
        topology_.describe(c), why.message(), fellow.message()));
  };
  // The coordinator asks once it has taken its last step and has room
  // for our model; it may wait a round time-out for a straggler first.
  // Its first request says whether to send now or to wait for our turn
  // (a second one): once it has counted us in, how long the models ahead
  // of ours take to cross (one at a time for a large model) bounds
  // nothing, the coordinator's liveness does (awaitCoordinator). A request
  // taken already came with a switch to this coordinator
  // (serveFinalCoordinators).
  StatusOr<Message> asked =
      request ? StatusOr<Message>(std::move(*request))
              : awaitCoordinator(c, Control::kFinalRequest, steps, flat,
                                 "request for this worker's final model", 2 * options_.timeout);
  if (!asked.ok()) return unavailableFrom(asked.status());
  final_->requested = true;
  std::vector<uint32_t> order;  // the workers, by reduce-scatter or in shards
  // By reduce-scatter: until it is taken, or the coordinator starts over
  // (another way, or reduce-scatter again without a worker suspected).
  for (uint32_t attempt = 0, expected = 0;
       readReduceScatterRequest(asked->payload.bytes(), attempt, order); ++expected) {
    const bool valid = attempt == expected && order.size() >= 2 && order[0] == c &&
                       validFinalOrder(order, topology_.rank(),
                                       [&](uint32_t r) { return group_.indexOf(r).has_value(); });
    if (!valid) {
      return dataLoss(fmt::format(
          "sync: the final average's request from {} is malformed (attempt {} of {} workers; "
          "the coordinator first and each worker of the group once, this one among them, "
          "expected): this worker's model is not the job's final model",
          topology_.describe(c), attempt, order.size()));
    }
    std::optional<Message> next;
    auto done = reduceScatterFinal(c, attempt, order, steps, flat, whole, next);
    if (!done.ok()) {
      if (done.status().code() == StatusCode::kDataLoss) return done.status();
      return unavailableFrom(done.status());
    }
    if (*done) {
      logger()->info(
          "sync: the final average from {} in {:.2f} s (by reduce-scatter among {} workers, a "
          "model of {:.1f} MB)",
          topology_.describe(c), since(t0), order.size(), megabytes);
      return lingerForJoiners(flat, steps);
    }
    asked = std::move(*next);
  }
  order.clear();
  if (!finalRequestSaysNow(asked->payload.bytes())) {
    asked = awaitCoordinator(c, Control::kFinalRequest, steps, flat,
                             "go-ahead to send this worker's final model", kWhileAlive);
    if (!asked.ok()) return unavailableFrom(asked.status());
  }
  // A straggler finds the request long after it came, and the notice
  // that the average was made without it behind it: nothing to send.
  const auto leftOut = [&] {
    return unavailableFrom(
        unavailable("it made the average without this worker, whose model did not reach it within "
                    "sync.timeoutSeconds of its request, or was refused"));
  };
  if (receiveControl(*transport_, Control::kFinalAverage, c, std::chrono::milliseconds(0)).ok()) {
    return leftOut();  // only a notice can come before our model has gone
  }
  stats_.encoded(modelBytes, modelBytes, 1);
  GEO_RETURN_IF_ERROR(sendPayload({c}, Control::kFinalContribution, steps, CodecId::kFp32, numel,
                                  modelPayload(whole)));
  // The coordinator takes the models of the peers after us, then sends
  // the average to each in turn or in shards, or tells us it was made
  // without us. It comes after the coordinator had all of our model:
  // what we sent from `whole` has left, and `whole` may take the average.
  auto got = awaitFinalAverage(c, steps, flat, whole, order);
  if (!got.ok()) {
    if (got.status().code() == StatusCode::kDataLoss) return got.status();
    return unavailableFrom(got.status());
  }
  if (got->has_value()) {
    const Message& m = **got;
    if (m.payload.size() == 0) return leftOut();
    GEO_RETURN_IF_ERROR(takeFinal(m, whole, c, "the final average"));
  }
  modified_ = true;
  logger()->info("sync: the final average from {} in {:.2f} s ({}a model of {:.1f} MB)",
                 topology_.describe(c), since(t0),
                 got->has_value()
                     ? std::string()
                     : fmt::format("in {} shards forwarded by the members, ", order.size()),
                 megabytes);
  // The coordinator waits for this before it leaves: the average may have
  // queued behind a slow uplink for longer than the transport's linger.
  // So do the members of a sharded average, whose forwarded shards may be
  // queued as well: each hears it from each.
  std::vector<uint32_t> others;
  for (uint32_t r : order) {
    if (r != topology_.rank()) others.push_back(r);
  }
  std::vector<uint32_t> ackTo = others;
  ackTo.push_back(c);
  GEO_RETURN_IF_ERROR(sendTo(ackTo, Control::kFinalAck, steps, CodecId::kRaw, 0,
                             std::make_shared<std::vector<std::byte>>()));
  for (uint32_t peer : others) {
    auto ack = awaitFrom(peer, Control::kFinalAck, steps, flat, true,
                         "acknowledgement of the final average", options_.timeout);
    if (!ack.ok()) {
      logger()->warn("sync: {} may not have this worker's shard of the final average: {}",
                     topology_.describe(peer), ack.status().message());
    }
  }
  return lingerForJoiners(flat, steps);
}

Status Base::coordinateFinal(train::FlatParameters& flat, int64_t steps, torch::Tensor& whole,
                             Clock::TimePoint t0) {
  const auto numel = static_cast<uint64_t>(whole.numel());
  const uint64_t modelBytes = numel * 4;
  const double megabytes = static_cast<double>(modelBytes) / 1e6;
  // Σ w_i x_i in rank order (we are the first alive: ours comes first),
  // each peer's model checked and added where its message holds it, as it
  // is taken, then divided by the weight of those that arrived. The sum
  // lies in `whole`: ours is scaled by its weight when the first peer's
  // model passes (until then `whole` is our model, untouched if none
  // does), which gives the bytes a separate zeroed sum gave.
  const auto alive = [&](size_t i) {
    return !membership_.suspected(group_.ranks[i]) && !membership_.joining(group_.ranks[i]);
  };
  std::vector<size_t> members;
  for (size_t i = 0; i < group_.size(); ++i) {
    if (i != group_.self && alive(i)) members.push_back(i);
  }
  // A worker counted out (suspected; one rejoining gets the job's model by
  // its join) hears so, with whom the average is made: where it hears us
  // while we do not hear it (pings queued behind a full uplink on its side
  // only), it would wait for a request that never comes, and fail. Not
  // one silent for the round time-out: gone, and a message queued for it
  // only keeps the connection lingering as this worker exits.
  std::vector<bool> toldLeftOut(group_.size());
  const auto tellLeftOut = [&]() -> Status {
    std::vector<uint32_t> averaged{topology_.rank()};
    for (size_t i : members) averaged.push_back(group_.ranks[i]);
    const double limit = std::chrono::duration<double>(options_.timeout).count();
    const auto counters = transport_->peerCounters();
    std::vector<uint32_t> out;
    for (size_t i = 0; i < group_.size(); ++i) {
      const uint32_t r = group_.ranks[i];
      // A lower rank follows one below us, or itself: never us.
      if (i <= group_.self || toldLeftOut[i] || membership_.joining(r) ||
          std::ranges::find(members, i) != members.end()) {
        continue;
      }
      const bool recent = std::ranges::any_of(counters, [&](const auto& c) {
        return c.peer == r && c.heard && c.silentSeconds < limit;
      });
      if (!recent) continue;
      toldLeftOut[i] = true;
      out.push_back(r);
    }
    if (out.empty()) return {};
    logger()->info(
        "sync: the final average is made without {} (suspected): telling {} so, and who holds "
        "the job's model",
        topology_.describe(out), out.size() == 1 ? "it" : "them");
    return sendTo(out, Control::kFinalLeftOut, steps, CodecId::kRaw, 0,
                  finalLeftOutPayload(averaged));
  };
  GEO_RETURN_IF_ERROR(tellLeftOut());
  // By reduce-scatter where it pays (finalWay): no model comes here. Once
  // a member is suspected in the middle it is tried again without it; once
  // it fails otherwise (a refused shard, shards too late), the average is
  // taken here, in shards or whole. Every worker's model is untouched
  // until the coordinator says to take the average.
  for (uint32_t attempt = 0, allowed = 1; allowed != 0; ++attempt) {
    std::vector<uint32_t> order{topology_.rank()};
    for (size_t i : members) order.push_back(group_.ranks[i]);
    const std::vector<uint32_t> to(order.begin() + 1, order.end());
    if (finalWay(to, modelBytes, true, attempt == 0) != FinalAverageWay::kReduceScatter) break;
    GEO_RETURN_IF_ERROR(sendTo(to, Control::kFinalRequest, steps, CodecId::kRaw, 0,
                               reduceScatterRequest(attempt, order)));
    final_->asked = to;
    std::optional<Message> unused;
    auto done = reduceScatterFinal(topology_.rank(), attempt, order, steps, flat, whole, unused);
    if (!done.ok()) return done.status();
    if (*done) {
      // Each member acknowledges once it took the average: stay until
      // then, or until it is suspected.
      awaitFinalAcks(to, steps, flat);
      logger()->info(
          "sync: the final average of {} models in {:.2f} s by reduce-scatter: each worker "
          "averaged one shard of {} ({:.1f} MB a model) and sent it to the others",
          order.size(), since(t0), order.size(), megabytes);
      return lingerForJoiners(flat, steps);
    }
    const size_t before = members.size();
    std::erase_if(members, [&](size_t i) { return !alive(i); });
    allowed = members.size() < before ? 1 : 0;
    GEO_RETURN_IF_ERROR(tellLeftOut());
  }
  const size_t window = finalModelsInFlight(modelBytes, options_.finalModelsInFlightBytes);
  const auto ask = [&](size_t k, bool now) {
    return sendTo(
        {group_.ranks[members[k]]}, Control::kFinalRequest, steps, CodecId::kRaw, 0,
        std::make_shared<std::vector<std::byte>>(1, std::byte{now ? uint8_t{1} : uint8_t{0}}));
  };
  // Every member hears at once that it is counted in: the first `window`
  // are asked to send now, the others to wait for their turn.
  for (size_t k = 0; k < members.size(); ++k) GEO_RETURN_IF_ERROR(ask(k, k < window));
  final_->asked.clear();
  for (size_t i : members) final_->asked.push_back(group_.ranks[i]);
  size_t asked = std::min(window, members.size());
  torch::Tensor theirs;  // a peer's model, staged only when its bytes are unaligned
  double total = group_.weights[group_.self];
  std::vector<uint32_t> to;
  for (size_t k = 0; k < members.size(); ++k) {
    const size_t i = members[k];
    {
      auto m = awaitFrom(group_.ranks[i], Control::kFinalContribution, steps, flat, true,
                         "final model", options_.timeout);
      if (!m.ok() && final_->to) return m.status();  // a coordinator below this one
      if (!m.ok()) {
        logger()->warn("sync: final average without {}: {}", topology_.describe(group_.ranks[i]),
                       m.status().message());
        stats_.missed();
      } else {
        // Our model is the sum's storage from here on: this worker can no
        // longer hand it to another coordinator.
        final_->switchable = false;
        std::string reason;
        const float scaleOurs = to.empty() ? static_cast<float>(group_.weights[group_.self]) : 1.0f;
        if (const Status ok =
                checkedAdd(m->payload.bytes(), static_cast<float>(group_.weights[i]), whole,
                           std::numeric_limits<float>::max(), reason, theirs, scaleOurs);
            !ok.ok()) {
          reject(group_.ranks[i], "the final model", reason, ok);
          stats_.missed();
        } else {
          total += group_.weights[i];
          to.push_back(group_.ranks[i]);
        }
      }
    }  // its message is let go before the next one is asked for
    if (asked < members.size()) GEO_RETURN_IF_ERROR(ask(asked++, true));
  }
  theirs = torch::Tensor();
  const double taken = since(t0);
  if (!to.empty()) {
    whole.mul_(static_cast<float>(1.0 / total));
    modified_ = true;
  }
  // A member asked but left out (its model came too late, or was refused)
  // is told so at once, an empty average: it waits for the average while
  // we live, and we may live on long after this (exporting the model).
  for (size_t i : members) {
    if (std::find(to.begin(), to.end(), group_.ranks[i]) != to.end()) continue;
    GEO_RETURN_IF_ERROR(sendTo({group_.ranks[i]}, Control::kFinalAverage, steps, CodecId::kRaw, 0,
                               std::make_shared<std::vector<std::byte>>()));
  }
  const bool shards = finalWay(to, modelBytes, false) == FinalAverageWay::kShards;
  if (shards) {
    // Waits for every acknowledgement itself, and sends the whole average
    // to a member whose shards did not all come.
    stats_.encoded(modelBytes, modelBytes, 1);
    GEO_RETURN_IF_ERROR(sendAverageInShards(to, steps, flat, whole));
  } else {
    stats_.encoded(modelBytes, modelBytes, to.size());
    GEO_RETURN_IF_ERROR(sendAverage(to, steps, flat, whole));
    // A send is only queued: leaving now would drop an average still waiting
    // for a slow uplink (a whole fp32 model: seconds at a few Mbit/s, beyond
    // the transport's linger), and that worker would end on its own model.
    // So stay until each has acknowledged it, or is suspected (silent: gone).
    awaitFinalAcks(to, steps, flat);
  }
  logger()->info(
      "sync: the final average of {} models in {:.2f} s: {:.2f} s to take the others' ({:.1f} MB "
      "each), {:.2f} s until each acknowledged it{}",
      to.size() + 1, since(t0), taken, megabytes, since(t0) - taken,
      shards ? fmt::format(" (handed out in {} shards, each forwarded by its member)", to.size())
             : std::string());
  return lingerForJoiners(flat, steps);
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
  return detail::makeHierarchical(options, topology, transport, std::move(inner));
}

}  // namespace geo::sync
