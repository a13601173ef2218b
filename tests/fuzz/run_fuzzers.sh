#!/usr/bin/env bash
# Builds the libFuzzer targets with clang++-14 (ASan + UBSan) and runs each for
# a bounded time on a copy of its seed corpus (tests/fuzz/corpus/<target>/; the
# checked-in seeds are never modified). Fails on any crash, sanitizer report,
# leak or per-input timeout; the failing input is left in
# <build>/<target>/artifacts/ with the command that reproduces it.
#
# Usage: tests/fuzz/run_fuzzers.sh [BUILD_DIR]      (default: build/fuzz)
# Environment: GEO_FUZZ_SECONDS  fuzzing time per target (default 60)
#              GEO_FUZZ_CXX      compiler (default clang++-14)
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=$(mkdir -p "${1:-$repo/build/fuzz}" && cd "${1:-$repo/build/fuzz}" && pwd)
seconds=${GEO_FUZZ_SECONDS:-60}
cxx=${GEO_FUZZ_CXX:-clang++-14}

if ! command -v "$cxx" >/dev/null; then
  echo "run_fuzzers.sh: $cxx not found (Debian: apt-get install clang-14 libclang-rt-14-dev)" >&2
  exit 1
fi

flags=(-fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -std=c++20 -g -O1
       -I"$repo" "-fmacro-prefix-map=$repo/=")

# build_target NAME SOURCES...: compiles <build>/NAME_fuzzer unless it is newer
# than all of its sources and the headers they include from the repository.
build_target() {
  local name=$1
  shift
  local binary="$build/${name}_fuzzer"
  local sources=("$@")
  local inputs=("${sources[@]/#/$repo/}" "$0")
  inputs+=("$repo"/common/*.h "$repo"/worker/transport/*.h)
  local stale=0
  [[ -x $binary ]] || stale=1
  for f in "${inputs[@]}"; do
    [[ $f -nt $binary ]] && stale=1
  done
  if ((stale)); then
    echo "== building $binary"
    (cd "$repo" && "$cxx" "${flags[@]}" "${sources[@]}" -lfmt -o "$binary")
  fi
}

# run_target NAME: fuzzes NAME for $seconds on a fresh copy of its corpus.
run_target() {
  local name=$1
  local binary="$build/${name}_fuzzer"
  local work="$build/$name"
  rm -rf "$work/corpus"
  mkdir -p "$work/corpus" "$work/artifacts"
  cp "$repo/tests/fuzz/corpus/$name/"* "$work/corpus/"
  echo "== fuzzing $name for ${seconds}s ($(ls "$work/corpus" | wc -l) seeds)"
  if ! "$binary" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
      -print_final_stats=1 -artifact_prefix="$work/artifacts/" "$work/corpus"; then
    echo "run_fuzzers.sh: $name FAILED; reproduce with: $binary $work/artifacts/<file>" >&2
    ls -l "$work/artifacts" >&2 || true
    return 1
  fi
}

build_target frame \
  tests/fuzz/frame_fuzzer.cc worker/transport/frame.cc common/status.cc common/enforce.cc
build_target assembler \
  tests/fuzz/assembler_fuzzer.cc worker/transport/assembler.cc worker/transport/buffer_pool.cc \
  worker/transport/frame.cc common/status.cc common/enforce.cc
run_target frame
run_target assembler
echo "run_fuzzers.sh: all fuzz targets passed"
