#pragma once
// Invariant checks that throw.
//
// GEO_ENFORCE(cond, fmt, args...) throws geo::Error when `cond` is false. The
// message carries file:line, the failed condition and a caller-supplied
// explanation formatted with {fmt}. Use it for programming errors and for bad
// input at library boundaries (data plane). Code that must not throw (poll loops,
// reconcile()) returns geo::Status instead; see common/status.h.

#include <fmt/format.h>

#include <stdexcept>
#include <string>
#include <string_view>

namespace geo {

// The exception every GEO_ENFORCE throws. what() is the full message.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {
[[noreturn]] void throwEnforce(const char* file, int line, std::string_view condition,
                               std::string_view message);
}  // namespace detail

}  // namespace geo

#define GEO_ENFORCE(cond, ...)                                                            \
  do {                                                                                    \
    if (!(cond)) [[unlikely]] {                                                           \
      ::geo::detail::throwEnforce(__FILE__, __LINE__, #cond, ::fmt::format(__VA_ARGS__)); \
    }                                                                                     \
  } while (false)

// GEO_ENFORCE_EQ(a, b, fmt, args...): like GEO_ENFORCE(a == b) and also prints
// both values (they must be formattable by {fmt}).
#define GEO_ENFORCE_EQ(a, b, ...)                                                                \
  do {                                                                                           \
    const auto& geoEnforceA_ = (a);                                                              \
    const auto& geoEnforceB_ = (b);                                                              \
    if (!(geoEnforceA_ == geoEnforceB_)) [[unlikely]] {                                          \
      ::geo::detail::throwEnforce(__FILE__, __LINE__, #a " == " #b,                              \
                                  ::fmt::format("{} (got {} vs {})", ::fmt::format(__VA_ARGS__), \
                                                geoEnforceA_, geoEnforceB_));                    \
    }                                                                                            \
  } while (false)
