# EDGE_CUDA=AUTO|ON|OFF decides whether the CUDA sources are built. Sets EDGE_WITH_CUDA.
# Targets: sm_90a machine code (Hopper: H100/H200) plus compute_90 PTX, which the driver can
# compile for later GPUs.

set(EDGE_WITH_CUDA OFF)
# Chosen before the language is enabled: enabling it would otherwise settle on nvcc's own default.
if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
  set(CMAKE_CUDA_ARCHITECTURES "90a-real;90-virtual" CACHE STRING "CUDA targets: Hopper machine code plus PTX")
endif()
if(EDGE_CUDA STREQUAL "ON")
  enable_language(CUDA)
  set(EDGE_WITH_CUDA ON)
elseif(EDGE_CUDA STREQUAL "AUTO")
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    enable_language(CUDA)
    set(EDGE_WITH_CUDA ON)
  else()
    message(STATUS "nvcc not found: building without CUDA (EDGE_CUDA=AUTO)")
  endif()
elseif(NOT EDGE_CUDA STREQUAL "OFF")
  message(FATAL_ERROR "EDGE_CUDA must be AUTO, ON or OFF, not '${EDGE_CUDA}'")
endif()

if(EDGE_WITH_CUDA)
  find_package(CUDAToolkit REQUIRED)

  # CMake 3.25 knows nvcc's dialects only up to C++17; nvcc 13 accepts -std=c++20.
  if(NOT "cuda_std_20" IN_LIST CMAKE_CUDA_COMPILE_FEATURES)
    set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    list(APPEND CMAKE_CUDA_COMPILE_FEATURES cuda_std_20)
    set(CMAKE_CUDA20_COMPILE_FEATURES cuda_std_20)
  endif()
  set(CMAKE_CUDA_STANDARD 20)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  set(CMAKE_CUDA_EXTENSIONS OFF)

  set(EDGE_CUDA_WARNINGS -Xcompiler=-Wall,-Wextra)
  if(EDGE_WERROR)
    list(APPEND EDGE_CUDA_WARNINGS -Werror=all-warnings -Xcompiler=-Werror)
  endif()
endif()

# Applies the CUDA dialect and warning set to a target's .cu sources.
function(edge_apply_cuda_flags target)
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:${EDGE_CUDA_WARNINGS}>)
endfunction()
