#include "controller/kube/api_error.h"

#include <gtest/gtest.h>

namespace geo::kube {
namespace {

TEST(ApiErrorTest, DecodesNotFoundStatus) {
  const ApiError error = decodeApiError(404, R"({
    "kind": "Status", "apiVersion": "v1", "status": "Failure",
    "message": "configmaps \"x\" not found", "reason": "NotFound",
    "details": {"name": "x", "kind": "configmaps"}, "code": 404})");
  EXPECT_EQ(error.httpCode, 404);
  EXPECT_EQ(error.reason, "NotFound");
  EXPECT_EQ(error.message, "configmaps \"x\" not found");
  EXPECT_EQ(error.details["name"], "x");
  EXPECT_TRUE(error.isNotFound());
  EXPECT_FALSE(error.isConflict());
  EXPECT_EQ(error.code, StatusCode::kNotFound);
  EXPECT_EQ(error.toStatus().toString(), "NOT_FOUND: NotFound (404): configmaps \"x\" not found");
  EXPECT_EQ(error.toStatus("GET x").message(), "GET x: NotFound (404): configmaps \"x\" not found");
}

TEST(ApiErrorTest, ConflictAndAlreadyExistsAreDistinct) {
  const ApiError conflict = decodeApiError(
      409,
      R"({"kind":"Status","reason":"Conflict","message":"the object has been modified","code":409})");
  const ApiError exists = decodeApiError(
      409, R"({"kind":"Status","reason":"AlreadyExists","message":"already exists","code":409})");
  EXPECT_TRUE(conflict.isConflict());
  EXPECT_FALSE(conflict.isAlreadyExists());
  EXPECT_TRUE(exists.isAlreadyExists());
  EXPECT_FALSE(exists.isConflict());
  EXPECT_EQ(conflict.code, StatusCode::kAborted);
  EXPECT_EQ(exists.code, StatusCode::kAlreadyExists);
}

TEST(ApiErrorTest, GoneAndExpiredBothMeanRelist) {
  EXPECT_TRUE(decodeApiError(410, R"({"kind":"Status","reason":"Expired","code":410})").isGone());
  EXPECT_TRUE(decodeApiError(410, "").isGone());
  // An ERROR watch event carries the code only in the body.
  const ApiError fromEvent = decodeApiError(0, R"({"kind":"Status","reason":"Gone","code":410})");
  EXPECT_TRUE(fromEvent.isGone());
  EXPECT_EQ(fromEvent.code, StatusCode::kOutOfRange);
}

TEST(ApiErrorTest, InvalidKeepsCauses) {
  const ApiError error = decodeApiError(422, R"({"kind":"Status","reason":"Invalid",
    "message":"TrainingJob.geotrain.io \"a\" is invalid: spec.regions: Required value",
    "details":{"causes":[{"reason":"FieldValueRequired","field":"spec.regions"}]},"code":422})");
  EXPECT_TRUE(error.isInvalid());
  EXPECT_EQ(error.code, StatusCode::kInvalidArgument);
  EXPECT_EQ(error.details["causes"][0]["field"], "spec.regions");
}

TEST(ApiErrorTest, RetryAfterFromHeaderOrDetails) {
  const ApiError header =
      decodeApiError(429, R"({"kind":"Status","reason":"TooManyRequests","code":429})", "3");
  EXPECT_TRUE(header.isTooManyRequests());
  EXPECT_EQ(header.code, StatusCode::kResourceExhausted);
  ASSERT_TRUE(header.retryAfter);
  EXPECT_EQ(header.retryAfter->count(), 3);
  const ApiError details = decodeApiError(
      429, R"({"kind":"Status","reason":"TooManyRequests","details":{"retryAfterSeconds":7}})");
  ASSERT_TRUE(details.retryAfter);
  EXPECT_EQ(details.retryAfter->count(), 7);
  // The header wins over the body.
  const ApiError both = decodeApiError(
      429, R"({"kind":"Status","reason":"TooManyRequests","details":{"retryAfterSeconds":7}})",
      "1");
  EXPECT_EQ(both.retryAfter->count(), 1);
}

TEST(ApiErrorTest, NonStatusBodiesGetTheReasonOfTheCode) {
  const ApiError proxy = decodeApiError(503, "<html>upstream connect error</html>");
  EXPECT_EQ(proxy.reason, "ServiceUnavailable");
  EXPECT_EQ(proxy.message, "<html>upstream connect error</html>");
  EXPECT_EQ(proxy.code, StatusCode::kUnavailable);
  EXPECT_TRUE(proxy.isServerError());
  const ApiError empty = decodeApiError(502, "");
  EXPECT_EQ(empty.reason, "Unknown");
  EXPECT_EQ(empty.message, "HTTP 502");
  EXPECT_EQ(empty.code, StatusCode::kUnavailable);
  const ApiError forbidden = decodeApiError(403, "{}");
  EXPECT_TRUE(forbidden.isForbidden());
  EXPECT_EQ(forbidden.code, StatusCode::kPermissionDenied);
  const ApiError longBody = decodeApiError(500, std::string(1000, 'x'));
  EXPECT_EQ(longBody.message.size(), 259u);  // 256 + "..."
}

TEST(ApiErrorTest, LocalErrorsHaveNoHttpCode) {
  const ApiError error = localError(StatusCode::kUnavailable, "connection refused");
  EXPECT_TRUE(error.isTransport());
  EXPECT_FALSE(error.isCancelled());
  EXPECT_EQ(error.toStatus().toString(), "UNAVAILABLE: connection refused");
  EXPECT_TRUE(localError(StatusCode::kCancelled, "stop").isCancelled());
}

TEST(ApiErrorTest, ParseRetryAfter) {
  EXPECT_EQ(parseRetryAfter(" 12\r\n")->count(), 12);  // as the header callback sees it
  EXPECT_EQ(parseRetryAfter("0")->count(), 0);
  EXPECT_FALSE(parseRetryAfter(""));
  EXPECT_FALSE(parseRetryAfter("-1"));
  EXPECT_FALSE(parseRetryAfter("1.5"));
  EXPECT_FALSE(parseRetryAfter("Wed, 21 Oct 2015 07:28:00 GMT"));
}

TEST(ApiErrorTest, ApiResultCarriesValueOrError) {
  ApiResult<int> good = 5;
  EXPECT_TRUE(good.ok());
  EXPECT_EQ(*good, 5);
  EXPECT_TRUE(good.status().ok());
  ApiResult<int> bad = decodeApiError(404, "");
  EXPECT_FALSE(bad.ok());
  EXPECT_TRUE(bad.error().isNotFound());
  EXPECT_EQ(bad.status().code(), StatusCode::kNotFound);
  EXPECT_THROW((void)bad.value(), Error);
}

}  // namespace
}  // namespace geo::kube
