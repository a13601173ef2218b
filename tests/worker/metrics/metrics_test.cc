#include "worker/metrics/worker_metrics.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <cstdlib>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace geo::metrics {
namespace {

// ---- A minimal HTTP/1.1 client ----------------------------------------------------------

std::string dechunk(const std::string& body) {
  std::string out;
  size_t pos = 0;
  while (pos < body.size()) {
    const size_t eol = body.find("\r\n", pos);
    if (eol == std::string::npos) break;
    const size_t n = std::strtoul(body.substr(pos, eol - pos).c_str(), nullptr, 16);
    if (n == 0) break;
    out += body.substr(eol + 2, n);
    pos = eol + 2 + n + 2;
  }
  return out;
}

// GET http://127.0.0.1:<port><path>; the body of a 200 answer, or "" (with a
// test failure) otherwise.
std::string httpGet(uint16_t port, const std::string& path = "/metrics") {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) {
    ADD_FAILURE() << "socket() failed";
    return "";
  }
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    ADD_FAILURE() << "cannot connect to 127.0.0.1:" << port;
    return "";
  }
  const std::string request =
      "GET " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
  for (size_t sent = 0; sent < request.size();) {
    const ssize_t n = ::send(fd, request.data() + sent, request.size() - sent, 0);
    if (n <= 0) break;
    sent += static_cast<size_t>(n);
  }
  std::string response;
  char buf[4096];
  for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) {
    response.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);

  const size_t headerEnd = response.find("\r\n\r\n");
  if (response.rfind("HTTP/1.1 200", 0) != 0 || headerEnd == std::string::npos) {
    ADD_FAILURE() << "bad HTTP answer: " << response.substr(0, 200);
    return "";
  }
  std::string headers = response.substr(0, headerEnd);
  for (char& c : headers) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  const std::string body = response.substr(headerEnd + 4);
  return headers.find("transfer-encoding: chunked") != std::string::npos ? dechunk(body) : body;
}

// ---- A Prometheus text-format (0.0.4) parser ---------------------------------------------

struct Sample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0;
};

struct Exposition {
  std::map<std::string, std::string> type;  // family -> counter|gauge|histogram|...
  std::map<std::string, std::string> help;
  std::vector<Sample> samples;
  std::vector<std::string> errors;  // empty when the text is well formed
};

bool isNameStart(char c) {
  return std::isalpha(static_cast<unsigned char>(c)) || c == '_';
}
bool isNameChar(char c) {
  return isNameStart(c) || std::isdigit(static_cast<unsigned char>(c));
}

// Reads a metric (allowColon) or label name at `pos`.
bool readName(const std::string& s, size_t& pos, std::string& out, bool allowColon) {
  const size_t start = pos;
  if (pos >= s.size() || !(isNameStart(s[pos]) || (allowColon && s[pos] == ':'))) return false;
  while (pos < s.size() && (isNameChar(s[pos]) || (allowColon && s[pos] == ':'))) ++pos;
  out = s.substr(start, pos - start);
  return true;
}

bool parseValue(const std::string& text, double& out) {
  if (text == "+Inf" || text == "Inf") return out = HUGE_VAL, true;
  if (text == "-Inf") return out = -HUGE_VAL, true;
  if (text == "NaN") return out = NAN, true;
  if (text.empty()) return false;
  char* end = nullptr;
  out = std::strtod(text.c_str(), &end);
  return end == text.c_str() + text.size();
}

// The family a sample belongs to: its own name, or the histogram/summary whose
// _bucket/_sum/_count series it is.
std::string familyOf(const Exposition& e, const std::string& name) {
  if (e.type.count(name)) return name;
  for (const char* suffix : {"_bucket", "_sum", "_count"}) {
    const std::string sfx(suffix);
    if (name.size() > sfx.size() && name.compare(name.size() - sfx.size(), sfx.size(), sfx) == 0) {
      const std::string base = name.substr(0, name.size() - sfx.size());
      auto it = e.type.find(base);
      if (it != e.type.end() && (it->second == "histogram" || it->second == "summary")) return base;
    }
  }
  return "";
}

