#include "controller/kube/exec_credential.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sodium.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/logging.h"
#include "controller/kube/kube_time.h"

extern char** environ;

namespace geo::kube {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// More output than any credential needs: a runaway plugin is cut off here.
constexpr size_t kMaxOutput = 1 << 20;
// The end of stderr that goes into an error message.
constexpr size_t kStderrTail = 1024;

Status unauthenticated(std::string message) {
  return Status(StatusCode::kUnauthenticated, std::move(message));
}

std::string base64(const std::string& bytes) {
  std::string out(sodium_base64_ENCODED_LEN(bytes.size(), sodium_base64_VARIANT_ORIGINAL), '\0');
  sodium_bin2base64(out.data(), out.size(), reinterpret_cast<const unsigned char*>(bytes.data()),
                    bytes.size(), sodium_base64_VARIANT_ORIGINAL);
  out.resize(std::strlen(out.c_str()));
  return out;
}

std::string tail(const std::string& text) {
  std::string t = text.size() > kStderrTail ? "..." + text.substr(text.size() - kStderrTail) : text;
  while (!t.empty() && (t.back() == '\n' || t.back() == '\r' || t.back() == ' ')) t.pop_back();
  return t;
}

// What KUBERNETES_EXEC_INFO tells the plugin.
std::string execInfo(const ExecConfig& c) {
  json spec = {{"interactive", false}};
  if (c.provideClusterInfo) {
    json cluster = {{"server", c.server}};
    if (!c.caPem.empty()) cluster["certificate-authority-data"] = base64(c.caPem);
    if (c.insecureSkipTlsVerify) cluster["insecure-skip-tls-verify"] = true;
    spec["cluster"] = cluster;
  }
  return json{{"apiVersion", c.apiVersion}, {"kind", "ExecCredential"}, {"spec", spec}}.dump();
}

// The controller's environment with the plugin's variables set over it.
std::vector<std::string> environment(const ExecConfig& c) {
  std::vector<std::pair<std::string, std::string>> overrides = c.env;
  overrides.emplace_back("KUBERNETES_EXEC_INFO", execInfo(c));
  std::vector<std::string> out;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string_view entry(*e);
    const std::string_view name = entry.substr(0, entry.find('='));
    bool replaced = false;
    for (const auto& [key, value] : overrides) replaced = replaced || key == name;
    if (!replaced) out.emplace_back(entry);
  }
  for (const auto& [key, value] : overrides) out.push_back(key + "=" + value);
  return out;
}

struct Output {
  std::string out, err;
  int status = 0;
  bool timedOut = false;
};

// Runs the plugin to completion (or `timeout`), collecting stdout and stderr.
StatusOr<Output> spawn(const ExecConfig& c, const std::string& what) {
  std::string program = c.command;
  if (program.find('/') != std::string::npos && !fs::path(program).is_absolute()) {
    program = (c.dir / program).string();
  }
  std::vector<std::string> argv = {program};
  argv.insert(argv.end(), c.args.begin(), c.args.end());
  std::vector<char*> argvp;
  for (auto& a : argv) argvp.push_back(a.data());
  argvp.push_back(nullptr);
  std::vector<std::string> env = environment(c);
  std::vector<char*> envp;
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);

  std::array<int, 2> out{-1, -1}, err{-1, -1};
  if (::pipe2(out.data(), O_CLOEXEC) != 0 || ::pipe2(err.data(), O_CLOEXEC) != 0) {
    for (int fd : {out[0], out[1], err[0], err[1]})
      if (fd >= 0) ::close(fd);
    return internalError(fmt::format("{}: pipe: {}", what, std::strerror(errno)));
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, err[1], STDERR_FILENO);
  // The controller blocks SIGTERM and SIGINT in every thread (its signal
  // thread waits for them); the plugin must not inherit that.
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none, defaults;
  sigemptyset(&none);
  sigemptyset(&defaults);
  sigaddset(&defaults, SIGPIPE);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  pid_t pid = 0;
  const int spawned =
      ::posix_spawnp(&pid, program.c_str(), &actions, &attr, argvp.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  ::close(out[1]);
  ::close(err[1]);
  if (spawned != 0) {
    ::close(out[0]);
    ::close(err[0]);
    return Status(spawned == ENOENT ? StatusCode::kNotFound : StatusCode::kUnauthenticated,
                  fmt::format("{}: cannot run it: {}", what, std::strerror(spawned)));
  }

  Output result;
  const auto deadline = Clock::now() + c.timeout;
  std::array<pollfd, 2> fds{pollfd{out[0], POLLIN, 0}, pollfd{err[0], POLLIN, 0}};
  std::array<std::string*, 2> sinks{&result.out, &result.err};
  int open = 2;
  while (open > 0) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) {
      result.timedOut = true;
      break;
    }
    if (::poll(fds.data(), fds.size(), static_cast<int>(left)) < 0 && errno != EINTR) break;
    for (size_t i = 0; i < fds.size(); ++i) {
      if (fds[i].fd < 0 || (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
      char buffer[4096];
      const ssize_t n = ::read(fds[i].fd, buffer, sizeof buffer);
      if (n > 0 && sinks[i]->size() < kMaxOutput) {
        sinks[i]->append(buffer, static_cast<size_t>(n));
      } else if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN)) {
        ::close(fds[i].fd);
        fds[i].fd = -1;
        --open;
      }
    }
  }
  for (const pollfd& p : fds)
    if (p.fd >= 0) ::close(p.fd);
  if (result.timedOut) ::kill(pid, SIGKILL);
  while (::waitpid(pid, &result.status, 0) < 0 && errno == EINTR) {
  }
  return result;
}

}  // namespace

