#pragma once
// The job planner behind `geotrain plan`: before a job runs, what each
// synchronization algorithm would do on the given links with the given
// model -- steps per second, WAN bytes per worker per step, the delay in
// steps, the steps and the time to a target accuracy -- and which one to
// pick.
//
// A model of the exchange, not a simulation. Every worker is taken to
// compute a step in `stepSeconds` (forward, backward and the optimizer:
// what a worker takes without any exchange), plus the codec's work on the
// payloads it encodes and decodes (codecSecondsPerValue per value on one
// core, over coresPerWorker cores); the WAN is each region pair's one-way
// latency (half its round trip) and each worker's uplink rate. For each
// algorithm (docs/algorithms.md):
//
//   allreduce   every step, a synchronous all-gather of the encoded
//               gradient: a step is its compute, the farthest pair's
//               latency and the sender's uplink time for one payload to
//               each rank outside its region (with hierarchical sync, to
//               each other region's leader).
//
// Under hierarchical sync every algorithm's step also holds the region's
// LAN reduce: the leader takes each member's update and sends each the
// result, 2 (m - 1) payloads in the LAN codec through its transport every
// step, each byte encrypted or decrypted once at its end
// (cipherSecondsPerByte, on coresPerWorker cores; Plan::lanSecondsPerStep).
// The LAN's rate and latency are taken as free, and so is the barrier the
// reduce makes of a step: a region goes at its slowest worker's pace.
//   dts         every K steps one round of (R - 1) payloads through the
//               uplink (R: the regions whose leaders exchange), due D steps
//               later. The uplink must carry a round within K steps (else
//               the step stretches to it), and a round must arrive within
//               D steps (else the training thread waits the rest at its due
//               step, once a round). With K and D auto, K and D are what
//               the worker's own rules choose from these figures
//               (sync/auto_rules.h: the same functions, not a copy).
//   swarm       every H steps an exchange with one random peer, which
//               replies: on average two payloads per H steps through the
//               uplink, never waited for.
//
// Steps to the target are the allreduce reference's steps (measured for
// the mlp on Fashion-MNIST to 85%: PlanInput::referenceSteps) times a
// factor for the algorithm, interpolated linearly between the points
// measured in docs/benchmarks.md (dts: by staleness, the age in steps of
// the peers' contributions as they are applied, D under a fixed delay;
// swarm: its one measured H). Beyond the last measured staleness the last
// segment's slope goes on, and the row says it extrapolates. The factors
// were measured with 4 workers; the planner does not scale them with the
// number of workers (more workers average more samples a step, which
// takes fewer steps, not more, for the same model).
//
// Pure functions of plain values: thread-compatible, nothing throws.
// Errors are InvalidArgument naming the field and what is allowed.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "worker/local/topology.h"
#include "worker/sync/exchange_choice.h"
#include "worker/sync/final_average.h"

