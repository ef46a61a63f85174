#!/usr/bin/env bash
# The gateway benchmark of docs/performance.md ("Gateway"):
#   1. requests/s on GET /v1/models (API key checked) next to nginx serving the same bytes from
#      a file, both with the same number of worker threads, measured by wrk with the same
#      connections, in alternating rounds; the median of each and their ratio;
#   2. what the gateway adds to a streamed request over calling the engine in-process
#      (edge_bench_gateway_overhead: p50/p99 of time to first token and of the whole request);
#   3. memory per open idle stream: the server's resident memory before and after opening
#      2,000 streamed requests that wait in the engine's queue (one long request holds the only
#      running slot of a synthetic 0.5B model), divided by the number of streams.
#
#   tests/bench/gateway.sh [BUILD_DIR]      (default build/; `make bench-gateway` runs it)
#
# Knobs: EDGE_BENCH_ROUNDS (3), EDGE_BENCH_DURATION (5s per wrk run), EDGE_BENCH_CONNECTIONS
# (64), EDGE_BENCH_THREADS (2: server threads of both servers and wrk's threads),
# EDGE_BENCH_STREAMS (2000), EDGE_BENCH_PARTS ("models overhead streams").
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
bin="$build/edgeinfer"
fixtures=${EDGE_TEST_MODELS:-../shared/models}
model="$fixtures/stories260K/stories260K.gguf"
rounds=${EDGE_BENCH_ROUNDS:-3}
duration=${EDGE_BENCH_DURATION:-5s}
connections=${EDGE_BENCH_CONNECTIONS:-64}
threads=${EDGE_BENCH_THREADS:-2}
streams=${EDGE_BENCH_STREAMS:-2000}
parts=${EDGE_BENCH_PARTS:-models overhead streams}
out="$build/bench-gateway"
mkdir -p "$out"
for tool in wrk nginx node curl; do
  command -v "$tool" >/dev/null || { echo "gateway.sh: $tool is missing (deploy/install-deps.sh installs it)" >&2; exit 1; }
done

pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  pids=()
}
trap cleanup EXIT

free_port() { node -e 'const s=require("net").createServer().listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})'; }

source tests/bench/serve_lib.sh
# Starts serve (see serve_lib.sh) with a state folder of its own, or ends the benchmark.
start_serve_or_exit() {
  local log=$1; shift
  start_serve "$log" "$out/state-$(basename "$log" .log)" "$@" || { echo "serve did not start; see $log" >&2; exit 1; }
  pids+=("$server_pid")
}

median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
rss_kib() { awk '/^VmRSS:/ { print $2 }' "/proc/$1/status"; }

if [[ " $parts " == *" models "* ]]; then
  echo "== GET /v1/models: edgeinfer serve vs nginx, wrk -t$threads -c$connections -d$duration, $rounds rounds"
  start_serve_or_exit "$out/models-serve.log" --model "$model" --http-threads "$threads" --no-access-log
  curl -sf -H "Authorization: Bearer $key" "http://127.0.0.1:$port/v1/models" >"$out/models.json"
  nginx_port=$(free_port)
  mkdir -p "$out/nginx"
  cat >"$out/nginx/nginx.conf" <<EOF
