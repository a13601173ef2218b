#pragma once
// The active replica's work, as controller-runtime's manager runs it: an
// informer of TrainingJobs in every namespace feeds a kube::Controller
// (kube/controller.h) whose workers run the Reconciler; the region
// clusters' caches and the members' kubeconfig Secrets feed it too; the
// controller's Prometheus metrics (docs/architecture.md section 7) are
// updated as passes end and every 2 s from the informer's cache.
//
// Threading: runManager blocks its caller until `stop` is cancelled, then
// drains the workers and stops the informer. The metrics are thread-safe.

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <atomic>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "controller/kube/cancel.h"
#include "controller/kube/client.h"
#include "controller/reconcile/clusters.h"
#include "controller/reconcile/reconciler.h"

namespace geo::controller {

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

// A TrainingJob's status.state, "Pending" while it has none.
std::string stateOf(const nlohmann::json& object);

// Runs until `stop` is cancelled (see above); `synced` turns true once the
// informer has listed every TrainingJob. Everything passed in must outlive
// the call.
void runManager(int workers, kube::KubeClient& hub, reconcile::SecretClusters& clusters,
                reconcile::Reconciler& reconciler, ControllerMetrics& metrics,
                std::atomic<bool>& synced, const kube::CancelToken& stop);

}  // namespace geo::controller
