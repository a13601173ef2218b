#pragma once
// A loopback Kubernetes API server for tests (see tests/support/README.md for
// exactly which behaviours it implements).
//
// Each TestApiServer is independent (own store, registry, port, CA), so one
// test process can run a hub and several member "clusters". start() binds
// an ephemeral port on 127.0.0.1 (or options.port) and serves on a thread
// pool until stop() or destruction. Tests reach into the store, registry
// and fault injector directly to set state a controller would see (e.g. a
// status condition) and to arm faults.

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "tests/support/fault_injector.h"
#include "tests/support/object_store.h"
#include "tests/support/resource_registry.h"

namespace geo::testapi {

struct ServerOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 0;  // 0: an ephemeral port
  bool tls = false;   // HTTPS with a generated CA (caPem())
  // Bearer token every request must carry ("": no authentication). 401 with
  // a Status body otherwise.
  std::string token;
  // Events the watch log keeps; watches from older versions get 410.
  size_t watchRetention = 100000;
  // How often a watch with allowWatchBookmarks=true gets a BOOKMARK.
  std::chrono::milliseconds bookmarkInterval{10000};
  // Default (and upper bound of) a watch's timeoutSeconds.
  std::chrono::seconds maxWatchTimeout{1800};
  // Handler threads; every open watch and every idle keep-alive connection
  // holds one.
  int threads = 64;
  // Logs every request (method, path, content type, answer code) to stderr.
  bool logRequests = false;
  // With TLS: the CA and server certificate live in this directory (made
  // on the first start, reused after), so a restarted server is trusted by
  // the kubeconfigs written before. "": new ones at every start.
  std::string tlsDir;
  // The objects live in this file too (ObjectStore::persistTo), loaded at
  // start when it exists: a server restarted on the same file, even after
  // SIGKILL, has every write it answered. "": memory only.
  std::string stateFile;
};

class TestApiServer {
 public:
  explicit TestApiServer(ServerOptions options = {});
  ~TestApiServer();
  TestApiServer(const TestApiServer&) = delete;
  TestApiServer& operator=(const TestApiServer&) = delete;

  // Binds and starts serving; returns once requests are accepted. Throws
  // geo::Error if the port cannot be bound. Call once.
  void start();
  // Stops serving; open watches end. Idempotent.
  void stop();

  uint16_t port() const;
  // "http://127.0.0.1:<port>" or "https://...".
  std::string url() const;
  // The CA certificate (PEM) that signed the server's; "" without TLS.
  const std::string& caPem() const;
  // Writes a kubeconfig (cluster with CA data, user with the token, one
  // context, current) that kubectl, helm and client libraries accept.
  void writeKubeconfig(const std::string& path, const std::string& contextName = "geo-test") const;

  ResourceRegistry& registry();
  ObjectStore& store();
  FaultInjector& faults();
  void setBookmarkInterval(std::chrono::milliseconds interval);

 private:
  // Defined in server_impl.h, so that cpp-httplib stays out of this header.
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace geo::testapi
