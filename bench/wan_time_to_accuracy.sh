#!/usr/bin/env bash
# WAN time to accuracy: runs `geotrain local` (london, tokyo, oregon, ohio;
# one worker per region) for each configuration on each emulated network,
# and once on `lan` (no latency, no bandwidth limit) as the reference for
# speed. Networks: world (the preset: 50-230 ms RTT, 100 Mbit/s uplinks),
# uplink10 (world's RTTs, 10 Mbit/s uplinks), rtt3 (world's RTTs x 3, 100
# Mbit/s), world1g (world's RTTs, 1 Gbit/s uplinks: a large model's update
# takes seconds at 100 Mbit/s; --set model.width=25000 makes the mlp 19.9M
# parameters, 10 MB a round at qsgd-4). Prints, per model and network, for each configuration: steps and
# wall time until the job's model, as rank 0 evaluates it, reaches the
# target accuracy (mlp 85%, cnn and resnet18 88%; evaluated in the background
# every 25 / 100 / 25 steps, as users run it, on a snapshot: the step is the
# snapshot's, or
# under dts that of the model the workers agree on, as of the last round
# completed; the time is the snapshot's; with training.evalBacklog set
# so that no snapshot is skipped, every one is evaluated, late if the
# machine is busy), steps relative to allreduce
# fp32 on lan (the same samples), final accuracy of the averaged model, WAN
# bytes per step, steps/s, and WAN compute utilization = steps/s on the
# network / steps/s on lan. Steps to a target on an accuracy plateau move
# by many steps with a point of noise: --seeds runs every configuration once
# per seed (job.seed: the initial model, the data order, QSGD's rounding)
# and prints the median steps and time, with each seed's steps, and
# `mean`: the first step at which rank 0's accuracy averaged over the seeds
# reaches the target (each seed's evaluations interpolated linearly,
# over the steps every seed's evaluations cover). The first crossing of
# one run's noisy curve comes early for the noisier curve (allreduce's
# single model swings by a point between evaluations; DTS's job model is
# an average of four); the mean curve estimates the step at which a run
# of that length is expected to reach the target.
#
# Usage: bench/wan_time_to_accuracy.sh [--models mlp,cnn,resnet18] [--steps-mlp N]
#          [--steps-cnn N] [--steps-resnet18 N] [--configs a,b,...] [--networks a,b,...]
#          [--seeds a,b,...] [--step-time T] [--set KEY=VALUE]... [--out DIR]
#          [--reference DIR] [--network userspace|netns] [--build DIR]
#          [--short CONFIG=STEPS] [--no-lan]
# resnet18 wants a machine of its own: on a 2-core VM its four workers take
# about 6 s a step (allreduce fp32 on lan) and one evaluation of the 10,000
# test images took over 12 minutes beside them, so that every snapshot's
# evaluation waits far behind training.
# --no-lan: the configurations other than allreduce fp32 run on the
# networks asked for only, not on lan too (their utilization is then not
# printed): a sweep of K on one network takes half the time.
# --short allreduce-fp32=6: that configuration runs only 6 steps on the
# networks other than lan (for a model whose every step takes seconds to
# cross the links, a run to the target would take hours), and its time to
# the target there is projected: its steps to the target on lan (the same
# steps: a synchronous configuration's arithmetic does not depend on the
# links; allreduce fp32's are the reference's) divided by its steps/s on
# the network, marked "~". Only a configuration without delay may be cut
# short (allreduce-*, localsgd-k<K>); it runs on lan even with --no-lan;
# --short may be given once per configuration. The column
# "vs AR t" is each configuration's time to the target over allreduce
# fp32's on the same network, measured or projected.
# --step-time (e.g. 25ms) gives every step at least that much compute, as
# a larger model's would (geotrain local --step-time): the links are then
# fewer steps of delay. --set passes a worker.yaml override to every run
# (e.g. --set sync.scaleLrWithDelay=false); use another --out for each.
# --network netns runs every job, the lan reference too, on kernel TCP
# between network namespaces with the WAN emulated below TCP (geotrain
# local --network netns; needs root); default: userspace.
# --reference DIR: the allreduce-fp32 lan runs (same seeds) that steps are
# compared with come from DIR, not --out (default: --out), and are not run
# again. Allreduce's steps do not depend on --step-time or --set of the
# delay rules: one set of reference runs serves them all (and may be
# shorter: it only has to reach the target).
# Configurations: allreduce-fp32, allreduce-qsgd4, localsgd-k<K> (local SGD:
# the models averaged in fp32 every K steps, synchronously: DTS with D = 0
# and the identity codec; post-local SGD without its allreduce warm-up),
# dts-auto (K = 8), dts-d<D>
# (K = 8), dts-k<K>-auto, dts-k<K>-d<D> (K may be `auto`: dts-kauto-auto is
# `--period auto --delay auto`), swarm-h<H>, default (no sync flags: what
# `geotrain local` runs). A run whose folder already holds a summary.json is
# not run again: several invocations with one --out share their lan runs,
# and an interrupted benchmark resumes. Every run's folder (logs, CSV,
# summary.json) stays under --out.
set -euo pipefail

