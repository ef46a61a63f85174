#!/usr/bin/env bash
# edgeinfer next to llama.cpp on the same GGUF files of the synthetic Llama 3.2 1B: batch-1
# decode and prefill, 1 / 8 / 16 concurrent streams through each one's server under the same
# client, and greedy text. `make bench-peer` runs it; the results go to docs/performance.md.
#
#   tests/bench/peer.sh [BUILD_DIR] [ROUNDS] [FORMATS]     (defaults: build/, 3, f16,q8_0,q4_0,q4_k_m)
#
# Files, written once to BUILD_DIR/bench-models/peer/ and reused: `edgeinfer make-model --preset
# llama-3.2-1b --format gguf --dtype f16`, and llama-quantize's standard Q8_0, Q4_0 and Q4_K_M of
# it (not --pure: Q4_0 keeps the embedding / output matrix in Q6_K, Q4_K_M mixes Q4_K and Q6_K).
# FORMATS picks the rows; in each llama.cpp runs the row's file and edgeinfer runs:
#   f16      the F16 file
#   q8_0     the Q8_0 file as it loads it, and fp8 quantized on load from the F16 file
#   q4_0     the Q4_0 file, and int4 quantized on load from the F16 file (groups of 128, the default)
#   q4_k_m   the Q4_K_M file
# A file edgeinfer cannot load is reported ("edgeinfer cannot load FILE: ...") and left out; the
# other rows go on.
#
# 1. Batch 1, taking turns for ROUNDS rounds: decode, `llama-bench -p 0 -n 64 -t 2 -r 1` against
#    `edge_bench_decode --batches 1 --prompt 1 --tokens 64 --repeat 1 --threads 2`; prefill,
#    `llama-bench -p 512 -n 0` against `edgeinfer generate` on a 512-token prompt (the prompt
#    tokens/s it logs: edge_bench_decode reports decode only; the prompt is one step of 512 in
#    both). Every round, then medians, ranges and edgeinfer / llama.cpp of the medians; edgeinfer's
#    int4 / fp8 and llama.cpp's Q4_0 / Q8_0.
# 2. Streams, ROUNDS rounds: `llama-server -np 16` against `edgeinfer serve`, each on a free
#    loopback port, under the same `edgeinfer bench` (completions, streamed, random prompts of 64
#    words, 32 tokens with ignore_eos, 4 / 16 / 32 requests at 1 / 8 / 16 in flight; both servers get
#    the same prompts, each point its own): output tokens/s and wall time per point.
# 3. Greedy text of each file: `llama-cli -n 32 --temp 0 -no-cnv` against `edgeinfer generate
#    --temperature 0 --max-tokens 32`, F32 KV cache in both, compared as in deepseek2_peer.sh;
#    differences are reported with their first differing character, not failed; then both
#    engines' log-probabilities over the same tokens of a text (llama-perplexity
#    --kl-divergence-base against edge_reference_logits, by peer_logits.py --report): their KL
#    divergence and, where the most likely token differs, how close the two tokens were.
# It ends with one markdown table of every ratio. 2 threads everywhere; for speed the KV cache is
# f16 in both (llama.cpp's default). llama.cpp's threads spin at their barriers and lose far more
# than edgeinfer's to another process's load: run it on an otherwise idle machine.
#
# Environment: EDGE_PEERS (../shared/peers), EDGE_PEER_PRESET (llama-3.2-1b), EDGE_PEER_LAYERS (0:
# all; 2 writes a 2-layer model for a quick check), EDGEINFER_BIN, EDGE_BENCH_DECODE_BIN.
# Exit 77 (skipped) where llama.cpp's binaries are absent or do not run on this CPU.
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
rounds=${2:-3}
formats=${3:-f16,q8_0,q4_0,q4_k_m}
edgeinfer=${EDGEINFER_BIN:-$build/edgeinfer}
bench_decode=${EDGE_BENCH_DECODE_BIN:-$build/edge_bench_decode}
peer=${EDGE_PEERS:-../shared/peers}/llama.cpp/bin
preset=${EDGE_PEER_PRESET:-llama-3.2-1b}
layers=${EDGE_PEER_LAYERS:-0}
threads=2
decode_tokens=64
prefill_tokens=512
streams=(1 8 16)
requests_per_stream=2  # requests per point: this many per stream in flight, at least min_requests
min_requests=4
input_words=64
output_tokens=32
slots=16          # llama-server's parallel sequences: the most streams measured
slot_context=512  # tokens each slot holds: a prompt of $input_words words and $output_tokens more
greedy_tokens=32
logits_context=128  # tokens per chunk of the log-probability comparison (positions 64..126 compared)
logits_chunks=2
python=/usr/bin/python3
reference_logits=${EDGE_REFERENCE_LOGITS:-$build/tests/reference/edge_reference_logits}
greedy_prompts=("Once upon a time" "The quick brown fox jumps over the lazy dog." \
                "Two engines read the same weights and")
