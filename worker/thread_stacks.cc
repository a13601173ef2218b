// Thread stacks large enough for this process's static TLS.
//
// glibc keeps every thread's static TLS (that of the libraries loaded at
// start) at the top of the thread's stack, and pthread_create refuses
// (EINVAL) a stack size that cannot hold it plus 16 KiB. OpenBLAS's
// pthreads and OpenMP builds alone carry 60 KiB of static TLS, LibTorch
// 10 KiB; Debian's civetweb, the HTTP server of the metrics endpoint
// (prometheus-cpp's Exposer), asks for stacks of 100 KiB, so with OpenBLAS
// loaded it could start no thread and the worker ran without metrics
// ("Cannot create threads: error 0"). The executable's definition comes
// first in symbol lookup, so every library's pthread_attr_setstacksize
// call lands here (geotrain-worker exports it: worker/CMakeLists.txt), and
// a stack asked for below 1 MiB gets 1 MiB: what a thread then uses is
// only the pages it touches.

#include <dlfcn.h>
#include <pthread.h>

#include <algorithm>
#include <cstddef>

namespace {

constexpr size_t kMinThreadStack = size_t{1} << 20;

using SetStackSize = int (*)(pthread_attr_t*, size_t);

SetStackSize realSetStackSize() {
  static const auto real =
      reinterpret_cast<SetStackSize>(dlsym(RTLD_NEXT, "pthread_attr_setstacksize"));
  return real;
}

}  // namespace

extern "C" int pthread_attr_setstacksize(pthread_attr_t* attr, size_t size) noexcept {
  const SetStackSize real = realSetStackSize();
  if (real == nullptr) return 0;  // keep the default size, which fits
  return real(attr, std::max(size, kMinThreadStack));
}
