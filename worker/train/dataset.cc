#include "worker/train/dataset.h"

#include "worker/train/npy.h"

#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <numbers>
#include <numeric>
#include <random>
#include <system_error>
#include <utility>

namespace geo::train {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kNumClasses = 10;
// The most classes a label file may imply (model.classes' bound).
constexpr int64_t kMaxClassesLoaded = int64_t{1} << 20;

// Per-channel statistics of each training set's pixels scaled to [0, 1]; the
// normalization of both splits uses them so that training inputs are ~N(0, 1).
struct Normalization {
  std::array<float, 3> mean;
  std::array<float, 3> std;
};
constexpr Normalization kFashionMnistNorm{{0.2860f}, {0.3530f}};
constexpr Normalization kMnistNorm{{0.1307f}, {0.3081f}};
constexpr Normalization kCifar10Norm{{0.4914f, 0.4822f, 0.4465f}, {0.2470f, 0.2435f, 0.2616f}};
// Measured on the generator below (seed 42, 60000 samples); they depend only
// on the generator's distribution, not on the seed.
constexpr Normalization kSyntheticNorm{{0.1373f}, {0.1879f}};

// ---- Files -----------------------------------------------------------------

// zlib reads gzipped and plain files alike (transparent mode), so one code
// path serves "x" and "x.gz".
struct GzClose {
  void operator()(gzFile f) const { gzclose(f); }
};
using GzHandle = std::unique_ptr<gzFile_s, GzClose>;

constexpr size_t kReadChunk = size_t{16} << 20;
// Upper bound on what is reserved up front from a header's claims, so a
// corrupt header that promises terabytes cannot allocate them.
constexpr size_t kMaxReserve = size_t{256} << 20;

StatusOr<GzHandle> openFile(const fs::path& path) {
  errno = 0;
  GzHandle f(gzopen(path.c_str(), "rb"));
  if (!f) {
    const int err = errno;
    std::string why = err != 0 ? std::strerror(err) : "out of memory";
    if (err == EACCES) {
      return Status(StatusCode::kPermissionDenied,
                    fmt::format("{}: cannot open: {}", path.string(), why));
    }
    return dataLoss(fmt::format("{}: cannot open: {}", path.string(), why));
  }
  gzbuffer(f.get(), 1u << 20);  // fewer, larger reads for the ~30 MB files
  return f;
}

// zlib's description of the last error on `f`, without the path it prefixes.
std::string gzErrorText(gzFile f, const fs::path& path, int* errnum) {
  const char* msg = gzerror(f, errnum);
  if (*errnum == Z_ERRNO) return std::strerror(errno);
  std::string text = msg != nullptr ? msg : "unknown zlib error";
  const std::string prefix = path.string() + ": ";
  if (text.starts_with(prefix)) text.erase(0, prefix.size());
  return text;
}

// Appends bytes of `f` to `out` until `limit` bytes have been appended or the
// file ends. A read error or a corrupt/truncated gzip stream is DataLoss.
// Memory grows with what the file really holds, never with `limit` (callers
// reserve what they expect).
Status readUpTo(gzFile f, const fs::path& path, std::vector<uint8_t>& out, size_t limit) {
  size_t appended = 0;
  int errnum = Z_OK;
  while (appended < limit) {
    const size_t want = std::min(limit - appended, kReadChunk);
    const size_t old = out.size();
    out.resize(old + want);
    const int got = gzread(f, out.data() + old, static_cast<unsigned>(want));
    out.resize(old + static_cast<size_t>(std::max(got, 0)));
    if (got < 0) break;  // reported below
    appended += static_cast<size_t>(got);
    if (static_cast<size_t>(got) < want) break;  // end of file (or an error, checked below)
  }
  const std::string why = gzErrorText(f, path, &errnum);
  if (errnum != Z_OK && errnum != Z_STREAM_END) {
    return dataLoss(fmt::format("{}: unreadable after {} bytes of data (corrupt or truncated?): {}",
                                path.string(), gztell(f), why));
  }
  return {};
}

// The first of `dir/name`, `dir/name.gz` (for every dir) that exists;
// NotFound listing every path tried otherwise.
StatusOr<fs::path> findFile(const std::vector<fs::path>& dirs, std::string_view name,
                            std::string_view what) {
  std::vector<std::string> tried;
  for (const fs::path& dir : dirs) {
    for (const std::string& candidate : {std::string(name), std::string(name) + ".gz"}) {
      fs::path p = dir / candidate;
      std::error_code ec;
      if (fs::is_regular_file(p, ec)) return p;
      tried.push_back(p.string());
    }
  }
  return notFound(fmt::format("{} not found; tried: {}", what, fmt::join(tried, ", ")));
}

uint32_t readBigEndian32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

// ---- IDX (MNIST, Fashion-MNIST) --------------------------------------------

constexpr uint32_t kIdxImagesMagic = 2051;  // 0x00000803: unsigned bytes, 3 dimensions
constexpr uint32_t kIdxLabelsMagic = 2049;  // 0x00000801: unsigned bytes, 1 dimension
constexpr int64_t kMnistSide = 28;

struct IdxFile {
  fs::path path;
  int64_t count = 0;
  std::vector<uint8_t> payload;  // exactly count * itemBytes bytes
};

// Reads an IDX file of unsigned bytes: checks the magic number, the item
// shape (28x28 for images), and that the payload is exactly as long as the
// header says.
StatusOr<IdxFile> readIdx(const fs::path& path, bool images) {
  auto opened = openFile(path);
  GEO_RETURN_IF_ERROR(opened.status());
  gzFile f = opened->get();

  const size_t headerBytes = images ? 16 : 8;
  std::vector<uint8_t> header;
  GEO_RETURN_IF_ERROR(readUpTo(f, path, header, headerBytes));
  if (header.size() < headerBytes) {
    return dataLoss(fmt::format("{}: truncated IDX header: expected {} bytes, found {}",
                                path.string(), headerBytes, header.size()));
  }
  const uint32_t magic = readBigEndian32(header.data());
  const uint32_t expectedMagic = images ? kIdxImagesMagic : kIdxLabelsMagic;
  if (magic != expectedMagic) {
    return dataLoss(fmt::format(
        "{}: bad IDX magic number: expected {} (0x{:08x}, unsigned bytes, {} for {}), found {} "
        "(0x{:08x})",
        path.string(), expectedMagic, expectedMagic, images ? "3 dimensions" : "1 dimension",
        images ? "images" : "labels", magic, magic));
  }
  IdxFile out;
  out.path = path;
  out.count = readBigEndian32(header.data() + 4);
  size_t itemBytes = 1;
  if (images) {
    const uint32_t rows = readBigEndian32(header.data() + 8);
    const uint32_t cols = readBigEndian32(header.data() + 12);
    if (rows != kMnistSide || cols != kMnistSide) {
      return dataLoss(fmt::format("{}: wrong image dimensions: expected {}x{}, found {}x{}",
                                  path.string(), kMnistSide, kMnistSide, rows, cols));
    }
    itemBytes = kMnistSide * kMnistSide;
  }
  if (out.count == 0) {
    return dataLoss(fmt::format("{}: expected at least one {}, found 0 in the header",
                                path.string(), images ? "image" : "label"));
  }
  const size_t expected = static_cast<size_t>(out.count) * itemBytes;
  out.payload.reserve(std::min(expected + 1, kMaxReserve));
  // One byte more than promised reveals trailing data.
  GEO_RETURN_IF_ERROR(readUpTo(f, path, out.payload, expected + 1));
  if (out.payload.size() < expected) {
    return dataLoss(fmt::format(
        "{}: truncated: the header promises {} {} ({} bytes after the {}-byte header), found "
        "only {} bytes",
        path.string(), out.count, images ? "images of 28x28" : "labels", expected, headerBytes,
        out.payload.size()));
  }
  if (out.payload.size() > expected) {
    return dataLoss(fmt::format(
        "{}: longer than the header says: expected exactly {} bytes after the header ({} {}), "
        "found trailing data",
        path.string(), expected, out.count, images ? "images" : "labels"));
  }
  return out;
}

// Labels must be class indices; the first offender is reported.
Status checkLabels(const uint8_t* labels, size_t n, size_t stride, const fs::path& path) {
  for (size_t i = 0; i < n; ++i) {
    const uint8_t v = labels[i * stride];
    if (v >= kNumClasses) {
      return dataLoss(fmt::format("{}: label {} of record {} is out of range: expected [0, {})",
                                  path.string(), v, i, kNumClasses));
    }
  }
  return {};
}

// Converts N records of C planes of side x side uint8 pixels (plane c of
// record i starts at src + i * recordBytes + c * side^2) into float32
// [N, C, side, side] normalized as (x/255 - mean_c) / std_c. One fused,
// multi-threaded pass, x * a_c - b_c, that the compiler vectorizes: separate
// to(kFloat), mul_ and sub_ calls would stream the ~190 MB of Fashion-MNIST
// floats through memory three times.
torch::Tensor normalizeBytes(const uint8_t* src, int64_t n, int64_t channels, int64_t side,
                             int64_t recordBytes, const Normalization& norm) {
  std::array<float, 3> scale{};
  std::array<float, 3> shift{};
  for (int64_t c = 0; c < channels; ++c) {
    scale[c] = 1.0f / (255.0f * norm.std[c]);
    shift[c] = norm.mean[c] / norm.std[c];
  }
  torch::Tensor out = torch::empty({n, channels, side, side}, torch::kFloat);
  float* dst = out.data_ptr<float>();
  const int64_t plane = side * side;
  at::parallel_for(0, n * channels, 256, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const int64_t c = p % channels;
      const uint8_t* in = src + (p / channels) * recordBytes + c * plane;
      float* o = dst + p * plane;
      const float a = scale[c];
      const float b = shift[c];
      for (int64_t k = 0; k < plane; ++k) o[k] = static_cast<float>(in[k]) * a - b;
    }
  });
  return out;
}

