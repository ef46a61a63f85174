#!/usr/bin/env bash
# The serving benchmark of docs/benchmarks.md: `edgeinfer serve` on the CPU measured by
# `edgeinfer bench` at 1, 8, 16, 32 and 64 concurrent requests, for stories260K (the real
# fixture) and the synthetic `tiny` Llama (make-model), with INT4 vs FP8 vs BF16 weights (FP8 KV cache) and
# an FP8 vs BF16 KV cache (INT4 weights). Then docs/benchmarks.md is written from the JSON
# results with `edgeinfer bench --compare`.
#
#   tests/bench/serving.sh [BUILD_DIR]      (default build/; `make bench` runs it)
#
# Results go to $BUILD_DIR/bench-serving/ (JSON, CSV, one HTML report per model). A
# configuration the server refuses to start is skipped and named in the document. Knobs:
# EDGE_BENCH_CONCURRENCY (1,8,16,32,64), EDGE_BENCH_DURATION (5s per point),
# EDGE_BENCH_REPORT_ONLY=1 (rewrite the document from the JSON already in $out, measure nothing),
# EDGE_BENCH_MODELS (stories260K tiny; any make-model preset works, but a 0.5B model on 2
# cores is too slow for c=64 in this time budget), EDGE_BENCH_DOC (docs/benchmarks.md).
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
bin="$build/edgeinfer"
fixtures=${EDGE_TEST_MODELS:-../shared/models}
out="$build/bench-serving"
concurrency=${EDGE_BENCH_CONCURRENCY:-1,8,16,32,64}
duration=${EDGE_BENCH_DURATION:-5s}
models=(${EDGE_BENCH_MODELS:-stories260K tiny})
doc=${EDGE_BENCH_DOC:-docs/benchmarks.md}
# weight dtype, KV cache dtype: the weights axis at FP8 KV, the KV axis at INT4 weights.
configs=("int4 fp8" "fp8 fp8" "bf16 fp8" "int4 bf16")
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

skipped=()
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
for model in "${models[@]}"; do
  [[ -n "${EDGE_BENCH_REPORT_ONLY:-}" ]] && break
  path=$(model_path "$model")
  read -r input_len output_len timeout <<<"$(lengths "$model")"
  for config in "${configs[@]}"; do
    read -r weights kv <<<"$config"
    name="$model-w$weights-kv$kv"
    echo "== $model: $weights weights, $kv KV cache ==" >&2
    if ! start_serve "$out/$name.serve.log" "$out/$name.state" --no-access-log --model "$path" \
         --served-model-name "$model" --weight-dtype "$weights" --kv-cache-dtype "$kv"; then
      reason=$(grep -m1 -E 'error|cannot' "$out/$name.serve.log" | sed 's/^.*error *//' || true)
      echo "skipped: the server did not start: $reason" >&2
      skipped+=("$model, $weights weights, $kv KV cache: ${reason:-the server did not start}")
      rm -f "$out/$name.json"
      continue
    fi
    "$bin" bench --base-url "http://127.0.0.1:$port" --api-key "$key" --model "$model" --label "$weights W / $kv KV" \
      --concurrency "$concurrency" --duration "$duration" --warmup-requests 8 --seed 1 --timeout "$timeout" \
      --input-len "$input_len" --output-len "$output_len" \
      --output-json "$out/$name.json" --output-csv "$out/$name.csv" --log-level warn ||
      skipped+=("$model, $weights weights, $kv KV cache: some point completed no request (see $out/$name.json)")
    stop_serve
  done
done

# ---- docs/benchmarks.md -------------------------------------------------------------------
compare() {  # metric files...
  local metric=$1; shift
  local present=()
  for f in "$@"; do [[ -f "$f" ]] && present+=("$f"); done
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
  echo "  random prompts (seed 1) of common words, \`ignore_eos\` so every request generates"
  echo "  \`max_tokens\`; temperature 0; streaming with usage. A request still running after its"
  echo "  timeout fails as a timeout and is counted (see \"Failed requests\" below), not waited for."
  failed=$(cat "$out"/*.json 2>/dev/null | grep -o '"failed":[0-9]*' | awk -F: '{s += $2} END {print s + 0}')
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
    f() { echo "$out/$model-w$1-kv$2.json"; }
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
  done
  echo
  echo "## Failed requests"
  echo
  echo "Requests that failed (by cause) per configuration and concurrency; a failed request is"
  echo "left out of the latencies and throughputs above."
  for model in "${models[@]}"; do
    for config in "${configs[@]}"; do
      read -r weights kv <<<"$config"
      [[ -f "$out/$model-w$weights-kv$kv.json" ]] || continue
      echo
      compare failed "$out/$model-w$weights-kv$kv.json" | sed "s/^Failed requests\$/$model, $weights weights, $kv KV cache/"
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
    read -r weights kv <<<"$config"
    [[ -f "$out/$model-w$weights-kv$kv.json" ]] && files+=("$out/$model-w$weights-kv$kv.json")
  done
  if [[ ${#files[@]} -gt 0 ]]; then
    "$bin" bench --compare "${files[@]}" --compare-metric output_throughput --html "$out/$model.html" >/dev/null
  fi
done
echo "wrote $doc and $out/*.html" >&2
