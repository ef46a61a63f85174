#!/usr/bin/env bash
# A campaign of the whole-server fuzzer (edge_server_fuzz): runs of REQUESTS requests each, seed
# after seed, at the lowest priority, until TOTAL requests have run. Each run's output is
# LOG_DIR/seed-S.log (its summary at the end); LOG_DIR/campaign.tsv gets a line per run (seed,
# requests, seconds, requests/s, findings, exit code) and LOG_DIR/findings/ the requests of any
# finding. Runs already in campaign.tsv are skipped, so the same command continues a campaign.
#
#   tests/fuzz/server_campaign.sh BUILD_DIR LOG_DIR [TOTAL] [REQUESTS] [FIRST_SEED] [CONCURRENCY]
#
# e.g. tests/fuzz/server_campaign.sh build-sanitize ../server-campaign 1000000 10000 100
set -uo pipefail

build=${1:?usage: server_campaign.sh BUILD_DIR LOG_DIR [TOTAL] [REQUESTS] [FIRST_SEED] [CONCURRENCY]}
logs=${2:?usage: server_campaign.sh BUILD_DIR LOG_DIR [TOTAL] [REQUESTS] [FIRST_SEED] [CONCURRENCY]}
total=${3:-1000000}
per_run=${4:-10000}
seed=${5:-100}
concurrency=${6:-4}

fuzzer="$build/edge_server_fuzz"
[[ -x "$fuzzer" ]] || { echo "server_campaign: no $fuzzer (build the target edge_server_fuzz)" >&2; exit 2; }
mkdir -p "$logs/findings"
table="$logs/campaign.tsv"
[[ -f "$table" ]] || printf 'seed\trequests\tseconds\trequests_per_s\tfindings\texit\n' >"$table"

done_requests() { awk -F'\t' 'NR > 1 { n += $2 } END { print n + 0 }' "$table"; }

while (( $(done_requests) < total )); do
  if awk -F'\t' -v s="$seed" 'NR > 1 && $1 == s { found = 1 } END { exit !found }' "$table"; then
    seed=$((seed + 1))
    continue
  fi
  log="$logs/seed-$seed.log"
  echo "server_campaign: seed $seed, $per_run requests ($(done_requests) of $total so far) -> $log"
  nice -n 19 "$fuzzer" --seed "$seed" --requests "$per_run" --concurrency "$concurrency" \
    --findings "$logs/findings" --max-findings 20 >"$log" 2>&1
  code=$?
  # "edge_server_fuzz: seed S, requests A..B, N requests in T s (R requests/s), ..."
  summary=$(grep -a '^edge_server_fuzz: seed' "$log" | tail -1)
  requests=$(sed -E 's/.*, ([0-9]+) requests in .*/\1/' <<<"$summary")
  seconds=$(sed -E 's/.* requests in ([0-9.]+) s .*/\1/' <<<"$summary")
  rate=$(sed -E 's/.*\(([0-9.]+) requests\/s\).*/\1/' <<<"$summary")
  findings=$(grep -a '^findings: ' "$log" | tail -1 | sed 's/findings: //')
  # A run that died (a crash) has no summary: what it reached is in its log.
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$seed" "${requests:-0}" "${seconds:-0}" "${rate:-0}" "${findings:-crash}" "$code" >>"$table"
  if (( code != 0 )); then
    echo "server_campaign: seed $seed ended with exit code $code: see $log" >&2
    exit 1
  fi
  seed=$((seed + 1))
done
echo "server_campaign: $(done_requests) requests in all; $table"
