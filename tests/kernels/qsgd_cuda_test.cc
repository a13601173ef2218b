// The CUDA codecs must reproduce the CPU ones bit for bit (kernels/qsgd_cuda.h):
// every test compares raw bytes / float bit patterns against kernels/qsgd.h
// and kernels/casts.h on the same inputs. Without a usable CUDA device every
// test skips.

#include "kernels/qsgd_cuda.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "common/enforce.h"
#include "kernels/casts.h"
#include "kernels/qsgd.h"

namespace geo::kernels {
namespace {

void cudaCheck(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    throw std::runtime_error(std::string(what) + " failed: " + cudaGetErrorString(err));
  }
}

// `count` elements of T on the device, starting `offset` elements into the
// allocation (offset > 0 makes the pointer unaligned for vector accesses).
template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t count, size_t offset = 0) : count_(count) {
    if (count + offset > 0) {
      void* p = nullptr;
      cudaCheck(cudaMalloc(&p, (count + offset) * sizeof(T)), "cudaMalloc");
      base_ = static_cast<T*>(p);
      ptr_ = base_ + offset;
    }
  }
  explicit DeviceBuffer(const std::vector<T>& host, size_t offset = 0)
      : DeviceBuffer(host.size(), offset) {
    upload(host);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { cudaFree(base_); }

  T* get() const { return count_ == 0 ? nullptr : ptr_; }

  void upload(const std::vector<T>& host) {
    if (count_ == 0) return;
    cudaCheck(cudaMemcpy(ptr_, host.data(), count_ * sizeof(T), cudaMemcpyHostToDevice),
              "cudaMemcpy H2D");
  }

  std::vector<T> download() const {
    std::vector<T> host(count_);
    if (count_ > 0) {
      cudaCheck(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
      cudaCheck(cudaMemcpy(host.data(), ptr_, count_ * sizeof(T), cudaMemcpyDeviceToHost),
                "cudaMemcpy D2H");
    }
    return host;
  }

  void fillBytes(uint8_t byte) {
    if (count_ > 0) cudaCheck(cudaMemset(ptr_, byte, count_ * sizeof(T)), "cudaMemset");
  }

 private:
  size_t count_;
  T* base_ = nullptr;
  T* ptr_ = nullptr;
};

// Index of the first element whose bytes differ, or -1.
template <typename T>
int64_t firstMismatch(const std::vector<T>& a, const std::vector<T>& b, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(T)) != 0) return static_cast<int64_t>(i);
  }
  return -1;
}

template <typename T>
void expectSameBytes(const std::vector<T>& cpu, const std::vector<T>& gpu, size_t count,
                     const char* what) {
  ASSERT_GE(cpu.size(), count);
  ASSERT_GE(gpu.size(), count);
  const int64_t at = firstMismatch(cpu, gpu, count);
  if (at < 0) return;
  if constexpr (std::is_same_v<T, float>) {
    ADD_FAILURE() << what << " differs first at element " << at << ": cpu " << cpu[at] << " (0x"
                  << std::hex << std::bit_cast<uint32_t>(cpu[at]) << "), gpu " << std::dec
                  << gpu[at] << " (0x" << std::hex << std::bit_cast<uint32_t>(gpu[at]) << ")";
  } else {
    ADD_FAILURE() << what << " differs first at element " << at << ": cpu "
                  << static_cast<uint64_t>(cpu[at]) << ", gpu " << static_cast<uint64_t>(gpu[at]);
  }
}

// Bit-identical, except that two NaNs match whatever their payloads: GPUs
// produce the canonical NaN where a CPU propagates an operand's payload.
void expectSameFloatsOrBothNan(const std::vector<float>& cpu, const std::vector<float>& gpu,
                               const char* what) {
  ASSERT_EQ(cpu.size(), gpu.size());
  for (size_t i = 0; i < cpu.size(); ++i) {
    if (std::isnan(cpu[i]) && std::isnan(gpu[i])) continue;
    if (std::bit_cast<uint32_t>(cpu[i]) != std::bit_cast<uint32_t>(gpu[i])) {
      ADD_FAILURE() << what << " differs first at element " << i << ": cpu 0x" << std::hex
                    << std::bit_cast<uint32_t>(cpu[i]) << ", gpu 0x"
                    << std::bit_cast<uint32_t>(gpu[i]);
      return;
    }
  }
}

