#pragma once
// Exit codes of geotrain-worker that other programs act on: the Kubernetes
// pod failure policy the controller renders for every worker Job
// (controller/reconcile/render.cc) and the restarts of `geotrain local`
// (worker/local/launcher.cc). 0 is success; anything not listed (1, a
// signal) is a failure that counts against the worker's retries.

namespace geo {

// A configuration that cannot work: retrying the same worker.yaml cannot
// help, so the job fails at once.
inline constexpr int kWorkerExitUsage = 2;

// What the worker depends on went away through no fault of its own -- a
// region member whose leader died (EX_TEMPFAIL) -- and started again it
// rejoins: it is restarted without counting a retry. A member fails each
// time its leader does; counted, its leader's failures used up its retries
// over a long job.
inline constexpr int kWorkerExitRejoin = 75;

}  // namespace geo
