#!/usr/bin/env bash
# The quota store benchmark of docs/performance.md ("Quotas in Redis"):
#   * try_admit + try_reserve + finish with the counters in memory and in Redis (p50 / p99);
#   * the latency a whole request gains: non-streamed /v1/chat/completions with max_tokens 1
#     against `serve --quota-store memory` and `serve --quota-store redis://...`, measured in
#     turn on one keep-alive connection each (p50 / p99, medians of several runs).
# Redis is a real redis-server on a free loopback port, without persistence; everything it
# starts is stopped on exit.
#
#   tests/bench/quota.sh [BUILD_DIR]      (default build/; `make bench-quota` runs it)
#
# Knobs: EDGE_BENCH_QUOTA_CALLS (store calls per run, 20000), EDGE_BENCH_QUOTA_REQUESTS
# (HTTP requests per run, 300), EDGE_BENCH_QUOTA_REPEAT (runs, 5).
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
bin="$build/edgeinfer"
calls=${EDGE_BENCH_QUOTA_CALLS:-20000}
requests=${EDGE_BENCH_QUOTA_REQUESTS:-300}
repeat=${EDGE_BENCH_QUOTA_REPEAT:-5}
admin_token="bench-admin-token-0123456789"
work=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

command -v redis-server >/dev/null || { echo "quota.sh: redis-server is not installed (deploy/install-deps.sh)" >&2; exit 1; }

# redis-server on the first free port from a random start.
redis_port=""
for _ in $(seq 1 20); do
  port=$((20000 + RANDOM % 20000))
  redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$work" \
    --logfile "$work/redis-$port.log" &
  pid=$!
  for _ in $(seq 1 100); do
    if [[ $(redis-cli -p "$port" ping 2>/dev/null) == PONG ]]; then redis_port=$port; break; fi
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.05
  done
  if [[ -n "$redis_port" ]]; then pids+=("$pid"); break; fi
  kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true
done
[[ -n "$redis_port" ]] || { echo "quota.sh: redis-server did not start" >&2; exit 1; }
redis_url="redis://127.0.0.1:$redis_port/0"

echo "== quota store calls, in this process =="
"$build/edge_bench_quota" store --redis "$redis_url" --calls "$calls" --repeat "$repeat"
echo

# Starts serve with extra arguments, waits for /readyz, and sets $url and $key: an API key of a
# tenant "bench" with every limit set (and never reached), so each request goes through every
# counter of the store. Not called in a subshell: the server's pid must reach $pids.
url=""
key=""
start_server() {
  local name=$1; shift
  local log="$work/$name.log"
  "$bin" serve --host 127.0.0.1 --port 0 --state-dir "$work/$name-state" --admin-token "$admin_token" \
    --threads 1 --kv-cache-memory 64MiB --no-access-log "$@" >/dev/null 2>"$log" &
  pids+=("$!")
  local port=""
  for _ in $(seq 1 600); do
    [[ -z "$port" ]] && port=$(sed -n 's/.*listening on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$log" | head -n1)
    if [[ -n "$port" ]] && [[ $(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/readyz") == 200 ]]; then
      break
    fi
    sleep 0.1
  done
  [[ -n "$port" ]] || { echo "quota.sh: $name did not start:" >&2; cat "$log" >&2; exit 1; }
  url="http://127.0.0.1:$port"
  local huge=1099511627776
  curl -sf -X POST "$url/admin/v1/tenants" -H "authorization: Bearer $admin_token" -H 'content-type: application/json' \
    -d "{\"id\":\"bench\",\"quotas\":{\"requests_per_minute\":$huge,\"tokens_per_minute\":$huge,\"max_concurrent\":$huge,\"daily_tokens\":$huge,\"max_tokens_per_request\":$huge}}" >/dev/null
  key=$(curl -sf -X POST "$url/admin/v1/tenants/bench/keys" -H "authorization: Bearer $admin_token" \
    -H 'content-type: application/json' -d '{}' | sed -n 's/.*"key":"\([^"]*\)".*/\1/p')
  [[ -n "$key" ]] || { echo "quota.sh: no API key from $name" >&2; exit 1; }
}

start_server memory --quota-store memory
memory_url=$url memory_key=$key
start_server redis --quota-store "$redis_url"
redis_url_http=$url redis_key=$key
echo "== a whole request through the gateway (stories260K, CPU) =="
"$build/edge_bench_quota" http "memory=$memory_url=$memory_key" "redis=$redis_url_http=$redis_key" \
  --calls "$requests" --repeat "$repeat"
