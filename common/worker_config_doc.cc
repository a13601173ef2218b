#include "common/worker_config_doc.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cctype>
#include <vector>

#include "common/enforce.h"
#include "common/worker_schema.h"

namespace geo {
namespace {

bool isPageNameChar(char c) {
  return std::islower(static_cast<unsigned char>(c)) != 0 ||
         std::isdigit(static_cast<unsigned char>(c)) != 0 || c == '-';
}

// A page reference at `text[at]`: "docs/<page>.md", optionally with
// "#<anchor>"; its length, or 0 when there is none.
size_t pageReference(std::string_view text, size_t at) {
  constexpr std::string_view kPrefix = "docs/";
  if (text.substr(at, kPrefix.size()) != kPrefix) return 0;
  size_t end = at + kPrefix.size();
  while (end < text.size() && isPageNameChar(text[end])) ++end;
  if (end == at + kPrefix.size() || text.substr(end, 3) != ".md") return 0;
  end += 3;
  if (end + 1 < text.size() && text[end] == '#' && isPageNameChar(text[end + 1])) {
    ++end;
    while (end < text.size() && isPageNameChar(text[end])) ++end;
  }
  return end - at;
}

// Whether a `<` before `rest` would start an HTML tag ("<name>", "</",
// "<!"), which Markdown passes through and a browser hides; "0 <= m" is text.
bool opensTag(std::string_view rest) {
  return !rest.empty() && (std::isalpha(static_cast<unsigned char>(rest.front())) != 0 ||
                           rest.front() == '/' || rest.front() == '!' || rest.front() == '?');
}

// Schema text (a doc line, an allowed value) as the text of a Markdown table
// cell. Doc lines are plain text with `code` spans, so that the CRD can show
// them too; here a page reference becomes a link relative to docs/, a `|`
// would end the cell and a `<` outside code may open an HTML tag.
std::string cell(std::string_view text) {
  std::string out;
  bool inCode = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '`') inCode = !inCode;
    if (!inCode) {
      if (const size_t n = pageReference(text, i); n > 0) {
        const std::string_view target = text.substr(i + 5, n - 5);  // after "docs/"
        out += fmt::format("[{}]({})", target.substr(0, target.find('#')), target);
        i += n - 1;
        continue;
      }
      if (c == '<' && opensTag(text.substr(i + 1))) {
        out += "\\<";
        continue;
      }
    }
    if (c == '|') {
      out += "\\|";
      continue;
    }
    out += c;
  }
  GEO_ENFORCE(!inCode, "unbalanced ` in the worker.yaml schema's text: {}", text);
  return out;
}

std::string typeText(const KeySpec& key) {
  std::string type;
  switch (key.type) {
    case KeyType::kInteger:
    case KeyType::kUnsigned: type = "integer"; break;
    case KeyType::kNumber: type = "number"; break;
    case KeyType::kBoolean: type = "boolean"; break;
    case KeyType::kString: type = "string"; break;
    case KeyType::kStringList: type = "list of strings"; break;
    case KeyType::kStringMap: type = "map of strings"; break;
  }
  if (key.takesAuto) type += " or `auto`";
  if (key.takesNull) type += " or null";
  return type;
}

// Enumerations and booleans list their values as code; every other key says
// what its error messages say.
std::string allowedText(const KeySpec& key) {
  if (key.type == KeyType::kBoolean) return "`true`, `false`";
  if (key.limits.choices.empty()) return cell(key.allowed);
  std::vector<std::string> values;
  for (const std::string& choice : key.limits.choices) values.push_back("`" + choice + "`");
  std::string text = fmt::format("{}", fmt::join(values, ", "));
  if (key.limits.emptyAllowed) text += ", or empty";
  return text;
}

}  // namespace

std::string workerConfigDocBegin(std::string_view section) {
  return fmt::format(
      "<!-- BEGIN keys of {}, rendered from the worker.yaml schema "
      "(common/worker_config_doc.h) -->",
      section);
}

std::string workerConfigDocEnd(std::string_view section) {
  return fmt::format("<!-- END keys of {} -->", section);
}

std::string renderWorkerConfigDocTable(std::string_view section) {
  const WorkerConfig defaults;
  std::string out =
      "| key | type | default | allowed | meaning |\n"
      "|---|---|---|---|---|\n";
  bool any = false;
  for (const KeySpec& key : workerConfigSchema()) {
    if (key.section != section) continue;
    any = true;
    const std::string value = workerKeyYaml(defaults, key);
    GEO_ENFORCE(value.find('\n') == std::string::npos && value.find('`') == std::string::npos,
                "{}: the default {} does not fit a table cell", key.path, value);
    out += fmt::format("| `{}` | {} | `{}` | {} | {} |\n", key.path, typeText(key), cell(value),
                       allowedText(key), cell(key.doc));
  }
  GEO_ENFORCE(any, "{} is not a section of the worker.yaml schema", section);
  return out;
}

StatusOr<std::string> renderWorkerConfigDoc(std::string_view page) {
  std::string out;
  size_t done = 0;  // page[0, done) is in `out`
  for (const std::string& section : workerConfigSections()) {
    const std::string begin = workerConfigDocBegin(section) + "\n";
    const std::string end = workerConfigDocEnd(section) + "\n";
    const size_t b = page.find(begin, done);
    const size_t e = b == std::string_view::npos ? b : page.find(end, b + begin.size());
    if (b == std::string_view::npos || e == std::string_view::npos ||
        page.find(begin, b + 1) != std::string_view::npos ||
        page.find(end, e + 1) != std::string_view::npos || (b > 0 && page[b - 1] != '\n')) {
      return invalidArgument(fmt::format(
          "the page lacks the lines '{}' and '{}', once each, in this order and after the "
          "previous section's",
          workerConfigDocBegin(section), workerConfigDocEnd(section)));
    }
    out.append(page.substr(done, b + begin.size() - done));
    out += renderWorkerConfigDocTable(section);
    done = e;
  }
  out.append(page.substr(done));
  return out;
}

}  // namespace geo
