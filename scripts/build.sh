#!/usr/bin/env bash
# Configures and builds geotrain into ${GEO_BUILD_DIR:-build} (Release).
# `--target NAME` (repeatable) builds only those targets and what they need
# (scripts/demo.sh builds only geotrain and geotrain-worker); without it every
# target is built, tests and benchmarks included when they are configured on.
# Every other argument is passed to CMake's configure step, e.g.
#   scripts/build.sh -DGEO_USE_CUDA=OFF
#   scripts/build.sh --target geotrain-controller
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${GEO_BUILD_DIR:-build}
JOBS=${GEO_JOBS:-$(nproc)}
configure=()
targets=()
while (($#)); do
  case "$1" in
    --target)
      [[ $# -ge 2 && -n "$2" ]] || { echo "build.sh: --target needs a target name" >&2; exit 2; }
      targets+=("$2")
      shift 2
      ;;
    --target=*)
      [[ -n "${1#--target=}" ]] || { echo "build.sh: --target needs a target name" >&2; exit 2; }
      targets+=("${1#--target=}")
      shift
      ;;
    *)
      configure+=("$1")
      shift
      ;;
  esac
done
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release "${configure[@]}"
if ((${#targets[@]})); then
  cmake --build "$BUILD_DIR" -j "$JOBS" --target "${targets[@]}"
else
  cmake --build "$BUILD_DIR" -j "$JOBS"
fi
