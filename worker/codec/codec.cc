#include "worker/codec/codec.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstring>
#include <vector>

#include "common/enforce.h"
#include "common/worker_config.h"
#include "kernels/casts.h"
#if GEO_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "kernels/qsgd_cuda.h"
#endif

namespace geo::codec {

namespace {

// What Codec::rangeBytes() asks of its range (the contract in codec.h).
void checkRange(const Codec& c, std::span<const std::byte> bytes, int64_t n, int64_t a, int64_t b) {
  GEO_ENFORCE(0 <= a && a < b && b <= n, "codec {}: the range [{}, {}) is not within {} values",
              c.describe(), a, b, n);
  const int64_t align = c.rangeAlignment();
  GEO_ENFORCE(a % align == 0 && (b % align == 0 || b == n),
              "codec {}: the range [{}, {}) of {} values does not fall on multiples of {}",
              c.describe(), a, b, n, align);
  GEO_ENFORCE_EQ(static_cast<int64_t>(bytes.size()), c.encodedBytes(n),
                 "codec {}: {} bytes do not encode {} values", c.describe(), bytes.size(), n);
}

void checkTensor(const torch::Tensor& t, const char* what) {
  GEO_ENFORCE(t.defined(), "codec: {} tensor is undefined", what);
  GEO_ENFORCE(t.scalar_type() == torch::kFloat, "codec: {} tensor must be fp32, got {}", what,
              std::string(c10::toString(t.scalar_type())));
  GEO_ENFORCE(t.device().is_cpu() || t.device().is_cuda(),
              "codec: {} tensor is on {}; the codecs take CPU and CUDA tensors", what,
              t.device().str());
  GEO_ENFORCE(t.is_contiguous(), "codec: {} tensor must be contiguous", what);
}

void checkSameDevice(const torch::Tensor& a, const torch::Tensor& b) {
  GEO_ENFORCE(a.device() == b.device(), "codec: the residual is on {}, the values on {}",
              b.device().str(), a.device().str());
}

#if GEO_HAVE_CUDA
// The kernels run on the current CUDA device: make it the tensor's.
void useDeviceOf(const torch::Tensor& t) {
  const cudaError_t err = cudaSetDevice(t.device().index() < 0 ? 0 : t.device().index());
  GEO_ENFORCE(err == cudaSuccess, "codec: cannot use {}: {}", t.device().str(),
              cudaGetErrorString(err));
}
#endif

// Shared by the lossless-per-element codecs: w = v (+ residual), encode w,
// residual = w - decode(encode(w)). Their width per value is the one the wire
// protocol states for their id (worker/transport/frame.h), which receivers
// check every frame against.
//
// Device tensors go through the host: these codecs are for a model small
// enough, or a link fast enough, that their 2-4 bytes per value are what is
// wanted, and a device copy of the values is cheap beside sending them. QSGD
// is the codec that runs on the device (QsgdCodec).
class ElementCodec : public Codec {
 public:
  int64_t encodedBytes(int64_t n) const final {
    return static_cast<int64_t>(transport::codecValueBytes(id())) * n;
  }
  void encode(const torch::Tensor& values, kernels::RngKey key, std::span<std::byte> out,
              torch::Tensor* residual) const override {
    checkTensor(values, "input");
    if (!values.device().is_cpu()) {
      const torch::Tensor hostValues = values.to(torch::kCPU);
      if (residual == nullptr) {
        encode(hostValues, key, out, nullptr);
        return;
      }
      checkSameDevice(values, *residual);
      torch::Tensor hostResidual = residual->to(torch::kCPU);
      encode(hostValues, key, out, &hostResidual);
      residual->copy_(hostResidual);
      return;
    }
    const int64_t n = values.numel();
    GEO_ENFORCE(static_cast<int64_t>(out.size()) >= encodedBytes(n),
                "codec {}: output buffer of {} bytes, need {}", describe(), out.size(),
                encodedBytes(n));
    if (residual == nullptr) {
      encodeRaw(values.data_ptr<float>(), n, out.data());
      return;
    }
    checkTensor(*residual, "residual");
    checkSameDevice(values, *residual);
    GEO_ENFORCE_EQ(residual->numel(), n, "codec: residual and input sizes differ");
    torch::Tensor w = values + *residual;
    encodeRaw(w.data_ptr<float>(), n, out.data());
    residual->copy_(w);
    decodeAccumulate(std::span<const std::byte>(out.data(), static_cast<size_t>(encodedBytes(n))),
                     -1.0f, *residual);
  }
  void decodeAccumulate(std::span<const std::byte> bytes, float alpha,
                        torch::Tensor& out) const final {
    checkTensor(out, "output");
    GEO_ENFORCE_EQ(static_cast<int64_t>(bytes.size()), encodedBytes(out.numel()),
                   "codec {}: payload size does not match the tensor", describe());
    if (out.device().is_cpu()) {
      decodeAccumulateRaw(bytes.data(), out.numel(), alpha, out.data_ptr<float>());
      return;
    }
    // alpha * value on the host, then one add on the device: the CPU's
    // out + alpha * x in the same fp32 operations. The host buffer starts at
    // -0, since -0 + y is y for every y (+0 would turn an alpha * x of -0
    // into +0, and an out of -0 plus it into +0).
    torch::Tensor scaled = torch::full({out.numel()}, -0.0f, torch::kFloat32);
    decodeAccumulateRaw(bytes.data(), out.numel(), alpha, scaled.data_ptr<float>());
    out.view({-1}).add_(scaled.to(out.device()));
  }