StatusOr<TensorDataset> loadIdx(const DatasetSpec& spec, Split split, const Normalization& norm) {
  const fs::path dir = spec.path.empty() ? defaultDatasetPath(spec.name) : spec.path;
  const std::string prefix = split == Split::kTrain ? "train" : "t10k";
  auto imagesPath = findFile({dir}, prefix + "-images-idx3-ubyte",
                             fmt::format("{} {} images", spec.name, splitName(split)));
  GEO_RETURN_IF_ERROR(imagesPath.status());
  auto labelsPath = findFile({dir}, prefix + "-labels-idx1-ubyte",
                             fmt::format("{} {} labels", spec.name, splitName(split)));
  GEO_RETURN_IF_ERROR(labelsPath.status());

  auto images = readIdx(*imagesPath, /*images=*/true);
  GEO_RETURN_IF_ERROR(images.status());
  auto labels = readIdx(*labelsPath, /*images=*/false);
  GEO_RETURN_IF_ERROR(labels.status());
  if (images->count != labels->count) {
    return dataLoss(
        fmt::format("image count != label count: expected {} labels in {} (one per "
                    "image of {}), found {}",
                    images->count, labels->path.string(), images->path.string(), labels->count));
  }
  GEO_RETURN_IF_ERROR(checkLabels(labels->payload.data(), labels->payload.size(), 1, labels->path));

  const int64_t n = images->count;
  TensorDataset out;
  out.numClasses = kNumClasses;
  out.inputs =
      normalizeBytes(images->payload.data(), n, 1, kMnistSide, kMnistSide * kMnistSide, norm);
  out.targets = torch::from_blob(labels->payload.data(), {n}, torch::kUInt8).to(torch::kLong);
  return out;
}

