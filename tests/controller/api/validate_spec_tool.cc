// Reads TrainingJob objects as JSON, one per line on stdin, and writes one
// JSON line per object: {"errors": [...], "spec": <specToJson> or null}.
// crd_schema_test.py runs the same samples through the CRD's OpenAPI schema
// and through this, to show that the two validations agree.
#include <iostream>
#include <string>

#include "controller/api/training_job.h"

int main() {
  std::string line;
  while (std::getline(std::cin, line)) {
    if (line.empty()) continue;
    nlohmann::json result;
    const auto object = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (object.is_discarded()) {
      result = {{"errors", {"not JSON"}}, {"spec", nullptr}};
    } else {
      const geo::api::ParsedSpec parsed = geo::api::parseSpec(object);
      nlohmann::json errors = nlohmann::json::array();
      for (const auto& e : parsed.errors) errors.push_back(e.toString());
      result = {{"errors", errors},
                {"spec", parsed.errors.empty() ? geo::api::specToJson(parsed.spec) : nullptr}};
    }
    std::cout << result.dump() << "\n" << std::flush;
  }
  return 0;
}
