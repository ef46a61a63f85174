// The grammar compile queue shared by tenants, through the real server on stories260K: one
// tenant's burst of distinct schemas neither holds up another tenant's schema (turns per tenant)
// nor takes the server down (the tenant's own bound answers 429), a client that leaves before its
// compile began costs no compile, and a tenant past its compile-seconds budget is refused new
// schemas while its cached ones still serve.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import { startServer, adminCall, waitFor } from './lib/server.mjs';
import { metric, requiredMetric } from './lib/metrics.mjs';

const models = process.env.EDGE_TEST_MODELS ?? path.resolve('../shared/models');
const storiesGguf = path.join(models, 'stories260K', 'stories260K.gguf');
const ADMIN_TOKEN = 'test-admin-token-0123456789';
const PER_TENANT = 8;

// Strings of about 2,000 characters at most: each a distinct grammar that takes stories260K's
// vocabulary 0.1 to 0.3 s to compile, so that a burst's compiles queue however slowly its
// requests arrive (a busy machine spreads 70 requests over a second or more).
const slowSchema = (i) => ({ type: 'string', maxLength: 2000 + i });
const okSchema = { type: 'object', properties: { ok: { type: 'boolean' } }, required: ['ok'], additionalProperties: false };

async function tenantKey(server, id) {
  await adminCall(server, ADMIN_TOKEN, 'POST', '/admin/v1/tenants', { id });
  return (await adminCall(server, ADMIN_TOKEN, 'POST', `/admin/v1/tenants/${id}/keys`, {})).key;
}

// A constrained chat completion; resolves with its status, headers, body and when it ended.
async function ask(server, key, schema, { signal, maxTokens = 8 } = {}) {
  const res = await globalThis.fetch(`${server.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
    body: JSON.stringify({
      messages: [{ role: 'user', content: 'Write the value.' }],
      max_tokens: maxTokens,
      response_format: { type: 'json_schema', json_schema: { name: 'v', schema } },
    }),
    signal,
  });
  const body = await res.json();
  return { status: res.status, headers: res.headers, body, at: performance.now() };
}

let queue;
let budget;
before(async () => {
  [queue, budget] = await Promise.all([
    startServer(['--model', storiesGguf, '--threads', '1', '--kv-cache-memory', '32MiB', '--admin-token', ADMIN_TOKEN,
      '--grammar-compile-threads', '1', '--grammar-max-queued-per-tenant', String(PER_TENANT)]),
    startServer(['--model', storiesGguf, '--threads', '1', '--kv-cache-memory', '32MiB', '--admin-token', ADMIN_TOKEN,
      '--grammar-compile-budget', '0.0001']),
  ]);
});
after(async () => {
  await Promise.all([queue?.stop(), budget?.stop()]);
});

test('70 distinct schemas of one tenant at once: another tenant is served next, the rest get 429, the server stays ready', async () => {
  const [a, b] = await Promise.all([tenantKey(queue, 'burst'), tenantKey(queue, 'quiet')]);
  const burst = Array.from({ length: 70 }, (_, i) => ask(queue, a, slowSchema(i)));
  // Sent once the burst's compiles are queued behind the one running, so that a first-in,
  // first-out queue would answer it after every one of them.
  let waitingWhenSent = 0;
  await waitFor('the burst queued', async () => {
    waitingWhenSent = await metric(queue, 'edgeinfer_grammar_compiles_waiting');
    return waitingWhenSent >= 4;
  });
  const sent = performance.now();
  const quiet = await ask(queue, b, okSchema, { maxTokens: 64 });
  const answers = await Promise.all(burst);
  const quietMs = quiet.at - sent;

  assert.equal(quiet.status, 200, JSON.stringify(quiet.body));
  assert.equal(typeof JSON.parse(quiet.body.choices[0].message.content).ok, 'boolean');
  const served = answers.filter((r) => r.status === 200);
  const refused = answers.filter((r) => r.status !== 200);
  assert.ok(served.length >= waitingWhenSent, `${served.length} of the burst served`);
  assert.ok(refused.length >= 70 - 2 * PER_TENANT, `only ${refused.length} of 70 refused`);
  for (const r of refused) {
    assert.equal(r.status, 429, JSON.stringify(r.body));
    assert.equal(r.body.error.code, 'rate_limit_exceeded');
    assert.equal(r.body.error.type, 'grammar_compile_queue');
    assert.ok(Number(r.headers.get('retry-after')) >= 1);
  }
  // Turns per tenant: the quiet tenant's compile came right after the one running when it was
  // sent, so the burst's compiles that were waiting then (less one that may have begun while it
  // was on its way, and one whose answer may have overtaken) were answered after it.
  const burstAfterQuiet = served.filter((r) => r.at > quiet.at).length;
  assert.ok(burstAfterQuiet >= waitingWhenSent - 2,
    `${burstAfterQuiet} of the burst answered after the quiet tenant, ${waitingWhenSent} were waiting when it was sent`);
  console.log(`quiet tenant answered in ${quietMs.toFixed(0)} ms with ${waitingWhenSent} of the burst's compiles ` +
    `waiting; ${burstAfterQuiet} of the burst's ${served.length} answered after it, ${refused.length} refused`);

  assert.equal(await requiredMetric(queue, 'edgeinfer_grammar_compile_rejections_total',
    { tenant: 'burst', reason: 'tenant_queue' }), refused.length);
  assert.ok(await requiredMetric(queue, 'edgeinfer_tenant_grammar_compile_seconds_total', { tenant: 'burst' }) > 0);
  assert.ok(await requiredMetric(queue, 'edgeinfer_tenant_grammar_compile_seconds_total', { tenant: 'quiet' }) > 0);
  const ready = await globalThis.fetch(`${queue.url}/readyz`);
  assert.equal(ready.status, 200, await ready.text());
});