models="mlp"
stepsMlp=1500  # on OpenBLAS the delayed configurations reach 85% only after ~1000 steps
stepsCnn=800
stepsResnet18=400
out="runs/wan-bench-$(date +%Y%m%d-%H%M%S)"
build="${GEO_BUILD_DIR:-build}"
configs="allreduce-fp32,allreduce-qsgd4,dts-kauto-auto,dts-k2-auto,dts-k4-auto,dts-auto,dts-d4,swarm-h4"
networks="world"
seeds=""  # none: the job's default seed, run folders without a suffix
extra=()  # --step-time and --set, for every run
reference=""  # none: --out
declare -A shortSteps=()  # --short: configurations cut short on the WAN networks, with their steps
noLan=0  # --no-lan: only allreduce fp32 runs on lan

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --models) models="$2"; shift 2 ;;
    --steps-mlp) stepsMlp="$2"; shift 2 ;;
    --steps-cnn) stepsCnn="$2"; shift 2 ;;
    --steps-resnet18) stepsResnet18="$2"; shift 2 ;;
    --configs) configs="$2"; shift 2 ;;
    --networks) networks="$2"; shift 2 ;;
    --seeds) seeds="$2"; shift 2 ;;
    --step-time) extra+=(--step-time "$2"); shift 2 ;;
    --set) extra+=(--set "$2"); shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --reference) reference="$2"; shift 2 ;;
    --network) extra+=(--network "$2"); shift 2 ;;
    --build) build="$2"; shift 2 ;;
    --no-lan) noLan=1; shift ;;
    --short)
      [[ "$2" == *=* && "${2#*=}" =~ ^[1-9][0-9]*$ ]] ||
        { echo "wan_time_to_accuracy.sh: --short $2: expected CONFIG=STEPS (e.g. allreduce-fp32=6)" >&2; exit 2; }
      [[ "${2%%=*}" == allreduce-* || "${2%%=*}" =~ ^localsgd-k[1-9][0-9]*$ ]] ||
        { echo "wan_time_to_accuracy.sh: --short $2: only a configuration without delay (allreduce-*, localsgd-k<K>) has the same steps on every network, so that its time can be projected" >&2; exit 2; }
      shortSteps["${2%%=*}"]="${2#*=}"
      shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "wan_time_to_accuracy.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

[[ -z "$reference" || -d "$reference" ]] ||
  { echo "wan_time_to_accuracy.sh: --reference $reference: no such folder (the --out of the allreduce-fp32 lan runs)" >&2; exit 2; }
geotrain="$build/worker/geotrain"
[[ -x "$geotrain" ]] || { echo "wan_time_to_accuracy.sh: $geotrain not found: build first (scripts/build.sh)" >&2; exit 1; }
mkdir -p "$out"

