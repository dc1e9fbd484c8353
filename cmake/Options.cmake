# Build switches. Enumerated options are validated: a typo is a configure error.

set(ZEROD_CUDA "AUTO" CACHE STRING "Build the CUDA parts: AUTO (when nvcc is found), ON (required), OFF")
set_property(CACHE ZEROD_CUDA PROPERTY STRINGS AUTO ON OFF)
if(NOT ZEROD_CUDA MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "ZEROD_CUDA must be AUTO, ON or OFF, not '${ZEROD_CUDA}'")
endif()

set(ZEROD_SANITIZE "" CACHE STRING "Sanitizers: '' (none), 'address' (ASan+UBSan), 'thread' (TSan)")
if(NOT ZEROD_SANITIZE MATCHES "^(|address|thread)$")
  message(FATAL_ERROR "ZEROD_SANITIZE must be empty, 'address' or 'thread', not '${ZEROD_SANITIZE}'")
endif()

option(ZEROD_BUILD_TESTS "Build the tests" ON)
option(ZEROD_FUZZ "Build the libFuzzer targets (tests/fuzz; clang only, with ASan and UBSan)" OFF)
option(ZEROD_WERROR "Treat warnings as errors" OFF)

set(ZEROD_HAVE_CUDA OFF)
if(NOT ZEROD_CUDA STREQUAL "OFF")
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    # Set before enable_language, which otherwise picks the compiler's
    # default (sm_75): Ampere and Hopper, with PTX for newer GPUs.
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES "80-real;90")
    endif()
    enable_language(CUDA)
    find_package(CUDAToolkit REQUIRED)
    set(CMAKE_CUDA_STANDARD 17)  # CMake 3.25 does not know nvcc's C++20 flag
    set(ZEROD_HAVE_CUDA ON)
    message(STATUS "zerod: CUDA ${CUDAToolkit_VERSION} found, CUDA parts will be built")
  elseif(ZEROD_CUDA STREQUAL "ON")
    message(FATAL_ERROR "ZEROD_CUDA=ON but no CUDA compiler was found")
  else()
    message(STATUS "zerod: no CUDA compiler found, CUDA parts skipped")
  endif()
else()
  message(STATUS "zerod: ZEROD_CUDA=OFF, CUDA parts skipped")
endif()

if(ZEROD_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang" OR NOT CMAKE_C_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "ZEROD_FUZZ needs clang (libFuzzer), not ${CMAKE_CXX_COMPILER_ID}: "
                        "configure with the 'fuzz' preset, or -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++")
  endif()
  if(ZEROD_SANITIZE)
    message(FATAL_ERROR "ZEROD_FUZZ brings its own sanitizers (address, undefined); leave ZEROD_SANITIZE empty")
  endif()
  # Everything gets coverage for libFuzzer and ASan + UBSan; undefined
  # behaviour aborts, so the fuzzer sees it as a crash. Only the fuzz
  # executables link libFuzzer itself (tests/fuzz).
  add_compile_options(-fsanitize=fuzzer-no-link,address,undefined -fno-omit-frame-pointer
    -fno-sanitize-recover=undefined)
  add_link_options(-fsanitize=address,undefined)
endif()

if(ZEROD_SANITIZE STREQUAL "address")
  add_compile_options(-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined)
  add_link_options(-fsanitize=address,undefined)
elseif(ZEROD_SANITIZE STREQUAL "thread")
  add_compile_options(-fsanitize=thread -fno-omit-frame-pointer)
  add_link_options(-fsanitize=thread)
endif()
