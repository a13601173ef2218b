#pragma once
// Training progress for TrainingJob status.progress, read from rank 0's
// Prometheus endpoint (docs/architecture.md section 7: geotrain_train_step,
// geotrain_train_loss, geotrain_eval_accuracy, geotrain_eval_loss).
//
// The hub controller usually cannot reach a member cluster's pod network, so
// it goes through that cluster's API server, as `kubectl get --raw` does:
// GET /api/v1/namespaces/NS/pods/POD:PORT/proxy/metrics (the pods/proxy
// subresource; the member ClusterRole grants `get` on it). Rank 0 is
// completion index 0 of the first region's Job.

#include <chrono>
#include <string>
#include <string_view>

#include "common/status.h"
#include "controller/api/training_job.h"
#include "controller/kube/client.h"

namespace geo::reconcile {

// The four series from a text exposition (format 0.0.4). A series that is
// absent or not a finite number stays unset; step 0 (nothing trained yet),
// accuracy 0 and eval loss 0 (no evaluation yet: the gauges start at 0) are
// unset too.
// Never throws; anything unparsable is skipped.
api::Progress progressFromExposition(std::string_view text);

// The name of the Running pod of the Job `jobName` with completion index 0
// (labels geotrain.io/job, geotrain.io/region and
// batch.kubernetes.io/job-completion-index, which the Job controller puts on
// Indexed Job pods), the newest if there are several; "" when none runs.
StatusOr<std::string> leaderPod(kube::KubeClient& client, const std::string& ns,
                                const std::string& job, const std::string& region);

// Scrapes `pod`'s /metrics on `port` through the API server's pod proxy.
// Bodies over 4 MiB are refused (a metrics page is a few KiB). Errors say
// which pod and what failed; they never touch the caller's status.
StatusOr<api::Progress> scrapeProgress(kube::KubeClient& client, const std::string& ns,
                                       const std::string& pod, int port,
                                       std::chrono::milliseconds timeout);

}  // namespace geo::reconcile