// Values whose magnitude class depends on the bucket, so that every bucket
// size sees ordinary, sparse, all-zero, tiny (scale < 2^-60: the 2^64
// pre-scaling path), subnormal, huge and "many values equal to the scale"
// buckets, with -0 mixed in.
std::vector<float> makeInput(int64_t n, int64_t d, uint32_t seed, float factor = 1.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t k = 0; k < n; ++k) {
    float x = normal(gen);
    switch ((k / d) % 7) {
      case 0: break;
      case 1:
        x *= 1e-3f;
        if (k % 5 == 0) x = 0.0f;
        if (k % 11 == 0) x = -0.0f;
        break;
      case 2: x = 0.0f; break;
      case 3: x *= 1e-25f; break;
      case 4: x *= 1e-41f; break;
      case 5: x *= 1e30f; break;
      default: x = k % 3 == 0 ? 1.5f : (k % 3 == 1 ? -1.5f : 0.75f); break;
    }
    v[static_cast<size_t>(k)] = x * factor;
  }
  return v;
}

// ---- QSGD: CPU vs CUDA over bits x bucket size x length x scale --------------

using QsgdParam = std::tuple<int, int64_t, int64_t, QsgdScale>;

class QsgdCudaTest : public ::testing::TestWithParam<QsgdParam> {};

TEST_P(QsgdCudaTest, MatchesCpuBitForBit) {
  if (!geo::kernels::cudaDeviceAvailable()) GTEST_SKIP() << "no CUDA device";
  const auto [bits, d, n, scale] = GetParam();
  const QsgdConfig cfg{bits, d, scale};
  const RngKey key{0x0123456789abcdefull ^ static_cast<uint64_t>(n),
                   0xfedcba9876543210ull + static_cast<uint64_t>(d)};
  const int64_t bytes = qsgdEncodedBytes(n, cfg);
  const auto nz = static_cast<size_t>(n);
  const auto bz = static_cast<size_t>(bytes);
  const std::vector<float> in = makeInput(n, d, 1000u + static_cast<uint32_t>(bits));
  DeviceBuffer<float> dIn(in);

  // Encode; the guard bytes past the payload must stay untouched.
  std::vector<uint8_t> cpu(bz);
  qsgdEncode(in.data(), n, cfg, key, cpu.data(), bytes);
  {
    SCOPED_TRACE("encode");
    constexpr size_t kGuard = 16;
    DeviceBuffer<uint8_t> dOut(bz + kGuard);
    dOut.fillBytes(0xA5);
    qsgdEncodeCuda(dIn.get(), n, cfg, key, dOut.get(), bytes + static_cast<int64_t>(kGuard),
                   nullptr, nullptr);
    const std::vector<uint8_t> gpu = dOut.download();
    expectSameBytes(cpu, gpu, bz, "payload");
    for (size_t i = bz; i < bz + kGuard; ++i) EXPECT_EQ(gpu[i], 0xA5) << "guard byte " << i - bz;
  }

  DeviceBuffer<uint8_t> dPayload(cpu);
  {
    SCOPED_TRACE("decode");
    std::vector<float> expect(nz);
    qsgdDecode(cpu.data(), bytes, n, cfg, expect.data());
    DeviceBuffer<float> dOut(nz);
    qsgdDecodeCuda(dPayload.get(), bytes, n, cfg, dOut.get(), nullptr);
    expectSameBytes(expect, dOut.download(), nz, "decoded values");
  }
  {
    SCOPED_TRACE("decode-accumulate");
    const float alpha = 0.3f;
    std::vector<float> expect = makeInput(n, d, 7u);
    DeviceBuffer<float> dOut(expect);
    qsgdDecodeAccumulate(cpu.data(), bytes, n, cfg, alpha, expect.data());
    qsgdDecodeAccumulateCuda(dPayload.get(), bytes, n, cfg, alpha, dOut.get(), nullptr);
    expectSameBytes(expect, dOut.download(), nz, "accumulated values");
  }
  {
    SCOPED_TRACE("error feedback");
    std::vector<float> residual = makeInput(n, d, 11u, 0.5f);
    DeviceBuffer<float> dResidual(residual);
    DeviceBuffer<uint8_t> dOut(bz);
    std::vector<uint8_t> expect(bz);
    // Two rounds, so the second quantizes in + (a residual the kernels wrote).
    for (uint64_t round = 0; round < 2; ++round) {
      const RngKey k{key.seed, key.stream + round};
      qsgdEncode(in.data(), n, cfg, k, expect.data(), bytes, residual.data());
      qsgdEncodeCuda(dIn.get(), n, cfg, k, dOut.get(), bytes, dResidual.get(), nullptr);
      expectSameBytes(expect, dOut.download(), bz, "payload");
      expectSameBytes(residual, dResidual.download(), nz, "residual");
    }
  }
}

