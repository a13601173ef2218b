#include "common/status.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>

namespace geo {
namespace {

TEST(Status, DefaultIsOk) {
  Status s;
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.toString(), "OK");
  EXPECT_NO_THROW(s.throwIfError());
}

TEST(Status, CarriesCodeAndMessage) {
  Status s = invalidArgument("bits must be 2, 4 or 8 (got 3)");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.toString(), "INVALID_ARGUMENT: bits must be 2, 4 or 8 (got 3)");
  EXPECT_EQ(s.withContext("worker.yaml").message(), "worker.yaml: bits must be 2, 4 or 8 (got 3)");
  EXPECT_THROW(s.throwIfError(), Error);
}

TEST(Status, CodeNamesAreCanonical) {
  EXPECT_EQ(statusCodeName(StatusCode::kDeadlineExceeded), "DEADLINE_EXCEEDED");
  EXPECT_EQ(statusCodeName(StatusCode::kUnavailable), "UNAVAILABLE");
  EXPECT_EQ(statusCodeName(StatusCode::kDataLoss), "DATA_LOSS");
}

StatusOr<int> half(int x) {
  if (x % 2 != 0) return invalidArgument("odd");
  return x / 2;
}

Status chain(int x, int* out) {
  auto r = half(x);
  GEO_RETURN_IF_ERROR(r.status());
  *out = *r;
  return {};
}

TEST(StatusOr, HoldsValueOrError) {
  auto good = half(8);
  ASSERT_TRUE(good.ok());
  EXPECT_EQ(*good, 4);
  auto bad = half(3);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(), "odd");
  EXPECT_THROW((void)bad.value(), Error);
}

TEST(StatusOr, MoveOnlyValues) {
  StatusOr<std::unique_ptr<int>> p(std::make_unique<int>(7));
  ASSERT_TRUE(p.ok());
  std::unique_ptr<int> taken = std::move(p).value();
  EXPECT_EQ(*taken, 7);
}

TEST(StatusOr, OkStatusWithoutValueIsABug) {
  EXPECT_THROW(StatusOr<int>{Status{}}, Error);
}

TEST(Status, ReturnIfErrorPropagates) {
  int out = 0;
  EXPECT_TRUE(chain(10, &out).ok());
  EXPECT_EQ(out, 5);
  EXPECT_EQ(chain(7, &out).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace geo
