#!/usr/bin/env bash
# The decode benchmark of docs/performance.md: CPU decode tokens/s at batch 1, 8 and 32 for
# stories260K (the real fixture), and for a synthetic Llama-3.2-1B with bf16, fp8 and int4
# weights and with bf16 and fp8 KV caches at batch 1, 8, 16, 32 and 64 (the published tables'
# layout), with batch-1 weight bandwidth as a share of the machine's measured memory bandwidth.
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
echo "== synthetic llama-3.2-1b: bf16 / fp8 / int4 weights, bf16 / fp8 KV cache =="
# Decode from position 32 without a prefill: a 64-sequence prefill alone would take longer than
# all the decode steps measured.
"$build/edge_bench_decode" --model "$synthetic" --weight-dtype bf16,fp8,int4 --kv-cache-dtype bf16,fp8 \
  --batches 1,8,16,32,64 --context 32 --tokens 4 --repeat 3
