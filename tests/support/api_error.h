#pragma once
// Errors of the test apiserver, shaped like the real kube-apiserver's.
//
// Every failure the server answers carries a `Status` body (kind Status,
// apiVersion v1, status Failure, message, reason, details, code), built from
// an ApiError. Inside the server, request handling throws ApiError and the
// HTTP layer turns it into the answer; nothing throws past a handler.

#include <nlohmann/json.hpp>

#include <stdexcept>
#include <string>
#include <string_view>

namespace geo::testapi {

using Json = nlohmann::json;

// What the HTTP layer needs to answer a failed request. `details` follows
// metav1.StatusDetails (name, group, kind, causes, retryAfterSeconds).
class ApiError : public std::runtime_error {
 public:
  ApiError(int code, std::string reason, std::string message, Json details = Json::object())
      : std::runtime_error(message),
        code_(code),
        reason_(std::move(reason)),
        details_(std::move(details)) {}

  int code() const { return code_; }
  const std::string& reason() const { return reason_; }
  const Json& details() const { return details_; }

  // The metav1.Status body for this error.
  Json toStatus() const;

 private:
  int code_;
  std::string reason_;
  Json details_;
};

// The resource's "group-qualified plural" the real server prints in
// messages: "configmaps" for the core group, "trainingjobs.geotrain.io" else.
std::string qualifiedResource(std::string_view group, std::string_view resource);

ApiError notFound(std::string_view group, std::string_view resource, std::string_view name);
ApiError alreadyExists(std::string_view group, std::string_view resource, std::string_view name);
// 409 Conflict for a stale resourceVersion (or a failed precondition).
ApiError conflict(std::string_view group, std::string_view resource, std::string_view name,
                  std::string_view why);
// 422 Invalid; `causes` is a list of {reason, message, field}.
ApiError invalid(std::string_view group, std::string_view kind, std::string_view name,
                 const Json& causes);
ApiError badRequest(std::string message);
ApiError methodNotSupported(std::string_view group, std::string_view resource,
                            std::string_view verb);
ApiError gone(std::string message);
ApiError forbidden(std::string message);

}  // namespace geo::testapi
