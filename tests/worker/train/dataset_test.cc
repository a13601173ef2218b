#include "worker/train/dataset.h"

#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <torch/torch.h>

#include "common/enforce.h"

namespace geo::train {
namespace {

namespace fs = std::filesystem;

const fs::path kFashionMnistDir = "/usr/share/datasets/fashion-mnist";

// ---- Fixture writers (files are generated at run time, in a fresh folder) --

void putBigEndian32(std::vector<uint8_t>& out, uint32_t v) {
  out.push_back(static_cast<uint8_t>(v >> 24));
  out.push_back(static_cast<uint8_t>(v >> 16));
  out.push_back(static_cast<uint8_t>(v >> 8));
  out.push_back(static_cast<uint8_t>(v));
}

// An IDX image file: magic, count, rows, cols, then count*rows*cols bytes;
// pixel p of image i is (i * 31 + p) % 256.
std::vector<uint8_t> idxImages(uint32_t count, uint32_t rows = 28, uint32_t cols = 28,
                               uint32_t magic = 2051) {
  std::vector<uint8_t> out;
  putBigEndian32(out, magic);
  putBigEndian32(out, count);
  putBigEndian32(out, rows);
  putBigEndian32(out, cols);
  for (uint32_t i = 0; i < count; ++i) {
    for (uint32_t p = 0; p < rows * cols; ++p)
      out.push_back(static_cast<uint8_t>((i * 31 + p) % 256));
  }
  return out;
}

// An IDX label file; label i is i % 10.
std::vector<uint8_t> idxLabels(uint32_t count, uint32_t magic = 2049) {
  std::vector<uint8_t> out;
  putBigEndian32(out, magic);
  putBigEndian32(out, count);
  for (uint32_t i = 0; i < count; ++i) out.push_back(static_cast<uint8_t>(i % 10));
  return out;
}

void writeFile(const fs::path& path, const std::vector<uint8_t>& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(f.good()) << path;
}

void writeGz(const fs::path& path, const std::vector<uint8_t>& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr) << path;
  ASSERT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())),
            static_cast<int>(bytes.size()));
  ASSERT_EQ(gzclose(f), Z_OK);
}

