// Three gateways on one PostgreSQL tenant store and one Redis quota store, as a scaled-out
// deployment runs them: a tenant created once is served by all three, a key revoked through one
// is refused by all within a second, the usage every gateway wrote adds up to what the clients
// received, and PostgreSQL killed under load and started again loses no ledger row (the
// gateways keep serving from their snapshots meanwhile); a single server's SQLite store moves
// into PostgreSQL with `edgeinfer admin migrate-store`.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { adminCall, edgeinferBin, makeStateDir, startServer, sleep, waitFor } from './lib/server.mjs';
import { startPostgres } from './lib/postgres.mjs';
import { startRedis } from './lib/redis.mjs';
import { scrape } from './lib/metrics.mjs';

const ADMIN_TOKEN = 'test-admin-token-0123456789';
let pg;
let redis;
let gateways = [];

before(async () => {
  [pg, redis] = await Promise.all([startPostgres(), startRedis()]);
  const store = pg.createDatabase('edgeinfer');
  const common = ['--threads', '1', '--http-threads', '1', '--kv-cache-memory', '16MiB', '--admin-token', ADMIN_TOKEN,
    '--tenant-store', store, '--tenant-store-timeout', '500ms', '--quota-store', `redis://127.0.0.1:${redis.port}/0`];
  // Started together: the schema is made once, the default tenant and its key once.
  gateways = await Promise.all([startServer(common), startServer(common), startServer(common)]);
});

after(async () => {
  await Promise.all(gateways.map((g) => g.stop()));
  await redis?.stop();
  await pg?.stop();
});

async function complete(gateway, key, { maxTokens = 4, prompt = 'Once upon a time' } = {}) {
  const res = await fetch(`${gateway.url}/v1/completions`, {
    method: 'POST',
    headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
    body: JSON.stringify({ prompt, max_tokens: maxTokens, temperature: 0 }),
  });
  return { status: res.status, json: await res.json() };
}

// Polls `check` every 10 ms for up to `limitMs`; resolves with the milliseconds it took, or null.
async function within(limitMs, check) {
  const start = Date.now();
  for (;;) {
    if (await check()) return Date.now() - start;
    if (Date.now() - start > limitMs) return null;
    await sleep(10);
  }
}

// The tenant's usage over the last two hours as the store holds it once every gateway flushed
// its ledger: each usage query flushes the ledger of the gateway asked, so the last answer
// holds all three.
async function usageTotal(tenant) {
  const from = new Date(Date.now() - 2 * 3600 * 1000).toISOString().slice(0, 19) + 'Z';
  let total;
  for (const g of gateways) {
    total = (await adminCall(g, ADMIN_TOKEN, 'GET', `/admin/v1/tenants/${tenant}/usage?from=${from}`)).total;
  }
  return total;
}

test('the default tenant and its key are made once for the three gateways', async () => {
  const keys = gateways.map((g) => g.defaultKey).filter(Boolean);
  assert.equal(keys.length, 1, gateways.map((g) => g.log).join('\n----\n'));
  for (const g of gateways) {
    assert.match(g.log, /tenant store PostgreSQL 127\.0\.0\.1:\d+\/edgeinfer \(schema 3\)/);
    assert.equal((await complete(g, keys[0])).status, 200);
  }
});

test('a tenant created once is served by every gateway; a key revoked on one is refused by all within 1 s', async () => {
  const [a, b, c] = gateways;
  await adminCall(a, ADMIN_TOKEN, 'POST', '/admin/v1/tenants', { id: 'shared', quotas: { requests_per_minute: 100000 } });
  const { key, id } = await adminCall(a, ADMIN_TOKEN, 'POST', '/admin/v1/tenants/shared/keys', {});
  const seen = await within(1000, async () => (await complete(b, key)).status === 200 && (await complete(c, key)).status === 200);
  assert.notEqual(seen, null, 'the new key did not work on the other gateways within 1 s');
  // Every gateway lists it: one store.
  for (const g of gateways) {
    const listed = await adminCall(g, ADMIN_TOKEN, 'GET', '/admin/v1/tenants');
    assert.ok(listed.data.some((t) => t.id === 'shared'));
  }

  await adminCall(b, ADMIN_TOKEN, 'DELETE', `/admin/v1/keys/${id}`);
  const refused = await within(1000, async () => {
    const answers = await Promise.all(gateways.map((g) => complete(g, key)));
    return answers.every((r) => r.status === 401);
  });
  assert.notEqual(refused, null, 'the revoked key still worked on a gateway after 1 s');
  console.log(`key revoked on one gateway: refused by all three after ${refused} ms`);
});

