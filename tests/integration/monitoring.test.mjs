// The shipped monitoring files against the real tools: a real Prometheus scrapes a running
// `edgeinfer serve` with monitoring/prometheus/prometheus.yml (only the target and intervals
// changed) and loads the alert rules; every metric the Grafana dashboard and the alert rules
// use exists on /metrics after traffic (no dead panels). /metrics is protected as deployed:
// the server reads its metrics token from the file the shipped config's credentials_file names,
// a scrape job without it fails with 401, and a split backend's /metrics wants its token too.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { freePort, startServer, sleep, fetch } from './lib/server.mjs';

const root = process.cwd();
const promDir = path.join(root, 'monitoring', 'prometheus');
const dashboardFile = path.join(root, 'monitoring', 'grafana', 'dashboards', 'edgeinfer.json');

let server;
let prometheus;
let promUrl;
let workDir;

async function completion(body) {
  const res = await fetch(`${server.url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ prompt: 'Once upon a time', max_tokens: 8, temperature: 0, ...body }),
  });
  await res.text();
  return res.status;
}

const adminToken = 'monitoring-test-admin-token';
const metricsToken = 'monitoring-test-metrics-token';
const withToken = { headers: { authorization: `Bearer ${metricsToken}` } };
let limitedKey;

// A tenant allowed one request a minute, so that a quota rejection shows in the metrics, with
// daily and monthly budgets, so that their shares do.
async function makeLimitedTenant() {
  const admin = { authorization: `Bearer ${adminToken}`, 'content-type': 'application/json' };
  const created = await globalThis.fetch(`${server.url}/admin/v1/tenants`, {
    method: 'POST', headers: admin,
    body: JSON.stringify({ id: 'limited', quotas: { requests_per_minute: 1, daily_tokens: 1000000, monthly_tokens: 10000000 } }),
  });
  assert.equal(created.status, 201, await created.text());
  const key = await globalThis.fetch(`${server.url}/admin/v1/tenants/limited/keys`, { method: 'POST', headers: admin, body: '{}' });
  assert.equal(key.status, 201);
  limitedKey = (await key.json()).key;
}

// Traffic that touches every family: streamed and whole completions, a request the engine
// refuses, a quota rejection, unknown routes.
async function sendTraffic() {
  assert.equal(await completion({}), 200);
  assert.equal(await completion({ stream: true }), 200);
  // The same long prompt twice: its full KV blocks come from the prefix cache the second time.
  const story = 'Once upon a time there was a little girl named Lily. She loved to play outside in the park with her friends every day.';
  assert.equal(await completion({ prompt: story }), 200);
  assert.equal(await completion({ prompt: story }), 200);
  assert.equal(await completion({ max_tokens: -1 }), 400);
  const limited = async () => {
    const res = await fetch(`${server.url}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: `Bearer ${limitedKey}` },
      body: JSON.stringify({ prompt: 'Once upon a time', max_tokens: 2 }),
    });
    await res.text();
    return res.status;
  };
  await limited();
  assert.equal(await limited(), 429);
  await (await fetch(`${server.url}/no/such/route`)).text();
}

