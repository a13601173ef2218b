#include "worker/codec/codec.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <string>
#include <vector>

#include "common/enforce.h"
#include "common/worker_config.h"
#include "kernels/qsgd_limits.h"

namespace geo::codec {
namespace {

std::vector<std::byte> encode(const Codec& c, const torch::Tensor& v, torch::Tensor* residual,
                              uint64_t stream = 1) {
  std::vector<std::byte> out(static_cast<size_t>(c.encodedBytes(v.numel())));
  c.encode(v, {42, stream}, out, residual);
  return out;
}

class CodecTest : public ::testing::TestWithParam<std::string> {
 protected:
  std::unique_ptr<Codec> codec() const {
    auto c = makeCodec({GetParam(), 4, 512, false, 1});
    EXPECT_TRUE(c.ok()) << c.status().toString();
    return std::move(*c);
  }
  // Largest error a value may have after a round trip.
  double tolerance(const torch::Tensor& v) const {
    const double maxAbs = v.abs().max().item<double>();
    if (GetParam() == "identity") return 0;
    if (GetParam() == "fp16") return maxAbs * std::ldexp(1.0, -11);
    if (GetParam() == "bf16") return maxAbs * std::ldexp(1.0, -8);
    return maxAbs / 7 * 1.0001;  // qsgd-4: one step of the largest bucket scale
  }
};

TEST_P(CodecTest, RoundTripWithinTheCodecsPrecision) {
  torch::manual_seed(3);
  for (int64_t n : {0, 1, 1000, 100003}) {
    const auto v = torch::randn({n});
    const auto c = codec();
    const auto bytes = encode(*c, v, nullptr);
    EXPECT_EQ(static_cast<int64_t>(bytes.size()), c->encodedBytes(n));
    auto out = torch::full({n}, 7.0f);
    c->decode(bytes, out);
    if (n > 0) {
      EXPECT_LE((out - v).abs().max().item<double>(), tolerance(v)) << n;
    }
  }
}

TEST_P(CodecTest, DecodeAccumulateAddsAlphaTimesTheValues) {
  torch::manual_seed(4);
  const auto v = torch::randn({5000});
  const auto c = codec();
  const auto bytes = encode(*c, v, nullptr);
  auto decoded = torch::empty({5000});
  c->decode(bytes, decoded);
  auto acc = torch::ones({5000});
  c->decodeAccumulate(bytes, 0.5f, acc);
  EXPECT_TRUE(torch::allclose(acc, 1 + 0.5 * decoded, 0, 1e-6));
}

TEST_P(CodecTest, ErrorFeedbackKeepsWhatWasNotSent) {
  torch::manual_seed(5);
  const auto v = torch::randn({3000});
  auto residual = torch::randn({3000}) * 0.01;
  const auto w = v + residual;
  const auto c = codec();
  const auto bytes = encode(*c, v, &residual);
  auto decoded = torch::empty({3000});
  c->decode(bytes, decoded);
  EXPECT_TRUE(torch::allclose(decoded + residual, w, 0, 1e-5));
  if (GetParam() == "identity") {
    EXPECT_EQ(residual.abs().max().item<float>(), 0.0f);
  }
}

TEST_P(CodecTest, RefusesWrongTensorsAndPayloads) {
  const auto c = codec();
  std::vector<std::byte> out(static_cast<size_t>(c->encodedBytes(100)));
  EXPECT_THROW(c->encode(torch::ones({100}, torch::kDouble), {}, out, nullptr), Error);
  EXPECT_THROW(c->encode(torch::ones({10, 20}).t(), {}, out, nullptr), Error);  // not contiguous
  auto target = torch::zeros({100});
  std::vector<std::byte> shortPayload(out.size() - 1);
  EXPECT_THROW(c->decodeAccumulate(shortPayload, 1.0f, target), Error);
}

// A GPU worker's payloads are a CPU worker's, bit for bit, so that CPU and
// GPU regions can train one model: the same tensor, seed and residual give
// the same bytes and the same residual on either device, and a payload adds
// the same floats to either. Runs where LibTorch sees a CUDA device (the
// device check, scripts/gpu-check.sh); skipped elsewhere.
TEST_P(CodecTest, CudaTensorsGiveTheCpuBytes) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device for LibTorch";
  torch::manual_seed(6);
  const torch::Device gpu(torch::kCUDA, 0);
  for (const int bits : {2, 4, 8}) {
    if (GetParam() != "qsgd" && bits != 4) continue;
    auto made = makeCodec({GetParam(), bits, 512, false, 1});
    ASSERT_TRUE(made.ok()) << made.status().toString();
    const Codec& c = **made;
    const int64_t n = 300007;
    const auto v = torch::randn({n});
    auto cpuResidual = torch::randn({n}) * 0.01;
    auto gpuResidual = cpuResidual.to(gpu);
    const auto cpuBytes = encode(c, v, &cpuResidual, 9);
    const auto gpuBytes = encode(c, v.to(gpu), &gpuResidual, 9);
    ASSERT_EQ(cpuBytes.size(), gpuBytes.size());
    EXPECT_TRUE(cpuBytes == gpuBytes) << c.describe() << ": payloads differ";
    EXPECT_TRUE(torch::equal(cpuResidual, gpuResidual.cpu())) << c.describe();

    auto cpuOut = torch::randn({n});
    auto gpuOut = cpuOut.to(gpu);
    c.decodeAccumulate(cpuBytes, 0.25f, cpuOut);
    c.decodeAccumulate(cpuBytes, 0.25f, gpuOut);
    EXPECT_TRUE(torch::equal(cpuOut, gpuOut.cpu())) << c.describe();
    // A residual on another device than the values is refused.
    EXPECT_THROW(encode(c, v.to(gpu), &cpuResidual), Error);
  }
}

// Slices of one flat tensor (a model's parameter tensors), as FlatCodec
// hands them over: on a CUDA tensor QSGD does them in one pass; the bytes,
// the residual and the accumulated floats are the CPU's, and payload bytes
// between the slices stay as they were.
TEST_P(CodecTest, CudaSlicesGiveTheCpuBytes) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device for LibTorch";
  torch::manual_seed(8);
  const torch::Device gpu(torch::kCUDA, 0);
  const auto c = codec();
  const std::vector<int64_t> sizes = {700, 3, 100000, 4097};
  std::vector<Codec::Slice> slices;
  int64_t n = 0;
  int64_t bytes = 0;
  for (size_t k = 0; k < sizes.size(); ++k) {
    bytes += 3;
    slices.push_back({n, sizes[k], bytes, {42, 7 + k}});
    n += sizes[k];
    bytes += c->encodedBytes(sizes[k]);
  }
  const auto v = torch::randn({n});
  auto cpuResidual = torch::randn({n}) * 0.01;
  auto gpuResidual = cpuResidual.to(gpu);
  std::vector<std::byte> cpuBytes(static_cast<size_t>(bytes), std::byte{0x5a});
  std::vector<std::byte> gpuBytes = cpuBytes;
  c->encodeSlices(v, slices, cpuBytes, &cpuResidual);
  c->encodeSlices(v.to(gpu), slices, gpuBytes, &gpuResidual);
  EXPECT_TRUE(cpuBytes == gpuBytes) << c->describe() << ": payloads differ";
  EXPECT_EQ(cpuBytes[0], std::byte{0x5a});  // before the first slice
  EXPECT_TRUE(torch::equal(cpuResidual, gpuResidual.cpu())) << c->describe();
  auto cpuOut = torch::randn({n});
  auto gpuOut = cpuOut.to(gpu);
  c->decodeAccumulateSlices(cpuBytes, slices, 0.5f, cpuOut);
  c->decodeAccumulateSlices(cpuBytes, slices, 0.5f, gpuOut);
  EXPECT_TRUE(torch::equal(cpuOut, gpuOut.cpu())) << c->describe();
}

