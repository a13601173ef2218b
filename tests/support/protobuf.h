#pragma once
// Decoding of Kubernetes' protobuf request bodies for the kinds whose typed
// clients send them.
//
// client-go 1.33's typed clientset (kubectl create, helm's release storage)
// encodes built-in objects as application/vnd.kubernetes.protobuf: the
// "k8s\0" magic, then a runtime.Unknown envelope around the object's
// generated.proto message. The server decodes Namespace, ConfigMap, Secret,
// ServiceAccount and DeleteOptions (every field of their generated.proto,
// status aside);
// any other kind, or a field it does not know, answers 415 instead of being
// decoded differently. Answers are always JSON: those clients accept it.

#include <nlohmann/json.hpp>

#include <string_view>

namespace geo::testapi {

using Json = nlohmann::json;

// The object in a protobuf body, as the JSON the server stores. Throws
// ApiError 415 for kinds or fields it does not decode, 400 for bad bytes.
Json decodeKubernetesProtobuf(std::string_view body);

}  // namespace geo::testapi