before(async () => {
  workDir = fs.mkdtempSync(path.join(os.tmpdir(), 'edge_prometheus_'));
  const shipped = fs.readFileSync(path.join(promDir, 'prometheus.yml'), 'utf8');
  assert.match(shipped, /127\.0\.0\.1:8080/);
  // The token file beside the config, which Prometheus reads (credentials_file) and the server too.
  const tokenFile = shipped.match(/credentials_file: (\S+)/)[1];
  fs.writeFileSync(path.join(workDir, tokenFile), `${metricsToken}\n`);
  server = await startServer(['--threads', '2', '--kv-cache-memory', '64MiB', '--admin-token', adminToken,
    '--metrics-token-file', path.join(workDir, tokenFile)]);
  await makeLimitedTenant();
  // The shipped job, and the same job without the token.
  const config = shipped
    .replaceAll('127.0.0.1:8080', `127.0.0.1:${server.port}`)
    .replace(/scrape_interval: \d+s/g, 'scrape_interval: 1s')
    .replace(/evaluation_interval: \d+s/g, 'evaluation_interval: 1s') + `
  - job_name: edgeinfer_without_token
    metrics_path: /metrics
    scrape_interval: 1s
    static_configs:
      - targets: ["127.0.0.1:${server.port}"]
`;
  fs.writeFileSync(path.join(workDir, 'prometheus.yml'), config);
  fs.copyFileSync(path.join(promDir, 'alerts.yml'), path.join(workDir, 'alerts.yml'));
  const port = await freePort();
  promUrl = `http://127.0.0.1:${port}`;
  prometheus = spawn('prometheus', [
    `--config.file=${path.join(workDir, 'prometheus.yml')}`,
    `--storage.tsdb.path=${path.join(workDir, 'data')}`,
    `--web.listen-address=127.0.0.1:${port}`,
  ], { stdio: ['ignore', 'ignore', 'pipe'] });
  let log = '';
  prometheus.stderr.on('data', (d) => { log += d; });
  const deadline = Date.now() + 30000;
  for (;;) {
    try {
      const res = await fetch(`${promUrl}/-/ready`);
      await res.text();
      if (res.ok) break;
    } catch { /* starting */ }
    if (prometheus.exitCode !== null || Date.now() > deadline) {
      throw new Error(`prometheus did not start:\n${log}`);
    }
    await sleep(100);
  }
});

after(async () => {
  if (prometheus && prometheus.exitCode === null) {
    prometheus.kill('SIGTERM');
    await new Promise((r) => prometheus.on('exit', r));
  }
  await server?.stop();
  if (workDir) fs.rmSync(workDir, { recursive: true, force: true });
});

async function query(expr) {
  const res = await fetch(`${promUrl}/api/v1/query?query=${encodeURIComponent(expr)}`);
  const body = await res.json();
  assert.equal(body.status, 'success', JSON.stringify(body));
  return body.data.result;
}

// Polls until `expr` has a sample satisfying `ok`, or fails after `ms`.
async function eventually(expr, ok, ms = 20000) {
  const deadline = Date.now() + ms;
  let last = [];
  while (Date.now() < deadline) {
    last = await query(expr);
    if (last.length > 0 && last.some((s) => ok(Number(s.value[1]), s.metric))) return last;
    await sleep(250);
  }
  assert.fail(`${expr} never satisfied the check; last result ${JSON.stringify(last)}`);
}

test('Prometheus scrapes the engine and gateway series with the shipped config', async () => {
  await sendTraffic();
  await eventually('up{job="edgeinfer"}', (v) => v === 1);
  await eventually('edgeinfer_generation_tokens_total', (v) => v >= 24);
  await eventually('edgeinfer_kv_cache_capacity_tokens', (v) => v > 0);
  await eventually('edgeinfer_cache_config_info', (v, m) => v === 1 && m.kv_dtype !== undefined);
  await eventually('sum(edgeinfer_request_success_total{finished_reason="length"})', (v) => v >= 3);
  await eventually('edgeinfer_http_requests_total{route="/v1/completions",code="200"}', (v) => v >= 3);
  await eventually('edgeinfer_time_to_first_token_seconds_count', (v) => v >= 3);
  await eventually('edgeinfer_prefix_cache_hits_total', (v) => v > 0);
});

test('Prometheus loads every shipped alert rule and none fires on a healthy server', async () => {
  const res = await fetch(`${promUrl}/api/v1/rules`);
  const body = await res.json();
  const rules = body.data.groups.flatMap((g) => g.rules);
  const names = rules.map((r) => r.name).sort();
  const shipped = [...fs.readFileSync(path.join(promDir, 'alerts.yml'), 'utf8').matchAll(/- alert: (\w+)/g)]
    .map((m) => m[1]).sort();
  assert.deepEqual(names, shipped);
  for (const rule of rules) {
    assert.equal(rule.health, 'ok', `${rule.name}: ${rule.lastError ?? ''}`);
  }
  await eventually('up{job="edgeinfer"}', (v) => v === 1);
  const firing = await query('ALERTS{alertstate="firing"}');
  assert.deepEqual(firing, []);
});

