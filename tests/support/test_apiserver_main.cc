// geo-test-apiserver: runs one test apiserver until SIGINT/SIGTERM, for the
// kubectl/helm tests and for people trying the controller by hand. SIGUSR1
// compacts its history and cuts every watch (watches from older versions
// then answer 410 Gone).

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <csignal>
#include <iostream>
#include <thread>

#include "tests/support/encoding.h"
#include "tests/support/test_apiserver.h"

namespace {

volatile std::sig_atomic_t gStop = 0;
void onSignal(int) {
  gStop = 1;
}

// SIGUSR1: an etcd compaction, and every watch stream cut (as when the
// apiserver's watch cache is rebuilt): clients re-watch from versions that
// are gone, get 410 Gone and must list again.
volatile std::sig_atomic_t gCompact = 0;
void onCompact(int) {
  gCompact = 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "Loopback Kubernetes API server for geotrain's tests (tests/support/README.md lists what "
      "it implements)."};
  geo::testapi::ServerOptions options;
  std::string kubeconfig;
  int bookmarkMs = 10000;
  app.add_option("--port", options.port, "port to listen on (0: an ephemeral one)");
  app.add_option("--host", options.host, "address to listen on")->capture_default_str();
  app.add_flag("--tls", options.tls, "serve HTTPS with a freshly generated CA");
  app.add_option("--token", options.token,
                 "bearer token clients must send (default: a random one with --kubeconfig-out)");
  app.add_option("--kubeconfig-out", kubeconfig, "write a kubeconfig for this server to FILE");
  app.add_option("--watch-retention", options.watchRetention,
                 "events kept for watches; older resourceVersions get 410 Gone")
      ->capture_default_str();
  app.add_option("--bookmark-interval-ms", bookmarkMs, "interval between watch bookmarks")
      ->capture_default_str();
  app.add_flag("--log-requests", options.logRequests, "log every request to stderr");
  app.add_option("--tls-dir", options.tlsDir,
                 "keep the CA and server certificate in DIR (made on the first start, reused "
                 "after: a restarted server is trusted by the kubeconfigs written before)");
  app.add_option("--state-file", options.stateFile,
                 "keep the objects in FILE too, written through on every change and loaded at "
                 "start (a restart, even after SIGKILL, keeps every write it answered)");
  CLI11_PARSE(app, argc, argv);
  options.bookmarkInterval = std::chrono::milliseconds(bookmarkMs);
  if (!kubeconfig.empty() && options.token.empty()) options.token = geo::testapi::randomUuid();

  std::signal(SIGINT, onSignal);
  std::signal(SIGTERM, onSignal);
  std::signal(SIGUSR1, onCompact);
  try {
    geo::testapi::TestApiServer server(options);
    server.start();
    if (!kubeconfig.empty()) server.writeKubeconfig(kubeconfig);
    // One line, flushed, so scripts can wait for it and read the URL.
    std::cout << "geo-test-apiserver listening on " << server.url() << std::endl;
    while (gStop == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      if (gCompact != 0) {
        gCompact = 0;
        server.store().compact();
        server.faults().dropWatches();
        std::cout << "geo-test-apiserver: compacted at resourceVersion "
                  << server.store().currentResourceVersion() << ", watches cut" << std::endl;
      }
    }
    server.stop();
  } catch (const std::exception& e) {
    std::cerr << "geo-test-apiserver: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