std::string qsgdParamName(const ::testing::TestParamInfo<QsgdParam>& info) {
  const auto [bits, d, n, scale] = info.param;
  return "b" + std::to_string(bits) + "_d" + std::to_string(d) + "_n" + std::to_string(n) +
         (scale == QsgdScale::kL2Norm ? "_l2" : "_maxabs");
}

INSTANTIATE_TEST_SUITE_P(
    Grid, QsgdCudaTest,
    ::testing::Combine(::testing::Values(2, 4, 8), ::testing::Values<int64_t>(1, 3, 128, 512, 1000),
                       ::testing::Values<int64_t>(0, 1, 7, 8, 1000, 4097, (int64_t{1} << 20) + 3),
                       ::testing::Values(QsgdScale::kMaxAbs, QsgdScale::kL2Norm)),
    qsgdParamName);

// ---- QSGD: buffers at odd addresses take the scalar paths --------------------

TEST(QsgdCuda, UnalignedBuffersMatchCpu) {
  if (!geo::kernels::cudaDeviceAvailable()) GTEST_SKIP() << "no CUDA device";
  const int64_t n = 4097 + 512;
  for (int bits : {2, 4, 8}) {
    for (int64_t d : {int64_t{3}, int64_t{512}}) {
      for (size_t byteOffset : {1, 2, 3, 4}) {
        SCOPED_TRACE("bits " + std::to_string(bits) + ", d " + std::to_string(d) +
                     ", payload offset " + std::to_string(byteOffset));
        const QsgdConfig cfg{bits, d, QsgdScale::kL2Norm};
        const RngKey key{99, static_cast<uint64_t>(bits)};
        const int64_t bytes = qsgdEncodedBytes(n, cfg);
        const auto bz = static_cast<size_t>(bytes);
        const std::vector<float> in = makeInput(n, d, 5u);
        std::vector<float> residual = makeInput(n, d, 6u, 0.25f);
        DeviceBuffer<float> dIn(in, 1);
        DeviceBuffer<float> dResidual(residual, 3);
        DeviceBuffer<uint8_t> dPayload(bz, byteOffset);

        std::vector<uint8_t> cpu(bz);
        qsgdEncode(in.data(), n, cfg, key, cpu.data(), bytes, residual.data());
        qsgdEncodeCuda(dIn.get(), n, cfg, key, dPayload.get(), bytes, dResidual.get(), nullptr);
        expectSameBytes(cpu, dPayload.download(), bz, "payload");
        expectSameBytes(residual, dResidual.download(), static_cast<size_t>(n), "residual");

        std::vector<float> expect = makeInput(n, d, 8u);
        DeviceBuffer<float> dOut(expect, 1);
        qsgdDecodeAccumulate(cpu.data(), bytes, n, cfg, -1.25f, expect.data());
        qsgdDecodeAccumulateCuda(dPayload.get(), bytes, n, cfg, -1.25f, dOut.get(), nullptr);
        expectSameBytes(expect, dOut.download(), static_cast<size_t>(n), "accumulated values");

        qsgdDecode(cpu.data(), bytes, n, cfg, expect.data());
        qsgdDecodeCuda(dPayload.get(), bytes, n, cfg, dOut.get(), nullptr);
        expectSameBytes(expect, dOut.download(), static_cast<size_t>(n), "decoded values");
      }
    }
  }
}

// ---- QSGD: errors --------------------------------------------------------------