flagsFor() {
  case "$1" in
    allreduce-fp32) echo "--algorithm allreduce --codec identity" ;;
    allreduce-qsgd4) echo "--algorithm allreduce --codec qsgd --bits 4" ;;
    localsgd-k*)
      [[ "${1#localsgd-k}" =~ ^[1-9][0-9]*$ ]] || { echo "wan_time_to_accuracy.sh: configuration '$1': expected localsgd-k<K>, K >= 1" >&2; exit 2; }
      echo "--algorithm dts --period ${1#localsgd-k} --delay 0 --codec identity" ;;
    dts-auto) echo "--algorithm dts --period 8 --delay auto --codec qsgd --bits 4" ;;
    dts-d*) echo "--algorithm dts --period 8 --delay ${1#dts-d} --codec qsgd --bits 4" ;;
    dts-k*-*) # dts-k<K>-auto or dts-k<K>-d<D>
      local k="${1#dts-k}" d="${1##*-}"
      k="${k%%-*}"
      [[ "$d" == auto ]] || d="${d#d}"
      echo "--algorithm dts --period $k --delay $d --codec qsgd --bits 4" ;;
    swarm-h*) echo "--algorithm swarm --swarm-h ${1#swarm-h} --codec qsgd --bits 4" ;;
    default) echo "" ;;
    *) echo "wan_time_to_accuracy.sh: unknown configuration '$1'" >&2; exit 2 ;;
  esac
}

