#include "tests/support/api_error.h"

#include <fmt/format.h>

namespace geo::testapi {

Json ApiError::toStatus() const {
  Json status = {{"kind", "Status"},    {"apiVersion", "v1"}, {"metadata", Json::object()},
                 {"status", "Failure"}, {"message", what()},  {"reason", reason_},
                 {"code", code_}};
  if (!details_.empty()) status["details"] = details_;
  return status;
}

std::string qualifiedResource(std::string_view group, std::string_view resource) {
  if (group.empty()) return std::string(resource);
  return fmt::format("{}.{}", resource, group);
}

namespace {

Json nameDetails(std::string_view group, std::string_view resource, std::string_view name) {
  Json d = {{"name", name}, {"kind", resource}};
  if (!group.empty()) d["group"] = group;
  return d;
}

}  // namespace

ApiError notFound(std::string_view group, std::string_view resource, std::string_view name) {
  return ApiError(404, "NotFound",
                  fmt::format("{} \"{}\" not found", qualifiedResource(group, resource), name),
                  nameDetails(group, resource, name));
}

ApiError alreadyExists(std::string_view group, std::string_view resource, std::string_view name) {
  return ApiError(409, "AlreadyExists",
                  fmt::format("{} \"{}\" already exists", qualifiedResource(group, resource), name),
                  nameDetails(group, resource, name));
}

ApiError conflict(std::string_view group, std::string_view resource, std::string_view name,
                  std::string_view why) {
  return ApiError(409, "Conflict",
                  fmt::format("Operation cannot be fulfilled on {} \"{}\": {}",
                              qualifiedResource(group, resource), name, why),
                  nameDetails(group, resource, name));
}

ApiError invalid(std::string_view group, std::string_view kind, std::string_view name,
                 const Json& causes) {
  std::string joined;
  for (const auto& c : causes) {
    if (!joined.empty()) joined += ", ";
    joined += fmt::format("{}: {}", c.value("field", ""), c.value("message", ""));
  }
  std::string groupKind = group.empty() ? std::string(kind) : fmt::format("{}.{}", kind, group);
  Json details = {{"name", name}, {"kind", kind}, {"causes", causes}};
  if (!group.empty()) details["group"] = group;
  return ApiError(422, "Invalid", fmt::format("{} \"{}\" is invalid: {}", groupKind, name, joined),
                  details);
}

ApiError badRequest(std::string message) {
  return ApiError(400, "BadRequest", std::move(message));
}

ApiError methodNotSupported(std::string_view group, std::string_view resource,
                            std::string_view verb) {
  return ApiError(405, "MethodNotAllowed",
                  fmt::format("{} is not supported on resources of kind \"{}\"", verb,
                              qualifiedResource(group, resource)),
                  Json{{"kind", resource}, {"group", group}});
}

ApiError gone(std::string message) {
  return ApiError(410, "Expired", std::move(message));
}

ApiError forbidden(std::string message) {
  return ApiError(403, "Forbidden", std::move(message));
}

}  // namespace geo::testapi