// ---- CIFAR-10 ----------------------------------------------------------------

constexpr int64_t kCifarSide = 32;
constexpr int64_t kCifarPixels = 3 * kCifarSide * kCifarSide;
constexpr int64_t kCifarRecord = 1 + kCifarPixels;

StatusOr<TensorDataset> loadCifar10(const DatasetSpec& spec, Split split) {
  const fs::path dir = spec.path.empty() ? defaultDatasetPath(spec.name) : spec.path;
  const std::vector<fs::path> dirs = {dir, dir / "cifar-10-batches-bin"};
  std::vector<std::string> names;
  if (split == Split::kTrain) {
    for (int i = 1; i <= 5; ++i) names.push_back(fmt::format("data_batch_{}.bin", i));
  } else {
    names.push_back("test_batch.bin");
  }

  std::vector<fs::path> paths;
  for (const std::string& name : names) {
    auto p = findFile(dirs, name, fmt::format("cifar10 {} batch {}", splitName(split), name));
    GEO_RETURN_IF_ERROR(p.status());
    paths.push_back(*std::move(p));
  }

  std::vector<uint8_t> records;
  size_t totalBytes = 0;
  for (const fs::path& path : paths) {
    std::error_code ec;
    const uintmax_t bytes = fs::file_size(path, ec);
    if (!ec) totalBytes += static_cast<size_t>(bytes);
  }
  records.reserve(std::min(totalBytes, kMaxReserve));  // exact for uncompressed files
  for (const fs::path& path : paths) {
    auto opened = openFile(path);
    GEO_RETURN_IF_ERROR(opened.status());
    const size_t begin = records.size();
    GEO_RETURN_IF_ERROR(readUpTo(opened->get(), path, records, std::numeric_limits<size_t>::max()));
    const size_t bytes = records.size() - begin;
    if (bytes == 0 || bytes % kCifarRecord != 0) {
      return dataLoss(fmt::format(
          "{}: expected a whole, non-zero number of {}-byte records (1 label byte + {} pixel "
          "bytes), found {} bytes ({} records and {} bytes left over: truncated?)",
          path.string(), kCifarRecord, kCifarPixels, bytes, bytes / kCifarRecord,
          bytes % kCifarRecord));
    }
    GEO_RETURN_IF_ERROR(
        checkLabels(records.data() + begin, bytes / kCifarRecord, kCifarRecord, path));
  }

  const int64_t n = static_cast<int64_t>(records.size()) / kCifarRecord;
  torch::Tensor raw = torch::from_blob(records.data(), {n, kCifarRecord}, torch::kUInt8);
  TensorDataset out;
  out.numClasses = kNumClasses;
  out.targets = raw.select(1, 0).to(torch::kLong);
  // The channel-major record layout is already [3, 32, 32].
  out.inputs = normalizeBytes(records.data() + 1, n, 3, kCifarSide, kCifarRecord, kCifar10Norm);
  return out;
}

// ---- Synthetic -----------------------------------------------------------------

// SplitMix64 (Steele, Lea, Flood 2014): fully specified, so the random draws
// are the same on every platform (the pixels too, up to the last bit of
// libm's exp/cos), and cheap to seed per sample, so samples can be generated
// in parallel, independently of the thread count and of the sample count.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t state) : state_(state) {}
  uint64_t operator()() {
    state_ += 0x9E3779B97F4A7C15ull;
    return mix(state_);
  }
  // Uniform in [0, 1).
  double uniform() { return static_cast<double>((*this)() >> 11) * 0x1.0p-53; }

  static uint64_t mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }

 private:
  uint64_t state_;
};

// One Gaussian blob per image at a class-dependent position: class c sits at
// angle 2*pi*c/10 on a circle around the centre. Adjacent class centres are
// 2 * kBlobRadius * sin(pi/10) = 3.7 px apart and each blob is jittered by up
// to kBlobJitter px, so neighbouring classes overlap; a second, class-independent blob
// (dimmer on average) and pixel noise make the task harder still. The
// result is learnable to high but not perfect accuracy by an MLP or CNN, with
// a visible convergence curve, like Fashion-MNIST.
constexpr double kBlobRadius = 6.0;
constexpr double kBlobJitter = 1.75;
constexpr double kBlobSigmaMin = 1.5;
constexpr double kBlobSigmaSpan = 1.5;
constexpr double kBlobAmpMin = 0.6;
constexpr double kBlobAmpSpan = 0.4;
constexpr double kDistractorAmpMin = 0.15;
constexpr double kDistractorAmpSpan = 0.45;
constexpr double kDistractorMargin = 4.0;  // px from the border
constexpr float kPixelNoise = 0.25f;       // standard deviation of the additive pixel noise

