#!/usr/bin/env bash
# GGUF deepseek2 (DeepSeek-V3 / Kimi K2) in edgeinfer next to llama.cpp, on files make-model writes.
#
#   tests/bench/deepseek2_peer.sh [BUILD_DIR] [check|speed] [ROUNDS]     (defaults: build/, check, 5)
#
# check (ctest integration.deepseek2_peer): deepseek-v3-tiny-gguf as an F32 GGUF (3 layers, the
#   first dense, 8 experts + 1 shared, YaRN with a softmax factor), llama.cpp with an F32 KV cache
#   (its default f16 cache adds noise enough to flip near-tied experts):
#   * greedy text: `llama-cli -n 32 --temp 0 -no-cnv` against `edgeinfer generate --temperature 0
#     --max-tokens 32`, for a few prompts, compared as UTF-8 with each invalid byte sequence
#     replaced (edgeinfer writes U+FFFD where a token ends mid-character, llama-cli the raw bytes);
#   * log-probabilities: llama.cpp's binaries print no logits, but `llama-perplexity
#     --kl-divergence-base` saves its log-softmax (16 bits per value) over chunks of a text, which
#     peer_logits.py compares with edgeinfer's own (edge_reference_logits) on the same tokens.
#   Exit 0 when both agree, 1 when not, 77 (skipped) where llama.cpp cannot run.
# speed: batch-1 decode tokens/s of deepseek-v3-small (4 layers at a 16B-A3B model's widths:
#   4.5 GB in bf16, and llama.cpp's Q4_0 of it, 1.3 GB) in both, `llama-bench -p 0 -n 64 -t 2`
#   against `edge_bench_decode --batches 1 --tokens 64 --threads 2`, taking turns for ROUNDS
#   rounds; prints each round, the medians and ranges, and edgeinfer's ratio. Run it on an
#   otherwise idle machine: llama.cpp's threads spin at their barriers and lose several times
#   more than edgeinfer's to another process's load. Each engine keeps its default 16-bit KV cache (llama.cpp
#   f16, edgeinfer bf16). The models are written once to BUILD_DIR/bench-models/.
#
# llama.cpp is the prebuilt peer in ${EDGE_PEERS:-../shared/peers}/llama.cpp (commit c392e5094;
# CPU binaries that need AVX-512). numpy comes from Debian's python3-numpy (/usr/bin/python3).
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
mode=${2:-check}
rounds=${3:-5}
edgeinfer=${EDGEINFER_BIN:-$build/edgeinfer}
reference=${EDGE_REFERENCE_LOGITS:-$build/tests/reference/edge_reference_logits}
peer=${EDGE_PEERS:-../shared/peers}/llama.cpp/bin
python=/usr/bin/python3
threads=2
script=deepseek2_peer
# shellcheck source=tests/bench/peer_lib.sh
source tests/bench/peer_lib.sh
require_peer llama-cli llama-perplexity llama-bench llama-quantize

work=$(mktemp -d "${TMPDIR:-/tmp}/deepseek2_peer.XXXXXX")
trap 'rm -rf "$work"' EXIT

