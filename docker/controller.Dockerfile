# geotrain-controller: a small Debian image, non-root, read-only root file
# system friendly (writes nothing). Build from the repository root:
#   docker build -f docker/controller.Dockerfile -t ghcr.io/geotrain/controller:0.1.0 .
# The build stage compiles the controller side only (-DGEO_BUILD_WORKER=OFF:
# no LibTorch, no CUDA); the runtime stage holds the binary and the shared
# libraries it links (tests/docker/dockerfile_test.py checks the list).

FROM debian:12 AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      build-essential cmake pkg-config ca-certificates \
      libfmt-dev libspdlog-dev libcli11-dev libyaml-cpp-dev nlohmann-json3-dev \
      libzmq3-dev cppzmq-dev libsodium-dev prometheus-cpp-dev \
      libcurl4-openssl-dev libcpp-httplib-dev libssl-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY CMakeLists.txt ./
COPY cmake cmake
COPY common common
# The schema's QSGD limits (constants only; the controller links no kernel).
COPY kernels/qsgd_limits.h kernels/qsgd_limits.h
COPY worker/CMakeLists.txt worker/CMakeLists.txt
COPY worker/transport worker/transport
COPY worker/metrics worker/metrics
COPY controller controller
RUN cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DGEO_BUILD_WORKER=OFF \
      -DGEO_BUILD_TESTS=OFF -DGEO_BUILD_BENCHMARKS=OFF \
 && cmake --build build -j"$(nproc)" --target geotrain-controller \
 && strip build/controller/geotrain-controller

FROM debian:12-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      ca-certificates libcurl4 libyaml-cpp0.7 libspdlog1.10 libfmt9 libsodium23 \
      libprometheus-cpp-core1.0 libprometheus-cpp-pull1.0 libcpp-httplib0.11 libstdc++6 \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/build/controller/geotrain-controller /usr/local/bin/geotrain-controller
USER 65532:65532
EXPOSE 8080 8081
ENTRYPOINT ["/usr/local/bin/geotrain-controller"]
