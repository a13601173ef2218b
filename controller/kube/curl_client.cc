// The libcurl implementation of KubeClient (see client.h for the contract).
//
// Every request runs on a (multi, easy) handle pair taken from a pool: the
// multi handle owns the connection cache, so a reused pair reuses its
// kept-alive connection, and curl_multi_poll lets cancel() wake a blocked
// stream at once through curl_multi_wakeup. A pair serves one request at a
// time; the pool grows on demand and keeps at most maxIdleHandles idle pairs.
// HTTP/1.1 is used throughout (one stream per connection, like the watch
// semantics the API server documents).

#include <curl/curl.h>

#include <algorithm>
#include <cctype>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "common/logging.h"
#include "controller/kube/client.h"

namespace geo::kube {
namespace {

using nlohmann::json;

void initCurlOnce() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

// What one attempt collects from libcurl's callbacks.
struct Exchange {
  CURL* easy = nullptr;
  const std::function<void(std::string_view)>* onChunk = nullptr;  // null: buffer everything
  std::string body;        // the buffered body (or a failed stream's Status)
  std::string retryAfter;  // the Retry-After header of the final answer
  // What onChunk threw: libcurl is C, so it is carried past it and rethrown.
  std::exception_ptr thrown;
  // The exec plugin's credentials this attempt sent (to invalidate on 401).
  std::optional<ExecCredential> exec;
};

size_t onHeader(char* data, size_t size, size_t count, void* user) {
  auto* exchange = static_cast<Exchange*>(user);
  const std::string_view line(data, size * count);
  // A new status line (after 100 Continue): forget the previous headers.
  if (line.starts_with("HTTP/")) exchange->retryAfter.clear();
  constexpr std::string_view kRetryAfter = "retry-after:";
  if (line.size() > kRetryAfter.size() &&
      std::equal(kRetryAfter.begin(), kRetryAfter.end(), line.begin(),
                 [](char a, char b) { return a == std::tolower(static_cast<unsigned char>(b)); })) {
    exchange->retryAfter = std::string(line.substr(kRetryAfter.size()));
  }
  return size * count;
}

size_t onBody(char* data, size_t size, size_t count, void* user) {
  auto* exchange = static_cast<Exchange*>(user);
  const std::string_view bytes(data, size * count);
  long code = 0;
  curl_easy_getinfo(exchange->easy, CURLINFO_RESPONSE_CODE, &code);
  if (exchange->onChunk != nullptr && code >= 200 && code < 300) {
    try {
      (*exchange->onChunk)(bytes);
    } catch (...) {
      exchange->thrown = std::current_exception();
      return 0;  // aborts the transfer
    }
  } else {
    exchange->body.append(bytes);
  }
  return bytes.size();
}

StatusCode codeForCurl(CURLcode code) {
  switch (code) {
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_RESOLVE_PROXY:
    case CURLE_COULDNT_CONNECT:
    case CURLE_SSL_CONNECT_ERROR: return StatusCode::kUnavailable;  // nothing was sent
    case CURLE_OPERATION_TIMEDOUT: return StatusCode::kDeadlineExceeded;
    case CURLE_ABORTED_BY_CALLBACK: return StatusCode::kCancelled;
    case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_SSL_CACERT_BADFILE:
    case CURLE_SSL_CERTPROBLEM:
    case CURLE_SSL_CIPHER:
    case CURLE_URL_MALFORMAT:
    case CURLE_UNSUPPORTED_PROTOCOL:
      return StatusCode::kFailedPrecondition;  // configuration: retrying cannot help
    default: return StatusCode::kUnknown;      // the request may have been acted on
  }
}

void setBlob(CURL* easy, CURLoption option, const std::string& pem) {
  curl_blob blob{const_cast<char*>(pem.data()), pem.size(), CURL_BLOB_COPY};
  curl_easy_setopt(easy, option, &blob);
}

class CurlClient final : public KubeClient {
 public:
  CurlClient(ClusterConfig config, ClientOptions options)
      : config_(std::move(config)), options_(std::move(options)) {}

  ~CurlClient() override {
    for (const Handle& handle : idle_) destroy(handle);
  }

  ApiResult<json> call(const ApiRequest& request, const CancelToken* cancel) override {
    Backoff backoff(options_.retryBackoff);
    bool renewed = false;
    while (true) {
      Exchange exchange;
      auto attempt = perform(request, exchange, options_.timeout, cancel);
      // Credentials from an exec plugin that the server refuses (revoked,
      // or expired earlier than they said): run the plugin again and repeat
      // the request once; a 401 means it was not acted on.
      if (!attempt.ok() && attempt.error().isUnauthorized() && exchange.exec && !renewed) {
        config_.exec->invalidate(*exchange.exec);
        renewed = true;
        continue;
      }
      if (attempt.ok()) {
        if (exchange.body.empty()) return json();
        json body = json::parse(exchange.body, nullptr, /*allow_exceptions=*/false);
        if (body.is_discarded()) {
          return localError(StatusCode::kDataLoss, fmt::format("{} {}: the answer is not JSON",
                                                               request.method, request.path));
        }
        return body;
      }
      const auto delay = retryDelay(attempt.error(), request.idempotent, options_, backoff);
      if (!delay || (cancel != nullptr && cancel->cancelled())) return attempt.error();
      logger()->debug("{} {}: {}; retry {} in {} ms", request.method, request.path,
                      attempt.error().toStatus().toString(), backoff.attempts(), delay->count());
      if (cancel != nullptr) {
        if (!cancel->sleepFor(*delay)) return localError(StatusCode::kCancelled, "cancelled");
      } else {
        std::this_thread::sleep_for(*delay);
      }
    }
  }

