# The data set tests (included from tests/worker/train/CMakeLists.txt).
# Real Fashion-MNIST cases skip themselves when dataset-fashion-mnist is not
# installed; every other fixture (IDX raw/gz, CIFAR-10) is written to a
# temporary folder at run time.
find_package(ZLIB REQUIRED)
geo_add_test(dataset_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/dataset_test.cc
  DEPS geo_train ZLIB::ZLIB
  LABELS train
  TIMEOUT 120)
