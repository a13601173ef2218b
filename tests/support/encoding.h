#pragma once
// Small encodings the test apiserver needs: base64 (kubeconfig CA data,
// continue tokens), random names and UIDs.

#include <string>
#include <string_view>

namespace geo::testapi {

std::string base64Encode(std::string_view data);
// Empty on malformed input.
std::string base64Decode(std::string_view text);
// A random RFC 4122 version-4 UUID.
std::string randomUuid();
// `n` characters from the alphabet the real server uses for generateName.
std::string randomSuffix(size_t n);

}  // namespace geo::testapi