Exposition parseExposition(const std::string& text) {
  Exposition e;
  size_t lineNo = 0;
  size_t start = 0;
  while (start < text.size()) {
    size_t eol = text.find('\n', start);
    if (eol == std::string::npos) {
      e.errors.push_back("text does not end with a newline");
      eol = text.size();
    }
    const std::string line = text.substr(start, eol - start);
    start = eol + 1;
    ++lineNo;
    auto fail = [&](const std::string& why) {
      e.errors.push_back("line " + std::to_string(lineNo) + ": " + why + ": " + line);
    };
    if (line.empty()) continue;
    if (line[0] == '#') {
      const bool isHelp = line.rfind("# HELP ", 0) == 0;
      const bool isType = line.rfind("# TYPE ", 0) == 0;
      if (!isHelp && !isType) continue;  // a plain comment
      size_t pos = 7;
      std::string name;
      if (!readName(line, pos, name, true)) {
        fail("bad metric name");
        continue;
      }
      if (isHelp) {
        if (pos < line.size() && line[pos] != ' ') fail("junk after name");
        if (e.help.count(name)) fail("second HELP");
        e.help[name] = pos < line.size() ? line.substr(pos + 1) : "";
      } else {
        const std::string type = pos < line.size() ? line.substr(pos + 1) : "";
        static const std::set<std::string> kTypes = {"counter", "gauge", "histogram", "summary",
                                                     "untyped"};
        if (pos >= line.size() || line[pos] != ' ' || !kTypes.count(type)) fail("bad TYPE");
        if (e.type.count(name)) fail("second TYPE");
        for (const Sample& s : e.samples) {
          if (s.name == name) fail("TYPE after its samples");
        }
        e.type[name] = type;
      }
      continue;
    }
    Sample s;
    size_t pos = 0;
    if (!readName(line, pos, s.name, true)) {
      fail("bad sample name");
      continue;
    }
    bool ok = true;
    if (pos < line.size() && line[pos] == '{') {
      ++pos;
      while (ok && pos < line.size() && line[pos] != '}') {
        std::string label;
        if (!readName(line, pos, label, false) || line.substr(pos, 2) != "=\"") {
          ok = false;
          break;
        }
        pos += 2;
        std::string value;
        for (; pos < line.size() && line[pos] != '"'; ++pos) {
          if (line[pos] == '\\') {
            ++pos;
            if (pos >= line.size()) break;
            if (line[pos] == 'n') {
              value += '\n';
            } else if (line[pos] == '\\' || line[pos] == '"') {
              value += line[pos];
            } else {
              ok = false;  // only \\, \" and \n are escapes
            }
          } else {
            value += line[pos];
          }
        }
        if (pos >= line.size()) ok = false;  // unterminated value
        ++pos;
        if (!s.labels.emplace(label, value).second) fail("duplicate label " + label);
        if (pos < line.size() && line[pos] == ',') ++pos;
      }
      if (pos >= line.size() || line[pos] != '}') ok = false;
      ++pos;
    }
    if (!ok || pos >= line.size() || line[pos] != ' ') {
      fail("bad labels");
      continue;
    }
    std::string rest = line.substr(pos + 1);
    const size_t space = rest.find(' ');  // an optional timestamp follows
    if (!parseValue(rest.substr(0, space), s.value)) fail("bad value");
    if (familyOf(e, s.name).empty()) fail("sample before its TYPE");
    e.samples.push_back(std::move(s));
  }
  return e;
}

// The one sample named `name` whose labels include `labels`; fails otherwise.
double valueOf(const Exposition& e, const std::string& name,
               const std::map<std::string, std::string>& labels = {}) {
  const Sample* found = nullptr;
  int matches = 0;
  for (const Sample& s : e.samples) {
    if (s.name != name) continue;
    bool all = true;
    for (const auto& [k, v] : labels) {
      auto it = s.labels.find(k);
      all = all && it != s.labels.end() && it->second == v;
    }
    if (all) {
      found = &s;
      ++matches;
    }
  }
  EXPECT_EQ(matches, 1) << name << " with the given labels";
  return found ? found->value : NAN;
}

bool hasSample(const Exposition& e, const std::string& name) {
  for (const Sample& s : e.samples) {
    if (s.name == name) return true;
  }
  return false;
}

// ---- Fixtures --------------------------------------------------------------------------

const WorkerIdentity kId{"demo", "eu-west", 3};

std::unique_ptr<WorkerMetrics> startMetrics() {
  auto m = WorkerMetrics::start(
      "127.0.0.1:0", kId, {{0, "eu-west", false}, {1, "us-east", true}, {2, "ap-south", true}});
  EXPECT_TRUE(m.ok()) << m.status().toString();
  return m.ok() ? std::move(m).value() : nullptr;
}

transport::PeerCounters peer(uint32_t rank, uint64_t sent, uint64_t received, double rtt,
                             uint64_t reconnects = 0) {
  transport::PeerCounters p;
  p.peer = rank;
  p.bytesSent = sent;
  p.bytesReceived = received;
  p.rttSeconds = rtt;
  p.reconnects = reconnects;
  return p;
}