  ApiResult<std::monostate> stream(const ApiRequest& request,
                                   const std::function<void(std::string_view)>& onChunk,
                                   std::chrono::milliseconds timeout,
                                   const CancelToken& cancel) override {
    Exchange exchange;
    exchange.onChunk = &onChunk;
    auto result = perform(request, exchange, timeout, &cancel);
    // No retry here (the watch's caller reconnects), but its next attempt
    // gets fresh credentials.
    if (!result.ok() && result.error().isUnauthorized() && exchange.exec) {
      config_.exec->invalidate(*exchange.exec);
    }
    return result;
  }

  const std::string& defaultNamespace() const override { return config_.defaultNamespace; }
  const ClientOptions& options() const override { return options_; }

 private:
  struct Handle {
    CURLM* multi = nullptr;
    CURL* easy = nullptr;
  };

  static void destroy(const Handle& handle) {
    curl_easy_cleanup(handle.easy);
    curl_multi_cleanup(handle.multi);
  }

  Handle acquire() {
    {
      std::lock_guard lock(mu_);
      if (!idle_.empty()) {
        const Handle handle = idle_.back();
        idle_.pop_back();
        return handle;
      }
    }
    Handle handle{curl_multi_init(), curl_easy_init()};
    GEO_ENFORCE(handle.multi != nullptr && handle.easy != nullptr, "libcurl: out of handles");
    return handle;
  }

  void release(const Handle& handle) {
    std::lock_guard lock(mu_);
    if (static_cast<int>(idle_.size()) < options_.maxIdleHandles) {
      idle_.push_back(handle);
      return;
    }
    destroy(handle);
  }

  // One attempt: ok for a 2xx answer (its body in `exchange` or streamed).
  ApiResult<std::monostate> perform(const ApiRequest& request, Exchange& exchange,
                                    std::chrono::milliseconds timeout, const CancelToken* cancel) {
    if (config_.exec) {
      auto credentials = config_.exec->credentials();
      if (!credentials.ok()) {
        return localError(
            credentials.status().code(),
            fmt::format("{} {}: {}", request.method, request.path, credentials.status().message()));
      }
      exchange.exec = std::move(*credentials);
    }
    const Handle handle = acquire();
    CURL* easy = handle.easy;
    exchange.easy = easy;
    curl_easy_reset(easy);
    const std::string url = config_.server + request.target();
    curl_easy_setopt(easy, CURLOPT_URL, url.c_str());
    curl_easy_setopt(easy, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(easy, CURLOPT_HTTP_VERSION, CURL_HTTP_VERSION_1_1);
    curl_easy_setopt(easy, CURLOPT_TIMEOUT_MS, static_cast<long>(timeout.count()));
    curl_easy_setopt(easy, CURLOPT_CONNECTTIMEOUT_MS,
                     static_cast<long>(options_.connectTimeout.count()));
    curl_easy_setopt(easy, CURLOPT_TCP_KEEPALIVE, 1L);
    curl_easy_setopt(easy, CURLOPT_USERAGENT, options_.userAgent.c_str());
    curl_easy_setopt(easy, CURLOPT_ACCEPT_ENCODING, "");
    if (request.method == "GET") {
      curl_easy_setopt(easy, CURLOPT_HTTPGET, 1L);
    } else {
      curl_easy_setopt(easy, CURLOPT_CUSTOMREQUEST, request.method.c_str());
    }
    if (!request.body.empty()) {
      curl_easy_setopt(easy, CURLOPT_POSTFIELDS, request.body.data());
      curl_easy_setopt(easy, CURLOPT_POSTFIELDSIZE_LARGE,
                       static_cast<curl_off_t>(request.body.size()));
    }
    curl_slist* headers = curl_slist_append(nullptr, "Accept: application/json");
    headers = curl_slist_append(headers, "Expect:");  // no 100-continue round trip
    if (!request.contentType.empty()) {
      headers = curl_slist_append(headers, ("Content-Type: " + request.contentType).c_str());
    }
    if (exchange.exec && !exchange.exec->token.empty()) {
      headers =
          curl_slist_append(headers, ("Authorization: Bearer " + exchange.exec->token).c_str());
    } else if (config_.token) {
      headers =
          curl_slist_append(headers, ("Authorization: Bearer " + config_.token->token()).c_str());
    }
    curl_easy_setopt(easy, CURLOPT_HTTPHEADER, headers);
    if (!config_.caPem.empty()) setBlob(easy, CURLOPT_CAINFO_BLOB, config_.caPem);
    if (config_.insecureSkipTlsVerify) {
      curl_easy_setopt(easy, CURLOPT_SSL_VERIFYPEER, 0L);
      curl_easy_setopt(easy, CURLOPT_SSL_VERIFYHOST, 0L);
    }
    const bool execCert = exchange.exec && !exchange.exec->clientCertPem.empty();
    const std::string& certPem = execCert ? exchange.exec->clientCertPem : config_.clientCertPem;
    const std::string& keyPem = execCert ? exchange.exec->clientKeyPem : config_.clientKeyPem;
    if (!certPem.empty()) {
      setBlob(easy, CURLOPT_SSLCERT_BLOB, certPem);
      curl_easy_setopt(easy, CURLOPT_SSLCERTTYPE, "PEM");
      setBlob(easy, CURLOPT_SSLKEY_BLOB, keyPem);
      curl_easy_setopt(easy, CURLOPT_SSLKEYTYPE, "PEM");
    }
    curl_easy_setopt(easy, CURLOPT_HEADERFUNCTION, onHeader);
    curl_easy_setopt(easy, CURLOPT_HEADERDATA, &exchange);
    curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, onBody);
    curl_easy_setopt(easy, CURLOPT_WRITEDATA, &exchange);
    char errors[CURL_ERROR_SIZE] = {};
    curl_easy_setopt(easy, CURLOPT_ERRORBUFFER, errors);

    CURLcode code = run(handle, cancel);
    curl_slist_free_all(headers);
    long httpCode = 0;
    curl_easy_getinfo(easy, CURLINFO_RESPONSE_CODE, &httpCode);
    release(handle);

    if (exchange.thrown) std::rethrow_exception(exchange.thrown);
    const std::string what = fmt::format("{} {}", request.method, request.path);
    if (code == CURLE_ABORTED_BY_CALLBACK) {
      return localError(StatusCode::kCancelled, what + ": cancelled");
    }
    if (code != CURLE_OK) {
      return localError(codeForCurl(code),
                        fmt::format("{}: {} ({})", what, curl_easy_strerror(code),
                                    errors[0] != '\0' ? errors : "no detail"));
    }
    if (httpCode < 200 || httpCode >= 300) {
      // The server's message as it is (it names the object); callers add
      // context with toStatus().
      return decodeApiError(static_cast<int>(httpCode), exchange.body, exchange.retryAfter);
    }
    return std::monostate{};
  }

