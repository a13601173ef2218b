#pragma once
// The command line of geotrain-controller: its flags, with their defaults
// and per-flag checks (addFlags), and the checks that concern several flags
// or need parsing (checkFlags). Pure: nothing here reads the environment or
// talks to a cluster.
//
// Errors: checkFlags returns INVALID_ARGUMENT naming the flag and what is
// allowed; the caller exits with its usage code.

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "controller/reconcile/clusters.h"

namespace CLI {
class App;
}

namespace geo::controller {

struct ControllerFlags {
  std::string kubeconfig;
  std::string context;
  std::string ns;
  std::vector<std::string> members;
  std::string workerImage;  // the default names the controller's own version
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
  int keyRotationStepSeconds = 150;
  std::string logLevel = "info";
  std::string logFormat = "text";
};

// A whole number of seconds >= `min`, written "15s" or "15"; nullopt when
// it is not one.
std::optional<int> parseSeconds(std::string_view text, int min);

// Registers every flag on `app`, writing into `flags` (which must outlive
// the parse); `flags` holds the defaults the help shows.
void addFlags(CLI::App& app, ControllerFlags& flags);

// After the parse: --renew-deadline below --lease-duration, and every
// --member parsed (reconcile/clusters.h) and named once. Returns the members
// by name.
StatusOr<std::map<std::string, reconcile::MemberSecret>> checkFlags(const ControllerFlags& flags);

}  // namespace geo::controller
