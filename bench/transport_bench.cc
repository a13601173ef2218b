// Loopback transport benchmark: throughput of 64 MiB messages and round-trip
// latency of 64-byte messages, with CURVE encryption and without, in the same
// run (ratios travel between machines; absolute numbers do not).
//
//   geo_transport_bench [--messages 8] [--size-mib 64] [--pings 2000]
//                       [--only plaintext|curve]
//
// Target (issue "Secure transport"): encrypted >= 50% of plaintext throughput.
// Plaintext uses the test-only build of the transport (product builds refuse
// encrypt = false).
//
// Besides the throughput, each mode prints where the CPU went, so the ratio
// can be explained on any machine rather than guessed at:
//   - CPU ns/B: the process's CPU time (user + system, every thread) per
//     payload byte over the throughput repetitions;
//   - busiest thread: the thread with the most CPU time, the share of the
//     wall time it was running and its CPU ns per payload byte. libzmq does a
//     connection's socket I/O and CURVE on one I/O thread ("ZMQbg/IO/0"); at
//     ~100% busy it is the bottleneck;
// and the cipher CURVE is bound to (RFC 26: XSalsa20-Poly1305 through
// libsodium's crypto_box_*_afternm, what libzmq calls per frame) is timed
// alone on one core over 4 MiB frames, the transport's frame size. The
// encrypting and the decrypting I/O thread each pay one of those on top of the
// socket work the plaintext I/O threads do. The last lines split the mean
// ratio into CPU per byte and cores in use.

#include <dirent.h>
#include <sodium.h>
#include <sys/resource.h>
#include <unistd.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "tests/worker/transport/transport_fixture.h"
#include "worker/transport/zmq_transport.h"

using namespace geo::transport;
using Seconds = std::chrono::duration<double>;

