#!/usr/bin/env bash
# Prompt caching at agent scale: `edgeinfer bench --dataset agent` (sessions whose every turn
# resends the whole conversation so far plus a new user message) through `edgeinfer gateway` in
# front of two `edgeinfer backend`s, on a synthetic model with a long context, in three
# configurations, each on fresh backends:
#   a  affinity + host tier  each request names its session (x-session-affinity); each backend
#                            has a host-memory KV tier (--kv-host-cache-memory) for the blocks
#                            its KV cache evicts
#   b  affinity only         the header, no host tier
#   c  neither               no header (the gateway routes by prefix affinity and load), no tier
# The KV cache of the two backends together (--kv-cache-memory) holds KV_SHARE (a quarter) of the
# sessions' working set: every session's whole conversation at its last turn, in tokens, from the
# tokens per word and KV bytes per token that a calibration request measures on this model. Each
# host tier holds the whole working set. Prints the prompt-token cache hit ratio (cached_tokens /
# prompt_tokens) and TTFT p50/p99 per configuration, and TTFT p50 of c over a. Measures; asserts
# nothing.
#
#   tests/bench/agent_cache.sh [BUILD_DIR [RESULTS_DIR]]     (`make bench-agent-cache` runs it)
#
# RESULTS_DIR (default: a new temporary folder) gets each run's JSON, an HTML report per
# configuration, agent-cache.html (the three side by side: hit ratio and TTFT by turn) and the
# servers' logs. Knobs (environment): SESSIONS (50), TURNS (20), TURN_LEN_MIN (300) and
# TURN_LEN_MAX (1500) words per turn, SYSTEM_LEN (1000: words of each session's system prompt and
# tools), OUTPUT_LEN (16 tokens per answer), CONCURRENCY (SESSIONS / 8: requests in flight,
# whose whole conversations then take about a quarter of the KV cache), KV_SHARE (0.25), RUNS (1:
# runs per configuration, alternating), CONFIGS ("a b c": which to run), PRESET (tiny: the
# make-model preset), ENDPOINT (chat, or completions), SEED (1). The full scale takes hours on 2
# cores; docs/performance.md's figures (about 11 minutes with RUNS=2): SESSIONS=16 TURNS=10
# TURN_LEN_MIN=30 TURN_LEN_MAX=150 SYSTEM_LEN=200; a quick look: SESSIONS=4 TURNS=3
# TURN_LEN_MIN=50 TURN_LEN_MAX=100 SYSTEM_LEN=100.
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
bin="$build/edgeinfer"
results=${2:-$(mktemp -d "${TMPDIR:-/tmp}/edge-agent-cache.XXXXXX")}
sessions=${SESSIONS:-50}
turns=${TURNS:-20}
turn_min=${TURN_LEN_MIN:-300}
turn_max=${TURN_LEN_MAX:-1500}
system_len=${SYSTEM_LEN:-1000}
output_len=${OUTPUT_LEN:-16}
concurrency=${CONCURRENCY:-$((sessions / 8 > 0 ? sessions / 8 : 1))}
kv_share=${KV_SHARE:-0.25}
runs=${RUNS:-1}
preset=${PRESET:-tiny}
endpoint=${ENDPOINT:-chat}
seed=${SEED:-1}
configs=(${CONFIGS:-a b c})
mkdir -p "$results"
results=$(cd "$results" && pwd)
source tests/bench/serve_lib.sh
cleanup() { stop_split; stop_serve; }
trap cleanup EXIT
# The internal API's token, read by every backend and gateway started here.
EDGE_INTERNAL_TOKEN=$(od -An -N24 -tx1 /dev/urandom | tr -d ' \n')
export EDGE_INTERNAL_TOKEN

# The model: the preset with a context long enough for a session's last turn at four tokens per
# word (the synthetic vocabulary needs fewer; the calibration below checks), kept between runs.
longest_words=$((system_len + turns * turn_max))
context=4096
while ((context < 4 * longest_words + turns * output_len + 256)); do context=$((context * 2)); done
model="$build/bench-agent-cache/models/$preset-ctx$context"
if [[ ! -f "$model/config.json" ]]; then
  mkdir -p "$(dirname "$model")"
  "$bin" make-model --preset "$preset" --context-length "$context" --seed 1 --out "$model" --log-level warn >&2