 protected:
  virtual void encodeRaw(const float* in, int64_t n, std::byte* out) const = 0;
  // out[k] += alpha * value k of bytes (exactly encodedBytes(n) of them).
  virtual void decodeAccumulateRaw(const std::byte* bytes, int64_t n, float alpha,
                                   float* out) const = 0;
};

class IdentityCodec final : public ElementCodec {
 public:
  transport::CodecId id() const override { return transport::CodecId::kFp32; }
  std::string describe() const override { return "identity (fp32)"; }

 protected:
  void decodeAccumulateRaw(const std::byte* bytes, int64_t n, float alpha,
                           float* o) const override {
    for (int64_t k = 0; k < n; ++k) {
      float x;
      std::memcpy(&x, bytes + 4 * k, 4);
      o[k] = o[k] + alpha * x;
    }
  }
  void encodeRaw(const float* in, int64_t n, std::byte* out) const override {
    std::memcpy(out, in, static_cast<size_t>(n) * 4);
  }
};

template <bool kBf16>
class HalfCodec final : public ElementCodec {
 public:
  transport::CodecId id() const override {
    return kBf16 ? transport::CodecId::kBf16 : transport::CodecId::kFp16;
  }
  std::string describe() const override { return kBf16 ? "bf16" : "fp16"; }

