#!/usr/bin/env bash
# The Mixture-of-Experts decode benchmark of docs/performance.md: CPU decode tokens/s of
# synthetic Qwen3-30B-A3B layers (128 experts, top 8) at batch 1, 8, 16, 32 and 64 with bf16,
# fp8 and int4 experts side by side in one run (the published table's layout, int4 against fp8
# per row), the weight bytes each step read (only the experts that ran) as a share of the
# machine's read bandwidth, and then the same layers as one dense MLP of equal size
# (qwen3-30b-a3b-dense), whose every token reads every weight.
#
#   tests/bench/moe_decode.sh [BUILD_DIR] [LAYERS]      (defaults: build/, 4 layers)
#
# The models (about 6.5 GiB each in bf16 at 4 layers) are written once to $BUILD_DIR/bench-models/.
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
layers=${2:-4}
moe="$build/bench-models/qwen3-30b-a3b-l$layers"
dense="$build/bench-models/qwen3-30b-a3b-dense-l$layers"
for pair in "qwen3-30b-a3b:$moe" "qwen3-30b-a3b-dense:$dense"; do
  preset=${pair%%:*}
  out=${pair#*:}
  if [[ ! -f "$out/config.json" ]]; then
    mkdir -p "$(dirname "$out")"
    "$build/edgeinfer" make-model --preset "$preset" --layers "$layers" --dtype bf16 --seed 1 --out "$out"
  fi
done

# Decode from position 32 without a prefill (as decode.sh does for the dense 1B).
echo "== qwen3-30b-a3b, $layers layers: bf16 / fp8 / int4 experts =="
"$build/edge_bench_decode" --model "$moe" --weight-dtype bf16,fp8,int4 --batches 1,8,16,32,64 --context 32 \
  --tokens 4 --repeat 3
echo
echo "== the same layers as one dense MLP of equal size (bf16 / int4) =="
"$build/edge_bench_decode" --model "$dense" --weight-dtype bf16,int4 --batches 1,8 --context 32 --tokens 2 --repeat 3
