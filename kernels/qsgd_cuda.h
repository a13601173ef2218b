#pragma once
// CUDA versions of the QSGD and fp16/bf16 codecs (kernels/qsgd.h,
// kernels/casts.h). For the same input, configuration and RngKey they produce
// the same bytes and the same floats, bit for bit, as the CPU kernels: both
// run the per-element arithmetic of kernels/qsgd_math.h and casts_math.h with
// IEEE fp32 round-to-nearest and no fused multiply-add, draw the same Philox
// numbers, and sum L2 norms in fp64 in the same order. The one exception is
// the payload of NaN *results* of arithmetic (accumulate into an out[k] that
// is already NaN or Inf, or an fp16/bf16 NaN code scaled by alpha): GPUs
// produce the canonical NaN where the CPU propagates the operand's payload;
// such outputs are NaN on both.
//
// All pointers are DEVICE pointers (cudaMalloc, or managed memory) on the
// current device, and all work is queued on `stream` (nullptr: the legacy
// default stream). Buffers may have any alignment the element type allows
// (aligned buffers take the faster, vectorized path), but must not overlap
// unless stated.
//
// Synchronization: functions that must report a value or an error computed on
// the device -- every QSGD function (NaN/Inf input, corrupt payload) and the
// castTo* encoders (non-finite count) -- wait for `stream` to drain
// (cudaStreamSynchronize) before returning, so everything queued earlier on
// that stream has finished too. castFrom* and accumulate* only enqueue work
// and return at once.
//
// Errors: the argument checks of the CPU functions (geo::Error), the same
// geo::Error for NaN/Inf input and corrupt scales, and a geo::Error naming the
// CUDA call for any CUDA failure (including a launch on a device the kernels
// were not built for). Inputs and the error-feedback residual are never
// modified by a call that throws because of the data; the encoder's output is
// then unspecified, and the QSGD decoders leave `out` untouched.
//
// Threading: callable concurrently from several host threads on disjoint
// buffers. Each host thread keeps a few bytes of device and pinned host
// scratch per device for the error flag and counts (allocated on first use,
// freed at thread exit); do not call cudaDeviceReset() while a host thread
// that used these functions may call them again.

#include <cstdint>

#include "kernels/qsgd.h"

// The CUDA runtime's stream handle, declared as cuda_runtime_api.h does so that
// plain C++ can include this header without the CUDA include path.
struct CUstream_st;
using cudaStream_t = CUstream_st*;  // NOLINT(readability-identifier-naming)