INSTANTIATE_TEST_SUITE_P(Codecs, CodecTest, ::testing::Values("identity", "fp16", "bf16", "qsgd"));

// sync.codec's allowed names (common/worker_config.h) are exactly the
// codecs makeCodec builds.
TEST(Codec, EveryNameTheSchemaAllowsIsACodec) {
  for (std::string_view name : kCodecNames) {
    EXPECT_TRUE(makeCodec({std::string(name)}).ok()) << name;
  }
  for (std::string_view name : kLanCodecNames) {
    EXPECT_NE(std::find(kCodecNames.begin(), kCodecNames.end(), name), kCodecNames.end()) << name;
  }
  const auto bad = makeCodec({"zstd"});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("allowed: identity, fp16, bf16, qsgd"), std::string::npos)
      << bad.status().toString();
}

TEST(Codec, IdsRatiosAndSpecErrors) {
  EXPECT_EQ((*makeCodec({"identity"}))->id(), transport::CodecId::kFp32);
  EXPECT_EQ((*makeCodec({"bf16"}))->id(), transport::CodecId::kBf16);
  EXPECT_NEAR((*makeCodec({"fp16"}))->compressionRatio(1000), 2.0, 1e-12);
  EXPECT_NEAR((*makeCodec({"qsgd", 4, 512}))->compressionRatio(512 * 1000), 7.88, 0.01);
  EXPECT_NEAR((*makeCodec({"qsgd", 2, 512}))->compressionRatio(512 * 1000), 15.5, 0.1);
}

