#pragma once
// YAML to JSON as Kubernetes reads manifests (sigs.k8s.io/yaml): quoted and
// block scalars stay strings, plain ones resolve by YAML 1.2's core schema
// (null, booleans, integers, floats), an integer too large for int64 stays a
// string. `geotrain plan --job` reads a TrainingJob with it, the test
// apiserver decodes YAML bodies with it, and tests load manifests with it.
// A pure function: nothing throws beyond what yaml-cpp's node access does.

#include <yaml-cpp/yaml.h>

#include <nlohmann/json.hpp>

namespace geo::api {

nlohmann::json yamlNodeToJson(const YAML::Node& node);

}  // namespace geo::api
