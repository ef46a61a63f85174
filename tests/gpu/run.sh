#!/usr/bin/env bash
# The GPU checks, on a bare CUDA machine (cmake, ninja or make, nvcc; none of the server's
# libraries): builds common, kernels, edge_backend_core and tests/gpu in build-gpu/
# (EDGE_GPU_ONLY=ON) and runs every test and benchmark of the ctest label `gpu`, printing
# all of their output:
#   gpu.numerics      host FP8/BF16/FP16 encoders = the hardware conversions, bit for bit
#   gpu.kernels       every CUDA kernel = its CPU reference over awkward shapes (tolerances inline)
#   gpu.engine        CUDA engine greedy stories260K = CPU engine (needs the fixture:
#                     EDGE_TEST_MODELS=/path/to/models, holding stories260K/stories260K.bin)
#   gpu.bench.decode  bandwidth fractions and synthetic Llama-3-8B decode tokens/s tables
# Exits non-zero when the build or any test fails. About 3 minutes on one H200 (build included).
set -euo pipefail
cd "$(dirname "$0")/../.."

nvidia-smi || true

# The architectures are pinned here as well as defaulted in cmake/EdgeCuda.cmake: these tests
# exist to exercise Hopper's instructions, and a build for an older architecture would quietly
# test cuda_fp8.h's software fallback instead.
build_dir=build-gpu
generator=()
if command -v ninja > /dev/null; then generator=(-G Ninja); fi
cmake -S . -B "$build_dir" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DEDGE_GPU_ONLY=ON -DEDGE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="90a-real;90-virtual"
cmake --build "$build_dir" --parallel "$(nproc)"
ctest --test-dir "$build_dir" -L gpu --verbose --timeout 300