std::vector<uint8_t> readFile(const fs::path& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

// CIFAR-10 binary records: label (first + r) % 10, pixel p = (r * 7 + p) % 256.
std::vector<uint8_t> cifarRecords(int records, int first) {
  std::vector<uint8_t> out;
  for (int r = 0; r < records; ++r) {
    out.push_back(static_cast<uint8_t>((first + r) % 10));
    for (int p = 0; p < 3072; ++p) out.push_back(static_cast<uint8_t>((r * 7 + p) % 256));
  }
  return out;
}

class DatasetFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() / fmt::format("geo_dataset_test_{}_{}_{}", getpid(),
                                                   info->test_suite_name(), info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  // A small valid Fashion-MNIST-like train split (n images) in dir_.
  void writeIdxPair(uint32_t n, bool gz) {
    auto write = gz ? writeGz : writeFile;
    const std::string suffix = gz ? ".gz" : "";
    write(dir_ / ("train-images-idx3-ubyte" + suffix), idxImages(n));
    write(dir_ / ("train-labels-idx1-ubyte" + suffix), idxLabels(n));
  }

  StatusOr<TensorDataset> load(std::string name = "fashion-mnist", Split split = Split::kTrain) {
    return loadDataset(DatasetSpec{.name = std::move(name), .path = dir_}, split);
  }

  // Asserts a DataLoss whose message contains every piece of `pieces`.
  void expectDataLoss(const StatusOr<TensorDataset>& r, const std::vector<std::string>& pieces) {
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << r.status().toString();
    for (const std::string& piece : pieces) {
      EXPECT_NE(r.status().message().find(piece), std::string::npos)
          << "\"" << piece << "\" missing from: " << r.status().toString();
    }
  }

  fs::path dir_;
};

// ---- Real Fashion-MNIST ------------------------------------------------------

TEST(DatasetFashionMnist, LoadsRealTrainAndTestSplits) {
  if (!fs::exists(kFashionMnistDir)) GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  const auto start = std::chrono::steady_clock::now();
  auto train = loadDataset(DatasetSpec{.name = "fashion-mnist"}, Split::kTrain);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(train.ok()) << train.status().toString();
  // Informational: speed is a benchmark's job, not a unit test's.
  std::printf("fashion-mnist train: 60000 images loaded in %.3f s\n", seconds);

  EXPECT_EQ(train->size(), 60000);
  EXPECT_EQ(train->numClasses, 10);
  EXPECT_EQ(train->inputs.sizes(), (std::vector<int64_t>{60000, 1, 28, 28}));
  EXPECT_EQ(train->inputs.scalar_type(), torch::kFloat);
  EXPECT_TRUE(train->inputs.is_contiguous());
  EXPECT_EQ(train->targets.sizes(), (std::vector<int64_t>{60000}));
  EXPECT_EQ(train->targets.scalar_type(), torch::kLong);
  EXPECT_EQ(train->targets.min().item<int64_t>(), 0);
  EXPECT_EQ(train->targets.max().item<int64_t>(), 9);
  // Fashion-MNIST is balanced: 6000 images per class.
  torch::Tensor counts = torch::bincount(train->targets);
  EXPECT_TRUE(torch::equal(counts, torch::full({10}, 6000, torch::kLong))) << counts;
  // Normalized with the training set's own statistics.
  EXPECT_NEAR(train->inputs.mean().item<double>(), 0.0, 0.01);
  EXPECT_NEAR(train->inputs.std().item<double>(), 1.0, 0.05);
  // Raw pixels are bytes: the minimum is the normalized 0.
  EXPECT_NEAR(train->inputs.min().item<double>(), -0.2860 / 0.3530, 1e-4);
  EXPECT_NEAR(train->inputs.max().item<double>(), (1.0 - 0.2860) / 0.3530, 1e-4);

  auto test =
      loadDataset(DatasetSpec{.name = "fashion-mnist", .path = kFashionMnistDir}, Split::kTest);
  ASSERT_TRUE(test.ok()) << test.status().toString();
  EXPECT_EQ(test->size(), 10000);
  EXPECT_EQ(test->inputs.sizes(), (std::vector<int64_t>{10000, 1, 28, 28}));
  EXPECT_TRUE(torch::equal(torch::bincount(test->targets), torch::full({10}, 1000, torch::kLong)));
}

// ---- IDX fixtures --------------------------------------------------------------

TEST_F(DatasetFiles, RawAndGzippedIdxLoadTheSame) {
  writeIdxPair(7, /*gz=*/false);
  auto raw = load();
  ASSERT_TRUE(raw.ok()) << raw.status().toString();

  fs::remove(dir_ / "train-images-idx3-ubyte");
  fs::remove(dir_ / "train-labels-idx1-ubyte");
  writeIdxPair(7, /*gz=*/true);
  auto gz = load();
  ASSERT_TRUE(gz.ok()) << gz.status().toString();

  ASSERT_EQ(raw->size(), 7);
  EXPECT_EQ(raw->inputs.sizes(), (std::vector<int64_t>{7, 1, 28, 28}));
  EXPECT_TRUE(torch::equal(raw->inputs, gz->inputs));
  EXPECT_TRUE(torch::equal(raw->targets, gz->targets));
  EXPECT_TRUE(torch::equal(raw->targets, torch::arange(7, torch::kLong) % 10));
  // Pixel p of image i is (i*31 + p) % 256, normalized with the fixed
  // Fashion-MNIST constants.
  auto expectedPixel = [](int i, int p) {
    return (((i * 31 + p) % 256) / 255.0 - 0.2860) / 0.3530;
  };
  EXPECT_NEAR(raw->inputs[0][0][0][0].item<double>(), expectedPixel(0, 0), 1e-5);
  EXPECT_NEAR(raw->inputs[3][0][2][5].item<double>(), expectedPixel(3, 2 * 28 + 5), 1e-5);
  EXPECT_NEAR(gz->inputs[6][0][27][27].item<double>(), expectedPixel(6, 783), 1e-5);
}

TEST_F(DatasetFiles, MixedRawAndGzippedFilesAndTestSplitNames) {
  writeFile(dir_ / "t10k-images-idx3-ubyte", idxImages(3));
  writeGz(dir_ / "t10k-labels-idx1-ubyte.gz", idxLabels(3));
  auto r = load("fashion-mnist", Split::kTest);
  ASSERT_TRUE(r.ok()) << r.status().toString();
  EXPECT_EQ(r->size(), 3);
}

TEST_F(DatasetFiles, MnistUsesItsOwnNormalization) {
  writeIdxPair(2, /*gz=*/false);
  auto r = load("mnist");
  ASSERT_TRUE(r.ok()) << r.status().toString();
  EXPECT_NEAR(r->inputs[1][0][0][3].item<double>(), ((31 + 3) / 255.0 - 0.1307) / 0.3081, 1e-5);
}

TEST_F(DatasetFiles, MissingFileIsNotFoundNamingEveryPathTried) {
  auto r = load();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound) << r.status().toString();
  const std::string& msg = r.status().message();
  EXPECT_NE(msg.find((dir_ / "train-images-idx3-ubyte").string()), std::string::npos) << msg;
  EXPECT_NE(msg.find((dir_ / "train-images-idx3-ubyte.gz").string()), std::string::npos) << msg;

  // Images present, labels missing: the labels' paths are named.
  writeFile(dir_ / "train-images-idx3-ubyte", idxImages(2));
  r = load();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find((dir_ / "train-labels-idx1-ubyte.gz").string()),
            std::string::npos)
      << r.status().toString();
}

TEST_F(DatasetFiles, BadImageMagic) {
  writeFile(dir_ / "train-images-idx3-ubyte", idxImages(2, 28, 28, /*magic=*/2049));
  writeFile(dir_ / "train-labels-idx1-ubyte", idxLabels(2));
  expectDataLoss(
      load(), {"train-images-idx3-ubyte", "bad IDX magic number", "expected 2051", "found 2049"});
}

TEST_F(DatasetFiles, BadLabelMagic) {
  writeFile(dir_ / "train-images-idx3-ubyte", idxImages(2));
  writeGz(dir_ / "train-labels-idx1-ubyte.gz", idxLabels(2, /*magic=*/2051));
  expectDataLoss(load(), {"train-labels-idx1-ubyte.gz", "bad IDX magic number", "expected 2049",
                          "found 2051"});
}

TEST_F(DatasetFiles, WrongImageDimensions) {
  writeFile(dir_ / "train-images-idx3-ubyte", idxImages(2, 32, 30));
  writeFile(dir_ / "train-labels-idx1-ubyte", idxLabels(2));
  expectDataLoss(load(), {"train-images-idx3-ubyte", "wrong image dimensions", "expected 28x28",
                          "found 32x30"});
}

TEST_F(DatasetFiles, ImageAndLabelCountsDiffer) {
  writeFile(dir_ / "train-images-idx3-ubyte", idxImages(5));
  writeFile(dir_ / "train-labels-idx1-ubyte", idxLabels(4));
  expectDataLoss(load(), {"image count != label count", "expected 5 labels",
                          "train-labels-idx1-ubyte", "found 4"});
}