namespace geo::kernels {

// True iff the CUDA runtime reports at least one device and these kernels can
// run on the current one (a driver is present and the binary carries code for
// its architecture). Never throws; false without a driver (CI).
bool cudaDeviceAvailable() noexcept;

// qsgdEncode on the device (same contract and bytes). With `residual`, it must
// not alias `in`. Synchronizes `stream`.
void qsgdEncodeCuda(const float* in, int64_t n, const QsgdConfig& cfg, RngKey key, uint8_t* out,
                    int64_t outBytes, float* residual, cudaStream_t stream);

// qsgdDecode on the device; throws on scales that are negative or not finite
// (before writing `out`). Synchronizes `stream`.
void qsgdDecodeCuda(const uint8_t* in, int64_t inBytes, int64_t n, const QsgdConfig& cfg,
                    float* out, cudaStream_t stream);

// qsgdDecodeAccumulate on the device (same arithmetic: out[k] + alpha *
// Q(w)_k as kernels/qsgd.h computes it). alpha must be finite; corrupt scales
// throw before `out` is modified. Synchronizes `stream`.
void qsgdDecodeAccumulateCuda(const uint8_t* in, int64_t inBytes, int64_t n, const QsgdConfig& cfg,
                              float alpha, float* out, cudaStream_t stream);

// The casts of kernels/casts.h. The encoders return how many outputs are not
// finite and synchronize `stream`; the decoders are asynchronous.
int64_t castToFp16Cuda(const float* in, int64_t n, uint16_t* out, cudaStream_t stream);
int64_t castToBf16Cuda(const float* in, int64_t n, uint16_t* out, cudaStream_t stream);
void castFromFp16Cuda(const uint16_t* in, int64_t n, float* out, cudaStream_t stream);
void castFromBf16Cuda(const uint16_t* in, int64_t n, float* out, cudaStream_t stream);
// out[k] = out[k] + alpha * decoded(in[k]).
void accumulateFp16Cuda(const uint16_t* in, int64_t n, float alpha, float* out,
                        cudaStream_t stream);
void accumulateBf16Cuda(const uint16_t* in, int64_t n, float alpha, float* out,
                        cudaStream_t stream);

// ---- Device tensors, host payloads --------------------------------------------
// What a worker that trains on a GPU needs: its update lives on the device,
// the payload it sends and receives lives in host memory (the transport's
// buffers). These two functions move only the packed bytes across PCIe,
// through pinned buffers, on a stream of the calling host thread's own
// (non-blocking, one per thread and device, created on first use).
//
// Ordering: `after` is the stream the caller's compute runs on (nullptr: the
// legacy default stream, where LibTorch queues work unless told otherwise).
// The kernels start only once everything queued on `after` so far has
// finished (an event, not a device-wide synchronization), and the functions
// return only once their own work has finished, so work queued on `after`
// later sees `residual` / `out` updated. Other streams are not ordered.
//
// Contract and errors as qsgdEncodeCuda / qsgdDecodeAccumulateCuda, with
// `hostOut` / `hostIn` ordinary host memory of any alignment.

// Encodes device `in` (and updates device `residual`) into hostOut[0, outBytes).
void qsgdEncodeCudaToHost(const float* in, int64_t n, const QsgdConfig& cfg, RngKey key,
                          uint8_t* hostOut, int64_t outBytes, float* residual, cudaStream_t after);

// Device out[k] += alpha * Q(w)_k for the host payload hostIn[0, inBytes).
void qsgdDecodeAccumulateCudaFromHost(const uint8_t* hostIn, int64_t inBytes, int64_t n,
                                      const QsgdConfig& cfg, float alpha, float* out,
                                      cudaStream_t after);

// Several slices of one device buffer (a worker's flat update: one slice per
// parameter tensor, each quantized on its own) to and from one host payload,
// with one synchronization and one copy across PCIe for all of them instead
// of one each. Slice k covers values [offset, offset + numel) of the buffer
// (n values long) and payload bytes [byteOffset, byteOffset +
// qsgdEncodedBytes(numel)); slices must not overlap, in either. Payload bytes
// outside every slice are neither written (encode) nor read (decode).
struct QsgdSlice {
  int64_t offset = 0;
  int64_t numel = 0;  // > 0
  int64_t byteOffset = 0;
  RngKey key;  // encode: the slice's random stream
};

// Each slice encoded as qsgdEncodeCudaToHost would encode it alone (same
// bytes, same residual). Ordering as above. On NaN/Inf input it throws the
// encoder's error; the residual of some slices may then be updated already
// (as encoding the slices one after another would have left it).
void qsgdEncodeSlicesCudaToHost(const float* in, float* residual, int64_t n,
                                const QsgdSlice* slices, int64_t count, const QsgdConfig& cfg,
                                uint8_t* hostOut, int64_t outBytes, cudaStream_t after);

// out[offset + k] += alpha * Q(w)_k for every slice, as
// qsgdDecodeAccumulateCudaFromHost on each. A corrupt scale throws naming
// the slice and bucket; `out` is then unspecified.
void qsgdDecodeAccumulateSlicesCudaFromHost(const uint8_t* hostIn, int64_t inBytes,
                                            const QsgdSlice* slices, int64_t count,
                                            const QsgdConfig& cfg, float alpha, float* out,
                                            int64_t n, cudaStream_t after);

}  // namespace geo::kernels