TEST(QsgdCuda, NonFiniteInputThrowsAndKeepsResidual) {
  if (!geo::kernels::cudaDeviceAvailable()) GTEST_SKIP() << "no CUDA device";
  const int64_t n = 4097;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  for (QsgdScale scale : {QsgdScale::kMaxAbs, QsgdScale::kL2Norm}) {
    for (float bad : {nan, inf, -inf}) {
      for (bool inResidual : {false, true}) {
        for (bool feedback : {false, true}) {
          if (inResidual && !feedback) continue;
          SCOPED_TRACE(std::string(scale == QsgdScale::kL2Norm ? "l2" : "max-abs") + ", bad " +
                       std::to_string(bad) + (inResidual ? " in residual" : " in input") +
                       (feedback ? ", feedback" : ""));
          const QsgdConfig cfg{4, 512, scale};
          const int64_t bytes = qsgdEncodedBytes(n, cfg);
          std::vector<float> in = makeInput(n, 512, 3u);
          std::vector<float> residual = makeInput(n, 512, 4u, 0.1f);
          (inResidual ? residual : in)[3001] = bad;
          DeviceBuffer<float> dIn(in);
          DeviceBuffer<float> dResidual(residual);
          DeviceBuffer<uint8_t> dOut(static_cast<size_t>(bytes));
          EXPECT_THROW(qsgdEncodeCuda(dIn.get(), n, cfg, {1, 2}, dOut.get(), bytes,
                                      feedback ? dResidual.get() : nullptr, nullptr),
                       geo::Error);
          expectSameBytes(residual, dResidual.download(), static_cast<size_t>(n),
                          "residual after a failed call");

          // The next call on this thread starts from a clean status.
          in[3001] = 1.0f;
          residual[3001] = 0.0f;
          dIn.upload(in);
          dResidual.upload(residual);
          std::vector<uint8_t> cpu(static_cast<size_t>(bytes));
          qsgdEncode(in.data(), n, cfg, {1, 2}, cpu.data(), bytes,
                     feedback ? residual.data() : nullptr);
          qsgdEncodeCuda(dIn.get(), n, cfg, {1, 2}, dOut.get(), bytes,
                         feedback ? dResidual.get() : nullptr, nullptr);
          expectSameBytes(cpu, dOut.download(), static_cast<size_t>(bytes), "payload");
        }
      }
    }
  }
}

TEST(QsgdCuda, L2OverflowThrowsLikeCpu) {
  if (!geo::kernels::cudaDeviceAvailable()) GTEST_SKIP() << "no CUDA device";
  const int64_t n = 64;
  std::vector<float> in = makeInput(n, 4, 12u);
  in[8] = 3e38f;
  in[9] = -3e38f;  // bucket 2: norm 4.2e38 > FLT_MAX
  DeviceBuffer<float> dIn(in);
  for (QsgdScale scale : {QsgdScale::kMaxAbs, QsgdScale::kL2Norm}) {
    const QsgdConfig cfg{8, 4, scale};
    const int64_t bytes = qsgdEncodedBytes(n, cfg);
    std::vector<uint8_t> cpu(static_cast<size_t>(bytes));
    DeviceBuffer<uint8_t> dOut(static_cast<size_t>(bytes));
    if (scale == QsgdScale::kL2Norm) {
      EXPECT_THROW(qsgdEncode(in.data(), n, cfg, {}, cpu.data(), bytes), geo::Error);
      EXPECT_THROW(qsgdEncodeCuda(dIn.get(), n, cfg, {}, dOut.get(), bytes, nullptr, nullptr),
                   geo::Error);
    } else {
      qsgdEncode(in.data(), n, cfg, {}, cpu.data(), bytes);
      qsgdEncodeCuda(dIn.get(), n, cfg, {}, dOut.get(), bytes, nullptr, nullptr);
      expectSameBytes(cpu, dOut.download(), static_cast<size_t>(bytes), "payload");
    }
  }
}

TEST(QsgdCuda, CorruptScalesThrowBeforeWriting) {
  if (!geo::kernels::cudaDeviceAvailable()) GTEST_SKIP() << "no CUDA device";
  const int64_t n = 5000;
  const QsgdConfig cfg{4, 128, QsgdScale::kMaxAbs};
  const int64_t bytes = qsgdEncodedBytes(n, cfg);
  const std::vector<float> in = makeInput(n, 128, 21u);
  std::vector<uint8_t> good(static_cast<size_t>(bytes));
  qsgdEncode(in.data(), n, cfg, {5, 6}, good.data(), bytes);
  const std::vector<float> base = makeInput(n, 128, 22u);
  for (float bad : {-1.0f, -0.0f, std::numeric_limits<float>::quiet_NaN(),
                    std::numeric_limits<float>::infinity()}) {
    SCOPED_TRACE("bad scale " + std::to_string(bad));
    std::vector<uint8_t> payload = good;
    std::memcpy(payload.data() + 4 * 9, &bad, 4);
    std::memcpy(payload.data() + 4 * 3, &bad, 4);  // the message names the first, as on the CPU
    DeviceBuffer<uint8_t> dPayload(payload);
    DeviceBuffer<float> dOut(base);
    std::vector<float> cpuOut = base;
    EXPECT_THROW(qsgdDecodeAccumulate(payload.data(), bytes, n, cfg, 1.0f, cpuOut.data()),
                 geo::Error);
    try {
      qsgdDecodeAccumulateCuda(dPayload.get(), bytes, n, cfg, 1.0f, dOut.get(), nullptr);
      ADD_FAILURE() << "no exception";
    } catch (const geo::Error& e) {
      EXPECT_NE(std::string(e.what()).find("scale of bucket 3 "), std::string::npos) << e.what();
    }
    expectSameBytes(base, dOut.download(), static_cast<size_t>(n), "out after a failed call");
    EXPECT_THROW(qsgdDecodeCuda(dPayload.get(), bytes, n, cfg, dOut.get(), nullptr), geo::Error);
  }
  // And a valid payload decodes again on this thread.
  DeviceBuffer<uint8_t> dGood(good);
  DeviceBuffer<float> dOut(static_cast<size_t>(n));
  std::vector<float> expect(static_cast<size_t>(n));
  qsgdDecode(good.data(), bytes, n, cfg, expect.data());
  qsgdDecodeCuda(dGood.get(), bytes, n, cfg, dOut.get(), nullptr);
  expectSameBytes(expect, dOut.download(), static_cast<size_t>(n), "decoded values");
}

