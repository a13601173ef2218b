#pragma once
// Status and StatusOr<T>: error values for code that must not throw (I/O
// threads, poll loops, the controller's reconcile()).
//
// A Status is either ok() or carries a StatusCode and a human-readable message
// that names what was wrong. The codes follow the canonical gRPC/absl set so
// they map one-to-one onto Kubernetes and transport failures. StatusOr<T> holds
// a T or a non-ok Status; value() on an error throws geo::Error (a bug in the
// caller, who must check ok() first). Both are a Result<T, E> (below), the
// template every result type of the project shares.

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

#include "common/enforce.h"

namespace geo {

enum class StatusCode {
  kOk = 0,
  kCancelled,
  kUnknown,
  kInvalidArgument,
  kDeadlineExceeded,
  kNotFound,
  kAlreadyExists,
  kPermissionDenied,
  kResourceExhausted,
  kFailedPrecondition,
  kAborted,
  kOutOfRange,
  kUnimplemented,
  kInternal,
  kUnavailable,
  kDataLoss,
  kUnauthenticated,
};

// "OK", "INVALID_ARGUMENT", ...
std::string_view statusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // ok
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // Prefixes the message with context, e.g. "loading worker.yaml: ...".
  Status withContext(std::string_view context) const;

  // "INVALID_ARGUMENT: bits must be 2, 4 or 8 (got 3)"; "OK" when ok.
  std::string toString() const;

  // Throws geo::Error with toString() unless ok(). For boundaries where a
  // Status meets code that uses exceptions.
  void throwIfError() const;

  friend bool operator==(const Status& a, const Status& b) {
    return a.code_ == b.code_ && a.message_ == b.message_;
  }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

Status invalidArgument(std::string message);
Status notFound(std::string message);
Status failedPrecondition(std::string message);
Status unavailable(std::string message);
// What this process depends on went away through no fault of its own (a
// region member's leader died): started again, it rejoins.
Status aborted(std::string message);
Status deadlineExceeded(std::string message);
Status internalError(std::string message);
Status dataLoss(std::string message);

// What errorText() says about a Status, for Result's failed value().
inline std::string errorText(const Status& status) {
  return status.toString();
}

// A T or an error E: the one result template. StatusOr<T> is Result<T,
// Status>; the Kubernetes client's ApiResult<T> (controller/kube/api_error.h)
// is Result<T, ApiError>, so the API reason survives until the caller
// decides. E needs an errorText(const E&) found by argument-dependent lookup,
// for the message of a value() that is a bug (GEO_ENFORCE).
template <typename T, typename E>
class [[nodiscard]] Result {
 public:
  // Implicit from a value or from an error, so functions can `return value;`
  // and `return error;`.
  Result(T value) : value_(std::move(value)) {}  // NOLINT(google-explicit-constructor)
  Result(E error) : error_(std::move(error)) {}  // NOLINT(google-explicit-constructor)

  bool ok() const { return value_.has_value(); }
  // The error; meaningless (default-constructed) when ok().
  const E& error() const { return error_; }

  const T& value() const& {
    ensureOk();
    return *value_;
  }
  T& value() & {
    ensureOk();
    return *value_;
  }
  T&& value() && {
    ensureOk();
    return std::move(*value_);
  }
  const T& operator*() const& { return value(); }
  T& operator*() & { return value(); }
  const T* operator->() const { return &value(); }
  T* operator->() { return &value(); }

 private:
  void ensureOk() const {
    GEO_ENFORCE(value_.has_value(), "value() of a result that holds an error: {}",
                errorText(error_));
  }

  E error_;
  std::optional<T> value_;
};

template <typename T>
class [[nodiscard]] StatusOr : public Result<T, Status> {
 public:
  StatusOr(T value) : Result<T, Status>(std::move(value)) {}  // NOLINT(google-explicit-constructor)
  // NOLINTNEXTLINE(google-explicit-constructor)
  StatusOr(Status status) : Result<T, Status>(std::move(status)) {
    GEO_ENFORCE(!this->error().ok(), "StatusOr constructed from an ok Status without a value");
  }

  // The error, or OK.
  const Status& status() const { return this->error(); }
};

}  // namespace geo

// Returns the Status of `expr` from the enclosing function when it is an error.
#define GEO_RETURN_IF_ERROR(expr)            \
  do {                                       \
    ::geo::Status geoStatus_ = (expr);       \
    if (!geoStatus_.ok()) return geoStatus_; \
  } while (false)
