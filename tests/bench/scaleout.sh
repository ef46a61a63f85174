#!/usr/bin/env bash
# Throughput scaling of the split topology: `edgeinfer gateway` in front of one `edgeinfer
# backend`, then of two, measured by `edgeinfer bench` against the gateway (CPU, one compute
# thread per backend, so that two backends can use the machine's two cores). Prints output
# tokens/s per run, the medians, and the ratio two/one per model. Measures; asserts nothing.
#
#   tests/bench/scaleout.sh [BUILD_DIR]      (default build/; `make bench-scaleout` runs it)
#
# Knobs: EDGE_SCALEOUT_MODELS (stories260K qwen2.5-0.5b: the fixture, whose tokens are so cheap
# that the gateway and the client weigh as much as the backends, and a synthetic Qwen2.5-0.5B,
# where each backend's compute dominates; any make-model preset works), EDGE_SCALEOUT_RUNS (3),
# and for every model EDGE_SCALEOUT_CONCURRENCY, EDGE_SCALEOUT_DURATION (per run) and
# EDGE_SCALEOUT_OUTPUT_LEN (defaults per model in load_of: 16, 5s, 64 for small models; 4, 20s,
# 32 for the 0.5B and 1B presets). About 12 minutes on 2 cores with the defaults.
# Results (JSON per run, server logs) go to $BUILD_DIR/bench-scaleout/.
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
bin="$build/edgeinfer"
fixtures=${EDGE_TEST_MODELS:-../shared/models}
out="$build/bench-scaleout"
models=(${EDGE_SCALEOUT_MODELS:-stories260K qwen2.5-0.5b})
runs=${EDGE_SCALEOUT_RUNS:-3}

# Per model: requests in flight, seconds per run and output tokens. A 0.5B model on one core per
# backend decodes tens of tokens/s, so it gets fewer requests in flight and longer runs.
load_of() {
  case "$1" in
    qwen2.5-0.5b|llama-3.2-1b)
      echo "${EDGE_SCALEOUT_CONCURRENCY:-4} ${EDGE_SCALEOUT_DURATION:-20s} ${EDGE_SCALEOUT_OUTPUT_LEN:-32}" ;;
    *) echo "${EDGE_SCALEOUT_CONCURRENCY:-16} ${EDGE_SCALEOUT_DURATION:-5s} ${EDGE_SCALEOUT_OUTPUT_LEN:-64}" ;;
  esac
}
mkdir -p "$out"
# The internal API's token, read by every backend and gateway started here.
EDGE_INTERNAL_TOKEN=$(od -An -N24 -tx1 /dev/urandom | tr -d ' \n')
export EDGE_INTERNAL_TOKEN

model_path() {
  case "$1" in
    stories260K) echo "$fixtures/stories260K/stories260K.gguf" ;;
    *)
      local path="$out/models/$1"
      if [[ ! -d "$path" ]]; then
        mkdir -p "$out/models"
        "$bin" make-model --preset "$1" --seed 1 --out "$path" >&2
      fi
      echo "$path" ;;
  esac
}

source tests/bench/serve_lib.sh
trap stop_split EXIT

# One measurement: $1 backends for model $2 (path $3), run $4. Prints output tokens/s.
measure() {
  local n=$1 model=$2 path=$3 run=$4
  local name="$model-b$n-r$run" urls=()
  for i in $(seq 1 "$n"); do
    start_split backend "$out/$name.backend$i.log" --model "$path" --served-model-name "$model" --threads 1 \
      --http-threads 1 --kv-cache-memory 256MiB
    urls+=(--backend "http://127.0.0.1:$port")
  done
  local state
  state=$(mktemp -d)
  start_split gateway "$out/$name.gateway.log" --model "$path" --state-dir "$state" --http-threads 1 "${urls[@]}"
  local gateway="http://127.0.0.1:$port"
  wait_backends_up "$gateway" "$n"
  local key
  key=$(sed -n 's/.*with API key \(ek-[0-9a-f]*\.[A-Za-z0-9_-]*\).*/\1/p' "$out/$name.gateway.log" | head -n1)
  "$bin" bench --base-url "$gateway" --api-key "$key" --model "$model" --label "$n backends" \
    --concurrency "$concurrency" --duration "$duration" --warmup-requests 8 --seed "$run" --timeout 60s \
    --input-len 64 --output-len "$output_len" --output-json "$out/$name.json" --log-level warn >/dev/null
  stop_split
  rm -rf "$state"
  grep -o '"output_throughput":[0-9.eE+-]*' "$out/$name.json" | head -n1 | cut -d: -f2 | awk '{ printf "%.1f\n", $1 }'
}

median() { sort -g | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
range() { sort -g | awk 'NR == 1 { lo = $1 } { hi = $1 } END { printf "%.0f-%.0f", lo, hi }'; }

cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n1)
echo "Split gateway scaling: $(nproc) cores of ${cpu:-an unknown CPU}; each backend --threads 1;"
echo "edgeinfer bench with 64-word prompts, $runs runs per point (one and two backends alternate,"
echo "so drift hits both alike); load average at the start: $(cut -d' ' -f1-3 /proc/loadavg)."
for model in "${models[@]}"; do
  read -r concurrency duration output_len <<<"$(load_of "$model")"
  echo "$model: concurrency $concurrency, $duration per run, $output_len output tokens"
done
echo
printf '| %-12s | %-26s | %-26s | %-9s |\n' "model" "1 backend tok/s (median, range)" "2 backends tok/s" "ratio 2/1"
printf '|%s|%s|%s|%s|\n' "--------------" "----------------------------" "----------------------------" "-----------"
for model in "${models[@]}"; do
  read -r concurrency duration output_len <<<"$(load_of "$model")"
  path=$(model_path "$model")
  one=()
  two=()
  for run in $(seq 1 "$runs"); do
    one+=("$(measure 1 "$model" "$path" "$run")")
    two+=("$(measure 2 "$model" "$path" "$run")")
    echo "  $model run $run: 1 backend ${one[-1]} tok/s, 2 backends ${two[-1]} tok/s" >&2
  done
  m1=$(printf '%s\n' "${one[@]}" | median)
  m2=$(printf '%s\n' "${two[@]}" | median)
  r1=$(printf '%s\n' "${one[@]}" | range)
  r2=$(printf '%s\n' "${two[@]}" | range)
  ratio=$(awk -v a="$m1" -v b="$m2" 'BEGIN { printf "%.2f", b / a }')
  printf '| %-12s | %-26s | %-26s | %-9s |\n' "$model" "$(printf '%.0f (%s)' "$m1" "$r1")" \
    "$(printf '%.0f (%s)' "$m2" "$r2")" "$ratio"
done