StatusOr<ExecCredential> parseExecCredential(const std::string& output,
                                             const std::string& apiVersion) {
  const json doc = json::parse(output, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) {
    return unauthenticated("its output is not a JSON ExecCredential");
  }
  if (doc.value("kind", "") != "ExecCredential") {
    return unauthenticated(
        fmt::format("its output has kind \"{}\", not ExecCredential", doc.value("kind", "")));
  }
  if (doc.value("apiVersion", "") != apiVersion) {
    return unauthenticated(
        fmt::format("its output has apiVersion \"{}\", the kubeconfig asks for {}",
                    doc.value("apiVersion", ""), apiVersion));
  }
  if (!doc.contains("status") || !doc["status"].is_object()) {
    return unauthenticated("its ExecCredential has no status");
  }
  const json& status = doc["status"];
  auto field = [&](const char* name) {
    return status.contains(name) && status[name].is_string() ? status[name].get<std::string>()
                                                             : std::string();
  };
  ExecCredential c;
  c.token = field("token");
  c.clientCertPem = field("clientCertificateData");
  c.clientKeyPem = field("clientKeyData");
  if (c.clientCertPem.empty() != c.clientKeyPem.empty()) {
    return unauthenticated(fmt::format(
        "its ExecCredential has status.{} but not status.{} (a client certificate needs both)",
        c.clientCertPem.empty() ? "clientKeyData" : "clientCertificateData",
        c.clientCertPem.empty() ? "clientCertificateData" : "clientKeyData"));
  }
  if (c.token.empty() && c.clientCertPem.empty()) {
    return unauthenticated(
        "its ExecCredential has neither status.token nor status.clientCertificateData and "
        "status.clientKeyData");
  }
  if (const std::string expiry = field("expirationTimestamp"); !expiry.empty()) {
    c.expiration = parseTime(expiry);
    if (!c.expiration) {
      return unauthenticated(fmt::format(
          "its ExecCredential's status.expirationTimestamp \"{}\" is not an RFC 3339 time",
          expiry));
    }
  }
  return c;
}

ExecCredentialSource::ExecCredentialSource(ExecConfig config) : config_(std::move(config)) {}

StatusOr<ExecCredential> ExecCredentialSource::credentials() {
  std::lock_guard lock(mu_);
  if (current_ && (!current_->expiration ||
                   std::chrono::system_clock::now() + kExpirySkew < *current_->expiration)) {
    return *current_;
  }
  current_.reset();
  ++runs_;
  auto fresh = run();
  if (!fresh.ok()) return fresh.status();
  current_ = *fresh;
  return *current_;
}

void ExecCredentialSource::invalidate(const ExecCredential& stale) {
  std::lock_guard lock(mu_);
  if (current_ && *current_ == stale) current_.reset();
}

int ExecCredentialSource::runs() const {
  std::lock_guard lock(mu_);
  return runs_;
}

StatusOr<ExecCredential> ExecCredentialSource::run() const {
  const std::string what = fmt::format("exec credential plugin {}", config_.command);
  auto output = spawn(config_, what);
  if (!output.ok()) {
    if (output.status().code() != StatusCode::kNotFound) return output.status();
    return unauthenticated(
        output.status().message() +
        (config_.installHint.empty() ? "" : fmt::format(" ({})", tail(config_.installHint))));
  }
  if (output->timedOut) {
    return unauthenticated(
        fmt::format("{}: no answer within {} s (killed)", what, config_.timeout.count() / 1000.0));
  }
  if (!WIFEXITED(output->status) || WEXITSTATUS(output->status) != 0) {
    const std::string how = WIFEXITED(output->status)
                                ? fmt::format("exited {}", WEXITSTATUS(output->status))
                                : fmt::format("killed by signal {}", WTERMSIG(output->status));
    const std::string err = tail(output->err);
    return unauthenticated(
        fmt::format("{}: {}{}", what, how, err.empty() ? "" : fmt::format(": {}", err)));
  }
  auto parsed = parseExecCredential(output->out, config_.apiVersion);
  if (!parsed.ok()) return parsed.status().withContext(what);
  if (parsed->expiration) {
    logger()->debug("{}: new credentials, valid until {}", what, formatTime(*parsed->expiration));
  }
  return parsed;
}

}  // namespace geo::kube
