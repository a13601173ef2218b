#!/usr/bin/env bash
# Quick start, step 2: install what is missing, build, and run the whole test
# suite with ctest. Extra arguments go to ctest (e.g. -R Qsgd, -L kernels).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh -DGEO_BUILD_TESTS=ON
cd "${GEO_BUILD_DIR:-build}"
ctest --output-on-failure -j "${GEO_JOBS:-$(nproc)}" "$@"
