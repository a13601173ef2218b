#include "worker/sync/flat_codec.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <numeric>
#include <utility>

#include "common/enforce.h"

namespace geo::sync::detail {

using transport::CodecId;

uint64_t mixStream(uint64_t a, uint64_t b, uint64_t c) {
  // splitmix64 finalizer over a simple combination: distinct (a, b, c) give
  // unrelated Philox streams.
  uint64_t x = a * 0x9E3779B97F4A7C15ull ^ (b + 0x632BE59BD9B4E019ull) * 0xBF58476D1CE4E5B9ull ^
               (c + 0x94D049BB133111EBull);
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

namespace {

// to[k] = alpha * the k-th fp32 value at `from` (raw segment bytes, not
// necessarily aligned), for k < n: the raw segments' half of a decode.
void scaleRaw(const std::byte* from, int64_t n, float alpha, float* to) {
  for (int64_t k = 0; k < n; ++k) {
    float x;
    std::memcpy(&x, from + 4 * k, 4);
    to[k] = alpha * x;
  }
}

// A peer's raw fp32 values, exactly n of them, checked under checkValues()
// with `limit`: a view of `bytes` where they are 4-byte aligned, else a
// copy in `staging` (a float view of unaligned bytes would be undefined).
// Valid while `bytes` is. A refused payload is never copied anywhere: a
// model-sized staging copy was a whole model more at the final average's
// peak.
StatusOr<torch::Tensor> checkedFloats(std::span<const std::byte> bytes, int64_t n, float limit,
                                      std::string& reason, torch::Tensor& staging) {
  if (static_cast<int64_t>(bytes.size()) != n * 4) {
    reason = "size";
    return dataLoss(fmt::format("{} bytes, expected {} ({} fp32 values)", bytes.size(), n * 4, n));
  }
  if (n == 0) return torch::empty({0}, torch::kFloat32);
  torch::Tensor values;
  if (reinterpret_cast<uintptr_t>(bytes.data()) % alignof(float) == 0) {
    values = torch::from_blob(const_cast<std::byte*>(bytes.data()), {n}, torch::kFloat32);
  } else {
    if (!staging.defined() || staging.numel() != n) staging = torch::empty({n}, torch::kFloat32);
    std::memcpy(staging.data_ptr<float>(), bytes.data(), bytes.size());
    values = staging;
  }
  GEO_RETURN_IF_ERROR(checkValues(values, limit, reason));
  return values;
}

}  // namespace

FlatCodec::FlatCodec(std::shared_ptr<const codec::Codec> codec, const std::vector<int64_t>& sizes,
                     int64_t smallTensorThreshold)
    : codec_(std::move(codec)) {
  numel_ = std::accumulate(sizes.begin(), sizes.end(), int64_t{0});
  if (codec_->id() != CodecId::kQsgd) {
    segments_.push_back({0, numel_, 0, codec_->encodedBytes(numel_), false});
    bytes_ = segments_.back().bytes;
    return;
  }
  int64_t offset = 0;
  for (int64_t n : sizes) {
    if (n == 0) continue;
    Segment s;
    s.offset = offset;
    s.numel = n;
    s.byteOffset = bytes_;
    s.raw = n < smallTensorThreshold;
    // A raw segment's bytes are its fp32 values, as identity's frames carry them.
    s.bytes = s.raw ? static_cast<int64_t>(transport::codecValueBytes(CodecId::kFp32)) * n
                    : codec_->encodedBytes(n);
    if (s.raw) rawNumel_ += n;
    segments_.push_back(s);
    offset += n;
    bytes_ += s.bytes;
  }
  if (rawNumel_ > 0) {
    rawIndex_ = torch::empty({rawNumel_}, torch::kInt64);
    int64_t* at = rawIndex_.data_ptr<int64_t>();
    for (const Segment& s : segments_) {
      if (!s.raw) continue;
      std::iota(at, at + s.numel, s.offset);
      at += s.numel;
    }
  }
}

torch::Tensor FlatCodec::rawIndexOn(const torch::Device& device) const {
  if (device.is_cpu()) return rawIndex_;
  std::lock_guard lock(rawIndexMu_);
  if (!rawIndexOnDevice_.defined() || rawIndexOnDevice_.device() != device) {
    rawIndexOnDevice_ = rawIndex_.to(device);
  }
  return rawIndexOnDevice_;
}

std::vector<std::byte> FlatCodec::encode(const torch::Tensor& values, uint64_t seed,
                                         uint64_t stream, torch::Tensor* residual) const {
  GEO_ENFORCE_EQ(values.numel(), numel_, "sync: parameter count changed");
  std::vector<std::byte> out(static_cast<size_t>(bytes_));
  // The raw (small) segments all at once: their values, with the residual
  // folded in and then cleared (identity leaves none), gathered into one
  // tensor and copied to the host in one go. A GPU worker's model has tens
  // of them (biases, norms' weights): one transfer each cost more than
  // quantizing the rest.
  if (rawNumel_ > 0) {
    const torch::Tensor index = rawIndexOn(values.device());
    torch::Tensor raw = values.index_select(0, index);
    if (residual != nullptr) {
      raw.add_(residual->index_select(0, index));
      residual->index_fill_(0, index, 0.0f);
    }
    raw = raw.to(torch::kCPU).contiguous();
    const auto* from = reinterpret_cast<const std::byte*>(raw.data_ptr<float>());
    for (const Segment& s : segments_) {
      if (!s.raw) continue;
      std::memcpy(out.data() + s.byteOffset, from, static_cast<size_t>(s.bytes));
      from += s.bytes;
    }
  }
  // The others in one call, each with its own random stream: on a GPU one
  // pass over the device for all of them.
  std::vector<codec::Codec::Slice> slices;
  slices.reserve(segments_.size());
  for (size_t i = 0; i < segments_.size(); ++i) {
    const Segment& s = segments_[i];
    if (!s.raw)
      slices.push_back({s.offset, s.numel, s.byteOffset, {seed, mixStream(stream, i, 0x5e9)}});
  }
  codec_->encodeSlices(values, slices, out, residual);
  return out;
}

void FlatCodec::decodeAccumulate(std::span<const std::byte> bytes, float alpha,
                                 torch::Tensor& out) const {
  GEO_ENFORCE_EQ(static_cast<int64_t>(bytes.size()), bytes_,
                 "sync: an update of {} bytes does not match this model's encoding ({} bytes, {})",
                 bytes.size(), bytes_, codec_->describe());
  // The raw segments: alpha * value on the host for all of them, one copy to
  // out's device, then out += that per segment -- the fp32 operations of
  // identity's decodeAccumulate (o + alpha * x), on either device.
  if (rawNumel_ > 0) {
    torch::Tensor scaled = torch::empty({rawNumel_}, torch::kFloat32);
    float* to = scaled.data_ptr<float>();
    for (const Segment& s : segments_) {
      if (!s.raw) continue;
      scaleRaw(bytes.data() + s.byteOffset, s.numel, alpha, to);
      to += s.numel;
    }
    if (!out.device().is_cpu()) scaled = scaled.to(out.device());
    // Each position once: out + scaled, one rounding, as add_ gives.
    out.index_add_(0, rawIndexOn(out.device()), scaled);
  }
  std::vector<codec::Codec::Slice> slices;
  slices.reserve(segments_.size());
  for (const Segment& s : segments_) {
    if (!s.raw) slices.push_back({s.offset, s.numel, s.byteOffset, {}});
  }
  codec_->decodeAccumulateSlices(bytes, slices, alpha, out);
}

Status checkValues(const torch::Tensor& t, float limit, std::string& reason) {
  if (t.numel() == 0) return {};
  // One pass and no tensor of the input's size: the smallest and largest
  // value (a NaN propagates into both, an infinity into one). A model-sized
  // temporary (isfinite's, abs()'s) page-faulted in on every call cost a
  // 20M-parameter worker more than the check itself.
  const auto [low, high] = torch::aminmax(t);
  const float lowest = low.item<float>();
  const float highest = high.item<float>();
  if (!std::isfinite(lowest) || !std::isfinite(highest)) {
    const int64_t nonFinite = t.numel() - torch::isfinite(t).sum().item<int64_t>();
    reason = "non_finite";
    return dataLoss(fmt::format("{} of {} values are NaN or infinite", nonFinite, t.numel()));
  }
  const float largest = std::max(-lowest, highest);
  if (largest > limit) {
    reason = "out_of_range";
    return dataLoss(
        fmt::format("a value of magnitude {:.3g} exceeds the limit of {:.0e}", largest, limit));
  }
  return {};
}

Status checkedCopy(std::span<const std::byte> bytes, torch::Tensor& out, float limit,
                   std::string& reason) {
  // A refused payload must not touch `out`: the values are checked where
  // they lie, and copied once they pass.
  torch::Tensor staging;
  auto values = checkedFloats(bytes, out.numel(), limit, reason, staging);
  if (!values.ok()) return values.status();
  out.view({-1}).copy_(*values);
  return {};
}

Status checkedAdd(std::span<const std::byte> bytes, float alpha, torch::Tensor& sum, float limit,
                  std::string& reason, torch::Tensor& staging, float scaleFirst) {
  auto values = checkedFloats(bytes, sum.numel(), limit, reason, staging);
  if (!values.ok()) return values.status();
  if (scaleFirst != 1.0f) sum.mul_(scaleFirst);
  // A GPU model's sum takes them through a copy on the device.
  const torch::Tensor here = sum.device().is_cpu() ? *values : values->to(sum.device());
  sum.view({-1}).add_(here, alpha);
  return {};
}

Status FlatCodec::wrongSize(size_t bytes, std::string& reason) const {
  reason = "size";
  return dataLoss(
      fmt::format("{} bytes, expected {} ({}): do all workers run the same model and codec?", bytes,
                  bytes_, codec_->describe()));
}

Status FlatCodec::decodeChecked(std::span<const std::byte> bytes, torch::Tensor& out,
                                std::string& reason) const {
  if (static_cast<int64_t>(bytes.size()) != bytes_) return wrongSize(bytes.size(), reason);
  out.zero_();
  try {
    decodeAccumulate(bytes, 1.0f, out);
  } catch (const std::exception& e) {
    reason = "malformed";
    return dataLoss(fmt::format("cannot be decoded: {}", e.what()));
  }
  return checkValues(out, kMaxContribution, reason);
}

std::vector<int64_t> FlatCodec::sliceBounds(int64_t maxNumel) const {
  GEO_ENFORCE(maxNumel >= 1, "sync: a slice of {} values", maxNumel);
  std::vector<int64_t> bounds{0};
  int64_t lo = 0;
  for (const Segment& s : segments_) {
    const int64_t step = s.raw ? 1 : codec_->rangeAlignment();
    const int64_t end = s.offset + s.numel;
    // The slice that began at lo (here, or in an earlier segment that could
    // not be cut finely enough) ends at the furthest cut of this segment
    // that keeps it within maxNumel: this segment's start at the earliest,
    // and a step on where a step is longer.
    while (end - lo > maxNumel) {
      int64_t cut = lo + maxNumel <= s.offset ? s.offset
                                              : s.offset + (lo + maxNumel - s.offset) / step * step;
      if (cut <= lo) cut = lo + step;
      if (cut >= end) break;
      bounds.push_back(cut);
      lo = cut;
    }
  }
  if (bounds.back() != numel_) bounds.push_back(numel_);
  return bounds;
}

void FlatCodec::decodeAccumulateRange(std::span<const std::byte> bytes, float alpha, int64_t lo,
                                      torch::Tensor& out) const {
  const int64_t hi = lo + out.numel();
  if (lo == 0 && hi == numel_) {
    decodeAccumulate(bytes, alpha, out);  // one pass; on a GPU, one copy
    return;
  }
  GEO_ENFORCE_EQ(static_cast<int64_t>(bytes.size()), bytes_,
                 "sync: an update of {} bytes does not match this model's encoding ({} bytes, {})",
                 bytes.size(), bytes_, codec_->describe());
  GEO_ENFORCE(0 <= lo && lo < hi && hi <= numel_, "sync: the slice [{}, {}) of {} values", lo, hi,
              numel_);
  std::vector<std::byte> staging;
  for (const Segment& s : segments_) {
    const int64_t a = std::max(lo, s.offset) - s.offset;
    const int64_t b = std::min(hi, s.offset + s.numel) - s.offset;
    if (a >= b) continue;
    torch::Tensor view = out.narrow(0, s.offset + a - lo, b - a);
    const auto segment =
        bytes.subspan(static_cast<size_t>(s.byteOffset), static_cast<size_t>(s.bytes));
    if (s.raw) {
      // alpha * value, then one addition, as decodeAccumulate() does.
      torch::Tensor scaled = torch::empty({b - a}, torch::kFloat32);
      scaleRaw(segment.data() + 4 * a, b - a, alpha, scaled.data_ptr<float>());
      if (!view.device().is_cpu()) scaled = scaled.to(view.device());
      view.add_(scaled);
      continue;
    }
    codec_->decodeAccumulate(codec_->rangeBytes(segment, s.numel, a, b, staging), alpha, view);
  }
}

Status FlatCodec::check(std::span<const std::byte> bytes, torch::Tensor& scratch,
                        std::string& reason) const {
  const std::vector<int64_t> bounds = sliceBounds(std::max<int64_t>(1, scratch.numel()));
  if (bounds.size() <= 2 && scratch.numel() >= numel_) {
    torch::Tensor whole = scratch.narrow(0, 0, numel_);
    return decodeChecked(bytes, whole, reason);
  }
  if (static_cast<int64_t>(bytes.size()) != bytes_) return wrongSize(bytes.size(), reason);
  torch::Tensor wider;  // a slice that cannot be cut as finely as scratch is long
  for (size_t k = 0; k + 1 < bounds.size(); ++k) {
    const int64_t n = bounds[k + 1] - bounds[k];
    torch::Tensor view;
    if (n <= scratch.numel()) {
      view = scratch.narrow(0, 0, n);
    } else {
      if (!wider.defined() || wider.numel() < n) wider = torch::empty({n}, scratch.options());
      view = wider.narrow(0, 0, n);
    }
    view.zero_();
    try {
      decodeAccumulateRange(bytes, 1.0f, bounds[k], view);
    } catch (const std::exception& e) {
      reason = "malformed";
      return dataLoss(fmt::format("cannot be decoded: {}", e.what()));
    }
    GEO_RETURN_IF_ERROR(checkValues(view, kMaxContribution, reason)
                            .withContext(fmt::format("values {} to {}", bounds[k], bounds[k + 1])));
  }
  return {};
}

std::vector<int64_t> FlatCodec::shardBounds(size_t parts) const {
  GEO_ENFORCE(parts >= 1, "sync: {} shards", parts);
  // The nearest position at or before `pos` a range may start at.
  const auto cutAt = [&](int64_t pos) {
    for (const Segment& s : segments_) {
      if (pos >= s.offset + s.numel) continue;
      if (s.raw || pos <= s.offset) return std::max(pos, s.offset);
      const int64_t step = codec_->rangeAlignment();
      return s.offset + (pos - s.offset) / step * step;
    }
    return numel_;
  };
  std::vector<int64_t> bounds{0};
  for (size_t k = 1; k < parts; ++k) {
    // numel_ * k / parts without overflow: numel_ < 2^40 or so, parts < 2^16.
    const auto target = static_cast<int64_t>(static_cast<double>(numel_) * static_cast<double>(k) /
                                             static_cast<double>(parts));
    bounds.push_back(std::max(bounds.back(), cutAt(target)));
  }
  bounds.push_back(numel_);
  return bounds;
}

std::vector<FlatCodec::Piece> FlatCodec::pieces(int64_t lo, int64_t hi) const {
  GEO_ENFORCE(0 <= lo && lo <= hi && hi <= numel_, "sync: the range [{}, {}) of {} values", lo, hi,
              numel_);
  std::vector<Piece> out;
  for (size_t i = 0; i < segments_.size(); ++i) {
    const Segment& s = segments_[i];
    const int64_t a = std::max(lo, s.offset) - s.offset;
    const int64_t b = std::min(hi, s.offset + s.numel) - s.offset;
    if (a >= b) continue;
    if (!s.raw) {
      const int64_t step = codec_->rangeAlignment();
      GEO_ENFORCE(a % step == 0 && (b % step == 0 || b == s.numel),
                  "sync: the range [{}, {}) does not fall on multiples of {} in a segment of {} "
                  "values at {}",
                  lo, hi, step, s.numel, s.offset);
    }
    out.push_back({i, a, b});
  }
  return out;
}

int64_t FlatCodec::pieceBytes(const Piece& p) const {
  return segments_[p.segment].raw ? 4 * (p.b - p.a) : codec_->encodedBytes(p.b - p.a);
}

int64_t FlatCodec::rangeEncodedBytes(int64_t lo, int64_t hi) const {
  int64_t bytes = 0;
  for (const Piece& p : pieces(lo, hi)) bytes += pieceBytes(p);
  return bytes;
}

std::vector<std::byte> FlatCodec::rangeEncoding(std::span<const std::byte> bytes, int64_t lo,
                                                int64_t hi) const {
  GEO_ENFORCE_EQ(static_cast<int64_t>(bytes.size()), bytes_,
                 "sync: an update of {} bytes does not match this model's encoding ({} bytes, {})",
                 bytes.size(), bytes_, codec_->describe());
  std::vector<std::byte> out;
  out.reserve(static_cast<size_t>(rangeEncodedBytes(lo, hi)));
  std::vector<std::byte> staging;
  for (const Piece& p : pieces(lo, hi)) {
    const Segment& s = segments_[p.segment];
    const auto segment =
        bytes.subspan(static_cast<size_t>(s.byteOffset), static_cast<size_t>(s.bytes));
    const std::span<const std::byte> part =
        s.raw ? segment.subspan(static_cast<size_t>(4 * p.a), static_cast<size_t>(4 * (p.b - p.a)))
              : codec_->rangeBytes(segment, s.numel, p.a, p.b, staging);
    out.insert(out.end(), part.begin(), part.end());
  }
  return out;
}

std::vector<std::byte> FlatCodec::encodeRange(const torch::Tensor& values, int64_t lo,
                                              uint64_t seed, uint64_t stream) const {
  const int64_t hi = lo + values.numel();
  std::vector<std::byte> out(static_cast<size_t>(rangeEncodedBytes(lo, hi)));
  const torch::Tensor cpu = values.is_cpu() ? values.contiguous() : values.to(torch::kCPU);
  size_t at = 0;
  for (const Piece& p : pieces(lo, hi)) {
    const Segment& s = segments_[p.segment];
    const torch::Tensor part = values.narrow(0, s.offset + p.a - lo, p.b - p.a);
    const auto n = static_cast<size_t>(pieceBytes(p));
    if (s.raw) {
      std::memcpy(out.data() + at, cpu.data_ptr<float>() + (s.offset + p.a - lo), n);
    } else {
      codec_->encode(part.contiguous(), {seed, mixStream(stream, p.segment, 0x5ea)},
                     std::span<std::byte>(out).subspan(at, n), nullptr);
    }
    at += n;
  }
  return out;
}

void FlatCodec::decodeRangeAccumulate(std::span<const std::byte> bytes, float alpha, int64_t lo,
                                      torch::Tensor& out) const {
  const int64_t hi = lo + out.numel();
  GEO_ENFORCE_EQ(static_cast<int64_t>(bytes.size()), rangeEncodedBytes(lo, hi),
                 "sync: a shard of {} bytes does not match the encoding of values [{}, {}) ({})",
                 bytes.size(), lo, hi, codec_->describe());
  size_t at = 0;
  for (const Piece& p : pieces(lo, hi)) {
    const Segment& s = segments_[p.segment];
    const auto n = static_cast<size_t>(pieceBytes(p));
    const auto part = bytes.subspan(at, n);
    torch::Tensor view = out.narrow(0, s.offset + p.a - lo, p.b - p.a);
    if (s.raw) {
      // alpha * value, then one addition, as decodeAccumulate() does.
      torch::Tensor scaled = torch::empty({p.b - p.a}, torch::kFloat32);
      scaleRaw(part.data(), p.b - p.a, alpha, scaled.data_ptr<float>());
      if (!view.device().is_cpu()) scaled = scaled.to(view.device());
      view.add_(scaled);
    } else {
      codec_->decodeAccumulate(part, alpha, view);
    }
    at += n;
  }
}

Status FlatCodec::decodeRangeChecked(std::span<const std::byte> bytes, int64_t lo,
                                     torch::Tensor& out, std::string& reason) const {
  const int64_t hi = lo + out.numel();
  int64_t expected = 0;
  try {
    expected = rangeEncodedBytes(lo, hi);
  } catch (const std::exception& e) {
    reason = "size";
    return dataLoss(
        fmt::format("values [{}, {}) are no shard of this model: {}", lo, hi, e.what()));
  }
  if (static_cast<int64_t>(bytes.size()) != expected) {
    reason = "size";
    return dataLoss(fmt::format(
        "{} bytes, expected {} for values [{}, {}) ({}): do all workers run the same model and "
        "codec?",
        bytes.size(), expected, lo, hi, codec_->describe()));
  }
  out.zero_();
  try {
    decodeRangeAccumulate(bytes, 1.0f, lo, out);
  } catch (const std::exception& e) {
    reason = "malformed";
    return dataLoss(fmt::format("cannot be decoded: {}", e.what()));
  }
  return checkValues(out, kMaxContribution, reason);
}

}  // namespace geo::sync::detail
