#include "worker/local/cli.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <string>
#include <string_view>
#include <utility>

#include "common/worker_config.h"
#include "common/worker_schema.h"
#include "worker/local/topology.h"

namespace geo::local {
namespace {

// The help text of a flag that sets a worker.yaml key: what it is, the key,
// and its default (the config's, else the schema's).
template <typename T>
std::string keyHelp(std::string_view what, std::string_view key, const T& builtin) {
  return fmt::format("{} ({}; default: the config's, built-in {})", what, key, builtin);
}

// "0.001 to 1000000": the inclusive range of a worker.yaml key with both
// bounds, from the schema.
std::string rangeText(std::string_view path) {
  auto key = geo::lookupWorkerKey(path);
  GEO_ENFORCE(key.ok() && (*key)->limits.minimum && (*key)->limits.maximum,
              "{} has no range in the worker.yaml schema", path);
  return fmt::format("{} to {}", *(*key)->limits.minimum, *(*key)->limits.maximum);
}

}  // namespace

CLI::App* addLocalCommand(CLI::App& app, LocalOptions& options, std::function<void()> onParsed) {
  CLI::App* local = app.add_subcommand(
      "local",
      "Run a whole multi-region training job as processes on this machine, with an emulated WAN "
      "between the regions");
  const geo::WorkerConfig d;  // the schema's defaults, quoted in the help

  // A flag that sets one worker.yaml key, applied with the same checks and
  // messages as the file (see worker/local/options.h for the order).
  auto keyFlag = [&](const char* flag, const char* type, const std::string& help) {
    local
        ->add_option_function<std::string>(
            flag,
            [&options, flag](const std::string& v) { options.keyFlags.emplace_back(flag, v); },
            help)
        ->type_name(type);
  };

  local
      ->add_option("--config,-c", options.configFile,
                   "worker.yaml every worker starts from (default: none, the built-in "
                   "defaults; see docs/worker-config.md)")
      ->type_name("FILE");
  local
      ->add_option("--set", options.sets,
                   "Override one worker.yaml key, e.g. --set training.momentum=0.8 (repeatable; "
                   "applied after --config and before the flags below; default: none)")
      ->type_name("KEY=VALUE");
  local
      ->add_option_function<std::string>(
          "--regions", [&options](const std::string& v) { options.regions = v; },
          fmt::format("Comma-separated region names, unique lowercase DNS labels (at most {}); "
                      "ranks are assigned region by region in this order (default: the "
                      "preset's: world and lan london,tokyo,oregon,ohio; world16 its 16 regions)",
                      kMaxLocalWorkers))
      ->type_name("LIST");
  local
      ->add_option("--workers-per-region", options.workersPerRegion,
                   fmt::format("Workers in each region (>= 1; at most {} workers in all regions "
                               "together); local index 0 leads its region",
                               kMaxLocalWorkers))
      ->type_name("N")
      ->capture_default_str();
  keyFlag("--algorithm", "NAME",
          fmt::format("Synchronizer: {} (sync.algorithm; default: {}, unless --config or --set "
                      "chooses another one than none)",
                      geo::workerKeyChoices("sync.algorithm"), kDefaultAlgorithm));
  keyFlag("--period", "K|auto",
          keyHelp("DTS period in steps, or auto to choose it from the measured link", "sync.period",
                  d.sync.period ? std::to_string(*d.sync.period) : std::string("auto")));
  keyFlag("--delay", "D|auto",
          keyHelp("DTS delay in steps, or auto to derive it from the measured link", "sync.delay",
                  d.sync.delay ? std::to_string(*d.sync.delay) : std::string("auto")));
  keyFlag(
      "--exchange", "NAME",
      keyHelp("DTS: how a round's contributions meet: " + geo::workerKeyChoices("sync.exchange") +
                  " (reducescatter: each region's uplink carries 2 (N - 1) / N payloads a "
                  "round, not N - 1, over two hops; auto: chosen at run time from the measured "
                  "links)",
              "sync.exchange", d.sync.exchange));
  keyFlag("--swarm-h", "H",
          keyHelp("SwarmSGD local steps between exchanges", "sync.swarmH", d.sync.swarmH));
  keyFlag("--codec", "NAME",
          keyHelp("WAN codec: " + geo::workerKeyChoices("sync.codec"), "sync.codec", d.sync.codec));
  keyFlag("--bits", "B",
          keyHelp("QSGD bits per value: " + geo::workerKeyChoices("sync.bits"), "sync.bits",
                  d.sync.bits));
  keyFlag("--hierarchical", "true|false",
          keyHelp("Reduce inside each region before the WAN", "sync.hierarchical",
                  d.sync.hierarchical));
  keyFlag("--timeout-seconds", "S",
          keyHelp(fmt::format("Seconds ({}) a silent peer may take before the round fails",
                              rangeText("sync.timeoutSeconds")),
                  "sync.timeoutSeconds", d.sync.timeoutSeconds));
  keyFlag("--steps", "N", keyHelp("Training steps", "training.steps", d.training.steps));
  keyFlag("--model", "NAME",
          keyHelp("Built-in model: " + geo::workerKeyChoices("model.builtin") +
                      " (gpt: on dataset.name tokens with training.loss next-token, which it "
                      "sets; dataset.path names the folder with train.bin and val.bin, e.g. from "
                      "scripts/prepare-text.py)",
                  "model.builtin", d.model.builtin));
  keyFlag("--batch-size", "N",
          keyHelp("Samples per step and worker", "training.batchSize", d.training.batchSize));
  keyFlag("--lr", "LR", keyHelp("Learning rate", "training.lr", d.training.lr));
  keyFlag("--eval-interval", "N",
          keyHelp("Steps between evaluations, 0 = only at the end", "training.evalInterval",
                  d.training.evalInterval));
  keyFlag("--threads", "N",
          fmt::format("Intra-op threads per worker, 0..{} (training.threads; default: the "
                      "config's when it sets one, else max(1, hardware cores / workers))",
                      geo::kMaxThreads));
  local
      ->add_option("--preset", options.preset,
                   "Emulated network: world (round trips london-tokyo 230 ms, london-oregon "
                   "140, london-ohio 90, tokyo-oregon 100, tokyo-ohio 160, oregon-ohio 50; "
                   "100mbit uplink), world16 (16 AWS regions, virginia to sydney, round trips "
                   "11-327 ms from cloudping.co, docs/data/world16-rtt.csv; 100mbit uplink) or "
                   "lan (no delay, no limit)")
      ->type_name("NAME")
      ->capture_default_str();
  local
      ->add_option("--rtt", options.rtt,
                   "Round-trip time of one region pair, e.g. london-tokyo=230ms (us, ms or s; "
                   "repeatable; needed for every pair the preset does not know; default: the "
                   "preset's)")
      ->type_name("A-B=TIME");
  local
      ->add_option_function<std::string>(
          "--uplink", [&options](const std::string& v) { options.uplink = v; },
          "WAN uplink of each worker (under --network netns: of each region, shared by its "
          "workers), e.g. 100mbit (bit, kbit, mbit or gbit per second); 0 or none = unlimited "
          "(default: the preset's, world and world16 100mbit, lan unlimited)")
      ->type_name("RATE");
  local
      ->add_option("--network", options.network.mode,
                   "What carries the WAN: userspace (the transport delays and shapes whole "
                   "messages above TCP; no privileges) or netns (each region in a network "
                   "namespace of its own, every packet between regions through an emulator "
                   "below TCP: real TCP retransmissions, socket buffers and queues; hosts tuned "
                   "for the WAN, connections between regions opening with a window of the "
                   "links' bandwidth-delay product over bbr's startup gain, 100 to 1000 "
                   "segments (transport.tcpInitialWindow; 689 on the world preset; --set "
                   "transport.tcpInitialWindow=10 for Linux's); needs root)")
      ->type_name("MODE")
      ->capture_default_str();
  local
      ->add_option("--loss", options.network.loss,
                   "netns only: the share of packets a region's uplink loses, e.g. 1% for every "
                   "region or tokyo=0.5% for one (repeatable; default: none)")
      ->type_name("[REGION=]PERCENT%");
  local
      ->add_option_function<std::string>(
          "--jitter", [&options](const std::string& v) { options.network.jitter = v; },
          "netns only: every packet between regions takes up to this much longer, uniformly "
          "drawn, in order (e.g. 5ms; default: none)")
      ->type_name("TIME");
  local
      ->add_option_function<std::string>(
          "--downlink", [&options](const std::string& v) { options.network.downlink = v; },
          "netns only: every region's downlink, e.g. 200mbit (default: unlimited)")
      ->type_name("RATE");
  local
      ->add_option_function<std::string>(
          "--queue", [&options](const std::string& v) { options.network.queue = v; },
          fmt::format("netns only: the longest a packet waits for a region's uplink or downlink "
                      "before the link drops it (its buffer; default: {}ms)",
                      static_cast<int>(kDefaultQueueSeconds * 1000)))
      ->type_name("TIME");
  local
      ->add_option("--out,-o", options.out,
                   "Run folder, new or empty (default: runs/<YYYYmmdd-HHMMSS>)")
      ->type_name("DIR");
  local
      ->add_option("--csv", options.csv,
                   "Time series CSV, one row per progress event (default: <out>/progress.csv)")
      ->type_name("FILE");
  local
      ->add_option("--plot", options.plot,
                   "Also draw eval accuracy against wall time, one line per region, into this "
                   "PNG with gnuplot (Debian package gnuplot-nox; default: no plot)")
      ->type_name("FILE.png");
  local
      ->add_option("--prometheus-config", options.prometheusConfig,
                   "Write a Prometheus scrape config for the workers' /metrics endpoints here "
                   "(prometheus --config.file=FILE; default: none)")
      ->type_name("FILE");
  local
      ->add_option("--kill", options.faults.kill,
                   "Fault injection: SIGKILL a worker at a time after launch, e.g. tokyo@20s, or "
                   "tokyo:1@20s for local index 1 (repeatable; default index 0, the leader)")
      ->type_name("REGION[:I]@TIME");
  local
      ->add_option_function<std::string>(
          "--restart-after", [&options](const std::string& v) { options.faults.restartAfter = v; },
          "Start a --kill'ed worker again this long after its kill, e.g. 10s (it rejoins the "
          "running job; default: it stays dead)")
      ->type_name("DURATION");
  local
      ->add_option("--partition", options.faults.partition,
                   "Fault injection: cut a region off from the others (the emulated links drop "
                   "everything both ways: messages under userspace, packets under netns), e.g. "
                   "tokyo@20s+30s; or the link between two regions only (a partial partition, "
                   "--network netns), e.g. tokyo/sydney@20s+30s (repeatable)")
      ->type_name("REGION[/OTHER]@TIME+DURATION");
  local
      ->add_option("--slow", options.faults.slow,
                   "Fault injection: the region's workers take FACTOR times as long per step, "
                   "e.g. oregon=3x (a straggler; repeatable)")
      ->type_name("REGION=FACTORx");
  local
      ->add_option("--throttle", options.faults.throttle,
                   "Fault injection: from TIME on, the region's emulated WAN uplink carries RATE, "
                   "e.g. tokyo@20s=5mbit (a link whose bandwidth drops; repeatable)")
      ->type_name("REGION@TIME=RATE");
  local
      ->add_option_function<std::string>(
          "--step-time", [&options](const std::string& v) { options.stepTime = v; },
          "Emulation: every worker's step computes for at least this long, e.g. 20ms, as a "
          "larger model would (up to 60s); a timeline in seconds (--kill, --partition, "
          "--throttle) then falls on the same steps on any machine")
      ->type_name("DURATION");
  local
      ->add_option("--worker-binary", options.workerBinary,
                   "geotrain-worker executable to run (default: geotrain-worker next to this "
                   "geotrain)")
      ->type_name("PATH");
  // A single-value flag given twice takes its last value, so a wrapper (such
  // as scripts/demo.sh) can pass defaults that the user's own flags override.
  for (CLI::Option* option : local->get_options()) {
    if (option->get_items_expected_max() == 1 && option->get_type_size() != 0) {
      option->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
    }
  }
  local->footer(
      "Starts one geotrain-worker per rank on this machine, with an emulated WAN between\n"
      "regions (traffic inside a region is not shaped), and shows live progress per region.\n"
      "With --network netns (as root) each region runs in a network namespace of its own\n"
      "(address 198.18.0.<region index + 1>) and the WAN is emulated below TCP.\n"
      "The run folder gets worker-<rank>.yaml (each rank's complete config: re-run one worker\n"
      "with geotrain-worker --config), keys/, logs/worker-<rank>.log (each worker's stderr),\n"
      "logs/launcher.log, progress.csv and summary.json.\n"
      "Configuration order: built-in defaults, --config, --set, the flags above; then the\n"
      "launcher sets worker.*, transport.listen/peers/regions/links/uplink/keyDir,\n"
      "metrics.listen=127.0.0.1:<free port> and checkpoint.dir=<dir>/rank-<r> for every rank,\n"
      "and keeps output.path (where the trained model goes) for rank 0 only. A dataset.path\n"
      "with {region} in it (--set dataset.path=/data/{region}) names each region's own copy:\n"
      "each region's workers then split that copy among themselves (dataset.sharding).\n"
      "\n"
      "Example: geotrain local --algorithm dts --delay auto --steps 1000 --plot accuracy.png\n"
      "Exit status: 0 when every worker exited 0; 1 when a worker failed (the others are\n"
      "stopped) or the job could not start; 2 on a usage error; 130 when interrupted.");
  local->callback(std::move(onParsed));
  return local;
}

CLI::App* addPlanCommand(CLI::App& app, PlanOptions& options, std::function<void()> onParsed) {
  CLI::App* plan = app.add_subcommand(
      "plan",
      "Predict, before a job runs, what each synchronization algorithm does on the given links: "
      "steps/s, WAN bytes per worker per step, the delay, steps and time to a target; and "
      "recommend one");
  plan->add_option("--job", options.jobFile,
                   "A TrainingJob manifest (YAML): its regions, workers per region, model and "
                   "sync settings, checked as the controller checks them; the links still come "
                   "from --preset, --rtt and --default-rtt")
      ->type_name("FILE");
  plan->add_option("--preset", options.topology.preset,
                   "Links: world, world16 or lan, as in `geotrain local` (see its --help)")
      ->type_name("NAME")
      ->capture_default_str();
  plan->add_option_function<std::string>(
          "--regions", [&options](const std::string& v) { options.topology.regions = v; },
          "Comma-separated region names (default: the preset's)")
      ->type_name("LIST");
  plan->add_option("--workers-per-region", options.topology.workersPerRegion,
                   "Workers in each region (>= 1)")
      ->type_name("N")
      ->capture_default_str();
  plan->add_option("--rtt", options.topology.rtt,
                   "Round-trip time of one region pair, e.g. london-tokyo=230ms (repeatable; "
                   "needed for every pair the preset does not know)")
      ->type_name("A-B=TIME");
  plan->add_option_function<std::string>(
          "--default-rtt", [&options](const std::string& v) { options.topology.defaultRtt = v; },
          "Round-trip time of every pair neither the preset nor --rtt gives, e.g. 150ms (for "
          "jobs of many regions; default: such a pair is an error)")
      ->type_name("TIME");
  plan->add_option_function<std::string>(
          "--uplink", [&options](const std::string& v) { options.topology.uplink = v; },
          "WAN uplink of each worker, e.g. 100mbit or 1gbit; 0 or none = unlimited (default: "
          "the preset's)")
      ->type_name("RATE");
  plan->add_option("--step-time", options.stepTime,
                   "Required: one worker's time per step without any exchange, e.g. 25ms (what "
                   "`geotrain-worker --steps 20` takes alone on the node type, or a `geotrain "
                   "local --algorithm none` run's ms/step)")
      ->type_name("TIME");
  plan->add_option("--codec-ns-per-value", options.codecNsPerValue,
                   "The synchronizer's encoding or decode-accumulating of one value on one core, "
                   "in ns (default: measured in the workers on a 2-core VM)")
      ->type_name("NS")
      ->capture_default_str();
  plan->add_option("--cores-per-worker", options.coresPerWorker,
                   "Cores each worker's codec has: 1 for a machine each; 2/16 = 0.125 for 16 "
                   "workers of `geotrain local` on 2 cores")
      ->type_name("C")
      ->capture_default_str();
  plan->add_option("--model", options.model,
                   "mlp (its tensors from --width), cnn or resnet18; any other model by "
                   "--parameters")
      ->type_name("NAME")
      ->capture_default_str();
  plan->add_option("--width", options.width, "The mlp's hidden units (model.width)")
      ->type_name("N")
      ->capture_default_str();
  plan->add_option("--parameters", options.parameters,
                   "Any model's parameter count, planned as one tensor (each worker logs it at "
                   "start; resnet18 on Fashion-MNIST: 11,172,810)")
      ->type_name("N");
  plan->add_option(
          "--codec", options.codec,
          fmt::format("What crosses the WAN: {} (sync.codec)", fmt::join(kCodecNames, ", ")))
      ->type_name("NAME")
      ->capture_default_str();
  plan->add_option("--bits", options.bits, "qsgd bits: 2, 4 or 8 (sync.bits)")
      ->type_name("B")
      ->capture_default_str();
  plan->add_option("--bucket", options.bucket, "qsgd bucket size (sync.bucket)")
      ->type_name("N")
      ->capture_default_str();
  plan->add_option("--hierarchical", options.hierarchical,
                   "Only region leaders cross the WAN (sync.hierarchical)")
      ->type_name("BOOL")
      ->capture_default_str();
  plan->add_option("--lan-codec", options.lanCodec,
                   fmt::format("What a region's members and leader exchange every step under "
                               "hierarchical sync: {} (sync.lanCodec)",
                               fmt::join(kLanCodecNames, ", ")))
      ->type_name("NAME")
      ->capture_default_str();
  plan->add_option("--period", options.period, "K of the fixed-period dts row (sync.period)")
      ->type_name("K")
      ->capture_default_str();
  plan->add_option_function<int64_t>(
          "--delay", [&options](int64_t d) { options.delay = d; },
          "D of the fixed-period dts row (default: the smallest that covers the link)")
      ->type_name("D");
  plan->add_option("--swarm-h", options.swarmH, "H of the swarm row (sync.swarmH)")
      ->type_name("H")
      ->capture_default_str();
  plan->add_option("--reference-steps", options.referenceSteps,
                   "Steps allreduce fp32 takes to the target on this model (default: the mlp's "
                   "to 85% on Fashion-MNIST, measured)")
      ->type_name("N")
      ->capture_default_str();
  plan->footer(
      "A model of the exchange, not a simulation: docs/algorithms.md, \"Planning a job\", "
      "says what it counts and how it extrapolates.\n"
      "Example: geotrain plan --preset world16 --step-time 25ms --width 25000\n"
      "         geotrain plan --job manifests/samples/world.yaml --step-time 30ms\n"
      "Exit status: 0 with the table printed; 1 on bad input (the message names the flag); 2 "
      "on a usage error.");
  plan->callback(std::move(onParsed));
  return plan;
}

}  // namespace geo::local
