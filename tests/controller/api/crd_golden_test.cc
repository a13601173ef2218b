// The worker.yaml sections of both CRD copies (manifests/crd and the chart's
// files/) against what the worker.yaml schema renders
// (controller/api/crd.h). After an intended change to the schema (a new key,
// a range, a doc line), regenerate them, read the diff (git diff manifests
// charts) and commit it with the change:
//
//   GEO_UPDATE_GOLDEN=1 ctest --test-dir build -R Golden

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "controller/api/crd.h"
#include "tests/support/golden.h"

namespace geo::api {
namespace {

using golden::kRegenerate;
using golden::readFile;
using golden::updating;

// A CRD file cut around its generated part: the text up to and including
// the begin marker's line, the generated lines, and the rest from the end
// marker's line on; `indent` is the markers'.
struct Parts {
  std::string before;
  std::string generated;
  std::string after;
  int indent = 0;
};

std::optional<Parts> split(const std::string& text) {
  const size_t begin = text.find(kCrdWorkerSectionsBegin);
  const size_t end = text.find(kCrdWorkerSectionsEnd);
  if (begin == std::string::npos || end == std::string::npos || end < begin) return std::nullopt;
  const size_t beginLine = text.rfind('\n', begin) + 1;
  const size_t afterBegin = text.find('\n', begin) + 1;
  const size_t endLine = text.rfind('\n', end) + 1;
  Parts parts;
  parts.before = text.substr(0, afterBegin);
  parts.generated = text.substr(afterBegin, endLine - afterBegin);
  parts.after = text.substr(endLine);
  parts.indent = static_cast<int>(begin - beginLine);
  return parts;
}

TEST(CrdGolden, WorkerSectionsAreRenderedFromTheSchema) {
  for (const std::string path : {GEO_CRD_FILE, GEO_CHART_CRD_FILE}) {
    SCOPED_TRACE(path);
    const std::string text = readFile(path);
    const auto parts = split(text);
    ASSERT_TRUE(parts.has_value()) << path << " lacks the lines '" << kCrdWorkerSectionsBegin
                                   << "' and '" << kCrdWorkerSectionsEnd << "' (in this order)";
    const std::string rendered = renderCrdWorkerSections(parts->indent);
    if (updating()) {
      std::ofstream(path, std::ios::binary) << parts->before << rendered << parts->after;
      continue;
    }
    EXPECT_EQ(parts->generated, rendered)
        << path << "'s worker.yaml sections are not the schema's; if the schema's change is "
        << "intended, run " << kRegenerate << " and review git diff";
  }
}

// The rendering itself: bounds, enums, auto keys and defaults as the API
// server reads them.
TEST(CrdGolden, RendersTypesBoundsAndDefaults) {
  const std::string out = renderCrdWorkerSections(0);
  auto has = [&](const std::string& lines) {
    EXPECT_NE(out.find(lines), std::string::npos) << "missing:\n" << lines << "\nin:\n" << out;
  };
  has("    lr:\n      type: number\n");
  has("      minimum: 0\n      exclusiveMinimum: true\n      default: 0.05\n");
  has("    bits:\n      type: integer\n      description: QSGD bits per value (sign + level).\n"
      "      enum:\n      - 2\n      - 4\n      - 8\n      default: 4\n");
  has("    period:\n      x-kubernetes-int-or-string: true\n");
  has("      default: auto\n      x-kubernetes-validations:\n"
      "      - rule: 'type(self) == int ? self >= 1 : self == ''auto'''\n"
      "        message: an integer >= 1, or auto\n");
  has("      - 'off'\n");  // a YAML 1.1 boolean, quoted
  has("    algorithm:\n");
  has("      default: dts\n");  // the TrainingJob's default, not worker.yaml's
  EXPECT_EQ(out.find("shardIndex"), std::string::npos);  // the controller's
  // model.builtin: '' allowed (with a torchscript), and no default.
  has("      - gpt\n      - ''\n    torchscript:\n");
}

}  // namespace
}  // namespace geo::api