// Every edgeinfer_* name in the dashboard's queries and the alert expressions.
function usedMetricNames() {
  const dashboard = JSON.parse(fs.readFileSync(dashboardFile, 'utf8'));
  const exprs = [];
  const walk = (panels) => {
    for (const p of panels ?? []) {
      for (const t of p.targets ?? []) exprs.push(t.expr);
      walk(p.panels);
    }
  };
  walk(dashboard.panels);
  for (const v of dashboard.templating?.list ?? []) {
    if (typeof v.definition === 'string') exprs.push(v.definition);
  }
  const alerts = fs.readFileSync(path.join(promDir, 'alerts.yml'), 'utf8');
  for (const m of alerts.matchAll(/expr: (\|[^\n]*\n(?:\s{10,}[^\n]*\n)*|[^\n]*)/g)) exprs.push(m[1]);
  const names = new Set();
  for (const e of exprs) for (const m of e.matchAll(/\bedgeinfer_[a-z0-9_]+/g)) names.add(m[0]);
  return [...names].sort();
}

test('every metric the dashboard and the alerts use exists on /metrics after traffic', async () => {
  await sendTraffic();
  await sleep(1500);  // the budget shares follow a change of the tenants at the ledger's next flush (1 s)
  const text = await (await fetch(`${server.url}/metrics`, withToken)).text();
  const present = new Set();
  for (const line of text.split('\n')) {
    const m = line.match(/^(edgeinfer_[a-z0-9_]+)[{ ]/);
    if (m) present.add(m[1]);
  }
  const used = usedMetricNames();
  assert.ok(used.length >= 20, `only ${used.length} metric names found in the dashboard and alerts`);
  const missing = used.filter((name) => !present.has(name));
  assert.deepEqual(missing, [], `used by the dashboard or alerts but absent from /metrics: ${missing.join(', ')}`);
});

test('/metrics answers only with the metrics token: Prometheus scrapes with it, and gets 401 without', async () => {
  const bare = await fetch(`${server.url}/metrics`);
  assert.equal(bare.status, 401);
  assert.equal(bare.headers.get('www-authenticate'), 'Bearer');
  assert.equal((await bare.json()).error.code, 'invalid_metrics_token');
  const wrong = await fetch(`${server.url}/metrics`, { headers: { authorization: `Bearer ${metricsToken}x` } });
  assert.equal(wrong.status, 401);
  await wrong.text();
  const good = await fetch(`${server.url}/metrics`, withToken);
  assert.equal(good.status, 200);
  assert.match(await good.text(), /edgeinfer_tenant_requests_total\{/);
  // Probes stay open.
  assert.equal((await fetch(`${server.url}/readyz`)).status, 200);

  await eventually('up{job="edgeinfer"}', (v) => v === 1);
  await eventually('up{job="edgeinfer_without_token"}', (v) => v === 0);
  const targets = await (await fetch(`${promUrl}/api/v1/targets`)).json();
  const refused = targets.data.activeTargets.find((t) => t.labels.job === 'edgeinfer_without_token');
  assert.match(refused.lastError, /401/);
});

test('a split backend\'s own /metrics wants its token too', async () => {
  const backend = await startServer(['--threads', '1', '--kv-cache-memory', '16MiB', '--internal-token',
    'internal-token-0123456789', '--metrics-token', metricsToken], { command: 'backend' });
  try {
    assert.match(backend.log, /\/metrics: for scrapers with the metrics token/);
    const bare = await fetch(`${backend.url}/metrics`);
    assert.equal(bare.status, 401);
    await bare.text();
    const good = await fetch(`${backend.url}/metrics`, withToken);
    assert.equal(good.status, 200);
    assert.match(await good.text(), /edgeinfer_kv_cache_capacity_tokens/);
  } finally {
    await backend.stop();
  }
});
