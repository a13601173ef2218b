#pragma once
// The API's timestamp formats (always written in UTC).

#include <chrono>
#include <optional>
#include <string>
#include <string_view>

namespace geo::kube {

// metav1.Time: RFC 3339 with seconds, "2024-05-01T10:00:00Z".
std::string formatTime(std::chrono::system_clock::time_point time);
// metav1.MicroTime: "2024-05-01T10:00:00.123456Z" (Leases, events.k8s.io).
std::string formatMicroTime(std::chrono::system_clock::time_point time);
// Either format, with "Z" or a numeric offset; nullopt when malformed.
std::optional<std::chrono::system_clock::time_point> parseTime(std::string_view text);

}  // namespace geo::kube
