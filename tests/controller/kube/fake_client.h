#pragma once
// A KubeClient whose two virtuals are scripted by the test: it records every
// request and answers from the test's functions. It exercises what the verbs,
// the watch decoder, the reflector, the elector and the recorder do with
// answers; it is not an API server (the integration tests use tests/support).

#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "controller/kube/client.h"

namespace geo::kube::testing {

// What a scripted stream sends: chunks, then how it ends.
struct ScriptedStream {
  std::vector<std::string> chunks;
  ApiResult<std::monostate> end = std::monostate{};
  // Block after the chunks until cancelled (a watch with nothing to say).
  bool holdOpen = false;
};

class FakeClient : public KubeClient {
 public:
  // Answers call(); the default answers 404 NotFound.
  std::function<ApiResult<nlohmann::json>(const ApiRequest&)> onCall;
  // Answers stream(); the default ends at once with a 410.
  std::function<ScriptedStream(const ApiRequest&)> onStream;

  ApiResult<nlohmann::json> call(const ApiRequest& request, const CancelToken*) override {
    record(request);
    if (onCall) return onCall(request);
    return decodeApiError(404, R"({"kind":"Status","reason":"NotFound","code":404})");
  }

  ApiResult<std::monostate> stream(const ApiRequest& request,
                                   const std::function<void(std::string_view)>& onChunk,
                                   std::chrono::milliseconds, const CancelToken& cancel) override {
    record(request);
    ScriptedStream script;
    if (onStream) {
      script = onStream(request);
    } else {
      script.end = decodeApiError(410, R"({"kind":"Status","reason":"Expired","code":410})");
    }
    for (const std::string& chunk : script.chunks) {
      if (cancel.cancelled()) return localError(StatusCode::kCancelled, "cancelled");
      onChunk(chunk);
    }
    if (script.holdOpen) {
      while (cancel.sleepFor(std::chrono::milliseconds(5))) {
      }
    }
    if (cancel.cancelled()) return localError(StatusCode::kCancelled, "cancelled");
    return script.end;
  }

  const std::string& defaultNamespace() const override { return namespace_; }
  const ClientOptions& options() const override { return options_; }

  std::vector<ApiRequest> requests() const {
    std::lock_guard lock(mu_);
    return requests_;
  }
  ApiRequest lastRequest() const {
    std::lock_guard lock(mu_);
    return requests_.empty() ? ApiRequest{} : requests_.back();
  }

 private:
  void record(const ApiRequest& request) {
    std::lock_guard lock(mu_);
    requests_.push_back(request);
  }

  std::string namespace_ = "default";
  ClientOptions options_;
  mutable std::mutex mu_;
  std::vector<ApiRequest> requests_;
};

// The value of the query parameter `key`, or "<absent>".
inline std::string queryValue(const ApiRequest& request, const std::string& key) {
  for (const auto& [k, v] : request.query) {
    if (k == key) return v;
  }
  return "<absent>";
}

}  // namespace geo::kube::testing
