# geotrain-worker with CUDA: the CUDA runtime, LibTorch built for CUDA, the
# QSGD CUDA kernels, and Fashion-MNIST; non-root. Build from the repository
# root (a GPU is not needed to build):
#   docker build -f docker/worker.Dockerfile -t ghcr.io/geotrain/worker:0.1.0 .
# Debian 12 with NVIDIA's CUDA 13.0 apt repository (the same Debian packages
# as the rest of the project) and PyTorch's LibTorch 2.9.1 built for CUDA 13.0
# (cu130, C++11 ABI) from download.pytorch.org (Debian's libtorch-dev is
# CPU-only): it can be built only where those sites are reachable.
# docker/worker-cpu.Dockerfile is the same worker from Debian's archive alone
# (CPU only). The kernels are compiled for the project's
# CMAKE_CUDA_ARCHITECTURES, 80-real;90 (A100; H100 and H200, with PTX for
# newer GPUs). CUDA 13 needs NVIDIA driver 580 or newer on the nodes.
# The build leaves the controller out (-DGEO_BUILD_CONTROLLER=OFF), which
# needs cpp-httplib, libcurl and OpenSSL that the worker does not.
# tests/docker/dockerfile_test.py --lint checks this file without a network
# (ctest -L lint): the sources it copies, the options and targets it builds,
# its ARGs, and that the CUDA versions below agree.

# The CUDA toolkit (NVIDIA's package names spell the version 13-0), and the
# LibTorch built for the same CUDA major version: the worker links both
# LibTorch and the CUDA runtime, and a LibTorch for another CUDA major
# version (cu12x) does not work with CUDA 13's runtime and kernels. Change
# all three together.
ARG CUDA_VERSION=13.0
ARG CUDA_PKG_VERSION=13-0
ARG LIBTORCH_URL=https://download.pytorch.org/libtorch/cu130/libtorch-shared-with-deps-2.9.1%2Bcu130.zip

FROM debian:12 AS build
ARG CUDA_VERSION
ARG CUDA_PKG_VERSION
ARG LIBTORCH_URL
# nvcc and the CUDA libraries' headers, which LibTorch's CMake package looks
# up (cuBLAS, cuFFT, cuRAND, cuSOLVER, cuSPARSE, NVRTC, the NVTX 3 headers)
# and cuDNN (a LibTorch built with cuDNN refuses to configure without it).
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates curl unzip gnupg \
 && curl -fsSLo /tmp/cuda-keyring.deb \
      https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/cuda-keyring_1.1-1_all.deb \
 && dpkg -i /tmp/cuda-keyring.deb \
 && apt-get update \
 && apt-get install -y --no-install-recommends \
      build-essential cmake pkg-config \
      cuda-nvcc-${CUDA_PKG_VERSION} cuda-libraries-dev-${CUDA_PKG_VERSION} \
      cuda-nvtx-${CUDA_PKG_VERSION} libcudnn9-dev-cuda-13 \
      libfmt-dev libspdlog-dev libcli11-dev libyaml-cpp-dev nlohmann-json3-dev \
      libzmq3-dev cppzmq-dev libsodium-dev prometheus-cpp-dev zlib1g-dev \
 && rm -rf /var/lib/apt/lists/*
# LibTorch ships {fmt} headers of its own, a newer {fmt} than the libfmt and
# spdlog from Debian the worker links: the build must not see them.
RUN curl -fsSL -o /tmp/libtorch.zip "${LIBTORCH_URL}" \
 && unzip -q /tmp/libtorch.zip -d /opt \
 && rm -rf /tmp/libtorch.zip /opt/libtorch/include/fmt
WORKDIR /src
COPY CMakeLists.txt ./
COPY cmake cmake
COPY common common
COPY kernels kernels
COPY worker worker
# LibTorch's CMake package picks the CUDA architectures of its own flags from
# TORCH_CUDA_ARCH_LIST (without a GPU to look at, an older list than CUDA 13
# compiles for): the project's 80-real;90. nvtx3_dir: the NVTX 3 headers of
# the toolkit (LibTorch looks for them in a third_party folder of the project
# being built, and CUDA 13 has no libnvToolsExt to fall back on).
ENV TORCH_CUDA_ARCH_LIST="8.0;9.0"
RUN cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DGEO_USE_CUDA=ON -DGEO_BUILD_CONTROLLER=OFF \
      -DGEO_BUILD_TESTS=OFF -DGEO_BUILD_BENCHMARKS=OFF \
      -DCMAKE_PREFIX_PATH=/opt/libtorch \
      -DCMAKE_CUDA_COMPILER=/usr/local/cuda-${CUDA_VERSION}/bin/nvcc \
      -Dnvtx3_dir=/usr/local/cuda-${CUDA_VERSION}/include \
 && cmake --build build -j"$(nproc)" --target geotrain-worker geotrain \
 && strip build/worker/geotrain-worker build/worker/geotrain \
 && strip --strip-unneeded build/worker/libgeotrain-worker-base.so \
      build/worker/libgeotrain-worker-training.so

FROM debian:12-slim
ARG CUDA_VERSION
ARG CUDA_PKG_VERSION
# The CUDA runtime of the kernels (libcudart.so.13); LibTorch brings its own
# CUDA libraries (cuBLAS, cuDNN, ...) in its lib folder. The driver
# (libcuda.so.1) comes from the node, through NVIDIA's container runtime.
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates curl gnupg \
 && curl -fsSLo /tmp/cuda-keyring.deb \
      https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/cuda-keyring_1.1-1_all.deb \
 && dpkg -i /tmp/cuda-keyring.deb && rm /tmp/cuda-keyring.deb \
 && apt-get update \
 && apt-get install -y --no-install-recommends \
      cuda-cudart-${CUDA_PKG_VERSION} \
      libfmt9 libspdlog1.10 libyaml-cpp0.7 libzmq5 libsodium23 \
      libprometheus-cpp-core1.0 libprometheus-cpp-pull1.0 zlib1g libgomp1 \
      dataset-fashion-mnist \
 && apt-get purge -y curl gnupg && apt-get autoremove -y \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /opt/libtorch/lib /opt/libtorch/lib
COPY --from=build /src/build/worker/geotrain-worker /src/build/worker/geotrain /usr/local/bin/
# geotrain-worker's two libraries (worker/app/training_library.h), where it
# looks for them: ../lib/geotrain/ from its folder.
COPY --from=build /src/build/worker/libgeotrain-worker-base.so \
     /src/build/worker/libgeotrain-worker-training.so /usr/local/lib/geotrain/
# No NVIDIA_VISIBLE_DEVICES here: NVIDIA's device plugin sets it for the
# GPUs a pod was given (resources nvidia.com/gpu), and a default of "all"
# in the image would hand every GPU of the node to a pod that asked for none.
ENV LD_LIBRARY_PATH=/opt/libtorch/lib:/usr/local/cuda-${CUDA_VERSION}/lib64 \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
USER 65532:65532
EXPOSE 7000 9400
ENTRYPOINT ["/usr/local/bin/geotrain-worker"]
