// Tenancy over real HTTP: the admin API and `edgeinfer admin`, API keys on /v1/completions,
// quotas with their headers, the usage ledger and audit log, and state kept across restarts.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { startServer, edgeinferBin, makeStateDir, sleep } from './lib/server.mjs';
import { metric, scrape, seriesValue } from './lib/metrics.mjs';

const ADMIN_TOKEN = 'test-admin-token-0123456789';
const stateDir = makeStateDir();
let server;

before(async () => {
  server = await startServer(['--threads', '2', '--kv-cache-memory', '64MiB', '--admin-token', ADMIN_TOKEN, '--state-dir', stateDir]);
});
after(async () => { await server?.stop(); });

async function admin(method, path, { body, token = ADMIN_TOKEN, raw, url = server.url } = {}) {
  const headers = {};
  if (token !== null) headers.authorization = `Bearer ${token}`;
  if (body !== undefined || raw !== undefined) headers['content-type'] = 'application/json';
  const res = await fetch(`${url}${path}`, {
    method, headers, body: raw ?? (body === undefined ? undefined : JSON.stringify(body)),
  });
  const text = await res.text();
  return { status: res.status, headers: res.headers, json: text ? JSON.parse(text) : null };
}

async function complete(key, { maxTokens = 8, prompt = 'Once upon a time', url = server.url } = {}) {
  const headers = { 'content-type': 'application/json' };
  if (key) headers.authorization = `Bearer ${key}`;
  const res = await fetch(`${url}/v1/completions`, {
    method: 'POST', headers, body: JSON.stringify({ prompt, max_tokens: maxTokens, temperature: 0 }),
  });
  return { status: res.status, headers: res.headers, json: await res.json() };
}

function cli(args, { env = {}, url = server.url } = {}) {
  const r = spawnSync(edgeinferBin, ['admin', '--url', url, ...args], {
    encoding: 'utf8', timeout: 30000, env: { ...process.env, EDGE_ADMIN_TOKEN: ADMIN_TOKEN, ...env },
  });
  return { status: r.status, stdout: r.stdout, stderr: r.stderr, json: r.status === 0 ? JSON.parse(r.stdout) : null };
}

const twoDaysAgo = () => new Date(Date.now() - 2 * 86400e3).toISOString().slice(0, 19) + 'Z';

test('first start creates tenant "default" and logs one working API key', async () => {
  assert.match(server.defaultKey ?? '', /^ek-[0-9a-f]{16}\.[A-Za-z0-9_-]{43}$/);
  const ok = await complete(server.defaultKey);
  assert.equal(ok.status, 200);
  assert.ok(ok.json.usage.completion_tokens > 0);
  const tenants = await admin('GET', '/admin/v1/tenants');
  assert.ok(tenants.json.data.some((t) => t.id === 'default'));
});

// The first key is made once the server serves: a start that fails first (the port taken, a
// model that does not load) must not use it up unseen, and a later start says how to make more.
test('a failed start makes no key; the first start that serves logs one that works, and later starts say how to get more', async () => {
  const state = makeStateDir();
  const serveArgs = ['serve', '--host', '127.0.0.1', '--state-dir', state, '--threads', '1', '--kv-cache-memory', '32MiB'];
  const blocker = net.createServer();
  await new Promise((resolve) => blocker.listen(0, '127.0.0.1', resolve));
  try {
    const taken = spawnSync(edgeinferBin, [...serveArgs, '--port', String(blocker.address().port)],
      { encoding: 'utf8', timeout: 60000 });
    assert.equal(taken.status, 1, taken.stderr);
    assert.match(taken.stderr, /cannot listen on 127\.0\.0\.1:\d+/);
    assert.doesNotMatch(taken.stderr, /with API key/);
  } finally {
    blocker.close();
  }
  const corrupt = path.join(state, 'corrupt.gguf');
  fs.writeFileSync(corrupt, Buffer.concat([Buffer.from('GGUF'), Buffer.alloc(60, 0xab)]));
  const broken = spawnSync(edgeinferBin, [...serveArgs, '--port', '0', '--model', corrupt], { encoding: 'utf8', timeout: 60000 });
  assert.equal(broken.status, 1, broken.stderr);
  assert.match(broken.stderr, /cannot serve/);
  assert.doesNotMatch(broken.stderr, /with API key/);

  const first = await startServer(['--threads', '1', '--kv-cache-memory', '32MiB', '--state-dir', state]);
  try {
    assert.match(first.defaultKey ?? '', /^ek-[0-9a-f]{16}\.[A-Za-z0-9_-]{43}$/, first.log);
    assert.equal((await complete(first.defaultKey, { url: first.url })).status, 200);
  } finally {
    await first.stop();
  }
  const again = await startServer(['--threads', '1', '--kv-cache-memory', '32MiB', '--state-dir', state]);
  const offline = ['admin', 'keys', 'create', 'default', '--state-dir', state];
  try {
    assert.equal(again.defaultKey, undefined);
    assert.ok(again.log.includes(`admin API off (no --admin-token); a new key: \`edgeinfer admin keys create default --state-dir ${state}\` while the server is stopped`), again.log);
    // While the server runs, it holds the store: the offline way says to use the admin API.
    const held = spawnSync(edgeinferBin, offline, { encoding: 'utf8', timeout: 30000 });
    assert.equal(held.status, 1, held.stderr);
    assert.match(held.stderr, /in use by another edgeinfer process; while the server runs, use its admin API/);
  } finally {
    await again.stop();
  }
  // Stopped, the line it logged works as written: a new key, no admin token, and it serves.
  const made = spawnSync(edgeinferBin, [...offline, '--expires-in', '30d'], { encoding: 'utf8', timeout: 30000 });
  assert.equal(made.status, 0, made.stderr);
  const issued = JSON.parse(made.stdout);
  assert.match(issued.key, /^ek-[0-9a-f]{16}\.[A-Za-z0-9_-]{43}$/);
  assert.equal(issued.tenant, 'default');
  assert.ok(issued.expires_at > Date.now() / 1000 + 29 * 86400);
  for (const [args, says] of [
    [['admin', 'keys', 'create', 'nobody', '--state-dir', state], /no tenant|not found/i],
    [['admin', 'keys', 'create', 'default', '--state-dir', path.join(state, 'missing')], /there is no tenant store at/],
    [[...offline, '--expires-at', '2001-01-01'], /must be in the future/],
  ]) {
    const refused = spawnSync(edgeinferBin, args, { encoding: 'utf8', timeout: 30000 });
    assert.notEqual(refused.status, 0, args.join(' '));
    assert.match(refused.stderr, says);
  }
  const third = await startServer(['--threads', '1', '--kv-cache-memory', '32MiB', '--state-dir', state]);
  try {
    assert.equal((await complete(issued.key, { url: third.url })).status, 200);
  } finally {
    await third.stop();
  }
});

