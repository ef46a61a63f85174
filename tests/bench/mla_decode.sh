#!/usr/bin/env bash
# The latent attention benchmark of docs/performance.md: CPU decode tokens/s of synthetic Kimi K2
# layers (kimi-k2 --layers 4: one dense layer and three MoE layers at their real shapes, 64 of
# the 384 routed experts each, see below) with INT4 experts in groups of 32 and bf16 attention
# (Kimi K2's INT4 release), at 1, 8, 16, 32 and 64 concurrent sequences from position 1024, over
# a bf16 and an FP8 latent cache side by side in one run (the published table's layout); then the
# 64 streams of the engine on a KV budget that FP8 holds and bf16 does not (edge_bench_kv_admission
# on deepseek-v3-tiny).
#
#   tests/bench/mla_decode.sh [BUILD_DIR] [LAYERS] [EXPERTS]   (defaults: build/, 4 layers, 64 experts)
#
# Why 64 experts: the whole preset at 4 layers is over 100 GB in bf16, which no CI-sized machine
# holds; each expert keeps its real shape and a token still reads 8 of them per layer, so batch-1
# decode reads what the real model's does. Batches read fewer distinct experts than with 384
# (at batch 64 all 64 of them, against about 290 of 384), so the large-batch rates are higher than
# the real model's would be on the same machine. The model (about 22 GB in bf16) is written once to
# $BUILD_DIR/bench-models/.
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
layers=${2:-4}
experts=${3:-64}
kimi="$build/bench-models/kimi-k2-l$layers-e$experts"
if [[ ! -f "$kimi/config.json" ]]; then
  mkdir -p "$(dirname "$kimi")"
  "$build/edgeinfer" make-model --preset kimi-k2 --layers "$layers" --experts "$experts" --dtype bf16 --seed 1 --out "$kimi"
fi

echo "== kimi-k2, $layers layers, $experts experts: INT4 experts (g32), bf16 attention; bf16 / FP8 latent cache =="
"$build/edge_bench_decode" --model "$kimi" --weight-dtype int4 --int4-group-size 32 --quantize-layers experts \
  --kv-cache-dtype bf16,fp8 --batches 1,8,16,32,64 --context 1024 --tokens 4 --repeat 3

echo
echo "== 64 streams on a KV budget FP8 holds and bf16 does not (deepseek-v3-tiny) =="
tiny="$build/bench-models/deepseek-v3-tiny"
[[ -f "$tiny/config.json" ]] || "$build/edgeinfer" make-model --preset deepseek-v3-tiny --seed 1 --out "$tiny"
"$build/edge_bench_kv_admission" --model "$tiny"
