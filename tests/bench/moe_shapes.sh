#!/usr/bin/env bash
# Mixture-of-Experts and latent-attention models at their real per-layer shapes, end to end:
# each preset cut to LAYERS layers, written in bf16 and in FP8 with 128x128 block scales, the FP8
# one quantized to INT4 compressed-tensors (groups of 32, the published FP8 -> INT4 step, sizes
# printed), and each of the three served with a 16-token streamed chat through the gateway.
# Prints, per model and format, the start-up log's model and KV cache lines and the chat's time
# (prompt included); exits non-zero on any failure.
#
#   tests/bench/moe_shapes.sh [BUILD_DIR] [LAYERS] [WORK_DIR] [PRESET[:EXPERTS] ...]
#       (defaults: build/, 2, build/bench-models/, qwen3-30b-a3b glm-4.5-air)
#
# PRESET:EXPERTS writes only the first EXPERTS routed experts of each sparse layer, each at its
# real shape (`make-model --experts`): `kimi-k2:16` is Kimi K2's layers with 16 of its 384
# experts, whose bf16 files would otherwise not fit a small disk. Each checkpoint is removed once
# it has been served, the FP8 one once its INT4 is written: at these sizes the disk runs out
# first (GLM-4.5-Air's 2 layers are 7 GB in bf16, Kimi K2's with 16 experts 7 GB).
#
#   tests/bench/moe_shapes.sh build 2 build/bench-models kimi-k2:16 glm-5     # the latent-attention models
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
layers=${2:-2}
work=${3:-$build/bench-models}
shift $(( $# < 3 ? $# : 3 ))
specs=("$@")
(( ${#specs[@]} > 0 )) || specs=(qwen3-30b-a3b glm-4.5-air)
bin=$build/edgeinfer
source tests/bench/serve_lib.sh
trap stop_serve EXIT
mkdir -p "$work"

chat() {
  curl -sN --max-time 600 "http://127.0.0.1:$port/v1/chat/completions" -H "Authorization: Bearer $key" \
    -H 'content-type: application/json' \
    -d "{\"model\":\"$1\",\"stream\":true,\"max_tokens\":16,\"temperature\":0,\"stream_options\":{\"include_usage\":true},\"messages\":[{\"role\":\"user\",\"content\":\"Write a haiku about the sea.\"}]}"
}

# Serves one checkpoint, asks it for a streamed chat and prints what its log and the answer say.
serve_and_chat() {
  local model=$1
  local name
  name=$(basename "$model")
  local log=$work/$name.serve.log
  if ! start_serve "$log" "$work/$name.state" --model "$model" --kv-cache-memory 256MiB; then
    echo "$name: the server did not start:"; tail -5 "$log"; exit 1
  fi
  local start end out tokens
  start=$(date +%s.%N)
  out=$(chat "$name")
  end=$(date +%s.%N)
  stop_serve
  rm -rf "$work/$name.state"
  if ! grep -q '^data: \[DONE\]' <<<"$out"; then echo "$name: no [DONE]:"; tail -c 600 <<<"$out"; exit 1; fi
  tokens=$(grep -o '"completion_tokens":[0-9]*' <<<"$out" | tail -1 | cut -d: -f2)
  echo "$name: $(grep -o 'loaded: .*' "$log" | head -1)"
  echo "$name: $(grep -o 'KV cache: .*' "$log" | head -1)"
  echo "$name: streamed $tokens tokens in $(printf '%.1f' "$(echo "$end - $start" | bc)") s (prompt included)"
}

for spec in "${specs[@]}"; do
  preset=${spec%%:*}
  experts=0
  [[ $spec == *:* ]] && experts=${spec#*:}
  base=$work/$preset-l$layers$([[ $experts != 0 ]] && echo "-e$experts" || true)
  make=("$bin" make-model --preset "$preset" --layers "$layers" --experts "$experts" --seed 1 --log-level warn)
  rm -rf "$base-bf16" "$base-fp8" "$base-int4"
  "${make[@]}" --out "$base-bf16"
  bf16_size=$(du -sh "$base-bf16" | cut -f1)
  serve_and_chat "$base-bf16"
  rm -rf "$base-bf16"
  "${make[@]}" --dtype fp8-block --out "$base-fp8"
  fp8_size=$(du -sh "$base-fp8" | cut -f1)
  serve_and_chat "$base-fp8"
  "$bin" quantize --model "$base-fp8" --weight-dtype int4 --int4-group-size 32 --out "$base-int4" 2>&1 | grep 'wrote'
  rm -rf "$base-fp8"
  echo "$spec files: bf16 $bf16_size, fp8-block $fp8_size, int4 $(du -sh "$base-int4" | cut -f1)"
  serve_and_chat "$base-int4"
  rm -rf "$base-int4"
done