SyncSnapshot syncSnapshot(std::map<size_t, uint64_t> staleness) {
  SyncSnapshot s;
  s.stalenessCounts.assign(65, 0);
  for (const auto& [v, n] : staleness) {
    s.stalenessCounts[v] = n;
    s.appliedUpdates += n;
    s.stalenessSum += static_cast<double>(v * n);
  }
  return s;
}

// ---- Tests -----------------------------------------------------------------------------

TEST(WorkerMetricsTest, ExposesEveryFamilyWithHelpTypeAndLabels) {
  auto m = startMetrics();
  ASSERT_NE(m, nullptr);
  ASSERT_NE(m->port(), 0);
  m->updateTransport({peer(0, 10, 20, 0.001), peer(1, 30, 40, 0.08), peer(2, 50, 60, 0.2)}, {});
  SyncSnapshot s = syncSnapshot({{0, 1}, {2, 1}});
  s.rounds = 1;
  s.roundSecondsCount = 1;
  s.roundSecondsSum = 0.3;
  s.peerUp = {{0, true}, {1, false}, {2, true}};
  s.degradedSeconds = 1.5;
  s.rejoins = 1;
  s.peerRejoins = 2;
  s.stateTransferBytesSent = 700;
  s.stateTransferBytesReceived = 900;
  s.stateTransferSeconds = 0.75;
  s.lateApplied = 3;
  s.lateDropped = 4;
  s.parityChecks = 9;
  s.parityMismatches = 2;
  s.parityRepairs = 1;
  m->updateSync(s);
  m->recordStep(0.02, 1.5, 64);
  m->setStep(41);
  m->setEvalAccuracy(0.5);

  const Exposition e = parseExposition(httpGet(m->port()));
  EXPECT_TRUE(e.errors.empty()) << ::testing::PrintToString(e.errors);

  const std::map<std::string, std::string> expected = {
      {"geotrain_bytes_sent_total", "counter"},
      {"geotrain_bytes_received_total", "counter"},
      {"geotrain_payload_bytes_total", "counter"},
      {"geotrain_encoded_bytes_total", "counter"},
      {"geotrain_update_staleness_steps", "histogram"},
      {"geotrain_sync_round_seconds", "histogram"},
      {"geotrain_peer_rtt_seconds", "gauge"},
      {"geotrain_step_seconds", "histogram"},
      {"geotrain_train_loss", "gauge"},
      {"geotrain_train_step", "gauge"},
      {"geotrain_eval_accuracy", "gauge"},
      {"geotrain_eval_loss", "gauge"},
      {"geotrain_samples_total", "counter"},
      {"geotrain_checkpoint_failures_total", "counter"},
      {"geotrain_codec_seconds_total", "counter"},
      {"geotrain_sync_delay_steps", "gauge"},
      {"geotrain_sync_period_steps", "gauge"},
      {"geotrain_sync_lr_scale", "gauge"},
      {"geotrain_sync_link_seconds", "gauge"},
      {"geotrain_sync_uplink_bytes_per_second", "gauge"},
      {"geotrain_sync_rounds_total", "counter"},
      {"geotrain_sync_missing_total", "counter"},
      {"geotrain_sync_wait_seconds_total", "counter"},
      {"geotrain_transport_refused_total", "counter"},
      {"geotrain_transport_reconnects_total", "counter"},
      {"geotrain_peer_up", "gauge"},
      {"geotrain_degraded_seconds_total", "counter"},
      {"geotrain_rejoins_total", "counter"},
      {"geotrain_peer_rejoins_total", "counter"},
      {"geotrain_state_transfer_bytes_total", "counter"},
      {"geotrain_state_transfer_seconds_total", "counter"},
      {"geotrain_late_updates_total", "counter"},
      {"geotrain_state_parity_checks_total", "counter"},
      {"geotrain_state_parity_mismatches_total", "counter"},
      {"geotrain_state_repairs_total", "counter"},
  };
  for (const auto& [name, type] : expected) {
    EXPECT_EQ(e.type.count(name) ? e.type.at(name) : "<none>", type) << name;
    EXPECT_FALSE(e.help.count(name) == 0 || e.help.at(name).empty()) << name << " has no HELP";
  }
  for (const Sample& sample : e.samples) {
    auto label = [&](const std::string& key) {
      auto it = sample.labels.find(key);
      return it == sample.labels.end() ? std::string("<none>") : it->second;
    };
    const std::string family = familyOf(e, sample.name);
    if (family.rfind("exposer_", 0) == 0) continue;  // the HTTP server's own series
    EXPECT_TRUE(expected.count(family)) << "unexpected family " << family;
    EXPECT_EQ(label("job"), "demo") << sample.name;
    EXPECT_EQ(label("rank"), "3") << sample.name;
    const bool perLink =
        family == "geotrain_bytes_sent_total" || family == "geotrain_bytes_received_total";
    EXPECT_EQ(label("region"), "eu-west") << sample.name;
    if (perLink) {
      EXPECT_NE(label("peer"), "<none>") << sample.name;
      EXPECT_NE(label("peer_region"), "<none>") << sample.name;
      EXPECT_TRUE(label("link") == "wan" || label("link") == "lan") << sample.name;
    }
    if (family == "geotrain_peer_up") {
      EXPECT_NE(label("peer"), "<none>") << sample.name;
      EXPECT_NE(label("peer_region"), "<none>") << sample.name;
      EXPECT_EQ(label("link"), "<none>") << sample.name;
    }
  }

  EXPECT_EQ(valueOf(e, "geotrain_bytes_sent_total",
                    {{"peer", "0"}, {"peer_region", "eu-west"}, {"link", "lan"}}),
            10);
  EXPECT_EQ(valueOf(e, "geotrain_bytes_received_total",
                    {{"peer", "1"}, {"peer_region", "us-east"}, {"link", "wan"}}),
            40);
  EXPECT_DOUBLE_EQ(valueOf(e, "geotrain_peer_rtt_seconds", {{"peer", "1"}}), 0.08);
  EXPECT_EQ(valueOf(e, "geotrain_transport_reconnects_total", {{"peer", "2"}}), 0);
  EXPECT_EQ(valueOf(e, "geotrain_transport_refused_total", {{"reason", "key"}}), 0);
  EXPECT_EQ(valueOf(e, "geotrain_sync_round_seconds_count"), 1);
  EXPECT_DOUBLE_EQ(valueOf(e, "geotrain_sync_round_seconds_sum"), 0.3);
  EXPECT_EQ(valueOf(e, "geotrain_sync_round_seconds_bucket", {{"le", "0.25"}}), 0);
  EXPECT_EQ(valueOf(e, "geotrain_sync_round_seconds_bucket", {{"le", "0.5"}}), 1);
  EXPECT_EQ(valueOf(e, "geotrain_step_seconds_count"), 1);
  EXPECT_DOUBLE_EQ(valueOf(e, "geotrain_train_loss"), 1.5);
  EXPECT_EQ(valueOf(e, "geotrain_train_step"), 41);
  EXPECT_DOUBLE_EQ(valueOf(e, "geotrain_eval_accuracy"), 0.5);
  EXPECT_EQ(valueOf(e, "geotrain_samples_total"), 64);

  EXPECT_EQ(valueOf(e, "geotrain_peer_up", {{"peer", "0"}, {"peer_region", "eu-west"}}), 1);
  EXPECT_EQ(valueOf(e, "geotrain_peer_up", {{"peer", "1"}, {"peer_region", "us-east"}}), 0);
  EXPECT_EQ(valueOf(e, "geotrain_peer_up", {{"peer", "2"}, {"peer_region", "ap-south"}}), 1);
  EXPECT_DOUBLE_EQ(valueOf(e, "geotrain_degraded_seconds_total"), 1.5);
  EXPECT_EQ(valueOf(e, "geotrain_rejoins_total"), 1);
  EXPECT_EQ(valueOf(e, "geotrain_peer_rejoins_total"), 2);
  EXPECT_EQ(valueOf(e, "geotrain_state_transfer_bytes_total", {{"direction", "sent"}}), 700);
  EXPECT_EQ(valueOf(e, "geotrain_state_transfer_bytes_total", {{"direction", "received"}}), 900);
  EXPECT_DOUBLE_EQ(valueOf(e, "geotrain_state_transfer_seconds_total"), 0.75);
  EXPECT_EQ(valueOf(e, "geotrain_late_updates_total", {{"result", "applied"}}), 3);
  EXPECT_EQ(valueOf(e, "geotrain_late_updates_total", {{"result", "dropped"}}), 4);
  EXPECT_EQ(valueOf(e, "geotrain_state_parity_checks_total"), 9);
  EXPECT_EQ(valueOf(e, "geotrain_state_parity_mismatches_total"), 2);
  EXPECT_EQ(valueOf(e, "geotrain_state_repairs_total"), 1);
}

