#pragma once
// The key tables of docs/worker-config.md, rendered from the worker.yaml
// schema (common/worker_schema.h), so that the reference states each key's
// type, default, allowed values and meaning exactly as the reader checks
// them.
//
// The page holds one table per section, each between the two marker lines
// below, with the hand-written prose around them; the test
// WorkerConfigDocGolden.TablesAreRenderedFromTheSchema fails when a table
// differs, and rewrites them with
//   GEO_UPDATE_GOLDEN=1 ctest --test-dir build -R Golden

#include <string>
#include <string_view>

#include "common/status.h"

namespace geo {

// The lines (without their newline) around `section`'s table.
std::string workerConfigDocBegin(std::string_view section);
std::string workerConfigDocEnd(std::string_view section);

// `section`'s table as Markdown, every line ending in a newline: a header
// and one row per key, `| key | type | default | allowed | meaning |`. The
// default is what toYaml() writes for a default configuration, the allowed
// values are the schema's (what error messages say), the meaning is the
// key's doc line, with docs/<page>.md turned into a link to that page.
std::string renderWorkerConfigDocTable(std::string_view section);

// `page` with the text between each section's markers replaced by
// renderWorkerConfigDocTable(); the rest is kept byte for byte. A section
// whose markers are missing, repeated or out of order is InvalidArgument
// naming them.
StatusOr<std::string> renderWorkerConfigDoc(std::string_view page);

}  // namespace geo