// vLLM's and llama.cpp's --api-key: the user's own keys, for the default tenant, never logged
// or stored; no key is generated.
test('--api-key (repeated, or EDGE_API_KEY) serves those keys as the default tenant and stores none', async () => {
  const state = makeStateDir();
  const keys = ['sk-first-local-key', 'second.key_2'];
  const withKeys = await startServer(['--threads', '1', '--kv-cache-memory', '32MiB', '--state-dir', state,
    '--api-key', keys[0], '--api-key', keys[1], '--admin-token', ADMIN_TOKEN]);
  try {
    assert.equal(withKeys.defaultKey, undefined, 'no key is generated');
    assert.match(withKeys.log, /--api-key: 2 keys for the tenant "default"/);
    for (const key of keys) {
      assert.equal((await complete(key, { url: withKeys.url })).status, 200, key);
      assert.ok(!withKeys.log.includes(key), 'a key never reaches the log');
    }
    assert.equal((await complete('sk-first-local-ke', { url: withKeys.url })).status, 401);
    assert.equal((await complete(null, { url: withKeys.url })).status, 401);
    // Keys of the admin API work beside them, and the store holds only those.
    const listed = await fetch(`${withKeys.url}/admin/v1/tenants/default/keys`, { headers: { authorization: `Bearer ${ADMIN_TOKEN}` } });
    assert.equal((await listed.json()).data.length, 0);
  } finally {
    await withKeys.stop();
  }
  for (const file of fs.readdirSync(state)) {
    const bytes = fs.readFileSync(path.join(state, file));
    for (const key of keys) assert.ok(!bytes.includes(key), `${file} holds a key's text`);
  }
  const fromEnv = await startServer(['--threads', '1', '--kv-cache-memory', '32MiB', '--state-dir', state],
    { env: { EDGE_API_KEY: keys.join(',') } });
  try {
    for (const key of keys) assert.equal((await complete(key, { url: fromEnv.url })).status, 200, key);
  } finally {
    await fromEnv.stop();
  }
  const bad = spawnSync(edgeinferBin, ['serve', '--port', '0', '--state-dir', state, '--api-key', 'a b'], { encoding: 'utf8', timeout: 30000 });
  assert.equal(bad.status, 2);
  assert.match(bad.stderr, /--api-key: key 1 has a character that is not printable ASCII or is a space/);
});

test('/v1/completions needs a valid API key: 401 invalid_api_key otherwise', async () => {
  for (const key of [null, 'ek-0000000000000000.nope', 'sk-something-else']) {
    const res = await complete(key);
    assert.equal(res.status, 401, `key ${key}`);
    assert.equal(res.json.error.code, 'invalid_api_key');
    assert.equal(res.json.error.type, 'invalid_request_error');
    assert.equal(res.headers.get('www-authenticate'), 'Bearer');
  }
});

test('admin calls without the admin token, or with a wrong one, are 401', async () => {
  const none = await admin('GET', '/admin/v1/tenants', { token: null });
  assert.equal(none.status, 401);
  assert.equal(none.json.error.code, 'invalid_admin_token');
  assert.match(none.json.error.message, /needs the admin token/);
  const wrong = await admin('GET', '/admin/v1/tenants', { token: 'not-the-admin-token-at-all' });
  assert.equal(wrong.status, 401);
  assert.equal(wrong.json.error.message, 'Incorrect admin token');
  // A tenant's API key is not an admin token.
  assert.equal((await admin('POST', '/admin/v1/tenants', { token: server.defaultKey, body: { id: 'x' } })).status, 401);
  assert.equal((await admin('GET', '/admin/v1/tenants/x', { token: null })).status, 401);
});