worker_processes $threads;
pid $PWD/$out/nginx/nginx.pid;
error_log $PWD/$out/nginx/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  keepalive_requests 1000000;
  server {
    listen 127.0.0.1:$nginx_port;
    location = /v1/models { default_type application/json; alias $PWD/$out/models.json; }
  }
}
EOF
  nginx -p "$PWD/$out/nginx" -c "$PWD/$out/nginx/nginx.conf" -e "$PWD/$out/nginx/error.log" -g 'daemon off;' &
  pids+=($!)
  for _ in $(seq 1 100); do curl -sf -o /dev/null "http://127.0.0.1:$nginx_port/v1/models" && break; sleep 0.1; done
  cmp -s "$out/models.json" <(curl -sf "http://127.0.0.1:$nginx_port/v1/models") || { echo "nginx serves other bytes" >&2; exit 1; }
  : >"$out/models-edge.txt"; : >"$out/models-nginx.txt"
  rps() { wrk -t"$threads" -c"$connections" -d"$duration" "$@" | awk '/^Requests\/sec:/ { print $2 }'; }
  for round in $(seq 1 "$rounds"); do
    edge=$(rps -H "Authorization: Bearer $key" "http://127.0.0.1:$port/v1/models")
    ngx=$(rps "http://127.0.0.1:$nginx_port/v1/models")
    echo "$edge" >>"$out/models-edge.txt"; echo "$ngx" >>"$out/models-nginx.txt"
    echo "round $round: edgeinfer $edge req/s, nginx $ngx req/s"
  done
  edge=$(median <"$out/models-edge.txt"); ngx=$(median <"$out/models-nginx.txt")
  echo "median: edgeinfer $edge req/s, nginx $ngx req/s, ratio edgeinfer/nginx $(awk -v a="$edge" -v b="$ngx" 'BEGIN { printf "%.2f", a / b }')"
  echo "($(wc -c <"$out/models.json") bytes per answer)"
  cleanup
fi

if [[ " $parts " == *" overhead "* ]]; then
  echo "== streamed request: gateway vs the engine in-process (stories260K, 32 prompt + 16 completion tokens)"
  for round in $(seq 1 "$rounds"); do
    echo "-- run $round"
    "$build/edge_bench_gateway_overhead" "$model" --requests 500 --max-tokens 16 --prompt-tokens 32 | tail -n 4
  done
fi

if [[ " $parts " == *" streams "* ]]; then
  echo "== memory per open idle stream: $streams streams waiting behind one long request"
  big="$build/bench-models/qwen2.5-0.5b-bf16.gguf"
  if [[ ! -f "$big" ]]; then
    mkdir -p "$(dirname "$big")"
    "$bin" make-model --preset qwen2.5-0.5b --format gguf --dtype bf16 --seed 1 --out "$big" >&2
  fi
  start_serve_or_exit "$out/streams-serve.log" --model "$big" --threads 1 --max-num-seqs 1 \
    --max-queued-requests $((streams + 16)) --kv-cache-memory 256MiB --no-access-log
  served=$(curl -sf -H "Authorization: Bearer $key" "http://127.0.0.1:$port/v1/models" | sed -n 's/.*"id":"\([^"]*\)".*/\1/p')
  # The long request: it holds the only running slot for minutes.
  curl -sN -o /dev/null -H "Authorization: Bearer $key" -H 'content-type: application/json' \
    -d "{\"model\":\"$served\",\"prompt\":\"Once\",\"max_tokens\":4000,\"ignore_eos\":true,\"stream\":true}" \
    "http://127.0.0.1:$port/v1/completions" &
  pids+=($!)
  sleep 3
  # Warm the path once (first allocations of the server's connection machinery).
  sleep 2 | node tests/bench/idle_streams.mjs "http://127.0.0.1:$port" "$key" "$served" 50 >/dev/null
  sleep 1
  before=$(rss_kib "$server_pid")
  fifo="$out/streams.fifo"; rm -f "$fifo"; mkfifo "$fifo"
  node tests/bench/idle_streams.mjs "http://127.0.0.1:$port" "$key" "$served" "$streams" <"$fifo" >"$out/streams-client.txt" &
  client=$!
  exec 3>"$fifo"
  for _ in $(seq 1 1200); do grep -q . "$out/streams-client.txt" && break; sleep 0.1; done
  result=$(cat "$out/streams-client.txt")
  sleep 1
  after=$(rss_kib "$server_pid")
  waiting=$(curl -s "http://127.0.0.1:$port/metrics" | awk '/^edgeinfer_num_requests_waiting/ { print $2 }')
  exec 3>&-
  wait "$client" || true
  echo "client: $result; engine waiting: $waiting"
  echo "server RSS: $before KiB before, $after KiB with $streams streams open:" \
    "$(awk -v a="$after" -v b="$before" -v n="$streams" 'BEGIN { printf "%.1f KiB", (a - b) / n }') per stream"
  cleanup
fi
