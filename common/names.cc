#include "common/names.h"

#include <fmt/format.h>

#include <algorithm>

namespace geo {

bool isDnsLabel(std::string_view s) {
  if (s.empty() || s.size() > 63) return false;
  const auto alnum = [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); };
  if (!alnum(s.front()) || !alnum(s.back())) return false;
  return std::all_of(s.begin(), s.end(), [&](char c) { return alnum(c) || c == '-'; });
}

std::string dnsLabelAllowed(std::string_view what) {
  return fmt::format("{}: {}", what, kDnsLabelRule);
}

bool isDnsSubdomain(std::string_view s) {
  if (s.empty() || s.size() > 253) return false;
  size_t start = 0;
  while (true) {
    const size_t dot = s.find('.', start);
    if (!isDnsLabel(s.substr(start, dot == std::string_view::npos ? dot : dot - start))) {
      return false;
    }
    if (dot == std::string_view::npos) return true;
    start = dot + 1;
  }
}

}  // namespace geo