TEST_F(DatasetFiles, TruncatedImagePayload) {
  std::vector<uint8_t> images = idxImages(3);
  images.resize(images.size() - 100);
  writeFile(dir_ / "train-images-idx3-ubyte", images);
  writeFile(dir_ / "train-labels-idx1-ubyte", idxLabels(3));
  expectDataLoss(load(), {"train-images-idx3-ubyte", "truncated", "promises 3 images", "2352 bytes",
                          "found only 2252 bytes"});
}

TEST_F(DatasetFiles, TruncatedLabelPayloadInsideGzip) {
  // A complete gzip stream whose content is short.
  std::vector<uint8_t> labels = idxLabels(3);
  labels.pop_back();
  writeFile(dir_ / "train-images-idx3-ubyte", idxImages(3));
  writeGz(dir_ / "train-labels-idx1-ubyte.gz", labels);
  expectDataLoss(load(), {"train-labels-idx1-ubyte.gz", "truncated", "promises 3 labels",
                          "found only 2 bytes"});
}

TEST_F(DatasetFiles, CutGzipStream) {
  // The compressed file itself is cut short (a partial download).
  writeIdxPair(40, /*gz=*/true);
  const fs::path images = dir_ / "train-images-idx3-ubyte.gz";
  std::vector<uint8_t> bytes = readFile(images);
  bytes.resize(bytes.size() / 2);
  writeFile(images, bytes);
  expectDataLoss(load(), {"train-images-idx3-ubyte.gz"});
}

TEST_F(DatasetFiles, CorruptGzipStream) {
  writeIdxPair(40, /*gz=*/true);
  const fs::path labels = dir_ / "train-labels-idx1-ubyte.gz";
  std::vector<uint8_t> bytes = readFile(labels);
  ASSERT_GT(bytes.size(), 30u);
  for (size_t i = 12; i < bytes.size() - 8; ++i) bytes[i] ^= 0x5A;
  writeFile(labels, bytes);
  expectDataLoss(load(), {"train-labels-idx1-ubyte.gz"});
}

TEST_F(DatasetFiles, TruncatedHeader) {
  std::vector<uint8_t> images = idxImages(1);
  images.resize(10);
  writeFile(dir_ / "train-images-idx3-ubyte", images);
  writeFile(dir_ / "train-labels-idx1-ubyte", idxLabels(1));
  expectDataLoss(
      load(), {"train-images-idx3-ubyte", "truncated IDX header", "expected 16 bytes", "found 10"});
}

TEST_F(DatasetFiles, TrailingBytes) {
  std::vector<uint8_t> labels = idxLabels(3);
  labels.push_back(0);
  writeFile(dir_ / "train-images-idx3-ubyte", idxImages(3));
  writeFile(dir_ / "train-labels-idx1-ubyte", labels);
  expectDataLoss(load(), {"train-labels-idx1-ubyte", "longer than the header says",
                          "expected exactly 3 bytes"});
}

TEST_F(DatasetFiles, HugeCountInHeaderIsTruncationNotACrash) {
  std::vector<uint8_t> images = idxImages(2);
  images[4] = images[5] = images[6] = images[7] = 0xFF;  // 4294967295 images
  writeFile(dir_ / "train-images-idx3-ubyte", images);
  writeFile(dir_ / "train-labels-idx1-ubyte", idxLabels(2));
  expectDataLoss(load(), {"truncated", "promises 4294967295 images", "found only 1568 bytes"});
}

TEST_F(DatasetFiles, LabelOutOfRange) {
  std::vector<uint8_t> labels = idxLabels(6);
  labels[8 + 4] = 10;
  writeFile(dir_ / "train-images-idx3-ubyte", idxImages(6));
  writeFile(dir_ / "train-labels-idx1-ubyte", labels);
  expectDataLoss(load(), {"train-labels-idx1-ubyte", "label 10 of record 4 is out of range",
                          "expected [0, 10)"});
}

TEST_F(DatasetFiles, UnknownNameAndBadSyntheticSize) {
  auto r = load("imagenet");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("fashion-mnist, mnist, cifar10, synthetic"),
            std::string::npos)
      << r.status().toString();

  auto s = loadDataset(DatasetSpec{.name = "synthetic", .syntheticSamples = 0}, Split::kTrain);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
}

// ---- CIFAR-10 --------------------------------------------------------------------

TEST_F(DatasetFiles, Cifar10LoadsFromTheBatchesFolder) {
  const fs::path batches = dir_ / "cifar-10-batches-bin";
  fs::create_directories(batches);
  for (int b = 1; b <= 5; ++b) {
    writeFile(batches / fmt::format("data_batch_{}.bin", b), cifarRecords(2, b));
  }
  writeFile(batches / "test_batch.bin", cifarRecords(3, 0));

  auto train = load("cifar10");
  ASSERT_TRUE(train.ok()) << train.status().toString();
  EXPECT_EQ(train->size(), 10);
  EXPECT_EQ(train->inputs.sizes(), (std::vector<int64_t>{10, 3, 32, 32}));
  EXPECT_EQ(train->targets.scalar_type(), torch::kLong);
  // Batch b holds labels b, b+1.
  EXPECT_EQ(train->targets[0].item<int64_t>(), 1);
  EXPECT_EQ(train->targets[1].item<int64_t>(), 2);
  EXPECT_EQ(train->targets[9].item<int64_t>(), 6);
  // Record 1 of a batch: pixel p = (7 + p) % 256, channel-major.
  const std::array<double, 3> mean = {0.4914, 0.4822, 0.4465};
  const std::array<double, 3> stdev = {0.2470, 0.2435, 0.2616};
  for (int c = 0; c < 3; ++c) {
    const int p = c * 1024 + 5 * 32 + 9;
    EXPECT_NEAR(train->inputs[3][c][5][9].item<double>(),
                (((7 + p) % 256) / 255.0 - mean[c]) / stdev[c], 1e-5)
        << "channel " << c;
  }

  auto test = load("cifar10", Split::kTest);
  ASSERT_TRUE(test.ok()) << test.status().toString();
  EXPECT_EQ(test->size(), 3);
}

