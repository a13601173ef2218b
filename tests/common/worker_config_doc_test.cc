// docs/worker-config.md's key tables against what the worker.yaml schema
// renders (common/worker_config_doc.h). After an intended change to the
// schema (a new key, a range, a doc line), regenerate them, read the diff
// (git diff docs) and commit it with the change:
//
//   GEO_UPDATE_GOLDEN=1 ctest --test-dir build -R Golden

#include "common/worker_config_doc.h"

#include <gtest/gtest.h>

#include <cctype>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "common/worker_schema.h"
#include "tests/support/golden.h"

namespace geo {
namespace {

using golden::kRegenerate;
using golden::readFile;
using golden::updating;

TEST(WorkerConfigDocGolden, TablesAreRenderedFromTheSchema) {
  const std::string page = readFile(GEO_WORKER_CONFIG_DOC);
  ASSERT_FALSE(page.empty()) << "cannot read " << GEO_WORKER_CONFIG_DOC;
  auto rendered = renderWorkerConfigDoc(page);
  ASSERT_TRUE(rendered.ok()) << GEO_WORKER_CONFIG_DOC << ": " << rendered.status().message();
  if (updating()) {
    std::ofstream(GEO_WORKER_CONFIG_DOC, std::ios::binary) << *rendered;
    return;
  }
  if (page == *rendered) return;
  // The first line that differs, rather than two copies of the whole page.
  std::istringstream have(page);
  std::istringstream want(*rendered);
  std::string haveLine;
  std::string wantLine;
  int line = 0;
  while (true) {
    ++line;
    const bool more = static_cast<bool>(std::getline(have, haveLine));
    const bool wanted = static_cast<bool>(std::getline(want, wantLine));
    if (!more && !wanted) break;
    if (more != wanted || haveLine != wantLine) break;
  }
  ADD_FAILURE() << GEO_WORKER_CONFIG_DOC << ":" << line
                << ": the key tables are not the schema's\n  the page: " << haveLine
                << "\n  rendered: " << wantLine << "\nif the schema's change is intended, run "
                << kRegenerate << " and review git diff";
}

// The row of `path` in its section's rendered table, split into its cells.
std::vector<std::string> renderedRow(const KeySpec& key) {
  const std::string table = renderWorkerConfigDocTable(key.section);
  const std::string start = "| `" + key.path + "` | ";
  const size_t row = table.find(start);
  if (row == std::string::npos) return {};
  std::string line = table.substr(row + 2, table.find('\n', row) - row - 2);
  std::vector<std::string> cells;
  // Cells end at " | " that is not escaped ("\|").
  size_t from = 0;
  while (true) {
    size_t end = line.find(" | ", from);
    while (end != std::string::npos && end > 0 && line[end - 1] == '\\') {
      end = line.find(" | ", end + 1);
    }
    if (end == std::string::npos) {
      cells.push_back(line.substr(from, line.size() - from - 2));  // the last " |"
      break;
    }
    cells.push_back(line.substr(from, end - from));
    from = end + 3;
  }
  return cells;
}

// toYaml writes `section:` lines at column 0 and `  key: value` lines under
// them; values of the defaults all fit on their line.
std::vector<std::pair<std::string, std::string>> defaultKeyValues() {
  std::vector<std::pair<std::string, std::string>> result;
  std::istringstream yaml(toYaml(WorkerConfig{}));
  std::string line;
  std::string section;
  while (std::getline(yaml, line)) {
    if (line.empty() || line[0] == '#') continue;
    const size_t colon = line.find(": ");
    if (line[0] != ' ') {
      section = line.substr(0, line.find(':'));
    } else if (line.rfind("  ", 0) == 0 && colon != std::string::npos) {
      result.emplace_back(section + "." + line.substr(2, colon - 2), line.substr(colon + 2));
    } else {
      ADD_FAILURE() << "unexpected line in toYaml(defaults): " << line;
    }
  }
  return result;
}

// Every key has a row whose default is exactly what toYaml() writes.
TEST(WorkerConfigDoc, EveryKeyHasARowWithWhatToYamlWrites) {
  const auto keys = defaultKeyValues();
  EXPECT_EQ(keys.size(), 73u);  // the schema's key count: a new key updates it
  ASSERT_EQ(keys.size(), workerConfigSchema().size());
  for (const auto& [path, value] : keys) {
    auto key = lookupWorkerKey(path);
    ASSERT_TRUE(key.ok()) << path;
    const std::vector<std::string> cells = renderedRow(**key);
    ASSERT_EQ(cells.size(), 5u) << path;
    EXPECT_EQ(cells[2], "`" + value + "`") << "default of " << path;
    EXPECT_EQ(cells[4].find('\n'), std::string::npos) << path;
  }
}

// The allowed column names every value an enumerated key admits, and says
// what messages say for the others.
TEST(WorkerConfigDoc, AllowedColumnIsTheSchemas) {
  for (const KeySpec& key : workerConfigSchema()) {
    const std::vector<std::string> cells = renderedRow(key);
    ASSERT_EQ(cells.size(), 5u) << key.path;
    const std::string& allowed = cells[3];
    for (const std::string& choice : key.limits.choices) {
      EXPECT_NE(allowed.find("`" + choice + "`"), std::string::npos)
          << key.path << "'s row does not name " << choice;
    }
    if (key.limits.choices.empty() && key.type != KeyType::kBoolean) {
      EXPECT_NE(allowed.find(key.allowed.substr(0, key.allowed.find('<'))), std::string::npos)
          << key.path;
    }
  }
  EXPECT_EQ(renderedRow(**lookupWorkerKey("model.builtin"))[3],
            "`mlp`, `cnn`, `resnet18`, `gpt`, or empty");
  EXPECT_EQ(renderedRow(**lookupWorkerKey("sync.delay"))[1], "integer or `auto`");
  EXPECT_EQ(renderedRow(**lookupWorkerKey("dataset.shardIndex"))[1], "integer or null");
}

// Markdown: a page reference becomes a link, a | stays in its cell and a <
// outside code is not an HTML tag.
TEST(WorkerConfigDoc, CellsAreMarkdown) {
  const std::string transport = renderWorkerConfigDocTable("transport");
  EXPECT_NE(transport.find("[wan-emulation.md](wan-emulation.md)"), std::string::npos);
  EXPECT_EQ(transport.find("docs/wan-emulation.md"), std::string::npos);
  const std::string training = renderWorkerConfigDocTable("training");
  EXPECT_NE(training.find("[kubernetes.md](kubernetes.md#gpu-workers)"), std::string::npos);
  for (const std::string& section : workerConfigSections()) {
    const std::string table = renderWorkerConfigDocTable(section);
    std::istringstream lines(table);
    std::string line;
    while (std::getline(lines, line)) {
      // Outside code, a < that could open a tag is escaped.
      bool inCode = false;
      for (size_t i = 0; i + 1 < line.size(); ++i) {
        if (line[i] == '`') inCode = !inCode;
        if (!inCode && line[i] == '<' && std::isalpha(static_cast<unsigned char>(line[i + 1]))) {
          EXPECT_TRUE(i > 0 && line[i - 1] == '\\') << line;
        }
      }
    }
  }
}

// A page without a section's markers, or with them out of order, is
// refused naming them; the text around the markers is kept as it is.
TEST(WorkerConfigDoc, ReplacesOnlyBetweenTheMarkers) {
  std::string page = "# title\n";
  for (const std::string& section : workerConfigSections()) {
    page += "prose before " + section + "\n" + workerConfigDocBegin(section) + "\nstale\n" +
            workerConfigDocEnd(section) + "\nprose after\n";
  }
  auto rendered = renderWorkerConfigDoc(page);
  ASSERT_TRUE(rendered.ok()) << rendered.status().message();
  EXPECT_EQ(rendered->find("stale"), std::string::npos);
  EXPECT_NE(rendered->find("prose before log\n" + workerConfigDocBegin("log") + "\n| key |"),
            std::string::npos);
  EXPECT_NE(rendered->find("|\n" + workerConfigDocEnd("log") + "\nprose after\n"),
            std::string::npos);
  auto again = renderWorkerConfigDoc(*rendered);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *rendered);

  std::string missing = page;
  missing.erase(missing.find(workerConfigDocEnd("sync")), workerConfigDocEnd("sync").size());
  auto refused = renderWorkerConfigDoc(missing);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find(workerConfigDocEnd("sync")), std::string::npos);
}

}  // namespace
}  // namespace geo