test('tenants: create 201, list, get, patch, delete; 404 and 409 where due', async () => {
  const body = {
    id: 'acme', weight: 2,
    quotas: { requests_per_minute: 600, tokens_per_minute: 200000, max_concurrent: 16, daily_tokens: 5000000,
      max_tokens_per_request: 4096, kv_host_cache_bytes: 1073741824, kv_disk_cache_bytes: 0,
      monthly_tokens: 100000000 },
  };
  const created = await admin('POST', '/admin/v1/tenants', { body });
  assert.equal(created.status, 201);
  assert.equal(created.json.id, 'acme');
  assert.equal(created.json.object, 'tenant');
  assert.equal(created.json.weight, 2);
  assert.deepEqual(created.json.quotas, body.quotas);
  assert.equal(typeof created.json.created_at, 'number');

  const again = await admin('POST', '/admin/v1/tenants', { body: { id: 'acme' } });
  assert.equal(again.status, 409);

  const list = await admin('GET', '/admin/v1/tenants');
  assert.equal(list.status, 200);
  assert.equal(list.json.object, 'list');
  assert.deepEqual(list.json.data.find((t) => t.id === 'acme'), created.json);

  assert.deepEqual((await admin('GET', '/admin/v1/tenants/acme')).json, created.json);
  const missing = await admin('GET', '/admin/v1/tenants/nobody');
  assert.equal(missing.status, 404);
  assert.match(missing.json.error.message, /no tenant 'nobody'/);

  const patched = await admin('PATCH', '/admin/v1/tenants/acme', {
    body: { weight: 0.5, quotas: { requests_per_minute: null, daily_tokens: 10, kv_host_cache_bytes: null,
      kv_disk_cache_bytes: 268435456 } },
  });
  assert.equal(patched.status, 200);
  assert.equal(patched.json.weight, 0.5);
  assert.equal(patched.json.quotas.requests_per_minute, null);   // null: unlimited
  assert.equal(patched.json.quotas.daily_tokens, 10);
  assert.equal(patched.json.quotas.tokens_per_minute, 200000);   // absent: unchanged
  assert.equal(patched.json.quotas.kv_host_cache_bytes, null);
  assert.equal(patched.json.quotas.kv_disk_cache_bytes, 268435456);
  assert.deepEqual((await admin('GET', '/admin/v1/tenants/acme')).json, patched.json);

  const removed = await admin('DELETE', '/admin/v1/tenants/acme');
  assert.equal(removed.status, 200);
  assert.deepEqual(removed.json, { id: 'acme', object: 'tenant', deleted: true });
  assert.equal((await admin('GET', '/admin/v1/tenants/acme')).status, 404);
  assert.equal((await admin('DELETE', '/admin/v1/tenants/acme')).status, 404);
});

test('bad admin bodies are 400s naming the field', async () => {
  const cases = [
    [{ raw: '{"id": "x",' }, null, /not valid JSON/],
    [{ raw: '[1,2]' }, null, /JSON object/],
    [{ body: { weight: 1 } }, 'id', /'id' is required/],
    [{ body: { id: 42 } }, 'id', /'id' must be a string/],
    [{ body: { id: 'has space' } }, 'id', /'id' must be 1 to 64 characters/],
    [{ body: { id: 'w', weight: 'heavy' } }, 'weight', /'weight' must be a number/],
    [{ body: { id: 'w', weight: -1 } }, 'weight', /above 0/],
    [{ body: { id: 'q', quotas: 5 } }, 'quotas', /must be an object/],
    [{ body: { id: 'q', quotas: { requests_per_minute: '600' } } }, 'quotas.requests_per_minute', /whole number/],
    [{ body: { id: 'q', quotas: { tokens_per_minute: 0 } } }, 'quotas.tokens_per_minute', /from 1 to/],
    [{ body: { id: 'q', quotas: { kv_host_cache_bytes: -1 } } }, 'quotas.kv_host_cache_bytes', /from 0 to/],
    [{ body: { id: 'q', quotas: { kv_disk_cache_bytes: '1GiB' } } }, 'quotas.kv_disk_cache_bytes', /whole number/],
    [{ body: { id: 'q', quotas: { daily_token: 5 } } }, 'quotas.daily_token', /unknown quota/],
    [{ body: { id: 'q', colour: 'red' } }, 'colour', /unknown field 'colour'/],
  ];
  for (const [request, param, message] of cases) {
    const res = await admin('POST', '/admin/v1/tenants', request);
    assert.equal(res.status, 400, JSON.stringify(request));
    assert.equal(res.json.error.type, 'invalid_request_error');
    assert.equal(res.json.error.param, param, JSON.stringify(request));
    assert.match(res.json.error.message, message);
  }
  assert.equal((await admin('GET', '/admin/v1/tenants')).json.data.some((t) => ['w', 'q'].includes(t.id)), false);

  await admin('POST', '/admin/v1/tenants', { body: { id: 'patchme' } });
  const patch = await admin('PATCH', '/admin/v1/tenants/patchme', { body: { id: 'renamed' } });
  assert.equal(patch.status, 400);
  assert.equal(patch.json.error.param, 'id');
  const key = await admin('POST', '/admin/v1/tenants/patchme/keys', { body: { expires_in: 'soon' } });
  assert.equal(key.status, 400);
  assert.equal(key.json.error.param, 'expires_in');
  const past = await admin('POST', '/admin/v1/tenants/patchme/keys', { body: { expires_at: '2001-01-01' } });
  assert.equal(past.status, 400);
  assert.equal(past.json.error.param, 'expires_at');
  const usage = await admin('GET', '/admin/v1/tenants/patchme/usage?from=yesterday');
  assert.equal(usage.status, 400);
  assert.equal(usage.json.error.param, 'from');
  const audit = await admin('GET', '/admin/v1/audit?limit=0');
  assert.equal(audit.status, 400);
  assert.equal(audit.json.error.param, 'limit');
});

