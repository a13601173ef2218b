#include "controller/app/manager.h"

#include <chrono>
#include <map>

#include "common/logging.h"
#include "controller/kube/controller.h"
#include "controller/kube/informer.h"

namespace geo::controller {

namespace kube = geo::kube;
namespace rec = geo::reconcile;

std::string stateOf(const nlohmann::json& object) {
  if (!object.contains("status") || !object["status"].is_object()) return "Pending";
  const std::string s = object["status"].value("state", "");
  return s.empty() ? "Pending" : s;
}

void runManager(int workers, kube::KubeClient& hub, rec::SecretClusters& clusters,
                rec::Reconciler& reconciler, ControllerMetrics& metrics, std::atomic<bool>& synced,
                const kube::CancelToken& stop) {
  kube::ControllerOptions options;
  options.workers = workers;
  options.name = "trainingjob";
  kube::Controller controller(
      options,
      [&](const std::string& key) -> StatusOr<kube::Requeue> {
        const size_t slash = key.find('/');
        auto r = reconciler.reconcile(key.substr(0, slash), key.substr(slash + 1));
        if (!r.ok()) return r.status();
        for (const auto& [region, up] : r->report.regionReachable) {
          metrics.reachable.Add({{"region", region}}).Set(up ? 1 : 0);
        }
        return r->requeue;
      },
      [&](const std::string&, kube::PassOutcome outcome, Clock::Duration took) {
        metrics.seconds.Observe(std::chrono::duration<double>(took).count());
        metrics.reconciles.Add({{"result", std::string(kube::passOutcomeName(outcome))}})
            .Increment();
      });
  kube::WorkQueue& queue = controller.queue();
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
  while (!informer.waitForSync(std::chrono::milliseconds(500))) {
    if (stop.cancelled()) {
      clusters.setOnChange({});
      informer.stop();
      return;
    }
  }
  synced = true;
  logger()->info("watching TrainingJobs in every namespace ({} now)", informer.store().size());
  controller.start();
  // Job counts by state, from the cache.
  while (stop.sleepFor(std::chrono::seconds(2))) {
    std::map<std::string, double> counts = {{"Pending", 0}, {"Running", 0},   {"Succeeded", 0},
                                            {"Failed", 0},  {"Suspended", 0}, {"Invalid", 0}};
    for (const auto& o : informer.store().list()) counts[stateOf(*o)] += 1;
    for (const auto& [state, n] : counts) metrics.jobs.Add({{"state", state}}).Set(n);
  }
  clusters.setOnChange({});
  controller.shutdown();
  informer.stop();
}

}  // namespace geo::controller