TEST(QsgdCuda, BadArgumentsThrow) {
  if (!geo::kernels::cudaDeviceAvailable()) GTEST_SKIP() << "no CUDA device";
  const int64_t n = 100;
  const QsgdConfig cfg{4, 16, QsgdScale::kMaxAbs};
  const int64_t bytes = qsgdEncodedBytes(n, cfg);
  DeviceBuffer<float> dIn(std::vector<float>(static_cast<size_t>(n), 1.0f));
  DeviceBuffer<float> dOut(static_cast<size_t>(n));
  DeviceBuffer<uint8_t> dPayload(static_cast<size_t>(bytes));
  dPayload.fillBytes(0);
  EXPECT_THROW(qsgdEncodeCuda(dIn.get(), n, {3, 16, QsgdScale::kMaxAbs}, {}, dPayload.get(), bytes,
                              nullptr, nullptr),
               geo::Error);
  EXPECT_THROW(qsgdEncodeCuda(dIn.get(), n, {4, 0, QsgdScale::kMaxAbs}, {}, dPayload.get(), bytes,
                              nullptr, nullptr),
               geo::Error);
  EXPECT_THROW(qsgdEncodeCuda(dIn.get(), -1, cfg, {}, dPayload.get(), bytes, nullptr, nullptr),
               geo::Error);
  EXPECT_THROW(qsgdEncodeCuda(dIn.get(), n, cfg, {}, dPayload.get(), bytes - 1, nullptr, nullptr),
               geo::Error);
  EXPECT_THROW(qsgdEncodeCuda(nullptr, n, cfg, {}, dPayload.get(), bytes, nullptr, nullptr),
               geo::Error);
  EXPECT_THROW(qsgdEncodeCuda(dIn.get(), n, cfg, {}, dPayload.get(), bytes, dIn.get(), nullptr),
               geo::Error);
  EXPECT_THROW(qsgdDecodeCuda(dPayload.get(), bytes + 1, n, cfg, dOut.get(), nullptr), geo::Error);
  EXPECT_THROW(qsgdDecodeCuda(dPayload.get(), bytes, n, cfg, nullptr, nullptr), geo::Error);
  for (float alpha :
       {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    EXPECT_THROW(
        qsgdDecodeAccumulateCuda(dPayload.get(), bytes, n, cfg, alpha, dOut.get(), nullptr),
        geo::Error);
  }
  EXPECT_THROW(castToFp16Cuda(nullptr, 4, nullptr, nullptr), geo::Error);
  EXPECT_THROW(castFromBf16Cuda(nullptr, -1, nullptr, nullptr), geo::Error);
  // n = 0 needs no buffers.
  qsgdEncodeCuda(nullptr, 0, cfg, {}, nullptr, 0, nullptr, nullptr);
  qsgdDecodeAccumulateCuda(nullptr, 0, 0, cfg, 1.0f, nullptr, nullptr);
  EXPECT_EQ(castToBf16Cuda(nullptr, 0, nullptr, nullptr), 0);
}

TEST(QsgdCuda, ConcurrentThreadsAndStreamsMatchCpu) {
  if (!geo::kernels::cudaDeviceAvailable()) GTEST_SKIP() << "no CUDA device";
  constexpr int kThreads = 4;
  const int64_t n = 100003;
  const QsgdConfig cfg{2, 512, QsgdScale::kL2Norm};
  const int64_t bytes = qsgdEncodedBytes(n, cfg);
  std::vector<std::vector<uint8_t>> gpu(kThreads);
  std::vector<std::string> errors(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      try {
        cudaStream_t stream = nullptr;
        cudaCheck(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
        const std::vector<float> in = makeInput(n, 512, 40u + static_cast<uint32_t>(t));
        DeviceBuffer<float> dIn(in);
        DeviceBuffer<uint8_t> dOut(static_cast<size_t>(bytes));
        for (int rep = 0; rep < 5; ++rep) {
          qsgdEncodeCuda(dIn.get(), n, cfg, {static_cast<uint64_t>(t), 0}, dOut.get(), bytes,
                         nullptr, stream);
        }
        gpu[t] = dOut.download();
        cudaCheck(cudaStreamDestroy(stream), "cudaStreamDestroy");
      } catch (const std::exception& e) {
        errors[t] = e.what();
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) {
    SCOPED_TRACE("thread " + std::to_string(t));
    ASSERT_EQ(errors[t], "");
    const std::vector<float> in = makeInput(n, 512, 40u + static_cast<uint32_t>(t));
    std::vector<uint8_t> cpu(static_cast<size_t>(bytes));
    qsgdEncode(in.data(), n, cfg, {static_cast<uint64_t>(t), 0}, cpu.data(), bytes);
    expectSameBytes(cpu, gpu[t], static_cast<size_t>(bytes), "payload");
  }
}

// ---- casts -----------------------------------------------------------------------

std::vector<uint16_t> allHalfCodes() {
  std::vector<uint16_t> codes(1 << 16);
  for (size_t i = 0; i < codes.size(); ++i) codes[i] = static_cast<uint16_t>(i);
  return codes;
}

// The worker's path: a device update with error feedback encoded into a host
// payload, and a host payload accumulated into a device tensor, each ordered
// after work still queued on the default stream. Bytes and floats must be
// the CPU kernels', whatever the payload's host alignment.
TEST(QsgdCuda, HostPayloadsMatchCpuAndFollowTheDefaultStream) {
  if (!geo::kernels::cudaDeviceAvailable()) GTEST_SKIP() << "no CUDA device";
  for (const int bits : {2, 4, 8}) {
    SCOPED_TRACE("bits " + std::to_string(bits));
    const QsgdConfig cfg{bits, 512, QsgdScale::kMaxAbs};
    const int64_t n = (int64_t{1} << 20) + 3;
    const auto nz = static_cast<size_t>(n);
    const int64_t bytes = qsgdEncodedBytes(n, cfg);
    const std::vector<float> in = makeInput(n, 512, 77u);
    std::vector<float> cpuResidual = makeInput(n, 512, 78u, 1e-3f);
    DeviceBuffer<float> dIn(nz);
    DeviceBuffer<float> dResidual(cpuResidual);
    // Queued on the default stream, not finished when the encode is called:
    // the encoder must read these values, not what was there before.
    std::vector<float> zeros(nz, 0.0f);
    dIn.upload(zeros);
    cudaCheck(
        cudaMemcpyAsync(dIn.get(), in.data(), nz * sizeof(float), cudaMemcpyHostToDevice, nullptr),
        "cudaMemcpyAsync");

    std::vector<uint8_t> cpu(static_cast<size_t>(bytes));
    qsgdEncode(in.data(), n, cfg, {5, 9}, cpu.data(), bytes, cpuResidual.data());
    std::vector<uint8_t> host(static_cast<size_t>(bytes) + 1, 0);  // +1: unaligned payload
    qsgdEncodeCudaToHost(dIn.get(), n, cfg, {5, 9}, host.data() + 1, bytes, dResidual.get(),
                         nullptr);
    const std::vector<uint8_t> gpu(host.begin() + 1, host.end());
    expectSameBytes(cpu, gpu, static_cast<size_t>(bytes), "payload");
    expectSameBytes(cpuResidual, dResidual.download(), nz, "residual");

    std::vector<float> expect = makeInput(n, 512, 79u);
    DeviceBuffer<float> dOut(expect);
    qsgdDecodeAccumulate(cpu.data(), bytes, n, cfg, 0.5f, expect.data());
    qsgdDecodeAccumulateCudaFromHost(host.data() + 1, bytes, n, cfg, 0.5f, dOut.get(), nullptr);
    expectSameBytes(expect, dOut.download(), nz, "accumulated");

    // A corrupt payload throws and leaves the device tensor untouched.
    std::vector<uint8_t> corrupt = cpu;
    const float negative = -1.0f;
    std::memcpy(corrupt.data(), &negative, sizeof negative);
    EXPECT_THROW(
        qsgdDecodeAccumulateCudaFromHost(corrupt.data(), bytes, n, cfg, 0.5f, dOut.get(), nullptr),
        geo::Error);
    expectSameBytes(expect, dOut.download(), nz, "after a corrupt payload");
  }
}

// A flat update's tensors as slices of one buffer, encoded into one host
// payload and accumulated back from it with one synchronization: the bytes,
// residual and floats of the CPU kernels applied slice by slice; payload
// bytes between the slices untouched; a corrupt scale named by slice.
TEST(QsgdCuda, SlicesMatchCpuSliceBySlice) {
  if (!geo::kernels::cudaDeviceAvailable()) GTEST_SKIP() << "no CUDA device";
  const QsgdConfig cfg{4, 512, QsgdScale::kMaxAbs};
  const std::vector<int64_t> sizes = {1000, 37, 300000, 513, 65536};
  std::vector<QsgdSlice> slices;
  int64_t n = 0;
  int64_t bytes = 0;
  for (size_t k = 0; k < sizes.size(); ++k) {
    bytes += 5;  // a gap, as the raw fp32 tensors between them leave
    slices.push_back({n, sizes[k], bytes, {11, 100 + k}});
    n += sizes[k];
    bytes += qsgdEncodedBytes(sizes[k], cfg);
  }
  const auto nz = static_cast<size_t>(n);
  const std::vector<float> in = makeInput(n, 512, 91u);
  std::vector<float> cpuResidual = makeInput(n, 512, 92u, 1e-3f);
  DeviceBuffer<float> dIn(in);
  DeviceBuffer<float> dResidual(cpuResidual);

  std::vector<uint8_t> cpu(static_cast<size_t>(bytes), 0xEE);
  for (const QsgdSlice& sl : slices) {
    qsgdEncode(in.data() + sl.offset, sl.numel, cfg, sl.key, cpu.data() + sl.byteOffset,
               qsgdEncodedBytes(sl.numel, cfg), cpuResidual.data() + sl.offset);
  }
  std::vector<uint8_t> gpu(static_cast<size_t>(bytes), 0xEE);
  qsgdEncodeSlicesCudaToHost(dIn.get(), dResidual.get(), n, slices.data(),
                             static_cast<int64_t>(slices.size()), cfg, gpu.data(), bytes, nullptr);
  expectSameBytes(cpu, gpu, static_cast<size_t>(bytes), "payload");
  expectSameBytes(cpuResidual, dResidual.download(), nz, "residual");

  std::vector<float> expect = makeInput(n, 512, 93u);
  DeviceBuffer<float> dOut(expect);
  for (const QsgdSlice& sl : slices) {
    qsgdDecodeAccumulate(cpu.data() + sl.byteOffset, qsgdEncodedBytes(sl.numel, cfg), sl.numel, cfg,
                         -0.75f, expect.data() + sl.offset);
  }
  qsgdDecodeAccumulateSlicesCudaFromHost(gpu.data(), bytes, slices.data(),
                                         static_cast<int64_t>(slices.size()), cfg, -0.75f,
                                         dOut.get(), n, nullptr);
  expectSameBytes(expect, dOut.download(), nz, "accumulated");

  std::vector<uint8_t> corrupt = gpu;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(corrupt.data() + slices[2].byteOffset + 4 * 7, &nan, sizeof nan);
  try {
    qsgdDecodeAccumulateSlicesCudaFromHost(corrupt.data(), bytes, slices.data(),
                                           static_cast<int64_t>(slices.size()), cfg, 1.0f,
                                           dOut.get(), n, nullptr);
    ADD_FAILURE() << "a NaN scale was accepted";
  } catch (const geo::Error& e) {
    EXPECT_NE(std::string(e.what()).find("scale of bucket 7 of slice 2"), std::string::npos)
        << e.what();
  }
  // A slice beyond the buffer is refused before anything runs.
  std::vector<QsgdSlice> beyond = {{n - 10, 11, 0, {}}};
  EXPECT_THROW(qsgdEncodeSlicesCudaToHost(dIn.get(), nullptr, n, beyond.data(), 1, cfg, gpu.data(),
                                          bytes, nullptr),
               geo::Error);
}

TEST(CastsCuda, DecodesAllCodesLikeCpu) {
  if (!geo::kernels::cudaDeviceAvailable()) GTEST_SKIP() << "no CUDA device";
  const std::vector<uint16_t> codes = allHalfCodes();
  const int64_t n = static_cast<int64_t>(codes.size());
  const auto nz = codes.size();
  const float alpha = 0.7f;
  const std::vector<float> base = makeInput(n, 512, 31u);
  for (size_t offset : {0, 1}) {  // 1: unaligned, scalar path
    SCOPED_TRACE("offset " + std::to_string(offset));
    DeviceBuffer<uint16_t> dCodes(codes, offset);
    {
      std::vector<float> expect(nz);
      castFromFp16(codes.data(), n, expect.data());
      DeviceBuffer<float> dOut(nz, offset);
      castFromFp16Cuda(dCodes.get(), n, dOut.get(), nullptr);
      expectSameBytes(expect, dOut.download(), nz, "fp16 decode");  // NaN payloads included
    }
    {
      std::vector<float> expect(nz);
      castFromBf16(codes.data(), n, expect.data());
      DeviceBuffer<float> dOut(nz, offset);
      castFromBf16Cuda(dCodes.get(), n, dOut.get(), nullptr);
      expectSameBytes(expect, dOut.download(), nz, "bf16 decode");
    }
    {
      std::vector<float> expect = base;
      accumulateFp16(codes.data(), n, alpha, expect.data());
      DeviceBuffer<float> dOut(base, offset);
      accumulateFp16Cuda(dCodes.get(), n, alpha, dOut.get(), nullptr);
      expectSameFloatsOrBothNan(expect, dOut.download(), "fp16 accumulate");
    }
    {
      std::vector<float> expect = base;
      accumulateBf16(codes.data(), n, alpha, expect.data());
      DeviceBuffer<float> dOut(base, offset);
      accumulateBf16Cuda(dCodes.get(), n, alpha, dOut.get(), nullptr);
      expectSameFloatsOrBothNan(expect, dOut.download(), "bf16 accumulate");
    }
  }
}

// Rounding edges of both formats, then random bit patterns (every exponent,
// NaN payloads) and scaled normal values.
std::vector<float> castInputs() {
  const uint32_t edgeBits[] = {
      0x00000000, 0x80000000, 0x3F800000, 0xBF800000, 0x00000001, 0x807FFFFF,
      0x00800000, 0x7F7FFFFF, 0xFF7FFFFF, 0x7F800000, 0xFF800000, 0x7FC00000,
      0xFFC00000, 0x7F800001, 0xFFA12345, 0x477FE000,  // 65504, the largest fp16
      0x477FEFFF, 0x477FF000,                          // just below / at the fp16 overflow tie
      0x33800000, 0x33000000, 0x33400000, 0x33C00000,  // around the smallest fp16 subnormal
      0x38800000, 0x387FE000, 0x387FF000,              // fp16 normal / subnormal boundary
      0x3F808000, 0x3F818000, 0x3F80C000, 0x3F807FFF,  // bf16 ties and near-ties
      0x7F7F8000, 0x7F7F7FFF, 0x007F8000, 0x00008000,
  };
  std::vector<float> v;
  for (uint32_t b : edgeBits) v.push_back(std::bit_cast<float>(b));
  std::mt19937 gen(77);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int i = 0; i < (1 << 19); ++i)
    v.push_back(std::bit_cast<float>(static_cast<uint32_t>(gen())));
  for (int i = 0; i < (1 << 19); ++i) {
    v.push_back(normal(gen) * std::ldexp(1.0f, static_cast<int>(gen() % 80) - 40));
  }
  for (int i = 0; i < 3; ++i) v.push_back(1.0f / 3.0f);  // odd length: a scalar tail
  return v;
}

TEST(CastsCuda, EncodesLikeCpu) {
  if (!geo::kernels::cudaDeviceAvailable()) GTEST_SKIP() << "no CUDA device";
  const std::vector<float> in = castInputs();
  const int64_t n = static_cast<int64_t>(in.size());
  const auto nz = in.size();
  for (size_t offset : {0, 1}) {
    SCOPED_TRACE("offset " + std::to_string(offset));
    DeviceBuffer<float> dIn(in, offset);
    DeviceBuffer<uint16_t> dOut(nz, offset);
    std::vector<uint16_t> expect(nz);

    const int64_t fp16Bad = castToFp16(in.data(), n, expect.data());
    EXPECT_EQ(castToFp16Cuda(dIn.get(), n, dOut.get(), nullptr), fp16Bad);
    expectSameBytes(expect, dOut.download(), nz, "fp16 encode");

    const int64_t bf16Bad = castToBf16(in.data(), n, expect.data());
    EXPECT_EQ(castToBf16Cuda(dIn.get(), n, dOut.get(), nullptr), bf16Bad);
    expectSameBytes(expect, dOut.download(), nz, "bf16 encode");
  }
}

}  // namespace
}  // namespace geo::kernels