TEST_F(DatasetFiles, Cifar10Errors) {
  auto r = load("cifar10", Split::kTest);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find((dir_ / "test_batch.bin").string()), std::string::npos);
  EXPECT_NE(r.status().message().find((dir_ / "cifar-10-batches-bin" / "test_batch.bin").string()),
            std::string::npos)
      << r.status().toString();

  std::vector<uint8_t> records = cifarRecords(2, 0);
  records.resize(records.size() - 1);
  writeFile(dir_ / "test_batch.bin", records);
  expectDataLoss(load("cifar10", Split::kTest),
                 {"test_batch.bin", "3073-byte records", "found 6145 bytes"});

  records = cifarRecords(2, 0);
  records[3073] = 200;
  writeFile(dir_ / "test_batch.bin", records);
  expectDataLoss(load("cifar10", Split::kTest),
                 {"test_batch.bin", "label 200 of record 1 is out of range"});
}

// ---- npy: a user's own arrays ----------------------------------------------------

// A .npy file as numpy.save writes it (format 1.0): magic, version, header
// length, the dict literal padded with spaces to a multiple of 64 bytes, then
// the raw elements.
std::vector<uint8_t> npyFile(const std::string& descr, const std::vector<int64_t>& shape,
                             const void* data, size_t bytes, bool fortran = false) {
  std::string shapeText = "(";
  for (size_t i = 0; i < shape.size(); ++i) {
    shapeText += std::to_string(shape[i]) + (shape.size() == 1 || i + 1 < shape.size() ? "," : "");
    if (i + 1 < shape.size()) shapeText += " ";
  }
  shapeText += ")";
  std::string header = fmt::format("{{'descr': '{}', 'fortran_order': {}, 'shape': {}, }}", descr,
                                   fortran ? "True" : "False", shapeText);
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::vector<uint8_t> out = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0};
  out.push_back(static_cast<uint8_t>(header.size() & 0xff));
  out.push_back(static_cast<uint8_t>(header.size() >> 8));
  out.insert(out.end(), header.begin(), header.end());
  const auto* p = static_cast<const uint8_t*>(data);
  out.insert(out.end(), p, p + bytes);
  return out;
}

template <typename T>
std::vector<uint8_t> npyOf(const std::string& descr, const std::vector<int64_t>& shape,
                           const std::vector<T>& values) {
  return npyFile(descr, shape, values.data(), values.size() * sizeof(T));
}

class DatasetNpy : public DatasetFiles {
 protected:
  // n samples of [2, 3] float32 features (sample i, element k = i + k / 10)
  // and labels i % classes, in both splits.
  void writeClassification(int64_t n, int64_t classes) {
    for (const std::string split : {"train", "test"}) {
      std::vector<float> x;
      std::vector<int64_t> y;
      for (int64_t i = 0; i < n; ++i) {
        for (int k = 0; k < 6; ++k) x.push_back(static_cast<float>(i) + static_cast<float>(k) / 10);
        y.push_back(i % classes);
      }
      writeFile(dir_ / (split + "_x.npy"), npyOf("<f4", {n, 2, 3}, x));
      writeFile(dir_ / (split + "_y.npy"), npyOf("<i8", {n}, y));
    }
  }
  StatusOr<TensorDataset> loadNpy(Split split = Split::kTrain, int64_t classes = 0) {
    return loadDataset(DatasetSpec{.name = "npy", .path = dir_, .classes = classes}, split);
  }
  void expectError(const StatusOr<TensorDataset>& r, StatusCode code,
                   const std::vector<std::string>& pieces) {
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), code) << r.status().toString();
    for (const std::string& piece : pieces) {
      EXPECT_NE(r.status().message().find(piece), std::string::npos)
          << "\"" << piece << "\" missing from: " << r.status().toString();
    }
  }
};

TEST_F(DatasetNpy, ClassificationOfAnyShapeWithClassesFromTheLabels) {
  writeClassification(40, 13);
  auto train = loadNpy();
  ASSERT_TRUE(train.ok()) << train.status().toString();
  EXPECT_EQ(train->inputs.sizes(), (std::vector<int64_t>{40, 2, 3}));
  EXPECT_EQ(train->inputs.dtype(), torch::kFloat);
  EXPECT_FLOAT_EQ(train->inputs[7][1][2].item<float>(), 7.5f);
  EXPECT_EQ(train->targets.dtype(), torch::kLong);
  EXPECT_EQ(train->targets[27].item<int64_t>(), 1);
  EXPECT_FALSE(train->regression());
  EXPECT_EQ(train->numClasses, 13);  // beyond ten classes, from the largest label
  auto test = loadNpy(Split::kTest);
  ASSERT_TRUE(test.ok());
  EXPECT_TRUE(checkSplitsAgree(*train, *test, "npy").ok());
  // A shard of a memory-mapped set owns its rows (the mapping may go).
  const TensorDataset half = shard(*train, 1, 2);
  EXPECT_EQ(half.size(), 20);
  EXPECT_FLOAT_EQ(half.inputs[0][0][0].item<float>(), 1.0f);
  // model.classes fixes the count; a label at or above it is an error.
  auto wide = loadNpy(Split::kTrain, 100);
  ASSERT_TRUE(wide.ok());
  EXPECT_EQ(wide->numClasses, 100);
  expectError(loadNpy(Split::kTrain, 5), StatusCode::kDataLoss,
              {"train_y.npy", "label 5 of sample 5 is out of range", "[0, 5)", "model.classes"});
}

