#!/usr/bin/env bash
# The GPU checks, on a bare CUDA machine (cmake, ninja, nvcc; none of the server's libraries):
# builds common, kernels and tests/gpu in build-gpu/ and runs the ctest label `gpu`.
# Exits non-zero when the build or any GPU test fails.
set -euo pipefail
cd "$(dirname "$0")/../.."

nvidia-smi

# The architectures are pinned here as well as defaulted in cmake/EdgeCuda.cmake: these tests
# exist to exercise Hopper's conversion instructions, and a build for an older architecture
# would quietly test cuda_fp8.h's software fallback instead.
build_dir=build-gpu
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DEDGE_GPU_ONLY=ON -DEDGE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="90a-real;90-virtual"
cmake --build "$build_dir" --parallel "$(nproc)"
ctest --test-dir "$build_dir" -L gpu --output-on-failure --timeout 120