using Profile = std::array<float, kMnistSide>;

// A separable Gaussian blob: exp(-(dx^2 + dy^2) / 2s^2) = gx * gy.
void blobProfile(double centre, double sigma, double amp, Profile& out) {
  for (int64_t k = 0; k < kMnistSide; ++k) {
    const double d = static_cast<double>(k) - centre;
    out[k] = static_cast<float>(amp * std::exp(-d * d / (2 * sigma * sigma)));
  }
}

constexpr uint64_t kTrainStream = 0x747261696eull;  // "train"
constexpr uint64_t kTestStream = 0x74657374ull;     // "test"

// One image row: two blobs plus noise, clamped to [0, 1] like real pixel
// intensities, and normalized. Normalizing first and clamping to the
// normalized bounds is the same map, but GCC vectorizes only this order.
void shadeRow(float* row, float gy, const Profile& gx, float hy, const Profile& hx,
              const Profile& noise) {
  const float mean = kSyntheticNorm.mean[0];
  const float invStd = 1.0f / kSyntheticNorm.std[0];
  const float lo = (0.0f - mean) * invStd;
  const float hi = (1.0f - mean) * invStd;
  for (int64_t x = 0; x < kMnistSide; ++x) {
    const float v = (gy * gx[x] + hy * hx[x] + noise[x] - mean) * invStd;
    row[x] = std::min(std::max(v, lo), hi);
  }
}

// Writes one normalized 28x28 image and its label.
void renderSyntheticSample(SplitMix64& rng, float* pixels, int64_t* label) {
  const uint64_t cls = rng() % kNumClasses;
  *label = static_cast<int64_t>(cls);
  const double angle = 2.0 * std::numbers::pi * static_cast<double>(cls) / kNumClasses;
  const double centre = (kMnistSide - 1) / 2.0;
  const double cx = centre + kBlobRadius * std::cos(angle) + kBlobJitter * (2 * rng.uniform() - 1);
  const double cy = centre + kBlobRadius * std::sin(angle) + kBlobJitter * (2 * rng.uniform() - 1);
  const double sigma = kBlobSigmaMin + kBlobSigmaSpan * rng.uniform();
  const double amp = kBlobAmpMin + kBlobAmpSpan * rng.uniform();
  Profile gx{};
  Profile gy{};
  blobProfile(cx, sigma, amp, gx);
  blobProfile(cy, sigma, 1.0, gy);

  const double span = kMnistSide - 1 - 2 * kDistractorMargin;
  const double dx = kDistractorMargin + span * rng.uniform();
  const double dy = kDistractorMargin + span * rng.uniform();
  const double dsigma = kBlobSigmaMin + kBlobSigmaSpan * rng.uniform();
  const double damp = kDistractorAmpMin + kDistractorAmpSpan * rng.uniform();
  Profile hx{};
  Profile hy{};
  blobProfile(dx, dsigma, damp, hx);
  blobProfile(dy, dsigma, 1.0, hy);

  // Noise: the sum of two 16-bit uniforms, minus 1, is triangular on [-1, 1)
  // with variance 1/6; one 64-bit draw gives two noise values. Drawn per row
  // first so that the pixel loop below is branch-free and vectorizes.
  const float noiseScale = kPixelNoise * std::sqrt(6.0f) / 65536.0f;
  Profile noise{};
  for (int64_t y = 0; y < kMnistSide; ++y) {
    for (int64_t x = 0; x < kMnistSide; x += 2) {
      const uint64_t r = rng();
      noise[x] = static_cast<float>(static_cast<int32_t>(r & 0xFFFF) +
                                    static_cast<int32_t>((r >> 16) & 0xFFFF) - 65536) *
                 noiseScale;
      noise[x + 1] = static_cast<float>(static_cast<int32_t>((r >> 32) & 0xFFFF) +
                                        static_cast<int32_t>(r >> 48) - 65536) *
                     noiseScale;
    }
    shadeRow(pixels + y * kMnistSide, gy[y], gx, hy[y], hx, noise);
  }
}

StatusOr<TensorDataset> makeSynthetic(const DatasetSpec& spec, Split split) {
  if (spec.syntheticSamples < 1) {
    return invalidArgument(
        fmt::format("synthetic: syntheticSamples must be >= 1 (got {})", spec.syntheticSamples));
  }
  const int64_t n = split == Split::kTrain
                        ? spec.syntheticSamples
                        : std::min<int64_t>(10000, std::max<int64_t>(1, spec.syntheticSamples / 6));
  // Distinct, decorrelated streams for (seed, split, sample).
  const uint64_t stream = SplitMix64::mix(SplitMix64::mix(spec.seed) ^
                                          (split == Split::kTrain ? kTrainStream : kTestStream));

  TensorDataset out;
  out.numClasses = kNumClasses;
  out.inputs = torch::empty({n, 1, kMnistSide, kMnistSide}, torch::kFloat);
  out.targets = torch::empty({n}, torch::kLong);
  float* pixels = out.inputs.data_ptr<float>();
  int64_t* labels = out.targets.data_ptr<int64_t>();
  at::parallel_for(0, n, 256, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      SplitMix64 rng(stream ^ SplitMix64::mix(static_cast<uint64_t>(i) + 1));
      renderSyntheticSample(rng, pixels + i * kMnistSide * kMnistSide, labels + i);
    }
  });
  return out;
}