test('query strings that are not UTF-8 once decoded are 400s whose bodies are valid UTF-8 and echo no raw bytes', async () => {
  const strict = new TextDecoder('utf-8', { fatal: true });
  const get = async (path) => {
    const res = await fetch(`${server.url}${path}`, { headers: { authorization: `Bearer ${ADMIN_TOKEN}` } });
    const bytes = Buffer.from(await res.arrayBuffer());
    return { status: res.status, bytes, json: JSON.parse(strict.decode(bytes)) };
  };
  for (const path of ['/admin/v1/tenants/default/usage?from=%FF%FE', '/admin/v1/tenants/default/usage?%C0%AF=1',
                      '/admin/v1/audit?limit=%ED%A0%80', '/admin/v1/audit?%FFlimit=1']) {
    const reply = await get(path);
    assert.equal(reply.status, 400, path);
    assert.equal(reply.json.error.type, 'invalid_request_error');
    assert.match(reply.json.error.message, /UTF-8/, path);
    for (const raw of [0xFF, 0xFE, 0xC0, 0xED]) assert.equal(reply.bytes.indexOf(raw), -1, `${path} echoes 0x${raw.toString(16)}`);
  }
  // A valid name that is unknown is still named; a valid value that is wrong is still shown.
  const unknown = await get('/admin/v1/audit?caf%C3%A9=1');
  assert.equal(unknown.status, 400);
  assert.equal(unknown.json.error.param, 'café');
  const wrong = await get(`/admin/v1/tenants/default/usage?from=${encodeURIComponent('hier 😀')}`);
  assert.equal(wrong.status, 400);
  assert.match(wrong.json.error.message, /"hier 😀" is not a time/);
});

test('keys: the secret is shown once, works at once, and stops at once when revoked', async () => {
  await admin('POST', '/admin/v1/tenants', { body: { id: 'keyed' } });
  const created = await admin('POST', '/admin/v1/tenants/keyed/keys', { body: {} });
  assert.equal(created.status, 201);
  assert.equal(created.json.object, 'api_key');
  assert.equal(created.json.tenant, 'keyed');
  assert.equal(created.json.status, 'active');
  assert.match(created.json.key, new RegExp(`^ek-${created.json.id}\\.[A-Za-z0-9_-]{43}$`));
  assert.equal((await admin('POST', '/admin/v1/tenants/nobody/keys', { body: {} })).status, 404);

  const listed = await admin('GET', '/admin/v1/tenants/keyed/keys');
  assert.equal(listed.status, 200);
  assert.equal(listed.json.data.length, 1);
  assert.equal(listed.json.data[0].id, created.json.id);
  assert.equal(listed.json.data[0].key, undefined);
  assert.ok(!JSON.stringify(listed.json).includes(created.json.key.split('.')[1]));

  assert.equal((await complete(created.json.key)).status, 200);
  const revoked = await admin('DELETE', `/admin/v1/keys/${created.json.id}`);
  assert.equal(revoked.status, 200);
  assert.equal(revoked.json.status, 'revoked');
  assert.equal(typeof revoked.json.revoked_at, 'number');
  const refused = await complete(created.json.key);
  assert.equal(refused.status, 401);
  assert.match(refused.json.error.message, /revoked/);
  assert.equal((await admin('DELETE', '/admin/v1/keys/0000000000000000')).status, 404);
});

test('an expired key is refused', async () => {
  await admin('POST', '/admin/v1/tenants', { body: { id: 'shortlived' } });
  const created = await admin('POST', '/admin/v1/tenants/shortlived/keys', { body: { expires_in: 1 } });
  assert.equal(created.status, 201);
  assert.equal(created.json.expires_at - created.json.created_at, 1);
  let res;
  for (let i = 0; i < 100; i++) {
    res = await complete(created.json.key);
    if (res.status === 401) break;
    await sleep(100);
  }
  assert.equal(res.status, 401);
  assert.match(res.json.error.message, /expired at/);
  const keys = await admin('GET', '/admin/v1/tenants/shortlived/keys');
  assert.equal(keys.json.data[0].status, 'expired');
});

test('requests per minute: 429 with retry-after, and x-ratelimit headers on every answer', async () => {
  await admin('POST', '/admin/v1/tenants', {
    body: { id: 'limited', quotas: { requests_per_minute: 2, tokens_per_minute: 100000 } },
  });
  const key = (await admin('POST', '/admin/v1/tenants/limited/keys', { body: {} })).json.key;
  const first = await complete(key);
  assert.equal(first.status, 200);
  assert.equal(first.headers.get('x-ratelimit-limit-requests'), '2');
  assert.equal(first.headers.get('x-ratelimit-remaining-requests'), '1');
  assert.equal(first.headers.get('x-ratelimit-limit-tokens'), '100000');
  assert.equal(first.headers.get('x-ratelimit-remaining-tokens'), String(100000 - first.json.usage.prompt_tokens - 8));
  assert.match(first.headers.get('x-ratelimit-reset-requests'), /^\d+(\.\d+)?m?s$|^\d+ms$/);
  assert.ok(first.headers.get('x-request-id'));
  const second = await complete(key);
  assert.equal(second.status, 200);
  assert.equal(second.headers.get('x-ratelimit-remaining-requests'), '0');

  const refused = await complete(key);
  assert.equal(refused.status, 429);
  assert.equal(refused.json.error.type, 'requests');
  assert.equal(refused.json.error.code, 'rate_limit_exceeded');
  // Two requests per minute: the next slot opens 30 s after the first request, minus the time
  // the three requests took.
  const retryAfterMs = Number(refused.headers.get('retry-after-ms'));
  assert.ok(retryAfterMs > 0 && retryAfterMs <= 30000, `retry-after-ms ${retryAfterMs}`);
  assert.equal(Number(refused.headers.get('retry-after')), Math.max(1, Math.ceil(retryAfterMs / 1000)));
  assert.equal(refused.headers.get('x-ratelimit-remaining-requests'), '0');
  assert.equal(refused.headers.get('x-ratelimit-limit-requests'), '2');

  assert.equal(await metric(server, 'edgeinfer_quota_rejections_total', { limit: 'requests_per_minute', tenant: 'limited' }), 1);
});