TEST_F(DatasetNpy, RegressionTargetsAndConvertedFeatures) {
  for (const std::string split : {"train", "test"}) {
    const std::vector<double> x = {1, 2, 3, 4, 5, 6};  // float64: converted to float32
    const std::vector<float> y = {0.5f, -1, 2, 0.25f, 3, 4};
    writeFile(dir_ / (split + "_x.npy"), npyOf("<f8", {3, 2}, x));
    writeFile(dir_ / (split + "_y.npy"), npyOf("<f4", {3, 2}, y));
  }
  auto train = loadNpy();
  ASSERT_TRUE(train.ok()) << train.status().toString();
  EXPECT_TRUE(train->regression());
  EXPECT_EQ(train->numClasses, 2);  // targets per sample
  EXPECT_EQ(train->targets.sizes(), (std::vector<int64_t>{3, 2}));
  EXPECT_FLOAT_EQ(train->targets[1][1].item<float>(), 0.25f);
  EXPECT_EQ(train->inputs.dtype(), torch::kFloat);
  EXPECT_FLOAT_EQ(train->inputs[2][1].item<float>(), 6.0f);
  // One target per sample may be a flat [N] file.
  writeFile(dir_ / "train_y.npy", npyOf("<f8", {3}, std::vector<double>{1, 2, 3}));
  auto flat = loadNpy();
  ASSERT_TRUE(flat.ok()) << flat.status().toString();
  EXPECT_EQ(flat->targets.sizes(), (std::vector<int64_t>{3, 1}));
  auto test = loadNpy(Split::kTest);
  ASSERT_TRUE(test.ok());
  const Status s = checkSplitsAgree(*flat, *test, "npy");
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("1 targets per training sample, 2 per test sample"), std::string::npos)
      << s.toString();
}

TEST_F(DatasetNpy, BadFilesAreNamedWithWhatIsWrong) {
  writeClassification(10, 3);
  const fs::path x = dir_ / "train_x.npy";
  const fs::path y = dir_ / "train_y.npy";
  const auto good = readFile(x);
  // Missing.
  fs::remove(dir_ / "test_y.npy");
  expectError(loadNpy(Split::kTest), StatusCode::kNotFound, {"test_y.npy", "no such file"});
  // Not numpy's at all.
  writeFile(x, {'h', 'e', 'l', 'l', 'o', ',', ' ', 'w', 'o', 'r', 'l', 'd'});
  expectError(loadNpy(), StatusCode::kDataLoss, {"train_x.npy", "not a .npy file"});
  // Truncated, and with trailing bytes.
  writeFile(x, std::vector<uint8_t>(good.begin(), good.end() - 5));
  expectError(loadNpy(), StatusCode::kDataLoss, {"train_x.npy", "truncated"});
  auto longer = good;
  longer.push_back(0);
  writeFile(x, longer);
  expectError(loadNpy(), StatusCode::kDataLoss, {"train_x.npy", "trailing bytes"});
  // Big-endian, Fortran order, a dtype numpy has and we do not take.
  const std::vector<float> six(60, 1.0f);
  writeFile(x, npyOf(">f4", {10, 6}, six));
  expectError(loadNpy(), StatusCode::kInvalidArgument, {"train_x.npy", ">f4", "big-endian"});
  writeFile(x, npyFile("<f4", {10, 6}, six.data(), six.size() * 4, /*fortran=*/true));
  expectError(loadNpy(), StatusCode::kInvalidArgument, {"train_x.npy", "Fortran order"});
  writeFile(x, npyOf("<c8", {10, 3}, six));
  expectError(loadNpy(), StatusCode::kInvalidArgument, {"train_x.npy", "dtype <c8"});
  writeFile(x, good);
  // Labels: a count that differs from the features', a negative label.
  writeFile(y, npyOf("<i8", {9}, std::vector<int64_t>(9, 0)));
  expectError(loadNpy(), StatusCode::kDataLoss, {"train_y.npy", "int64 [9]", "expected [10]"});
  std::vector<int32_t> labels(10, 1);
  labels[4] = -2;
  writeFile(y, npyOf("<i4", {10}, labels));
  expectError(loadNpy(), StatusCode::kDataLoss,
              {"train_y.npy", "label -2 of sample 4 is out of range"});
  // Integer labels must be one per sample.
  writeFile(y, npyOf("<i8", {10, 2}, std::vector<int64_t>(20, 0)));
  expectError(loadNpy(), StatusCode::kDataLoss, {"train_y.npy", "one per sample"});
  // A test label the training split never had.
  writeClassification(10, 3);
  std::vector<int64_t> testLabels(10, 0);
  testLabels[9] = 7;
  writeFile(dir_ / "test_y.npy", npyOf("<i8", {10}, testLabels));
  auto train = loadNpy();
  auto test = loadNpy(Split::kTest);
  ASSERT_TRUE(train.ok() && test.ok());
  const Status s = checkSplitsAgree(*train, *test, "npy");
  EXPECT_NE(s.message().find("test label 7 is out of range"), std::string::npos) << s.toString();
  // No folder named.
  expectError(loadDataset(DatasetSpec{.name = "npy"}, Split::kTrain), StatusCode::kInvalidArgument,
              {"dataset.path"});
}