fi
served=agent-model

# Calibration on `edgeinfer serve`: one request of a 500-word system prompt and a one-word turn
# gives the prompt tokens per word (the template adds a few), the log the KV bytes per token.
calibration_words=500
calibration_kv=$((64 << 20))
start_serve "$results/calibration.log" "$results/calibration-state" --model "$model" --served-model-name "$served" \
  --threads 1 --kv-cache-memory "$calibration_kv" ||
  { echo "edgeinfer serve did not start; see $results/calibration.log" >&2; exit 1; }
"$bin" bench --base-url "http://127.0.0.1:$port" --api-key "$key" --model "$served" --endpoint "$endpoint" \
  --dataset agent --sessions 1 --turns 1 --system-prompt-len "$((calibration_words - 1))" --turn-len-min 1 \
  --turn-len-max 1 --output-len 1 --warmup-requests 0 --output-json "$results/calibration.json" \
  --log-level warn >/dev/null
stop_serve
prompt_tokens=$(jq '.points[0].total_input_tokens' "$results/calibration.json")
kv_tokens=$(sed -n 's/.*KV cache: .* = \([0-9]*\) tokens.*/\1/p' "$results/calibration.log" | head -n1)
read -r tokens_per_word kv_bytes_per_token <<<"$(awk -v p="$prompt_tokens" -v w="$calibration_words" \
  -v m="$calibration_kv" -v t="$kv_tokens" 'BEGIN { printf "%.4f %.1f\n", p / w, m / t }')"

# The working set: every session's conversation at its last turn (the mean turn length).
read -r session_tokens longest_tokens working_set kv_each host_each <<<"$(awk -v s="$sessions" -v t="$turns" \
  -v lo="$turn_min" -v hi="$turn_max" -v sys="$system_len" -v out="$output_len" -v tpw="$tokens_per_word" \
  -v bpt="$kv_bytes_per_token" -v share="$kv_share" 'BEGIN {
    session = (sys + t * (lo + hi) / 2) * tpw + t * out
    longest = (sys + t * hi) * tpw + t * out
    ws = s * session
    kv = share * ws * bpt / 2
    # A backend must hold its longest request whole (a longer one is refused), with room to spare.
    if (kv < 1.25 * longest * bpt) kv = 1.25 * longest * bpt
    printf "%d %d %d %d %d\n", session, longest, ws, kv, ws * bpt
  }')"
if ((longest_tokens >= context)); then
  echo "a session's last turn (about $longest_tokens tokens) does not fit the model's context of $context" >&2
  exit 1
fi
kv_share_real=$(awk -v kv="$kv_each" -v ws="$working_set" -v bpt="$kv_bytes_per_token" \
  'BEGIN { printf "%.0f", 100 * 2 * kv / (ws * bpt) }')

# One run of configuration $1 (a, b or c), run number $2: fresh backends and gateway.
run_config() {
  local config=$1 run=$2 label affinity tier=()
  case "$config" in
    a) label="affinity + host tier"; affinity=--session-affinity; tier=(--kv-host-cache-memory "$host_each") ;;
    b) label="affinity only"; affinity=--session-affinity ;;
    c) label="neither"; affinity=--no-session-affinity ;;
  esac
  local name="$config-r$run" urls=() backends=()
  for i in 1 2; do
    start_split backend "$results/$name.backend$i.log" --model "$model" --served-model-name "$served" --threads 1 \
      --http-threads 1 --kv-cache-memory "$kv_each" "${tier[@]}"
    urls+=(--backend "http://127.0.0.1:$port")
    backends+=("http://127.0.0.1:$port")
  done
  local state
  state=$(mktemp -d)
  start_split gateway "$results/$name.gateway.log" --model "$model" --state-dir "$state" --http-threads 1 \
    "${urls[@]}"
  local gateway="http://127.0.0.1:$port"
  wait_backends_up "$gateway" 2
  local api_key
  api_key=$(sed -n 's/.*with API key \(ek-[0-9a-f]*\.[A-Za-z0-9_-]*\).*/\1/p' "$results/$name.gateway.log" | head -n1)
  local started=$SECONDS
  "$bin" bench --base-url "$gateway" --api-key "$api_key" --model "$served" --endpoint "$endpoint" \
    --label "$label" --dataset agent --sessions "$sessions" --turns "$turns" --system-prompt-len "$system_len" \
    --turn-len-min "$turn_min" --turn-len-max "$turn_max" --output-len "$output_len" \
    "$affinity" --concurrency "$concurrency" --seed "$seed" --timeout 30m \
    --output-json "$results/$name.json" --html "$results/$name.html" --log-level warn >"$results/$name.txt"
  # What the servers counted (prefix cache hits, preemptions, routes), for a closer look.
  curl -s "$gateway/metrics" >"$results/$name.gateway.metrics" || true
  for i in 1 2; do curl -s "${backends[$((i - 1))]}/metrics" >"$results/$name.backend$i.metrics" || true; done
  stop_split
  rm -rf "$state"
  echo "  $label, run $run: $((SECONDS - started)) s" >&2
}

cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n1)
echo "Prompt caching at agent scale: $(nproc) cores of ${cpu:-an unknown CPU}; load average at the start:"
echo "$(cut -d' ' -f1-3 /proc/loadavg). Synthetic $preset model (context $context), two backends (--threads 1)"
echo "behind the split gateway; endpoint $endpoint."
echo "Workload: $sessions sessions x $turns turns, system prompt $system_len words, turns of $turn_min-$turn_max"
echo "words, answers of $output_len tokens, $concurrency requests in flight, seed $seed."
echo "Measured: $tokens_per_word prompt tokens per word, $kv_bytes_per_token KV bytes per token."
echo "Working set: about $working_set tokens ($session_tokens per session at its last turn)."
echo "Per backend: KV cache $kv_each bytes (both together: about $kv_share_real% of the working set);"
echo "host tier (configuration a) $host_each bytes. Results: $results"
echo
for run in $(seq 1 "$runs"); do
  for config in "${configs[@]}"; do run_config "$config" "$run"; done
done

# The table: median (and range) over the runs of each configuration.
stat_of() {  # config, jq expression -> "median" or "median (lo-hi)"
  local values
  values=$(for run in $(seq 1 "$runs"); do jq "$2" "$results/$1-r$run.json"; done | sort -g)
  awk '{ v[NR] = $1 } END {
    m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
    if (NR > 1) printf "%.1f (%.1f-%.1f)", m, v[1], v[NR]; else printf "%.1f", m
  }' <<<"$values"
}
median_of() { stat_of "$1" "$2" | cut -d' ' -f1; }
printf '| %-22s | %-16s | %-24s | %-24s | %-6s |\n' "configuration" "hit ratio %" "TTFT p50 ms" "TTFT p99 ms" \
  "failed"
printf '|%s|%s|%s|%s|%s|\n' "------------------------" "------------------" "--------------------------" \
  "--------------------------" "--------"
for config in "${configs[@]}"; do
  label=$(jq -r '.label' "$results/$config-r1.json")
  failed=$(for run in $(seq 1 "$runs"); do jq '.points[0].failed' "$results/$config-r$run.json"; done |
    awk '{ n += $1 } END { print n }')
  printf '| %-22s | %-16s | %-24s | %-24s | %-6s |\n' "$label" \
    "$(stat_of "$config" '.points[0].prompt_cache.share * 100')" "$(stat_of "$config" '.points[0].ttft_ms.median')" \
    "$(stat_of "$config" '.points[0].ttft_ms.p99')" "$failed"
done
echo
have() { [[ " ${configs[*]} " == *" $1 "* ]]; }
if have a && have c; then
  echo "TTFT p50, neither / affinity + host tier: $(awk -v c="$(median_of c '.points[0].ttft_ms.median')" \
    -v a="$(median_of a '.points[0].ttft_ms.median')" 'BEGIN { printf "%.2fx", c / a }')"
fi
joined() { local files=(); for run in $(seq 1 "$runs"); do files+=("$results/$1-r$run.json"); done; (IFS=+; echo "${files[*]}"); }
compared=()
for config in "${configs[@]}"; do compared+=("$(joined "$config")"); done
"$bin" bench --compare "${compared[@]}" --compare-metric cached_prompt_share,ttft_median_ms,ttft_p99_ms \
  --html "$results/agent-cache.html" >"$results/compare.md"
echo "Reports: $results/agent-cache.html (the configurations side by side), $results/compare.md, a-r1.html, ..."
