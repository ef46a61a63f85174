#!/usr/bin/env bash
# The serving benchmark of docs/benchmarks.md: `edgeinfer serve` on the CPU measured by
# `edgeinfer bench` at 1, 8, 16, 32 and 64 concurrent requests, for stories260K (the real
# fixture) and the synthetic `tiny` Llama (make-model), with INT4 vs FP8 vs BF16 weights (FP8 KV cache) and
# an FP8 vs BF16 KV cache (INT4 weights). Each configuration runs several times, the runs of all
# configurations taking turns so that the machine's drift hits them alike, each on a freshly
# started server; each point draws its own prompts, so every figure is of a cold prefix cache.
# One more configuration per model sends every point the first point's prompts
# (`--reuse-prompts`), to show what a warm cache changes. Then docs/benchmarks.md is written
# from the JSON results with `edgeinfer bench --compare` (medians and ranges of the runs).
#
#   tests/bench/serving.sh [BUILD_DIR]      (default build/; `make bench` runs it)
#
# Results go to $BUILD_DIR/bench-serving/ (JSON and CSV per run, one HTML report per model). A
# configuration the server refuses to start is skipped and named in the document. Knobs:
# EDGE_BENCH_CONCURRENCY (1,8,16,32,64), EDGE_BENCH_DURATION (5s per point), EDGE_BENCH_RUNS (3
# per configuration), EDGE_BENCH_REPORT_ONLY=1 (rewrite the document from the JSON already in
# $out, measure nothing), EDGE_BENCH_MODELS (stories260K tiny; any make-model preset works, but
# a 0.5B model on 2 cores is too slow for c=64 in this time budget), EDGE_BENCH_DOC
# (docs/benchmarks.md).
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
bin="$build/edgeinfer"
fixtures=${EDGE_TEST_MODELS:-../shared/models}
out="$build/bench-serving"
concurrency=${EDGE_BENCH_CONCURRENCY:-1,8,16,32,64}
duration=${EDGE_BENCH_DURATION:-5s}
runs=${EDGE_BENCH_RUNS:-3}
models=(${EDGE_BENCH_MODELS:-stories260K tiny})
doc=${EDGE_BENCH_DOC:-docs/benchmarks.md}
# weight dtype, KV cache dtype, prompts: the weights axis at FP8 KV, the KV axis at INT4 weights,
# and INT4 / FP8 KV again with every point sending the first point's prompts.
configs=("int4 fp8 fresh" "fp8 fp8 fresh" "bf16 fp8 fresh" "int4 bf16 fresh" "int4 fp8 reused")
mkdir -p "$out"

model_path() {
  case "$1" in
    stories260K) echo "$fixtures/stories260K/stories260K.gguf" ;;
    *)
      local path="$build/bench-models/$1-bf16.gguf"
      if [[ ! -f "$path" ]]; then
        mkdir -p "$(dirname "$path")"
        "$bin" make-model --preset "$1" --format gguf --dtype bf16 --seed 1 --out "$path" >&2
      fi
      echo "$path" ;;
  esac
}

# Per model: input and output lengths (words / tokens) of the random dataset, and the
# per-request timeout (well above the slowest request at c=64 on 2 cores).
lengths() {
  case "$1" in
    stories260K|tiny|tiny-qwen2) echo "64 64 20s" ;;
    *) echo "32 16 300s" ;;
  esac
}

source tests/bench/serve_lib.sh
trap stop_serve EXIT

# The configuration's name in file names, and its label in the tables.
config_name() { if [[ "$3" == reused ]]; then echo "w$1-kv$2-reused"; else echo "w$1-kv$2"; fi; }
config_label() { if [[ "$3" == reused ]]; then echo "$1 W / $2 KV, reused prompts"; else echo "$1 W / $2 KV"; fi; }
# The result files of a configuration's runs, joined by '+' (what --compare takes as one configuration).
runs_of() {  # model weights kv prompts
  local files=() name
  name="$1-$(config_name "$2" "$3" "$4")"
  for f in "$out/$name"-r[0-9]*.json; do [[ -f "$f" ]] && files+=("$f"); done
  (IFS=+; echo "${files[*]}")
}