networkFlags() {
  case "$1" in
    lan) echo "--preset lan" ;;
    world) echo "--preset world" ;;
    uplink10) echo "--preset world --uplink 10mbit" ;;
    world1g) echo "--preset world --uplink 1gbit" ;;
    rtt3) echo "--preset world --rtt london-tokyo=690ms --rtt london-oregon=420ms --rtt london-ohio=270ms --rtt tokyo-oregon=300ms --rtt tokyo-ohio=480ms --rtt oregon-ohio=150ms" ;;
    *) echo "wan_time_to_accuracy.sh: unknown network '$1' (allowed: world, world1g, uplink10, rtt3)" >&2; exit 2 ;;
  esac
}
for n in ${networks//,/ }; do networkFlags "$n" > /dev/null; done
for c in ${configs//,/ }; do flagsFor "$c" > /dev/null; done

for model in ${models//,/ }; do
  case "$model" in
    mlp) steps=$stepsMlp; target=0.85; evalEvery=25 ;;
    cnn) steps=$stepsCnn; target=0.88; evalEvery=100 ;;
    resnet18) steps=$stepsResnet18; target=0.88; evalEvery=25 ;;
    *) echo "wan_time_to_accuracy.sh: model '$model' is not benchmarked (allowed: mlp, cnn, resnet18)" >&2; exit 2 ;;
  esac
  for config in ${configs//,/ }; do
    for network in lan ${networks//,/ }; do
      seedList="${seeds:-default}"
      for seed in ${seedList//,/ }; do
        # On lan only allreduce's steps are compared: the others' lan runs
        # give utilization, for which one seed does.
        if [[ "$network" == lan && "$config" != allreduce-fp32 && "$seed" != "${seedList%%,*}" ]]; then
          continue
        fi
        if [[ -n "$reference" && "$config" == allreduce-fp32 && "$network" == lan ]]; then
          continue  # the reference's, in --reference
        fi
        if [[ "$noLan" == 1 && "$config" != allreduce-fp32 && -z "${shortSteps[$config]:-}" && "$network" == lan ]]; then
          continue
        fi
        runSteps=$steps runEval=$evalEvery
        if [[ -n "${shortSteps[$config]:-}" && "$network" != lan ]]; then
          runSteps=${shortSteps[$config]} runEval=0  # its speed only: the time to the target is projected
        fi
        dir="$out/$model-$config-$network" seedFlags=()
        if [[ "$seed" != default ]]; then dir="$dir-s$seed" seedFlags=(--set "job.seed=$seed"); fi
        if [[ -f "$dir/summary.json" ]]; then echo "== $model $config on $network: done before ($dir)"; continue; fi
        rm -rf "$dir"
        echo "== $model $config on $network ($runSteps steps${seedFlags:+, seed $seed}) -> $dir"
        # shellcheck disable=SC2046
        "$geotrain" local $(networkFlags "$network") --regions london,tokyo,oregon,ohio \
          --workers-per-region 1 --model "$model" --steps "$runSteps" --eval-interval "$runEval" \
          --set training.evalBacklog=$((steps / evalEvery + 1)) "${seedFlags[@]}" "${extra[@]}" \
          $(flagsFor "$config") --out "$dir" > "$dir.log" 2>&1 ||
          { echo "   failed: see $dir.log"; tail -5 "$dir.log"; }
      done
    done
  done
  shortList=""
  for c in "${!shortSteps[@]}"; do shortList+="${shortList:+,}$c"; done
  python3 - "$out" "$model" "$target" "$configs" "$networks" "$seeds" "${reference:-$out}" "$shortList" <<'EOF'
import csv, json, statistics, sys, pathlib
out, model, target = sys.argv[1], sys.argv[2], sys.argv[3]
# The lan table first (the reference runs, with --networks "" alone), then
# the networks asked for.
configs = sys.argv[4].split(",")
networks = ["lan"] + [n for n in sys.argv[5].split(",") if n and n != "lan"]
seeds = sys.argv[6].split(",") if sys.argv[6] else [None]
reference = sys.argv[7]
short = [c for c in sys.argv[8].split(",") if c]  # configurations cut short on the WAN networks: their time is projected
def meanCurveSteps(curves):
    # curves: per seed, {step: accuracy}. The first integer step at which
    # the mean of the linearly interpolated curves reaches the target, over
    # the steps every curve covers; None when it never does.
    curves = [sorted(c.items()) for c in curves if c]
    if not curves: return None
    lo, hi = max(c[0][0] for c in curves), min(c[-1][0] for c in curves)
    def at(c, x):
        for (x0, y0), (x1, y1) in zip(c, c[1:]):
            if x0 <= x <= x1: return y0 + (y1 - y0) * (x - x0) / (x1 - x0) if x1 > x0 else y1
        return c[-1][1]
    for x in range(lo, hi + 1):
        if sum(at(c, x) for c in curves) / len(curves) >= float(target): return x
    return None
def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None
def run(config, network, base=out):
    # Over the seeds: the median steps and time to target (each seed's steps
    # in stepsBySeed), the mean of the rest.
    runs = [r for r in (run1(config, network, seed, base) for seed in seeds) if r is not None]
    if not runs: return None
    s = {k: statistics.mean(r[k] for r in runs) for k, v in runs[0].items()
         if isinstance(v, (int, float)) and not isinstance(v, bool) and all(r.get(k) is not None for r in runs)}
    s["stepsBySeed"] = [r["stepsToTarget"] for r in runs]
    s["stepsToTarget"] = median(s["stepsBySeed"]) if None not in s["stepsBySeed"] else None
    s["meanCurveSteps"] = meanCurveSteps([r["curve"] for r in runs])
    s["timeToAccuracy"] = {target: median([(r.get("timeToAccuracy") or {}).get(target) for r in runs])}
    return s
def run1(config, network, seed, base):
    d = pathlib.Path(base) / (f"{model}-{config}-{network}" + (f"-s{seed}" if seed else ""))
    p = d / "summary.json"
    if not p.exists(): return None
    s = json.loads(p.read_text())
    # Steps to target: the earliest snapshot of rank 0 whose evaluation
    # reached it (with training.evalBacklog every snapshot is evaluated,
    # late if need be, so this is resolved to evalEvery steps).
    s["stepsToTarget"] = None
    with open(d / "progress.csv") as f:
        evals = [(int(row["eval_step"] or row["step"]), float(row["eval_accuracy"])) for row in csv.DictReader(f)
                 if row["rank"] == "0" and row["eval_accuracy"]]
    reached = [step for step, accuracy in evals if accuracy >= float(target)]
    s["stepsToTarget"] = min(reached) if reached else None
    s["curve"] = dict(evals)  # a step evaluated twice (the job model of one round): the later report
    return s
ref = run("allreduce-fp32", "lan", reference)
refSteps = ref and ref["stepsToTarget"]
refMean = ref and ref["meanCurveSteps"]
fmt = lambda v, f: (f.format(v) if v is not None else "-")
for network in networks:
    print(f"\n{model} on {network} (4 regions x 1 worker): target {float(target)*100:.0f}% test accuracy"
          f"{'' if refSteps else ' (no allreduce-fp32 lan run reached it: steps are not compared)'}")
    print(f"{'configuration':<16} {'steps':>6} {'vs AR':>6} {'mean':>5} {'vs AR':>6} {'time':>8} {'vs AR t':>8} {'final acc':>9} {'WAN KB/step':>11} {'steps/s':>8} {'lan st/s':>8} {'util':>6} {'stale':>6} {'wait':>6}")
    def timeTo(c, w):
        # (seconds to the target, projected?) on this network
        if c in short and network != "lan":
            # Its own steps to the target on lan (allreduce fp32's: the reference's).
            lanSteps = refSteps if c == "allreduce-fp32" else ((run(c, "lan") or {}).get("stepsToTarget"))
            sw = w.get("stepsPerSecond")
            return (lanSteps / sw if lanSteps and sw else None), True
        return (w.get("timeToAccuracy") or {}).get(target), False
    ar = run("allreduce-fp32", network, reference if network == "lan" else out)
    arTime = timeTo("allreduce-fp32", ar)[0] if ar else None
    for c in configs:
        w, l = run(c, network), (ref if c == "allreduce-fp32" else run(c, "lan"))
        if network == "lan" and c == "allreduce-fp32": w = ref
        if w is None:
            print(f"{c:<16} (no run)"); continue
        st = w["stepsToTarget"]
        tta, projected = timeTo(c, w)
        vsArTime = arTime / tta if tta and arTime else None
        sw = w.get("stepsPerSecond"); sl = l.get("stepsPerSecond") if l else None
        util = sw / sl if sw and sl else None
        perStep = w["wanBytes"] / 4 / w["steps"] / 1e3 if w.get("steps") else None  # per worker
        rel = st / refSteps if st and refSteps else None
        mc = w.get("meanCurveSteps") if len(seeds) > 1 else None
        relMean = mc / refMean if mc and refMean else None
        acc = w.get("testAccuracy")
        bySeed = f"  (seeds: {', '.join(fmt(v, '{}') for v in w['stepsBySeed'])})" if len(seeds) > 1 else ""
        print(f"{c:<16} {fmt(st, '{:g}'):>6} {fmt(rel, '{:.2f}x'):>6} {fmt(mc, '{}'):>5} {fmt(relMean, '{:.2f}x'):>6} {fmt(tta, ('~' if projected else '') + '{:.1f} s'):>8} {fmt(vsArTime, '{:.1f}x'):>8} {'-' if projected else fmt(acc and acc*100, '{:.2f}%'):>9} "
              f"{fmt(perStep, '{:.1f}'):>11} {fmt(sw, '{:.2f}'):>8} {fmt(sl, '{:.2f}'):>8} {fmt(util and util*100, '{:.0f}%'):>6} {fmt(w.get('stalenessMean'), '{:.1f}'):>6} {fmt(w.get('waitSeconds'), '{:.1f} s'):>6}{bySeed}")
    print("(steps: of rank 0's first evaluation at or above the target; vs AR: / allreduce fp32's on lan;"
          " vs AR t: allreduce fp32's time to the target on this network / this one's"
          + (f" (~: projected from the configuration's steps on lan and its steps/s here, a short run: {', '.join(short)})" if short else "")
          + ";"
          " WAN KB/step: sent + received per worker and step; util: steps/s / the same configuration's on lan;"
          " wait: the longest time a worker waited for peers or its uplink"
          + ("; steps and time: median over the seeds, the rest their mean; mean: where the accuracy averaged"
             " over the seeds first reaches the target, and / allreduce fp32's)" if len(seeds) > 1 else ")"))
EOF
done
echo
echo "runs, logs and summaries: $out"