test('tokens per minute, daily budget and max tokens per request refuse as OpenAI does', async () => {
  await admin('POST', '/admin/v1/tenants', { body: { id: 'tokens', quotas: { tokens_per_minute: 40 } } });
  const tokensKey = (await admin('POST', '/admin/v1/tenants/tokens/keys', { body: {} })).json.key;
  const big = await complete(tokensKey, { maxTokens: 100 });
  assert.equal(big.status, 429);
  assert.equal(big.json.error.type, 'tokens');
  assert.match(big.json.error.message, /Request too large/);

  await admin('POST', '/admin/v1/tenants', { body: { id: 'budget', quotas: { daily_tokens: 30 } } });
  const budgetKey = (await admin('POST', '/admin/v1/tenants/budget/keys', { body: {} })).json.key;
  const used = await complete(budgetKey, { maxTokens: 8 });
  assert.equal(used.status, 200);
  const spent = await complete(budgetKey, { maxTokens: 30 - used.json.usage.total_tokens });
  assert.equal(spent.status, 429);
  assert.equal(spent.json.error.type, 'insufficient_quota');
  assert.equal(spent.json.error.code, 'insufficient_quota');
  const secondsToMidnight = (Date.UTC(new Date().getUTCFullYear(), new Date().getUTCMonth(), new Date().getUTCDate() + 1) -
    Date.now()) / 1000;
  assert.ok(Math.abs(Number(spent.headers.get('retry-after')) - secondsToMidnight) < 60);

  await admin('POST', '/admin/v1/tenants', { body: { id: 'small', quotas: { max_tokens_per_request: 4 } } });
  const smallKey = (await admin('POST', '/admin/v1/tenants/small/keys', { body: {} })).json.key;
  const tooMany = await complete(smallKey, { maxTokens: 5 });
  assert.equal(tooMany.status, 400);
  assert.equal(tooMany.json.error.param, 'max_tokens');
  assert.equal((await complete(smallKey, { maxTokens: 4 })).status, 200);
});

test('usage rows count the requests, tokens and rejections actually served', async () => {
  await admin('POST', '/admin/v1/tenants', { body: { id: 'metered', quotas: { requests_per_minute: 2 } } });
  const key = (await admin('POST', '/admin/v1/tenants/metered/keys', { body: {} })).json.key;
  const served = [];
  let rejected = 0;
  for (let i = 0; i < 5; i++) {
    const res = await complete(key, { maxTokens: 4 + i });
    if (res.status === 200) served.push(res.json.usage);
    else if (res.status === 429) rejected++;
  }
  // Two per minute: the rest are refused (unless this machine took 30 s per request).
  assert.ok(served.length >= 2);
  assert.ok(rejected >= 1);
  assert.equal(served.length + rejected, 5);

  const usage = await admin('GET', `/admin/v1/tenants/metered/usage?from=${encodeURIComponent(twoDaysAgo())}`);
  assert.equal(usage.status, 200);
  assert.equal(usage.json.tenant, 'metered');
  assert.ok(usage.json.data.length >= 1);
  for (const row of usage.json.data) assert.match(row.hour, /^\d{4}-\d\d-\d\dT\d\d:00:00Z$/);
  const sum = (field) => served.reduce((s, u) => s + u[field], 0);
  assert.equal(usage.json.total.requests, served.length);
  assert.equal(usage.json.total.rejections, rejected);
  assert.equal(usage.json.total.prompt_tokens, sum('prompt_tokens'));
  assert.equal(usage.json.total.completion_tokens, sum('completion_tokens'));
  assert.equal(usage.json.total.total_tokens, sum('total_tokens'));
  assert.equal((await admin('GET', '/admin/v1/tenants/nobody/usage')).status, 404);
});

