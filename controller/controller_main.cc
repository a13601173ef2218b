// geotrain-controller: the hub controller. Watches TrainingJobs in every
// namespace of its cluster and reconciles each one across the region
// clusters (reconcile/reconciler.h), with leader election, Prometheus
// metrics and health endpoints.

#include <fmt/format.h>
#include <httplib.h>
#include <prometheus/exposer.h>
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>

#include "common/logging.h"
#include "controller/app/flags.h"
#include "controller/app/manager.h"
#include "controller/kube/config.h"
#include "controller/kube/events.h"
#include "controller/kube/leader_election.h"
#include "controller/reconcile/clusters.h"
#include "controller/reconcile/reconciler.h"

namespace {

namespace kube = geo::kube;
namespace rec = geo::reconcile;
using geo::controller::ControllerFlags;
using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr int kExitOk = 0;
constexpr int kExitFailure = 1;
constexpr int kExitUsage = 2;

int fail(const std::string& message, int code = kExitFailure) {
  std::cerr << "geotrain-controller: " << message << "\n";
  return code;
}

// The hub's own cluster: --kubeconfig, else in-cluster, else $KUBECONFIG or
// ~/.kube/config, as kubectl looks.
geo::StatusOr<kube::ClusterConfig> hubConfig(const ControllerFlags& f) {
  if (!f.kubeconfig.empty()) return kube::loadKubeconfig(f.kubeconfig, f.context);
  if (std::getenv("KUBERNETES_SERVICE_HOST") != nullptr) return kube::loadInClusterConfig();
  if (const char* env = std::getenv("KUBECONFIG"); env != nullptr && *env != '\0') {
    return kube::loadKubeconfig(env, f.context);
  }
  if (const char* home = std::getenv("HOME"); home != nullptr) {
    return kube::loadKubeconfig(std::string(home) + "/.kube/config", f.context);
  }
  return geo::failedPrecondition(
      "no cluster to talk to: not in a pod, and neither --kubeconfig nor $KUBECONFIG is set");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app(
      "geotrain-controller: reconciles TrainingJobs (geotrain.io/v1alpha1) of every namespace\n"
      "of this cluster across the region clusters they name: per region an Indexed Job,\n"
      "its Services, a ConfigMap with worker.yaml and a Secret with the region's keys.");
  ControllerFlags f;
  f.workerImage = "ghcr.io/geotrain/worker:" GEO_VERSION;
  geo::controller::addFlags(app, f);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? kExitOk : kExitUsage;
  }
  if (auto s = geo::initLogging(f.logLevel); !s.ok()) return fail(s.message(), kExitUsage);
  if (auto s = geo::setLogFormat(f.logFormat); !s.ok()) return fail(s.message(), kExitUsage);
  auto members = geo::controller::checkFlags(f);
  if (!members.ok()) return fail(members.status().message(), kExitUsage);

  auto config = hubConfig(f);
  if (!config.ok()) return fail(config.status().message());
  if (f.ns.empty()) {
    const char* podNs = std::getenv("POD_NAMESPACE");
    f.ns = podNs != nullptr && *podNs != '\0' ? podNs : config->defaultNamespace;
  }
  if (f.identity.empty()) {
    const char* pod = std::getenv("POD_NAME");
    char host[256] = {};
    ::gethostname(host, sizeof host - 1);
    std::random_device rd;
    f.identity = fmt::format("{}_{:08x}", pod != nullptr ? pod : host, rd());
  }
  kube::ClientOptions clientOptions;
  auto hub = kube::makeKubeClient(*config, clientOptions);
  if (!hub.ok()) return fail(hub.status().message());
  // The elector's calls must end before the renew deadline.
  kube::ClientOptions electorOptions;
  electorOptions.timeout = seconds(std::max(1, f.renewDeadlineSeconds / 2));
  electorOptions.maxRetries = 0;
  auto electorClient = kube::makeKubeClient(*config, electorOptions);
  if (!electorClient.ok()) return fail(electorClient.status().message());

