#include "controller/app/flags.h"

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <charconv>

namespace geo::controller {

namespace {

// A duration flag in whole seconds ("15s"): one validator for every such
// flag, so that they accept and refuse the same spellings.
void addSecondsFlag(CLI::App& app, const std::string& name, int& target, int min,
                    const std::string& help, const std::string& example) {
  app.add_option_function<std::string>(
         name, [&target, min](const std::string& v) { target = *parseSeconds(v, min); }, help)
      ->check(CLI::Validator(
          [min, example](std::string& v) {
            return parseSeconds(v, min)
                       ? std::string()
                       : fmt::format("a whole number of seconds >= {}, e.g. {}", min, example);
          },
          "SECONDS"));
}

}  // namespace

std::optional<int> parseSeconds(std::string_view text, int min) {
  if (!text.empty() && text.back() == 's') text.remove_suffix(1);
  if (text.empty() || text.find_first_not_of("0123456789") != std::string_view::npos)
    return std::nullopt;
  int value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size() || value < min) return std::nullopt;
  return value;
}

void addFlags(CLI::App& app, ControllerFlags& f) {
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
  addSecondsFlag(app, "--lease-duration", f.leaseDurationSeconds, 2,
                 "seconds a leader's Lease lasts without renewal, e.g. 15s", "15s");
  addSecondsFlag(app, "--renew-deadline", f.renewDeadlineSeconds, 1,
                 "seconds the leader keeps trying to renew before it steps down, e.g. 10s", "10s");
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
  app.add_option("--key-rotation-step", f.keyRotationStepSeconds,
                 "seconds each phase of a key rotation (annotation geotrain.io/rotate-keys) lasts "
                 "once every region has its files: at least the kubelet's time to update a "
                 "mounted ConfigMap or Secret (its sync period plus its cache's TTL)")
      ->check(CLI::Range(1, 24 * 3600))
      ->capture_default_str();
  app.add_option("--log-level", f.logLevel, "trace, debug, info, warn, error, critical or off")
      ->capture_default_str();
  app.add_option("--log-format", f.logFormat,
                 "text, or json: one object a line (time, level, msg) for log collectors")
      ->capture_default_str();
}

StatusOr<std::map<std::string, reconcile::MemberSecret>> checkFlags(const ControllerFlags& f) {
  if (f.renewDeadlineSeconds >= f.leaseDurationSeconds) {
    return invalidArgument(
        fmt::format("--renew-deadline {}s is not allowed (allowed: less than --lease-duration {}s)",
                    f.renewDeadlineSeconds, f.leaseDurationSeconds));
  }
  std::map<std::string, reconcile::MemberSecret> members;
  for (const std::string& m : f.members) {
    auto parsed = reconcile::parseMemberFlag(m);
    if (!parsed.ok()) return parsed.status();
    if (!members.emplace(parsed->first, parsed->second).second) {
      return invalidArgument("--member " + parsed->first + " is given twice");
    }
  }
  return members;
}

}  // namespace geo::controller
