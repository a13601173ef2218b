#include "worker/local/worker_event.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
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

std::vector<std::string> texts(const Json& object, const char* key) {
  std::vector<std::string> out;
  const Json* v = member(object, key);
  if (v == nullptr || !v->is_array()) return out;
  for (const Json& item : *v) {
    if (item.is_string()) out.push_back(item.get<std::string>());
  }
  return out;
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
  e.stepEndedAt = number(j, "stepEndedAt");

  e.region = text(j, "region");
  e.localRank = integer(j, "localRank");
  e.worldSize = integer(j, "worldSize");
  e.model = text(j, "model");
  e.parameters = integer(j, "parameters");
  e.shardSamples = integer(j, "shardSamples");
  e.steps = integer(j, "steps");
  e.algorithm = text(j, "algorithm");
  e.resumedAt = integer(j, "resumedAt");

  e.step = integer(j, "step");
  e.fromStep = integer(j, "fromStep");
  e.loss = number(j, "loss");
  e.nonFinite = texts(j, "nonFinite");
  e.lr = number(j, "lr");
  e.samplesPerSecond = number(j, "samplesPerSecond");
  e.evalAccuracy = number(j, "evalAccuracy");
  e.evalLoss = number(j, "evalLoss");
  e.evalStep = integer(j, "evalStep");
  e.evalAgeSeconds = number(j, "evalAgeSeconds");
  e.testAccuracy = number(j, "testAccuracy");
  e.testLoss = number(j, "testLoss");
  if (const Json* sync = member(j, "sync")) {
    e.sync.delay = number(*sync, "delay");
    e.sync.lrScale = number(*sync, "lrScale");
    e.sync.appliedUpdates = integer(*sync, "appliedUpdates");
    e.sync.stalenessMean = number(*sync, "stalenessMean");
    e.sync.stalenessMax = number(*sync, "stalenessMax");
    e.sync.missing = integer(*sync, "missing");
    e.sync.waitSeconds = number(*sync, "waitSeconds");
    e.sync.peersDown = integer(*sync, "peersDown");
    e.sync.degradedSeconds = number(*sync, "degradedSeconds");
    e.sync.rejoins = integer(*sync, "rejoins");
    e.sync.stateTransferBytes = integer(*sync, "stateTransferBytes");
    e.sync.rounds = integer(*sync, "rounds");
    e.sync.codecSeconds = number(*sync, "codecSeconds");
    e.sync.peerRejoins = integer(*sync, "peerRejoins");
    e.sync.lateApplied = integer(*sync, "lateApplied");
    e.sync.lateDropped = integer(*sync, "lateDropped");
    e.sync.rejected = integer(*sync, "rejected");
  }
  e.stepSecondsMax = number(j, "stepSecondsMax");
  e.maxRssBytes = count(j, "maxRssBytes");
  e.modelHash = text(j, "modelHash");
  e.joinedAt = integer(j, "joinedAt");
  e.arrivedAfterEnd = flag(j, "arrivedAfterEnd");
  e.transferred = flag(j, "transferred");
  e.jobFinished = flag(j, "jobFinished");
  e.rejoin = flag(j, "rejoin");
  e.stateTransferSeconds = number(j, "stateTransferSeconds");
  if (const Json* bytes = member(j, "bytes")) {
    e.bytes.wanSent = count(*bytes, "wanSent");
    e.bytes.wanReceived = count(*bytes, "wanReceived");
    e.bytes.lanSent = count(*bytes, "lanSent");
    e.bytes.lanReceived = count(*bytes, "lanReceived");
    e.bytes.payload = count(*bytes, "payload");
  }
  if (const Json* t = member(j, "stepTime")) {
    e.stepTime.steps = integer(*t, "steps");
    e.stepTime.computeSeconds = number(*t, "computeSeconds");
    e.stepTime.syncSeconds = number(*t, "syncSeconds");
    e.stepTime.codecSeconds = number(*t, "codecSeconds");
    e.stepTime.encodeSeconds = number(*t, "encodeSeconds");
    e.stepTime.waitSeconds = number(*t, "waitSeconds");
  }
  e.message = text(j, "message");
  return e;
} catch (const std::exception& error) {  // allocation failure; nothing else throws above
  return invalidArgument(fmt::format("cannot read the line: {}", error.what()));
}

std::string_view eventName(EventKind kind) {
  switch (kind) {
    case EventKind::kStart: return "start";
    case EventKind::kJoined: return "joined";
    case EventKind::kProgress: return "progress";
    case EventKind::kDone: return "done";
    case EventKind::kError: return "error";
    case EventKind::kOther: break;
  }
  return "";
}

namespace {

// Insertion order is the order the lines are written in.
using OrderedJson = nlohmann::ordered_json;

// `value` rounded as printf's `spec` would print it ("{:.6g}"), so that the
// line carries no more digits than the document promises. nlohmann writes
// the shortest text that reads back as the same double: 0.137, not
// 0.13700000000000001.
double rounded(double value, std::string_view spec) {
  if (!std::isfinite(value)) return value;
  return std::strtod(fmt::format(fmt::runtime(spec), value).c_str(), nullptr);
}

template <typename T>
void put(OrderedJson& j, const char* key, const std::optional<T>& value) {
  if (value) j[key] = *value;
}

void put(OrderedJson& j, const char* key, const std::optional<double>& value,
         std::string_view spec) {
  if (value) j[key] = rounded(*value, spec);
}

void put(OrderedJson& j, const char* key, const std::string& value) {
  if (!value.empty()) j[key] = value;
}

// Values the worker counts in whole steps, read as doubles: written as
// integers, as they were counted.
void putWhole(OrderedJson& j, const char* key, const std::optional<double>& value) {
  if (value) j[key] = static_cast<int64_t>(std::llround(*value));
}

}  // namespace

