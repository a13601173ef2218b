#include "common/enforce.h"

#include <gtest/gtest.h>

#include <string>

namespace geo {
namespace {

int positive(int x) {
  GEO_ENFORCE(x > 0, "x must be positive, got {}", x);
  return x;
}

TEST(Enforce, PassesThroughWhenTrue) {
  EXPECT_EQ(positive(3), 3);
}

TEST(Enforce, ThrowsWithLocationConditionAndMessage) {
  try {
    positive(-2);
    FAIL() << "expected geo::Error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.rfind("tests/common/enforce_test.cc:", 0), std::string::npos) << what;
    EXPECT_NE(what.find("`x > 0`"), std::string::npos) << what;
    EXPECT_NE(what.find("x must be positive, got -2"), std::string::npos) << what;
  }
}

TEST(Enforce, EqPrintsBothValues) {
  try {
    GEO_ENFORCE_EQ(2 + 2, 5, "arithmetic");
    FAIL() << "expected geo::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("arithmetic (got 4 vs 5)"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(GEO_ENFORCE_EQ(std::string("a"), "a", "strings"));
}

TEST(Enforce, EvaluatesArgumentsOnce) {
  int calls = 0;
  auto next = [&] { return ++calls; };
  GEO_ENFORCE_EQ(next(), 1, "once");
  EXPECT_EQ(calls, 1);
}

}  // namespace
}  // namespace geo