// The membership counters exist from the start, at zero, every label value
// included, so that rate() and increase() answer before the first event.
TEST(WorkerMetricsTest, MembershipCountersStartAtZero) {
  auto m = startMetrics();
  ASSERT_NE(m, nullptr);
  const Exposition e = parseExposition(httpGet(m->port()));
  ASSERT_TRUE(e.errors.empty()) << ::testing::PrintToString(e.errors);
  EXPECT_EQ(valueOf(e, "geotrain_degraded_seconds_total"), 0);
  EXPECT_EQ(valueOf(e, "geotrain_rejoins_total"), 0);
  EXPECT_EQ(valueOf(e, "geotrain_peer_rejoins_total"), 0);
  EXPECT_EQ(valueOf(e, "geotrain_state_transfer_bytes_total", {{"direction", "sent"}}), 0);
  EXPECT_EQ(valueOf(e, "geotrain_state_transfer_bytes_total", {{"direction", "received"}}), 0);
  EXPECT_EQ(valueOf(e, "geotrain_state_transfer_seconds_total"), 0);
  EXPECT_EQ(valueOf(e, "geotrain_late_updates_total", {{"result", "applied"}}), 0);
  EXPECT_EQ(valueOf(e, "geotrain_late_updates_total", {{"result", "dropped"}}), 0);
  // No peer is reported live or dead before the synchronizer says so.
  EXPECT_FALSE(hasSample(e, "geotrain_peer_up"));
}

