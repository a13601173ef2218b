#pragma once
// Errors of the Kubernetes API, as values.
//
// Every failed call of the client yields an ApiError: the HTTP code and the
// `reason` of the server's metav1.Status body (NotFound, AlreadyExists,
// Conflict, Invalid, Gone, TooManyRequests, ...), or httpCode 0 when no HTTP
// answer came (connection refused, TLS failure, timeout, cancelled). Callers
// branch on the predicates (isConflict(), isGone(), ...) and hand the error
// on as a geo::Status with toStatus(); the StatusCode mapping keeps each
// reason family distinct (AlreadyExists and Conflict are both HTTP 409 but
// map to kAlreadyExists and kAborted).
//
// ApiResult<T> is Result<T, ApiError> (common/status.h), the template
// StatusOr<T> is made of, with an ApiError instead of a Status, so the
// reason survives until the caller decides. Neither type throws except
// value() on an error (a bug in the caller, GEO_ENFORCE).

#include <chrono>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include <nlohmann/json.hpp>

#include "common/enforce.h"
#include "common/status.h"

namespace geo::kube {

// metav1.StatusReason values the client distinguishes.
namespace reason {
inline constexpr std::string_view kBadRequest = "BadRequest";
inline constexpr std::string_view kUnauthorized = "Unauthorized";
inline constexpr std::string_view kForbidden = "Forbidden";
inline constexpr std::string_view kNotFound = "NotFound";
inline constexpr std::string_view kMethodNotAllowed = "MethodNotAllowed";
inline constexpr std::string_view kAlreadyExists = "AlreadyExists";
inline constexpr std::string_view kConflict = "Conflict";
inline constexpr std::string_view kGone = "Gone";
inline constexpr std::string_view kExpired = "Expired";
inline constexpr std::string_view kInvalid = "Invalid";
inline constexpr std::string_view kTooManyRequests = "TooManyRequests";
inline constexpr std::string_view kInternalError = "InternalError";
inline constexpr std::string_view kServiceUnavailable = "ServiceUnavailable";
inline constexpr std::string_view kTimeout = "Timeout";
inline constexpr std::string_view kUnknown = "Unknown";
}  // namespace reason

struct ApiError {
  // 0: no HTTP answer (transport failure, timeout, cancellation); see `code`.
  int httpCode = 0;
  // The Status body's reason, or the reason implied by httpCode when the body
  // has none (a proxy's HTML page, an empty body); "" for transport failures.
  std::string reason;
  std::string message;
  // The Status body's `details` (name, kind, causes, retryAfterSeconds); null
  // when absent.
  nlohmann::json details;
  // Retry-After header, or details.retryAfterSeconds.
  std::optional<std::chrono::seconds> retryAfter;
  // The geo::Status family; set by the factories below.
  StatusCode code = StatusCode::kUnknown;

  bool isNotFound() const { return reason == reason::kNotFound; }
  bool isAlreadyExists() const { return reason == reason::kAlreadyExists; }
  // A stale resourceVersion or failed precondition: re-read and retry.
  bool isConflict() const { return reason == reason::kConflict; }
  // The watch/list resourceVersion is too old: drop the cache and list again.
  bool isGone() const {
    return httpCode == 410 || reason == reason::kGone || reason == reason::kExpired;
  }
  bool isInvalid() const { return reason == reason::kInvalid; }
  bool isTooManyRequests() const { return httpCode == 429; }
  bool isForbidden() const { return httpCode == 403; }
  bool isUnauthorized() const { return httpCode == 401; }
  bool isServerError() const { return httpCode >= 500; }
  bool isTransport() const { return httpCode == 0; }
  bool isCancelled() const { return code == StatusCode::kCancelled; }

  // "Conflict (409): Operation cannot be fulfilled on ..." as a Status with
  // `code`; `context` (e.g. "PUT /api/v1/...") is prefixed when not empty.
  Status toStatus(std::string_view context = {}) const;
};

// Decodes an HTTP answer that was not 2xx. A metav1.Status body supplies
// reason, message, details and (when it disagrees with the header) code;
// anything else yields the reason implied by httpCode and the body's start as
// the message. `retryAfterHeader` is the raw Retry-After value ("" if none).
ApiError decodeApiError(int httpCode, std::string_view body,
                        std::string_view retryAfterHeader = {});

// An error without an HTTP answer: the connection failed (kUnavailable: the
// request was not sent), the answer was lost (kUnknown: it may have been
// applied), a timeout (kDeadlineExceeded), cancel() (kCancelled), or the
// client refused a bad call (kInvalidArgument).
ApiError localError(StatusCode code, std::string message);

// The reason the API server uses for an HTTP code without a Status body.
std::string_view reasonForHttpCode(int httpCode);

// Retry-After as delay-seconds ("3"); HTTP-dates and garbage give nullopt (the
// API server only sends seconds).
std::optional<std::chrono::seconds> parseRetryAfter(std::string_view value);

// For Result's message on a value() that is a bug.
inline std::string errorText(const ApiError& error) {
  return error.toStatus().toString();
}

template <typename T>
class [[nodiscard]] ApiResult : public Result<T, ApiError> {
 public:
  ApiResult(T value) : Result<T, ApiError>(std::move(value)) {}         // NOLINT
  ApiResult(ApiError error) : Result<T, ApiError>(std::move(error)) {}  // NOLINT

  // OK, or the error as a Status (ApiError::toStatus with `context`).
  Status status(std::string_view context = {}) const {
    return this->ok() ? Status() : this->error().toStatus(context);
  }
};

}  // namespace geo::kube
