#pragma once
// Kubernetes' name rules (RFC 1123), in one place for everything that names
// a region or an object: worker.yaml's transport.regions, geotrain local's
// --regions, and the TrainingJob's regions, member clusters and the objects
// it refers to. Region names become metrics labels, link keys and parts of
// Kubernetes object names, hence the strictest of the rules.

#include <string>
#include <string_view>

namespace geo {

// A lowercase DNS label: letters a-z, digits and '-', starting and ending
// with a letter or digit, 1 to 63 characters.
bool isDnsLabel(std::string_view s);

// isDnsLabel()'s rule in the words messages use after "allowed: ".
inline constexpr std::string_view kDnsLabelRule =
    "lowercase letters, digits and '-', starting and ending with a letter or digit, at most 63 "
    "characters";

// "<what>: <kDnsLabelRule>", e.g. "a region name: lowercase letters, ...":
// what a name must be, for a message that says what kind of name it is.
std::string dnsLabelAllowed(std::string_view what);

// An RFC 1123 subdomain: dot-separated DNS labels, at most 253 characters
// (Secret, ServiceAccount, PriorityClass and StorageClass names).
bool isDnsSubdomain(std::string_view s);

}  // namespace geo