 protected:
  void decodeAccumulateRaw(const std::byte* bytes, int64_t n, float alpha,
                           float* out) const override {
    // Payload bytes may sit at any address: bring them to an aligned buffer.
    std::vector<uint16_t> halves(static_cast<size_t>(n));
    std::memcpy(halves.data(), bytes, static_cast<size_t>(n) * 2);
    if (kBf16) {
      kernels::accumulateBf16(halves.data(), n, alpha, out);
    } else {
      kernels::accumulateFp16(halves.data(), n, alpha, out);
    }
  }
  void encodeRaw(const float* in, int64_t n, std::byte* out) const override {
    std::vector<uint16_t> halves(static_cast<size_t>(n));
    const int64_t bad = kBf16 ? kernels::castToBf16(in, n, halves.data())
                              : kernels::castToFp16(in, n, halves.data());
    GEO_ENFORCE(bad == 0, "codec {}: {} of {} values are not finite in {} (overflow, NaN or Inf)",
                describe(), bad, n, describe());
    std::memcpy(out, halves.data(), static_cast<size_t>(n) * 2);
  }
};

// Receivers accept a QSGD frame only if it holds at least
// kMinQsgdBitsPerValue bits per value: the narrowest width must honour that.
static_assert(static_cast<uint64_t>(kernels::kQsgdBits.front()) >= transport::kMinQsgdBitsPerValue);

class QsgdCodec final : public Codec {
 public:
  explicit QsgdCodec(const CodecSpec& s)
      : cfg_{s.bits, s.bucket,
             s.l2Scale ? kernels::QsgdScale::kL2Norm : kernels::QsgdScale::kMaxAbs},
        threads_(s.threads) {}
  transport::CodecId id() const override { return transport::CodecId::kQsgd; }
  std::string describe() const override {
    return fmt::format("qsgd-{} bucket {} {}", cfg_.bits, cfg_.bucketSize,
                       cfg_.scale == kernels::QsgdScale::kL2Norm ? "l2" : "max-abs");
  }
  int64_t encodedBytes(int64_t n) const override { return kernels::qsgdEncodedBytes(n, cfg_); }
  void encode(const torch::Tensor& values, kernels::RngKey key, std::span<std::byte> out,
              torch::Tensor* residual) const override {
    checkTensor(values, "input");
    float* res = residualOf(values, residual);
    if (values.device().is_cuda()) {
      onDevice(values);
      // After the work LibTorch queued on the legacy default stream (the
      // worker never changes the current stream); only the packed bytes
      // cross to the host.
#if GEO_HAVE_CUDA
      kernels::qsgdEncodeCudaToHost(values.data_ptr<float>(), values.numel(), cfg_, key,
                                    reinterpret_cast<uint8_t*>(out.data()),
                                    static_cast<int64_t>(out.size()), res, nullptr);
#endif
      return;
    }
    kernels::qsgdEncode(values.data_ptr<float>(), values.numel(), cfg_, key,
                        reinterpret_cast<uint8_t*>(out.data()), static_cast<int64_t>(out.size()),
                        res, threads_);
  }
  void decodeAccumulate(std::span<const std::byte> bytes, float alpha,
                        torch::Tensor& out) const override {
    checkTensor(out, "output");
    if (out.device().is_cuda()) {
      onDevice(out);
#if GEO_HAVE_CUDA
      kernels::qsgdDecodeAccumulateCudaFromHost(reinterpret_cast<const uint8_t*>(bytes.data()),
                                                static_cast<int64_t>(bytes.size()), out.numel(),
                                                cfg_, alpha, out.data_ptr<float>(), nullptr);
#endif
      return;
    }
    kernels::qsgdDecodeAccumulate(reinterpret_cast<const uint8_t*>(bytes.data()),
                                  static_cast<int64_t>(bytes.size()), out.numel(), cfg_, alpha,
                                  out.data_ptr<float>(), threads_);
  }

  // Scales first, then codes (kernels/qsgd.h): a range of whole buckets is
  // its buckets' scales and its values' codes, which must start on a byte:
  // whole buckets whose codes fill whole bytes (a bucket of 512 at any
  // width; one of 1 value at 2 bits needs 4 of them).
  int64_t rangeAlignment() const override {
    int64_t align = cfg_.bucketSize;
    while (align * cfg_.bits % 8 != 0) align += cfg_.bucketSize;
    return align;
  }
  std::span<const std::byte> rangeBytes(std::span<const std::byte> bytes, int64_t n, int64_t a,
                                        int64_t b, std::vector<std::byte>& staging) const override {
    checkRange(*this, bytes, n, a, b);
    const int64_t buckets = kernels::qsgdNumBuckets(n, cfg_);
    const int64_t firstBucket = a / cfg_.bucketSize;
    const int64_t rangeBuckets = kernels::qsgdNumBuckets(b - a, cfg_);
    const int64_t codesFrom = a * cfg_.bits / 8;
    const int64_t codes = kernels::qsgdCodeBytes(b - a, cfg_);
    staging.resize(static_cast<size_t>(4 * rangeBuckets + codes));
    std::memcpy(staging.data(), bytes.data() + 4 * firstBucket,
                static_cast<size_t>(4 * rangeBuckets));
    std::memcpy(staging.data() + 4 * rangeBuckets, bytes.data() + 4 * buckets + codesFrom,
                static_cast<size_t>(codes));
    return staging;
  }

