#!/usr/bin/env bash
# Builds the libFuzzer targets (ASan + UBSan): the frame decoder, the payload
# assembler and the codecs' decode-and-apply; and runs each for
# a bounded time on a copy of its seed corpus (tests/fuzz/corpus/<target>/; the
# checked-in seeds are never modified). Fails on any crash, sanitizer report,
# leak or per-input timeout; the failing input is left in
# <build>/<target>/artifacts/ with the command that reproduces it.
#
# Usage: tests/fuzz/run_fuzzers.sh [BUILD_DIR]      (default: build/fuzz)
# Environment: GEO_FUZZ_SECONDS  fuzzing time per target (default 60; under
#                                ctest GEO_FUZZ_CTEST_SECONDS, 30, which
#                                GEO_FUZZ_SECONDS overrides)
#              GEO_FUZZ_CXX      compiler (default clang++-14)
#              GEO_FUZZ_GXX      compiler of the LibTorch targets (default g++)
#              GEO_FUZZ_TORCH_INCLUDE  LibTorch's C++ API headers
#                                (default Debian's /usr/include/torch/csrc/api/include)
#              GEO_FUZZ_TORCH    0: skip the LibTorch targets (a build without
#                                the worker)
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=$(mkdir -p "${1:-$repo/build/fuzz}" && cd "${1:-$repo/build/fuzz}" && pwd)
seconds=${GEO_FUZZ_SECONDS:-${GEO_FUZZ_CTEST_SECONDS:-60}}
cxx=${GEO_FUZZ_CXX:-clang++-14}
gxx=${GEO_FUZZ_GXX:-g++}
torch_include=${GEO_FUZZ_TORCH_INCLUDE:-/usr/include/torch/csrc/api/include}
with_torch=${GEO_FUZZ_TORCH:-1}

if ! command -v "$cxx" >/dev/null; then
  echo "run_fuzzers.sh: $cxx not found (Debian: apt-get install clang-14 libclang-rt-14-dev)" >&2
  exit 1
fi

flags=(-fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -std=c++20 -g -O1
       -I"$repo" "-fmacro-prefix-map=$repo/=")

# stale BINARY FILES...: whether BINARY is missing or older than any of FILES.
stale() {
  local binary=$1
  shift
  [[ -x $binary ]] || return 0
  local f
  for f in "$@"; do
    [[ $f -nt $binary ]] && return 0
  done
  return 1
}

# build_target NAME SOURCES...: compiles <build>/NAME_fuzzer unless it is newer
# than all of its sources and the headers they include from the repository.
build_target() {
  local name=$1
  shift
  local binary="$build/${name}_fuzzer"
  local sources=("$@")
  if stale "$binary" "${sources[@]/#/$repo/}" "$0" "$repo"/common/*.h \
      "$repo"/worker/transport/*.h; then
    echo "== building $binary"
    (cd "$repo" && "$cxx" "${flags[@]}" "${sources[@]}" -lfmt -o "$binary")
  fi
}

# build_torch_target NAME SOURCES...: like build_target, for a target that
# uses LibTorch. LibTorch 1.13's headers do not compile with clang 14 in C++20
# mode, so these are compiled by g++ with ASan + UBSan and trace-cmp coverage
# and linked with clang's libFuzzer engine (see tests/fuzz/codec_fuzzer.cc).
build_torch_target() {
  local name=$1
  shift
  local binary="$build/${name}_fuzzer"
  local sources=("$@")
  if stale "$binary" "${sources[@]/#/$repo/}" "$0" "$repo"/common/*.h \
      "$repo"/worker/transport/*.h "$repo"/worker/codec/*.h "$repo"/worker/sync/flat_codec.h \
      "$repo"/kernels/*.h; then
    local engine
    engine="$("$cxx" -print-runtime-dir)/libclang_rt.fuzzer-x86_64.a"
    echo "== building $binary (g++, LibTorch)"
    (cd "$repo" && "$gxx" -fsanitize=address,undefined -fno-sanitize-recover=all \
      -fsanitize-coverage=trace-cmp -std=c++20 -g -O1 -fopenmp -ffp-contract=off \
      -I"$repo" -isystem "$torch_include" -D_GLIBCXX_USE_CXX11_ABI=1 \
      "-fmacro-prefix-map=$repo/=" "${sources[@]}" "$engine" \
      -ltorch -ltorch_cpu -lc10 -lfmt -o "$binary")
  fi
}

# run_target NAME [FLAGS...]: fuzzes NAME for $seconds on a fresh copy of its
# corpus, with extra libFuzzer flags.
run_target() {
  local name=$1
  shift
  local binary="$build/${name}_fuzzer"
  local work="$build/$name"
  rm -rf "$work/corpus"
  mkdir -p "$work/corpus" "$work/artifacts"
  cp "$repo/tests/fuzz/corpus/$name/"* "$work/corpus/"
  echo "== fuzzing $name for ${seconds}s ($(ls "$work/corpus" | wc -l) seeds)"
  if ! "$binary" "$@" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
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
if [[ $with_torch == 1 ]]; then
  build_torch_target codec \
    tests/fuzz/codec_fuzzer.cc worker/sync/flat_codec.cc worker/codec/codec.cc \
    kernels/qsgd_cpu.cc kernels/casts_cpu.cc common/status.cc common/enforce.cc
fi
run_target frame
run_target assembler
if [[ $with_torch == 1 ]]; then
  # Without edge coverage, comparison feedback (value profiles) guides it.
  run_target codec -use_value_profile=1
fi
echo "run_fuzzers.sh: all fuzz targets passed"
