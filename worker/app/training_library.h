#pragma once
// geotrain-worker in two parts. The executable parses the command line,
// sets up logging and the fault signals, and opens the connections to the
// peers (connect.h); everything that needs LibTorch -- the model, the data,
// the synchronizer, the trainer -- is a shared library of its own,
// libgeotrain-worker-training.so, which the executable loads after that.
// Why: loading LibTorch (Debian's links about 290 libraries, OpenCV and
// FFmpeg among them) and running its static initializers takes 0.45 s of CPU,
// 0.87-0.91 s when four workers start at once on two cores; the
// connections' handshakes with far peers (five round trips: 1.2 s at 230
// ms) now run during it instead of after it. No LibTorch in this header.
//
// What both parts use -- the transport, the configuration, logging -- is in
// libgeotrain-worker-base.so, whose symbols the training library resolves:
// one copy of each in the process (worker/CMakeLists.txt).

#include <chrono>
#include <optional>
#include <string>

#include "common/status.h"
#include "common/worker_config.h"
#include "worker/app/connect.h"
#include "worker/app/worker_output.h"

namespace geo::app {

// What `geotrain local` emulates on one machine (train::StepEmulation).
struct Emulation {
  double slowdown = 1;                       // >= 1: every step takes this many times as long
  std::chrono::milliseconds minStepTime{0};  // > 0: every step's compute lasts at least this
};

// runWorker's arguments, through the library's C entry point.
struct TrainingCall {
  const WorkerConfig* config = nullptr;
  const Progress* progress = nullptr;
  const Emulation* emulation = nullptr;
  Connection* connection = nullptr;  // moved from
};

// The library's file name, and its entry point: runWorker (run.h) with the
// call's arguments; a bug's exception is reported there and ends as
// kExitFailure.
inline constexpr const char* kTrainingLibrary = "libgeotrain-worker-training.so";
inline constexpr const char* kTrainingEntry = "geoRunTraining";
struct TrainingLibrary {
  int (*run)(TrainingCall*) = nullptr;
  std::string path;  // where it was loaded from
};

// Loads the library from next to this process's executable, or else from
// <executable's folder>/../lib/geotrain/ (an installed layout: bin/ and
// lib/geotrain/), with its entry point. Not found, or not loadable
// (a library it needs is missing): FailedPrecondition naming each path
// tried and the loader's reason.
StatusOr<TrainingLibrary> loadTrainingLibrary();

// OpenBLAS built with DYNAMIC_ARCH (Debian's) picks its kernels by the
// CPU's model when it loads, and a release does not know CPUs newer than
// itself: Debian 12's 0.3.21 takes an Emerald Rapids Xeon (family 6, model
// 207) for an unknown one and runs its generic "Prescott" (SSE3) kernels,
// with which a step of a 20M-parameter mlp took 1.6 times as long as with
// its AVX-512 ones. So, before LibTorch (and with it OpenBLAS) is loaded
// and before any other thread runs: unless OPENBLAS_CORETYPE is set
// already (the user's choice wins), sets it by what the CPU and the kernel
// support -- "SkylakeX" with AVX-512 F, CD, BW, DQ and VL, "Haswell" with
// AVX2 and FMA (the kernels OpenBLAS uses for every later CPU of those
// families; for fp32 products Cooper Lake's and Zen's are the same) -- and
// returns what it did, for the log; nullopt when it did nothing (set
// already, or an older CPU, which OpenBLAS knows).
std::optional<std::string> chooseBlasKernels();

// glibc's malloc serves a block of at least its mmap threshold with a
// mapping of its own, given back to the kernel when freed, and smaller ones
// from its heaps, which keep what is freed for later. The threshold starts
// at 128 KiB and rises to the size of every such block freed (up to 32
// MiB), so after a few steps the megabyte-sized transients of a large
// model's rounds (encoded contributions, 4 MB slices of a completion, the
// transport's chunks) come from the heaps and their pages stay resident
// when freed. Fixes the threshold at 1 MiB (which also stops it rising)
// unless MALLOC_MMAP_THRESHOLD_ is set (the user's choice wins); call it
// first in main. Returns whether it did. The 101.3M-parameter mlp's peak
// RSS (docs/algorithms.md, "Memory") went from 2.79-2.85 GB to 2.62 GB,
// its step no slower.
bool fixMmapThreshold();

}  // namespace geo::app
