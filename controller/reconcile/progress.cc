#include "controller/reconcile/progress.h"

#include <fmt/format.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "controller/kube/cancel.h"

namespace geo::reconcile {

namespace {

// The value of a sample line "name{labels} value [timestamp]" or
// "name value [timestamp]" when its metric name is `name`.
std::optional<double> sampleValue(std::string_view line, std::string_view name) {
  if (line.substr(0, name.size()) != name) return std::nullopt;
  std::string_view rest = line.substr(name.size());
  if (rest.empty()) return std::nullopt;
  if (rest.front() == '{') {
    // Label values may hold '}' inside quotes: skip to the closing brace
    // outside a quoted string.
    bool quoted = false;
    size_t i = 1;
    for (; i < rest.size(); ++i) {
      if (quoted && rest[i] == '\\') {
        ++i;
      } else if (rest[i] == '"') {
        quoted = !quoted;
      } else if (!quoted && rest[i] == '}') {
        break;
      }
    }
    if (i >= rest.size()) return std::nullopt;
    rest = rest.substr(i + 1);
  }
  if (rest.empty() || (rest.front() != ' ' && rest.front() != '\t')) return std::nullopt;
  const std::string value(rest.substr(rest.find_first_not_of(" \t")));
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(value.c_str(), &end);
  if (end == value.c_str() || errno != 0 || !std::isfinite(v)) return std::nullopt;
  return v;
}

}  // namespace

api::Progress progressFromExposition(std::string_view text) {
  api::Progress p;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(start, end - start);
    start = end + 1;
    if (line.empty() || line.front() == '#') continue;
    if (auto v = sampleValue(line, "geotrain_train_step"); v && !p.step) {
      if (*v >= 1) p.step = static_cast<int64_t>(*v);
    } else if (auto l = sampleValue(line, "geotrain_train_loss"); l && !p.loss) {
      p.loss = *l;
    } else if (auto a = sampleValue(line, "geotrain_eval_accuracy"); a && !p.accuracy) {
      if (*a > 0 && *a <= 1) p.accuracy = *a;
    } else if (auto e = sampleValue(line, "geotrain_eval_loss"); e && !p.evalLoss) {
      if (*e > 0) p.evalLoss = *e;  // 0: not evaluated yet (the gauge starts there)
    }
  }
  if (!p.step) return {};  // nothing trained yet: a loss of 0 means nothing
  return p;
}

StatusOr<std::string> leaderPod(kube::KubeClient& client, const std::string& ns,
                                const std::string& job, const std::string& region) {
  kube::ListOptions options;
  options.labelSelector = fmt::format(
      "geotrain.io/job={},geotrain.io/region={},batch.kubernetes.io/job-completion-index=0", job,
      region);
  auto pods = client.list(kube::resources::kPods, ns, options);
  if (!pods.ok()) return pods.status("list the pods of rank 0");
  std::string best, bestCreated;
  for (const nlohmann::json& pod : pods->items) {
    const nlohmann::json status = pod.value("status", nlohmann::json::object());
    if (status.value("phase", "") != "Running" || status.value("podIP", "").empty()) continue;
    if (pod["metadata"].contains("deletionTimestamp")) continue;
    const std::string created = kube::metadataField(pod, "creationTimestamp");
    if (best.empty() || created > bestCreated) {
      best = kube::metadataField(pod, "name");
      bestCreated = created;
    }
  }
  return best;
}

StatusOr<api::Progress> scrapeProgress(kube::KubeClient& client, const std::string& ns,
                                       const std::string& pod, int port,
                                       std::chrono::milliseconds timeout) {
  constexpr size_t kMaxBody = 4 << 20;
  kube::ApiRequest request;
  request.method = "GET";
  request.path = fmt::format("/api/v1/namespaces/{}/pods/{}:{}/proxy/metrics",
                             kube::percentEncode(ns), kube::percentEncode(pod), port);
  std::string body;
  bool tooLarge = false;
  kube::CancelToken cancel;
  auto r = client.stream(
      request,
      [&](std::string_view chunk) {
        if (body.size() + chunk.size() > kMaxBody) {
          tooLarge = true;
          cancel.cancel();
          return;
        }
        body.append(chunk);
      },
      timeout, cancel);
  const std::string what =
      fmt::format("scrape pod {}/{} port {} through the API server", ns, pod, port);
  if (tooLarge) return unavailable(fmt::format("{}: more than {} bytes", what, kMaxBody));
  if (!r.ok()) return r.error().toStatus(what);
  return progressFromExposition(body);
}

}  // namespace geo::reconcile