  // On a CUDA tensor, every slice in one pass (kernels/qsgd_cuda.h,
  // qsgdEncodeSlicesCudaToHost): a model of many tensors paid a
  // synchronization and a copy per tensor.
  void encodeSlices(const torch::Tensor& values, std::span<const Slice> slices,
                    std::span<std::byte> out, torch::Tensor* residual) const override {
    if (!values.device().is_cuda()) {
      Codec::encodeSlices(values, slices, out, residual);
      return;
    }
    checkTensor(values, "input");
    float* res = residualOf(values, residual);
    onDevice(values);
#if GEO_HAVE_CUDA
    const auto table = kernelSlices(slices);
    kernels::qsgdEncodeSlicesCudaToHost(values.data_ptr<float>(), res, values.numel(), table.data(),
                                        static_cast<int64_t>(table.size()), cfg_,
                                        reinterpret_cast<uint8_t*>(out.data()),
                                        static_cast<int64_t>(out.size()), nullptr);
#endif
  }
  void decodeAccumulateSlices(std::span<const std::byte> bytes, std::span<const Slice> slices,
                              float alpha, torch::Tensor& out) const override {
    if (!out.device().is_cuda()) {
      Codec::decodeAccumulateSlices(bytes, slices, alpha, out);
      return;
    }
    checkTensor(out, "output");
    onDevice(out);
#if GEO_HAVE_CUDA
    const auto table = kernelSlices(slices);
    kernels::qsgdDecodeAccumulateSlicesCudaFromHost(
        reinterpret_cast<const uint8_t*>(bytes.data()), static_cast<int64_t>(bytes.size()),
        table.data(), static_cast<int64_t>(table.size()), cfg_, alpha, out.data_ptr<float>(),
        out.numel(), nullptr);
#endif
  }

 private:
#if GEO_HAVE_CUDA
  static std::vector<kernels::QsgdSlice> kernelSlices(std::span<const Slice> slices) {
    std::vector<kernels::QsgdSlice> table;
    table.reserve(slices.size());
    for (const Slice& s : slices) table.push_back({s.offset, s.numel, s.byteOffset, s.key});
    return table;
  }
#endif

  // Makes the tensor's device current, or refuses a build without the CUDA
  // kernels (a CUDA LibTorch built without nvcc).
  static void onDevice(const torch::Tensor& t) {
#if GEO_HAVE_CUDA
    useDeviceOf(t);
#else
    GEO_ENFORCE(false,
                "codec qsgd: the tensor is on {} but this build has no CUDA kernels (configure "
                "with -DGEO_USE_CUDA=ON and nvcc; README, 'Building for GPUs')",
                t.device().str());
#endif
  }

  // The residual's data (on the values' device, as many values), or null.
  static float* residualOf(const torch::Tensor& values, torch::Tensor* residual) {
    if (residual == nullptr) return nullptr;
    checkTensor(*residual, "residual");
    checkSameDevice(values, *residual);
    GEO_ENFORCE_EQ(residual->numel(), values.numel(), "codec: residual and input sizes differ");
    return residual->data_ptr<float>();
  }

