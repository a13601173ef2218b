#pragma once
// Kubernetes' name rules (RFC 1123), in one place for everything that names
// a region or an object: worker.yaml's transport.regions, geotrain local's
// --regions, and the TrainingJob's regions, member clusters and the objects
// it refers to. Region names become metrics labels, link keys and parts of
// Kubernetes object names, hence the strictest of the rules.

#include <string_view>

namespace geo {

// A lowercase DNS label: letters a-z, digits and '-', starting and ending
// with a letter or digit, 1 to 63 characters.
bool isDnsLabel(std::string_view s);

// An RFC 1123 subdomain: dot-separated DNS labels, at most 253 characters
// (Secret, ServiceAccount, PriorityClass and StorageClass names).
bool isDnsSubdomain(std::string_view s);

}  // namespace geo
