// Two gateways sharing quota counters in a real redis-server: one tenant's requests/min and
// tokens/min hold across both (60, not 120), a Redis killed mid-run is handled as each
// gateway's --quota-fail-mode says (closed: 503; open: requests pass) and shows in /metrics and
// in one log line, and a Redis restarted on the same port is used again without restarting the
// gateways.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { adminCall, freePort, startServer, sleep } from './lib/server.mjs';
import { startRedis } from './lib/redis.mjs';
import { requiredMetric, requiredSeriesValue, scrape } from './lib/metrics.mjs';

const ADMIN_TOKEN = 'test-admin-token-0123456789';
let redis;
let closedGateway;  // --quota-fail-mode closed
let openGateway;    // --quota-fail-mode open

before(async () => {
  redis = await startRedis(await freePort());
  const common = ['--threads', '1', '--http-threads', '2', '--kv-cache-memory', '64MiB', '--admin-token', ADMIN_TOKEN,
    '--quota-store', `redis://127.0.0.1:${redis.port}/0`, '--quota-store-timeout', '200ms'];
  [closedGateway, openGateway] = await Promise.all([
    startServer([...common, '--quota-fail-mode', 'closed']),
    startServer([...common, '--quota-fail-mode', 'open']),
  ]);
});

after(async () => {
  await closedGateway?.stop();
  await openGateway?.stop();
  await redis?.stop();
});

function admin(server, method, route, body) {
  return adminCall(server, ADMIN_TOKEN, method, route, body);
}

// The same tenant (same id, same quotas) on both gateways, each with its own tenant store and
// API key: the counters in Redis are keyed by the tenant id, so they are the same counters.
async function tenantOnBoth(id, quotas) {
  const keys = [];
  for (const server of [closedGateway, openGateway]) {
    await admin(server, 'POST', '/admin/v1/tenants', { id, quotas });
    keys.push((await admin(server, 'POST', `/admin/v1/tenants/${id}/keys`, {})).key);
  }
  return keys;
}

async function complete(server, key, { prompt = 'Once upon a time', maxTokens = 1 } = {}) {
  const res = await fetch(`${server.url}/v1/completions`, {
    method: 'POST',
    headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
    body: JSON.stringify({ prompt, max_tokens: maxTokens, temperature: 0 }),
  });
  return { status: res.status, headers: res.headers, json: await res.json() };
}

// Sends `total` requests, alternating between the gateways, all at once: the limits admit or
// refuse them within moments, so that little can refill meanwhile.
async function sendThroughBoth(keys, total, options, parallel = total) {
  const gateways = [closedGateway, openGateway];
  const results = [];
  let next = 0;
  const start = Date.now();
  await Promise.all(Array.from({ length: parallel }, async () => {
    for (let i = next++; i < total; i = next++) {
      const g = i % 2;
      results.push({ gateway: g, ...(await complete(gateways[g], keys[g], options)) });
    }
  }));
  return { results, seconds: (Date.now() - start) / 1000 };
}

const count = (text, pattern) => (text.match(pattern) ?? []).length;

test('requests per minute: 60 through two gateways are 60 accepted, not 120', async () => {
  const keys = await tenantOnBoth('shared-rpm', { requests_per_minute: 60 });
  const { results, seconds } = await sendThroughBoth(keys, 140, {});
  const accepted = results.filter((r) => r.status === 200);
  const refused = results.filter((r) => r.status !== 200);
  // GCRA: the minute's 60 at once, then one more per second that passed while sending.
  assert.ok(accepted.length >= 60, `accepted ${accepted.length}`);
  assert.ok(accepted.length <= 60 + Math.floor(seconds), `accepted ${accepted.length} in ${seconds} s`);
  assert.ok(accepted.some((r) => r.gateway === 0) && accepted.some((r) => r.gateway === 1));
  for (const r of refused) {
    assert.equal(r.status, 429);
    assert.equal(r.json.error.type, 'requests');
    assert.equal(r.json.error.code, 'rate_limit_exceeded');
    assert.equal(r.headers.get('x-ratelimit-limit-requests'), '60');
    assert.ok(Number(r.headers.get('retry-after-ms')) <= 1000);
  }
  console.log(`requests/min 60 through two gateways: ${accepted.length} accepted of ${results.length} in ${seconds} s`);
});