TEST(WorkerMetricsTest, MembershipCountersFollowTotalsAndNeverDecreaseOnReset) {
  auto m = startMetrics();
  ASSERT_NE(m, nullptr);
  SyncSnapshot s = syncSnapshot({});
  for (uint64_t i = 1; i <= 4; ++i) {
    s.degradedSeconds = 2.5 * static_cast<double>(i);
    s.rejoins = i / 2;
    s.peerRejoins = i;
    s.stateTransferBytesSent = 1000 * i;
    s.stateTransferBytesReceived = 3000 * i;
    s.stateTransferSeconds = 0.5 * static_cast<double>(i);
    s.lateApplied = 2 * i;
    s.lateDropped = i;
    m->updateSync(s);
    m->updateSync(s);  // the same totals again add nothing
  }
  const Exposition before = parseExposition(httpGet(m->port()));
  ASSERT_TRUE(before.errors.empty()) << ::testing::PrintToString(before.errors);
  EXPECT_DOUBLE_EQ(valueOf(before, "geotrain_degraded_seconds_total"), 10);
  EXPECT_EQ(valueOf(before, "geotrain_rejoins_total"), 2);
  EXPECT_EQ(valueOf(before, "geotrain_peer_rejoins_total"), 4);
  EXPECT_EQ(valueOf(before, "geotrain_state_transfer_bytes_total", {{"direction", "sent"}}), 4000);
  EXPECT_EQ(valueOf(before, "geotrain_state_transfer_bytes_total", {{"direction", "received"}}),
            12000);
  EXPECT_DOUBLE_EQ(valueOf(before, "geotrain_state_transfer_seconds_total"), 2);
  EXPECT_EQ(valueOf(before, "geotrain_late_updates_total", {{"result", "applied"}}), 8);
  EXPECT_EQ(valueOf(before, "geotrain_late_updates_total", {{"result", "dropped"}}), 4);

  // The synchronizer is recreated (e.g. the worker rejoined): its totals
  // restart from zero, and each new total is taken as the increment.
  SyncSnapshot restarted = syncSnapshot({});
  restarted.degradedSeconds = 1;
  restarted.rejoins = 1;
  restarted.stateTransferBytesReceived = 500;
  restarted.stateTransferSeconds = 0.25;
  restarted.lateDropped = 1;
  m->updateSync(restarted);
  const Exposition after = parseExposition(httpGet(m->port()));
  ASSERT_TRUE(after.errors.empty()) << ::testing::PrintToString(after.errors);
  EXPECT_DOUBLE_EQ(valueOf(after, "geotrain_degraded_seconds_total"), 11);
  EXPECT_EQ(valueOf(after, "geotrain_rejoins_total"), 3);
  EXPECT_EQ(valueOf(after, "geotrain_peer_rejoins_total"), 4);
  EXPECT_EQ(valueOf(after, "geotrain_state_transfer_bytes_total", {{"direction", "sent"}}), 4000);
  EXPECT_EQ(valueOf(after, "geotrain_state_transfer_bytes_total", {{"direction", "received"}}),
            12500);
  EXPECT_DOUBLE_EQ(valueOf(after, "geotrain_state_transfer_seconds_total"), 2.25);
  EXPECT_EQ(valueOf(after, "geotrain_late_updates_total", {{"result", "applied"}}), 8);
  EXPECT_EQ(valueOf(after, "geotrain_late_updates_total", {{"result", "dropped"}}), 5);

  // Whatever the field, no exported counter went down.
  for (const Sample& b : before.samples) {
    if (familyOf(before, b.name).empty() || before.type.at(familyOf(before, b.name)) != "counter") {
      continue;
    }
    for (const Sample& a : after.samples) {
      if (a.name == b.name && a.labels == b.labels) {
        EXPECT_GE(a.value, b.value) << b.name;
      }
    }
  }

  // Counting on from the restarted totals.
  restarted.rejoins = 2;
  restarted.stateTransferBytesReceived = 800;
  m->updateSync(restarted);
  const Exposition later = parseExposition(httpGet(m->port()));
  EXPECT_EQ(valueOf(later, "geotrain_rejoins_total"), 4);
  EXPECT_EQ(valueOf(later, "geotrain_state_transfer_bytes_total", {{"direction", "received"}}),
            12800);
}

