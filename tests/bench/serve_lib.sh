# Starting and stopping `edgeinfer serve` for the benchmark scripts. Source it after setting
# $bin (the edgeinfer binary).
#
# start_serve LOG STATE_DIR [serve arguments...]
#   Starts serve in the background on a free loopback port with a fresh tenant store in
#   STATE_DIR, so that its first start creates the default tenant and logs its API key. Once
#   /readyz answers 200 it sets $port, $key and $server_pid and returns 0; it returns 1 when the
#   server exits first or is not ready within 5 minutes (LOG says why). Call it in the script's
#   own shell, not in a subshell: the variables must stay visible.
# stop_serve
#   Sends SIGTERM to the server started last and waits for it.
# start_split COMMAND LOG [arguments...]
#   Starts `edgeinfer COMMAND` (backend or gateway) in the background on a free loopback port,
#   logging to LOG, and adds it to $split_pids; sets $port once it listens, returns 1 when it does
#   not listen within a minute.
# wait_backends_up URL N
#   Waits until the gateway at URL shows N backends up on its /metrics.
# stop_split
#   Sends SIGTERM to every process start_split started and waits for them.
server_pid="" port="" key=""
split_pids=()

stop_serve() {
  if [[ -n "$server_pid" ]]; then
    kill -TERM "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
    server_pid=""
  fi
}

start_serve() {
  local log=$1 state=$2
  shift 2
  port="" key=""
  rm -rf "$state"
  "$bin" serve --host 127.0.0.1 --port 0 --state-dir "$state" "$@" >/dev/null 2>"$log" &
  server_pid=$!
  for _ in $(seq 1 3000); do
    if ! kill -0 "$server_pid" 2>/dev/null; then
      wait "$server_pid" 2>/dev/null || true
      server_pid=""
      return 1
    fi
    [[ -z "$port" ]] && port=$(sed -n 's/.*listening on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$log" | head -n1)
    if [[ -n "$port" ]] && [[ $(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/readyz") == 200 ]]; then
      key=$(sed -n 's/.*with API key \(ek-[0-9a-f]*\.[A-Za-z0-9_-]*\).*/\1/p' "$log" | head -n1)
      return 0
    fi
    sleep 0.1
  done
  stop_serve
  return 1
}

start_split() {
  local command=$1 log=$2
  shift 2
  "$bin" "$command" --host 127.0.0.1 --port 0 --log-level info --no-access-log "$@" >/dev/null 2>"$log" &
  split_pids+=($!)
  port=""
  for _ in $(seq 1 600); do
    port=$(sed -n 's/.*listening on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$log" | head -n1)
    [[ -n "$port" ]] && return 0
    sleep 0.1
  done
  echo "edgeinfer $command did not start; see $log" >&2
  return 1
}

wait_backends_up() {
  local url=$1 n=$2
  for _ in $(seq 1 600); do
    local up
    up=$(curl -s "$url/metrics" | grep -c '^edgeinfer_backend_up{.*} 1$' || true)
    [[ "$up" -ge "$n" ]] && return 0
    sleep 0.1
  done
  echo "the gateway at $url did not see $n backends up" >&2
  return 1
}

stop_split() {
  local pid
  for pid in "${split_pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${split_pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  split_pids=()
}