// ---- tokens: a corpus as flat token ids ----------------------------------------

class DatasetTokens : public DatasetNpy {
 protected:
  // n uint16 ids, id i = (i * 7) % modulo, in train.bin and val.bin.
  void writeTokens(int64_t n, int64_t modulo) {
    std::vector<uint16_t> ids;
    for (int64_t i = 0; i < n; ++i) ids.push_back(static_cast<uint16_t>((i * 7) % modulo));
    const auto* p = reinterpret_cast<const uint8_t*>(ids.data());
    const std::vector<uint8_t> bytes(p, p + ids.size() * 2);
    writeFile(dir_ / "train.bin", bytes);
    writeFile(dir_ / "val.bin", bytes);
  }
  StatusOr<TensorDataset> loadTokens(Split split, int64_t context = 8, int64_t classes = 0) {
    return loadDataset(
        DatasetSpec{.name = "tokens", .path = dir_, .classes = classes, .context = context}, split);
  }
};

TEST_F(DatasetTokens, WindowsOfTheStreamAndTheirNextTokens) {
  writeTokens(1000, 300);
  auto train = loadTokens(Split::kTrain);
  ASSERT_TRUE(train.ok()) << train.status().toString();
  EXPECT_TRUE(train->isTokenStream());
  EXPECT_EQ(train->numClasses, 300);  // ids up to 299: more than bytes
  EXPECT_EQ(train->size(), 1000 - 8);
  const torch::Tensor starts = torch::tensor({0, 5, 991}, torch::kLong);
  const auto [x, y] = tokenWindows(*train, starts);
  EXPECT_EQ(x.sizes(), (std::vector<int64_t>{3, 8}));
  EXPECT_EQ(x[1][0].item<int64_t>(), 35);
  EXPECT_EQ(y[1][0].item<int64_t>(), 42);  // the next token
  EXPECT_EQ(y[2][7].item<int64_t>(), (999 * 7) % 300);
  // Evaluation: fixed windows spread over val.bin.
  auto val = loadTokens(Split::kTest);
  ASSERT_TRUE(val.ok());
  EXPECT_EQ(val->inputs.sizes(), (std::vector<int64_t>{kEvalWindows, 8}));
  EXPECT_TRUE(torch::equal(val->targets.narrow(1, 0, 7), val->inputs.narrow(1, 1, 7)));
  EXPECT_TRUE(checkSplitsAgree(*train, *val, "tokens").ok());
  // Byte-level ids have the bytes' vocabulary.
  writeTokens(100, 50);
  auto bytes = loadTokens(Split::kTrain);
  ASSERT_TRUE(bytes.ok());
  EXPECT_EQ(bytes->numClasses, 256);
}

TEST_F(DatasetTokens, ContiguousShardsAndDrawsThatDependOnTheStepAlone) {
  writeTokens(1000, 256);
  auto train = loadTokens(Split::kTrain);
  ASSERT_TRUE(train.ok());
  int64_t total = 0;
  for (int64_t i = 0; i < 3; ++i) {
    const TensorDataset part = shard(*train, i, 3);
    total += part.tokens.count;
    EXPECT_EQ(part.tokens.at(0), train->tokens.at(i * 1000 / 3));
  }
  EXPECT_EQ(total, 1000);
  const torch::Tensor a = randomWindowStarts(7, 12, 64, 100);
  EXPECT_TRUE(torch::equal(a, randomWindowStarts(7, 12, 64, 100)));
  EXPECT_FALSE(torch::equal(a, randomWindowStarts(7, 13, 64, 100)));
  EXPECT_FALSE(torch::equal(a, randomWindowStarts(8, 12, 64, 100)));
  EXPECT_GE(a.min().item<int64_t>(), 0);
  EXPECT_LT(a.max().item<int64_t>(), 100);
}

TEST_F(DatasetTokens, BadFilesAreNamedWithWhatIsWrong) {
  writeTokens(1000, 300);
  // An id at or above the vocabulary set by model.classes.
  expectError(loadTokens(Split::kTrain, 8, 256), StatusCode::kDataLoss,
              {"train.bin", "token id 259 at position 37 is out of range", "[0, 256)"});
  // Half a token, too short for a window, missing, uint32 ids read as such.
  writeFile(dir_ / "train.bin", {1, 0, 2});
  expectError(loadTokens(Split::kTrain), StatusCode::kDataLoss,
              {"train.bin", "3 bytes is not a whole number of 2-byte token ids"});
  writeFile(dir_ / "train.bin", {1, 0, 2, 0});
  expectError(loadTokens(Split::kTrain), StatusCode::kDataLoss,
              {"train.bin", "2 tokens, fewer than one window of model.context + 1 = 9"});
  fs::remove(dir_ / "val.bin");
  expectError(loadTokens(Split::kTest), StatusCode::kNotFound, {"val.bin", "no such file"});
  std::vector<uint8_t> wide;
  for (uint32_t i = 0; i < 20; ++i) {
    const uint32_t id = 70000 + i;
    wide.insert(wide.end(), reinterpret_cast<const uint8_t*>(&id),
                reinterpret_cast<const uint8_t*>(&id) + 4);
  }
  writeFile(dir_ / "train.bin", wide);
  auto four = loadDataset(
      DatasetSpec{.name = "tokens", .path = dir_, .tokenBytes = 4, .context = 8}, Split::kTrain);
  ASSERT_TRUE(four.ok()) << four.status().toString();
  EXPECT_EQ(four->numClasses, 70020);
  EXPECT_EQ(four->tokens.at(3), 70003);
}

