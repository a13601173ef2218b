#pragma once
// The part of the TrainingJob CRD's OpenAPI schema that is worker.yaml's:
// spec.model, dataset, training, sync, checkpoint, output and log, rendered
// from the worker.yaml schema (common/worker_schema.h), so that the CRD
// states each key's type, range, allowed values and default exactly as the
// worker and the controller check them.
//
// Both CRD copies (manifests/crd/trainingjobs.geotrain.io.yaml and the
// chart's charts/geotrain/files/) hold this text between the two marker
// lines below; the test CrdGolden.WorkerSectionsAreRenderedFromTheSchema
// fails when they differ, and rewrites them with
//   GEO_UPDATE_GOLDEN=1 ctest --test-dir build -R Golden

#include <string>
#include <string_view>

namespace geo::api {

// The comment lines around the rendered sections in a CRD file (each on a
// line of its own, indented as the sections are).
inline constexpr std::string_view kCrdWorkerSectionsBegin =
    "# BEGIN worker.yaml sections, rendered from the worker.yaml schema (controller/api/crd.h)";
inline constexpr std::string_view kCrdWorkerSectionsEnd = "# END worker.yaml sections";

// The sections as block YAML, each line indented by `indent` spaces and
// ending in a newline: for every key of a section the TrainingJob has (not
// dataset.shardIndex/shardCount, the controller's), its type (integer or
// `auto`: x-kubernetes-int-or-string with a CEL rule), description (the
// key's doc line), enum or bounds, and default (TrainingJobSpec's, so
// sync.algorithm is dts; none for model.builtin, which the API server would
// otherwise set beside a torchscript); then the relations the CRD can state
// (model: exactly one of builtin and torchscript). Deterministic: the same
// schema renders the same bytes.
std::string renderCrdWorkerSections(int indent);

}  // namespace geo::api