namespace {

struct Pair {
  std::unique_ptr<Transport> a, b;
};

Pair makePair(bool encrypt) {
  testing::World w(2);
  auto ca = w.config(0);
  auto cb = w.config(1);
  ca.encrypt = cb.encrypt = encrypt;
  ca.pingInterval = cb.pingInterval = std::chrono::milliseconds(0);
  auto a = makeZmqTransport(ca);
  auto b = makeZmqTransport(cb);
  if (!a.ok() || !b.ok()) {
    std::fprintf(stderr, "setup failed: %s %s\n", a.status().toString().c_str(),
                 b.status().toString().c_str());
    std::exit(1);
  }
  return {std::move(*a), std::move(*b)};
}

// CPU seconds (user + system) of the whole process so far.
double processCpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

struct ThreadTimes {
  std::string name;
  double cpuSeconds = 0;
};

// CPU seconds of every thread of this process, by thread id, from
// /proc/self/task/TID/stat (utime + stime in clock ticks, fields 14 and 15;
// the name is field 2, in parentheses, and may itself hold spaces).
std::map<int, ThreadTimes> threadTimes() {
  std::map<int, ThreadTimes> out;
  const double tick = 1.0 / static_cast<double>(sysconf(_SC_CLK_TCK));
  DIR* dir = opendir("/proc/self/task");
  if (dir == nullptr) return out;
  while (const dirent* e = readdir(dir)) {
    if (e->d_name[0] == '.') continue;
    std::ifstream in(std::string("/proc/self/task/") + e->d_name + "/stat");
    std::string line;
    if (!std::getline(in, line)) continue;
    const auto open = line.find('(');
    const auto close = line.rfind(')');
    if (open == std::string::npos || close == std::string::npos) continue;
    std::istringstream rest(line.substr(close + 2));
    std::string field;
    unsigned long long utime = 0, stime = 0;
    for (int i = 3; i <= 15 && rest >> field; ++i) {  // field 3 is the state
      if (i == 14) utime = std::stoull(field);
      if (i == 15) stime = std::stoull(field);
    }
    out[std::atoi(e->d_name)] = {line.substr(open + 1, close - open - 1),
                                 static_cast<double>(utime + stime) * tick};
  }
  closedir(dir);
  return out;
}

struct Throughput {
  double gbps = 0;              // best of the repetitions
  double meanGbps = 0;          // all the repetitions together
  double cpuNsPerByte = 0;      // every thread, over all repetitions
  std::string busiestName;      // the thread with the most CPU time
  double busiestShare = 0;      // its CPU time / wall time
  double busiestNsPerByte = 0;  // its CPU ns per payload byte
  // Cores kept busy on average over the repetitions (ns/B x GB/s).
  double cores() const { return cpuNsPerByte * meanGbps; }
};

// Failed sends and receives; any makes the run exit with status 1.
int failures = 0;

// Sends `messages` messages of `payload` from a to b and waits for them all.
void exchange(Pair& p, int messages, const Payload& payload, uint64_t& round) {
  const uint64_t first = round;
  for (int i = 0; i < messages; ++i) {
    auto st =
        p.a->send(1, MessageKind::kUpdate, {.round = round++}, payload, std::chrono::seconds(60));
    if (!st.ok()) {
      std::fprintf(stderr, "send: %s\n", st.toString().c_str());
      ++failures;
    }
  }
  for (int i = 0; i < messages; ++i) {
    auto m = p.b->receive(MessageKind::kUpdate, first + i, 0, std::chrono::seconds(10));
    if (!m.ok()) {
      std::fprintf(stderr, "receive: %s\n", m.status().toString().c_str());
      ++failures;
      // What each end saw, to tell a lost message from a refused one.
      for (const Transport* t : {p.a.get(), p.b.get()}) {
        const auto c = t->counters();
        for (const auto& pc : t->peerCounters()) {
          std::fprintf(stderr,
                       "  rank %u -> %u: sent %llu B in %llu, received %llu B in %llu, queued "
                       "%llu B, reconnects %llu; frames rejected %llu (%s)\n",
                       t->rank(), pc.peer, static_cast<unsigned long long>(pc.bytesSent),
                       static_cast<unsigned long long>(pc.messagesSent),
                       static_cast<unsigned long long>(pc.bytesReceived),
                       static_cast<unsigned long long>(pc.messagesReceived),
                       static_cast<unsigned long long>(pc.queuedBytes),
                       static_cast<unsigned long long>(pc.reconnects),
                       static_cast<unsigned long long>(c.framesRejected),
                       c.lastRejectReason.c_str());
        }
      }
      return;
    }
  }
}

// Throughput of `messages` messages of `bytes` from a to b: one unmeasured
// repetition (it fills the buffer pools and grows the TCP windows: about a
// third of the steady rate), then best of 3, and where the CPU went over the
// three.
Throughput throughput(Pair& p, int messages, size_t bytes, uint64_t& round) {
  const Payload payload(testing::pattern(bytes, 1));  // shared, never copied
  exchange(p, messages, payload, round);
  Throughput r;
  const auto threads0 = threadTimes();
  const double cpu0 = processCpuSeconds();
  const auto start = std::chrono::steady_clock::now();
  for (int rep = 0; rep < 3; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    exchange(p, messages, payload, round);
    const double s = Seconds(std::chrono::steady_clock::now() - t0).count();
    r.gbps = std::max(r.gbps, static_cast<double>(messages) * bytes / s / 1e9);
  }
  const double wall = Seconds(std::chrono::steady_clock::now() - start).count();
  const double total = 3.0 * messages * static_cast<double>(bytes);
  r.meanGbps = total / wall / 1e9;
  r.cpuNsPerByte = (processCpuSeconds() - cpu0) / total * 1e9;
  double busiest = -1;
  for (const auto& [tid, t] : threadTimes()) {
    const auto before = threads0.find(tid);
    const double used = t.cpuSeconds - (before == threads0.end() ? 0 : before->second.cpuSeconds);
    if (used > busiest) {
      busiest = used;
      r.busiestName = t.name;
    }
  }
  r.busiestShare = busiest / wall;
  r.busiestNsPerByte = busiest / total * 1e9;
  return r;
}

// GB/s of libsodium's crypto_box_easy_afternm (seal) and
// crypto_box_open_easy_afternm (open) on one core over `frame`-byte frames,
// about `seconds` each.
std::pair<double, double> cipherGbps(size_t frame, double seconds) {
  if (sodium_init() < 0) return {0, 0};
  unsigned char pk[crypto_box_PUBLICKEYBYTES], sk[crypto_box_SECRETKEYBYTES];
  unsigned char key[crypto_box_BEFORENMBYTES], nonce[crypto_box_NONCEBYTES] = {};
  crypto_box_keypair(pk, sk);
  if (crypto_box_beforenm(key, pk, sk) != 0) return {0, 0};
  std::vector<unsigned char> plain(frame, 0x5a), boxed(frame + crypto_box_MACBYTES);
  auto rate = [&](auto&& op) {
    size_t done = 0;
    const auto t0 = std::chrono::steady_clock::now();
    double s = 0;
    while (s < seconds) {
      for (int i = 0; i < 8; ++i) op();
      done += 8 * frame;
      s = Seconds(std::chrono::steady_clock::now() - t0).count();
    }
    return static_cast<double>(done) / s / 1e9;
  };
  const double seal = rate([&] {
    sodium_increment(nonce, sizeof nonce);
    crypto_box_easy_afternm(boxed.data(), plain.data(), frame, nonce, key);
  });
  bool opened = true;
  const double open = rate([&] {
    opened &=
        crypto_box_open_easy_afternm(plain.data(), boxed.data(), boxed.size(), nonce, key) == 0;
  });
  return {seal, opened ? open : 0};
}

// Round-trip times of `pings` 64-byte echoes, sorted.
std::vector<double> roundTrips(Pair& p, int pings, uint64_t& round) {
  std::vector<double> rtt;
  const auto payload = testing::pattern(64, 2);
  for (int i = 0; i < pings; ++i) {
    const uint64_t r = round++;
    const auto t0 = std::chrono::steady_clock::now();
    (void)p.a->send(1, MessageKind::kUpdate, {.round = r}, Payload(payload),
                    std::chrono::seconds(5));
    auto m = p.b->receive(MessageKind::kUpdate, r, 0, std::chrono::seconds(5));
    if (!m.ok()) {
      ++failures;
      continue;
    }
    (void)p.b->send(0, MessageKind::kUpdate, {.round = r}, Payload::copyOf(m->payload.bytes()),
                    std::chrono::seconds(5));
    if (!p.a->receive(MessageKind::kUpdate, r, 1, std::chrono::seconds(5)).ok()) {
      ++failures;
      continue;
    }
    rtt.push_back(Seconds(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(rtt.begin(), rtt.end());
  return rtt;
}

double percentile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  return sorted[std::min(sorted.size() - 1, static_cast<size_t>(q * sorted.size()))];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("geotrain transport benchmark: loopback throughput and latency, CURVE vs plaintext");
  int messages = 8;
  int sizeMiB = 64;
  int pings = 2000;
  std::string only;
  app.add_option("--messages", messages, "messages per throughput repetition")
      ->check(CLI::PositiveNumber);
  app.add_option("--size-mib", sizeMiB, "message size in MiB")->check(CLI::PositiveNumber);
  app.add_option("--pings", pings, "round trips for the latency figures")
      ->check(CLI::PositiveNumber);
  app.add_option("--only", only, "run one mode only (for profiling): plaintext or curve")
      ->check(CLI::IsMember({"plaintext", "curve"}));
  CLI11_PARSE(app, argc, argv);

  std::printf("%-10s %9s %9s %8s  %-25s %10s %10s\n", "mode", "best GB/s", "mean GB/s", "CPU ns/B",
              "busiest thread, busy ns/B", "RTT p50", "RTT p99");
  Throughput t[2];
  for (bool encrypt : {false, true}) {
    if (!only.empty() && only != (encrypt ? "curve" : "plaintext")) continue;
    Pair p = makePair(encrypt);
    uint64_t round = 0;
    (void)roundTrips(p, 10, round);  // connect and warm up
    t[encrypt] = throughput(p, messages, static_cast<size_t>(sizeMiB) << 20, round);
    const auto rtt = roundTrips(p, pings, round);
    const Throughput& m = t[encrypt];
    std::printf("%-10s %9.3f %9.3f %8.2f  %-12.12s %5.0f%% %6.2f %7.1f us %7.1f us\n",
                encrypt ? "curve" : "plaintext", m.gbps, m.meanGbps, m.cpuNsPerByte,
                m.busiestName.c_str(), m.busiestShare * 100, m.busiestNsPerByte,
                percentile(rtt, 0.5) * 1e6, percentile(rtt, 0.99) * 1e6);
  }
  const auto [seal, open] = cipherGbps(size_t{4} << 20, 0.5);
  std::printf(
      "XSalsa20-Poly1305 alone, one core, 4 MiB frames: seal %.2f GB/s (%.2f ns/B), "
      "open %.2f GB/s (%.2f ns/B)\n",
      seal, 1 / seal, open, 1 / open);
  if (only.empty()) {
    std::printf("encrypted / plaintext throughput: %.2fx (best), %.2fx (mean)\n",
                t[1].gbps / t[0].gbps, t[1].meanGbps / t[0].meanGbps);
    // Throughput is cores in use / CPU per byte, so the mean ratio splits
    // exactly into the two: how much more CPU CURVE spends per byte (the
    // cipher is timed above) and how many more cores it keeps busy.
    const double cpu = t[0].cpuNsPerByte / t[1].cpuNsPerByte;
    const double cores = t[1].cores() / t[0].cores();
    std::printf(
        "mean ratio = CPU per byte plaintext / curve x cores in use curve / plaintext "
        "= %.2f x (%.2f / %.2f) = %.2fx\n",
        cpu, t[1].cores(), t[0].cores(), cpu * cores);
    std::printf(
        "CPU per byte: curve %.2f ns/B, plaintext + seal + open %.2f + %.2f + %.2f = %.2f ns/B\n",
        t[1].cpuNsPerByte, t[0].cpuNsPerByte, 1 / seal, 1 / open,
        t[0].cpuNsPerByte + 1 / seal + 1 / open);
  }
  if (failures > 0) std::fprintf(stderr, "%d sends or receives failed\n", failures);
  return failures > 0 ? 1 : 0;
}
