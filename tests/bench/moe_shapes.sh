#!/usr/bin/env bash
# Mixture-of-Experts models at their real per-layer shapes, end to end: synthetic
# qwen3-30b-a3b and glm-4.5-air cut to LAYERS layers, written in bf16 and in FP8 with 128x128
# block scales, the FP8 one quantized to INT4 compressed-tensors (groups of 32, the published
# FP8 -> INT4 step, sizes printed), and each of the three served with a streamed chat through
# the gateway. Prints, per model and format, the start-up log's model line, the first streamed
# chunk's latency and the decode rate; exits non-zero on any failure.
#
#   tests/bench/moe_shapes.sh [BUILD_DIR] [LAYERS] [WORK_DIR]   (defaults: build/, 2, build/bench-models/)
#
# Disk: about 20 GB at 2 layers (GLM-4.5-Air's 2 layers are 7 GB in bf16).
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
layers=${2:-2}
work=${3:-$build/bench-models}
bin=$build/edgeinfer
source tests/bench/serve_lib.sh
trap stop_serve EXIT
mkdir -p "$work"

chat() {
  curl -sN --max-time 600 "http://127.0.0.1:$port/v1/chat/completions" -H "Authorization: Bearer $key" \
    -H 'content-type: application/json' \
    -d "{\"model\":\"$1\",\"stream\":true,\"max_tokens\":16,\"temperature\":0,\"stream_options\":{\"include_usage\":true},\"messages\":[{\"role\":\"user\",\"content\":\"Write a haiku about the sea.\"}]}"
}

for preset in qwen3-30b-a3b glm-4.5-air; do
  base=$work/$preset-l$layers
  [[ -f $base-bf16/config.json ]] || "$bin" make-model --preset "$preset" --layers "$layers" --seed 1 --out "$base-bf16"
  [[ -f $base-fp8/config.json ]] || "$bin" make-model --preset "$preset" --layers "$layers" --seed 1 --dtype fp8-block \
    --out "$base-fp8"
  if [[ ! -f $base-int4/config.json ]]; then
    rm -rf "$base-int4"
    "$bin" quantize --model "$base-fp8" --weight-dtype int4 --int4-group-size 32 --out "$base-int4" 2>&1 | grep 'wrote'
  fi
  echo "files: bf16 $(du -sh "$base-bf16" | cut -f1), fp8-block $(du -sh "$base-fp8" | cut -f1), int4 $(du -sh "$base-int4" | cut -f1)"
  for format in bf16 fp8 int4; do
    model=$base-$format
    name=$(basename "$model")
    log=$work/$name.serve.log
    if ! start_serve "$log" "$work/$name.state" --model "$model" --kv-cache-memory 256MiB; then
      echo "$name: the server did not start:"; tail -5 "$log"; exit 1
    fi
    start=$(date +%s.%N)
    out=$(chat "$name")
    end=$(date +%s.%N)
    stop_serve
    if ! grep -q '^data: \[DONE\]' <<<"$out"; then echo "$name: no [DONE]:"; tail -c 600 <<<"$out"; exit 1; fi
    tokens=$(grep -o '"completion_tokens":[0-9]*' <<<"$out" | tail -1 | cut -d: -f2)
    echo "$name: $(grep -o 'loaded: .*' "$log" | head -1)"
    echo "$name: streamed $tokens tokens in $(printf '%.1f' "$(echo "$end - $start" | bc)") s (prompt included)"
  done
done
