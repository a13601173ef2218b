#include "tests/support/test_apiserver.h"

#include <fmt/format.h>
#include <zlib.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "common/enforce.h"
#include "tests/support/encoding.h"
#include "tests/support/server_impl.h"

namespace geo::testapi {

namespace {

std::vector<std::string> splitPath(const std::string& path) {
  std::vector<std::string> out;
  std::stringstream ss(path);
  std::string part;
  while (std::getline(ss, part, '/')) {
    if (!part.empty()) out.push_back(part);
  }
  return out;
}

bool isPublicPath(const std::string& path) {
  return path == "/healthz" || path == "/readyz" || path == "/livez" || path == "/version";
}

ApiError notFoundPath() {
  return ApiError(404, "NotFound", "the server could not find the requested resource");
}

}  // namespace

void sendJson(httplib::Response& res, int code, const Json& body) {
  res.status = code;
  res.set_content(body.dump(), "application/json");
}

void sendError(httplib::Response& res, const ApiError& error) {
  if (error.code() == 429) {
    res.set_header("Retry-After", std::to_string(error.details().value("retryAfterSeconds", 1)));
  }
  sendJson(res, error.code(), error.toStatus());
}

TestApiServer::Impl::Impl(ServerOptions opts)
    : options(std::move(opts)),
      store(registry, options.watchRetention),
      bookmarkIntervalMs(options.bookmarkInterval.count()) {}

namespace {

// What kube-apiserver compresses: answers of at least 128 KiB, with gzip at
// level 1, to clients that accept gzip (never brotli).
constexpr size_t kGzipThresholdBytes = 128 * 1024;

// Whether Accept-Encoding ("gzip, deflate, br", "gzip;q=0.5") offers gzip.
bool acceptsGzip(std::string acceptEncoding) {
  acceptEncoding.erase(std::remove(acceptEncoding.begin(), acceptEncoding.end(), ' '),
                       acceptEncoding.end());
  std::stringstream ss(acceptEncoding);
  std::string coding;
  while (std::getline(ss, coding, ',')) {
    const size_t semi = coding.find(';');
    const std::string params = semi == std::string::npos ? "" : coding.substr(semi + 1);
    coding = coding.substr(0, semi);
    if ((coding == "gzip" || coding == "*") && params != "q=0" && params != "q=0.0") return true;
  }
  return false;
}

// gzip (RFC 1952) of `data` at level 1; nullopt if zlib fails.
std::optional<std::string> gzip(const std::string& data) {
  z_stream zs{};
  if (deflateInit2(&zs, 1, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK) return std::nullopt;
  std::string out(deflateBound(&zs, uLong(data.size())), '\0');
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
  zs.avail_in = uInt(data.size());
  zs.next_out = reinterpret_cast<Bytef*>(out.data());
  zs.avail_out = uInt(out.size());
  const int rc = deflate(&zs, Z_FINISH);
  out.resize(zs.total_out);
  deflateEnd(&zs);
  if (rc != Z_STREAM_END) return std::nullopt;
  return out;
}

}  // namespace

// Response compression. cpp-httplib compresses every answer whose
// Content-Type is compressible (application/json, text/...) for a client
// whose Accept-Encoding names br or gzip, preferring brotli at quality 11:
// that cost more CPU than the rest of a request together (a third of the
// server's time under the controller benchmark) and is not what the real
// server does. So the request's Accept-Encoding is taken out before
// cpp-httplib sees it (its handlers get `const Request&`, but the object is
// a non-const local of the connection loop, so the const_cast is well
// defined), and JSON answers are gzipped here as kube-apiserver does.
void TestApiServer::Impl::handle(const httplib::Request& req, httplib::Response& res) {
  const bool gzipOk = acceptsGzip(req.get_header_value("Accept-Encoding"));
  const_cast<httplib::Request&>(req).headers.erase("Accept-Encoding");
  dispatch(req, res);
  if (gzipOk && res.body.size() >= kGzipThresholdBytes &&
      res.get_header_value("Content-Type") == "application/json" &&
      !res.has_header("Content-Encoding")) {
    if (auto compressed = gzip(res.body)) {
      res.body = std::move(*compressed);
      res.set_header("Content-Encoding", "gzip");
    }
  }
}

void TestApiServer::Impl::dispatch(const httplib::Request& req, httplib::Response& res) {
  try {
    const std::string auth = req.get_header_value("Authorization");
    if (!options.token.empty() && auth != "Bearer " + options.token &&
        !(auth.empty() && isPublicPath(req.path))) {
      throw ApiError(401, "Unauthorized", "Unauthorized");
    }
    const auto latency = faults.latency();
    if (latency.count() > 0) std::this_thread::sleep_for(latency);
    if (auto failure = faults.takeFailure(req.method, req.path)) {
      if (failure->code == 429) {
        throw ApiError(429, "TooManyRequests",
                       "the server has received too many requests and has asked us to try again "
                       "later",
                       Json{{"retryAfterSeconds", failure->retryAfterSeconds}});
      }
      throw ApiError(failure->code, failure->code == 500 ? "InternalError" : "ServiceUnavailable",
                     fmt::format("injected failure: {} {}", req.method, req.path));
    }
    if (req.path == "/healthz" || req.path == "/readyz" || req.path == "/livez") {
      res.set_content("ok", "text/plain");
      return;
    }
    if (req.path == "/version") {
      sendJson(res, 200,
               {{"major", "1"},
                {"minor", "33"},
                {"gitVersion", "v1.33.0-geotrain-test"},
                {"gitCommit", "0000000000000000000000000000000000000000"},
                {"gitTreeState", "clean"},
                {"buildDate", "2025-04-23T00:00:00Z"},
                {"goVersion", "go1.24.2"},
                {"compiler", "gc"},
                {"platform", "linux/amd64"}});
      return;
    }
    if (req.path.starts_with("/openapi/")) {
      serveOpenApi(req, res);
      return;
    }
    route(req, res);
  } catch (const ApiError& e) {
    sendError(res, e);
  } catch (const std::exception& e) {
    sendError(res,
              ApiError(500, "InternalError", fmt::format("Internal error occurred: {}", e.what())));
  }
}

void TestApiServer::Impl::route(const httplib::Request& req, httplib::Response& res) {
  const std::vector<std::string> parts = splitPath(req.path);
  std::string group;
  std::string version;
  size_t rest = 0;
  if (!parts.empty() && parts[0] == "api") {
    if (parts.size() >= 2) version = parts[1];
    rest = 2;
  } else if (!parts.empty() && parts[0] == "apis") {
    if (parts.size() >= 2) group = parts[1];
    if (parts.size() >= 3) version = parts[2];
    rest = 3;
  } else {
    throw notFoundPath();
  }
  if (parts.size() <= rest) {
    if (req.method != "GET")
      throw ApiError(405, "MethodNotAllowed",
                     "the server does not allow this method on the requested resource");
    // Discovery documents are plain JSON only (the aggregated form and
    // tables are not served for them).
    if (negotiate(req.get_header_value("Accept")).form != Rendering::Form::kObject) {
      throw ApiError(406, "NotAcceptable",
                     "only the following media types are accepted: application/json");
    }
    auto doc = discoveryDocument(registry, req.path);
    if (!doc) throw notFoundPath();
    sendJson(res, 200, *doc);
    return;
  }
  std::vector<std::string> segs(parts.begin() + long(rest), parts.end());
  Target target;
  if (segs[0] == "namespaces" && segs.size() >= 3) {
    auto t = registry.find(group, version, segs[2]);
    if (t && t->namespaced) {
      target.type = t;
      target.ns = segs[1];
      segs.erase(segs.begin(), segs.begin() + 2);
    }
  }
  if (!target.type) {
    target.type = registry.find(group, version, segs[0]);
    if (!target.type) throw notFoundPath();
  }
  if (segs.size() >= 2) target.name = segs[1];
  if (segs.size() >= 3) target.subresource = segs[2];
  // pods/{id}/proxy takes the rest of the path, whatever its length, as the
  // path to forward (only in a namespace, like every pods subresource).
  if (target.subresource == "proxy" && target.type->group.empty() &&
      target.type->resource == "pods" && !target.ns.empty()) {
    // api/v1 or apis/g/v, then namespaces/{ns}/pods/{id}/proxy.
    serveProxy(req, res, target, rest + 5);
    return;
  }
  if (segs.size() > 3) throw notFoundPath();
  if (!target.subresource.empty() &&
      !(target.subresource == "status" && target.type->statusSubresource)) {
    throw notFoundPath();
  }
  serveResource(req, res, target);
}

TestApiServer::TestApiServer(ServerOptions options)
    : impl_(std::make_unique<Impl>(std::move(options))) {}

TestApiServer::~TestApiServer() {
  stop();
}

void TestApiServer::start() {
  Impl& s = *impl_;
  GEO_ENFORCE(s.http == nullptr, "TestApiServer::start called twice");
  if (!s.options.stateFile.empty()) {
    if (std::filesystem::exists(s.options.stateFile)) s.store.load(s.options.stateFile);
    s.store.persistTo(s.options.stateFile);
  }
  if (s.options.tls) {
    s.tls = s.options.tlsDir.empty() ? generateTlsMaterial() : tlsMaterialIn(s.options.tlsDir);
    s.http = std::make_unique<httplib::SSLServer>(s.tls->serverCert.get(), s.tls->serverKey.get());
    GEO_ENFORCE(s.http->is_valid(), "could not set up TLS for the test apiserver");
  } else {
    s.http = std::make_unique<httplib::Server>();
  }
  const int threads = s.options.threads;
  s.http->new_task_queue = [threads] { return new httplib::ThreadPool(size_t(threads)); };
  // Go's net/http (the real API server) sets TCP_NODELAY; without it a
  // response written in two pieces waits for the client's delayed ACK (~40
  // ms a request).
  s.http->set_tcp_nodelay(true);
  s.http->set_keep_alive_max_count(100000);
  s.http->set_keep_alive_timeout(5);
  s.http->set_payload_max_length(64u << 20);
  auto handler = [&s](const httplib::Request& req, httplib::Response& res) { s.handle(req, res); };
  if (s.options.logRequests) {
    s.http->set_logger([](const httplib::Request& req, const httplib::Response& res) {
      std::cerr << fmt::format("{} {}{}{} [{}] -> {}\n", req.method, req.path,
                               req.params.empty() ? "" : "?",
                               httplib::detail::params_to_query_str(req.params),
                               req.get_header_value("Content-Type"), res.status);
    });
  }
  const std::string all = "/.*";
  s.http->Get(all, handler);
  s.http->Post(all, handler);
  s.http->Put(all, handler);
  s.http->Patch(all, handler);
  s.http->Delete(all, handler);
  if (s.options.port == 0) {
    s.port = s.http->bind_to_any_port(s.options.host);
  } else {
    s.port = s.http->bind_to_port(s.options.host, s.options.port) ? s.options.port : -1;
  }
  GEO_ENFORCE(s.port > 0, "test apiserver could not bind {}:{}", s.options.host, s.options.port);
  s.listener = std::thread([&s] { s.http->listen_after_bind(); });
  while (!s.http->is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

void TestApiServer::stop() {
  Impl& s = *impl_;
  if (s.http == nullptr || s.stopping.exchange(true)) return;
  s.store.wakeWatchers();
  s.http->stop();
  if (s.listener.joinable()) s.listener.join();
}

uint16_t TestApiServer::port() const {
  return uint16_t(impl_->port);
}

std::string TestApiServer::url() const {
  return fmt::format("{}://{}:{}", impl_->options.tls ? "https" : "http", impl_->options.host,
                     impl_->port);
}

const std::string& TestApiServer::caPem() const {
  static const std::string kNone;
  return impl_->tls ? impl_->tls->caPem : kNone;
}

void TestApiServer::writeKubeconfig(const std::string& path, const std::string& contextName) const {
  Json cluster = {{"server", url()}};
  if (impl_->tls) cluster["certificate-authority-data"] = base64Encode(impl_->tls->caPem);
  Json user = Json::object();
  if (!impl_->options.token.empty()) user["token"] = impl_->options.token;
  // JSON is YAML: every kubeconfig reader accepts it.
  const Json config = {
      {"apiVersion", "v1"},
      {"kind", "Config"},
      {"clusters", {{{"name", contextName}, {"cluster", cluster}}}},
      {"users", {{{"name", contextName}, {"user", user}}}},
      {"contexts",
       {{{"name", contextName},
         {"context",
          {{"cluster", contextName}, {"user", contextName}, {"namespace", "default"}}}}}},
      {"current-context", contextName},
      {"preferences", Json::object()}};
  {
    std::ofstream out(path);
    out << config.dump(2) << "\n";
    GEO_ENFORCE(out.good(), "could not write kubeconfig {}", path);
  }
  // The file holds a credential; helm warns about group-readable ones.
  std::filesystem::permissions(
      path, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
}

ResourceRegistry& TestApiServer::registry() {
  return impl_->registry;
}
ObjectStore& TestApiServer::store() {
  return impl_->store;
}
FaultInjector& TestApiServer::faults() {
  return impl_->faults;
}

void TestApiServer::setBookmarkInterval(std::chrono::milliseconds interval) {
  impl_->bookmarkIntervalMs = interval.count();
}

}  // namespace geo::testapi
