#!/usr/bin/env bash
# WAN time to accuracy: runs `geotrain local` on the `world` preset (london,
# tokyo, oregon, ohio; 50-230 ms RTT, 100 Mbit/s uplinks; one worker per
# region) for allreduce fp32, allreduce qsgd-4, dts (K = 8, D = auto and a
# few fixed D, qsgd-4) and swarm (H = 4, qsgd-4), and the same runs on the
# `lan` preset (no latency, no bandwidth limit). Prints, per model and
# configuration: wall time to the target accuracy (mlp 85%, cnn 88%), the
# speed-up over allreduce fp32, final test accuracy, WAN bytes, steps/s, and
# WAN compute utilization = steps/s on `world` / steps/s on `lan`.
#
# Usage: bench/wan_time_to_accuracy.sh [--models mlp,cnn] [--steps-mlp N]
#          [--steps-cnn N] [--configs a,b,...] [--out DIR] [--build DIR]
# Configurations: allreduce-fp32, allreduce-qsgd4, dts-auto (K = 8), dts-d<D>
# (K = 8), dts-k<K>-auto, dts-k<K>-d<D> (K may be `auto`: dts-kauto-auto is
# `--period auto --delay auto`), swarm-h<H>. Periodic evaluation runs as
# users run it (mlp every 25 steps, cnn every 100), in the background.
# Every run's folder (logs, CSV, summary.json) stays under --out.
set -euo pipefail

models="mlp"
stepsMlp=600
stepsCnn=800
out="runs/wan-bench-$(date +%Y%m%d-%H%M%S)"
build="${GEO_BUILD_DIR:-build}"
configs="allreduce-fp32,allreduce-qsgd4,dts-kauto-auto,dts-k2-auto,dts-k4-auto,dts-auto,dts-d4,swarm-h4"

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --models) models="$2"; shift 2 ;;
    --steps-mlp) stepsMlp="$2"; shift 2 ;;
    --steps-cnn) stepsCnn="$2"; shift 2 ;;
    --configs) configs="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --build) build="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "wan_time_to_accuracy.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

geotrain="$build/worker/geotrain"
[[ -x "$geotrain" ]] || { echo "wan_time_to_accuracy.sh: $geotrain not found: build first (scripts/build.sh)" >&2; exit 1; }
mkdir -p "$out"

flagsFor() {
  case "$1" in
    allreduce-fp32) echo "--algorithm allreduce --codec identity" ;;
    allreduce-qsgd4) echo "--algorithm allreduce --codec qsgd --bits 4" ;;
    dts-auto) echo "--algorithm dts --period 8 --delay auto --codec qsgd --bits 4" ;;
    dts-d*) echo "--algorithm dts --period 8 --delay ${1#dts-d} --codec qsgd --bits 4" ;;
    dts-k*-*) # dts-k<K>-auto or dts-k<K>-d<D>
      local k="${1#dts-k}" d="${1##*-}"
      k="${k%%-*}"
      [[ "$d" == auto ]] || d="${d#d}"
      echo "--algorithm dts --period $k --delay $d --codec qsgd --bits 4" ;;
    swarm-h*) echo "--algorithm swarm --swarm-h ${1#swarm-h} --codec qsgd --bits 4" ;;
    *) echo "wan_time_to_accuracy.sh: unknown configuration '$1'" >&2; exit 2 ;;
  esac
}

for model in ${models//,/ }; do
  case "$model" in
    mlp) steps=$stepsMlp; target=0.85; evalEvery=25 ;;
    cnn) steps=$stepsCnn; target=0.88; evalEvery=100 ;;
    *) echo "wan_time_to_accuracy.sh: model '$model' is not benchmarked (allowed: mlp, cnn)" >&2; exit 2 ;;
  esac
  for config in ${configs//,/ }; do
    for preset in world lan; do
      dir="$out/$model-$config-$preset"
      echo "== $model $config on $preset ($steps steps) -> $dir"
      # shellcheck disable=SC2046
      "$geotrain" local --preset "$preset" --regions london,tokyo,oregon,ohio \
        --workers-per-region 1 --model "$model" --steps "$steps" --eval-interval "$evalEvery" \
        $(flagsFor "$config") --out "$dir" > "$dir.log" 2>&1 ||
        { echo "   failed: see $dir.log"; tail -5 "$dir.log"; }
    done
  done
  python3 - "$out" "$model" "$target" "$configs" <<'EOF'
import json, sys, pathlib
out, model, target, configs = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4].split(",")
def load(config, preset):
    p = pathlib.Path(out) / f"{model}-{config}-{preset}" / "summary.json"
    return json.loads(p.read_text()) if p.exists() else None
rows = []
base = None
for c in configs:
    w, l = load(c, "world"), load(c, "lan")
    if w is None:
        rows.append((c, None, None, None, None, None, None, None)); continue
    tta = (w.get("timeToAccuracy") or {}).get(target)
    sps_w = w.get("stepsPerSecond"); sps_l = l.get("stepsPerSecond") if l else None
    util = sps_w / sps_l if sps_w and sps_l else None
    if c == "allreduce-fp32": base = tta
    rows.append((c, tta, w.get("testAccuracy"), w.get("wanBytes"), sps_w, sps_l, util, w.get("stalenessMean")))
print(f"\n{model}: time to {float(target)*100:.0f}% test accuracy on the world preset (4 regions x 1 worker)")
print(f"{'configuration':<16} {'time to target':>14} {'speed-up':>9} {'final acc':>9} {'WAN MB':>9} {'steps/s':>8} {'lan st/s':>8} {'util':>6} {'stale':>6}")
fmt = lambda v, f: (f.format(v) if v is not None else "-")
for c, tta, acc, wan, sw, sl, util, st in rows:
    speed = base / tta if base and tta else None
    print(f"{c:<16} {fmt(tta, '{:.1f} s'):>14} {fmt(speed, '{:.1f}x'):>9} {fmt(acc and acc*100, '{:.2f}%'):>9} "
          f"{fmt(wan and wan/1e6, '{:.1f}'):>9} {fmt(sw, '{:.2f}'):>8} {fmt(sl, '{:.2f}'):>8} {fmt(util and util*100, '{:.0f}%'):>6} {fmt(st, '{:.1f}'):>6}")
EOF
done
echo
echo "runs, logs and summaries: $out"