check() {
  [[ -x "$reference" ]] || skip_because "no $reference (build edge_reference_logits)"
  "$python" -c "import numpy" 2> /dev/null || skip_because "no numpy for $python (python3-numpy)"
  local model="$work/deepseek-v3-tiny-gguf.gguf"
  "$edgeinfer" make-model --preset deepseek-v3-tiny-gguf --format gguf --dtype f32 --seed 1 --out "$model" \
    --log-level warn
  local failed=0

  echo "== greedy text: llama-cli -n 32 --temp 0 against edgeinfer generate (deepseek-v3-tiny-gguf, F32) =="
  local prompt
  for prompt in "Once upon a time" "Experts of a mixture, chosen per token." \
                "Latent attention keeps one row per token and layer"; do
    "$peer/llama-cli" -m "$model" -p "$prompt" -n 32 --temp 0 -no-cnv -ctk f32 -ctv f32 -t "$threads" \
      > "$work/peer.txt" 2> "$work/peer.log"
    "$edgeinfer" generate --model "$model" --prompt "$prompt" --max-tokens 32 --temperature 0 \
      --kv-cache-dtype f32 --threads "$threads" --log-level warn > "$work/edge.txt" 2> "$work/edge.log"
    local generated
    generated=$(sed -n 's/.*generated: \([0-9]*\) tokens.*/\1/p' "$work/edge.log")
    compare_greedy "$work/peer.txt" "$work/edge.txt" "$prompt" "$generated" || failed=1
  done

  echo "== log-probabilities: llama-perplexity --kl-divergence-base against edgeinfer's forward pass =="
  local n_ctx=128 chunks=2
  "$python" - > "$work/text.txt" <<'EOF'
import random
random.seed(7)
words = ("the quick brown fox jumps over a lazy dog while seven experts route each token through "
         "latent attention and one shared expert adds its own part").split()
print(" ".join(random.choice(words) for _ in range(600)))
EOF
  "$peer/llama-perplexity" -m "$model" -f "$work/text.txt" -c "$n_ctx" -b "$n_ctx" --chunks "$chunks" \
    -ctk f32 -ctv f32 -t "$threads" --kl-divergence-base "$work/peer.logits" > "$work/perplexity.log" 2>&1 ||
    { tail -5 "$work/perplexity.log"; exit 1; }
  # llama-perplexity starts each chunk with BOS when the vocabulary adds one.
  local bos
  bos=$("$edgeinfer" tokenize --model "$model" --text "" --log-level warn | tr -d '[]')
  "$python" tests/bench/peer_logits.py "$reference" "$model" "$work/peer.logits" "${bos:--1}" "$chunks" || failed=1

  if [[ $failed -ne 0 ]]; then
    echo "deepseek2_peer: edgeinfer and llama.cpp DISAGREE"
    return 1
  fi
  echo "deepseek2_peer: edgeinfer and llama.cpp agree"
}

speed() {
  local bench="$build/edge_bench_decode"
  [[ -x "$bench" ]] || skip_because "no $bench (build edge_bench_decode)"
  local bf16="$build/bench-models/deepseek-v3-small-bf16.gguf"
  local q4_0="$build/bench-models/deepseek-v3-small-q4_0.gguf"
  if [[ ! -f "$bf16" ]]; then
    mkdir -p "$(dirname "$bf16")"
    "$edgeinfer" make-model --preset deepseek-v3-small --format gguf --dtype bf16 --seed 1 --out "$bf16"
  fi
  # llama.cpp's own Q4_0 of it, every tensor (edgeinfer repacks Q4_0 into int4 groups of 32).
  [[ -f "$q4_0" ]] || "$peer/llama-quantize" --pure "$bf16" "$q4_0" Q4_0 > /dev/null 2>&1
  echo "== batch-1 decode, deepseek-v3-small (GGUF deepseek2), $threads threads, 64 tokens, $rounds rounds =="
  local r kind model peer_rate edge_rate
  for kind in bf16 q4_0; do
    : > "$work/peer.$kind"
    : > "$work/edge.$kind"
  done
  for ((r = 1; r <= rounds; ++r)); do
    for kind in bf16 q4_0; do
      model=$bf16
      [[ $kind == q4_0 ]] && model=$q4_0
      peer_rate=$("$peer/llama-bench" -m "$model" -p 0 -n 64 -t "$threads" -r 1 -o csv 2> /dev/null |
                  awk -F, 'NR == 1 { for (i = 1; i <= NF; ++i) if ($i == "avg_ts") c = i }
                           NR == 2 { gsub(/"/, "", $c); printf "%.2f\n", $c }')
      edge_rate=$("$bench" --model "$model" --batches 1 --prompt 1 --tokens 64 --repeat 1 --threads "$threads" |
                  sed -n 's/^batch 1: .* \([0-9.]*\) tok\/s$/\1/p')
      echo "  round $r, $kind: llama.cpp $peer_rate tok/s, edgeinfer $edge_rate tok/s"
      echo "$peer_rate" >> "$work/peer.$kind"
      echo "$edge_rate" >> "$work/edge.$kind"
    done
  done
  echo "tok/s, median (range) of $rounds runs:"
  printf "  %-5s %24s %24s %8s\n" weights llama.cpp edgeinfer ratio
  for kind in bf16 q4_0; do
    local p e
    p=$(median_of "$work/peer.$kind")
    e=$(median_of "$work/edge.$kind")
    printf "  %-5s %24s %24s %7.2fx\n" "$kind" "$p ($(range_of "$work/peer.$kind"))" \
      "$e ($(range_of "$work/edge.$kind"))" "$(awk -v e="$e" -v p="$p" 'BEGIN { print e / p }')"
  done
}

case "$mode" in
  check) check ;;
  speed) speed ;;
  *) echo "usage: tests/bench/deepseek2_peer.sh [BUILD_DIR] [check|speed] [ROUNDS]" >&2; exit 2 ;;
esac