// ---- npy: a user's own arrays ----------------------------------------------------

// Element i of `a` as T (a's kind and size were checked by openNpy).
template <typename T>
T npyAt(const NpyArray& a, int64_t i) {
  const std::byte* p = a.data + static_cast<size_t>(i) * a.itemSize;
  auto load = [p]<typename S>(S) {
    S v;
    std::memcpy(&v, p, sizeof v);
    return static_cast<T>(v);
  };
  const bool isSigned = a.kind == NpyKind::kSigned;
  switch (a.kind) {
    case NpyKind::kBool: return load(uint8_t{});
    case NpyKind::kUnsigned:
    case NpyKind::kSigned:
      switch (a.itemSize) {
        case 1: return isSigned ? load(int8_t{}) : load(uint8_t{});
        case 2: return isSigned ? load(int16_t{}) : load(uint16_t{});
        case 4: return isSigned ? load(int32_t{}) : load(uint32_t{});
        default: return isSigned ? load(int64_t{}) : load(uint64_t{});
      }
    case NpyKind::kFloat:
      if (a.itemSize == 2) {
        c10::Half h;
        std::memcpy(&h, p, sizeof h);
        return static_cast<T>(static_cast<float>(h));
      }
      return a.itemSize == 4 ? load(float{}) : load(double{});
  }
  return T{};
}

// float32 features. A float32 file is used in place (the mapping is the
// tensor's storage, read-only: training only ever gathers rows from it);
// any other dtype is converted into memory of our own.
torch::Tensor npyFeatures(const NpyArray& a) {
  std::vector<int64_t> shape = a.shape;
  if (a.kind == NpyKind::kFloat && a.itemSize == 4) {
    auto keep = a.mapping;
    return torch::from_blob(
        const_cast<std::byte*>(a.data), shape, [keep](void*) mutable { keep.reset(); },
        torch::TensorOptions().dtype(torch::kFloat));
  }
  torch::Tensor out = torch::empty(shape, torch::kFloat);
  float* dst = out.data_ptr<float>();
  at::parallel_for(0, a.elements(), 1 << 16, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) dst[i] = npyAt<float>(a, i);
  });
  return out;
}

StatusOr<TensorDataset> loadNpy(const DatasetSpec& spec, Split split) {
  if (spec.path.empty()) {
    return invalidArgument(
        "dataset npy needs dataset.path: the folder with train_x.npy, "
        "train_y.npy, test_x.npy and test_y.npy");
  }
  const std::string prefix(splitName(split));
  auto x = openNpy(spec.path / (prefix + "_x.npy"));
  if (!x.ok()) return x.status();
  auto y = openNpy(spec.path / (prefix + "_y.npy"));
  if (!y.ok()) return y.status();
  const std::string xs = x->path.string(), ys = y->path.string();
  if (x->shape.empty() || x->shape[0] < 1) {
    return dataLoss(
        fmt::format("{}: holds {}; expected [N, ...] with N >= 1 samples", xs, x->describe()));
  }
  if (x->kind == NpyKind::kBool) {
    return invalidArgument(
        fmt::format("{}: holds {}; features must be numbers (save "
                    "x.astype(\"<f4\"))",
                    xs, x->describe()));
  }
  const int64_t n = x->shape[0];
  if (y->shape.empty() || y->shape[0] != n || y->shape.size() > 2) {
    return dataLoss(
        fmt::format("{}: holds {}; expected [{}] (a label or target per sample of {}) "
                    "or [{}, T] (T float targets each)",
                    ys, y->describe(), n, xs, n));
  }
  TensorDataset out;
  out.inputs = npyFeatures(*x);
  if (y->kind == NpyKind::kFloat) {
    // Regression: float targets [N, T], T >= 1.
    const int64_t width = y->shape.size() == 2 ? y->shape[1] : 1;
    if (width < 1) return dataLoss(fmt::format("{}: holds {}; no targets", ys, y->describe()));
    torch::Tensor t = torch::empty({n, width}, torch::kFloat);
    float* dst = t.data_ptr<float>();
    for (int64_t i = 0; i < n * width; ++i) {
      dst[i] = npyAt<float>(*y, i);
      if (!std::isfinite(dst[i])) {
        return dataLoss(fmt::format("{}: target {} of sample {} is {} (expected a finite number)",
                                    ys, i % width, i / width, dst[i]));
      }
    }
    out.targets = std::move(t);
    out.numClasses = width;
    return out;
  }
  // Classification: one integer label per sample in [0, classes).
  if (y->shape.size() != 1) {
    return dataLoss(fmt::format("{}: holds {}; integer labels must be one per sample ([{}])", ys,
                                y->describe(), n));
  }
  torch::Tensor t = torch::empty({n}, torch::kLong);
  int64_t* dst = t.data_ptr<int64_t>();
  int64_t largest = -1;
  for (int64_t i = 0; i < n; ++i) {
    const bool huge = y->kind == NpyKind::kUnsigned && y->itemSize == 8 &&
                      npyAt<uint64_t>(*y, i) > static_cast<uint64_t>(kMaxClassesLoaded);
    const int64_t v = huge ? -1 : npyAt<int64_t>(*y, i);
    const bool tooLarge = spec.classes > 0 ? v >= spec.classes : v >= kMaxClassesLoaded;
    if (huge || v < 0 || tooLarge) {
      return dataLoss(fmt::format("{}: label {} of sample {} is out of range: expected [0, {}){}",
                                  ys,
                                  huge ? std::to_string(npyAt<uint64_t>(*y, i)) : std::to_string(v),
                                  i, spec.classes > 0 ? spec.classes : kMaxClassesLoaded,
                                  spec.classes > 0 ? " (model.classes)" : ""));
    }
    dst[i] = v;
    largest = std::max(largest, v);
  }
  out.targets = std::move(t);
  out.numClasses = spec.classes > 0 ? spec.classes : largest + 1;
  return out;
}