namespace geo::local {

struct PlanInput {
  std::vector<std::string> regions;
  int64_t workersPerRegion = 1;
  // rttSeconds[i][j]: round trip between regions i and j (symmetric, 0 on
  // the diagonal).
  std::vector<std::vector<double>> rttSeconds;
  double uplinkBytesPerSecond = 0;  // every worker's WAN uplink; 0: unlimited
  // The parameter tensors' sizes (values), in the model's order: tensors
  // below smallTensorThreshold travel as fp32 under qsgd, as the worker
  // sends them.
  std::vector<int64_t> tensorSizes;
  std::string codec = "qsgd";  // identity | fp16 | bf16 | qsgd
  int bits = 4;
  int64_t bucket = 512;
  int64_t smallTensorThreshold = 10000;
  bool hierarchical = true;
  double stepSeconds = 0;  // > 0: one worker's step, without any exchange
  // The synchronizer's encoding and decode-accumulating, per value and
  // payload on one core: 3.3 ns, measured in the workers of geotrain local
  // on this project's 2-core VM (codec ms/step of 4 and 16 workers of the
  // mlp, qsgd-4, K = 16: 3.2 and 3.4 ns a value on a whole core). The
  // kernels alone take 0.5-2 ns (geo_kernels_bench); the rest is the
  // worker's gathering, checks and copies. The cores a worker's codec has:
  // 1 for a worker with a core of its own; 2 / 16 for 16 workers sharing 2.
  double codecSecondsPerValue = 3.3e-9;
  double coresPerWorker = 1;
  // The synchronizer's other work per step, on one core (its polls of the
  // transport, the round's bookkeeping): 0.15-0.18 ms, measured as sync -
  // codec - waiting ms/step in the same runs. Every algorithm but none pays it.
  double syncSecondsPerStep = 0.16e-3;
  // Inside a region under hierarchical sync, every step: the codec the
  // members' updates and their leader's result travel in (sync.lanCodec:
  // identity or bf16), and what sealing or opening one byte of them costs
  // one end on one core -- CurveZMQ's XSalsa20-Poly1305 and libzmq's
  // copies: 1.87-1.96 ns a byte for both ends together, measured by
  // geo_transport_bench (docs/wan-emulation.md). The LAN's rate is taken
  // as unlimited; its encryption is not.
  std::string lanCodec = "identity";
  double cipherSecondsPerByte = 0.95e-9;
  // dts fixed: K and D (nullopt D: the smallest that covers the link);
  // swarm: H. The auto rules' caps.
  int64_t period = 8;
  std::optional<int64_t> delay;
  int64_t swarmH = 4;
  int64_t maxAutoPeriod = 1024;  // as the worker's (sync::Options)
  int64_t maxAutoDelay = 256;
  // Steps allreduce fp32 takes to the target (the reference the factors
  // scale); 205: the mlp to 85% on Fashion-MNIST, 4 workers, Nesterov,
  // the accuracy averaged over ten seeds (docs/benchmarks.md).
  double referenceSteps = 205;
};

// Checks what plan() needs: at least one region, a square symmetric RTT
// matrix of non-negative finite times, workersPerRegion >= 1, tensors of
// positive size, stepSeconds > 0, codecSecondsPerValue >= 0 and
// coresPerWorker > 0, cipherSecondsPerByte >= 0, lanCodec identity or
// bf16, a known codec (qsgd: bits 2, 4 or 8,
// bucket >= 1), period, swarmH and the caps >= 1, delay >= 0,
// referenceSteps > 0.
Status validatePlanInput(const PlanInput& in);

struct PlanRow {
  std::string algorithm;  // "allreduce fp32", "dts K=auto D=auto", ...
  int64_t period = 1;     // K (allreduce: 1; swarm: H)
  int64_t delay = 0;      // D in steps (allreduce and swarm: 0)
  double stepSeconds = 0;
  double codecSeconds = 0;  // of the step: encoding and decoding
  double stepsPerSecond = 0;
  // Bytes one worker sends over the WAN per step: a region's leader's (the
  // busiest worker's) under hierarchical sync.
  double wanBytesPerStep = 0;
  double staleness = 0;  // steps
  double stepsToTarget = 0;
  double secondsToTarget = 0;
  std::string limit;          // "compute", "uplink" or "latency": what sets the step
  bool extrapolated = false;  // the steps factor lies outside what was measured
};

struct Plan {
  std::vector<PlanRow> rows;
  size_t recommended = 0;       // index into rows: the shortest time to the target
  double payloadBytes = 0;      // one encoded update (header and chunking included)
  double fp32PayloadBytes = 0;  // the same in fp32
  double slowestOneWaySeconds = 0;
  // Under hierarchical sync with more than one worker a region: a leader's
  // encryption and decryption of its region's LAN reduce, per step (in
  // every row's stepSeconds).
  double lanSecondsPerStep = 0;
  // The job's end (sync::finalAverageWay, docs/membership.md): every
  // worker's model in fp32 to the coordinator (each through its own
  // uplink), then the average from the coordinator to each of them through
  // its uplink, or in shards each member forwards; or by reduce-scatter
  // among all of them. Not in the time to the target.
  double finalAverageSeconds = 0;
  sync::FinalAverageWay finalAverageWay = sync::FinalAverageWay::kWhole;
  // The members besides the coordinator where the average goes in shards
  // (handed out or by reduce-scatter), or 0: sent whole.
  size_t finalAverageShards = 0;
  // What a job with sync.exchange: auto (and K, D auto) would run once
  // measured: it starts on all-gather and moves where the other promises
  // at least a fifth less time to the target (sync::chooseExchange, the
  // rule its coordinator applies to what it measures).
  sync::Exchange autoExchange = sync::Exchange::kAllGather;
};

// Encoded bytes of one update of `tensorSizes` with the codec (the worker's
// FlatCodec layout), plus the transport's frame headers (one per 64 KiB
// chunk).
double planPayloadBytes(const PlanInput& in, const std::string& codec);

StatusOr<Plan> plan(const PlanInput& in);

// `geotrain plan`'s flags as given (cli.h's addPlanCommand fills them).
struct PlanOptions {
  // --job: a TrainingJob manifest (YAML) that gives the regions, the
  // workers per region, the model and the sync settings. The links still
  // come from the topology flags (a TrainingJob names clusters, not round
  // trips).
  std::string jobFile;
  TopologyOptions topology;      // --preset, --regions, --workers-per-region, --rtt, --uplink
  std::string stepTime;          // --step-time, required: "2.5ms"
  double codecNsPerValue = 3.3;  // --codec-ns-per-value
  double coresPerWorker = 1;     // --cores-per-worker
  std::string model = "mlp";     // --model: mlp or cnn (their tensors), resnet18
  int64_t width = 256;           // --width: the mlp's hidden units
  int64_t parameters = 0;        // --parameters: any model as one tensor of this many values
  std::string codec = "qsgd";
  int bits = 4;
  int64_t bucket = 512;
  bool hierarchical = true;
  std::string lanCodec = "identity";  // --lan-codec
  int64_t period = 8;
  std::optional<int64_t> delay;
  int64_t swarmH = 4;
  double referenceSteps = 205;
};

// The built-in models' parameter tensors for Fashion-MNIST (28x28 inputs,
// one channel, 10 classes), in the order the worker builds them: the mlp
// of `width` hidden units, and the cnn. resnet18 is planned as one tensor
// of its count (its small tensors, batch norm's, are 0.1% of it).
std::vector<int64_t> mlpTensorSizes(int64_t width);
std::vector<int64_t> cnnTensorSizes();
inline constexpr int64_t kResnet18Parameters = 11172810;

// Reads a TrainingJob manifest (YAML, one document) into the options it
// decides: the regions and workers per region (every region must have the
// same replicas), the model and the sync settings, over what the flags
// said. The spec is checked as the controller checks it (parseSpec); its
// errors come back naming the file and each field.
Status applyJobFile(PlanOptions& options);

// The planner's input from the flags: the topology as `geotrain local`
// builds it (same presets, --rtt and --uplink rules and messages), the
// step time parsed, the model's tensors (--parameters wins over --model).
StatusOr<PlanInput> makePlanInput(const PlanOptions& options);

// The table `geotrain plan` prints (fixed-width columns, a line saying which
// row is recommended and why).
std::string formatPlan(const PlanInput& in, const Plan& p);

}  // namespace geo::local