  // Drives the transfer on the pair's multi handle until it finishes or
  // `cancel` fires (which wakes curl_multi_poll at once).
  static CURLcode run(const Handle& handle, const CancelToken* cancel) {
    curl_multi_add_handle(handle.multi, handle.easy);
    std::optional<CancelToken::Subscription> wake;
    if (cancel != nullptr) {
      wake.emplace(*cancel, [multi = handle.multi] { curl_multi_wakeup(multi); });
    }
    CURLcode result = CURLE_OK;
    int running = 1;
    while (running > 0) {
      if (cancel != nullptr && cancel->cancelled()) {
        result = CURLE_ABORTED_BY_CALLBACK;
        break;
      }
      if (const CURLMcode status = curl_multi_perform(handle.multi, &running); status != CURLM_OK) {
        result = CURLE_RECV_ERROR;
        break;
      }
      if (running == 0) break;
      curl_multi_poll(handle.multi, nullptr, 0, 1000, nullptr);
    }
    int pending = 0;
    while (CURLMsg* message = curl_multi_info_read(handle.multi, &pending)) {
      if (message->msg == CURLMSG_DONE && message->easy_handle == handle.easy) {
        result = message->data.result;
      }
    }
    wake.reset();
    curl_multi_remove_handle(handle.multi, handle.easy);
    return result;
  }

  const ClusterConfig config_;
  const ClientOptions options_;
  std::mutex mu_;
  std::vector<Handle> idle_;
};

}  // namespace

StatusOr<std::unique_ptr<KubeClient>> makeKubeClient(ClusterConfig config, ClientOptions options) {
  initCurlOnce();
  if (config.server.empty()) return invalidArgument("cluster config: server is empty");
  const curl_version_info_data* info = curl_version_info(CURLVERSION_NOW);
  // curl_multi_poll/wakeup need 7.68, the *_BLOB options 7.77.
  if (info->version_num < 0x074D00) {
    return invalidArgument(
        fmt::format("libcurl {} is too old (7.77 or newer needed)", info->version));
  }
  if (config.server.starts_with("https://") && (info->features & CURL_VERSION_SSL) == 0) {
    return invalidArgument(fmt::format("libcurl {} has no TLS support", info->version));
  }
  return std::unique_ptr<KubeClient>(new CurlClient(std::move(config), std::move(options)));
}

}  // namespace geo::kube
