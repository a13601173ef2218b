#!/usr/bin/env bash
# Quick start, step 1: install what is missing, build, and run the main job:
# `geotrain local` on the `world` preset -- four emulated regions (london,
# tokyo, oregon, ohio; 50-230 ms round trips, 100 Mbit/s uplinks), one worker
# each, training the mlp on Fashion-MNIST with DTS (K and D chosen at run
# time from the measured links, the default) and 4-bit QSGD. Extra arguments go to `geotrain local` and override these
# (e.g. scripts/demo.sh --steps 2000 --workers-per-region 2 --plot acc.png).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# Only the two programs the job runs: the test suites and benchmarks are
# scripts/test.sh's to build (most of a fresh build's time).
scripts/build.sh --target geotrain --target geotrain-worker
build="${GEO_BUILD_DIR:-build}"
exec "$build/worker/geotrain" local --preset world --regions london,tokyo,oregon,ohio \
  --workers-per-region 1 --algorithm dts --codec qsgd --bits 4 \
  --model mlp --steps 800 --eval-interval 100 "$@"