// ---- tokens: a corpus as flat token ids ------------------------------------------

// Maps `file` as a stream of token ids and checks every id against the
// vocabulary: `classes` when set, else grown to the largest id + 1 (at
// least 256, bytes). Returns the stream and the vocabulary.
StatusOr<std::pair<TokenStream, int64_t>> mapTokens(const fs::path& file, int64_t tokenBytes,
                                                    int64_t classes) {
  auto mapped = mapFile(file);
  if (!mapped.ok()) return mapped.status();
  if (mapped->size % static_cast<size_t>(tokenBytes) != 0) {
    return dataLoss(
        fmt::format("{}: {} bytes is not a whole number of {}-byte token ids (dataset.tokenBytes)",
                    file.string(), mapped->size, tokenBytes));
  }
  TokenStream s;
  s.mapping = std::move(mapped->mapping);
  s.data = mapped->data;
  s.count = static_cast<int64_t>(mapped->size) / tokenBytes;
  s.tokenBytes = tokenBytes;
  // The largest id, in parallel: a corpus of gigabytes is read once here.
  std::atomic<int64_t> largest{0};
  std::atomic<int64_t> firstBad{std::numeric_limits<int64_t>::max()};
  at::parallel_for(0, s.count, 1 << 20, [&](int64_t begin, int64_t end) {
    int64_t top = 0;
    for (int64_t i = begin; i < end; ++i) {
      const int64_t id = s.at(i);
      top = std::max(top, id);
      if (classes > 0 && id >= classes) {
        int64_t seen = firstBad.load();
        while (i < seen && !firstBad.compare_exchange_weak(seen, i)) {
        }
        break;
      }
    }
    int64_t seen = largest.load();
    while (top > seen && !largest.compare_exchange_weak(seen, top)) {
    }
  });
  if (firstBad.load() != std::numeric_limits<int64_t>::max()) {
    const int64_t i = firstBad.load();
    return dataLoss(
        fmt::format("{}: token id {} at position {} is out of range: the vocabulary "
                    "is [0, {}) (model.classes)",
                    file.string(), s.at(i), i, classes));
  }
  const int64_t vocab = classes > 0 ? classes : std::max<int64_t>(256, largest.load() + 1);
  return std::make_pair(std::move(s), vocab);
}

StatusOr<TensorDataset> loadTokens(const DatasetSpec& spec, Split split) {
  if (spec.path.empty()) {
    return invalidArgument(
        "dataset tokens needs dataset.path: the folder with train.bin and "
        "val.bin");
  }
  if (spec.tokenBytes != 2 && spec.tokenBytes != 4) {
    return invalidArgument(
        fmt::format("dataset.tokenBytes: {} is not allowed (allowed: 2, 4)", spec.tokenBytes));
  }
  const fs::path file = spec.path / (split == Split::kTrain ? "train.bin" : "val.bin");
  auto mapped = mapTokens(file, spec.tokenBytes, spec.classes);
  if (!mapped.ok()) return mapped.status();
  auto& [stream, vocab] = *mapped;
  if (stream.count < spec.context + 1) {
    return dataLoss(fmt::format("{}: {} tokens, fewer than one window of model.context + 1 = {}",
                                file.string(), stream.count, spec.context + 1));
  }
  TensorDataset out;
  out.numClasses = vocab;
  out.context = spec.context;
  if (split == Split::kTrain) {
    out.tokens = std::move(stream);
    return out;
  }
  // Evaluation windows, evenly spread: the same on every worker and at every
  // evaluation, so that losses compare.
  const int64_t span = stream.count - spec.context;  // window starts
  const int64_t windows = std::min<int64_t>(kEvalWindows, span);
  torch::Tensor starts = torch::empty({windows}, torch::kLong);
  for (int64_t w = 0; w < windows; ++w) starts[w] = w * span / windows;
  TensorDataset whole;
  whole.tokens = std::move(stream);
  whole.context = spec.context;
  std::tie(out.inputs, out.targets) = tokenWindows(whole, starts);
  return out;
}

StatusOr<TensorDataset> loadUnchecked(const DatasetSpec& spec, Split split) {
  if (spec.name == "fashion-mnist") return loadIdx(spec, split, kFashionMnistNorm);
  if (spec.name == "mnist") return loadIdx(spec, split, kMnistNorm);
  if (spec.name == "cifar10") return loadCifar10(spec, split);
  if (spec.name == "synthetic") return makeSynthetic(spec, split);
  if (spec.name == "npy") return loadNpy(spec, split);
  if (spec.name == "tokens") return loadTokens(spec, split);
  return invalidArgument(fmt::format("unknown dataset \"{}\": expected one of {}", spec.name,
                                     fmt::join(kDatasetNames, ", ")));
}