skipped=()
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
if [[ -z "${EDGE_BENCH_REPORT_ONLY:-}" ]]; then
  rm -f "$out"/*-r[0-9]*.json "$out"/*-r[0-9]*.csv
  for model in "${models[@]}"; do model_path "$model" >/dev/null; done
fi
for run in $(seq 1 "$runs"); do
  [[ -n "${EDGE_BENCH_REPORT_ONLY:-}" ]] && break
  for model in "${models[@]}"; do
    path=$(model_path "$model")
    read -r input_len output_len timeout <<<"$(lengths "$model")"
    for config in "${configs[@]}"; do
      read -r weights kv prompts <<<"$config"
      name="$model-$(config_name "$weights" "$kv" "$prompts")-r$run"
      echo "== run $run of $runs, $model: $weights weights, $kv KV cache, $prompts prompts ==" >&2
      if ! start_serve "$out/$name.serve.log" "$out/$name.state" --no-access-log --model "$path" \
           --served-model-name "$model" --weight-dtype "$weights" --kv-cache-dtype "$kv"; then
        reason=$(grep -m1 -E 'error|cannot' "$out/$name.serve.log" | sed 's/^.*error *//' || true)
        echo "skipped: the server did not start: $reason" >&2
        skipped+=("$model, $weights weights, $kv KV cache, run $run: ${reason:-the server did not start}")
        continue
      fi
      reuse=()
      [[ "$prompts" == reused ]] && reuse=(--reuse-prompts)
      "$bin" bench --base-url "http://127.0.0.1:$port" --api-key "$key" --model "$model" \
        --label "$(config_label "$weights" "$kv" "$prompts")" "${reuse[@]}" \
        --concurrency "$concurrency" --duration "$duration" --warmup-requests 8 --seed "$run" --timeout "$timeout" \
        --input-len "$input_len" --output-len "$output_len" \
        --output-json "$out/$name.json" --output-csv "$out/$name.csv" --log-level warn ||
        skipped+=("$model, $weights weights, $kv KV cache, run $run: some point completed no request (see $out/$name.json)")
      stop_serve
    done
  done
done

