// The tenancy side of the gateway under faults: a kill -9 mid-stream loses at most the last
// second of usage and never hands out a daily budget twice; a stalled Redis slows no tenant that
// does not use it and leaves nothing held when it resumes; cheap limits come before the body is
// parsed; a missing max_tokens is capped by the tenant's limits instead of refused.
//
// Latency assertions compare with a baseline measured in the same test, by a stated factor or
// a stated slack, whichever allows more (latencyWithin).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { adminCall, makeSlowModel, makeStateDir, sleep, startServer } from './lib/server.mjs';
import { metric, requiredMetric } from './lib/metrics.mjs';
import { startRedis } from './lib/redis.mjs';

const ADMIN_TOKEN = 'test-admin-token-0123456789';

function admin(server, method, route, body) {
  return adminCall(server, ADMIN_TOKEN, method, route, body);
}

async function tenantWithKey(server, id, quotas = {}) {
  await admin(server, 'POST', '/admin/v1/tenants', { id, quotas });
  return (await admin(server, 'POST', `/admin/v1/tenants/${id}/keys`, {})).key;
}

function post(server, key, route, body, signal) {
  return fetch(`${server.url}${route}`, {
    method: 'POST',
    headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
    body: typeof body === 'string' ? body : JSON.stringify(body),
    signal,
  });
}

// A streamed completion read to its end: the number of data events, whether it ended with
// [DONE], and any error event.
async function stream(server, key, body) {
  const started = Date.now();
  const res = await post(server, key, '/v1/completions', { ...body, stream: true });
  const out = { status: res.status, events: 0, done: false, error: undefined };
  if (res.status !== 200) {
    out.json = await res.json();
    return out;
  }
  const decoder = new TextDecoder();
  let buffer = '';
  try {
    for await (const chunk of res.body) {
      buffer += decoder.decode(chunk, { stream: true });
      for (let end = buffer.indexOf('\n\n'); end >= 0; end = buffer.indexOf('\n\n')) {
        const event = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        if (!event.startsWith('data: ')) continue;
        const data = event.slice(6);
        if (data === '[DONE]') out.done = true;
        else if (JSON.parse(data).error) out.error = JSON.parse(data).error;
        else out.events++;
      }
    }
  } catch (e) {
    out.cut = e.message;
  }
  out.seconds = (Date.now() - started) / 1000;
  return out;
}

const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

// Whether `during` (seconds) stays within `factor` times `alone`, or within a second more than
// it: a baseline of tens of milliseconds is within the scheduling noise of a shared 2-core
// machine running other tests and builds (a 0.065 s stream took 0.5 s beside a build), while
// the defects these tests catch cost seconds (a stalled Redis turned 1.9 s into 26.7 s; parsing
// refused 3.8 MB bodies, 0.5 s into 4.3 s).
const latencySlackSeconds = 1.0;
const latencyWithin = (during, alone, factor) => during <= Math.max(factor * alone, alone + latencySlackSeconds);

