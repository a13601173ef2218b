#pragma once
// The patch formats of PATCH requests.
//
// JSON patch (RFC 6902) and JSON merge patch (RFC 7396) as the real server
// applies them; strategic merge patch for the built-in kinds, with the merge
// keys of k8s.io/api (see ResourceType::listInfo) and the directives kubectl's
// three-way merge emits ($patch, $retainKeys, $setElementOrder,
// $deleteFromPrimitiveList). Failures throw ApiError (400 for an undecodable
// patch, 422 for one that does not apply, 415 for strategic merge patch on a
// custom resource).

#include <nlohmann/json.hpp>

#include "tests/support/resource_registry.h"

namespace geo::testapi {

using Json = nlohmann::json;

Json applyJsonPatch(const Json& target, const Json& patch);
Json applyMergePatch(const Json& target, const Json& patch);
Json applyStrategicMergePatch(const Json& target, const Json& patch, const ResourceType& type);

}  // namespace geo::testapi
