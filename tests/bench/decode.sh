#!/usr/bin/env bash
# The decode benchmark of docs/performance.md: CPU decode tokens/s at batch 1, 8 and 32 for
# stories260K (the real fixture) and a synthetic Llama-3.2-1B in bf16, with batch-1 weight
# bandwidth as a share of the machine's measured memory bandwidth.
#
#   tests/bench/decode.sh [BUILD_DIR]      (default build/; `make bench` runs it)
#
# The synthetic model (2.3 GiB) is written once to $BUILD_DIR/bench-models/ and reused.
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
models=${EDGE_TEST_MODELS:-../shared/models}
synthetic="$build/bench-models/llama-3.2-1b-bf16.gguf"

if [[ ! -f "$synthetic" ]]; then
  mkdir -p "$(dirname "$synthetic")"
  "$build/edgeinfer" make-model --preset llama-3.2-1b --format gguf --dtype bf16 --seed 1 --out "$synthetic"
fi

echo "== stories260K (f32) =="
"$build/edge_bench_decode" --model "$models/stories260K/stories260K.gguf" --batches 1,8,32 --prompt 32 --tokens 128 --repeat 5
echo
echo "== synthetic llama-3.2-1b (bf16) =="
"$build/edge_bench_decode" --model "$synthetic" --batches 1,8,32 --prompt 32 --tokens 32 --repeat 3
