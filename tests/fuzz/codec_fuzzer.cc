// libFuzzer target for what a worker does with a peer's contribution: decode
// it with FlatCodec::decodeChecked and, if it passes, apply it to a model.
// Built and run by tests/fuzz/run_fuzzers.sh. LibTorch 1.13's headers do not
// compile with clang 14 in C++20 mode, so this target is built with g++
// (-fsanitize=address,undefined, -fsanitize-coverage=trace-cmp for libFuzzer's
// comparison feedback) and linked with clang's libFuzzer engine
// (libclang_rt.fuzzer); the seeds in tests/fuzz/corpus/codec/ give it the
// structure that edge coverage would otherwise have to find.
//
// Input layout (every byte string is a valid input):
//   byte 0   the codec: (b & 7) % 6 picks identity, fp16, bf16, qsgd-2,
//            qsgd-4, qsgd-8; bit 3: QSGD with an L2 scale instead of max-abs;
//            bit 4: the payload is an honest encoding XORed with the rest of
//            the input (reaches the value checks with the right size), else
//            the rest of the input is the payload itself
//   byte 1   the model's layout: 1 + (b & 3) tensors, the first of
//            1 + (b >> 2) * 7 values, then 5, 600 and 1 values (tensors
//            under 32 values travel raw under QSGD, as in a real model)
//   byte 2   the QSGD bucket: 1 + b (1..256)
//   bytes 3.. the payload, or the XOR mask (repeated over the honest payload)
//
// Properties checked (a violation aborts, which libFuzzer reports):
//   - decodeChecked never throws and never crashes, whatever the bytes;
//   - an accepted contribution has the model's size, and every value is
//     finite and within +-kMaxContribution; the model it is applied to
//     stays finite;
//   - a rejected one names a reason among size, malformed, non_finite,
//     out_of_range, with a message;
//   - an honest encoding (an empty mask) is always accepted.

#include <torch/torch.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "worker/codec/codec.h"
#include "worker/sync/flat_codec.h"

namespace {

using geo::sync::detail::FlatCodec;

void check(bool condition) {
  if (!condition) std::abort();
}

geo::codec::CodecSpec specOf(uint8_t selector, uint8_t bucket) {
  static const char* const kNames[] = {"identity", "fp16", "bf16", "qsgd", "qsgd", "qsgd"};
  static const int kBits[] = {4, 4, 4, 2, 4, 8};
  const int which = (selector & 7) % 6;
  geo::codec::CodecSpec spec;
  spec.name = kNames[which];
  spec.bits = kBits[which];
  spec.bucket = 1 + bucket;
  spec.l2Scale = (selector & 8) != 0;
  spec.threads = 1;
  return spec;
}

std::vector<int64_t> layoutOf(uint8_t b) {
  std::vector<int64_t> sizes = {1 + (b >> 2) * 7, 5, 600, 1};
  sizes.resize(1 + (b & 3));
  return sizes;
}

}  // namespace

#if !defined(__clang__)
// GCC's -fsanitize-coverage=trace-cmp also reports floating-point compares,
// which libFuzzer has no hooks for: they are not traced.
extern "C" void __sanitizer_cov_trace_cmpf(float, float) {}
extern "C" void __sanitizer_cov_trace_cmpd(double, double) {}
#endif

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  torch::set_num_threads(1);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  uint8_t control[3] = {};
  std::memcpy(control, data, size < 3 ? size : 3);
  const uint8_t* rest = data + (size < 3 ? size : 3);
  const size_t restSize = size < 3 ? 0 : size - 3;

  auto codec = geo::codec::makeCodec(specOf(control[0], control[2]));
  check(codec.ok());
  const std::vector<int64_t> sizes = layoutOf(control[1]);
  const FlatCodec flat(std::shared_ptr<const geo::codec::Codec>(std::move(*codec)), sizes,
                       /*smallTensorThreshold=*/32);

  const bool honest = (control[0] & 16) != 0;
  std::vector<std::byte> payload;
  if (honest) {
    // A plausible update (small, finite), encoded as a peer would.
    torch::manual_seed(control[1]);
    const torch::Tensor update = torch::randn({flat.numel()}) * 0.01;
    payload = flat.encode(update, 7, 11, nullptr);
    for (size_t i = 0; i < payload.size() && restSize > 0; ++i) {
      payload[i] ^= static_cast<std::byte>(rest[i % restSize]);
    }
  } else {
    payload.resize(restSize);
    if (restSize > 0) std::memcpy(payload.data(), rest, restSize);
  }

  torch::Tensor model = torch::ones({flat.numel()});
  torch::Tensor decoded = torch::empty({flat.numel()});
  std::string reason;
  geo::Status ok;
  try {
    ok = flat.decodeChecked(payload, decoded, reason);
  } catch (...) {
    std::abort();  // the contract: nothing a peer sends throws
  }
  if (ok.ok()) {
    check(static_cast<int64_t>(payload.size()) == flat.encodedBytes());
    check(torch::isfinite(decoded).all().item<bool>());
    check(decoded.numel() == 0 ||
          decoded.abs().max().item<float>() <= geo::sync::detail::kMaxContribution);
    model.add_(decoded, 0.25);  // applied as one of four contributions
    check(torch::isfinite(model).all().item<bool>());
  } else {
    check(reason == "size" || reason == "malformed" || reason == "non_finite" ||
          reason == "out_of_range");
    check(!ok.message().empty());
  }
  if (honest && restSize == 0) check(ok.ok());
  return 0;
}
