#pragma once
// Codec: how a synchronizer turns an fp32 tensor into the bytes of one frame
// payload and back -- identity (fp32), fp16, bf16 or QSGD (kernels/). Modelled
// on PyTorch DDP communication hooks: the codec only compresses; which tensor
// is sent when, and what is done with the average, is the synchronizer's job.
//
// Contract: tensors are contiguous fp32, on the CPU or a CUDA device (the
// residual on the values' device); payloads are host bytes. QSGD encodes and
// decode-accumulates a CUDA tensor on the device (kernels/qsgd_cuda.h: only
// the packed bytes cross PCIe, ordered after the work LibTorch queued on the
// legacy default stream, which the worker never changes); the other codecs
// stage a CUDA tensor through the host. A build without the CUDA kernels
// refuses a CUDA tensor with an error that says so. The same tensor, seed and
// codec give the same bytes on either device, so CPU and GPU regions mix.
// encode() writes exactly encodedBytes(numel) bytes. With a residual (error
// feedback), encode() quantizes w = values + residual and leaves
// residual = w - decode(encode(w)); lossless codecs leave it at zero.
// decodeAccumulate() adds alpha * decoded values to `out`.
//
// Threading: a Codec is immutable after construction; calls may run
// concurrently on disjoint tensors. Errors: bad arguments (sizes, dtypes,
// devices, non-finite values for QSGD, corrupt payloads) throw geo::Error
// naming what was wrong; makeCodec returns a Status for a bad spec.

#include <torch/torch.h>

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "kernels/qsgd.h"
#include "worker/transport/frame.h"

namespace geo::codec {

struct CodecSpec {
  std::string name = "qsgd";  // identity | fp16 | bf16 | qsgd
  int bits = 4;               // qsgd: 2, 4 or 8
  int64_t bucket = 512;       // qsgd bucket size
  bool l2Scale = false;       // qsgd: L2-norm instead of max-abs scale
  int threads = 0;            // qsgd CPU threads (0: all OpenMP threads)
};

class Codec {
 public:
  virtual ~Codec() = default;
  virtual transport::CodecId id() const = 0;
  virtual std::string describe() const = 0;
  virtual int64_t encodedBytes(int64_t numel) const = 0;
  // `key` names the random stream (QSGD's stochastic rounding); others ignore it.
  virtual void encode(const torch::Tensor& values, kernels::RngKey key, std::span<std::byte> out,
                      torch::Tensor* residual) const = 0;
  virtual void decodeAccumulate(std::span<const std::byte> bytes, float alpha,
                                torch::Tensor& out) const = 0;
  // out = decoded values (out's contents are replaced).
  void decode(std::span<const std::byte> bytes, torch::Tensor& out) const;

  // Part of a flat (1-D) tensor and of its payload: values [offset, offset +
  // numel), payload bytes [byteOffset, byteOffset + encodedBytes(numel)).
  struct Slice {
    int64_t offset = 0;
    int64_t numel = 0;
    int64_t byteOffset = 0;
    kernels::RngKey key;  // encode: the slice's random stream
  };
  // encode() of each slice of `values` (and of `residual`, shaped alike)
  // into `out` at its byteOffset; payload bytes outside the slices are left
  // as they are. The same bytes as encoding the slices one by one; QSGD on
  // a CUDA tensor does them all with one synchronization and one copy.
  virtual void encodeSlices(const torch::Tensor& values, std::span<const Slice> slices,
                            std::span<std::byte> out, torch::Tensor* residual) const;
  // decodeAccumulate() of each slice's bytes into its part of `out`.
  virtual void decodeAccumulateSlices(std::span<const std::byte> bytes,
                                      std::span<const Slice> slices, float alpha,
                                      torch::Tensor& out) const;

  // Values [a, b) of an encoding of n values, as the encoding of b - a
  // values on their own: decodeAccumulate() of what this returns adds, at
  // each of those positions, exactly what decoding all n adds there. a and
  // b must be multiples of rangeAlignment() (b may also be n), 0 <= a < b
  // <= n, and `bytes` exactly encodedBytes(n) long (throws geo::Error
  // otherwise). The result views `bytes` where the range lies in one piece
  // there (identity, fp16, bf16), else `staging`, which it fills (QSGD: the
  // range's scales, then its codes). What lets a synchronizer decode a
  // large model slice by slice, holding a slice at a time.
  virtual int64_t rangeAlignment() const { return 1; }
  virtual std::span<const std::byte> rangeBytes(std::span<const std::byte> bytes, int64_t n,
                                                int64_t a, int64_t b,
                                                std::vector<std::byte>& staging) const;

  // fp32 bytes / encoded bytes for n values: 1, 2, 2 or ~7.9 (qsgd-4/512).
  double compressionRatio(int64_t numel) const;
};

// InvalidArgument naming the field and the allowed values for a bad spec.
StatusOr<std::unique_ptr<Codec>> makeCodec(const CodecSpec& spec);

}  // namespace geo::codec