test('the usage all three gateways wrote adds up to what the clients received', async () => {
  await adminCall(gateways[0], ADMIN_TOKEN, 'POST', '/admin/v1/tenants', { id: 'metered' });
  const { key } = await adminCall(gateways[1], ADMIN_TOKEN, 'POST', '/admin/v1/tenants/metered/keys', {});
  await within(1000, async () => (await Promise.all(gateways.map((g) => complete(g, key, { maxTokens: 1 })))).every((r) => r.status === 200));
  const before = await usageTotal('metered');
  const answers = await Promise.all(Array.from({ length: 24 }, (_, i) => complete(gateways[i % 3], key, { maxTokens: 1 + (i % 5) })));
  const received = { requests: 0, prompt_tokens: 0, completion_tokens: 0 };
  for (const r of answers) {
    assert.equal(r.status, 200, JSON.stringify(r.json));
    received.requests += 1;
    received.prompt_tokens += r.json.usage.prompt_tokens;
    received.completion_tokens += r.json.usage.completion_tokens;
  }
  const after = await usageTotal('metered');
  assert.equal(after.requests - before.requests, received.requests);
  assert.equal(after.prompt_tokens - before.prompt_tokens, received.prompt_tokens);
  assert.equal(after.completion_tokens - before.completion_tokens, received.completion_tokens);
});

test('PostgreSQL killed under load: requests keep being served, and no ledger row is lost once it is back', async () => {
  await adminCall(gateways[0], ADMIN_TOKEN, 'POST', '/admin/v1/tenants', { id: 'outage' });
  const { key } = await adminCall(gateways[0], ADMIN_TOKEN, 'POST', '/admin/v1/tenants/outage/keys', {});
  await within(1000, async () => (await Promise.all(gateways.map((g) => complete(g, key, { maxTokens: 1 })))).every((r) => r.status === 200));
  const before = await usageTotal('outage');

  const received = { requests: 0, prompt_tokens: 0, completion_tokens: 0 };
  const latency = { up: [], down: [], after: [] };
  let phase = 'up';
  let running = true;
  const load = (async () => {
    for (let i = 0; running; ++i) {
      const started = performance.now();
      const during = phase;
      const r = await complete(gateways[i % 3], key, { maxTokens: 2 });
      assert.equal(r.status, 200, JSON.stringify(r.json));
      if (during === phase) latency[during].push(performance.now() - started);
      received.requests += 1;
      received.prompt_tokens += r.json.usage.prompt_tokens;
      received.completion_tokens += r.json.usage.completion_tokens;
    }
  })();
  await sleep(1500);
  await pg.stop();
  phase = 'down';
  const servedBefore = received.requests;
  await sleep(3000);  // down for a while: every gateway's ledger flushes fail and keep their batches
  assert.ok(received.requests > servedBefore, 'no request was served while PostgreSQL was down');
  phase = 'after';
  const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
  console.log(`requests with PostgreSQL up: ${latency.up.length}, median ${median(latency.up).toFixed(1)} ms; ` +
    `while it was down (3 s): ${latency.down.length}, median ${median(latency.down).toFixed(1)} ms, ` +
    `slowest ${Math.max(...latency.down).toFixed(1)} ms`);
  // The outage shows in /metrics.
  const down = await scrape(gateways[1]);
  assert.match(down, /^edgeinfer_tenant_store_up 0$/m);
  await pg.start();
  await sleep(500);
  running = false;
  await load;

  // Each gateway's ledger reaches the store again (the usage query flushes it) with what it kept.
  for (const g of gateways) {
    await waitFor('the ledger to flush again', async () => {
      const res = await fetch(`${g.url}/admin/v1/tenants/outage/usage`, { headers: { authorization: `Bearer ${ADMIN_TOKEN}` } });
      await res.arrayBuffer();
      return res.status === 200;
    }, { timeoutMs: 10000 });
  }
  const after = await usageTotal('outage');
  assert.equal(after.requests - before.requests, received.requests);
  assert.equal(after.prompt_tokens - before.prompt_tokens, received.prompt_tokens);
  assert.equal(after.completion_tokens - before.completion_tokens, received.completion_tokens);
  const up = await scrape(gateways[1]);
  assert.match(up, /^edgeinfer_tenant_store_up 1$/m);
});

