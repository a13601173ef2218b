#include "common/status.h"

#include <fmt/format.h>

namespace geo {

std::string_view statusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "OK";
    case StatusCode::kCancelled: return "CANCELLED";
    case StatusCode::kUnknown: return "UNKNOWN";
    case StatusCode::kInvalidArgument: return "INVALID_ARGUMENT";
    case StatusCode::kDeadlineExceeded: return "DEADLINE_EXCEEDED";
    case StatusCode::kNotFound: return "NOT_FOUND";
    case StatusCode::kAlreadyExists: return "ALREADY_EXISTS";
    case StatusCode::kPermissionDenied: return "PERMISSION_DENIED";
    case StatusCode::kResourceExhausted: return "RESOURCE_EXHAUSTED";
    case StatusCode::kFailedPrecondition: return "FAILED_PRECONDITION";
    case StatusCode::kAborted: return "ABORTED";
    case StatusCode::kOutOfRange: return "OUT_OF_RANGE";
    case StatusCode::kUnimplemented: return "UNIMPLEMENTED";
    case StatusCode::kInternal: return "INTERNAL";
    case StatusCode::kUnavailable: return "UNAVAILABLE";
    case StatusCode::kDataLoss: return "DATA_LOSS";
    case StatusCode::kUnauthenticated: return "UNAUTHENTICATED";
  }
  return "UNKNOWN";
}

Status Status::withContext(std::string_view context) const {
  if (ok()) return *this;
  return Status(code_, fmt::format("{}: {}", context, message_));
}

std::string Status::toString() const {
  if (ok()) return "OK";
  return fmt::format("{}: {}", statusCodeName(code_), message_);
}

void Status::throwIfError() const {
  if (!ok()) throw Error(toString());
}

Status invalidArgument(std::string message) {
  return {StatusCode::kInvalidArgument, std::move(message)};
}
Status notFound(std::string message) {
  return {StatusCode::kNotFound, std::move(message)};
}
Status failedPrecondition(std::string message) {
  return {StatusCode::kFailedPrecondition, std::move(message)};
}
Status unavailable(std::string message) {
  return {StatusCode::kUnavailable, std::move(message)};
}
Status aborted(std::string message) {
  return {StatusCode::kAborted, std::move(message)};
}
Status deadlineExceeded(std::string message) {
  return {StatusCode::kDeadlineExceeded, std::move(message)};
}
Status internalError(std::string message) {
  return {StatusCode::kInternal, std::move(message)};
}
Status dataLoss(std::string message) {
  return {StatusCode::kDataLoss, std::move(message)};
}

}  // namespace geo