  // Signals end the controller: SIGTERM (the kubelet), SIGINT (Ctrl-C).
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGINT);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);

  // What can fail to listen comes before any thread of ours: a return
  // from main with a joinable std::thread would abort the process instead
  // of exiting with the message (a busy port, under a Deployment's
  // restarts, looked like a crash). The servers' own threads start after
  // the signal mask, so that sigwait below receives SIGTERM.
  geo::controller::ControllerMetrics metrics;
  std::unique_ptr<prometheus::Exposer> exposer;
  try {
    exposer = std::make_unique<prometheus::Exposer>(f.metricsListen);
    exposer->RegisterCollectable(metrics.registry);
  } catch (const std::exception& e) {
    return fail(fmt::format("--metrics-listen {}: {}", f.metricsListen, e.what()));
  }
  std::atomic<bool> synced{false};
  std::atomic<bool> leading{!f.leaderElect};
  httplib::Server health;
  health.Get("/healthz", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("ok\n", "text/plain");
  });
  // Ready: the leader once its cache is synced; a standby as soon as it runs
  // (it is healthy, just not active).
  health.Get("/readyz", [&](const httplib::Request&, httplib::Response& res) {
    const bool ready = !leading || synced;
    res.status = ready ? 200 : 503;
    res.set_content(ready ? "ok\n" : "informer not synced\n", "text/plain");
  });
  const size_t colon = f.healthListen.rfind(':');
  if (colon == std::string::npos ||
      !health.bind_to_port(f.healthListen.substr(0, colon).c_str(),
                           std::stoi(f.healthListen.substr(colon + 1)))) {
    return fail("--health-listen " + f.healthListen + ": cannot listen there");
  }
  kube::CancelToken stop;
  std::thread signalThread([&] {
    int sig = 0;
    sigwait(&sigs, &sig);
    if (sig != 0) geo::logger()->info("signal {}: stopping", sig);
    stop.cancel();
  });
  std::thread healthThread([&] { health.listen_after_bind(); });

  rec::SecretClusters clusters(**hub, f.ns, *members, clientOptions);
  kube::EventRecorder events(**hub, "geotrain-controller", f.identity);
  rec::ReconcilerOptions options;
  options.render.workerImage = f.workerImage;
  options.render.clusterDomain = f.clusterDomain;
  options.cleanupTimeout = seconds(f.cleanupTimeoutSeconds);
  options.keyRotationStep = seconds(f.keyRotationStepSeconds);
  rec::Reconciler reconciler(**hub, clusters, &events, options);
  geo::logger()->info("geotrain-controller {} as {} in namespace {}; members: {}", GEO_VERSION,
                      f.identity, f.ns,
                      members->empty() ? "none" : fmt::format("{}", members->size()));

  int code = kExitOk;
  if (!f.leaderElect) {
    geo::controller::runManager(f.workers, **hub, clusters, reconciler, metrics, synced, stop);
  } else {
    kube::CancelToken leaderStop;
    std::thread active;
    kube::LeaderElectionConfig le;
    le.leaseNamespace = f.ns;
    le.leaseName = f.leaseName;
    le.identity = f.identity;
    le.leaseDuration = seconds(f.leaseDurationSeconds);
    le.renewDeadline = seconds(f.renewDeadlineSeconds);
    le.retryPeriod = milliseconds(std::max(500, f.renewDeadlineSeconds * 1000 / 5));
    le.onStartedLeading = [&] {
      geo::logger()->info("leading (Lease {}/{})", f.ns, f.leaseName);
      leading = true;
      active = std::thread([&] {
        geo::controller::runManager(f.workers, **hub, clusters, reconciler, metrics, synced,
                                    leaderStop);
      });
    };
    le.onStoppedLeading = [&] {
      // Lost the Lease while another replica may already act: stop at once;
      // the Deployment restarts this one as a standby.
      if (!stop.cancelled()) {
        geo::logger()->error("lost the Lease {}/{}: exiting", f.ns, f.leaseName);
        code = kExitFailure;
        stop.cancel();
      }
      leaderStop.cancel();
    };
    kube::LeaderElector elector(**electorClient, le);
    elector.run(stop);
    leaderStop.cancel();
    if (active.joinable()) active.join();
  }
  health.stop();
  healthThread.join();
  pthread_kill(signalThread.native_handle(), SIGTERM);  // end sigwait if no signal came
  signalThread.join();
  geo::logger()->info("stopped");
  return code;
}