test('edgeinfer admin migrate-store moves a stopped server\'s SQLite store into PostgreSQL, keys and usage as they were', async () => {
  const stateDir = makeStateDir();
  const single = await startServer(['--threads', '1', '--http-threads', '1', '--kv-cache-memory', '16MiB',
    '--admin-token', ADMIN_TOKEN, '--state-dir', stateDir]);
  let key;
  let usage;
  try {
    await adminCall(single, ADMIN_TOKEN, 'POST', '/admin/v1/tenants', { id: 'moving', quotas: { daily_tokens: 100000 } });
    ({ key } = await adminCall(single, ADMIN_TOKEN, 'POST', '/admin/v1/tenants/moving/keys', {}));
    assert.equal((await complete(single, key)).status, 200);
    const migrate = (args) => spawnSync(edgeinferBin, ['admin', 'migrate-store', ...args], { encoding: 'utf8' });
    // Not while the server holds the folder.
    const locked = migrate(['--state-dir', stateDir, '--to', pg.url('edgeinfer_moved')]);
    assert.equal(locked.status, 1, locked.stderr);
    assert.match(locked.stderr, /in use by another edgeinfer process/);
    usage = (await adminCall(single, ADMIN_TOKEN, 'GET', '/admin/v1/tenants/moving/usage')).total;
  } finally {
    await single.stop();
  }
  const migrate = (args) => spawnSync(edgeinferBin, ['admin', 'migrate-store', ...args], { encoding: 'utf8' });
  const wrong = migrate(['--state-dir', stateDir, '--to', 'mysql://somewhere/db']);
  assert.equal(wrong.status, 2);
  assert.match(wrong.stderr, /not a postgresql:\/\/ URL/);
  const target = pg.createDatabase('edgeinfer_moved');
  const moved = migrate(['--state-dir', stateDir, '--to', target]);
  assert.equal(moved.status, 0, moved.stderr);
  assert.match(moved.stdout, /copied 2 tenants, 2 API keys, \d+ usage rows, \d+ audit entries and 0 stored responses/);
  // Into a store that has tenants already: refused, nothing changed.
  const again = migrate(['--state-dir', stateDir, '--to', target]);
  assert.equal(again.status, 1);
  assert.match(again.stderr, /not empty/);

  const shared = await startServer(['--threads', '1', '--http-threads', '1', '--kv-cache-memory', '16MiB',
    '--admin-token', ADMIN_TOKEN, '--tenant-store', target]);
  try {
    assert.equal(shared.defaultKey, undefined);  // the first start happened before the move
    assert.equal((await complete(shared, key)).status, 200);
    const tenant = await adminCall(shared, ADMIN_TOKEN, 'GET', '/admin/v1/tenants/moving');
    assert.equal(tenant.quotas.daily_tokens, 100000);
    const after = (await adminCall(shared, ADMIN_TOKEN, 'GET', '/admin/v1/tenants/moving/usage')).total;
    assert.equal(after.requests, usage.requests + 1);
  } finally {
    await shared.stop();
  }
});
