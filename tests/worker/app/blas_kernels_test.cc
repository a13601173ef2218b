// What geotrain-worker sets in its process before LibTorch loads
// (worker/app/training_library.h): OpenBLAS's kernels chosen by the CPU's
// features where the user has not chosen them, and malloc's mmap threshold
// fixed. Each case puts the environment back as it found it.

#include <gtest/gtest.h>

#include <malloc.h>

#include <cstdlib>
#include <optional>
#include <string>

#include "worker/app/training_library.h"

namespace geo::app {
namespace {

// The environment variable as it was, put back at the end of a test.
class CoreTypeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const char* v = std::getenv("OPENBLAS_CORETYPE")) saved_ = v;
    ::unsetenv("OPENBLAS_CORETYPE");
  }
  void TearDown() override {
    if (saved_) {
      ::setenv("OPENBLAS_CORETYPE", saved_->c_str(), 1);
    } else {
      ::unsetenv("OPENBLAS_CORETYPE");
    }
  }
  static std::string coreType() {
    const char* v = std::getenv("OPENBLAS_CORETYPE");
    return v ? v : "";
  }
  std::optional<std::string> saved_;
};

TEST_F(CoreTypeTest, TheUsersChoiceWins) {
  ::setenv("OPENBLAS_CORETYPE", "Prescott", 1);
  EXPECT_EQ(chooseBlasKernels(), std::nullopt);
  EXPECT_EQ(coreType(), "Prescott");
}

TEST_F(CoreTypeTest, UnsetItFollowsTheCpusFeatures) {
  const auto said = chooseBlasKernels();
#if defined(__x86_64__)
  __builtin_cpu_init();
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") &&
                      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
                      __builtin_cpu_supports("avx512vl");
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  const std::string expected = avx512 ? "SkylakeX" : avx2 ? "Haswell" : "";
  EXPECT_EQ(coreType(), expected);
  if (expected.empty()) {
    EXPECT_EQ(said, std::nullopt);
  } else {
    ASSERT_TRUE(said.has_value());
    EXPECT_NE(said->find("OPENBLAS_CORETYPE=" + expected), std::string::npos) << *said;
  }
#else
  EXPECT_EQ(said, std::nullopt);
  EXPECT_EQ(coreType(), "");
#endif
}

TEST_F(CoreTypeTest, AnEmptyValueCountsAsUnset) {
  ::setenv("OPENBLAS_CORETYPE", "", 1);
  const auto said = chooseBlasKernels();
  EXPECT_EQ(said.has_value(), !coreType().empty());
}

TEST(MmapThreshold, FixedUnlessTheUserSetIt) {
  const char* before = std::getenv("MALLOC_MMAP_THRESHOLD_");
  const std::optional<std::string> saved =
      before ? std::optional<std::string>(before) : std::nullopt;
  ::setenv("MALLOC_MMAP_THRESHOLD_", "65536", 1);
  EXPECT_FALSE(fixMmapThreshold()) << "the user's MALLOC_MMAP_THRESHOLD_ was overridden";
  ::unsetenv("MALLOC_MMAP_THRESHOLD_");
  EXPECT_TRUE(fixMmapThreshold());
  // A freed 2 MiB block goes back to the kernel at once: the heap's
  // resident bytes (mallinfo2's arena, the main heap's size) do not grow
  // by it, as they would once the dynamic threshold had risen past it.
  for (int i = 0; i < 4; ++i) {
    void* big = std::malloc(8 << 20);  // freed mapped blocks raised the threshold before
    ASSERT_NE(big, nullptr);
    std::free(big);
  }
  const size_t arenaBefore = ::mallinfo2().arena;
  void* block = std::malloc(2 << 20);
  ASSERT_NE(block, nullptr);
  EXPECT_GE(::mallinfo2().hblkhd, size_t{2} << 20) << "a 2 MiB block not served by a mapping";
  std::free(block);
  EXPECT_LT(::mallinfo2().arena, arenaBefore + (1 << 20));
  if (saved) ::setenv("MALLOC_MMAP_THRESHOLD_", saved->c_str(), 1);
}

}  // namespace
}  // namespace geo::app
