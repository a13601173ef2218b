#include "common/logging.h"

#include <mutex>
#include <string>

#include <spdlog/sinks/stdout_color_sinks.h>

namespace geo {

namespace {
std::once_flag gInitOnce;

void createLogger() {
  auto log = spdlog::stderr_color_mt("geo");
  log->set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%L%$ %v");
  spdlog::set_default_logger(log);
}
}  // namespace

std::shared_ptr<spdlog::logger> logger() {
  std::call_once(gInitOnce, createLogger);
  return spdlog::get("geo");
}

Status initLogging(std::string_view level) {
  auto parsed = spdlog::level::from_str(std::string(level));
  // from_str maps unknown names to "off"; only accept "off" when asked for it.
  if (parsed == spdlog::level::off && level != "off") {
    return invalidArgument(fmt::format(
        "log level '{}' is not valid: allowed values are trace, debug, info, warn, error, "
        "critical, off",
        level));
  }
  logger()->set_level(parsed);
  return {};
}

}  // namespace geo