# ---- docs/benchmarks.md -------------------------------------------------------------------
compare() {  # metric configurations (each: files joined by '+')...
  local metric=$1; shift
  local present=()
  for f in "$@"; do [[ -n "$f" ]] && present+=("$f"); done
  if [[ ${#present[@]} -lt 1 ]]; then echo "(no results)"; return; fi
  "$bin" bench --compare "${present[@]}" --compare-metric "$metric"
}

cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n1)
{
  echo "# Serving benchmarks (CPU)"
  echo
  echo "Written by \`make bench\` (\`tests/bench/serving.sh\`) from the JSON results in \`$out/\`;"
  echo "do not edit by hand. \`edgeinfer serve\` on the CPU executor (access log off, API key on),"
  echo "measured over HTTP by \`edgeinfer bench\` on the same machine (they share its cores)."
  echo
  echo "* Machine: $(nproc) cores of ${cpu:-an unknown CPU}, $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo);"
  echo "  edgeinfer $("$bin" --version | sed 's/^edgeinfer //'), $(date -u +%Y-%m-%d)."
  if [[ -z "${EDGE_BENCH_REPORT_ONLY:-}" ]]; then
    echo "* Machine load average (1, 5, 15 min) when the sweep began: $load_before; when it ended:"
    echo "  $(cut -d' ' -f1-3 /proc/loadavg). Other work on the machine lowers every figure."
  fi
  echo "* Load: closed loop at each concurrency for $duration per point after 8 warm-up requests;"
  echo "  random prompts of common words, drawn for each point (seed: the run's number), so no point"
  echo "  finds an earlier point's prompts in the server's prefix cache; \`ignore_eos\` so every"
  echo "  request generates \`max_tokens\`; temperature 0; streaming with usage. A request still"
  echo "  running after its timeout fails as a timeout and is counted (see \"Failed requests\""
  echo "  below), not waited for."
  echo "* $runs runs of every configuration, each on a freshly started server, the configurations"
  echo "  taking turns run by run; each cell is the median of the runs with their range. The"
  echo "  machine is shared: read differences inside the ranges as noise."
  echo "* \"reused prompts\" runs INT4 W / FP8 KV again with every point sending the first point's"
  echo "  prompts (\`--reuse-prompts\`, how this sweep ran before the points drew their own), so"
  echo "  its later points measure a warm prefix cache: the last section of each model compares the"
  echo "  two. Values marked * come from such points (over 5% of the prompt tokens served from the"
  echo "  cache, by \`usage.prompt_tokens_details.cached_tokens\`)."
  failed=$(cat "$out"/*-r[0-9]*.json 2>/dev/null | grep -o '"failed":[0-9]*' | awk -F: '{s += $2} END {print s + 0}')
  if [[ "$failed" -gt 0 ]]; then
    echo "* **$failed requests failed** over the sweep (table at the end). A point's duration runs"
    echo "  until its last request ended, so a request that ran into its timeout stretches it and"
    echo "  lowers that point's throughput; the latency percentiles cover completed requests only."
  fi
  echo "* Metrics as vLLM's \`bench serve\`: TTFT, TPOT (excluding the first token) in ms;"
  echo "  throughput over the point's duration. The last column of each table is the first"
  echo "  configuration against the second, in percent."
  for model in "${models[@]}"; do
    read -r input_len output_len timeout <<<"$(lengths "$model")"
    f() { runs_of "$model" "$1" "$2" "${3:-fresh}"; }
    echo
    echo "## $model"
    echo
    echo "Prompts of $input_len words, $output_len output tokens, timeout $timeout per request."
    echo
    echo "### Weights: INT4 vs FP8 vs BF16 (FP8 KV cache)"
    for metric in output_throughput tpot_median_ms ttft_median_ms; do
      echo
      compare "$metric" "$(f int4 fp8)" "$(f fp8 fp8)" "$(f bf16 fp8)"
    done
    echo
    echo "### KV cache: FP8 vs BF16 (INT4 weights)"
    for metric in output_throughput tpot_median_ms ttft_median_ms; do
      echo
      compare "$metric" "$(f int4 fp8)" "$(f int4 bf16)"
    done
    echo
    echo "### Prompts drawn per point vs reused (INT4 W / FP8 KV)"
    for metric in cached_prompt_share output_throughput tpot_median_ms ttft_median_ms; do
      echo
      compare "$metric" "$(f int4 fp8)" "$(f int4 fp8 reused)"
    done
  done
  echo
  echo "## Failed requests"
  echo
  echo "Requests that failed (by cause) per configuration and concurrency; a failed request is"
  echo "left out of the latencies and throughputs above."
  for model in "${models[@]}"; do
    for config in "${configs[@]}"; do
      read -r weights kv prompts <<<"$config"
      files=$(runs_of "$model" "$weights" "$kv" "$prompts")
      [[ -n "$files" ]] || continue
      echo
      compare failed "$files" | sed "s/^Failed requests/$model, $weights weights, $kv KV cache, $prompts prompts/"
    done
  done
  if [[ ${#skipped[@]} -gt 0 ]]; then
    echo
    echo "## Not measured"
    echo
    for s in "${skipped[@]}"; do echo "* $s"; done
  fi
  echo
  echo "Charts: \`$out/<model>.html\` (throughput and latency percentiles against concurrency)."
} >"$doc"

for model in "${models[@]}"; do
  files=()
  for config in "${configs[@]}"; do
    read -r weights kv prompts <<<"$config"
    group=$(runs_of "$model" "$weights" "$kv" "$prompts")
    [[ -n "$group" ]] && files+=("$group")
  done
  if [[ ${#files[@]} -gt 0 ]]; then
    "$bin" bench --compare "${files[@]}" --compare-metric output_throughput --html "$out/$model.html" >/dev/null
  fi
done
echo "wrote $doc and $out/*.html" >&2