test('kill -9 mid-stream: the ledger has what was served up to the last second; the daily budget is not handed out twice', async () => {
  // Two streams still running when the server is killed.
  const model = makeSlowModel();
  const stateDir = makeStateDir();
  const args = ['--model', model, '--state-dir', stateDir, '--admin-token', ADMIN_TOKEN, '--max-model-len', '4096',
    '--kv-cache-memory', '256MiB'];
  const first = await startServer(args);
  const budget = 5000;
  const key = await tenantWithKey(first, 'crashy', { daily_tokens: budget });
  const asked = { prompt: 'Once upon a time', max_tokens: 2000, ignore_eos: true, temperature: 0 };
  const streams = [stream(first, key, asked), stream(first, key, asked)];

  // Generated before `checkpointed` was read, a second and a half before the kill: in the ledger.
  const deadline = Date.now() + 60000;
  while (!((await metric(first, 'edgeinfer_generation_tokens_total')) >= 4)) {
    assert.ok(Date.now() < deadline, `no tokens generated:\n${first.log}`);
    await sleep(100);
  }
  const checkpointed = await requiredMetric(first, 'edgeinfer_generation_tokens_total');
  await sleep(1500);
  const beforeKill = await requiredMetric(first, 'edgeinfer_generation_tokens_total');
  await first.stop('SIGKILL');
  const cut = await Promise.all(streams);
  for (const s of cut) {
    assert.equal(s.status, 200);
    assert.equal(s.done, false, 'a stream cut by the crash must not look complete');
  }

  const second = await startServer(args);
  try {
    const usage = await admin(second, 'GET', '/admin/v1/tenants/crashy/usage');
    const ledgered = usage.total.completion_tokens;
    console.log(`kill -9: generated ${checkpointed} tokens 1.5 s before the kill and ${beforeKill} by the kill; ` +
      `the ledger has ${ledgered} (${usage.total.requests} requests, ${usage.total.prompt_tokens} prompt tokens)`);
    assert.equal(usage.total.requests, 2);
    assert.ok(ledgered >= checkpointed, `ledger ${ledgered} < ${checkpointed} generated more than a second before the kill`);
    assert.ok(ledgered <= beforeKill + 2, `ledger ${ledgered} > ${beforeKill} generated`);

    // Both reservations (prompt + 2000 each) count as spent today: what is left is less than
    // 1000, whatever the crashed streams had used.
    const prompt = usage.total.prompt_tokens / 2;
    const left = budget - 2 * (prompt + 2000);
    const refused = await post(second, key, '/v1/completions', { prompt: 'Once upon a time', max_tokens: left - prompt + 1 });
    assert.equal(refused.status, 429, JSON.stringify(await refused.json()));
    // Admitted (its stream begins), then left: generating all of it would take minutes here.
    const leaving = new AbortController();
    const served = await post(second, key, '/v1/completions',
      { prompt: 'Once upon a time', max_tokens: left - prompt, stream: true }, leaving.signal);
    assert.equal(served.status, 200);
    leaving.abort();
    assert.match(second.log, /tenant crashy: \d+ tokens of today's budget were reserved by requests cut short by a crash/);
  } finally {
    await second.stop();
  }
});

test('a request without max_tokens gets what the tenant may use, not a refusal', async () => {
  const server = await startServer(['--admin-token', ADMIN_TOKEN]);
  try {
    const short = await tenantWithKey(server, 'short', { max_tokens_per_request: 100 });
    const chat = { messages: [{ role: 'user', content: 'Tell me a story' }], ignore_eos: true };
    let res = await post(server, short, '/v1/chat/completions', chat);
    let json = await res.json();
    assert.equal(res.status, 200, JSON.stringify(json));
    assert.equal(json.usage.completion_tokens, 100);
    assert.equal(json.choices[0].finish_reason, 'length');

    const perMinute = await tenantWithKey(server, 'per-minute', { tokens_per_minute: 300 });
    res = await post(server, perMinute, '/v1/chat/completions', chat);
    json = await res.json();
    assert.equal(res.status, 200, JSON.stringify(json));
    assert.equal(json.usage.total_tokens, 300);
    // The bucket is spent now: the next one waits for it, and is told how long.
    res = await post(server, perMinute, '/v1/chat/completions', chat);
    assert.equal(res.status, 429);
    assert.ok(Number(res.headers.get('retry-after')) >= 1);
  } finally {
    await server.stop();
  }
});

test('requests per minute are judged before the body is parsed; a refused body still counts', async () => {
  const server = await startServer(['--admin-token', ADMIN_TOKEN, '--max-body', '4MiB']);
  try {
    const limited = await tenantWithKey(server, 'one-a-minute', { requests_per_minute: 1 });
    const other = await tenantWithKey(server, 'bystander');
    const huge = JSON.stringify({ prompt: 'Once upon a time '.repeat(230000), max_tokens: 4 });  // about 3.8 MB
    assert.ok(huge.length > 3.8e6 && huge.length < 4 * 1024 * 1024);

    // The first is admitted, read and refused for its length; it is the minute's one request.
    let res = await post(server, limited, '/v1/completions', huge);
    assert.equal(res.status, 400);
    assert.equal((await res.json()).error.code, 'context_length_exceeded');
    res = await post(server, limited, '/v1/completions', '{"prompt": "valid", "max_tokens": 1}');
    assert.equal(res.status, 429);
    assert.equal((await res.json()).error.type, 'requests');

    const asked = { prompt: 'Once upon a time', max_tokens: 200, ignore_eos: true };
    const alone = [];
    for (let i = 0; i < 3; ++i) alone.push((await stream(server, other, asked)).seconds);
    const during = [];
    const flood = Array.from({ length: 4 }, async () => {
      const statuses = [];
      for (let i = 0; i < 3; ++i) {
        const r = await post(server, limited, '/v1/completions', huge);
        await r.arrayBuffer();
        statuses.push(r.status);
      }
      return statuses;
    });
    for (let i = 0; i < 3; ++i) during.push((await stream(server, other, asked)).seconds);
    const refused = (await Promise.all(flood)).flat();
    assert.deepEqual([...new Set(refused)], [429]);
    // The baseline again after the flood, so that load from outside the test that came or went
    // meanwhile weighs on both sides. Reading 46 MB of refused bodies off loopback costs some
    // CPU on 2 busy cores (past ×3 under a load of 5); parsing them cost ×8.6.
    for (let i = 0; i < 2; ++i) alone.push((await stream(server, other, asked)).seconds);
    const factor = median(during) / median(alone);
    console.log(`a bystander's 200-token stream: ${median(alone).toFixed(3)} s alone, ${median(during).toFixed(3)} s ` +
      `while a limited tenant sends 3.8 MB bodies (×${factor.toFixed(2)})`);
    assert.ok(latencyWithin(median(during), median(alone), 5), `the bystander slowed ×${factor.toFixed(2)}`);

    const usage = await admin(server, 'GET', '/admin/v1/tenants/one-a-minute/usage');
    assert.equal(usage.total.rejections, 13);
  } finally {
    await server.stop();
  }
});

test('a stalled Redis slows no tenant that does not use it, and holds nothing once it resumes', async () => {
  const redis = await startRedis();
  const server = await startServer(['--admin-token', ADMIN_TOKEN, '--http-threads', '2',
    '--quota-store', `redis://127.0.0.1:${redis.port}/0`, '--quota-store-timeout', '100ms', '--quota-fail-mode', 'open']);
  try {
    // Limits the 8 clients below never reach, so that the engine serves the same load in both
    // phases (fail-open serves every request during the stall).
    const clients = 8;
    const limited = await tenantWithKey(server, 'redis-limited', { requests_per_minute: 100000,
      max_concurrent: clients, daily_tokens: 1000000 });
    const free = await tenantWithKey(server, 'redis-free');
    // The free tenant's stream times while the limited one sends requests from 8 clients: the
    // same load with Redis answering, then with Redis stopped.
    const asked = { prompt: 'Once upon a time', max_tokens: 400, ignore_eos: true };
    const underLoad = async () => {
      let running = true;
      const hammer = Array.from({ length: clients }, async () => {
        const statuses = [];
        while (running) {
          const r = await post(server, limited, '/v1/completions', { prompt: 'Once upon a time', max_tokens: 8 });
          await r.arrayBuffer();
          statuses.push(r.status);
        }
        return statuses;
      });
      const seconds = [];
      for (let i = 0; i < 5; ++i) seconds.push((await stream(server, free, asked)).seconds);
      running = false;
      return { seconds: median(seconds), statuses: (await Promise.all(hammer)).flat() };
    };
    const answering = await underLoad();
    redis.pause();
    const stalledRun = await underLoad();
    redis.resume();
    const alone = [answering.seconds];
    const during = [stalledRun.seconds];
    const statuses = stalledRun.statuses;

    const factor = median(during) / median(alone);
    console.log(`Redis stopped: a tenant without Redis limits streamed 400 tokens in ${median(alone).toFixed(3)} s ` +
      `before, ${median(during).toFixed(3)} s during the stall (×${factor.toFixed(2)}); ${statuses.length} requests of ` +
      `a Redis-limited tenant meanwhile (${statuses.filter((s) => s === 200).length} served uncounted)`);
    assert.ok(latencyWithin(median(during), median(alone), 2), `×${factor.toFixed(2)}`);

    // Once Redis answers, what the stalled calls took is given back: no slot is held by a
    // request that is not running, and the day's count is what the counted requests used.
    const cli = (...args) => spawnSync('redis-cli', ['-p', String(redis.port), ...args], { encoding: 'utf8' }).stdout.trim();
    const deadline = Date.now() + 10000;
    while (cli('ZCARD', 'edgeinfer:quota:{redis-limited}:slots') !== '0') {
      assert.ok(Date.now() < deadline, `slots still held: ${cli('ZRANGE', 'edgeinfer:quota:{redis-limited}:slots', '0', '-1')}`);
      await sleep(100);
    }
    const all = await Promise.all(Array.from({ length: clients },
      () => stream(server, limited, { prompt: 'Once upon a time', max_tokens: 50, ignore_eos: true })));
    assert.deepEqual(all.map((s) => s.status), Array(clients).fill(200));
  } finally {
    redis.resume();
    await server.stop();
    await redis.stop();
  }
});

test('a client that leaves mid-stream is charged what the engine generated for it, not what it read', async () => {
  const server = await startServer(['--admin-token', ADMIN_TOKEN]);
  try {
    const key = await tenantWithKey(server, 'leaver');
    const before = await metric(server, 'edgeinfer_generation_tokens_total');
    const leaving = new AbortController();
    const res = await post(server, key, '/v1/completions',
      { prompt: 'Once upon a time', max_tokens: 400, ignore_eos: true, stream: true }, leaving.signal);
    assert.equal(res.status, 200);
    const reader = res.body.getReader();
    await reader.read();  // the first event, then gone
    leaving.abort();
    // The engine notices at its next step; everything it generated until then is charged.
    const deadline = Date.now() + 10000;
    for (;;) {
      const generated = (await requiredMetric(server, 'edgeinfer_generation_tokens_total')) - before;
      const usage = await admin(server, 'GET', '/admin/v1/tenants/leaver/usage');
      if (usage.total.requests === 1 && usage.total.completion_tokens === generated &&
          (await requiredMetric(server, 'edgeinfer_num_requests_running')) === 0) {
        assert.ok(generated < 400, `generated ${generated}: the request was not cancelled`);
        break;
      }
      assert.ok(Date.now() < deadline, `charged ${usage.total.completion_tokens} of ${generated} generated`);
      await sleep(50);
    }
  } finally {
    await server.stop();
  }
});
