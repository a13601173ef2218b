// geotrain-controller: the hub controller. Watches TrainingJobs in every
// namespace of its cluster and reconciles each one across the region
// clusters (reconcile/reconciler.h), with leader election, Prometheus
// metrics and health endpoints.

#include <fmt/format.h>
#include <httplib.h>
#include <prometheus/counter.h>
#include <prometheus/exposer.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
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
#include <vector>

#include "common/logging.h"
#include "controller/kube/config.h"
#include "controller/kube/events.h"
#include "controller/kube/informer.h"
#include "controller/kube/leader_election.h"
#include "controller/kube/workqueue.h"
#include "controller/reconcile/clusters.h"
#include "controller/reconcile/reconciler.h"

namespace {

namespace kube = geo::kube;
namespace rec = geo::reconcile;
using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr int kExitOk = 0;
constexpr int kExitFailure = 1;
constexpr int kExitUsage = 2;

struct Flags {
  std::string kubeconfig;
  std::string context;
  std::string ns;
  std::vector<std::string> members;
  std::string workerImage = "ghcr.io/geotrain/worker:" GEO_VERSION;
  std::string clusterDomain = "cluster.local";
  bool leaderElect = true;
  std::string leaseName = "geotrain-controller";
  int leaseDurationSeconds = 15;
  int renewDeadlineSeconds = 10;
  std::string identity;
  std::string metricsListen = "0.0.0.0:8080";
  std::string healthListen = "0.0.0.0:8081";
  int workers = 2;
  int cleanupTimeoutSeconds = 600;
  std::string logLevel = "info";
  std::string logFormat = "text";
};

int fail(const std::string& message, int code = kExitFailure) {
  std::cerr << "geotrain-controller: " << message << "\n";
  return code;
}

// The hub's own cluster: --kubeconfig, else in-cluster, else $KUBECONFIG or
// ~/.kube/config, as kubectl looks.
geo::StatusOr<kube::ClusterConfig> hubConfig(const Flags& f) {
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

// docs/architecture.md section 7, controller side.
struct ControllerMetrics {
  std::shared_ptr<prometheus::Registry> registry = std::make_shared<prometheus::Registry>();
  prometheus::Family<prometheus::Counter>& reconciles =
      prometheus::BuildCounter()
          .Name("geotrain_reconcile_total")
          .Help("TrainingJob reconcile passes, by result (success, requeue, retry, error)")
          .Register(*registry);
  prometheus::Histogram& seconds =
      prometheus::BuildHistogram()
          .Name("geotrain_reconcile_seconds")
          .Help("Wall time of one reconcile pass")
          .Register(*registry)
          .Add({}, prometheus::Histogram::BucketBoundaries{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                                           1, 2.5, 5, 10, 30});
  prometheus::Family<prometheus::Gauge>& jobs = prometheus::BuildGauge()
                                                    .Name("geotrain_jobs")
                                                    .Help("TrainingJobs by status.state")
                                                    .Register(*registry);
  prometheus::Family<prometheus::Gauge>& reachable =
      prometheus::BuildGauge()
          .Name("geotrain_region_reachable")
          .Help("1 when the region's cluster answered the last reconcile of a job, else 0")
          .Register(*registry);
};

std::string stateOf(const nlohmann::json& object) {
  if (!object.contains("status") || !object["status"].is_object()) return "Pending";
  const std::string s = object["status"].value("state", "");
  return s.empty() ? "Pending" : s;
}

// Runs the informer and the workers until `stop` is cancelled.
void runController(const Flags& f, kube::KubeClient& hub, rec::SecretClusters& clusters,
                   rec::Reconciler& reconciler, ControllerMetrics& metrics,
                   std::atomic<bool>& synced, const kube::CancelToken& stop) {
  kube::WorkQueue queue;
  // A change in a region's cluster (a Job's status, a load balancer's
  // address, a deleted object) starts a pass of its TrainingJob at once.
  clusters.enableCaches(
      [&queue](const std::string& ns, const std::string& job) { queue.add(ns + "/" + job); });
  // A member's kubeconfig Secret that is replaced (a rotated token) is used
  // from then on, without a restart.
  clusters.watchSecrets();
  kube::InformerOptions informerOptions;
  informerOptions.transform = [](nlohmann::json o) {  // nobody reads managedFields
    if (o.contains("metadata") && o["metadata"].is_object()) o["metadata"].erase("managedFields");
    return o;
  };
  kube::Informer informer(hub, rec::kTrainingJobs, "", informerOptions);
  kube::EventHandlers handlers;
  handlers.onAdd = [&](const nlohmann::json& o) { queue.add(kube::objectKey(o)); };
  handlers.onUpdate = [&](const nlohmann::json& before, const nlohmann::json& o) {
    if (rec::needsReconcile(before, o)) queue.add(kube::objectKey(o));
  };
  handlers.onDelete = [&](const nlohmann::json& o) { queue.add(kube::objectKey(o)); };
  informer.addHandlers(std::move(handlers));
  informer.start();
  while (!informer.waitForSync(milliseconds(500))) {
    if (stop.cancelled()) {
      clusters.setOnChange({});
      informer.stop();
      return;
    }
  }
  synced = true;
  geo::logger()->info("watching TrainingJobs in every namespace ({} now)", informer.store().size());

  std::vector<std::thread> workers;
  for (int w = 0; w < f.workers; ++w) {
    workers.emplace_back([&] {
      while (auto key = queue.get()) {
        const size_t slash = key->find('/');
        const std::string ns = key->substr(0, slash), name = key->substr(slash + 1);
        const auto start = std::chrono::steady_clock::now();
        auto r = reconciler.reconcile(ns, name);
        metrics.seconds.Observe(
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
        std::string outcome;
        if (!r.ok()) {
          geo::logger()->warn("trainingjob {}: {}", *key, r.status().message());
          queue.addRateLimited(*key);
          outcome = "error";
        } else {
          for (const auto& [region, up] : r->regionReachable) {
            metrics.reachable.Add({{"region", region}}).Set(up ? 1 : 0);
          }
          if (r->retry) {
            queue.addRateLimited(*key);
            outcome = "retry";
          } else {
            queue.forget(*key);
            if (r->requeueAfter) queue.addAfter(*key, *r->requeueAfter);
            outcome = r->requeueAfter ? "requeue" : "success";
          }
        }
        metrics.reconciles.Add({{"result", outcome}}).Increment();
        queue.done(*key);
      }
    });
  }
  // Job counts by state, from the cache.
  while (stop.sleepFor(seconds(2))) {
    std::map<std::string, double> counts = {{"Pending", 0}, {"Running", 0},   {"Succeeded", 0},
                                            {"Failed", 0},  {"Suspended", 0}, {"Invalid", 0}};
    for (const auto& o : informer.store().list()) counts[stateOf(*o)] += 1;
    for (const auto& [state, n] : counts) metrics.jobs.Add({{"state", state}}).Set(n);
  }
  clusters.setOnChange({});
  queue.shutdown();
  for (auto& t : workers) t.join();
  informer.stop();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app(
      "geotrain-controller: reconciles TrainingJobs (geotrain.io/v1alpha1) of every namespace\n"
      "of this cluster across the region clusters they name: per region an Indexed Job,\n"
      "its Services, a ConfigMap with worker.yaml and a Secret with the region's keys.");
  Flags f;
  app.add_option("--kubeconfig", f.kubeconfig,
                 "kubeconfig of the hub cluster (default: in-cluster, else $KUBECONFIG or "
                 "~/.kube/config)");
  app.add_option("--context", f.context, "kubeconfig context (default: the current one)");
  app.add_option("--namespace", f.ns,
                 "the controller's namespace: its Lease and the members' kubeconfig Secrets "
                 "(default: $POD_NAMESPACE, else the kubeconfig's)");
  app.add_option("--member", f.members,
                 "a member cluster: NAME=SECRET[:KEY], the Secret (in --namespace) whose KEY "
                 "(default kubeconfig) holds its kubeconfig; repeatable; TrainingJobs name it in "
                 "spec.regions[].cluster (local: this cluster)");
  app.add_option("--worker-image", f.workerImage,
                 "image of TrainingJobs that do not set spec.image")
      ->capture_default_str();
  app.add_option("--cluster-domain", f.clusterDomain, "DNS domain of the region clusters")
      ->capture_default_str();
  app.add_option("--leader-elect", f.leaderElect,
                 "elect one active replica with a Lease (true, false)")
      ->capture_default_str();
  app.add_option("--lease-name", f.leaseName, "name of the Lease")->capture_default_str();
  app.add_option_function<std::string>(
         "--lease-duration", [&](const std::string& v) { f.leaseDurationSeconds = std::stoi(v); },
         "seconds a leader's Lease lasts without renewal, e.g. 15s")
      ->check(CLI::Validator(
          [](std::string& v) {
            if (!v.empty() && v.back() == 's') v.pop_back();
            return !v.empty() && v.find_first_not_of("0123456789") == std::string::npos &&
                           std::stoi(v) >= 2
                       ? std::string()
                       : std::string("a whole number of seconds >= 2, e.g. 15s");
          },
          "SECONDS"));
  app.add_option_function<std::string>(
         "--renew-deadline", [&](const std::string& v) { f.renewDeadlineSeconds = std::stoi(v); },
         "seconds the leader keeps trying to renew before it steps down, e.g. 10s")
      ->check(CLI::Validator(
          [](std::string& v) {
            if (!v.empty() && v.back() == 's') v.pop_back();
            return !v.empty() && v.find_first_not_of("0123456789") == std::string::npos &&
                           std::stoi(v) >= 1
                       ? std::string()
                       : std::string("a whole number of seconds >= 1, e.g. 10s");
          },
          "SECONDS"));
  app.add_option("--identity", f.identity,
                 "this replica's name in the Lease (default: $POD_NAME or the host name, and a "
                 "random suffix)");
  app.add_option("--metrics-listen", f.metricsListen, "host:port of /metrics")
      ->capture_default_str();
  app.add_option("--health-listen", f.healthListen, "host:port of /healthz and /readyz")
      ->capture_default_str();
  app.add_option("--workers", f.workers, "TrainingJobs reconciled at once")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option("--cleanup-timeout", f.cleanupTimeoutSeconds,
                 "seconds after a TrainingJob's deletion after which regions that still cannot "
                 "be reached are given up (their objects stay there; Event CleanupAbandoned)")
      ->check(CLI::Range(0, 30 * 24 * 3600))
      ->capture_default_str();
  app.add_option("--log-level", f.logLevel, "trace, debug, info, warn, error, critical or off")
      ->capture_default_str();
  app.add_option("--log-format", f.logFormat,
                 "text, or json: one object a line (time, level, msg) for log collectors")
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? kExitOk : kExitUsage;
  }
  if (auto s = geo::initLogging(f.logLevel); !s.ok()) return fail(s.message(), kExitUsage);
  if (auto s = geo::setLogFormat(f.logFormat); !s.ok()) return fail(s.message(), kExitUsage);
  if (f.renewDeadlineSeconds >= f.leaseDurationSeconds) {
    return fail(fmt::format("--renew-deadline {}s is not allowed (allowed: less than "
                            "--lease-duration {}s)",
                            f.renewDeadlineSeconds, f.leaseDurationSeconds),
                kExitUsage);
  }
  std::map<std::string, rec::MemberSecret> members;
  for (const std::string& m : f.members) {
    auto parsed = rec::parseMemberFlag(m);
    if (!parsed.ok()) return fail(parsed.status().message(), kExitUsage);
    if (!members.emplace(parsed->first, parsed->second).second) {
      return fail("--member " + parsed->first + " is given twice", kExitUsage);
    }
  }

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
  kube::CancelToken stop;
  std::thread signalThread([&] {
    int sig = 0;
    sigwait(&sigs, &sig);
    if (sig != 0) geo::logger()->info("signal {}: stopping", sig);
    stop.cancel();
  });

  ControllerMetrics metrics;
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
  std::thread healthThread([&] { health.listen_after_bind(); });

  rec::SecretClusters clusters(**hub, f.ns, members, clientOptions);
  kube::EventRecorder events(**hub, "geotrain-controller", f.identity);
  rec::ReconcilerOptions options;
  options.render.workerImage = f.workerImage;
  options.render.clusterDomain = f.clusterDomain;
  options.cleanupTimeout = seconds(f.cleanupTimeoutSeconds);
  rec::Reconciler reconciler(**hub, clusters, &events, options);
  geo::logger()->info("geotrain-controller {} as {} in namespace {}; members: {}", GEO_VERSION,
                      f.identity, f.ns,
                      members.empty() ? "none" : fmt::format("{}", members.size()));

  int code = kExitOk;
  if (!f.leaderElect) {
    runController(f, **hub, clusters, reconciler, metrics, synced, stop);
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
      active = std::thread(
          [&] { runController(f, **hub, clusters, reconciler, metrics, synced, leaderStop); });
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