  kernels::QsgdConfig cfg_;
  int threads_;
};

}  // namespace

void Codec::encodeSlices(const torch::Tensor& values, std::span<const Slice> slices,
                         std::span<std::byte> out, torch::Tensor* residual) const {
  for (const Slice& s : slices) {
    const auto bytes = static_cast<size_t>(encodedBytes(s.numel));
    GEO_ENFORCE(s.byteOffset >= 0 && static_cast<size_t>(s.byteOffset) + bytes <= out.size(),
                "codec {}: a slice's payload bytes {} to {} are not within the {}-byte payload",
                describe(), s.byteOffset, static_cast<size_t>(s.byteOffset) + bytes, out.size());
    torch::Tensor r;
    if (residual != nullptr) r = residual->narrow(0, s.offset, s.numel);
    encode(values.narrow(0, s.offset, s.numel), s.key,
           out.subspan(static_cast<size_t>(s.byteOffset), bytes),
           residual != nullptr ? &r : nullptr);
  }
}

void Codec::decodeAccumulateSlices(std::span<const std::byte> bytes, std::span<const Slice> slices,
                                   float alpha, torch::Tensor& out) const {
  for (const Slice& s : slices) {
    const auto size = static_cast<size_t>(encodedBytes(s.numel));
    GEO_ENFORCE(s.byteOffset >= 0 && static_cast<size_t>(s.byteOffset) + size <= bytes.size(),
                "codec {}: a slice's payload bytes {} to {} are not within the {}-byte payload",
                describe(), s.byteOffset, static_cast<size_t>(s.byteOffset) + size, bytes.size());
    auto view = out.narrow(0, s.offset, s.numel);
    decodeAccumulate(bytes.subspan(static_cast<size_t>(s.byteOffset), size), alpha, view);
  }
}

std::span<const std::byte> Codec::rangeBytes(std::span<const std::byte> bytes, int64_t n, int64_t a,
                                             int64_t b, std::vector<std::byte>& /*staging*/) const {
  // Value k in bytes [k * w, (k + 1) * w): the range is one piece.
  checkRange(*this, bytes, n, a, b);
  const int64_t from = encodedBytes(a);
  return bytes.subspan(static_cast<size_t>(from), static_cast<size_t>(encodedBytes(b) - from));
}

void Codec::decode(std::span<const std::byte> bytes, torch::Tensor& out) const {
  checkTensor(out, "output");
  out.zero_();
  decodeAccumulate(bytes, 1.0f, out);
}

double Codec::compressionRatio(int64_t numel) const {
  const int64_t bytes = encodedBytes(numel);
  return bytes == 0 ? 1.0 : 4.0 * static_cast<double>(numel) / static_cast<double>(bytes);
}

StatusOr<std::unique_ptr<Codec>> makeCodec(const CodecSpec& spec) {
  if (spec.name == "identity") return std::unique_ptr<Codec>(std::make_unique<IdentityCodec>());
  if (spec.name == "fp16") return std::unique_ptr<Codec>(std::make_unique<HalfCodec<false>>());
  if (spec.name == "bf16") return std::unique_ptr<Codec>(std::make_unique<HalfCodec<true>>());
  if (spec.name == "qsgd") {
    // The kernels' limits, checked here so that a bad spec is a Status rather
    // than the kernels' exception at the first encode.
    if (!kernels::isQsgdBits(spec.bits)) {
      return invalidArgument(fmt::format("qsgd bits {} is not allowed (allowed: {})", spec.bits,
                                         fmt::join(kernels::kQsgdBits, ", ")));
    }
    if (spec.bucket < kernels::kQsgdMinBucket || spec.bucket > kernels::kQsgdMaxBucket) {
      return invalidArgument(fmt::format("qsgd bucket {} is not allowed (allowed: {} to {})",
                                         spec.bucket, kernels::kQsgdMinBucket,
                                         kernels::kQsgdMaxBucket));
    }
    return std::unique_ptr<Codec>(std::make_unique<QsgdCodec>(spec));
  }
  return invalidArgument(
      fmt::format("'{}' is not a codec (allowed: {})", spec.name, fmt::join(kCodecNames, ", ")));
}

}  // namespace geo::codec
