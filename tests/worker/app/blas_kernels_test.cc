// chooseBlasKernels (worker/app/training_library.h): OpenBLAS's kernels
// chosen by the CPU's features where the user has not chosen them. Each
// case puts the environment back as it found it.

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace geo::app