TEST(WorkerMetricsTest, PeerUpFollowsTheLatestPeerList) {
  auto m = startMetrics();
  ASSERT_NE(m, nullptr);
  SyncSnapshot s = syncSnapshot({});
  s.peerUp = {{1, true}, {2, true}};
  m->updateSync(s);
  Exposition e = parseExposition(httpGet(m->port()));
  ASSERT_TRUE(e.errors.empty()) << ::testing::PrintToString(e.errors);
  EXPECT_EQ(valueOf(e, "geotrain_peer_up", {{"peer", "1"}, {"peer_region", "us-east"}}), 1);
  EXPECT_EQ(valueOf(e, "geotrain_peer_up", {{"peer", "2"}, {"peer_region", "ap-south"}}), 1);

  // Peer 2 is suspected; peer 7, not in the start() table, joins the list.
  s.peerUp = {{1, true}, {2, false}, {7, true}};
  m->updateSync(s);
  e = parseExposition(httpGet(m->port()));
  ASSERT_TRUE(e.errors.empty()) << ::testing::PrintToString(e.errors);
  EXPECT_EQ(valueOf(e, "geotrain_peer_up", {{"peer", "2"}}), 0);
  EXPECT_EQ(valueOf(e, "geotrain_peer_up", {{"peer", "7"}, {"peer_region", "unknown"}}), 1);

  // Peer 2 is back; peer 1 is no longer synchronized with: its series goes.
  s.peerUp = {{2, true}, {7, false}};
  m->updateSync(s);
  e = parseExposition(httpGet(m->port()));
  ASSERT_TRUE(e.errors.empty()) << ::testing::PrintToString(e.errors);
  EXPECT_EQ(valueOf(e, "geotrain_peer_up", {{"peer", "2"}}), 1);
  EXPECT_EQ(valueOf(e, "geotrain_peer_up", {{"peer", "7"}}), 0);
  int series = 0;
  for (const Sample& sample : e.samples) {
    if (sample.name != "geotrain_peer_up") continue;
    ++series;
    EXPECT_NE(sample.labels.at("peer"), "1") << "a peer no longer listed keeps its series";
  }
  EXPECT_EQ(series, 2);

  // Listed again, it is back with its labels.
  s.peerUp = {{1, false}, {2, true}, {7, true}};
  m->updateSync(s);
  e = parseExposition(httpGet(m->port()));
  EXPECT_EQ(valueOf(e, "geotrain_peer_up", {{"peer", "1"}, {"peer_region", "us-east"}}), 0);
}

// Refused contributions: one series per (peer, reason), following the
// synchronizer's cumulative counts.
TEST(WorkerMetricsTest, RejectedUpdatesByPeerAndReason) {
  auto m = startMetrics();
  ASSERT_NE(m, nullptr);
  SyncSnapshot s = syncSnapshot({});
  s.rejected = {{2, "non_finite", 3}};
  m->updateSync(s);
  s.rejected = {{2, "non_finite", 5}, {1, "size", 1}};
  m->updateSync(s);
  const Exposition e = parseExposition(httpGet(m->port()));
  ASSERT_TRUE(e.errors.empty()) << ::testing::PrintToString(e.errors);
  EXPECT_EQ(
      valueOf(e, "geotrain_sync_rejected_updates_total", {{"peer", "2"}, {"reason", "non_finite"}}),
      5);
  EXPECT_EQ(valueOf(e, "geotrain_sync_rejected_updates_total", {{"peer", "1"}, {"reason", "size"}}),
            1);
}