test('tokens per minute: two gateways together serve the limit within 1%, not twice it', async () => {
  const tpm = 2000;
  const keys = await tenantOnBoth('shared-tpm', { tokens_per_minute: tpm });
  const prompt = 'Once upon a time there was a little girl';
  const { results, seconds } = await sendThroughBoth(keys, 300, { prompt });
  const accepted = results.filter((r) => r.status === 200);
  const used = accepted.reduce((sum, r) => sum + r.json.usage.total_tokens, 0);
  const cost = Math.max(...accepted.map((r) => r.json.usage.prompt_tokens + 1));  // reserved per request
  assert.ok(cost <= tpm / 100, `a request reserves ${cost} tokens: too coarse to measure 1%`);
  assert.ok(results.some((r) => r.status === 429 && r.json.error.type === 'tokens'));
  // The bucket holds tpm tokens and refills tpm/60 per second: what both served together is the
  // bucket less at most one request's cost, plus what refilled while sending.
  const refilled = (tpm * seconds) / 60;
  assert.ok(used >= tpm - cost, `used ${used} of ${tpm}`);
  assert.ok(used <= tpm + refilled, `used ${used} of ${tpm} + ${refilled.toFixed(0)} refilled in ${seconds} s`);
  assert.ok(Math.abs(used - tpm) / tpm <= 0.01 + refilled / tpm, `used ${used}`);
  console.log(`tokens/min ${tpm} through two gateways: ${used} tokens served in ${seconds} s ` +
    `(${(100 * (used - tpm) / tpm).toFixed(2)}%, refill ${refilled.toFixed(0)})`);
});

test('Redis killed: closed answers 503, open lets requests pass; restarted: both count again', async () => {
  // 10 a minute: one request's share of the window is 6 s, longer than the reconnection takes, so the
  // remaining count below is not blurred by what the window gives back meanwhile.
  const rpm = 10;
  const keys = await tenantOnBoth('outage', { requests_per_minute: rpm, tokens_per_minute: 100000 });
  assert.equal((await complete(closedGateway, keys[0])).status, 200);
  assert.equal((await complete(openGateway, keys[1])).status, 200);
  assert.equal(await requiredMetric(closedGateway, 'edgeinfer_quota_store_up'), 1);

  await redis.stop();
  for (let i = 0; i < 5; ++i) {
    const closed = await complete(closedGateway, keys[0]);
    assert.equal(closed.status, 503);
    assert.equal(closed.json.error.type, 'server_error');
    assert.equal(closed.json.error.code, 'quota_store_unavailable');
    assert.match(closed.json.error.message, /quota store is unavailable/);
    assert.equal(closed.headers.get('retry-after'), '1');

    const open = await complete(openGateway, keys[1]);
    assert.equal(open.status, 200);
    assert.equal(open.headers.get('x-ratelimit-limit-requests'), null);  // nothing was counted
  }
  for (const server of [closedGateway, openGateway]) {
    const text = await scrape(server);
    assert.equal(requiredSeriesValue(text, 'edgeinfer_quota_store_up'), 0);
    assert.ok(requiredSeriesValue(text, 'edgeinfer_quota_store_errors_total', { operation: 'acquire' }) >= 5);
    assert.equal(count(server.log, /quota store redis:\/\/\S+ is down/g), 1, server.log);  // one line, not one per request
  }
  assert.match(closedGateway.log, /refused with 503 \(--quota-fail-mode closed\)/);
  assert.match(openGateway.log, /admitted without being counted \(--quota-fail-mode open\)/);

  redis = await startRedis(redis.port);  // same port, empty
  const deadline = Date.now() + 30000;
  let recovered;
  while ((recovered = await complete(closedGateway, keys[0])).status !== 200 && Date.now() < deadline) await sleep(100);
  assert.equal(recovered.status, 200);
  const recoveredAt = Date.now();
  assert.equal(recovered.headers.get('x-ratelimit-limit-requests'), String(rpm));
  // The open gateway admits uncounted (no headers) until its own reconnection backoff has passed.
  let open;
  while ((open = await complete(openGateway, keys[1])).headers.get('x-ratelimit-limit-requests') === null &&
    Date.now() < deadline) await sleep(100);
  assert.equal(open.status, 200);
  assert.equal(open.headers.get('x-ratelimit-limit-requests'), String(rpm));  // counted again
  // Both gateways' requests are counted in the one window: rpm - 2 left, plus one for each 60/rpm s
  // that passed between them (none unless the reconnection was slow).
  const givenBack = Math.floor((Date.now() - recoveredAt) / (60000 / rpm));
  const remaining = Number(open.headers.get('x-ratelimit-remaining-requests'));
  assert.ok(remaining >= rpm - 2 && remaining <= rpm - 2 + givenBack, `remaining ${remaining}, ${givenBack} given back`);
  for (const server of [closedGateway, openGateway]) {
    assert.equal(await requiredMetric(server, 'edgeinfer_quota_store_up'), 1);
    assert.equal(count(server.log, /quota store redis:\/\/\S+ is back up/g), 1, server.log);
  }
});

test('a --quota-store that is not memory or redis:// stops serve with a clear error', async () => {
  await assert.rejects(startServer(['--quota-store', 'memcached://localhost'], { timeoutMs: 20000 }),
    /--quota-store: invalid Redis URL "memcached:\/\/localhost": the scheme is "memcached", not redis/);
});