TEST(DatasetInputs, DescribedForTheExportedModel) {
  EXPECT_EQ(describeInputs("fashion-mnist"),
            "float32 [N, 1, 28, 28]: (pixel / 255 - 0.2860) / 0.3530");
  EXPECT_NE(describeInputs("cifar10").find("R, G, B"), std::string::npos);
  EXPECT_NE(describeInputs("npy").find("as they are"), std::string::npos);
}

// ---- Synthetic -----------------------------------------------------------------

TEST(DatasetSynthetic, DeterministicPerSeedAndDifferentAcrossSeeds) {
  auto spec = DatasetSpec{.name = "synthetic", .syntheticSamples = 600, .seed = 7};
  auto a = loadDataset(spec, Split::kTrain);
  auto b = loadDataset(spec, Split::kTrain);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->inputs.sizes(), (std::vector<int64_t>{600, 1, 28, 28}));
  EXPECT_EQ(a->targets.scalar_type(), torch::kLong);
  EXPECT_TRUE(torch::equal(a->inputs, b->inputs));
  EXPECT_TRUE(torch::equal(a->targets, b->targets));

  spec.seed = 8;
  auto c = loadDataset(spec, Split::kTrain);
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(torch::equal(a->inputs, c->inputs));
  EXPECT_FALSE(torch::equal(a->targets, c->targets));

  // The test split is another stream, of syntheticSamples / 6 samples.
  spec.seed = 7;
  auto t = loadDataset(spec, Split::kTest);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->size(), 100);
  EXPECT_FALSE(torch::equal(a->inputs.slice(0, 0, 100), t->inputs));

  // Sample i does not depend on the sample count: a smaller set is a prefix.
  spec.syntheticSamples = 50;
  auto prefix = loadDataset(spec, Split::kTrain);
  ASSERT_TRUE(prefix.ok());
  EXPECT_TRUE(torch::equal(prefix->inputs, a->inputs.slice(0, 0, 50)));

  // Independent of torch's global RNG.
  torch::manual_seed(1);
  spec.syntheticSamples = 600;
  auto d = loadDataset(spec, Split::kTrain);
  ASSERT_TRUE(d.ok());
  EXPECT_TRUE(torch::equal(a->inputs, d->inputs));
}

TEST(DatasetSynthetic, DefaultSizesNormalizedAndLearnable) {
  const auto start = std::chrono::steady_clock::now();
  auto train = loadDataset(DatasetSpec{.name = "synthetic"}, Split::kTrain);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(train.ok()) << train.status().toString();
  std::printf("synthetic train: 60000 images generated in %.3f s\n", seconds);
  auto test = loadDataset(DatasetSpec{.name = "synthetic"}, Split::kTest);
  ASSERT_TRUE(test.ok());
  EXPECT_EQ(train->size(), 60000);
  EXPECT_EQ(test->size(), 10000);
  EXPECT_NEAR(train->inputs.mean().item<double>(), 0.0, 0.02);
  EXPECT_NEAR(train->inputs.std().item<double>(), 1.0, 0.05);
  // Every class appears, roughly uniformly.
  torch::Tensor counts = torch::bincount(train->targets, {}, 10);
  EXPECT_EQ(counts.size(0), 10);
  EXPECT_GT(counts.min().item<int64_t>(), 5500);
  EXPECT_LT(counts.max().item<int64_t>(), 6500);

  // Learnable: even a nearest-class-mean classifier fitted on the training
  // split does far better than chance (10%) on the test split.
  torch::Tensor x = train->inputs.flatten(1);
  torch::Tensor means = torch::zeros({10, x.size(1)});
  means.index_add_(0, train->targets, x);
  means.div_(counts.to(torch::kFloat).unsqueeze(1));
  torch::Tensor tx = test->inputs.flatten(1);
  torch::Tensor predicted = torch::cdist(tx, means).argmin(1);
  const double accuracy = predicted.eq(test->targets).to(torch::kDouble).mean().item<double>();
  std::printf("synthetic: nearest-class-mean test accuracy %.3f\n", accuracy);
  EXPECT_GT(accuracy, 0.8);
}

// ---- shard ---------------------------------------------------------------------------

TensorDataset numbered(int64_t n) {
  TensorDataset d;
  d.inputs = torch::arange(n, torch::kFloat).view({n, 1, 1, 1}).expand({n, 1, 2, 2}).contiguous();
  d.targets = torch::arange(n, torch::kLong);
  return d;
}

TEST(DatasetShard, PartitionsTheDataSet) {
  const TensorDataset d = numbered(103);
  for (int64_t count : {1, 2, 4, 7, 103, 150}) {
    std::vector<int> seen(103, 0);
    int64_t total = 0;
    for (int64_t index = 0; index < count; ++index) {
      TensorDataset s = shard(d, index, count);
      EXPECT_EQ(s.size(), index < 103 ? (103 - index + count - 1) / count : 0)
          << index << "/" << count;
      EXPECT_EQ(s.inputs.size(0), s.targets.size(0));
      EXPECT_EQ(s.numClasses, d.numClasses);
      EXPECT_TRUE(s.inputs.is_contiguous());
      total += s.size();
      for (int64_t k = 0; k < s.size(); ++k) {
        const int64_t i = s.targets[k].item<int64_t>();
        EXPECT_EQ(i % count, index) << "element " << i << " in shard " << index << "/" << count;
        EXPECT_EQ(s.inputs[k][0][1][1].item<float>(), static_cast<float>(i));
        ++seen[static_cast<size_t>(i)];
      }
    }
    EXPECT_EQ(total, 103) << count;
    for (int i = 0; i < 103; ++i) EXPECT_EQ(seen[i], 1) << "element " << i << ", count " << count;
  }
}