// The codec speaks of its own spec (name, bits, bucket), not of worker.yaml
// keys, and admits exactly the kernels' limits (kernels/qsgd_limits.h).
TEST(Codec, SpecErrorsNameTheSpecFieldAndTheKernelLimits) {
  EXPECT_EQ(makeCodec({"zstd"}).status().message(),
            "'zstd' is not a codec (allowed: identity, fp16, bf16, qsgd)");
  EXPECT_EQ(makeCodec({"qsgd", 3}).status().message(),
            "qsgd bits 3 is not allowed (allowed: 2, 4, 8)");
  for (int bits = 0; bits <= 9; ++bits) {
    EXPECT_EQ(makeCodec({"qsgd", bits}).ok(), kernels::isQsgdBits(bits)) << "bits " << bits;
  }
  const auto bucketError = [](int64_t bucket) {
    const auto c = makeCodec({"qsgd", 4, bucket});
    EXPECT_FALSE(c.ok()) << "bucket " << bucket;
    EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
    return c.status().message();
  };
  EXPECT_EQ(bucketError(int64_t{1} << 31),
            "qsgd bucket 2147483648 is not allowed (allowed: 1 to 1073741824)");
  EXPECT_EQ(bucketError(0), "qsgd bucket 0 is not allowed (allowed: 1 to 1073741824)");
  EXPECT_EQ(bucketError(kernels::kQsgdMaxBucket + 1).find("bucket 1073741825 is not allowed"),
            std::string("qsgd ").size());
  const auto widest = makeCodec({"qsgd", 4, kernels::kQsgdMaxBucket});
  ASSERT_TRUE(widest.ok()) << widest.status().toString();
  EXPECT_EQ((*widest)->encodedBytes(10), 4 + 5);  // one bucket: one scale, 10 x 4 bits
}

// What a codec writes for n values is what the wire protocol promises for its
// id (worker/transport/frame.h): receivers check each header against it
// before the payload reaches a codec.
TEST(Codec, EncodedSizesAreTheFrameWidths) {
  const transport::FrameLimits limits{.jobHash = 7, .worldSize = 2};
  for (const std::string name : {"identity", "fp16", "bf16", "qsgd"}) {
    for (int bits : kernels::kQsgdBits) {
      for (int64_t bucket : {int64_t{1}, int64_t{512}, kernels::kQsgdMaxBucket}) {
        const auto c = makeCodec({name, bits, bucket}).value();
        for (int64_t n : {0, 1, 3, 1000}) {
          const auto width = transport::codecValueBytes(c->id());
          if (width != 0) {
            EXPECT_EQ(c->encodedBytes(n), static_cast<int64_t>(width) * n) << c->describe();
          }
          transport::FrameHeader h;
          h.jobHash = 7;
          h.codec = c->id();
          h.elementCount = static_cast<uint64_t>(n);
          h.payloadBytes = static_cast<uint64_t>(c->encodedBytes(n));
          std::array<std::byte, transport::kFrameHeaderBytes> bytes{};
          transport::encodeFrameHeader(h, bytes);
          const auto decoded = transport::decodeFrameHeader(bytes, h.payloadBytes, limits);
          EXPECT_TRUE(decoded.ok())
              << c->describe() << " n " << n << ": " << decoded.status().toString();
        }
      }
    }
  }
}

TEST(Codec, Fp16OverflowIsAnErrorNotInfinity) {
  const auto c = makeCodec({"fp16"}).value();
  auto residual = torch::zeros({3});
  const auto before = residual.clone();
  std::vector<std::byte> out(6);
  EXPECT_THROW(c->encode(torch::tensor({1.0f, 1e6f, 2.0f}), {}, out, &residual), Error);
  EXPECT_TRUE(torch::equal(residual, before));
}

}  // namespace
}  // namespace geo::codec