// Bounded draw in [0, bound) without modulo bias: reject the 2^64 mod bound
// smallest values so that the rest split evenly into `bound` classes.
uint64_t uniformBelow(std::mt19937_64& rng, uint64_t bound) {
  const uint64_t threshold = (0 - bound) % bound;
  for (;;) {
    const uint64_t r = rng();
    if (r >= threshold) return r % bound;
  }
}

}  // namespace

int64_t TensorDataset::size() const {
  if (isTokenStream()) return std::max<int64_t>(0, tokens.count - context);
  return inputs.defined() ? inputs.size(0) : 0;
}

int64_t TokenStream::at(int64_t i) const {
  const std::byte* p = data + i * tokenBytes;
  if (tokenBytes == 2) {
    uint16_t v;
    std::memcpy(&v, p, sizeof v);
    return v;
  }
  uint32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

TokenStream TokenStream::slice(int64_t begin, int64_t end) const {
  GEO_ENFORCE(0 <= begin && begin <= end && end <= count, "token slice [{}, {}) of {}", begin, end,
              count);
  TokenStream s = *this;
  s.data = data + begin * tokenBytes;
  s.count = end - begin;
  return s;
}

torch::Tensor randomWindowStarts(uint64_t seed, int64_t step, int64_t batch, int64_t limit) {
  GEO_ENFORCE(limit >= 1, "no window to draw from ({} starts)", limit);
  torch::Tensor out = torch::empty({batch}, torch::kLong);
  int64_t* p = out.data_ptr<int64_t>();
  // Counter-based: the step and the seed pick the stream, nothing carries
  // over from one step to the next.
  SplitMix64 rng(seed * 0x9e3779b97f4a7c15ull +
                 static_cast<uint64_t>(step) * 0xbf58476d1ce4e5b9ull);
  for (int64_t b = 0; b < batch; ++b) {
    p[b] = static_cast<int64_t>(rng() % static_cast<uint64_t>(limit));
  }
  return out;
}

std::pair<torch::Tensor, torch::Tensor> tokenWindows(const TensorDataset& d,
                                                     const torch::Tensor& starts) {
  GEO_ENFORCE(d.isTokenStream(), "tokenWindows of a data set without a token stream");
  const int64_t batch = starts.size(0);
  const int64_t t = d.context;
  torch::Tensor x = torch::empty({batch, t}, torch::kLong);
  torch::Tensor y = torch::empty({batch, t}, torch::kLong);
  const int64_t* s = starts.data_ptr<int64_t>();
  int64_t* px = x.data_ptr<int64_t>();
  int64_t* py = y.data_ptr<int64_t>();
  for (int64_t b = 0; b < batch; ++b) {
    GEO_ENFORCE(s[b] >= 0 && s[b] + t < d.tokens.count, "window at {} past the stream's {} tokens",
                s[b], d.tokens.count);
    for (int64_t i = 0; i < t; ++i) {
      px[b * t + i] = d.tokens.at(s[b] + i);
      py[b * t + i] = d.tokens.at(s[b] + i + 1);
    }
  }
  return {x, y};
}

bool TensorDataset::regression() const {
  return targets.defined() && targets.is_floating_point();
}

Status checkSplitsAgree(const TensorDataset& train, const TensorDataset& test,
                        std::string_view name) {
  if (train.isTokenStream()) {
    // Both checked against the vocabulary when loaded; the evaluation's
    // vocabulary is the training split's.
    const int64_t largest = test.targets.max().item<int64_t>();
    if (largest >= train.numClasses) {
      return dataLoss(
          fmt::format("dataset {}: val.bin holds token id {}, train.bin only ids "
                      "below {} (set model.classes to the vocabulary)",
                      name, largest, train.numClasses));
    }
    return {};
  }
  const auto trainShape = train.inputs.sizes().slice(1).vec();
  const auto testShape = test.inputs.sizes().slice(1).vec();
  if (trainShape != testShape) {
    return dataLoss(
        fmt::format("dataset {}: test samples are [{}], training samples [{}] (they "
                    "must match)",
                    name, fmt::join(testShape, ", "), fmt::join(trainShape, ", ")));
  }
  if (train.regression() != test.regression()) {
    return dataLoss(fmt::format(
        "dataset {}: the training split has {} targets, the test split {} (they must match)", name,
        train.regression() ? "float" : "integer", test.regression() ? "float" : "integer"));
  }
  if (train.regression()) {
    if (train.numClasses != test.numClasses) {
      return dataLoss(fmt::format("dataset {}: {} targets per training sample, {} per test sample",
                                  name, train.numClasses, test.numClasses));
    }
    return {};
  }
  const int64_t largest = test.size() == 0 ? -1 : test.targets.max().item<int64_t>();
  if (largest >= train.numClasses) {
    return dataLoss(fmt::format(
        "dataset {}: test label {} is out of range: the training split implies {} classes "
        "[0, {}) (set model.classes to fix the count)",
        name, largest, train.numClasses, train.numClasses));
  }
  return {};
}

std::string_view splitName(Split split) {
  return split == Split::kTrain ? "train" : "test";
}

std::string describeInputs(std::string_view name) {
  const auto scaled = [](std::string_view shape, const Normalization& n, int channels) {
    if (channels == 1) {
      return fmt::format("float32 {}: (pixel / 255 - {:.4f}) / {:.4f}", shape, n.mean[0], n.std[0]);
    }
    return fmt::format(
        "float32 {}: (pixel / 255 - mean[c]) / std[c], mean {:.4f} {:.4f} {:.4f}, "
        "std {:.4f} {:.4f} {:.4f} (R, G, B planes)",
        shape, n.mean[0], n.mean[1], n.mean[2], n.std[0], n.std[1], n.std[2]);
  };
  if (name == "fashion-mnist") return scaled("[N, 1, 28, 28]", kFashionMnistNorm, 1);
  if (name == "mnist") return scaled("[N, 1, 28, 28]", kMnistNorm, 1);
  if (name == "cifar10") return scaled("[N, 3, 32, 32]", kCifar10Norm, 3);
  if (name == "synthetic") return scaled("[N, 1, 28, 28]", kSyntheticNorm, 1);
  if (name == "npy") return "float32 [N, ...]: the values of train_x.npy, as they are";
  if (name == "tokens") return "int64 [N, T]: token ids, T <= model.context";
  return "unknown";
}

std::filesystem::path defaultDatasetPath(std::string_view name) {
  if (name == "fashion-mnist" || name == "mnist" || name == "cifar10") {
    return std::filesystem::path("/usr/share/datasets") / name;
  }
  return {};
}

StatusOr<TensorDataset> loadDataset(const DatasetSpec& spec, Split split) {
  // Nothing may throw out of here (a worker reports a bad data set as a
  // Status); allocation and LibTorch failures become error values.
  try {
    auto loaded = loadUnchecked(spec, split);
    if (!loaded.ok()) {
      return loaded.status().withContext(fmt::format("loading {} {}", spec.name, splitName(split)));
    }
    if (spec.classes > 0 && !loaded->regression()) {
      // model.classes fixes the outputs; every label must be below it.
      const int64_t largest = loaded->size() == 0 ? -1 : loaded->targets.max().item<int64_t>();
      if (largest >= spec.classes) {
        return dataLoss(
            fmt::format("loading {} {}: label {} is out of range: expected [0, {}) "
                        "(model.classes)",
                        spec.name, splitName(split), largest, spec.classes));
      }
      loaded->numClasses = spec.classes;
    }
    return loaded;
  } catch (const std::bad_alloc&) {
    return Status(StatusCode::kResourceExhausted,
                  fmt::format("loading {} {}: out of memory", spec.name, splitName(split)));
  } catch (const std::exception& e) {
    return internalError(fmt::format("loading {} {}: {}", spec.name, splitName(split), e.what()));
  }
}

TensorDataset shard(const TensorDataset& d, int64_t index, int64_t count) {
  GEO_ENFORCE(count >= 1, "shard count must be >= 1 (got {})", count);
  GEO_ENFORCE(index >= 0 && index < count, "shard index must be in [0, {}) (got {})", count, index);
  if (count == 1) return d;
  if (d.isTokenStream()) {
    // Contiguous parts: windows stay inside a worker's part.
    TensorDataset out = d;
    const int64_t n = d.tokens.count;
    out.tokens = d.tokens.slice(index * n / count, (index + 1) * n / count);
    return out;
  }
  if (!d.inputs.defined()) return d;
  const int64_t n = d.size();
  GEO_ENFORCE_EQ(d.targets.size(0), n, "inputs and targets must have the same length");
  TensorDataset out;
  out.numClasses = d.numClasses;
  // clone() rather than contiguous(): a slice that happens to be contiguous
  // (0 or 1 rows) would otherwise keep the whole data set alive.
  const int64_t start = std::min(index, n);
  out.inputs = d.inputs.slice(0, start, n, count).clone(at::MemoryFormat::Contiguous);
  out.targets = d.targets.slice(0, start, n, count).clone(at::MemoryFormat::Contiguous);
  return out;
}

BatchSampler::BatchSampler(int64_t datasetSize, int64_t batchSize, uint64_t seed)
    : datasetSize_(datasetSize), batchSize_(batchSize), seed_(seed) {
  GEO_ENFORCE(batchSize >= 1 && batchSize <= datasetSize,
              "batch size must be in [1, dataset size {}] (got {})", datasetSize, batchSize);
  shuffleFor(0);
}

void BatchSampler::shuffleFor(int64_t epoch) {
  permutation_.resize(static_cast<size_t>(datasetSize_));
  std::iota(permutation_.begin(), permutation_.end(), int64_t{0});
  std::mt19937_64 rng(seed_ + static_cast<uint64_t>(epoch));
  for (size_t i = permutation_.size() - 1; i > 0; --i) {
    std::swap(permutation_[i], permutation_[uniformBelow(rng, i + 1)]);
  }
}

torch::Tensor BatchSampler::next() {
  if (state_.position + batchSize_ > datasetSize_) {
    ++state_.epoch;
    state_.position = 0;
    shuffleFor(state_.epoch);
  }
  torch::Tensor batch =
      torch::from_blob(permutation_.data() + state_.position, {batchSize_}, torch::kLong).clone();
  state_.position += batchSize_;
  return batch;
}

BatchSampler::State BatchSampler::state() const {
  return state_;
}

void BatchSampler::restore(const State& s) {
  GEO_ENFORCE(s.epoch >= 0, "sampler state: epoch must be >= 0 (got {})", s.epoch);
  GEO_ENFORCE(s.position >= 0 && s.position <= datasetSize_,
              "sampler state: position must be in [0, {}] (got {})", datasetSize_, s.position);
  if (s.epoch != state_.epoch) shuffleFor(s.epoch);
  state_ = s;
}

}  // namespace geo::train
