# geotrain-worker with CUDA: the CUDA runtime, LibTorch built for CUDA, the
# QSGD CUDA kernels, and Fashion-MNIST; non-root. Build from the repository
# root (a GPU is not needed to build):
#   docker build -f docker/worker.Dockerfile -t ghcr.io/geotrain/worker:0.1.0 .
# Debian 12 with NVIDIA's CUDA 12.4 apt repository (the same Debian packages
# as the rest of the project) and the LibTorch 2.4 CUDA 12.4 build from
# download.pytorch.org (Debian's libtorch-dev is CPU-only): it can be built
# only where those sites are reachable. docker/worker-cpu.Dockerfile is the
# same worker from Debian's archive alone (CPU only).
# The build leaves the controller out (-DGEO_BUILD_CONTROLLER=OFF), which
# needs cpp-httplib, libcurl and OpenSSL that the worker does not.

ARG CUDA_PKG_VERSION=12-4
ARG LIBTORCH_URL=https://download.pytorch.org/libtorch/cu124/libtorch-cxx11-abi-shared-with-deps-2.4.1%2Bcu124.zip

FROM debian:12 AS build
ARG CUDA_PKG_VERSION
ARG LIBTORCH_URL
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates curl unzip gnupg \
 && curl -fsSLo /tmp/cuda-keyring.deb \
      https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/cuda-keyring_1.1-1_all.deb \
 && dpkg -i /tmp/cuda-keyring.deb \
 && apt-get update \
 && apt-get install -y --no-install-recommends \
      build-essential cmake pkg-config \
      cuda-nvcc-${CUDA_PKG_VERSION} cuda-cudart-dev-${CUDA_PKG_VERSION} \
      libfmt-dev libspdlog-dev libcli11-dev libyaml-cpp-dev nlohmann-json3-dev \
      libzmq3-dev cppzmq-dev libsodium-dev prometheus-cpp-dev zlib1g-dev \
 && rm -rf /var/lib/apt/lists/*
RUN curl -fsSL -o /tmp/libtorch.zip "${LIBTORCH_URL}" \
 && unzip -q /tmp/libtorch.zip -d /opt \
 && rm /tmp/libtorch.zip
WORKDIR /src
COPY CMakeLists.txt ./
COPY cmake cmake
COPY common common
COPY kernels kernels
COPY worker worker
RUN cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DGEO_USE_CUDA=ON -DGEO_BUILD_CONTROLLER=OFF \
      -DGEO_BUILD_TESTS=OFF -DGEO_BUILD_BENCHMARKS=OFF \
      -DCMAKE_PREFIX_PATH=/opt/libtorch -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc \
 && cmake --build build -j"$(nproc)" --target geotrain-worker geotrain

FROM debian:12-slim
ARG CUDA_PKG_VERSION
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
ENV LD_LIBRARY_PATH=/opt/libtorch/lib:/usr/local/cuda/lib64 \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
USER 65532:65532
EXPOSE 7000 9400
ENTRYPOINT ["/usr/local/bin/geotrain-worker"]
