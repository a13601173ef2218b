#!/usr/bin/env bash
# Quick start, step 1: install what is missing, build, and run the main job.
# Until `geotrain local` lands, the main job is the codec benchmark: QSGD
# 2/4/8-bit encode and decode-accumulate against memcpy on 64 MiB of fp32.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
echo "demo: running the codec benchmark (64 MiB of fp32; ratios are against memcpy)"
"${GEO_BUILD_DIR:-build}/bench/geo_kernels_bench" --benchmark_min_time=0.2 "$@"
