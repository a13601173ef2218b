// The pods/proxy subresource:
//   {GET,POST,PUT,PATCH,DELETE} /api/v1/namespaces/{ns}/pods/{id}/proxy[/{path...}][?query]
// with {id} = name | name:port | scheme:name:port (scheme http or https), as
// kube-apiserver's pod REST storage (pkg/registry/core/pod: ResourceLocation
// and the UpgradeAwareHandler of apimachinery's proxy package) serves it:
//
// - the Pod comes from the store: 404 NotFound Status when it is not there;
//   an {id} with more than three ':'-parts, an empty name or another scheme
//   is 400 "invalid pod request".
// - the address is status.podIP; one that is not an IP (an empty podIP: a
//   pod not started yet) is 400 BadRequest "address not allowed", exactly
//   what the real server answers (it has no "pod has no IP" message).
//   *Difference:* the real server refuses every address that is not global
//   unicast (loopback, link-local, multicast, unspecified) the same way;
//   this one lets loopback through, because the tests' "pods" are HTTP
//   servers on 127.0.0.1, and refuses the rest.
// - the port: the one in {id}; else the first containerPort of the first
//   container that declares ports; else the scheme's (80, or 443 for
//   https). A port that is not a number is not looked up among the
//   containers' port names (the real server hands it to Go's dialer, which
//   looks it up as a service name and fails): 503 "error trying to reach
//   service: dial tcp: lookup tcp/<port>: unknown port".
// - the request goes to {scheme}://{podIP}:{port}{path}?{query}, path and
//   query byte for byte as the client sent them (still percent-encoded),
//   with the client's headers except Authorization (the real server's
//   authentication filter strips it) and hop-by-hop headers, and without
//   verifying an https pod's certificate (as the real pod proxy transport).
//   The answer's status, headers (Content-Type included) and body come back
//   unchanged, redirects are not followed. A GET or HEAD of `.../proxy` with
//   no path is a 301 to `.../proxy/`, like the real server.
// - a pod that cannot be reached (refused, timed out, reset) is 503
//   ServiceUnavailable "error trying to reach service: dial tcp ip:port:
//   connect: connection refused" (Go's wording), within kConnectTimeout /
//   kReadTimeout.
//
// Authentication, latency and failure injection have already applied (in
// handle()), as for any other request.

#include <arpa/inet.h>
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cstring>

#include "tests/support/server_impl.h"

