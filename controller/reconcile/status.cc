#include "controller/reconcile/status.h"

#include <fmt/format.h>

#include <algorithm>

namespace geo::reconcile {

namespace {

using nlohmann::json;

int64_t count(const json& job, const char* key) {
  if (!job.is_object() || !job.contains("status") || !job["status"].is_object()) return 0;
  const json& s = job["status"];
  return s.contains(key) && s[key].is_number_integer() ? s[key].get<int64_t>() : 0;
}

// The batch/v1 Job condition of `type` with status True, or null.
const json* jobCondition(const json& job, const std::string& type) {
  if (!job.is_object() || !job.contains("status") || !job["status"].is_object()) return nullptr;
  const json& s = job["status"];
  if (!s.contains("conditions") || !s["conditions"].is_array()) return nullptr;
  for (const json& c : s["conditions"]) {
    if (c.is_object() && c.value("type", "") == type && c.value("status", "") == "True") {
      return &c;
    }
  }
  return nullptr;
}

std::string join(const std::vector<std::string>& parts, std::string_view separator) {
  std::string out;
  for (const auto& p : parts) {
    if (!out.empty()) out += separator;
    out += p;
  }
  return out;
}

// Whether the Job is over or on its way there: its pods are being deleted or
// are gone, so fewer of them ready is no loss. FailureTarget and
// SuccessCriteriaMet come first (Kubernetes >= 1.31) while the Job controller
// still deletes the pods, Failed and Complete after.
bool finishing(const json& job) {
  for (const char* type : {"Complete", "Failed", "SuccessCriteriaMet", "FailureTarget"}) {
    if (jobCondition(job, type) != nullptr) return true;
  }
  return false;
}

// Whether the Job's spec.suspend is true: suspended by the controller
// (spec.runPolicy.suspend) or held back by another manager (Kueue, until it
// admits the Job).
bool jobSuspended(const json& job) {
  if (!job.is_object() || !job.contains("spec") || !job["spec"].is_object()) return false;
  const json& spec = job["spec"];
  return spec.contains("suspend") && spec["suspend"].is_boolean() && spec["suspend"].get<bool>();
}

bool conditionTrue(const api::TrainingJobStatus& s, std::string_view type) {
  const api::Condition* c = api::findCondition(s.conditions, type);
  return c != nullptr && c->status == "True";
}

// The status as the observation alone says, for a job that has not
// finished (aggregateStatus applies the rule for finished ones).
api::TrainingJobStatus fromObservation(const api::TrainingJobStatus& previous,
                                       const Observation& o) {
  api::TrainingJobStatus s = previous;
  s.observedGeneration = o.generation;
  if (o.keyRotation) s.keyRotation = o.keyRotation;
  const std::string& now = o.now;
  auto set = [&](std::string_view type, bool value, const std::string& reason,
                 const std::string& message) {
    api::setCondition(
        s.conditions,
        {std::string(type), value ? "True" : "False", o.generation, "", reason, message}, now);
  };

  if (!o.specErrors.empty()) {
    set(api::kConditionCreated, false, "InvalidSpec", api::joinErrors(o.specErrors));
    s.state = "Invalid";
    return s;
  }

  // Per-region counts; an unreachable region keeps what was last seen.
  std::vector<api::RegionStatus> regions;
  std::vector<std::string> unreachable, noNamespace, failedRegions, restarting, notAdmitted;
  std::string failedMessage;
  int64_t ready = 0, complete = 0, withJob = 0, anyActive = 0;
  for (const RegionObservation& r : o.regions) {
    api::RegionStatus rs;
    for (const auto& p : previous.regions) {
      if (p.name == r.name) rs = p;
    }
    rs.name = r.name;
    rs.reachable = r.reachable;
    if (!r.endpoint.empty()) rs.endpoint = r.endpoint;
    if (!r.missingNamespace.empty()) {
      noNamespace.push_back(r.missingNamespace);
    } else if (!r.reachable) {
      unreachable.push_back(r.name + " (" + r.unreachableReason + ")");
    } else if (!r.job.is_null()) {
      ++withJob;
      rs.ready = count(r.job, "ready");
      rs.active = count(r.job, "active");
      rs.succeeded = count(r.job, "succeeded");
      rs.failed = count(r.job, "failed");
    } else {
      rs.ready = rs.active = rs.succeeded = rs.failed = 0;
      rs.started = false;  // no Job (yet, or any more): the next one starts afresh
    }
    // Every worker ready or done (status.h).
    const bool up = rs.ready + rs.succeeded >= r.replicas;
    if (r.reachable && !r.job.is_null()) {
      // FailureTarget: the Job controller has decided, and deletes the pods
      // before it sets Failed (Kubernetes >= 1.31).
      const json* c = jobCondition(r.job, "Failed");
      if (c == nullptr) c = jobCondition(r.job, "FailureTarget");
      if (c != nullptr) {
        failedRegions.push_back(r.name);
        if (failedMessage.empty()) {
          failedMessage = fmt::format("region {}: {}: {}", r.name, c->value("reason", "Failed"),
                                      c->value("message", ""));
        }
      }
      if (jobCondition(r.job, "Complete") != nullptr) ++complete;
      const bool heldBack = !o.suspended && !finishing(r.job) && jobSuspended(r.job);
      if (heldBack) notAdmitted.push_back(r.name);
      if (o.suspended || finishing(r.job) || heldBack) {
        rs.started = false;
      } else if (up) {
        rs.started = true;
      } else if (rs.started) {
        const int64_t missing = r.replicas - rs.ready - rs.succeeded;
        restarting.push_back(fmt::format(
            "{}: {}/{} workers ready{} ({})", r.name, rs.ready, r.replicas,
            rs.succeeded > 0 ? fmt::format(", {} done", rs.succeeded) : "",
            missing == 1 ? "a worker failed and is being restarted"
                         : fmt::format("{} workers failed and are being restarted", missing)));
      }
    }
    if (up) ++ready;
    anyActive += rs.active;
    regions.push_back(std::move(rs));
  }
  s.regions = std::move(regions);
  const auto total = static_cast<int64_t>(o.regions.size());
  s.regionsReady = fmt::format("{}/{}", ready, total);

  // Created
  if (withJob + static_cast<int64_t>(unreachable.size()) >= total && total > 0 &&
      noNamespace.empty() && o.waitingForGateway.empty()) {
    set(api::kConditionCreated, true, "Created",
        fmt::format("the workloads of all {} regions exist", total));
  } else if (!o.waitingForGateway.empty()) {
    set(api::kConditionCreated, false, "WaitingForGateway",
        fmt::format("waiting for the gateway address of region {}", o.waitingForGateway));
  } else {
    set(api::kConditionCreated, false, "Creating",
        fmt::format("{} of {} regions have their workload", withJob, total));
  }

  set(api::kConditionSuspended, o.suspended, o.suspended ? "Suspended" : "NotSuspended",
      o.suspended ? "spec.runPolicy.suspend is true: the workers are stopped" : "");

  const bool failed = !failedRegions.empty();
  const bool succeeded = !failed && total > 0 && complete == total;
  set(api::kConditionFailed, failed, failed ? "RegionFailed" : "NoFailure",
      failed ? failedMessage : "");
  set(api::kConditionSucceeded, succeeded, succeeded ? "AllRegionsComplete" : "NotComplete",
      succeeded ? fmt::format("all {} regions completed", total) : "");
  if (succeeded && s.completionTime.empty()) s.completionTime = now;
  if (succeeded) s.outputPath = o.outputPath;

  const bool allReady = total > 0 && ready == total;
  // Every region is up or restarting a worker: the job has started and runs
  // on (DTS and swarm train without the missing worker meanwhile, allreduce
  // waits for it), so it stays Running rather than going back to Pending.
  const bool runningDegraded =
      !allReady && total > 0 && ready + static_cast<int64_t>(restarting.size()) == total;
  if (failed || succeeded) {
    set(api::kConditionRunning, false, "Finished", failed ? "a region failed" : "training done");
  } else if (o.suspended) {
    set(api::kConditionRunning, false, "Suspended", "");
  } else if (!notAdmitted.empty()) {
    set(api::kConditionRunning, false, "WaitingForAdmission",
        fmt::format("the Job of {} is suspended by another manager (such as Kueue): waiting "
                    "until every region is admitted",
                    join(notAdmitted, ", ")));
  } else if (allReady) {
    set(api::kConditionRunning, true, "AllWorkersReady",
        fmt::format("every worker of all {} regions is ready", total));
  } else if (runningDegraded) {
    set(api::kConditionRunning, true, "WorkersRestarting",
        "running with fewer workers: " + join(restarting, "; "));
  } else {
    set(api::kConditionRunning, false, "Pending",
        fmt::format("{} of {} regions have all their workers ready", ready, total));
  }
  std::vector<std::string> degraded;
  if (!unreachable.empty()) degraded.push_back("cannot reach: " + join(unreachable, ", "));
  degraded.insert(degraded.end(), noNamespace.begin(), noNamespace.end());
  degraded.insert(degraded.end(), restarting.begin(), restarting.end());
  set(api::kConditionRegionDegraded, !degraded.empty(),
      !unreachable.empty()   ? "RegionUnreachable"
      : !noNamespace.empty() ? "NamespaceMissing"
      : !restarting.empty()  ? "WorkersRestarting"
                             : "AllRegionsHealthy",
      join(degraded, "; "));

  if (anyActive > 0 && s.startTime.empty()) s.startTime = now;
  if (o.progress) s.progress = *o.progress;

  if (failed) {
    s.state = "Failed";
  } else if (succeeded) {
    s.state = "Succeeded";
  } else if (o.suspended) {
    s.state = "Suspended";
  } else if (allReady || runningDegraded) {
    s.state = "Running";
  } else {
    s.state = "Pending";
  }
  return s;
}

}  // namespace

bool isFinished(const api::TrainingJobStatus& status) {
  return conditionTrue(status, api::kConditionSucceeded) ||
         conditionTrue(status, api::kConditionFailed);
}

api::TrainingJobStatus aggregateStatus(const api::TrainingJobStatus& previous,
                                       const Observation& o) {
  if (!isFinished(previous)) return fromObservation(previous, o);
  // Finished (status.h): the observation may only add detail to the same
  // outcome, seen in every region's Job (a FailureTarget's message replaced
  // by the Failed one, the last counts). A Job that is gone (the TTL
  // controller, a user), unreachable, recreated or changed says nothing
  // about a job that is over.
  const bool everyJobSeen =
      !o.regions.empty() && o.specErrors.empty() &&
      std::all_of(o.regions.begin(), o.regions.end(),
                  [](const RegionObservation& r) { return r.reachable && !r.job.is_null(); });
  if (everyJobSeen) {
    api::TrainingJobStatus fresh = fromObservation(previous, o);
    if (isFinished(fresh) && fresh.state == previous.state) return fresh;
  }
  api::TrainingJobStatus s = previous;
  s.observedGeneration = o.generation;
  return s;
}

}  // namespace geo::reconcile