served_name=peer

script=peer
# shellcheck source=tests/bench/peer_lib.sh
source tests/bench/peer_lib.sh
bin=$edgeinfer
# shellcheck source=tests/bench/serve_lib.sh
source tests/bench/serve_lib.sh

usage() {
  echo "usage: tests/bench/peer.sh [BUILD_DIR] [ROUNDS] [FORMATS: f16,q8_0,q4_0,q4_k_m]" >&2
  exit 2
}
[[ $rounds =~ ^[1-9][0-9]*$ ]] || usage
IFS=, read -r -a rows <<< "$formats"
[[ ${#rows[@]} -gt 0 ]] || usage

# Per row: its label, llama.cpp's quantization type, and edgeinfer's configurations. Per
# configuration: the row whose file it reads (f16: quantized on load from the F16 file), the
# weight dtype it loads with, which matrices that applies to (the classifier too for int4 and
# fp8 on load, as llama-quantize's files have it: the tied 128 256 × 2048 classifier is a fifth
# of the weights, read every token, and left in f16 it would cap int4 / fp8 near 1.3×), and its
# label.
declare -A row_label=([f16]="F16" [q8_0]="Q8_0 / fp8" [q4_0]="Q4_0 / int4" [q4_k_m]="Q4_K_M")
declare -A row_type=([q8_0]=Q8_0 [q4_0]=Q4_0 [q4_k_m]=Q4_K_M)
declare -A row_configs=([f16]="f16" [q8_0]="q8_0 fp8" [q4_0]="q4_0 int4" [q4_k_m]="q4_k_m")
declare -A config_file=([f16]=f16 [q8_0]=q8_0 [fp8]=f16 [q4_0]=q4_0 [int4]=f16 [q4_k_m]=q4_k_m)
declare -A config_weights=([f16]=auto [q8_0]=auto [fp8]=fp8 [q4_0]=auto [int4]=int4 [q4_k_m]=auto)
declare -A config_layers=([f16]=all [q8_0]=all [fp8]=all-and-classifier [q4_0]=all [int4]=all-and-classifier
                          [q4_k_m]=all)
declare -A config_label=([f16]="F16 file" [q8_0]="Q8_0 file" [fp8]="fp8 on load" [q4_0]="Q4_0 file"
                         [int4]="int4 on load" [q4_k_m]="Q4_K_M file")
for row in "${rows[@]}"; do
  [[ -n ${row_label[$row]:-} ]] || usage
done

require_peer llama-cli llama-bench llama-server llama-quantize
[[ -x "$edgeinfer" ]] || skip_because "no $edgeinfer (build edgeinfer)"
[[ -x "$bench_decode" ]] || skip_because "no $bench_decode (build edge_bench_decode)"

work=$(mktemp -d "${TMPDIR:-/tmp}/peer.XXXXXX")
llama_pid="" client_pid=""
stop_llama_server() {
  if [[ -n "$llama_pid" ]]; then
    kill -TERM "$llama_pid" 2> /dev/null || true
    wait "$llama_pid" 2> /dev/null || true
    llama_pid=""
  fi
}
cleanup() {
  [[ -n "$client_pid" ]] && kill -TERM "$client_pid" 2> /dev/null
  stop_serve
  stop_llama_server
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ---- the machine, the commit, the files ---------------------------------------------------------

has_flag() { grep -qw "$1" /proc/cpuinfo && echo yes || echo no; }
model_desc=$preset
[[ $layers -gt 0 ]] && model_desc="$preset, first $layers layers"
echo "== edgeinfer next to llama.cpp: synthetic $model_desc =="
echo "commit: $(git rev-parse --short HEAD 2> /dev/null || echo unknown)$(git diff --quiet HEAD 2> /dev/null || echo ' (with changes)'); binary: $("$edgeinfer" --version)"
echo "llama.cpp: $("$peer/llama-cli" --version 2>&1 | sed -n 's/^version: //p')"
echo "CPU: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; avx512_vnni: $(has_flag avx512_vnni), avx512_bf16: $(has_flag avx512_bf16)"
echo "date: $(date -u +%Y-%m-%dT%H:%MZ); load average: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "$threads threads in both; KV cache f16 for speed, f32 for greedy text; rounds: $rounds"

dir="$build/bench-models/peer"
base=$preset
[[ $layers -gt 0 ]] && base="$preset-l$layers"
declare -A file=([f16]="$dir/$base-f16.gguf" [q8_0]="$dir/$base-q8_0.gguf" [q4_0]="$dir/$base-q4_0.gguf"
                 [q4_k_m]="$dir/$base-q4_k_m.gguf")
mkdir -p "$dir"
if [[ ! -f "${file[f16]}" ]]; then
  echo "writing ${file[f16]}"
  "$edgeinfer" make-model --preset "$preset" --layers "$layers" --format gguf --dtype f16 --seed 1 \
    --out "${file[f16]}" --log-level warn
fi
for row in "${rows[@]}"; do
  [[ $row == f16 || -f "${file[$row]}" ]] && continue
  echo "writing ${file[$row]} (llama-quantize ${row_type[$row]})"
  if ! "$peer/llama-quantize" "${file[f16]}" "${file[$row]}.part" "${row_type[$row]}" "$threads" \
       > "$work/quantize.log" 2>&1; then
    tail -5 "$work/quantize.log"
    exit 1
  fi
  mv "${file[$row]}.part" "${file[$row]}"
done
for row in "${rows[@]}"; do
  echo "  ${row_label[$row]}: ${file[$row]} ($(du -h "${file[$row]}" | cut -f1))"
done

# ---- batch 1 -------------------------------------------------------------------------------------

declare -A cannot_load=()  # configuration -> why edgeinfer could not load it
declare -A loaded_as=()    # configuration -> the projections' format as edge_bench_decode loaded them

# llama-bench's tokens/s for one test (-p P -n N), or nothing.
peer_rate() {
  "$peer/llama-bench" -m "$1" -p "$2" -n "$3" -t "$threads" -r 1 -o csv 2> "$work/llama-bench.log" |
    awk -F, 'NR == 1 { for (i = 1; i <= NF; ++i) if ($i == "avg_ts") c = i }
             NR == 2 && c { gsub(/"/, "", $c); printf "%.2f\n", $c }'
}

# Batch-1 decode of configuration $1 (in this shell, not a subshell): appends the rate to
# $work/decode.edge.$1 and sets $decode_rate, or records why it could not load.
edge_decode() {
  local config=$1 path=${file[${config_file[$1]}]} status=0
  "$bench_decode" --model "$path" --weight-dtype "${config_weights[$config]}" \
    --quantize-layers "${config_layers[$config]}" --batches 1 --prompt 1 \
    --tokens "$decode_tokens" --repeat 1 --threads "$threads" --kv-cache-dtype f16 \
    > "$work/decode.out" 2> "$work/decode.err" || status=$?
  decode_rate=$(sed -n 's/^batch 1: .* \([0-9.]*\) tok\/s$/\1/p' "$work/decode.out")
  if [[ $status -ne 0 || -z $decode_rate ]]; then
    local why
    why=$(grep -m1 . "$work/decode.err" || echo "edge_bench_decode exited with status $status")
    cannot_load[$config]=${why#"$path: "}
    return 0
  fi
  loaded_as[$config]=$(sed -n 's/^batch 1: *\([^/ ]*\)\/.*/\1/p' "$work/decode.out")
  echo "$decode_rate" >> "$work/decode.edge.$config"
}

# The prefill prompt: $prefill_tokens tokens with BOS in the F16 file's tokenizer (the same in
# every file), from words, cut at a token boundary and decoded back to text.
words="the quick brown fox jumps over a lazy dog while two engines read the same weights in turns"
text=$(for _ in $(seq 1 200); do printf '%s ' "$words"; done)
ids=$("$edgeinfer" tokenize --model "${file[f16]}" --no-bos --log-level warn --text "$text" | tr -d '[] \n' |
      cut -d, -f"1-$((prefill_tokens - 1))")
prefill_prompt=$(printf '[%s]\n' "$ids" | "$edgeinfer" tokenize --model "${file[f16]}" --decode --log-level warn)

# Prefill tokens/s of configuration $1 from edgeinfer generate's log, or nothing.
edge_prefill() {
  local config=$1
  "$edgeinfer" generate --model "${file[${config_file[$config]}]}" --weight-dtype "${config_weights[$config]}" \
    --quantize-layers "${config_layers[$config]}" \
    --prompt "$prefill_prompt" --max-tokens 1 --ignore-eos --temperature 0 --threads "$threads" \
    --kv-cache-dtype f16 --device cpu --log-level warn > /dev/null 2> "$work/prefill.err" || true
  sed -n 's/^prompt: \([0-9]*\) tokens, \([0-9.]*\) tok\/s;.*/\1 \2/p' "$work/prefill.err"
}

loadable() { [[ -z ${cannot_load[$1]:-} ]]; }

echo
echo "== batch 1: decode (llama-bench -p 0 -n $decode_tokens against edge_bench_decode), prefill" \
     "(llama-bench -p $prefill_tokens -n 0 against edgeinfer generate), tok/s =="
prefill_length=""
for ((r = 1; r <= rounds; ++r)); do
  for row in "${rows[@]}"; do
    read -r -a configs <<< "${row_configs[$row]}"
    rate=$(peer_rate "${file[$row]}" 0 "$decode_tokens") || true
    [[ -n $rate ]] || { echo "llama-bench failed on ${file[$row]}:"; tail -3 "$work/llama-bench.log"; exit 1; }
    echo "$rate" >> "$work/decode.peer.$row"
    line="  round $r, ${row_label[$row]}, decode: llama.cpp $rate; edgeinfer"
    for config in "${configs[@]}"; do
      loadable "$config" || continue
      edge_decode "$config"
      if loadable "$config"; then
        line+=" ${config_label[$config]} (${loaded_as[$config]}) $decode_rate,"
      else
        echo "  edgeinfer cannot load ${file[${config_file[$config]}]} (--weight-dtype ${config_weights[$config]}): ${cannot_load[$config]}"
      fi
    done
    [[ $line == *edgeinfer ]] && line+=" -"
    echo "${line%,}"

    rate=$(peer_rate "${file[$row]}" "$prefill_tokens" 0) || true
    [[ -n $rate ]] || { echo "llama-bench failed on ${file[$row]}:"; tail -3 "$work/llama-bench.log"; exit 1; }
    echo "$rate" >> "$work/prefill.peer.$row"
    line="  round $r, ${row_label[$row]}, prefill: llama.cpp $rate; edgeinfer"
    for config in "${configs[@]}"; do
      loadable "$config" || continue
      read -r length rate <<< "$(edge_prefill "$config")"
      if [[ -z ${rate:-} ]]; then
        line+=" ${config_label[$config]} failed ($(grep -m1 . "$work/prefill.err" || true)),"
        continue
      fi
      prefill_length=$length
      echo "$rate" >> "$work/prefill.edge.$config"
      line+=" ${config_label[$config]} $rate,"
    done
    [[ $line == *edgeinfer ]] && line+=" -"
    echo "${line%,}"
  done
done
[[ -n $prefill_length ]] && echo "  (edgeinfer's prefill prompt: $prefill_length tokens; llama-bench's: $prefill_tokens)"

# ---- streams -------------------------------------------------------------------------------------

streams_of() { if [[ $1 -eq 1 ]]; then echo "1 stream"; else echo "$1 streams"; fi; }

# Starts llama-server on $1 on a free loopback port: sets $llama_pid and $llama_port, or returns 1.
start_llama_server() {
  local model=$1 log=$2
  llama_port=""
  "$peer/llama-server" -m "$model" -np "$slots" -c $((slots * slot_context)) -t "$threads" \
    --host 127.0.0.1 --port 0 > "$log" 2>&1 &
  llama_pid=$!
  for _ in $(seq 1 3000); do
    if ! kill -0 "$llama_pid" 2> /dev/null; then
      wait "$llama_pid" 2> /dev/null || true
      llama_pid=""
      return 1
    fi
    [[ -z "$llama_port" ]] &&
      llama_port=$(sed -n 's/.*server is listening on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$log" | head -n1)
    if [[ -n "$llama_port" ]] &&
       [[ $(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$llama_port/health") == 200 ]]; then
      return 0
    fi
    sleep 0.1
  done
  stop_llama_server
  return 1
}

# One point under edgeinfer bench: BASE_URL API_KEY STREAMS SEED SIDE NAME. Appends tokens/s and
# seconds to $work/serve.SIDE.NAME.cSTREAMS and $work/wall.SIDE.NAME.cSTREAMS and sets $point to
# "TOK/S, S s" and what went wrong, if anything. The client runs in the background so that a
# signal's trap (which stops the servers) runs at once rather than after the point.
bench_point() {
  local url=$1 api_key=$2 n=$3 seed=$4 side=$5 name=$6
  local requests=$((n * requests_per_stream > min_requests ? n * requests_per_stream : min_requests))
  local auth=()
  [[ -n $api_key ]] && auth=(--api-key "$api_key")
  rm -f "$work/point.csv"
  "$edgeinfer" bench --base-url "$url" "${auth[@]}" --model "$served_name" --endpoint completions \
    --concurrency "$n" --num-requests "$requests" --input-len "$input_words" --output-len "$output_tokens" \
    --ignore-eos --temperature 0 --seed "$seed" --output-csv "$work/point.csv" --log-level warn \
    > "$work/point.log" 2>&1 &
  client_pid=$!
  wait "$client_pid" || true
  client_pid=""
  local completed failed seconds tokens rate
  read -r completed failed seconds tokens rate <<< "$(awk -F, '
    NR == 1 { for (i = 1; i <= NF; ++i) c[$i] = i }
    NR == 2 { print $c["completed"], $c["failed"], $c["duration_s"], $c["total_output_tokens"], $c["output_throughput"] }
    ' "$work/point.csv" 2> /dev/null)"
  if [[ -z ${completed:-} || $completed -eq 0 ]]; then
    point="no request completed ($(grep -m1 -i 'requests failed\|error' "$work/point.log" || tail -n1 "$work/point.log"))"
    return 0
  fi
  printf '%.2f\n' "$rate" >> "$work/serve.$side.$name.c$n"
  printf '%.2f\n' "$seconds" >> "$work/wall.$side.$name.c$n"
  local note=""
  [[ $failed -gt 0 ]] &&
    note+=" [$failed of $requests failed: $(sed -n 's/.*requests failed; first: //p' "$work/point.log" | head -n1)]"
  [[ $tokens -lt $((completed * output_tokens)) ]] && note+=" [$tokens of $((completed * output_tokens)) tokens]"
  point=$(printf '%.2f tok/s, %.2f s%s' "$rate" "$seconds" "$note")
}

echo
echo "== streams: llama-server -np $slots against edgeinfer serve under edgeinfer bench" \
     "($input_words-word prompts, $output_tokens tokens), output tok/s and wall time per point =="
for ((r = 1; r <= rounds; ++r)); do
  for row in "${rows[@]}"; do
    read -r -a configs <<< "${row_configs[$row]}"
    if start_llama_server "${file[$row]}" "$work/llama-server.log"; then
      for n in "${streams[@]}"; do
        bench_point "http://127.0.0.1:$llama_port" "" "$n" $((100 * r + n)) peer "$row"
        echo "  round $r, ${row_label[$row]}, $(streams_of "$n"): llama.cpp $point"
      done
      stop_llama_server
    else
      echo "  llama-server did not start on ${file[$row]}: $(tail -n1 "$work/llama-server.log")"
    fi
    for config in "${configs[@]}"; do
      loadable "$config" || continue
      if ! start_serve "$work/serve.log" "$work/state" --model "${file[${config_file[$config]}]}" \
           --served-model-name "$served_name" --weight-dtype "${config_weights[$config]}" \
           --quantize-layers "${config_layers[$config]}" --threads "$threads" \
           --kv-cache-dtype f16 --device cpu --no-access-log; then
        echo "  edgeinfer serve did not start on ${file[${config_file[$config]}]}: $(tail -n1 "$work/serve.log")"
        continue
      fi
      for n in "${streams[@]}"; do
        bench_point "http://127.0.0.1:$port" "$key" "$n" $((100 * r + n)) edge "$config"
        echo "  round $r, ${row_label[$row]}, $(streams_of "$n"): edgeinfer ${config_label[$config]} $point"
      done
      stop_serve
    done
  done
done

# ---- greedy text ---------------------------------------------------------------------------------

# Why greedy texts part: both engines' log-probabilities over the same tokens of a text
# (llama-perplexity --kl-divergence-base against edge_reference_logits, F32 KV cache in both),
# by peer_logits.py --report: their KL divergence, and at each position whose most likely token
# differs, how close the two tokens were. Skipped with a message where a piece is missing.
logits_text=""
logits_report() {
  local model=$1
  if [[ ! -x $reference_logits || ! -x $peer/llama-perplexity ]] || ! "$python" -c "import numpy" 2> /dev/null; then
    echo "    (log-probabilities not compared: needs $reference_logits, $peer/llama-perplexity and numpy for $python)"
    return 0
  fi
  if [[ -z $logits_text ]]; then
    logits_text="$work/logits_text.txt"
    for _ in $(seq 1 40); do printf '%s ' "$words"; done > "$logits_text"
  fi
  if ! "$peer/llama-perplexity" -m "$model" -f "$logits_text" -c "$logits_context" -b "$logits_context"        --chunks "$logits_chunks" -ctk f32 -ctv f32 -t "$threads" --kl-divergence-base "$work/peer.logits"        > "$work/perplexity.log" 2>&1; then
    echo "    (llama-perplexity failed: $(tail -n1 "$work/perplexity.log"))"
    return 0
  fi
  local bos
  bos=$("$edgeinfer" tokenize --model "$model" --text "" --log-level warn | tr -d '[]')
  "$python" tests/bench/peer_logits.py --report "$reference_logits" "$model" "$work/peer.logits" "${bos:--1}"     "$logits_chunks" | sed 's/^/    /'
}

echo
echo "== greedy text: llama-cli -n $greedy_tokens --temp 0 against edgeinfer generate, F32 KV cache =="
declare -A greedy_equal=()
for row in "${rows[@]}"; do
  if ! loadable "$row"; then
    echo "  ${row_label[$row]}: edgeinfer cannot load ${file[$row]}: ${cannot_load[$row]}"
    continue
  fi
  echo "  ${row_label[$row]} (${file[$row]}):"
  equal=0
  for prompt in "${greedy_prompts[@]}"; do
    "$peer/llama-cli" -m "${file[$row]}" -p "$prompt" -n "$greedy_tokens" --temp 0 -no-cnv -ctk f32 -ctv f32 \
      -t "$threads" < /dev/null > "$work/peer.txt" 2> "$work/peer.log" || true
    "$edgeinfer" generate --model "${file[$row]}" --prompt "$prompt" --max-tokens "$greedy_tokens" --temperature 0 \
      --kv-cache-dtype f32 --threads "$threads" --device cpu --log-level warn \
      > "$work/edge.txt" 2> "$work/edge.log" || true
    generated=$(sed -n 's/.*generated: \([0-9]*\) tokens.*/\1/p' "$work/edge.log")
    if compare_greedy "$work/peer.txt" "$work/edge.txt" "$prompt" "${generated:-no}" | sed 's/^/  /'; then
      equal=$((equal + 1))
    fi
  done
  greedy_equal[$row]="$equal of ${#greedy_prompts[@]}"
  logits_report "${file[$row]}"
done

# ---- medians, ranges and ratios ------------------------------------------------------------------

# "MEDIAN (MIN-MAX)" of a results file, or "-" where there is none.
cell() { if [[ -s $1 ]]; then echo "$(median_of "$1") ($(range_of "$1"))"; else echo "-"; fi; }
# The ratio of the medians of two results files, as "1.23×", or "-".
ratio() {
  if [[ -s $1 && -s $2 ]]; then
    awk -v a="$(median_of "$1")" -v b="$(median_of "$2")" 'BEGIN { if (b > 0) printf "%.2f×", a / b; else print "-" }'
  else
    echo "-"
  fi
}
# A configuration's name in the tables: its label and the format its projections loaded as.
config_name() {
  if loadable "$1"; then echo "${config_label[$1]}${loaded_as[$1]:+ (${loaded_as[$1]})}"; else echo "${config_label[$1]}: cannot load"; fi
}

echo
echo "== results: median (range) of the rounds ($rounds) =="
for kind in decode prefill; do
  echo
  echo "Batch-1 $kind, tok/s:"
  echo
  echo "| format | llama.cpp | edgeinfer weights | edgeinfer | edgeinfer / llama.cpp |"
  echo "|---|---|---|---|---|"
  for row in "${rows[@]}"; do
    read -r -a configs <<< "${row_configs[$row]}"
    for config in "${configs[@]}"; do
      echo "| ${row_label[$row]} | $(cell "$work/$kind.peer.$row") | $(config_name "$config")" \
           "| $(cell "$work/$kind.edge.$config") | $(ratio "$work/$kind.edge.$config" "$work/$kind.peer.$row") |"
    done
  done
done
echo
echo "Streams: output tok/s, and wall time per point in s:"
echo
echo "| format | edgeinfer weights | streams | llama.cpp tok/s | edgeinfer tok/s | edgeinfer / llama.cpp | llama.cpp s | edgeinfer s |"
echo "|---|---|---|---|---|---|---|---|"
for row in "${rows[@]}"; do
  read -r -a configs <<< "${row_configs[$row]}"
  for config in "${configs[@]}"; do
    for n in "${streams[@]}"; do
      echo "| ${row_label[$row]} | $(config_name "$config") | $n | $(cell "$work/serve.peer.$row.c$n")" \
           "| $(cell "$work/serve.edge.$config.c$n") | $(ratio "$work/serve.edge.$config.c$n" "$work/serve.peer.$row.c$n")" \
           "| $(cell "$work/wall.peer.$row.c$n") | $(cell "$work/wall.edge.$config.c$n") |"
    done
  done
done

echo
echo "== summary: ratios of the medians ($model_desc, rounds: $rounds; load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)) =="
echo
header="| ratio | batch-1 decode | prefill $prefill_tokens |"
rule="|---|---|---|"
for n in "${streams[@]}"; do
  header+=" $(streams_of "$n") |"
  rule+="---|"
done
echo "$header"
echo "$rule"
# One row: LABEL NUMERATOR-KIND-PREFIX DENOMINATOR-KIND-PREFIX, each PREFIX "SIDE.KEY".
summary_row() {
  local line n
  line="| $1 | $(ratio "$work/decode.$2" "$work/decode.$3") | $(ratio "$work/prefill.$2" "$work/prefill.$3") |"
  for n in "${streams[@]}"; do line+=" $(ratio "$work/serve.$2.c$n" "$work/serve.$3.c$n") |"; done
  echo "$line"
}
for row in "${rows[@]}"; do
  read -r -a configs <<< "${row_configs[$row]}"
  for config in "${configs[@]}"; do
    if loadable "$config"; then
      summary_row "edgeinfer / llama.cpp, ${row_label[$row]}: $(config_name "$config")" "edge.$config" "peer.$row"
    else
      line="| edgeinfer / llama.cpp, ${row_label[$row]}: ${config_label[$config]} | cannot load | - |"
      for _ in "${streams[@]}"; do line+=" - |"; done
      echo "$line"
    fi
  done
done
has_row() { [[ ",$formats," == *",$1,"* ]]; }
if has_row q8_0 && has_row q4_0; then
  loadable int4 && loadable fp8 && summary_row "edgeinfer int4 / fp8 (both on load from F16)" edge.int4 edge.fp8
  summary_row "llama.cpp Q4_0 / Q8_0" peer.q4_0 peer.q8_0
fi
if [[ ${#greedy_equal[@]} -gt 0 ]]; then
  echo
  line="Greedy text equal ($greedy_tokens tokens, F32 KV cache):"
  for row in "${rows[@]}"; do
    [[ -n ${greedy_equal[$row]:-} ]] && line+=" ${row_label[$row]} ${greedy_equal[$row]},"
  done
  echo "${line%,}."
fi