TEST(DatasetShard, OwnsItsRowsAndRejectsBadArguments) {
  const TensorDataset d = numbered(10);
  TensorDataset s = shard(d, 1, 3);
  s.inputs.zero_();
  EXPECT_EQ(d.inputs[1][0][0][0].item<float>(), 1.0f);  // a copy, not a view

  EXPECT_THROW(shard(d, 3, 3), Error);
  EXPECT_THROW(shard(d, -1, 3), Error);
  EXPECT_THROW(shard(d, 0, 0), Error);
}

// ---- BatchSampler ------------------------------------------------------------

std::vector<int64_t> toVector(const torch::Tensor& t) {
  return {t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel()};
}

TEST(BatchSampler, EveryIndexOncePerEpoch) {
  BatchSampler sampler(100, 10, 42);
  EXPECT_EQ(sampler.batchesPerEpoch(), 10);
  std::vector<int64_t> epoch0;
  for (int b = 0; b < 10; ++b) {
    torch::Tensor batch = sampler.next();
    EXPECT_EQ(batch.scalar_type(), torch::kLong);
    EXPECT_EQ(batch.sizes(), (std::vector<int64_t>{10}));
    for (int64_t i : toVector(batch)) epoch0.push_back(i);
  }
  EXPECT_EQ(sampler.state(), (BatchSampler::State{0, 100}));
  std::vector<int64_t> epoch1;
  for (int b = 0; b < 10; ++b) {
    for (int64_t i : toVector(sampler.next())) epoch1.push_back(i);
  }
  EXPECT_EQ(sampler.state(), (BatchSampler::State{1, 100}));
  EXPECT_NE(epoch0, epoch1) << "each epoch is a different order";
  std::vector<int64_t> all(100);
  std::iota(all.begin(), all.end(), 0);
  std::sort(epoch0.begin(), epoch0.end());
  std::sort(epoch1.begin(), epoch1.end());
  EXPECT_EQ(epoch0, all);
  EXPECT_EQ(epoch1, all);
}

TEST(BatchSampler, PartialLastBatchIsSkipped) {
  BatchSampler sampler(25, 10, 1);
  std::set<int64_t> seen;
  for (int b = 0; b < 2; ++b) {
    for (int64_t i : toVector(sampler.next())) seen.insert(i);
  }
  EXPECT_EQ(seen.size(), 20u);
  EXPECT_EQ(sampler.state(), (BatchSampler::State{0, 20}));
  sampler.next();  // the 5 left over are dropped: a new epoch starts
  EXPECT_EQ(sampler.state(), (BatchSampler::State{1, 10}));
}

TEST(BatchSampler, DeterministicPerSeedAndIndependentOfTorchRng) {
  BatchSampler a(1000, 32, 5);
  BatchSampler b(1000, 32, 5);
  BatchSampler c(1000, 32, 6);
  torch::manual_seed(123);
  const torch::Tensor before = torch::rand({4});
  torch::manual_seed(123);
  bool differs = false;
  for (int k = 0; k < 100; ++k) {  // several epochs
    torch::Tensor x = a.next();
    torch::manual_seed(k);  // must not matter
    EXPECT_TRUE(torch::equal(x, b.next())) << "batch " << k;
    differs = differs || !torch::equal(x, c.next());
  }
  EXPECT_TRUE(differs) << "another seed gives another order";
  // And the sampler does not consume torch's global generator.
  BatchSampler d(1000, 32, 5);
  torch::manual_seed(123);
  for (int k = 0; k < 50; ++k) d.next();
  EXPECT_TRUE(torch::equal(torch::rand({4}), before));
}

TEST(BatchSampler, RestoreContinuesIdentically) {
  BatchSampler original(103, 8, 99);
  for (int k = 0; k < 17; ++k) original.next();  // into epoch 1
  const BatchSampler::State saved = original.state();
  EXPECT_EQ(saved, (BatchSampler::State{1, 40}));
  std::vector<std::vector<int64_t>> expected;
  for (int k = 0; k < 40; ++k) expected.push_back(toVector(original.next()));

  // A fresh sampler (epoch 0), and one that has run further (epoch 3).
  BatchSampler fresh(103, 8, 99);
  BatchSampler ahead(103, 8, 99);
  for (int k = 0; k < 45; ++k) ahead.next();
  for (BatchSampler* s : {&fresh, &ahead}) {
    s->restore(saved);
    EXPECT_EQ(s->state(), saved);
    for (int k = 0; k < 40; ++k) EXPECT_EQ(toVector(s->next()), expected[k]) << "batch " << k;
    EXPECT_EQ(s->state(), original.state());
  }

  // Restoring at the very end of an epoch rolls over on the next call.
  BatchSampler atEnd(103, 8, 99);
  atEnd.restore({2, 103});
  atEnd.next();
  EXPECT_EQ(atEnd.state(), (BatchSampler::State{3, 8}));
}

TEST(BatchSampler, RejectsBadArguments) {
  EXPECT_THROW(BatchSampler(10, 0, 1), Error);
  EXPECT_THROW(BatchSampler(10, 11, 1), Error);
  EXPECT_NO_THROW(BatchSampler(10, 10, 1));
  BatchSampler s(10, 5, 1);
  EXPECT_THROW(s.restore({-1, 0}), Error);
  EXPECT_THROW(s.restore({0, 11}), Error);
  EXPECT_THROW(s.restore({0, -1}), Error);
}

}  // namespace
}  // namespace geo::train