test('requests whose client left before their compile began cost no compile', async () => {
  const key = await tenantKey(queue, 'leaver');
  const dropped = await metric(queue, 'edgeinfer_grammar_compiles_dropped_total');
  const compiled = await metric(queue, 'edgeinfer_grammar_compile_seconds_count');
  const controller = new AbortController();
  const leaving = Array.from({ length: 6 }, (_, i) => ask(queue, key, slowSchema(100 + i), { signal: controller.signal })
    .catch((e) => ({ aborted: e.name === 'AbortError' })));
  await waitFor('the compiles queued', async () => (await metric(queue, 'edgeinfer_grammar_compiles_waiting')) >= 3);
  controller.abort();
  // (One may have been answered before the abort: its compile was running.)
  for (const r of await Promise.all(leaving)) assert.ok(r.aborted || r.status === 200, JSON.stringify(r.body));
  // Each of the six either compiled or was dropped, once the compile running has ended.
  let droppedNow = 0;
  let compiledNow = 0;
  await waitFor('every compile compiled or dropped', async () => {
    droppedNow = (await requiredMetric(queue, 'edgeinfer_grammar_compiles_dropped_total')) - dropped;
    compiledNow = (await requiredMetric(queue, 'edgeinfer_grammar_compile_seconds_count')) - compiled;
    return droppedNow + compiledNow >= 6;
  });
  assert.ok(droppedNow >= 3, `${droppedNow} compiles dropped, ${compiledNow} compiled`);
  assert.equal(droppedNow + compiledNow, 6);
  const ready = await globalThis.fetch(`${queue.url}/readyz`);
  assert.equal(ready.status, 200);
});

test('past its compile-seconds budget a tenant gets 429 for a new schema; its cached schema and other tenants still pass', async () => {
  const [a, b] = await Promise.all([tenantKey(budget, 'spender'), tenantKey(budget, 'other')]);
  const first = await ask(budget, a, slowSchema(0));
  assert.equal(first.status, 200, JSON.stringify(first.body));
  const refused = await ask(budget, a, slowSchema(1));
  assert.equal(refused.status, 429, JSON.stringify(refused.body));
  assert.equal(refused.body.error.type, 'grammar_compile_seconds');
  assert.equal(refused.body.error.code, 'rate_limit_exceeded');
  assert.ok(Number(refused.headers.get('retry-after')) > 60, refused.headers.get('retry-after'));
  const cached = await ask(budget, a, slowSchema(0));
  assert.equal(cached.status, 200, JSON.stringify(cached.body));
  const other = await ask(budget, b, slowSchema(1));
  assert.equal(other.status, 200, JSON.stringify(other.body));
  assert.equal(await requiredMetric(budget, 'edgeinfer_grammar_compile_rejections_total',
    { tenant: 'spender', reason: 'tenant_budget' }), 1);
});
