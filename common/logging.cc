#include "common/logging.h"

#include <mutex>
#include <string>

#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/stdout_color_sinks.h>

namespace geo {

namespace {
std::once_flag gInitOnce;

// %* in a pattern: the message as the contents of a JSON string.
class JsonEscapedMessage : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&,
              spdlog::memory_buf_t& dest) override {
    static constexpr char kHex[] = "0123456789abcdef";
    for (const char c : msg.payload) {
      switch (c) {
        case '"': dest.append(std::string_view("\\\"")); break;
        case '\\': dest.append(std::string_view("\\\\")); break;
        case '\n': dest.append(std::string_view("\\n")); break;
        case '\r': dest.append(std::string_view("\\r")); break;
        case '\t': dest.append(std::string_view("\\t")); break;
        default:
          if (static_cast<unsigned char>(c) < 0x20) {
            const char esc[] = {'\\', 'u', '0', '0', kHex[(c >> 4) & 0xf], kHex[c & 0xf]};
            dest.append(esc, esc + sizeof esc);
          } else {
            dest.push_back(c);
          }
      }
    }
  }
  std::unique_ptr<custom_flag_formatter> clone() const override {
    return std::make_unique<JsonEscapedMessage>();
  }
};

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

Status setLogFormat(std::string_view format) {
  if (format == "text") {
    logger()->set_formatter(
        std::make_unique<spdlog::pattern_formatter>("%Y-%m-%dT%H:%M:%S.%e %^%L%$ %v"));
    return {};
  }
  if (format == "json") {
    auto f = std::make_unique<spdlog::pattern_formatter>(spdlog::pattern_time_type::utc);
    f->add_flag<JsonEscapedMessage>('*').set_pattern(
        R"({"time":"%Y-%m-%dT%H:%M:%S.%eZ","level":"%l","msg":"%*"})");
    logger()->set_formatter(std::move(f));
    return {};
  }
  return invalidArgument(
      fmt::format("log format '{}' is not valid: allowed values are text, json", format));
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
