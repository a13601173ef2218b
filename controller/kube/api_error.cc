#include "controller/kube/api_error.h"

#include <charconv>

#include <fmt/format.h>

namespace geo::kube {
namespace {

StatusCode codeFor(std::string_view why, int httpCode) {
  if (why == reason::kNotFound) return StatusCode::kNotFound;
  if (why == reason::kAlreadyExists) return StatusCode::kAlreadyExists;
  if (why == reason::kConflict) return StatusCode::kAborted;
  if (why == reason::kInvalid || why == reason::kBadRequest) return StatusCode::kInvalidArgument;
  if (why == reason::kGone || why == reason::kExpired) return StatusCode::kOutOfRange;
  if (why == reason::kTooManyRequests) return StatusCode::kResourceExhausted;
  if (why == reason::kUnauthorized) return StatusCode::kUnauthenticated;
  if (why == reason::kForbidden) return StatusCode::kPermissionDenied;
  if (why == reason::kMethodNotAllowed) return StatusCode::kUnimplemented;
  if (why == reason::kTimeout) return StatusCode::kDeadlineExceeded;
  if (why == reason::kServiceUnavailable) return StatusCode::kUnavailable;
  if (why == reason::kInternalError) return StatusCode::kInternal;
  if (httpCode >= 500) return StatusCode::kUnavailable;
  if (httpCode >= 400) return StatusCode::kFailedPrecondition;
  return StatusCode::kUnknown;
}

}  // namespace

std::string_view reasonForHttpCode(int httpCode) {
  switch (httpCode) {
    case 400: return reason::kBadRequest;
    case 401: return reason::kUnauthorized;
    case 403: return reason::kForbidden;
    case 404: return reason::kNotFound;
    case 405: return reason::kMethodNotAllowed;
    case 409: return reason::kConflict;
    case 410: return reason::kGone;
    case 422: return reason::kInvalid;
    case 429: return reason::kTooManyRequests;
    case 500: return reason::kInternalError;
    case 503: return reason::kServiceUnavailable;
    case 504: return reason::kTimeout;
    default: return reason::kUnknown;
  }
}

std::optional<std::chrono::seconds> parseRetryAfter(std::string_view value) {
  constexpr std::string_view kSpace = " \t\r\n";
  while (!value.empty() && kSpace.find(value.front()) != std::string_view::npos) {
    value.remove_prefix(1);
  }
  while (!value.empty() && kSpace.find(value.back()) != std::string_view::npos) {
    value.remove_suffix(1);
  }
  long long seconds = 0;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), seconds);
  if (value.empty() || ec != std::errc() || end != value.data() + value.size() || seconds < 0) {
    return std::nullopt;
  }
  return std::chrono::seconds(seconds);
}

ApiError decodeApiError(int httpCode, std::string_view body, std::string_view retryAfterHeader) {
  ApiError error;
  error.httpCode = httpCode;
  error.retryAfter = parseRetryAfter(retryAfterHeader);
  const nlohmann::json status = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  const bool isStatus = status.is_object() && status.value("kind", std::string()) == "Status";
  if (isStatus) {
    error.reason = status.value("reason", std::string());
    error.message = status.value("message", std::string());
    if (status.contains("details") && status["details"].is_object()) {
      error.details = status["details"];
      const auto& seconds = error.details["retryAfterSeconds"];
      if (!error.retryAfter && seconds.is_number_integer() && seconds.get<long long>() >= 0) {
        error.retryAfter = std::chrono::seconds(seconds.get<long long>());
      }
    }
  } else {
    // Not from the API server itself (a proxy, a load balancer): keep the
    // start of the body so the message still says something.
    constexpr size_t kMaxBody = 256;
    error.message = std::string(body.substr(0, kMaxBody));
    if (body.size() > kMaxBody) error.message += "...";
  }
  if (error.reason.empty()) error.reason = std::string(reasonForHttpCode(httpCode));
  if (error.message.empty()) error.message = fmt::format("HTTP {}", httpCode);
  error.code = codeFor(error.reason, httpCode);
  return error;
}

ApiError localError(StatusCode code, std::string message) {
  ApiError error;
  error.code = code;
  error.message = std::move(message);
  return error;
}

Status ApiError::toStatus(std::string_view context) const {
  std::string text =
      httpCode == 0 ? message : fmt::format("{} ({}): {}", reason, httpCode, message);
  if (!context.empty()) text = fmt::format("{}: {}", context, text);
  return {code == StatusCode::kOk ? StatusCode::kUnknown : code, std::move(text)};
}

}  // namespace geo::kube
