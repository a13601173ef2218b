#!/usr/bin/env bash
# Configures and builds geotrain into ${GEO_BUILD_DIR:-build} (Release).
# Extra arguments are passed to CMake's configure step, e.g.
#   scripts/build.sh -DGEO_USE_CUDA=OFF
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${GEO_BUILD_DIR:-build}
JOBS=${GEO_JOBS:-$(nproc)}
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release "$@"
cmake --build "$BUILD_DIR" -j "$JOBS"
