#include "controller/kube/kube_time.h"

#include <charconv>

#include <fmt/chrono.h>
#include <fmt/format.h>

namespace geo::kube {
namespace {

using std::chrono::system_clock;

bool readInt(std::string_view& text, size_t digits, int& out) {
  if (text.size() < digits) return false;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + digits, out);
  if (ec != std::errc() || end != text.data() + digits) return false;
  text.remove_prefix(digits);
  return true;
}

bool expect(std::string_view& text, char c) {
  if (text.empty() || text.front() != c) return false;
  text.remove_prefix(1);
  return true;
}

}  // namespace

std::string formatTime(system_clock::time_point time) {
  return fmt::format("{:%Y-%m-%dT%H:%M:%S}Z", std::chrono::floor<std::chrono::seconds>(time));
}

std::string formatMicroTime(system_clock::time_point time) {
  const auto seconds = std::chrono::floor<std::chrono::seconds>(time);
  const auto micros = std::chrono::duration_cast<std::chrono::microseconds>(time - seconds);
  return fmt::format("{:%Y-%m-%dT%H:%M:%S}.{:06d}Z", seconds, micros.count());
}

std::optional<system_clock::time_point> parseTime(std::string_view text) {
  int year = 0, month = 0, day = 0, hour = 0, minute = 0, second = 0;
  if (!readInt(text, 4, year) || !expect(text, '-') || !readInt(text, 2, month) ||
      !expect(text, '-') || !readInt(text, 2, day) || !expect(text, 'T') ||
      !readInt(text, 2, hour) || !expect(text, ':') || !readInt(text, 2, minute) ||
      !expect(text, ':') || !readInt(text, 2, second)) {
    return std::nullopt;
  }
  std::chrono::microseconds fraction{0};
  if (!text.empty() && text.front() == '.') {
    text.remove_prefix(1);
    int64_t scale = 100000;
    size_t digits = 0;
    while (!text.empty() && text.front() >= '0' && text.front() <= '9') {
      fraction += std::chrono::microseconds((text.front() - '0') * scale);
      scale /= 10;
      text.remove_prefix(1);
      ++digits;
    }
    if (digits == 0) return std::nullopt;
  }
  std::chrono::minutes offset{0};
  if (expect(text, 'Z') || expect(text, 'z')) {
    // UTC
  } else if (!text.empty() && (text.front() == '+' || text.front() == '-')) {
    const int sign = text.front() == '-' ? -1 : 1;
    text.remove_prefix(1);
    int hours = 0, minutes = 0;
    if (!readInt(text, 2, hours) || !expect(text, ':') || !readInt(text, 2, minutes)) {
      return std::nullopt;
    }
    offset = std::chrono::minutes(sign * (hours * 60 + minutes));
  } else {
    return std::nullopt;
  }
  if (!text.empty()) return std::nullopt;
  const std::chrono::year_month_day date{std::chrono::year(year),
                                         std::chrono::month(static_cast<unsigned>(month)),
                                         std::chrono::day(static_cast<unsigned>(day))};
  if (!date.ok() || hour > 23 || minute > 59 || second > 60) return std::nullopt;
  return std::chrono::sys_days(date) + std::chrono::hours(hour) + std::chrono::minutes(minute) +
         std::chrono::seconds(second) + fraction - offset;
}

}  // namespace geo::kube
