#pragma once
// Pieces shared by the synchronizers (not a public interface): the group of
// ranks an algorithm runs among, the encoding of a whole flat parameter
// buffer, statistics, bounded receives and the final model average.

#include <torch/torch.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "worker/sync/synchronizer.h"

namespace geo::sync::detail {

using Clock = std::chrono::steady_clock;

// Message rounds outside any algorithm's range, for end-of-training traffic.
inline constexpr uint64_t kFinalAverageRound = ~uint64_t{0};
inline constexpr uint64_t kFinishedRound = ~uint64_t{0} - 1;
inline constexpr uint64_t kResyncRound = ~uint64_t{0} - 2;

// The ranks a WAN algorithm runs among (all ranks, or the region leaders),
// ascending, with the weight of each in an average (they sum to 1: uniform,
// or region size / world size for leaders).
struct Group {
  std::vector<uint32_t> ranks;
  std::vector<double> weights;
  size_t self = 0;  // index of this rank in `ranks`

  size_t size() const { return ranks.size(); }
  uint32_t selfRank() const { return ranks[self]; }
};

// Encodes a flat fp32 buffer made of parameter tensors of the given sizes:
// with qsgd, tensors under the small-tensor threshold travel as raw fp32 and
// the others are quantized each on their own (buckets never straddle two
// tensors); other codecs encode the whole buffer at once. The wire format is
// the segments' encodings back to back.
class FlatCodec {
 public:
  FlatCodec(std::shared_ptr<const codec::Codec> codec, const std::vector<int64_t>& sizes,
            int64_t smallTensorThreshold);

  transport::CodecId id() const { return codec_->id(); }
  std::string describe() const { return codec_->describe(); }
  int64_t numel() const { return numel_; }
  int64_t encodedBytes() const { return bytes_; }
  // `stream` names the random stream (segments derive their own from it).
  std::vector<std::byte> encode(const torch::Tensor& values, uint64_t seed, uint64_t stream,
                                torch::Tensor* residual) const;
  void decodeAccumulate(std::span<const std::byte> bytes, float alpha, torch::Tensor& out) const;

 private:
  struct Segment {
    int64_t offset = 0;
    int64_t numel = 0;
    int64_t byteOffset = 0;
    int64_t bytes = 0;
    bool raw = false;
  };
  std::shared_ptr<const codec::Codec> codec_;
  std::shared_ptr<const codec::Codec> raw_;
  std::vector<Segment> segments_;
  int64_t numel_ = 0;
  int64_t bytes_ = 0;
};

uint64_t mixStream(uint64_t a, uint64_t b, uint64_t c);

// Sends one buffer to each rank in `to` without copying it per peer; an
// error names the peer and the message.
Status sendBuffer(transport::Transport& transport, const Topology& topology,
                  const std::vector<uint32_t>& to, transport::MessageKind kind,
                  const transport::SendMeta& meta,
                  std::shared_ptr<const std::vector<std::byte>> bytes,
                  std::chrono::milliseconds timeout);

class StatsRecorder;
// A bounded receive that records the time waited in `stats`; on failure the
// Status (DeadlineExceeded on timeout) names the peer, what was awaited and
// the timeout.
StatusOr<transport::Message> receiveBounded(transport::Transport& transport,
                                            const Topology& topology, uint32_t peer,
                                            transport::MessageKind kind, uint64_t round,
                                            std::chrono::milliseconds timeout,
                                            const std::string& what, StatsRecorder& stats);

// Thread-safe statistics with the recording helpers every algorithm uses.
class StatsRecorder {
 public:
  void applied(int64_t staleness);
  void missed(uint64_t n = 1);
  void waited(double seconds);
  void coded(double seconds);
  void encoded(uint64_t payloadBytes, uint64_t encodedBytes, uint64_t destinations);
  void roundDone(double seconds);
  void setDelay(int64_t delay);
  SyncStats snapshot() const;
  void merge(const SyncStats& inner);  // adds another recorder's snapshot

 private:
  mutable std::mutex mu_;
  SyncStats stats_;
};

// Common state and helpers of an algorithm running among `group` ranks.
class Base : public Synchronizer {
 public:
  Base(SyncOptions options, Topology topology, transport::Transport* transport, Group group);
  SyncStats stats() const override { return stats_.snapshot(); }

  // Whether the last afterStep() changed the parameters (the hierarchical
  // wrapper forwards them to the region's members only then).
  bool modifiedParameters() const { return modified_; }

 protected:
  // Builds the codecs for `flat` on first use.
  void ensureCodec(const train::FlatParameters& flat);

  // Sends one buffer to each rank in `to` without copying it per peer.
  Status sendTo(const std::vector<uint32_t>& to, transport::MessageKind kind, uint64_t round,
                int64_t step, transport::CodecId codec, uint64_t elements,
                std::shared_ptr<const std::vector<std::byte>> bytes);
  // A bounded receive that records the wait; DeadlineExceeded names the
  // peer, what was awaited and the timeout.
  StatusOr<transport::Message> receiveFrom(uint32_t peer, transport::MessageKind kind,
                                           uint64_t round, std::chrono::milliseconds timeout,
                                           const std::string& what);
  // Averages the fp32 models of the group (weights, rank order) so that
  // every member ends with the same bits. Absent peers are skipped; the
  // weights of those present are renormalized.
  Status averageModels(train::FlatParameters& flat, const std::vector<bool>& absent);

  SyncOptions options_;
  Topology topology_;
  transport::Transport* transport_;
  Group group_;
  StatsRecorder stats_;
  std::unique_ptr<FlatCodec> codec_;
  bool modified_ = false;
};

std::unique_ptr<Base> makeAllreduce(const SyncOptions& o, const Topology& t,
                                    transport::Transport* tr, Group g);
std::unique_ptr<Base> makeDts(const SyncOptions& o, const Topology& t, transport::Transport* tr,
                              Group g);
std::unique_ptr<Base> makeSwarm(const SyncOptions& o, const Topology& t, transport::Transport* tr,
                                Group g);

double secondsSince(Clock::time_point t0);

// Tensor <-> byte buffers (contiguous fp32 CPU tensors).
std::shared_ptr<std::vector<std::byte>> tensorBytes(const torch::Tensor& t);
void copyBytesTo(std::span<const std::byte> bytes, torch::Tensor& out);

}  // namespace geo::sync::detail
