#include "worker/transport/link.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <initializer_list>
#include <optional>
#include <string>

namespace geo::transport {

namespace {

struct Unit {
  std::string_view name;
  double factor;
};

// "123.5mbit" with units {bit: 1, mbit: 1e6, ...} -> 123.5e6; nullopt when
// the number or the unit is not valid.
std::optional<double> parseQuantity(std::string_view text, std::initializer_list<Unit> units) {
  double value = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec != std::errc() || value < 0) return std::nullopt;
  const std::string_view unit(ptr, static_cast<size_t>(end - ptr));
  for (const Unit& u : units) {
    if (u.name == unit) return value * u.factor;
  }
  return std::nullopt;
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
    if (key == "delay") {
      const auto us = parseQuantity(value, {{"us", 1}, {"ms", 1e3}, {"s", 1e6}});
      if (!us) return badValue(key, value, "a number with unit us, ms or s (e.g. 50ms)");
      p.oneWayDelay = std::chrono::microseconds(static_cast<int64_t>(*us));
    } else if (key == "rate") {
      const auto bits =
          parseQuantity(value, {{"bit", 1}, {"kbit", 1e3}, {"mbit", 1e6}, {"gbit", 1e9}});
      if (!bits) {
        return badValue(key, value,
                        "a number with unit bit, kbit, mbit or gbit per second (e.g. 20mbit)");
      }
      p.bytesPerSecond = *bits / 8;
    } else if (key == "burst") {
      const auto bytes = parseQuantity(value, {{"b", 1}, {"kb", 1024}, {"mb", 1024 * 1024}});
      if (!bytes) return badValue(key, value, "a number with unit b, kb or mb (e.g. 64kb)");
      p.burstBytes = static_cast<uint64_t>(*bytes);
    } else {
      return invalidArgument(
          fmt::format("link profile: unknown key '{}' (allowed: delay, rate, burst)", key));
    }
  }
  return p;
}

SteadyClock::time_point LinkShaper::schedule(uint64_t bytes, SteadyClock::time_point now) {
  if (!profile_.shaped()) return now;
  SteadyClock::time_point departed = now;
  if (profile_.bytesPerSecond > 0) {
    const auto perByte = std::chrono::duration<double>(1.0 / profile_.bytesPerSecond);
    const auto burstCredit = std::chrono::duration_cast<SteadyClock::duration>(
        perByte * static_cast<double>(profile_.burstBytes));
    // An idle link banks at most `burst` bytes of credit.
    nextFree_ = std::max(nextFree_, now - burstCredit);
    nextFree_ +=
        std::chrono::duration_cast<SteadyClock::duration>(perByte * static_cast<double>(bytes));
    departed = std::max(nextFree_, now);
  }
  return departed + profile_.oneWayDelay;
}

}  // namespace geo::transport
