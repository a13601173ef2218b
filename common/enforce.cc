#include "common/enforce.h"

namespace geo::detail {

void throwEnforce(const char* file, int line, std::string_view condition,
                  std::string_view message) {
  // __FILE__ is relative to the repository root (-fmacro-prefix-map in the
  // top-level CMakeLists.txt), so messages read "kernels/qsgd_cpu.cc:42".
  throw Error(fmt::format("{}:{}: check `{}` failed: {}", file, line, condition, message));
}

}  // namespace geo::detail
