#include "controller/reconcile/pod_problems.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>

namespace geo::reconcile {

namespace {

using nlohmann::json;

std::string str(const json& o, const char* key) {
  if (!o.is_object()) return "";
  auto it = o.find(key);
  return it != o.end() && it->is_string() ? it->get<std::string>() : "";
}

const json& member(const json& o, const char* key) {
  static const json kNull;
  if (!o.is_object()) return kNull;
  auto it = o.find(key);
  return it != o.end() ? *it : kNull;
}

template <size_t kSize>
bool among(const std::string& s, const std::array<const char*, kSize>& list) {
  return std::any_of(list.begin(), list.end(), [&](const char* item) { return s == item; });
}

// ": <message>" when there is one, so a message never ends in ": ".
std::string detail(const std::string& message) {
  return message.empty() ? "" : ": " + message;
}

// A container's termination as "exited 1 (Error)", with its message.
std::string termination(const json& terminated) {
  const json& code = member(terminated, "exitCode");
  std::string out = code.is_number_integer() ? fmt::format("exited {}", code.get<int64_t>())
                                             : std::string("terminated");
  if (const std::string reason = str(terminated, "reason"); !reason.empty()) {
    out += " (" + reason + ")";
  }
  return out + detail(str(terminated, "message"));
}

}  // namespace

std::vector<Problem> podProblems(const std::string& region, const json& pods) {
  static constexpr std::array<const char*, 4> kPull = {"ErrImagePull", "ImagePullBackOff",
                                                       "InvalidImageName", "ErrImageNeverPull"};
  static constexpr std::array<const char*, 3> kContainer = {
      "CreateContainerConfigError", "CreateContainerError", "RunContainerError"};
  std::vector<Problem> out;
  if (!pods.is_array()) return out;
  for (const json& pod : pods) {
    const json& meta = member(pod, "metadata");
    const json& status = member(pod, "status");
    const std::string name = str(meta, "name");
    const std::string uid = str(meta, "uid").empty() ? name : str(meta, "uid");
    const std::string where = fmt::format("region {}: pod {}", region, name);
    auto add = [&](const std::string& kind, const std::string& reason, const std::string& text) {
      const std::string key = fmt::format("{}/{}", uid, kind);
      if (std::none_of(out.begin(), out.end(), [&](const Problem& p) { return p.key == key; })) {
        out.push_back({key, reason, fmt::format("{}: {}", where, text)});
      }
    };
    std::vector<json> containers;
    for (const char* list : {"initContainerStatuses", "containerStatuses"}) {
      const json& l = member(status, list);
      if (l.is_array()) containers.insert(containers.end(), l.begin(), l.end());
    }
    bool containerReported = false;
    for (const json& c : containers) {
      const std::string container = str(c, "name");
      const json& state = member(c, "state");
      const json& waiting = member(state, "waiting");
      const std::string why = str(waiting, "reason");
      const std::string what =
          fmt::format("container {}: {}{}", container, why, detail(str(waiting, "message")));
      if (among(why, kPull)) {
        add("pull", "WorkerImagePullFailed", what);
        containerReported = true;
      } else if (among(why, kContainer)) {
        add("container", "WorkerContainerError", what);
        containerReported = true;
      } else if (why == "CrashLoopBackOff") {
        add("crashloop", "WorkerCrashLoopBackOff", what);
        containerReported = true;
      }
      for (const char* which : {"state", "lastState"}) {
        const json& terminated = member(member(c, which), "terminated");
        if (str(terminated, "reason") == "OOMKilled") {
          add("oom", "WorkerOOMKilled",
              fmt::format("container {} was killed for using more memory than its limit ({})",
                          container, termination(terminated)));
          containerReported = true;
        }
      }
    }
    const std::string phase = str(status, "phase");
    if (phase == "Failed" && !containerReported) {
      std::string text;
      for (const json& c : containers) {
        const json& terminated = member(member(c, "state"), "terminated");
        const json& code = member(terminated, "exitCode");
        if (code.is_number_integer() && code.get<int64_t>() != 0) {
          text = fmt::format("container {} {}", str(c, "name"), termination(terminated));
          break;
        }
      }
      if (text.empty()) {
        text =
            fmt::format("failed ({}){}",
                        str(status, "reason").empty() ? "no reason given" : str(status, "reason"),
                        detail(str(status, "message")));
      }
      add("failed", "WorkerFailed", text);
    }
    if (phase == "Pending") {
      const json& conditions = member(status, "conditions");
      if (conditions.is_array()) {
        for (const json& c : conditions) {
          if (str(c, "type") == "PodScheduled" && str(c, "status") == "False" &&
              str(c, "reason") == "Unschedulable") {
            add("unschedulable", "WorkerUnschedulable",
                "cannot be scheduled" + detail(str(c, "message")));
          }
        }
      }
    }
  }
  return out;
}

std::vector<Problem> jobProblems(const std::string& region, const json& job) {
  const json& conditions = member(member(job, "status"), "conditions");
  if (!conditions.is_array()) return {};
  const std::string name = str(member(job, "metadata"), "name");
  const std::string uid =
      str(member(job, "metadata"), "uid").empty() ? name : str(member(job, "metadata"), "uid");
  for (const char* type : {"Failed", "FailureTarget"}) {
    for (const json& c : conditions) {
      if (str(c, "type") != type || str(c, "status") != "True") continue;
      return {{uid + "/failed", "RegionJobFailed",
               fmt::format("region {}: Job {} failed: {}{}", region, name,
                           str(c, "reason").empty() ? "no reason given" : str(c, "reason"),
                           detail(str(c, "message")))}};
    }
  }
  return {};
}

}  // namespace geo::reconcile