test('the spend view sums what each key used, by model and API, and narrows to one key', async () => {
  await admin('POST', '/admin/v1/tenants', { body: { id: 'spender' } });
  const [first, second] = [(await admin('POST', '/admin/v1/tenants/spender/keys', { body: {} })).json,
    (await admin('POST', '/admin/v1/tenants/spender/keys', { body: {} })).json];
  const sums = new Map();  // "key api" -> usage summed
  const add = (keyId, api, usage) => {
    const s = sums.get(`${keyId} ${api}`) ?? { requests: 0, prompt_tokens: 0, completion_tokens: 0 };
    s.requests += 1;
    s.prompt_tokens += usage.prompt_tokens;
    s.completion_tokens += usage.completion_tokens;
    sums.set(`${keyId} ${api}`, s);
  };
  for (let i = 0; i < 3; i++) {
    const r = await complete(first.key, { maxTokens: 3 + i });
    assert.equal(r.status, 200);
    add(first.id, 'completions', r.json.usage);
  }
  const chat = await fetch(`${server.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { authorization: `Bearer ${second.key}`, 'content-type': 'application/json' },
    body: JSON.stringify({ messages: [{ role: 'user', content: 'Hi' }], max_tokens: 5 }),
  });
  assert.equal(chat.status, 200);
  add(second.id, 'chat_completions', (await chat.json()).usage);

  const spend = await admin('GET', `/admin/v1/tenants/spender/spend?from=${encodeURIComponent(twoDaysAgo())}`);
  assert.equal(spend.status, 200);
  assert.equal(spend.json.data.length, 2);
  for (const row of spend.json.data) {
    const expected = sums.get(`${row.key_id} ${row.api}`);
    assert.ok(expected, JSON.stringify(row));
    assert.equal(row.model, 'stories260K');
    assert.equal(row.requests, expected.requests);
    assert.equal(row.prompt_tokens, expected.prompt_tokens);
    assert.equal(row.completion_tokens, expected.completion_tokens);
    assert.equal(row.total_tokens, expected.prompt_tokens + expected.completion_tokens);
    assert.equal(row.rejections, undefined);
  }
  const one = await admin('GET', `/admin/v1/tenants/spender/spend?key=${second.id}`);
  assert.equal(one.json.data.length, 1);
  assert.equal(one.json.data[0].api, 'chat_completions');
  const cliSpend = cli(['spend', 'spender', '--key', first.id]);
  assert.equal(cliSpend.status, 0, cliSpend.stderr);
  assert.equal(cliSpend.json.total.requests, 3);
  assert.equal((await admin('GET', '/admin/v1/tenants/spender/spend?by=model')).status, 400);
});

test('a monthly budget refuses with 429 insufficient_quota once spent, saying when it resets', async () => {
  const made = cli(['tenants', 'create', 'monthly', '--monthly-tokens', '40']);
  assert.equal(made.status, 0, made.stderr);
  assert.equal(made.json.quotas.monthly_tokens, 40);
  const key = (await admin('POST', '/admin/v1/tenants/monthly/keys', { body: {} })).json.key;
  let refused;
  for (let i = 0; i < 10 && !refused; i++) {
    const r = await complete(key, { maxTokens: 8 });
    if (r.status === 429) refused = r;
    else assert.equal(r.status, 200, JSON.stringify(r.json));
  }
  assert.ok(refused, 'the monthly budget never refused');
  assert.equal(refused.json.error.code, 'insufficient_quota');
  assert.match(refused.json.error.message, /monthly token budget/);
  const next = new Date();
  const reset = new Date(Date.UTC(next.getUTCFullYear(), next.getUTCMonth() + 1, 1)).toISOString().replace('.000Z', 'Z');
  assert.ok(refused.json.error.message.includes(reset), refused.json.error.message);
  assert.ok(Number(refused.headers.get('retry-after')) > 0);
});

test('the share of its daily budget a tenant has spent is in /metrics, for the 80% alert', async () => {
  await admin('POST', '/admin/v1/tenants', { body: { id: 'budgeted', quotas: { daily_tokens: 60, monthly_tokens: 600 } } });
  await admin('POST', '/admin/v1/tenants', { body: { id: 'unbudgeted' } });
  const key = (await admin('POST', '/admin/v1/tenants/budgeted/keys', { body: {} })).json.key;
  let spent = 0;
  while (spent < 50) {
    const r = await complete(key, { maxTokens: Math.min(10, 60 - spent - 8) });
    assert.equal(r.status, 200, JSON.stringify(r.json));
    spent += r.json.usage.total_tokens;
  }
  // Read from the store every 10 s.
  let shown = 0;
  const deadline = Date.now() + 25000;
  while (Date.now() < deadline) {
    const text = await scrape(server);
    shown = seriesValue(text, 'edgeinfer_tenant_budget_used_ratio', { tenant: 'budgeted', budget: 'daily_tokens' });
    if (Math.abs(shown - spent / 60) < 1e-9) break;
    await sleep(250);
  }
  assert.ok(Math.abs(shown - spent / 60) < 1e-9, `shown ${shown}, spent ${spent} of 60`);
  assert.ok(shown >= 0.8);
  const text = await scrape(server);
  const monthly = seriesValue(text, 'edgeinfer_tenant_budget_used_ratio', { tenant: 'budgeted', budget: 'monthly_tokens' });
  assert.ok(Math.abs(monthly - spent / 600) < 1e-9, `monthly share ${monthly}, spent ${spent} of 600`);
  assert.doesNotMatch(text, /edgeinfer_tenant_budget_used_ratio\{[^}]*tenant="unbudgeted"/);
});

test('the audit log lists admin changes, newest first, with their request ids', async () => {
  const created = await admin('POST', '/admin/v1/tenants', { body: { id: 'audited' } });
  const patched = await admin('PATCH', '/admin/v1/tenants/audited', { body: { weight: 3 } });
  const key = await admin('POST', '/admin/v1/tenants/audited/keys', { body: {} });
  const audit = await admin('GET', '/admin/v1/audit?limit=3');
  assert.equal(audit.status, 200);
  assert.equal(audit.json.has_more, true);
  assert.deepEqual(audit.json.data.map((e) => e.action), ['key.create', 'tenant.update', 'tenant.create']);
  assert.deepEqual(audit.json.data.map((e) => e.request_id),
    [key.headers.get('x-request-id'), patched.headers.get('x-request-id'), created.headers.get('x-request-id')]);
  assert.equal(audit.json.data[1].details.after.weight, 3);
  assert.equal(audit.json.data[0].target, key.json.id);
  assert.ok(!JSON.stringify(audit.json).includes(key.json.key));
  const older = await admin('GET', `/admin/v1/audit?limit=1&before=${audit.json.data[2].id}`);
  assert.ok(older.json.data[0].id < audit.json.data[2].id);
});

test('edgeinfer admin drives the whole API', async () => {
  let r = cli(['tenants', 'create', 'cli-tenant', '--weight', '2', '--requests-per-minute', '100',
    '--daily-tokens', '5000']);
  assert.equal(r.status, 0, r.stderr);
  assert.equal(r.json.id, 'cli-tenant');
  assert.equal(r.json.quotas.requests_per_minute, 100);
  assert.equal(r.json.quotas.daily_tokens, 5000);

  r = cli(['tenants', 'list']);
  assert.equal(r.status, 0, r.stderr);
  assert.ok(r.json.data.some((t) => t.id === 'cli-tenant'));
  assert.equal(cli(['tenants', 'get', 'cli-tenant']).json.weight, 2);

  r = cli(['tenants', 'update', 'cli-tenant', '--requests-per-minute', 'unlimited', '--tokens-per-minute', '9000']);
  assert.equal(r.status, 0, r.stderr);
  assert.equal(r.json.quotas.requests_per_minute, null);
  assert.equal(r.json.quotas.tokens_per_minute, 9000);
  assert.equal(r.json.quotas.daily_tokens, 5000);

  // Sizes in bytes, with a unit or without; 0 keeps nothing in that tier.
  r = cli(['tenants', 'update', 'cli-tenant', '--kv-host-cache-bytes', '512MiB', '--kv-disk-cache-bytes', '0']);
  assert.equal(r.status, 0, r.stderr);
  assert.equal(r.json.quotas.kv_host_cache_bytes, 512 * 1024 * 1024);
  assert.equal(r.json.quotas.kv_disk_cache_bytes, 0);
  assert.equal(r.json.quotas.tokens_per_minute, 9000);
  r = cli(['tenants', 'update', 'cli-tenant', '--kv-disk-cache-bytes', '4096']);
  assert.equal(r.json.quotas.kv_disk_cache_bytes, 4096);
  assert.equal(cli(['tenants', 'get', 'cli-tenant']).json.quotas.kv_host_cache_bytes, 512 * 1024 * 1024);

  r = cli(['keys', 'create', 'cli-tenant', '--expires-in', '30d']);
  assert.equal(r.status, 0, r.stderr);
  assert.equal(r.json.expires_at - r.json.created_at, 30 * 86400);
  const key = r.json.key;
  assert.equal((await complete(key)).status, 200);  // the tier caps refuse nothing
  r = cli(['keys', 'list', 'cli-tenant']);
  assert.equal(r.json.data.length, 1);
  assert.ok(!r.stdout.includes(key));

  r = cli(['usage', 'cli-tenant', '--from', twoDaysAgo()]);
  assert.equal(r.status, 0, r.stderr);
  assert.equal(r.json.total.requests, 1);

  r = cli(['keys', 'revoke', key.slice(3, 19)]);
  assert.equal(r.status, 0, r.stderr);
  assert.equal(r.json.status, 'revoked');
  assert.equal((await complete(key)).status, 401);

  r = cli(['audit', '--limit', '2']);
  assert.equal(r.status, 0, r.stderr);
  assert.deepEqual(r.json.data.map((e) => e.action), ['key.revoke', 'key.create']);

  r = cli(['tenants', 'delete', 'cli-tenant']);
  assert.equal(r.status, 0, r.stderr);
  assert.equal(r.json.deleted, true);

  // Errors: the server's message and exit 1; usage mistakes exit 2.
  r = cli(['tenants', 'get', 'cli-tenant']);
  assert.equal(r.status, 1);
  assert.match(r.stderr, /HTTP 404: no tenant 'cli-tenant'/);
  r = cli(['tenants', 'list'], { env: { EDGE_ADMIN_TOKEN: 'wrong-wrong-wrong-wrong' } });
  assert.equal(r.status, 1);
  assert.match(r.stderr, /HTTP 401: Incorrect admin token/);
  r = cli(['tenants', 'list', '--admin-token', ADMIN_TOKEN], { env: { EDGE_ADMIN_TOKEN: '' } });
  assert.equal(r.status, 0, r.stderr);
  r = cli(['tenants', 'list'], { env: { EDGE_ADMIN_TOKEN: '' } });
  assert.equal(r.status, 2);
  assert.match(r.stderr, /no admin token/);
  r = cli(['tenants', 'create', 'x', '--max-concurrent', 'lots']);
  assert.equal(r.status, 2);
  assert.match(r.stderr, /--max-concurrent takes a whole number or "unlimited"/);
  r = cli(['tenants', 'create', 'x', '--kv-host-cache-bytes', '2 lots']);
  assert.equal(r.status, 2);
  assert.match(r.stderr, /--kv-host-cache-bytes takes a size in bytes/);
  r = cli(['tenants', 'create', 'x', '--max-concurrent', '0']);
  assert.equal(r.status, 1);
  assert.match(r.stderr, /HTTP 400: 'quotas.max_concurrent' must be from 1/);
  r = cli(['tenants', 'list'], { url: 'http://127.0.0.1:1' });
  assert.equal(r.status, 1);
  assert.match(r.stderr, /cannot reach http:\/\/127\.0\.0\.1:1/);
});

test('the KV tier caps reach the engine: a tenant capped at 0 keeps nothing in the host tier', async () => {
  // KV memory of a few blocks, so that other prompts push a prompt's blocks out of it, and a host
  // tier below it that keeps them for the tenants allowed to.
  const tiered = await startServer(['--threads', '1', '--kv-cache-memory', '128KiB', '--kv-host-cache-memory', '1MiB',
    '--admin-token', ADMIN_TOKEN]);
  try {
    const url = tiered.url;
    const cachedAfterOthers = async (tenant, quotas) => {
      assert.equal((await admin('POST', '/admin/v1/tenants', { url, body: { id: tenant, quotas } })).status, 201);
      const key = (await admin('POST', `/admin/v1/tenants/${tenant}/keys`, { url, body: {} })).json.key;
      const ask = async (prompt) => {
        const res = await complete(key, { url, prompt, maxTokens: 2 });
        assert.equal(res.status, 200, JSON.stringify(res.json));
        return res.json.usage.prompt_tokens_details.cached_tokens;
      };
      const prompt = 'A big brown dog ran across the yard to catch the yellow frisbee that the boy had thrown over the fence';
      assert.equal(await ask(prompt), 0);
      for (let i = 1; i <= 6; i++) {
        await ask(`Story number ${i}: the little bird flew over the hills and the valleys to find a warm nest before winter`);
      }
      return ask(prompt);
    };
    assert.ok(await cachedAfterOthers('tier-kept', { kv_host_cache_bytes: 512 * 1024 }) > 0,
      'an evicted prompt comes back from the host tier');
    assert.equal(await cachedAfterOthers('tier-none', { kv_host_cache_bytes: 0 }), 0);
  } finally {
    await tiered.stop();
  }
});

test('without --admin-token the admin API is disabled, with a clear 403', async () => {
  const plain = await startServer(['--threads', '1', '--kv-cache-memory', '64MiB'], { waitReady: false });
  try {
    const res = await fetch(`${plain.url}/admin/v1/tenants`, { headers: { authorization: `Bearer ${ADMIN_TOKEN}` } });
    assert.equal(res.status, 403);
    const body = await res.json();
    assert.equal(body.error.code, 'admin_api_disabled');
    assert.match(body.error.message, /--admin-token/);
  } finally {
    await plain.stop();
  }
});

test('a short admin token is refused at start', () => {
  const r = spawnSync(edgeinferBin, ['serve', '--port', '0', '--state-dir', makeStateDir(), '--admin-token', 'short'], {
    encoding: 'utf8', timeout: 20000,
  });
  assert.equal(r.status, 2);
  assert.match(r.stderr, /--admin-token must be at least 16 characters/);
});

test('a second server cannot use the same state folder', () => {
  const r = spawnSync(edgeinferBin, ['serve', '--port', '0', '--state-dir', stateDir], { encoding: 'utf8', timeout: 20000 });
  assert.equal(r.status, 1);
  assert.match(r.stderr, /in use by another edgeinfer process/);
});

test('a restart keeps tenants, keys, usage (of a stream running at SIGTERM too) and audit; no new default key', async () => {
  await admin('POST', '/admin/v1/tenants', { body: { id: 'durable', quotas: { tokens_per_minute: 50000 } } });
  const key = (await admin('POST', '/admin/v1/tenants/durable/keys', { body: {} })).json.key;
  const served = await complete(key);
  assert.equal(served.status, 200);
  const auditBefore = (await admin('GET', '/admin/v1/audit?limit=1000')).json.data.length;

  // A stream is running when SIGTERM comes: it is let finish, and its usage is written when the
  // server stops (well within the ledger's one-second flush interval).
  const res = await fetch(`${server.url}/v1/completions`, {
    method: 'POST',
    headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
    body: JSON.stringify({ prompt: 'Once upon a time', max_tokens: 200, ignore_eos: true, stream: true,
      stream_options: { include_usage: true } }),
  });
  assert.equal(res.status, 200);
  const reader = res.body.getReader();
  const decoder = new TextDecoder();
  let text = decoder.decode((await reader.read()).value);
  const stopped = server.stop('SIGTERM');
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    text += decoder.decode(value);
  }
  assert.equal((await stopped).code, 0);
  assert.match(text, /data: \[DONE\]/);
  const streamed = text.split('\n\n').filter((e) => e.startsWith('data: {'))
    .map((e) => JSON.parse(e.slice(6))).find((chunk) => chunk.usage)?.usage;
  assert.equal(streamed?.completion_tokens, 200);

  server = await startServer(['--threads', '2', '--kv-cache-memory', '64MiB', '--admin-token', ADMIN_TOKEN, '--state-dir', stateDir]);
  assert.equal(server.defaultKey, undefined);
  assert.equal((await admin('GET', '/admin/v1/tenants/durable')).json.quotas.tokens_per_minute, 50000);
  const again = await complete(key);
  assert.equal(again.status, 200);
  const usage = await admin('GET', `/admin/v1/tenants/durable/usage?from=${encodeURIComponent(twoDaysAgo())}`);
  assert.equal(usage.json.total.requests, 3);
  assert.equal(usage.json.total.prompt_tokens,
    served.json.usage.prompt_tokens + streamed.prompt_tokens + again.json.usage.prompt_tokens);
  assert.equal(usage.json.total.completion_tokens,
    served.json.usage.completion_tokens + streamed.completion_tokens + again.json.usage.completion_tokens);
  assert.equal((await admin('GET', '/admin/v1/audit?limit=1000')).json.data.length, auditBefore);
});