// The trainer's running total of failed checkpoint writes becomes a counter
// that never decreases (a new trainer's total counts from zero again).
TEST(WorkerMetricsTest, CheckpointFailuresFollowTheTrainersTotal) {
  auto m = startMetrics();
  ASSERT_NE(m, nullptr);
  m->setCheckpointFailures(0);
  m->setCheckpointFailures(2);
  m->setCheckpointFailures(2);
  m->setCheckpointFailures(1);  // a restarted trainer
  const Exposition e = parseExposition(httpGet(m->port()));
  ASSERT_TRUE(e.errors.empty()) << ::testing::PrintToString(e.errors);
  EXPECT_EQ(valueOf(e, "geotrain_checkpoint_failures_total"), 3);
}

TEST(WorkerMetricsTest, CountersFollowCumulativeTotals) {
  auto m = startMetrics();
  ASSERT_NE(m, nullptr);
  transport::TransportCounters c;
  SyncSnapshot s = syncSnapshot({});
  for (uint64_t i = 1; i <= 5; ++i) {
    c.refusedKeys = i;
    c.handshakeFailures = 2 * i;
    c.framesRejected = 3 * i;
    m->updateTransport({peer(1, 1000 * i, 500 * i, -1, i / 2), peer(2, 7 * i, 9 * i, -1)}, c);
    s.rounds = i;
    s.missing = i / 2;
    s.delay = static_cast<int64_t>(i);
    s.period = static_cast<int64_t>(2 * i);
    s.linkSeconds = 0.1 * static_cast<double>(i);
    s.uplinkBytesPerSecond = 1e5 * static_cast<double>(i);
    s.lrScale = 1.0 / static_cast<double>(i);
    s.payloadBytes = 4000 * i;
    s.encodedBytes = 1000 * i;
    s.waitSeconds = 0.5 * static_cast<double>(i);
    s.codecSeconds = 0.25 * static_cast<double>(i);
    m->updateSync(s);
    // The same totals again add nothing.
    m->updateSync(s);
    m->recordStep(0.01, 2.0 / static_cast<double>(i), 32);
  }
  const Exposition e = parseExposition(httpGet(m->port()));
  ASSERT_TRUE(e.errors.empty()) << ::testing::PrintToString(e.errors);

  EXPECT_EQ(valueOf(e, "geotrain_bytes_sent_total", {{"peer", "1"}}), 5000);
  EXPECT_EQ(valueOf(e, "geotrain_bytes_received_total", {{"peer", "1"}}), 2500);
  EXPECT_EQ(valueOf(e, "geotrain_bytes_sent_total", {{"peer", "2"}}), 35);
  EXPECT_EQ(valueOf(e, "geotrain_bytes_received_total", {{"peer", "2"}}), 45);
  EXPECT_EQ(valueOf(e, "geotrain_transport_reconnects_total", {{"peer", "1"}}), 2);
  EXPECT_EQ(valueOf(e, "geotrain_transport_refused_total", {{"reason", "key"}}), 5);
  EXPECT_EQ(valueOf(e, "geotrain_transport_refused_total", {{"reason", "handshake"}}), 10);
  EXPECT_EQ(valueOf(e, "geotrain_transport_refused_total", {{"reason", "frame"}}), 15);
  EXPECT_FALSE(hasSample(e, "geotrain_peer_rtt_seconds")) << "no RTT measured yet";
  EXPECT_EQ(valueOf(e, "geotrain_sync_rounds_total"), 5);
  EXPECT_EQ(valueOf(e, "geotrain_sync_missing_total"), 2);
  EXPECT_EQ(valueOf(e, "geotrain_sync_delay_steps"), 5);
  EXPECT_EQ(valueOf(e, "geotrain_sync_period_steps"), 10);
  EXPECT_DOUBLE_EQ(valueOf(e, "geotrain_sync_link_seconds"), 0.5);
  EXPECT_DOUBLE_EQ(valueOf(e, "geotrain_sync_uplink_bytes_per_second"), 5e5);
  EXPECT_DOUBLE_EQ(valueOf(e, "geotrain_sync_lr_scale"), 0.2);
  EXPECT_EQ(valueOf(e, "geotrain_payload_bytes_total"), 20000);
  EXPECT_EQ(valueOf(e, "geotrain_encoded_bytes_total"), 5000);
  EXPECT_DOUBLE_EQ(valueOf(e, "geotrain_sync_wait_seconds_total"), 2.5);
  EXPECT_DOUBLE_EQ(valueOf(e, "geotrain_codec_seconds_total"), 1.25);
  EXPECT_EQ(valueOf(e, "geotrain_samples_total"), 160);
  EXPECT_EQ(valueOf(e, "geotrain_step_seconds_count"), 5);
  EXPECT_DOUBLE_EQ(valueOf(e, "geotrain_train_loss"), 0.4);

  // A source that restarts from zero (e.g. a recreated transport) keeps the
  // exported counter growing: the new total is the increment.
  m->updateTransport({peer(1, 300, 0, -1, 2)}, c);
  const Exposition after = parseExposition(httpGet(m->port()));
  EXPECT_EQ(valueOf(after, "geotrain_bytes_sent_total", {{"peer", "1"}}), 5300);
  EXPECT_EQ(valueOf(after, "geotrain_bytes_received_total", {{"peer", "1"}}), 2500);
}

