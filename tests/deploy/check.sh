#!/usr/bin/env bash
# Checks the shipped monitoring and deployment files with the tools that read them:
# promtool (scrape config, alert rules and their unit tests), systemd-analyze (the unit),
# yamllint (compose, Kubernetes, Prometheus, Grafana provisioning), `kubectl kustomize` of each
# Kubernetes topology, a JSON parse of the Grafana dashboard, and a parse of tests/gpu/run.sh.
#
#   tests/deploy/check.sh SOURCE_DIR EDGEINFER_BINARY
set -euo pipefail
src=${1:?source dir}
bin=${2:?edgeinfer binary}
failures=0
step() {
  local what=$1
  shift
  if out=$("$@" 2>&1); then
    echo "ok   $what"
  else
    echo "FAIL $what"
    echo "$out" | sed 's/^/     /'
    failures=$((failures + 1))
  fi
}

# promtool wants the metrics token files the configs name (credentials_file): a made-up token
# beside the host config, and the compose secret's path moved into the scratch folder.
step "promtool check config" bash -c "d=\$(mktemp -d) && trap 'rm -rf \$d' EXIT &&
  cp '$src/monitoring/prometheus/prometheus.yml' '$src/monitoring/prometheus/alerts.yml' \$d/ &&
  echo metrics-token-for-the-check > \$d/edgeinfer_metrics_token && promtool check config \$d/prometheus.yml"
step "promtool check config (compose)" bash -c "d=\$(mktemp -d) && trap 'rm -rf \$d' EXIT &&
  grep -q 'credentials_file: /run/secrets/edgeinfer_metrics_token' '$src/deploy/prometheus-compose.yml' &&
  sed \"s|/run/secrets/edgeinfer_metrics_token|\$d/token|\" '$src/deploy/prometheus-compose.yml' > \$d/prometheus.yml &&
  echo metrics-token-for-the-check > \$d/token && cp '$src/monitoring/prometheus/alerts.yml' \$d/ &&
  promtool check config \$d/prometheus.yml"
step "promtool check rules" promtool check rules "$src/monitoring/prometheus/alerts.yml"
step "promtool test rules" promtool test rules "$src/monitoring/prometheus/alerts_test.yml"

# The unit names /usr/local/bin/edgeinfer, which verify requires to exist: check a copy that
# runs the binary just built.
unit_dir=$(mktemp -d)
trap 'rm -rf "$unit_dir"' EXIT
sed "s|^ExecStart=/usr/local/bin/edgeinfer|ExecStart=$bin|" "$src/deploy/systemd/edgeinfer.service" \
  > "$unit_dir/edgeinfer.service"
step "systemd-analyze verify" bash -c "out=\$(systemd-analyze verify '$unit_dir/edgeinfer.service' 2>&1); rc=\$?;
  echo \"\$out\"; [ \$rc -eq 0 ] && [ -z \"\$out\" ]"

step "yamllint" yamllint -c "$src/.yamllint" --strict \
  "$src/deploy/docker-compose.yml" "$src/deploy/prometheus-compose.yml" "$src/deploy/k8s" \
  "$src/monitoring/prometheus" "$src/monitoring/grafana/provisioning"
# Each topology renders (Debian's kubectl 1.20 and today's read the same files), into documents
# that each name their kind.
for topology in deploy/k8s deploy/k8s/split deploy/k8s/inference-pool; do
  step "kubectl kustomize $topology" bash -c "kubectl kustomize '$src/$topology' 2>/dev/null | python3 -c '
import sys, yaml
docs = [d for d in yaml.safe_load_all(sys.stdin) if d]
bad = [d for d in docs if \"kind\" not in d or \"name\" not in d.get(\"metadata\", {})]
assert docs and not bad, bad
print(len(docs), \"resources\")'"
done
for json in "$src"/monitoring/grafana/dashboards/*.json; do
  step "JSON $(basename "$json")" node -e 'JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"))' "$json"
done

# The GPU window's one command must at least parse here, where it never runs.
step "bash -n tests/gpu/run.sh" bash -n "$src/tests/gpu/run.sh"

if [[ $failures -gt 0 ]]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all checks passed"