std::string formatWorkerEvent(const WorkerEvent& e) {
  OrderedJson j = OrderedJson::object();
  j["event"] = e.name.empty() ? std::string(eventName(e.kind)) : e.name;
  put(j, "rank", e.rank);
  put(j, "time", e.time, "{:.3f}");
  // start
  put(j, "region", e.region);
  put(j, "localRank", e.localRank);
  put(j, "worldSize", e.worldSize);
  put(j, "model", e.model);
  put(j, "parameters", e.parameters);
  put(j, "shardSamples", e.shardSamples);
  put(j, "steps", e.steps);
  put(j, "algorithm", e.algorithm);
  put(j, "resumedAt", e.resumedAt);
  // joined, progress, done
  put(j, "step", e.step);
  put(j, "stepEndedAt", e.stepEndedAt, "{:.3f}");
  put(j, "fromStep", e.fromStep);
  put(j, "transferred", e.transferred);
  put(j, "jobFinished", e.jobFinished);
  put(j, "stateTransferSeconds", e.stateTransferSeconds, "{:.4g}");
  if (e.loss) {
    if (std::isfinite(*e.loss)) {
      j["loss"] = rounded(*e.loss, "{:.6g}");
    } else {
      j["loss"] = nullptr;
    }
  }
  std::vector<std::string> nonFinite = e.nonFinite;
  if (e.loss && !std::isfinite(*e.loss) &&
      std::find(nonFinite.begin(), nonFinite.end(), "loss") == nonFinite.end()) {
    nonFinite.insert(nonFinite.begin(), "loss");
  }
  if (!nonFinite.empty()) j["nonFinite"] = nonFinite;
  put(j, "lr", e.lr, "{:.6g}");
  put(j, "samplesPerSecond", e.samplesPerSecond, "{:.1f}");
  put(j, "evalAccuracy", e.evalAccuracy, "{:.6g}");
  put(j, "evalLoss", e.evalLoss, "{:.6g}");
  put(j, "evalStep", e.evalStep);
  put(j, "evalAgeSeconds", e.evalAgeSeconds, "{:.4g}");
  put(j, "stepSecondsMax", e.stepSecondsMax, "{:.4g}");
  put(j, "maxRssBytes", e.maxRssBytes);
  put(j, "modelHash", e.modelHash);
  put(j, "joinedAt", e.joinedAt);
  put(j, "testAccuracy", e.testAccuracy, "{:.6g}");
  put(j, "testLoss", e.testLoss, "{:.6g}");
  put(j, "arrivedAfterEnd", e.arrivedAfterEnd);
  put(j, "message", e.message);
  put(j, "rejoin", e.rejoin);

  OrderedJson sync = OrderedJson::object();
  const SyncStats& s = e.sync;
  putWhole(sync, "delay", s.delay);
  put(sync, "lrScale", s.lrScale, "{:.4g}");
  put(sync, "rounds", s.rounds);
  put(sync, "appliedUpdates", s.appliedUpdates);
  put(sync, "stalenessMean", s.stalenessMean, "{:.4g}");
  putWhole(sync, "stalenessMax", s.stalenessMax);
  put(sync, "missing", s.missing);
  put(sync, "waitSeconds", s.waitSeconds, "{:.4g}");
  put(sync, "codecSeconds", s.codecSeconds, "{:.4g}");
  put(sync, "peersDown", s.peersDown);
  put(sync, "degradedSeconds", s.degradedSeconds, "{:.4g}");
  put(sync, "rejoins", s.rejoins);
  put(sync, "peerRejoins", s.peerRejoins);
  put(sync, "stateTransferBytes", s.stateTransferBytes);
  put(sync, "lateApplied", s.lateApplied);
  put(sync, "lateDropped", s.lateDropped);
  put(sync, "rejected", s.rejected);
  if (!sync.empty()) j["sync"] = std::move(sync);

  OrderedJson bytes = OrderedJson::object();
  put(bytes, "wanSent", e.bytes.wanSent);
  put(bytes, "wanReceived", e.bytes.wanReceived);
  put(bytes, "lanSent", e.bytes.lanSent);
  put(bytes, "lanReceived", e.bytes.lanReceived);
  put(bytes, "payload", e.bytes.payload);
  if (!bytes.empty()) j["bytes"] = std::move(bytes);

  OrderedJson stepTime = OrderedJson::object();
  put(stepTime, "steps", e.stepTime.steps);
  put(stepTime, "computeSeconds", e.stepTime.computeSeconds, "{:.4g}");
  put(stepTime, "syncSeconds", e.stepTime.syncSeconds, "{:.4g}");
  put(stepTime, "codecSeconds", e.stepTime.codecSeconds, "{:.4g}");
  put(stepTime, "encodeSeconds", e.stepTime.encodeSeconds, "{:.4g}");
  put(stepTime, "waitSeconds", e.stepTime.waitSeconds, "{:.4g}");
  if (!stepTime.empty()) j["stepTime"] = std::move(stepTime);
  // Invalid UTF-8 (a model description, a message quoting a file name) is
  // replaced rather than thrown on: a progress line is never lost.
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace geo::local
