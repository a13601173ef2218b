# geotrain-worker for CPUs: Debian 12's LibTorch 1.13 (CPU only) and
# Fashion-MNIST, for CPU clusters, laptops and CI; non-root, read-only root
# file system friendly (writes only under /tmp and checkpoint.dir, which a
# pod mounts). Build from the repository root, with podman or docker:
#   scripts/images.sh worker-cpu
#   docker build -f docker/worker-cpu.Dockerfile -t ghcr.io/geotrain/worker-cpu:0.1.0 .
# Every package comes from Debian's archive. The size (about 1.2 GB, 396
# packages) is LibTorch's: Debian's libtorch1.13 depends on OpenCV, FFmpeg,
# oneDNN, ONNX, BLAS and more, and through OpenCV on Mesa (with LLVM), GDAL
# and PROJ. The largest: libtorch1.13 131 MB, libllvm15 115 MB, libdnnl2
# 39 MB, libicu72 36 MB, libmfx1 27 MB, Mesa's drivers 25 MB, libgdal32
# 24 MB, libz3-4 23 MB, proj-data 23 MB. The worker's binaries are a few MB,
# Fashion-MNIST 30 MB. (tests/docker/dockerfile_test.py --built lists them.)
# libopenblas0-pthread is LibTorch's BLAS (libtorch1.13 only recommends it;
# without it the reference BLAS trains the mlp at a quarter of the speed).
# Not the serial build: Debian builds it without locks, and a worker calls
# the BLAS from two threads (training, and evaluation on its own thread).

FROM debian:12 AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      build-essential cmake pkg-config \
      libtorch-dev zlib1g-dev \
      libfmt-dev libspdlog-dev libcli11-dev libyaml-cpp-dev nlohmann-json3-dev \
      libzmq3-dev cppzmq-dev libsodium-dev prometheus-cpp-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY CMakeLists.txt ./
COPY cmake cmake
COPY common common
COPY kernels kernels
COPY worker worker
RUN cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DGEO_USE_CUDA=OFF -DGEO_BUILD_CONTROLLER=OFF \
      -DGEO_BUILD_TESTS=OFF -DGEO_BUILD_BENCHMARKS=OFF \
 && cmake --build build -j"$(nproc)" --target geotrain-worker geotrain \
 && strip build/worker/geotrain-worker build/worker/geotrain \
 && strip --strip-unneeded build/worker/libgeotrain-worker-base.so \
      build/worker/libgeotrain-worker-training.so

FROM debian:12-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      libtorch1.13 libopenblas0-pthread libfmt9 libspdlog1.10 libyaml-cpp0.7 libzmq5 libsodium23 \
      libprometheus-cpp-core1.0 libprometheus-cpp-pull1.0 zlib1g libgomp1 \
      dataset-fashion-mnist \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/build/worker/geotrain-worker /src/build/worker/geotrain /usr/local/bin/
# geotrain-worker's two libraries (worker/app/training_library.h), where it
# looks for them: ../lib/geotrain/ from its folder.
COPY --from=build /src/build/worker/libgeotrain-worker-base.so \
     /src/build/worker/libgeotrain-worker-training.so /usr/local/lib/geotrain/
USER 65532:65532
EXPOSE 7000 9400
ENTRYPOINT ["/usr/local/bin/geotrain-worker"]
