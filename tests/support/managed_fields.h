#pragma once
// Field ownership (metadata.managedFields) and server-side apply.
//
// Ownership is tracked per (manager, operation, subresource) as a set of
// field paths in the fieldsV1 notation ("f:spec", "k:{\"name\":\"c\"}",
// "v:\"x\"", "."). Updates (create, PUT, non-apply PATCH) give their
// manager the fields they changed and take those fields from everyone else;
// an apply owns exactly the fields of its configuration, conflicts with
// other managers that own a field it sets to a different value (409 with the
// managers and fields, unless force), and removes the fields it applied
// before and no longer applies when nobody else owns them.

#include <nlohmann/json.hpp>

#include <string>

#include "tests/support/resource_registry.h"

namespace geo::testapi {

using Json = nlohmann::json;

// Fills `updated.metadata.managedFields` after a non-apply write by
// `manager` (old == nullptr for a create). When the request itself changed
// managedFields (kubectl's client-side -> server-side apply migration), the
// request's value stands, as on the real server.
void trackUpdate(const Json* old, Json& updated, const ResourceType& type,
                 const std::string& manager, const std::string& subresource,
                 const std::string& now);

// The object after `manager` applies `applied` (a full configuration of the
// object, already decoded) to `live` (nullptr: the object does not exist).
// Throws ApiError 409 (reason Conflict, causes FieldManagerConflict) on
// conflicts unless `force`.
Json serverSideApply(const Json* live, const Json& applied, const ResourceType& type,
                     const std::string& manager, bool force, const std::string& subresource,
                     const std::string& now);

}  // namespace geo::testapi
