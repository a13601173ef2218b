# Resolves GEO_USE_CUDA (AUTO|ON|OFF) into GEO_CUDA_ENABLED and enables the CUDA
# language when the toolkit is usable. Building the kernels needs only nvcc and
# the CUDA runtime library; running them needs a GPU, which tests check at run
# time (they GTEST_SKIP without one).
string(TOUPPER "${GEO_USE_CUDA}" _geo_cuda_mode)
if(NOT _geo_cuda_mode MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "GEO_USE_CUDA='${GEO_USE_CUDA}' is invalid: allowed values are AUTO, ON, OFF")
endif()

set(GEO_CUDA_ENABLED OFF)
if(NOT _geo_cuda_mode STREQUAL "OFF")
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      # A100 (SASS) and H100/H200 (SASS + PTX for newer GPUs).
      set(CMAKE_CUDA_ARCHITECTURES "80-real;90")
    endif()
    enable_language(CUDA)
    find_package(CUDAToolkit)
    if(CUDAToolkit_FOUND)
      set(GEO_CUDA_ENABLED ON)
      # CMake 3.25 (Debian 12) knows no C++20 flag for nvcc; device code and
      # the headers it includes are C++17.
      set(CMAKE_CUDA_STANDARD 17)
      set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    endif()
  endif()
  if(_geo_cuda_mode STREQUAL "ON" AND NOT GEO_CUDA_ENABLED)
    message(FATAL_ERROR
      "GEO_USE_CUDA=ON but no usable CUDA toolkit was found (nvcc: '${CMAKE_CUDA_COMPILER}', "
      "CUDA runtime found: '${CUDAToolkit_FOUND}'). Install the CUDA toolkit "
      "(nvcc at /usr/local/cuda/bin/nvcc) or configure with -DGEO_USE_CUDA=AUTO or OFF.")
  endif()
endif()
