// libgeotrain-worker-training.so: the part of geotrain-worker that needs
// LibTorch, which worker_main.cc loads once the connections are opening
// (worker/app/training_library.h says why).

#include <exception>
#include <utility>

#include "worker/app/run.h"

extern "C" int geoRunTraining(geo::app::TrainingCall* call) {
  try {
    return geo::app::runWorker(*call->config, *call->progress, *call->emulation,
                               std::move(*call->connection));
  } catch (const std::exception& e) {
    return geo::app::reportFailure(call->progress, geo::internalError(e.what()));
  }
}