TEST(WorkerMetricsTest, StalenessHistogramCountsAppliedUpdates) {
  auto m = startMetrics();
  ASSERT_NE(m, nullptr);
  // Staleness 64 is the overflow entry (">= 64"): it goes to +Inf.
  SyncSnapshot s = syncSnapshot({{0, 3}, {1, 2}, {3, 4}, {5, 1}, {64, 2}});
  m->updateSync(s);
  SyncSnapshot later = syncSnapshot({{0, 4}, {1, 2}, {3, 4}, {5, 1}, {20, 3}, {64, 2}});
  m->updateSync(later);
  m->updateSync(later);

  const Exposition e = parseExposition(httpGet(m->port()));
  ASSERT_TRUE(e.errors.empty()) << ::testing::PrintToString(e.errors);
  EXPECT_EQ(valueOf(e, "geotrain_update_staleness_steps_count"),
            static_cast<double>(later.appliedUpdates));
  EXPECT_DOUBLE_EQ(valueOf(e, "geotrain_update_staleness_steps_sum"), later.stalenessSum);
  const std::vector<std::pair<std::string, double>> buckets = {
      {"0", 4},   {"1", 6},   {"2", 6},   {"4", 10},   {"8", 11},
      {"16", 11}, {"32", 14}, {"64", 14}, {"+Inf", 16}};
  double previous = 0;
  for (const auto& [le, count] : buckets) {
    const double v = valueOf(e, "geotrain_update_staleness_steps_bucket", {{"le", le}});
    EXPECT_EQ(v, count) << "le=" << le;
    EXPECT_GE(v, previous) << "buckets must be cumulative";
    previous = v;
  }
}

TEST(WorkerMetricsTest, LabelValuesAreEscaped) {
  auto m = WorkerMetrics::start("127.0.0.1:0", {"a \"quoted\"\\job\nx", "r", 0},
                                {{1, "odd\"region", true}});
  ASSERT_TRUE(m.ok()) << m.status().toString();
  (*m)->updateTransport({peer(1, 5, 6, 0.1)}, {});
  const Exposition e = parseExposition(httpGet((*m)->port()));
  ASSERT_TRUE(e.errors.empty()) << ::testing::PrintToString(e.errors);
  EXPECT_EQ(valueOf(e, "geotrain_bytes_sent_total",
                    {{"job", "a \"quoted\"\\job\nx"}, {"peer_region", "odd\"region"}}),
            5);
}

TEST(WorkerMetricsTest, ParserRejectsMalformedText) {
  EXPECT_FALSE(parseExposition("x 1\n").errors.empty()) << "sample before TYPE";
  EXPECT_FALSE(parseExposition("# TYPE x counter\nx{a=\"b} 1\n").errors.empty());
  EXPECT_FALSE(parseExposition("# TYPE x counter\nx{a=b} 1\n").errors.empty());
  EXPECT_FALSE(parseExposition("# TYPE x counter\nx one\n").errors.empty());
  EXPECT_FALSE(parseExposition("# TYPE x widget\n").errors.empty());
  EXPECT_TRUE(parseExposition("# HELP x h\n# TYPE x histogram\nx_bucket{le=\"+Inf\"} 1\n"
                              "x_sum 2.5\nx_count 1\n")
                  .errors.empty());
}

TEST(WorkerMetricsTest, SecondBindOnSamePortFailsNamingTheAddress) {
  auto first = startMetrics();
  ASSERT_NE(first, nullptr);
  const std::string listen = "127.0.0.1:" + std::to_string(first->port());
  auto second = WorkerMetrics::start(listen, kId, {});
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(second.status().message().find(listen), std::string::npos)
      << second.status().toString();
  // The first endpoint still serves.
  EXPECT_FALSE(httpGet(first->port()).empty());
}

TEST(WorkerMetricsTest, MalformedListenAddressIsInvalidArgument) {
  for (const std::string listen : {"9400", ":9400", "host:", "host:port", "host:70000"}) {
    auto m = WorkerMetrics::start(listen, kId, {});
    ASSERT_FALSE(m.ok()) << listen;
    EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument) << listen;
    EXPECT_NE(m.status().message().find(listen), std::string::npos) << m.status().toString();
  }
}

}  // namespace
}  // namespace geo::metrics