namespace geo::testapi {

namespace {

// Short: tests scrape loopback servers; a hung one should fail a test in
// seconds, not minutes.
constexpr time_t kConnectTimeout = 5;  // seconds
constexpr time_t kReadTimeout = 5;     // seconds

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

// Request headers that are not forwarded: the credential for this server,
// hop-by-hop headers, the ones the client library sets itself, and the
// REMOTE_ADDR-style pseudo headers cpp-httplib's server adds.
bool forwardRequestHeader(const std::string& name) {
  static const char* const kDropped[] = {
      "authorization", "host", "connection", "keep-alive", "proxy-connection", "te", "trailer",
      "upgrade", "transfer-encoding", "content-length",
      // The upstream answer is decoded by httplib::Client; our own server
      // compresses again for clients that accept it.
      "accept-encoding", "remote_addr", "remote_port", "local_addr", "local_port"};
  const std::string l = lower(name);
  return std::none_of(std::begin(kDropped), std::end(kDropped),
                      [&](const char* d) { return l == d; });
}

bool forwardResponseHeader(const std::string& name) {
  static const char* const kDropped[] = {"connection",        "keep-alive",     "proxy-connection",
                                         "transfer-encoding", "content-length", "content-encoding",
                                         "trailer",           "upgrade"};
  const std::string l = lower(name);
  return std::none_of(std::begin(kDropped), std::end(kDropped),
                      [&](const char* d) { return l == d; });
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    const size_t at = s.find(sep, start);
    out.push_back(s.substr(start, at == std::string::npos ? std::string::npos : at - start));
    if (at == std::string::npos) return out;
    start = at + 1;
  }
}

// The raw (still percent-encoded) path after the first `segments` non-empty
// segments of the request target, and its query ("" when none).
std::pair<std::string, std::string> rawRemainder(const httplib::Request& req, size_t segments) {
  std::string target = req.target;
  if (target.empty()) {
    // Not expected from cpp-httplib's server; fall back on the decoded form.
    target = req.path;
    if (!req.params.empty()) {
      target.append("?").append(httplib::detail::params_to_query_str(req.params));
    }
  }
  const size_t q = target.find('?');
  const std::string path = target.substr(0, q);
  const std::string query = q == std::string::npos ? "" : target.substr(q + 1);
  size_t pos = 0;
  for (size_t seen = 0; seen < segments && pos < path.size();) {
    while (pos < path.size() && path[pos] == '/') ++pos;
    if (pos >= path.size()) break;
    while (pos < path.size() && path[pos] != '/') ++pos;
    ++seen;
  }
  return {path.substr(std::min(pos, path.size())), query};
}

// Where a pod address may lead. The real server wants a global unicast IP;
// loopback is allowed here too (see the file comment).
bool addressAllowed(const std::string& ip) {
  unsigned char buf[16];
  if (inet_pton(AF_INET, ip.c_str(), buf) == 1) {
    if (buf[0] == 127) return true;                    // loopback
    if (buf[0] == 0 || buf[0] >= 224) return false;    // unspecified, multicast, reserved
    if (buf[0] == 169 && buf[1] == 254) return false;  // link-local
    return !(buf[0] == 255 && buf[1] == 255 && buf[2] == 255 && buf[3] == 255);
  }
  if (inet_pton(AF_INET6, ip.c_str(), buf) == 1) {
    static const unsigned char kLoopback[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
    static const unsigned char kUnspecified[16] = {};
    if (std::memcmp(buf, kLoopback, 16) == 0) return true;
    if (std::memcmp(buf, kUnspecified, 16) == 0) return false;
    if (buf[0] == 0xff) return false;                     // multicast
    return !(buf[0] == 0xfe && (buf[1] & 0xc0) == 0x80);  // link-local
  }
  return false;
}

// The first declared container port, as the real server picks one.
std::string firstContainerPort(const Json& pod) {
  const Json* containers = nullptr;
  if (pod.contains("spec") && pod["spec"].is_object() && pod["spec"].contains("containers")) {
    containers = &pod["spec"]["containers"];
  }
  if (containers == nullptr || !containers->is_array()) return "";
  for (const Json& c : *containers) {
    if (!c.is_object() || !c.contains("ports") || !c["ports"].is_array() || c["ports"].empty()) {
      continue;
    }
    const Json& p = c["ports"][0];
    if (p.is_object() && p.contains("containerPort") && p["containerPort"].is_number_integer()) {
      return std::to_string(p["containerPort"].get<int64_t>());
    }
    return "";
  }
  return "";
}

ApiError unreachable(const std::string& why) {
  return ApiError(503, "ServiceUnavailable", "error trying to reach service: " + why);
}

}  // namespace

void TestApiServer::Impl::serveProxy(const httplib::Request& req, httplib::Response& res,
                                     const Target& target, size_t consumedSegments) {
  const ResourceType& type = *target.type;
  // SplitSchemeNamePort: name, name:port or scheme:name:port.
  const std::vector<std::string> parts = split(target.name, ':');
  std::string scheme;
  std::string name;
  std::string podPort;
  if (parts.size() == 1) {
    name = parts[0];
  } else if (parts.size() == 2) {
    name = parts[0];
    podPort = parts[1];
  } else if (parts.size() == 3) {
    scheme = parts[0];
    name = parts[1];
    podPort = parts[2];
  }
  if (name.empty() || (scheme != "" && scheme != "http" && scheme != "https")) {
    throw badRequest(fmt::format("invalid pod request \"{}\"", target.name));
  }
  if (scheme.empty()) scheme = "http";

  const Json pod = store.get(type, target.ns, name);  // 404 when absent
  std::string ip;
  if (pod.contains("status") && pod["status"].is_object() && pod["status"].contains("podIP") &&
      pod["status"]["podIP"].is_string()) {
    ip = pod["status"]["podIP"].get<std::string>();
  }
  if (!addressAllowed(ip)) throw badRequest("address not allowed");
  if (podPort.empty()) podPort = firstContainerPort(pod);
  if (podPort.empty()) podPort = scheme == "https" ? "443" : "80";
  const bool numeric =
      podPort.size() <= 5 && std::all_of(podPort.begin(), podPort.end(),
                                         [](unsigned char c) { return std::isdigit(c) != 0; });
  if (!numeric || std::stoi(podPort) > 65535) {
    throw unreachable(fmt::format("dial tcp: lookup tcp/{}: unknown port", podPort));
  }
  const std::string host = ip.find(':') != std::string::npos ? "[" + ip + "]" : ip;
  const std::string address = fmt::format("{}:{}", host, podPort);

  auto [path, query] = rawRemainder(req, consumedSegments);
  if (path.empty() && (req.method == "GET" || req.method == "HEAD")) {
    res.status = 301;
    std::string location = req.path;
    location += '/';
    if (!query.empty()) location.append("?").append(query);
    res.set_header("Location", location);
    return;
  }
  if (path.empty()) path.push_back('/');

  httplib::Client client(fmt::format("{}://{}", scheme, address));
  client.set_connection_timeout(kConnectTimeout, 0);
  client.set_read_timeout(kReadTimeout, 0);
  client.set_write_timeout(kReadTimeout, 0);
  client.set_follow_location(false);
  // The path is already encoded as the client sent it: send it as is.
  client.set_url_encode(false);
  client.set_keep_alive(false);
  client.enable_server_certificate_verification(false);

  httplib::Request upstream;
  upstream.method = req.method;
  upstream.path = path;
  if (!query.empty()) upstream.path.append("?").append(query);
  upstream.body = req.body;
  for (const auto& [key, value] : req.headers) {
    if (forwardRequestHeader(key)) upstream.headers.emplace(key, value);
  }
  httplib::Result r = client.send(upstream);
  if (!r) {
    switch (r.error()) {
      case httplib::Error::Connection:
        throw unreachable(fmt::format("dial tcp {}: connect: connection refused", address));
      case httplib::Error::ConnectionTimeout:
        throw unreachable(fmt::format("dial tcp {}: i/o timeout", address));
      case httplib::Error::SSLConnection:
        throw unreachable(fmt::format("tls handshake with {} failed", address));
      case httplib::Error::Read:
        throw unreachable(
            fmt::format("read tcp {}: no answer (connection closed or timed out)", address));
      default:
        throw unreachable(
            fmt::format("{} {}: {}", req.method, address, httplib::to_string(r.error())));
    }
  }
  res.status = r->status;
  for (const auto& [key, value] : r->headers) {
    if (forwardResponseHeader(key)) res.headers.emplace(key, value);
  }
  res.body = std::move(r->body);
}

}  // namespace geo::testapi
