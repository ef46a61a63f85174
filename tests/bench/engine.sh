#!/usr/bin/env bash
# The engine benchmarks of docs/performance.md:
#   * KV admission: 64 concurrent streams on a small fp8 budget against the same budget in bf16,
#     for stories260K (8-wide heads) and a synthetic model with 128-wide heads;
#   * the trace-driven scheduler simulation at the KV budget of Llama-3-70B (INT4) on an H200,
#     for a chat-like trace and a long-context one.
#
#   tests/bench/engine.sh [BUILD_DIR]      (default build/; `make bench-engine` runs it)
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
models=${EDGE_TEST_MODELS:-../shared/models}
synthetic="$build/bench-models/tiny-hd128.gguf"

if [[ ! -f "$synthetic" ]]; then
  mkdir -p "$(dirname "$synthetic")"
  "$build/edgeinfer" make-model --preset tiny-hd128 --format gguf --dtype f32 --seed 1 --out "$synthetic"
fi

echo "== KV admission: 64 streams, fp8 vs bf16 =="
"$build/edge_bench_kv_admission" --model "$models/stories260K/stories260K.gguf" --model "$synthetic"
for rate in 2.5 3; do
  echo "== scheduler simulation: Llama-3-70B INT4 on an H200, chat trace at $rate/s =="
  "$build/edge_bench_scheduler_sim" --requests 4000 --rate "$rate" --prompt-median 512 --output-median 256
  echo
done
echo "== scheduler simulation: Llama-3-70B INT4 on an H200, long-context trace at 0.4/s =="
"$build/edge_bench_scheduler_sim" --requests 1000 --rate 0.4 --prompt-median 4000 --output-median 400
