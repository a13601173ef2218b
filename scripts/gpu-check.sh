#!/usr/bin/env bash
# The GPU path, proved in one command on a machine with one NVIDIA GPU.
#
#   scripts/gpu-check.sh bundle [--build DIR] [--out DIR]
#       Here (Debian 12, nvcc, the project built with its CUDA kernels):
#       collects what a GPU machine that has only a driver, CUDA, CMake,
#       a compiler and PyTorch lacks -- the CUDA kernel tests and benchmark
#       built here with the few shared libraries they need, the files of
#       Debian's development packages the worker builds against (ZeroMQ,
#       libsodium, prometheus-cpp, yaml-cpp, spdlog, {fmt}, CLI11,
#       nlohmann-json, GoogleTest, zlib, pkgconf) and Fashion-MNIST -- into
#       DIR (default .gpu-bundle, which git ignores), and checks that it
#       stays under 64 MiB.
#
#   scripts/gpu-check.sh run [--bundle DIR] [--out DIR] [--steps N] [--jobs N] [--from S] [--wan SECONDS]
#       There, from the repository root (the bundle beside it): the CUDA
#       kernel tests (CPU and CUDA encodings bit for bit), geo_kernels_bench
#       (QSGD-2/4/8 encode and decode-accumulate of 16 Mi and 100 M values
#       against a device-to-device copy of the same bytes), the worker built
#       against PyTorch's LibTorch with CUDA (python3 -c 'import torch;
#       print(torch.utils.cmake_prefix_path)'), the CPU/CUDA tests of the
#       codecs, flat updates and parity fingerprints, two workers training
#       the cnn on the GPU over loopback with DTS (accuracy, steps/s,
#       identical final models), and resnet18 on the GPU with DTS's defaults
#       and with a round every step (the training thread's encoding time
#       against its step, and the synchronizer's time stage by stage).
#       Figures go to stdout and to DIR (default gpu-check-out); about 4
#       minutes on one H100. Without a GPU it says so and exits 77. --from S
#       starts at check S (1-6; 3: build the worker and train), to rerun the
#       later checks within a short lease. --wan SECONDS adds check 7, the
#       bandwidth-bound benchmark on a GPU: resnet18 on four workers sharing
#       the GPU, on the namespace network (needs root), DTS's defaults on
#       lan and on the world links at 100 Mbit/s, allreduce fp32 for 3
#       steps on the world links, then allreduce fp32 on lan over loopback
#       for its steps to the target, all within SECONDS (what is left when
#       the reference starts is its share; bench/wan_time_to_accuracy.sh
#       prints the table, and the runs go to DIR/wan.tgz).
#
# Exit status: 0 when every check passed, 1 when one failed, 2 on a usage
# error, 77 (run) when there is no GPU.
set -eEuo pipefail
trap 'echo "gpu-check: stopped by a failing command at line $LINENO" >&2' ERR

usage() {
  sed -n '2,/^set -e/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
}

die() {
  echo "gpu-check: $*" >&2
  exit 1
}

repo=$(cd "$(dirname "$0")/.." && pwd)
mode=${1:-}
[[ $mode == -h || $mode == --help ]] && { usage; exit 0; }
[[ $mode == bundle || $mode == run ]] || { usage >&2; exit 2; }
shift

bundle="$repo/.gpu-bundle"
build="$repo/build"
out=""
steps=3000
jobs=$(nproc)
from=1
wan=0
while (($#)); do
  case $1 in
    --bundle) bundle=$(realpath -m "$2"); shift 2 ;;
    --build) build=$(realpath -m "$2"); shift 2 ;;
    --out) out=$(realpath -m "$2"); shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    --from) from=$2; shift 2 ;;
    --wan) wan=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "gpu-check: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ $steps =~ ^[1-9][0-9]*$ ]] || { echo "gpu-check: --steps must be a positive integer, got '$steps'" >&2; exit 2; }
[[ $from =~ ^[1-6]$ ]] || { echo "gpu-check: --from must be a check number from 1 to 6, got '$from'" >&2; exit 2; }
[[ $wan =~ ^[0-9]+$ ]] || { echo "gpu-check: --wan must be a number of seconds, got '$wan'" >&2; exit 2; }
[[ $jobs =~ ^[1-9][0-9]*$ ]] || { echo "gpu-check: --jobs must be a positive integer, got '$jobs'" >&2; exit 2; }

