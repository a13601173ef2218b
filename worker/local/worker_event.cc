#include "worker/local/worker_event.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>

#include <nlohmann/json.hpp>

namespace geo::local {

namespace {

using Json = nlohmann::json;

const Json* member(const Json& object, const char* key) {
  if (!object.is_object()) return nullptr;
  const auto it = object.find(key);
  return it == object.end() ? nullptr : &*it;
}

std::optional<double> number(const Json& object, const char* key) {
  const Json* v = member(object, key);
  if (v == nullptr || !v->is_number()) return std::nullopt;
  const double d = v->get<double>();
  if (!std::isfinite(d)) return std::nullopt;
  return d;
}

std::optional<int64_t> integer(const Json& object, const char* key) {
  const Json* v = member(object, key);
  if (v == nullptr || !v->is_number()) return std::nullopt;
  if (v->is_number_integer()) return v->get<int64_t>();
  const double d = v->get<double>();  // 4.0 is accepted as 4
  if (!std::isfinite(d) || d != std::floor(d) || std::abs(d) > 9.0e15) return std::nullopt;
  return static_cast<int64_t>(d);
}

std::optional<uint64_t> count(const Json& object, const char* key) {
  const Json* v = member(object, key);
  if (v == nullptr || !v->is_number()) return std::nullopt;
  if (v->is_number_unsigned()) return v->get<uint64_t>();
  if (v->is_number_integer()) {
    const int64_t i = v->get<int64_t>();
    if (i < 0) return std::nullopt;
    return static_cast<uint64_t>(i);
  }
  const double d = v->get<double>();
  if (!std::isfinite(d) || d < 0 || d > 1.8e19) return std::nullopt;
  return static_cast<uint64_t>(d);
}

std::optional<bool> flag(const Json& object, const char* key) {
  const Json* v = member(object, key);
  if (v == nullptr || !v->is_boolean()) return std::nullopt;
  return v->get<bool>();
}

std::string text(const Json& object, const char* key) {
  const Json* v = member(object, key);
  if (v == nullptr || !v->is_string()) return {};
  return v->get<std::string>();
}

EventKind kindOf(std::string_view name) {
  if (name == "start") return EventKind::kStart;
  if (name == "joined") return EventKind::kJoined;
  if (name == "progress") return EventKind::kProgress;
  if (name == "done") return EventKind::kDone;
  if (name == "error") return EventKind::kError;
  return EventKind::kOther;
}

}  // namespace

StatusOr<WorkerEvent> parseWorkerEvent(std::string_view line) try {
  Json j = Json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return invalidArgument("not a JSON line");
  if (!j.is_object()) return invalidArgument("not a JSON object");
  const Json* event = member(j, "event");
  if (event == nullptr || !event->is_string()) {
    return invalidArgument("a JSON object without a string \"event\"");
  }
  WorkerEvent e;
  e.name = event->get<std::string>();
  e.kind = kindOf(e.name);
  e.rank = integer(j, "rank");
  e.time = number(j, "time");

  e.region = text(j, "region");
  e.localRank = integer(j, "localRank");
  e.worldSize = integer(j, "worldSize");
  e.model = text(j, "model");
  e.parameters = integer(j, "parameters");
  e.shardSamples = integer(j, "shardSamples");
  e.steps = integer(j, "steps");
  e.algorithm = text(j, "algorithm");

  e.step = integer(j, "step");
  e.loss = number(j, "loss");
  e.lr = number(j, "lr");
  e.samplesPerSecond = number(j, "samplesPerSecond");
  e.evalAccuracy = number(j, "evalAccuracy");
  e.evalStep = integer(j, "evalStep");
  e.evalAgeSeconds = number(j, "evalAgeSeconds");
  e.testAccuracy = number(j, "testAccuracy");
  if (const Json* sync = member(j, "sync")) {
    e.sync.delay = number(*sync, "delay");
    e.sync.appliedUpdates = integer(*sync, "appliedUpdates");
    e.sync.stalenessMean = number(*sync, "stalenessMean");
    e.sync.stalenessMax = number(*sync, "stalenessMax");
    e.sync.missing = integer(*sync, "missing");
    e.sync.waitSeconds = number(*sync, "waitSeconds");
    e.sync.peersDown = integer(*sync, "peersDown");
    e.sync.degradedSeconds = number(*sync, "degradedSeconds");
    e.sync.rejoins = integer(*sync, "rejoins");
    e.sync.stateTransferBytes = integer(*sync, "stateTransferBytes");
  }
  e.stepSecondsMax = number(j, "stepSecondsMax");
  e.modelHash = text(j, "modelHash");
  e.transferred = flag(j, "transferred");
  e.jobFinished = flag(j, "jobFinished");
  e.stateTransferSeconds = number(j, "stateTransferSeconds");
  if (const Json* bytes = member(j, "bytes")) {
    e.bytes.wanSent = count(*bytes, "wanSent");
    e.bytes.wanReceived = count(*bytes, "wanReceived");
    e.bytes.lanSent = count(*bytes, "lanSent");
    e.bytes.lanReceived = count(*bytes, "lanReceived");
    e.bytes.payload = count(*bytes, "payload");
  }
  e.message = text(j, "message");
  return e;
} catch (const std::exception& error) {  // allocation failure; nothing else throws above
  return invalidArgument(fmt::format("cannot read the line: {}", error.what()));
}

}  // namespace geo::local
