#pragma once
// YAML to JSON as Kubernetes reads manifests (sigs.k8s.io/yaml): quoted and
// block scalars stay strings, plain ones resolve by YAML 1.2's core schema
// (null, booleans, integers, floats), an integer too large for int64 stays a
// string. The test apiserver decodes YAML bodies with it; tests use it to
// load manifests the same way.

#include "controller/api/manifest_yaml.h"

namespace geo::testapi {

// The product's reader (controller/api/manifest_yaml.h), under the name the
// test apiserver and the tests use.
using api::yamlNodeToJson;

}  // namespace geo::testapi
