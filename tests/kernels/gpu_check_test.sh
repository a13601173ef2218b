#!/usr/bin/env bash
# scripts/gpu-check.sh where there is no GPU (CI): `run` says so and exits
# 77; bad arguments exit 2 naming the option; `bundle` collects what a GPU
# machine needs and stays under the 64 MiB a device call may carry.
#   gpu_check_test.sh REPO BUILD_DIR
set -euo pipefail
repo=$1
build=$2
script="$repo/scripts/gpu-check.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() {
  echo "FAIL: $*" >&2
  exit 1
}

# No GPU: a PATH without nvidia-smi (the machine may have one elsewhere).
mkdir -p "$tmp/bin"
for tool in bash sed dirname realpath nproc; do ln -s "$(command -v "$tool")" "$tmp/bin/$tool"; done
set +e
msg=$(PATH="$tmp/bin" "$script" run --bundle "$tmp/none" 2>&1)
rc=$?
set -e
[[ $rc == 77 ]] || fail "run without a GPU exited $rc, not 77: $msg"
[[ $msg == *"no NVIDIA GPU"* ]] || fail "run without a GPU did not say so: $msg"

# Usage errors name the option and what is allowed.
expect_usage() {
  local want=$1
  shift
  set +e
  local out
  out=$("$script" "$@" 2>&1)
  local code=$?
  set -e
  [[ $code == 2 ]] || fail "'$*' exited $code, not 2"
  [[ $out == *"$want"* ]] || fail "'$*' did not say '$want': $out"
}
expect_usage "--steps must be a positive integer, got '0'" run --steps 0
expect_usage "--from must be a check number from 1 to 6, got '7'" run --from 7
expect_usage "--wan must be a number of seconds, got 'x'" run --wan x
expect_usage "unknown option '--gpus'" run --gpus 2
expect_usage "scripts/gpu-check.sh bundle [--build DIR]" nonsense

# The bundle: the kernel programs with their libraries, the packages' files
# the worker builds against, the data, all under the limit.
"$script" bundle --build "$build" --out "$tmp/bundle" | tee "$tmp/bundle.txt"
for f in bin/qsgd_cuda_test bin/geo_kernels_bench lib/libcudart.so.13 \
         sysroot/usr/include/zmq.h sysroot/usr/include/sodium.h \
         sysroot/usr/lib/x86_64-linux-gnu/cmake/prometheus-cpp/prometheus-cpp-config.cmake \
         sysroot/usr/lib/x86_64-linux-gnu/libgtest.a sysroot/usr/bin/pkgconf \
         data/fashion-mnist/train-images-idx3-ubyte.gz; do
  [[ -e $tmp/bundle/$f ]] || fail "the bundle lacks $f"
done
bytes=$(du -sb "$tmp/bundle" | cut -f1)
((bytes < 64 * 1024 * 1024)) || fail "the bundle is $bytes bytes, over 64 MiB"
# Every link in it resolves inside it (a link to an absolute path would
# point at this machine's files), except libcurl.so's: only its headers are
# carried, for prometheus-cpp's CMake package.
dangling=$(cd "$tmp/bundle" && find . -xtype l ! -name libcurl.so)
[[ -z $dangling ]] || fail "links that resolve nowhere in the bundle: $dangling"
echo "gpu-check: no-GPU path and bundle ($bytes bytes) as expected"
