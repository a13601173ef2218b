#include "worker/transport/link.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <string>

namespace geo::transport {

namespace {

// Splits "123.5mbit" into 123.5 and "mbit".
bool splitNumber(std::string_view text, double* value, std::string_view* unit) {
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, *value);
  if (ec != std::errc() || *value < 0) return false;
  *unit = std::string_view(ptr, static_cast<size_t>(end - ptr));
  return true;
}

Status badValue(std::string_view key, std::string_view value, std::string_view allowed) {
  return invalidArgument(
      fmt::format("link profile: {}='{}' is not valid: expected {}", key, value, allowed));
}

}  // namespace

StatusOr<LinkProfile> parseLinkProfile(std::string_view spec) {
  LinkProfile p;
  while (!spec.empty()) {
    const size_t comma = spec.find(',');
    const std::string_view item = spec.substr(0, comma);
    spec = comma == std::string_view::npos ? std::string_view() : spec.substr(comma + 1);
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    if (eq == std::string_view::npos) {
      return invalidArgument(
          fmt::format("link profile: '{}' is not key=value (keys: delay, rate, burst)", item));
    }
    const std::string_view key = item.substr(0, eq);
    const std::string_view value = item.substr(eq + 1);
    double number = 0;
    std::string_view unit;
    if (key == "delay") {
      constexpr std::string_view kAllowed = "a number with unit us, ms or s (e.g. 50ms)";
      if (!splitNumber(value, &number, &unit)) return badValue(key, value, kAllowed);
      double us = 0;
      if (unit == "us") {
        us = number;
      } else if (unit == "ms") {
        us = number * 1e3;
      } else if (unit == "s") {
        us = number * 1e6;
      } else {
        return badValue(key, value, kAllowed);
      }
      p.oneWayDelay = std::chrono::microseconds(static_cast<int64_t>(us));
    } else if (key == "rate") {
      constexpr std::string_view kAllowed =
          "a number with unit bit, kbit, mbit or gbit per second (e.g. 20mbit)";
      if (!splitNumber(value, &number, &unit)) return badValue(key, value, kAllowed);
      double bits = 0;
      if (unit == "bit") {
        bits = number;
      } else if (unit == "kbit") {
        bits = number * 1e3;
      } else if (unit == "mbit") {
        bits = number * 1e6;
      } else if (unit == "gbit") {
        bits = number * 1e9;
      } else {
        return badValue(key, value, kAllowed);
      }
      p.bytesPerSecond = bits / 8;
    } else if (key == "burst") {
      constexpr std::string_view kAllowed = "a number with unit b, kb or mb (e.g. 64kb)";
      if (!splitNumber(value, &number, &unit)) return badValue(key, value, kAllowed);
      double bytes = 0;
      if (unit == "b") {
        bytes = number;
      } else if (unit == "kb") {
        bytes = number * 1024;
      } else if (unit == "mb") {
        bytes = number * 1024 * 1024;
      } else {
        return badValue(key, value, kAllowed);
      }
      p.burstBytes = static_cast<uint64_t>(bytes);
    } else {
      return invalidArgument(
          fmt::format("link profile: unknown key '{}' (allowed: delay, rate, burst)", key));
    }
  }
  return p;
}

Clock::time_point LinkShaper::schedule(uint64_t bytes, Clock::time_point now) {
  if (!profile_.shaped()) return now;
  Clock::time_point departed = now;
  if (profile_.bytesPerSecond > 0) {
    const auto perByte = std::chrono::duration<double>(1.0 / profile_.bytesPerSecond);
    const auto burstCredit = std::chrono::duration_cast<Clock::duration>(
        perByte * static_cast<double>(profile_.burstBytes));
    // An idle link banks at most `burst` bytes of credit.
    nextFree_ = std::max(nextFree_, now - burstCredit);
    nextFree_ += std::chrono::duration_cast<Clock::duration>(perByte * static_cast<double>(bytes));
    departed = std::max(nextFree_, now);
  }
  return departed + profile_.oneWayDelay;
}

}  // namespace geo::transport