# The bundle's size limit: what a GPU machine here is sent with the tree.
readonly kBundleLimitBytes=$((64 * 1024 * 1024))

# Debian packages whose files the worker's build needs on a machine that has
# none of Debian's (runtime libraries with their -dev packages). libcurl's
# headers only satisfy prometheus-cpp's CMake package (its push library,
# which the worker does not link, needs them).
readonly kPackages=(
  libzmq3-dev libzmq5 libpgm-5.3-0 libnorm1 cppzmq-dev
  libsodium-dev libsodium23
  prometheus-cpp-dev libprometheus-cpp-core1.0 libprometheus-cpp-pull1.0
  libprometheus-cpp-push1.0 libcivetweb-dev libcivetweb1 civetweb
  libyaml-cpp-dev libyaml-cpp0.7 libspdlog-dev libspdlog1.10 libfmt-dev libfmt9
  libcli11-dev nlohmann-json3-dev libgtest-dev zlib1g-dev libcurl4-openssl-dev
  pkgconf pkgconf-bin libpkgconf3
)

make_bundle() {
  out=${out:-$bundle}
  local tests="$build/tests/kernels/qsgd_cuda_test" bench="$build/bench/geo_kernels_bench"
  for f in "$tests" "$bench"; do
    [[ -x $f ]] || die "$f is missing: build the project with its CUDA kernels first (nvcc at /usr/local/cuda/bin/nvcc; scripts/build.sh -DGEO_USE_CUDA=ON -DGEO_BUILD_TESTS=ON)"
  done
  local data=/usr/share/datasets/fashion-mnist
  [[ -d $data ]] || die "$data is missing (Debian package dataset-fashion-mnist)"
  rm -rf "$out"
  mkdir -p "$out/bin" "$out/lib" "$out/sysroot" "$out/data"
  cp "$tests" "$bench" "$out/bin/"
  # The libraries those two need that a machine without Debian's packages
  # lacks: everything ldd resolves outside glibc and the compiler runtime.
  ldd "$tests" "$bench" | awk '/=> \//{print $3}' | sort -u | while read -r lib; do
    case $(basename "$lib") in
      libc.so.*|libm.so.*|libdl.so.*|libpthread.so.*|librt.so.*|libgcc_s.so.*|libstdc++.so.*|ld-linux*) ;;
      *) cp -L "$lib" "$out/lib/" ;;
    esac
  done
  local pkg missing=()
  for pkg in "${kPackages[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'ok installed' || missing+=("$pkg")
  done
  ((${#missing[@]} == 0)) || die "Debian packages missing here: ${missing[*]} (apt-get install them)"
  # Files only (no docs, man pages or changelogs; no static libraries but
  # GoogleTest's, the only form it comes in), at their paths under sysroot/.
  # A link to an absolute path would point outside the sysroot: it becomes
  # a copy of what it names.
  dpkg -L "${kPackages[@]}" | grep -Ev '^/usr/share/(doc|man|lintian|bug)/' |
    grep -Ev '/lib[^/]*\.a$|^/usr/lib/x86_64-linux-gnu/libg(test|mock)' |
    while read -r f; do
      [[ -f $f || -L $f ]] && [[ ! -d $f ]] || continue
      mkdir -p "$out/sysroot$(dirname "$f")"
      if [[ -L $f && $(readlink "$f") == /* ]]; then cp -L "$f" "$out/sysroot$f"; else cp -P "$f" "$out/sysroot$f"; fi
    done
  for f in $(dpkg -L libgtest-dev | grep -E '/libg(test|mock)[^/]*\.a$'); do
    mkdir -p "$out/sysroot$(dirname "$f")"
    cp "$f" "$out/sysroot$f"
  done
  cp -r "$data" "$out/data/"
  local bytes
  bytes=$(du -sb "$out" | cut -f1)
  awk -v dir="$out" -v b="$bytes" -v limit=$((kBundleLimitBytes / 1048576)) \
    'BEGIN { printf "gpu-check: bundle %s: %.1f MiB (limit %d MiB)\n", dir, b / 1048576, limit }'
  ((bytes < kBundleLimitBytes)) || die "the bundle is over its limit"
}

# ---- run --------------------------------------------------------------------

failures=()
check() {  # check NAME CONDITION-MESSAGE: records a failed check
  failures+=("$1")
  echo "FAILED: $1" >&2
}

have_gpu() {
  command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '
}

run_check() {
  out=${out:-$repo/gpu-check-out}
  if ! have_gpu; then
    echo "gpu-check: no NVIDIA GPU here (nvidia-smi lists none): nothing to check"
    exit 77
  fi
  [[ -d $bundle/bin ]] || die "no bundle at $bundle: make one with 'scripts/gpu-check.sh bundle' on a Debian 12 machine with nvcc and carry it here"
  mkdir -p "$out"
  local t0=$SECONDS
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"

  if ((from <= 2)); then kernel_checks; fi
  build_and_train
}

kernel_checks() {
  echo "== 1. CUDA kernels: CPU and CUDA bit for bit"
  if LD_LIBRARY_PATH="$bundle/lib" "$bundle/bin/qsgd_cuda_test" >"$out/kernel-tests.txt" 2>&1; then
    grep -E '^\[  (PASSED|SKIPPED) ' "$out/kernel-tests.txt" || true
    ! grep -q '^\[  SKIPPED ' "$out/kernel-tests.txt" || check "kernel tests skipped on a GPU"
  else
    tail -30 "$out/kernel-tests.txt"
    check "kernel tests"
  fi

  echo "== 2. geo_kernels_bench: QSGD against a device-to-device copy"
  if LD_LIBRARY_PATH="$bundle/lib" "$bundle/bin/geo_kernels_bench" --benchmark_filter=Gpu \
      --benchmark_color=false >"$out/kernels-bench.txt" 2>&1; then
    sed -n '/^kernel (GB\/s/,$p' "$out/kernels-bench.txt"
    local ratio
    for op in Encode DecodeAccumulate; do
      ratio=$(awk -v op="BM_GpuQsgd${op}/bits:4/values:100000000/" 'index($1, op) == 1 {sub("x", "", $3); print $3}' "$out/kernels-bench.txt")
      echo "QSGD-4 ${op} of 100 M values: ${ratio:-?}x the copy (target >= 0.70x)"
      [[ -n $ratio ]] && awk -v r="$ratio" 'BEGIN{exit !(r >= 0.70)}' || check "QSGD-4 $op at ${ratio:-?}x the copy"
    done
  else
    tail -30 "$out/kernels-bench.txt"
    check "kernels bench"
  fi

}

build_and_train() {
  local t0=$SECONDS
  echo "== 3. the worker against PyTorch's LibTorch with CUDA"
  local torch_prefix sysroot="$bundle/sysroot" multiarch=usr/lib/x86_64-linux-gnu
  torch_prefix=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>/dev/null) ||
    die "python3 cannot import torch: a LibTorch with CUDA is needed (CMAKE_PREFIX_PATH)"
  # PyTorch's LibTorch ships {fmt} headers of its own, a newer {fmt} than
  # the libfmt and spdlog the worker links, in the include folder every
  # LibTorch user gets: build against a view of that LibTorch without them
  # (its CMake files copied, its libraries and other headers linked).
  local torch_root view="$out/libtorch"
  torch_root=$(cd "$torch_prefix/../.." && pwd)
  if [[ -d $torch_root/include/fmt ]]; then
    rm -rf "$view"
    mkdir -p "$view/include"
    cp -r "$torch_root/share" "$view/share"
    ln -s "$torch_root/lib" "$view/lib"
    for f in "$torch_root"/include/*; do
      [[ $(basename "$f") == fmt ]] || ln -s "$f" "$view/include/"
    done
    torch_prefix="$view/share/cmake"
    echo "LibTorch: $torch_root (without its {fmt} headers: $view)"
  fi
  # Debian's .pc files name /usr: point them at the bundle's copy.
  find "$sysroot" -name '*.pc' -exec sed -i "s|^prefix=/usr\$|prefix=$sysroot/usr|" {} +
  local wbuild="$out/build"
  # Only the sysroot's libraries (libzmq's own needs): bundle/lib holds
  # Debian's libgomp and libcudart for the prebuilt kernel programs, which
  # the worker, built here against this machine's compiler and CUDA, must
  # not pick up.
  export LD_LIBRARY_PATH="$sysroot/$multiarch${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export PKG_CONFIG_PATH="$sysroot/$multiarch/pkgconfig:$sysroot/usr/share/pkgconfig"
  export PKG_CONFIG_LIBDIR="$PKG_CONFIG_PATH"
  local gen=()
  command -v ninja >/dev/null && gen=(-G Ninja)
  if cmake -S "$repo" -B "$wbuild" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
      -DGEO_USE_CUDA=ON -DGEO_BUILD_CONTROLLER=OFF -DGEO_BUILD_BENCHMARKS=OFF -DGEO_BUILD_TESTS=ON \
      -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc -DCMAKE_CUDA_ARCHITECTURES=90 \
      -DCMAKE_PREFIX_PATH="$torch_prefix;$sysroot/usr;$sysroot/$multiarch/cmake;$sysroot/usr/share/cmake" \
      -DPKG_CONFIG_EXECUTABLE="$sysroot/usr/bin/pkgconf" -DCMAKE_POLICY_VERSION_MINIMUM=3.5 \
      -DCMAKE_CXX_FLAGS="-I$sysroot/usr/include" \
      >"$out/configure.txt" 2>&1 &&
    cmake --build "$wbuild" -j "$jobs" --target geotrain geotrain-worker codec_test \
      >"$out/build.txt" 2>&1; then
    echo "built in $((SECONDS - t0)) s since the start"
  else
    check "worker build"
    { tail -n 40 "$out/configure.txt"; grep -A12 '^FAILED' "$out/build.txt"; } 2>/dev/null || true
    report
  fi

  echo "== 4. codecs: CUDA tensors give the CPU bytes (codecs, flat updates, parity fingerprints)"
  local t
  # sync_test apart: a failure to build it costs its tests, not the training.
  cmake --build "$wbuild" -j "$jobs" --target sync_test >"$out/build-sync-test.txt" 2>&1 ||
    { check "sync_test build"; grep -A12 '^FAILED' "$out/build-sync-test.txt" || true; }
  for t in codec/codec_test sync/sync_test; do
    [[ -x $wbuild/tests/worker/$t ]] || continue
    local log="$out/$(basename "$t")-cuda.txt"
    if "$wbuild/tests/worker/$t" --gtest_filter='*Cuda*' >"$log" 2>&1; then
      grep -E '^\[  (PASSED|SKIPPED) ' "$log" || true
      ! grep -q '^\[  SKIPPED ' "$log" || check "$(basename "$t") CUDA tests skipped on a GPU"
    else
      tail -30 "$log"
      check "$(basename "$t") CUDA tests"
    fi
  done

  local geotrain="$wbuild/worker/geotrain" data="$bundle/data/fashion-mnist"
  echo "== 5. two workers train the cnn on the GPU (DTS, qsgd-4, loopback), $steps steps"
  rm -rf "$out/cnn"
  if "$geotrain" local --regions a,b --preset lan --algorithm dts --codec qsgd --bits 4 \
      --model cnn --steps "$steps" --eval-interval 500 --set training.device=cuda \
      --set dataset.path="$data" -o "$out/cnn" >"$out/cnn.txt" 2>&1; then
    grep -m1 -h 'device' "$out/cnn/logs/worker-0.log" || true
    python3 - "$out/cnn/summary.json" <<'EOF' || check "cnn on the GPU"
import json, sys
s = json.load(open(sys.argv[1]))
ms = s["perStepMilliseconds"]
print(f"cnn: accuracy {s['testAccuracy']:.4f}, {s['stepsPerSecond']:.1f} steps/s, "
      f"final models identical: {s['modelsAgree']}, ms/step compute {ms['compute']:.2f} "
      f"sync {ms['sync']:.2f} codec {ms['codec']:.3f} waiting {ms['wait']:.2f}")
sys.exit(0 if s["testAccuracy"] >= 0.88 and s["modelsAgree"] else 1)
EOF
  else
    tail -30 "$out/cnn.txt"
    check "cnn on the GPU"
  fi

  echo "== 6. resnet18 on the GPU: the training thread's encoding against its step"
  # The job as a user runs it (DTS's auto K and D), where the target is
  # checked; then a round every step (K = D = 1), the most encoding a step
  # can carry, reported beside it.
  local run k
  for run in auto every-step; do
    k=()
    [[ $run == every-step ]] && k=(--period 1 --delay 1)
    rm -rf "$out/resnet18-$run"
    if GEO_SYNC_STAGE_TIMES=device "$geotrain" local --regions a,b --preset lan --algorithm dts \
        --codec qsgd --bits 4 "${k[@]}" --model resnet18 --steps 300 --eval-interval 0 \
        --set training.device=cuda --set dataset.path="$data" -o "$out/resnet18-$run" \
        >"$out/resnet18-$run.txt" 2>&1; then
      grep -h -m1 'time in the synchronizer' "$out/resnet18-$run/logs/worker-0.log" | sed 's/^.* I //' || true
      python3 - "$out/resnet18-$run/summary.json" "$run" <<'EOF' || check "resnet18 encoding under 5% of a step"
import json, sys
s = json.load(open(sys.argv[1]))
ms = s["perStepMilliseconds"]
step = ms["compute"] + ms["sync"]
encode = ms["encode"] / step if step > 0 else 1.0
codec = ms["codec"] / step if step > 0 else 1.0
auto = sys.argv[2] == "auto"
print(f"resnet18 ({'DTS defaults' if auto else 'a round every step'}): {s['stepsPerSecond']:.1f} steps/s, "
      f"ms/step compute {ms['compute']:.2f} sync {ms['sync']:.2f} codec {ms['codec']:.3f} "
      f"encode {ms['encode']:.3f} waiting {ms['wait']:.2f}: encoding {100 * encode:.2f}% of a step"
      + (" (target < 5%)" if auto else "") + f", encoding and decoding {100 * codec:.2f}%")
sys.exit(0 if not auto or encode < 0.05 else 1)
EOF
    else
      tail -30 "$out/resnet18-$run.txt"
      check "resnet18 on the GPU ($run)"
    fi
  done
  if ((wan > 0)); then wan_check "$geotrain" "$data"; fi
  echo "gpu-check: $((SECONDS - t0)) s"
  report
}

# Check 7: resnet18 where the link is the limit (docs/benchmarks.md,
# "resnet18 on one GPU at 100 Mbit/s").
wan_check() {
  local geotrain=$1 data=$2 t0=$SECONDS
  echo "== 7. resnet18 on the GPU, 4 workers, the namespace network at 100 Mbit/s (${wan} s at most)"
  local bench=(bench/wan_time_to_accuracy.sh --build "$(dirname "$(dirname "$geotrain")")" --models resnet18
    --set training.device=cuda --set dataset.path="$data")
  local runs=/tmp/gpu-check-wan
  rm -rf "$runs" && mkdir -p "$runs/tta" "$runs/ref"
  left() { echo $((wan - (SECONDS - t0))); }
  (cd "$repo" && timeout -k 10 "$(left)" "${bench[@]}" --network netns --configs default,allreduce-fp32 \
    --networks world --short allreduce-fp32=3 --reference "$runs/ref" --steps-resnet18 800 \
    --out "$runs/tta") || check "resnet18 on the namespace network"
  if (($(left) > 30)); then
    # Allreduce's steps to the target do not depend on the network: over
    # loopback, the quickest, for what is left of the time.
    (cd "$repo" && timeout -k 10 "$(left)" "${bench[@]}" --network userspace --configs allreduce-fp32 \
      --networks '' --steps-resnet18 600 --out "$runs/ref") ||
      echo "allreduce fp32's reference stopped at the time limit: its evaluations so far are in wan.tgz"
  fi
  find "$runs" -path '*/logs/*' -size +2M -delete
  tar czf "$out/wan.tgz" -C "$runs" . && echo "runs: $out/wan.tgz"
}

report() {
  if ((${#failures[@]})); then
    echo "gpu-check: FAILED: ${failures[*]}"
    exit 1
  fi
  echo "gpu-check: every check passed"
  exit 0
}

case $mode in
  bundle) make_bundle ;;
  run) run_check ;;
esac
