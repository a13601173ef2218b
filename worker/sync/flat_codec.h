#pragma once
// The encoding of a whole flat parameter buffer for the wire, and the checks
// every contribution from a peer passes before it is used. Shared by the
// synchronizers and the codec fuzzer (tests/fuzz/codec_fuzzer.cc); depends on
// the codecs and LibTorch only.

#include <torch/torch.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "worker/codec/codec.h"

namespace geo::sync::detail {

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
  // Decodes a contribution from a peer into `out` (overwritten) and checks
  // it: its size, the codec's own rules (e.g. a QSGD scale that is not a
  // finite, non-negative number), and that every value is finite and within
  // +-kMaxContribution. Never throws; on failure `reason` is set to a metric
  // label (size, malformed, non_finite, out_of_range) and the Status says
  // what was wrong (the caller adds the peer and round).
  Status decodeChecked(std::span<const std::byte> bytes, torch::Tensor& out,
                       std::string& reason) const;

  // Slice by slice, for a large model (docs/algorithms.md, "Memory"): a
  // pass that holds a slice of the model at a time instead of a whole one.
  //
  // Where such a pass may cut the buffer: ascending positions from 0 to
  // numel(), at most maxNumel apart except where a segment cannot be cut
  // that finely (QSGD cuts on whole buckets; maxNumel >= 1).
  std::vector<int64_t> sliceBounds(int64_t maxNumel) const;
  // decodeAccumulate() of values [lo, lo + out.numel()) only, into `out`
  // (contiguous fp32, that many values): the same values at those
  // positions, bit for bit. lo and lo + out.numel() must be bounds of
  // sliceBounds() (throws geo::Error otherwise, or for a payload of the
  // wrong size).
  void decodeAccumulateRange(std::span<const std::byte> bytes, float alpha, int64_t lo,
                             torch::Tensor& out) const;
  // decodeChecked()'s verdict on a whole contribution, decoded a slice at a
  // time into `scratch` (its numel() is the slice length; its contents are
  // left undefined): whether the contribution may be used. Never throws.
  Status check(std::span<const std::byte> bytes, torch::Tensor& scratch, std::string& reason) const;

  // Shard by shard, for DTS's reduce-scatter exchange (docs/algorithms.md,
  // "Reduce-scatter"): each shard travels in an encoding of its own, which
  // its owner decodes, averages with the others' and encodes again.
  //
  // `parts` contiguous shards of the buffer, as equal as the cuts allow:
  // parts + 1 ascending positions from 0 to numel(), each a position a
  // range may start at (a segment's start, a raw value, a multiple of the
  // codec's rangeAlignment() inside a quantized segment). A shard may be
  // empty where the cuts are coarser than numel() / parts (parts >= 1).
  std::vector<int64_t> shardBounds(size_t parts) const;
  // The bytes of values [lo, hi) in their own encoding: each segment's part
  // of the range encoded on its own (raw: its fp32 values), in order. lo and
  // hi from shardBounds() (throws geo::Error otherwise).
  int64_t rangeEncodedBytes(int64_t lo, int64_t hi) const;
  // Values [lo, hi) of a whole encoding (encode()'s `bytes`), in their own
  // encoding: decodeRangeAccumulate() of the result adds at each position
  // exactly what decodeAccumulate() of `bytes` adds there.
  std::vector<std::byte> rangeEncoding(std::span<const std::byte> bytes, int64_t lo,
                                       int64_t hi) const;
  // Encodes `values` (hi - lo of them, those of positions [lo, hi)) in
  // that range's own encoding; `stream` as encode()'s. No residual.
  std::vector<std::byte> encodeRange(const torch::Tensor& values, int64_t lo, uint64_t seed,
                                     uint64_t stream) const;
  // out += alpha * the values of a range's own encoding (out holds hi - lo
  // values, those of [lo, hi)). Throws geo::Error for a payload of the
  // wrong size or one the codec refuses.
  void decodeRangeAccumulate(std::span<const std::byte> bytes, float alpha, int64_t lo,
                             torch::Tensor& out) const;
  // decodeChecked() for a range's own encoding: `out` (hi - lo values) is
  // overwritten with the decoded values, which must all be finite and
  // within +-kMaxContribution. Never throws.
  Status decodeRangeChecked(std::span<const std::byte> bytes, int64_t lo, torch::Tensor& out,
                            std::string& reason) const;

 private:
  struct Segment {
    int64_t offset = 0;
    int64_t numel = 0;
    int64_t byteOffset = 0;
    int64_t bytes = 0;
    bool raw = false;
  };
  // decodeChecked()'s and check()'s refusal of a payload of the wrong size.
  Status wrongSize(size_t bytes, std::string& reason) const;
  // The parts of segments in [lo, hi): {segment index, a, b} with a < b
  // the part's positions inside its segment, in order.
  struct Piece {
    size_t segment = 0;
    int64_t a = 0, b = 0;
  };
  std::vector<Piece> pieces(int64_t lo, int64_t hi) const;
  int64_t pieceBytes(const Piece& p) const;
  std::shared_ptr<const codec::Codec> codec_;
  std::vector<Segment> segments_;
  int64_t numel_ = 0;
  int64_t bytes_ = 0;
  int64_t rawNumel_ = 0;  // values in raw segments, all together
  // The raw segments' positions in the flat buffer, in order (int64, on the
  // CPU), and a copy on the device last asked for: a GPU model's raw
  // segments are gathered, cleared and added to with one operation each
  // instead of one per segment (resnet18 has 44 of them, and each
  // operation on a GPU costs a launch). Guarded: the job model may be
  // computed on another thread than the training thread.
  torch::Tensor rawIndex_;
  torch::Tensor rawIndexOn(const torch::Device& device) const;
  mutable std::mutex rawIndexMu_;
  mutable torch::Tensor rawIndexOnDevice_;
};

// A random stream id for (a, b, c): distinct triples give unrelated Philox
// streams.
uint64_t mixStream(uint64_t a, uint64_t b, uint64_t c);

// The largest magnitude a value of a peer's contribution may have. An update
// is the progress of a few optimizer steps, a swarm message the difference of
// two models: nothing a converging run sends comes near; a forged frame or a
// diverged peer does (1e38 is finite).
inline constexpr float kMaxContribution = 1e6f;

// Whether `t` holds only finite values within +-limit; else a message
// naming how many values broke the rule.
Status checkValues(const torch::Tensor& t, float limit, std::string& reason);

// Copies a peer's raw fp32 values (a model, a region-average gradient, a
// resync reference) into `out` (contiguous fp32) only if there are exactly
// out.numel() of them and each is finite and within +-limit; otherwise
// `out` is left untouched, `reason` is set to size, non_finite or
// out_of_range, and the Status says what was wrong. Never throws.
Status checkedCopy(std::span<const std::byte> bytes, torch::Tensor& out, float limit,
                   std::string& reason);

// sum += alpha * a peer's raw fp32 values, under checkedCopy()'s rules
// (`sum` untouched if they break one). The values are checked and added
// where they lie (the final average's peak held a checked copy of each
// peer's model beside its message); bytes that are not 4-byte aligned are
// staged in `staging` first; a sum on a GPU takes them through a copy on
// the device. `scaleFirst` other than 1: sum *= scaleFirst once the values
// have passed, before they are added (a sum kept in the storage of its
// first term, which is scaled only when a second one comes). Never throws.
Status checkedAdd(std::span<const std::byte> bytes, float alpha, torch::Tensor& sum, float limit,
                  std::string& reason, torch::Tensor& staging, float scaleFirst = 1.0f);

}  // namespace geo::sync::detail
