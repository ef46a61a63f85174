// The split topology: two `edgeinfer backend` processes (stories260K, one compute thread each)
// behind one `edgeinfer gateway`, over real HTTP on loopback, with the official `openai` SDK as
// the client:
//   1. load spreads by KV usage: idle backends share requests; a backend whose small KV cache
//      is full gets fewer of them;
//   2. a backend killed (SIGKILL) mid-run: the stream that was generating on it ends with a
//      clear error (no hang), requests that had not started there are placed on the other one
//      and succeed, and new requests go to the survivor;
//   3. requests sharing a long prefix land on the backend that caches it (its prefix-cache hit
//      rate is reported);
//   4. a client that drops its stream frees the backend's request (running back to 0, the
//      request counted as aborted);
//   5. usage figures a backend reports outside what the gateway sent, relayed and asked for are
//      corrected before they are charged (a proxy rewrites a real backend's figures);
//   6. chaos: a backend killed with SIGKILL mid-stream: its client gets an error event, the
//      ledger charges what the client received, the backend is marked down and the next
//      requests go to the other one, all within stated bounds;
//   7. session affinity: requests naming a session (x-session-affinity, prompt_cache_key) stay on
//      one backend; the backend of some sessions killed (SIGKILL) and restarted: their requests
//      keep succeeding on the other one meanwhile and come back, the other sessions never move;
//      and a backend's stream never holds events it has until its heartbeat;
// Where an outcome would otherwise depend on how fast stories260K generates, the backends are
// frozen (SIGSTOP) while the test sets the situation up, and let go (SIGCONT) to play it out.
// plus the internal API's token (given, or made on a backend's first start) and wire format,
// the gateway's model check and bad --backend values.
import { test, before, after, describe } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { spawnSync } from 'node:child_process';
import OpenAI from 'openai';
import { startServer, sleep, waitFor as waitWithin, edgeinferBin, makeStateDir } from './lib/server.mjs';
import { metric, requiredMetric, requiredSeriesValue, scrape, seriesValue as value } from './lib/metrics.mjs';

const models = process.env.EDGE_TEST_MODELS ?? path.resolve('../shared/models');
const storiesGguf = path.join(models, 'stories260K', 'stories260K.gguf');
const TOKEN = 'internal-token-0123456789';
// Prompts the tests send: stories260K writes children's stories.
const shortPrompt = 'Once upon a time';

// Starts a backend with `backendArgs` (on `port`, else a free port).
function startBackend(backendArgs = [], port = 0) {
  return startServer(['--model', storiesGguf, '--threads', '1', '--internal-token', TOKEN, '--http-threads', '1',
    ...backendArgs], { command: 'backend', port });
}

// Starts backends (each with `backendArgs`) and a gateway in front of them.
async function startCluster({ backends = 2, backendArgs = [], gatewayArgs = [] } = {}) {
  const started = [];
  for (let i = 0; i < backends; i++) started.push(await startBackend(backendArgs));
  const gateway = await startServer(['--model', storiesGguf, '--internal-token', TOKEN, '--http-threads', '2',
    '--backend-poll-interval', '100ms', ...started.flatMap((b) => ['--backend', b.url]), ...gatewayArgs],
  { command: 'gateway' });
  // The gateway is ready with one backend up; the tests start from all of them (a slow build,
  // under the sanitizers, verifies the second well after the first).
  await waitWithin('every backend up at the gateway', async () => {
    const text = await scrape(gateway);
    return started.every((b) => value(text, 'edgeinfer_backend_up', { backend: b.url }) === 1);
  }, { timeoutMs: 60000 });
  const client = new OpenAI({ baseURL: `${gateway.url}/v1`, apiKey: gateway.defaultKey, maxRetries: 0 });
  return {
    backends: started,
    gateway,
    client,
    stop: async () => { await Promise.all([gateway, ...started].map((s) => s.stop())); },
  };
}

// The gateway's count of requests each backend accepted.
async function acceptedPerBackend(cluster) {
  const text = await scrape(cluster.gateway);
  return cluster.backends.map((b) => requiredSeriesValue(text, 'edgeinfer_backend_requests_total', { backend: b.url }));
}

// Sends `n` short requests through the gateway: every one succeeds, and backend `only` takes them all.
async function allServedBy(cluster, only, n = 6) {
  const before = await acceptedPerBackend(cluster);
  for (let i = 0; i < n; i++) {
    const done = await cluster.client.completions.create({ model: 'stories260K', prompt: shortPrompt, max_tokens: 8 });
    assert.equal(done.choices[0].finish_reason, 'length');
  }
  const after = await acceptedPerBackend(cluster);
  assert.deepEqual(after.map((count, i) => count - before[i]), cluster.backends.map((_, i) => (i === only ? n : 0)));
}

async function load(backend) {
  const res = await fetch(`${backend.url}/internal/v1/load`, { headers: { authorization: `Bearer ${TOKEN}` } });
  assert.equal(res.status, 200);
  return res.json();
}

// Waits in this file allow 60 s unless they say otherwise (lib's default is 30 s): the cluster's
// backends compute with one thread each.
function waitFor(what, check, { timeoutMs = 60000 } = {}) {
  return waitWithin(what, check, { timeoutMs });
}

// A long streamed completion (ignore_eos keeps it generating) with its progress on record.
function longStream(client, { maxTokens, prompt = shortPrompt }) {
  const controller = new AbortController();
  const record = { deltas: 0, error: null, finishReason: null, controller };
  record.done = (async () => {
    try {
      const stream = await client.completions.create(
        { model: 'stories260K', prompt, max_tokens: maxTokens, temperature: 0.8, stream: true, ignore_eos: true },
        { signal: controller.signal });
      for await (const chunk of stream) {
        if (chunk.choices[0]?.text) record.deltas++;
        if (chunk.choices[0]?.finish_reason) record.finishReason = chunk.choices[0].finish_reason;
      }
    } catch (error) {
      record.error = error;
    }
  })();
  return record;
}

describe('load, KV usage and cancellation', () => {
  // A small KV cache (153 blocks, 2448 tokens of stories260K in f32) and reserve admission: a
  // request holds the blocks for its whole output from admission on, so one long request fills
  // most of a backend and the next ones queue.
  let cluster;
  before(async () => {
    cluster = await startCluster({ backendArgs: ['--kv-cache-memory', '3MiB', '--admission', 'reserve'] });
  });
  after(async () => { await cluster?.stop(); });

  test('idle backends share the requests', async () => {
    const before = await acceptedPerBackend(cluster);
    await Promise.all(Array.from({ length: 8 }, () => cluster.client.completions.create(
      { model: 'stories260K', prompt: shortPrompt, max_tokens: 32, temperature: 0 })));
    const after = await acceptedPerBackend(cluster);
    const served = after.map((n, i) => n - before[i]);
    console.log(`8 concurrent requests on idle backends: ${served.join(' / ')}`);
    assert.equal(served[0] + served[1], 8);
    assert.ok(served[0] > 0 && served[1] > 0, `both backends serve: ${served}`);
  });

  test('a list of prompts is answered through the gateway as each prompt alone, its requests spread over backends', async () => {
    const prompts = ['Once upon a time', 'The dog', 'Lily saw a big', 'A cat'];
    const alone = [];
    for (const prompt of prompts) {
      alone.push((await cluster.client.completions.create({ model: 'stories260K', prompt, max_tokens: 10, temperature: 0 }))
        .choices[0].text);
    }
    const before = await acceptedPerBackend(cluster);
    const batch = await cluster.client.completions.create({ model: 'stories260K', prompt: prompts, max_tokens: 10, temperature: 0 });
    assert.deepEqual(batch.choices.map((c) => [c.index, c.text]), alone.map((text, i) => [i, text]));
    const after = await acceptedPerBackend(cluster);
    assert.equal(after.reduce((a, b) => a + b, 0) - before.reduce((a, b) => a + b, 0), prompts.length);
  });

  test('a backend whose KV cache is full gets fewer requests', async () => {
    const [full] = cluster.backends;
    // Fill the first backend directly (not through the gateway, so only its load report can tell).
    const fillers = Array.from({ length: 12 }, () => {
      const controller = new AbortController();
      const done = fetch(`${full.url}/internal/v1/generate`, {
        method: 'POST',
        headers: { authorization: `Bearer ${TOKEN}`, 'content-type': 'application/json' },
        body: JSON.stringify({ prompt: [1, 400, 300, 200], max_tokens: 2000, ignore_eos: true, tenant: 'filler' }),
        signal: controller.signal,
      }).then(async (res) => { for await (const chunk of res.body) void chunk; }).catch(() => {});
      return { controller, done };
    });
    try {
      await waitFor('the full backend to report its KV cache used and a queue', async () => {
        const l = await load(full);
        return l.kv_usage_ratio > 0.8 && l.waiting > 0;
      });
      // The gateway has read that report once its gauge shows it.
      await waitFor('the gateway to see the full backend', async () =>
        (await metric(cluster.gateway, 'edgeinfer_backend_kv_cache_usage_ratio', { backend: full.url })) > 0.8);
      const before = await acceptedPerBackend(cluster);
      for (let i = 0; i < 6; i++) {
        await cluster.client.completions.create({ model: 'stories260K', prompt: shortPrompt, max_tokens: 16, temperature: 0 });
      }
      const after = await acceptedPerBackend(cluster);
      const toFull = after[0] - before[0];
      const toFree = after[1] - before[1];
      console.log(`6 requests while backend 1 is full (KV ${(await load(full)).kv_usage_ratio.toFixed(2)}): full ${toFull}, free ${toFree}`);
      assert.equal(toFull + toFree, 6);
      assert.ok(toFree > toFull, `the free backend gets more: full ${toFull}, free ${toFree}`);
    } finally {
      for (const f of fillers) f.controller.abort();
      await Promise.all(fillers.map((f) => f.done));
    }
    // Dropping the direct streams cancelled them on the backend.
    await waitFor('the filled backend to be idle again', async () => (await load(full)).in_flight === 0);
  });

  test('a client that drops its stream frees the request on the backend', async () => {
    const aborts = async () => (await Promise.all(cluster.backends.map(async (b) =>
      metric(b, 'edgeinfer_request_success_total', { finished_reason: 'abort' })))).reduce((x, y) => x + y);
    const abortedBefore = await aborts();
    // One long stream per backend (the gateway spreads them), both generating.
    const streams = Array.from({ length: 2 }, () => longStream(cluster.client, { maxTokens: 1000 }));
    await waitFor('both streams to produce text', () => streams.every((s) => s.deltas > 0 || s.error));
    for (const s of streams) assert.equal(s.error, null, String(s.error));
    // Freeze the backends, so that the outcome does not depend on how fast they generate: the
    // requests cannot finish while the clients leave.
    for (const b of cluster.backends) b.child.kill('SIGSTOP');
    try {
      for (const s of streams) s.controller.abort();
      await Promise.all(streams.map((s) => s.done));
      // The gateway has closed its connections to the backends.
      await waitFor('the gateway to drop the requests', async () => {
        const text = await scrape(cluster.gateway);
        return cluster.backends.every((b) => requiredSeriesValue(text, 'edgeinfer_backend_in_flight', { backend: b.url }) === 0);
      });
    } finally {
      for (const b of cluster.backends) b.child.kill('SIGCONT');
    }
    await waitFor('both backends to run nothing', async () => {
      const loads = await Promise.all(cluster.backends.map(load));
      return loads.every((l) => l.running === 0 && l.in_flight === 0);
    });
    // Each dropped stream ended as aborted in its backend's engine, not by running to its length.
    assert.equal(await aborts() - abortedBefore, 2);
  });
});

describe('prefix affinity', () => {
  let cluster;
  before(async () => { cluster = await startCluster({ backendArgs: ['--kv-cache-memory', '16MiB'] }); });
  after(async () => { await cluster?.stop(); });

  test('requests sharing a long prefix land on the backend that caches it', async () => {
    // About 150 tokens in common, then a different ending per request.
    const prefix = 'Once upon a time, there was a little girl named Lily. She loved to play outside in the park. '
      + 'One day, she saw a big, red ball. She wanted to play with it, but it was too high. Lily asked her mom '
      + 'to help her. Her mom smiled and said yes. They played with the ball all day long and had lots of fun. '
      + 'The sun was warm and the birds sang in the trees. ';
    const endings = ['Tom came to play.', 'A dog ran by.', 'The cat was sleepy.', 'It began to rain.',
      'Lily found a shell.', 'Ben had a kite.', 'The sky was blue.', 'A frog jumped high.'];
    const loadsBefore = await Promise.all(cluster.backends.map(load));
    const before = await acceptedPerBackend(cluster);
    for (const ending of endings) {
      await cluster.client.completions.create({ model: 'stories260K', prompt: prefix + ending, max_tokens: 8, temperature: 0 });
    }
    const after = await acceptedPerBackend(cluster);
    const served = after.map((n, i) => n - before[i]);
    const loadsAfter = await Promise.all(cluster.backends.map(load));
    const queries = loadsAfter.map((l, i) => l.prefix_cache.queries - loadsBefore[i].prefix_cache.queries);
    const hits = loadsAfter.map((l, i) => l.prefix_cache.hits - loadsBefore[i].prefix_cache.hits);
    const owner = served[0] >= served[1] ? 0 : 1;
    const rate = hits[owner] / queries[owner];
    console.log(`prefix affinity: requests per backend ${served.join(' / ')}; prefix-cache hit rate on the `
      + `owner ${(100 * rate).toFixed(1)}% (${hits[owner]} of ${queries[owner]} prompt tokens)`);
    // Every request went to one backend, which served the shared blocks from its cache.
    assert.deepEqual([...served].sort(), [0, endings.length]);
    assert.equal(queries[1 - owner], 0);
    assert.ok(hits[owner] > 0);
    assert.ok(rate > 0.5, `most prompt tokens come from the cache: ${rate}`);
    assert.equal(await metric(cluster.gateway, 'edgeinfer_backend_routes_total', { reason: 'affinity' }), endings.length - 1);
  });
});

describe('session affinity', () => {
  let cluster;
  // A long heartbeat and a short stream timeout: a stream that waited for its heartbeat to send
  // events it already had would fail (and be retried) instead of only being late.
  const backendArgs = ['--heartbeat', '60s'];
  // A short ejection: the killed backend is tried again soon after it is back.
  before(async () => {
    cluster = await startCluster({ backendArgs, gatewayArgs: ['--eject-time', '200ms', '--backend-stream-timeout', '5s'] });
  });
  after(async () => { await cluster?.stop(); });

  // Sends one completion (one at a time, so the gateway's counts tell where it went): it must
  // succeed; resolves with the index of the backend that served it.
  async function servedBy({ header, cacheKey }) {
    const before = await acceptedPerBackend(cluster);
    const body = { model: 'stories260K', prompt: shortPrompt, max_tokens: 4 };
    if (cacheKey !== undefined) body.prompt_cache_key = cacheKey;
    const headers = header === undefined ? {} : { 'x-session-affinity': header };
    const done = await cluster.client.completions.create(body, { headers });
    assert.equal(done.choices[0].finish_reason, 'length');
    const after = await acceptedPerBackend(cluster);
    const moved = after.map((n, i) => n - before[i]);
    assert.equal(moved.reduce((a, b) => a + b, 0), 1, `one backend accepted it: ${moved}`);
    return moved.indexOf(1);
  }

  // Where each session's requests go now (two requests each: both to the same backend).
  async function placements(sessions) {
    const out = [];
    for (const session of sessions) {
      const first = await servedBy({ header: session });
      assert.equal(await servedBy({ header: session }), first, `session ${session} stays on one backend`);
      out.push(first);
    }
    return out;
  }

  test('a session\'s requests stay on one backend; the header wins over prompt_cache_key', async () => {
    const sessions = Array.from({ length: 8 }, (_, i) => `agent-run-${i}`);
    const placed = await placements(sessions);
    console.log(`session affinity: 8 sessions per backend ${[0, 1].map((b) => placed.filter((p) => p === b).length).join(' / ')}`);
    assert.ok(placed.includes(0) && placed.includes(1), `sessions spread over both backends: ${placed}`);
    // The body's key is the same session as the header's.
    for (let i = 0; i < 2; i++) assert.equal(await servedBy({ cacheKey: sessions[i] }), placed[i]);
    // Both given: the header's session decides.
    const a = placed.indexOf(0);
    const b = placed.indexOf(1);
    assert.equal(await servedBy({ header: sessions[a], cacheKey: sessions[b] }), 0);
    assert.equal(await servedBy({ header: sessions[b], cacheKey: sessions[a] }), 1);
    assert.ok(await metric(cluster.gateway, 'edgeinfer_backend_routes_total', { reason: 'session' }) >= 20);
  });

  test('a killed backend\'s sessions move to the other one and come back; the others never move', async () => {
    const sessions = Array.from({ length: 8 }, (_, i) => `agent-run-${i}`);
    const placed = await placements(sessions);
    const victim = placed[0];
    const survivor = 1 - victim;
    const { port } = cluster.backends[victim];
    cluster.backends[victim].child.kill('SIGKILL');
    await cluster.backends[victim].exited;

    // Right away, before the gateway's next poll notices: every request succeeds, on the survivor.
    for (const session of sessions) assert.equal(await servedBy({ header: session }), survivor, `session ${session}`);

    cluster.backends[victim] = await startBackend(backendArgs, port);
    const url = cluster.backends[victim].url;
    await waitFor('the restarted backend to be up', async () =>
      (await metric(cluster.gateway, 'edgeinfer_backend_up', { backend: url })) === 1);
    assert.deepEqual(await placements(sessions), placed, 'every session is back where it was');
  });

  test('a backend sends events as they come, never holding them until its heartbeat', async () => {
    // Events that reach a backend's stream while it writes the previous ones must not wait for
    // the next wake-up: here that would be the 60 s heartbeat, past the gateway's 5 s timeout.
    for (let i = 0; i < 150; i++) {
      const done = await cluster.client.completions.create({ model: 'stories260K', prompt: shortPrompt, max_tokens: 4 },
        { headers: { 'x-session-affinity': 'steady' } });
      assert.equal(done.choices[0].finish_reason, 'length');
    }
    const text = await scrape(cluster.gateway);
    assert.equal(value(text, 'edgeinfer_backend_retries_total', { reason: 'stream' }), 0, 'no stream was silent for 5 s');
  });

  test('a bad session header is a 400 in each API\'s own shape', async () => {
    const long = 'k'.repeat(257);
    const chat = await fetch(`${cluster.gateway.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { authorization: `Bearer ${cluster.gateway.defaultKey}`, 'content-type': 'application/json', 'x-session-affinity': long },
      body: JSON.stringify({ model: 'stories260K', messages: [{ role: 'user', content: 'hi' }], max_tokens: 4 }),
    });
    assert.equal(chat.status, 400);
    const chatError = (await chat.json()).error;
    assert.equal(chatError.type, 'invalid_request_error');
    assert.equal(chatError.param, 'x-session-affinity');
    assert.match(chatError.message, /x-session-affinity header must be a non-empty string of at most 256 bytes/);

    const messages = await fetch(`${cluster.gateway.url}/v1/messages`, {
      method: 'POST',
      headers: { 'x-api-key': cluster.gateway.defaultKey, 'content-type': 'application/json', 'x-session-affinity': '' },
      body: JSON.stringify({ model: 'stories260K', messages: [{ role: 'user', content: 'hi' }], max_tokens: 4 }),
    });
    assert.equal(messages.status, 400);
    const anthropic = await messages.json();
    assert.equal(anthropic.type, 'error');
    assert.equal(anthropic.error.type, 'invalid_request_error');
    assert.match(anthropic.error.message, /x-session-affinity header must be a non-empty string/);

    // The body's key in a wrong shape: the same kind of 400, naming the field.
    const responses = await fetch(`${cluster.gateway.url}/v1/responses`, {
      method: 'POST',
      headers: { authorization: `Bearer ${cluster.gateway.defaultKey}`, 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'stories260K', input: 'hi', max_output_tokens: 4, prompt_cache_key: ['a'] }),
    });
    assert.equal(responses.status, 400);
    assert.equal((await responses.json()).error.param, 'prompt_cache_key');
  });
});

describe('a backend with a full queue', () => {
  let cluster;
  before(async () => {
    cluster = await startCluster({ backends: 1,
      backendArgs: ['--kv-cache-memory', '16MiB', '--max-num-seqs', '1', '--max-queued-requests', '1'] });
  });
  after(async () => { await cluster?.stop(); });

  test('refusals of a full queue are 503s, and the backend is not ejected for them', async () => {
    // One request runs, one waits, the rest of a burst of 20 find the queue full.
    const send = () => fetch(`${cluster.gateway.url}/v1/completions`, {
      method: 'POST',
      headers: { authorization: `Bearer ${cluster.gateway.defaultKey}`, 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'stories260K', prompt: shortPrompt, max_tokens: 300, ignore_eos: true }),
    });
    const answers = await Promise.all(Array.from({ length: 20 }, send));
    const codes = answers.map((r) => r.status);
    await Promise.all(answers.map((r) => r.text()));
    const refused = codes.filter((c) => c === 503).length;
    assert.ok(refused >= 3, `the burst met a full queue: ${codes.join(' ')}`);
    assert.equal(codes.filter((c) => c !== 503 && c !== 200).length, 0, codes.join(' '));
    // A full queue says nothing about the backend's health: it stays in the pool.
    const text = await scrape(cluster.gateway);
    const backend = cluster.backends[0].url;
    assert.equal(requiredSeriesValue(text, 'edgeinfer_backend_ejections_total', { backend }), 0);
    assert.equal(value(text, 'edgeinfer_backend_up', { backend }), 1);
    assert.equal((await fetch(`${cluster.gateway.url}/readyz`)).status, 200);
    const next = await send();
    assert.equal(next.status, 200, await next.text());
  });
});

describe('a backend dies mid-run', () => {
  let cluster;
  before(async () => { cluster = await startCluster({ backendArgs: ['--kv-cache-memory', '64MiB'] }); });
  after(async () => { await cluster?.stop(); });

  test('a stream on it ends with an error, requests not started move to the other, new ones go there', async () => {
    const [victim, survivor] = cluster.backends;
    const inFlight = async () => {
      const text = await scrape(cluster.gateway);
      return cluster.backends.map((b) => value(text, 'edgeinfer_backend_in_flight', { backend: b.url }));
    };
    // One long stream per backend, both generating.
    const running = Array.from({ length: 2 }, () => longStream(cluster.client, { maxTokens: 1500 }));
    await waitFor('both streams to produce text', () => running.every((s) => s.deltas > 0 || s.error));
    for (const s of running) assert.equal(s.error, null, String(s.error));
    assert.deepEqual(await inFlight(), [1, 1]);
    // Freeze both backends, so that nothing finishes by itself; then send requests that cannot
    // start: the gateway sends half of them to the backend about to die.
    for (const b of cluster.backends) b.child.kill('SIGSTOP');
    const waiting = Array.from({ length: 4 }, () => longStream(cluster.client, { maxTokens: 200 }));
    await waitFor('the gateway to send the new requests', async () => {
      const n = await inFlight();
      return n[0] + n[1] === 6;
    });
    assert.deepEqual(await inFlight(), [3, 3]);
    victim.child.kill('SIGKILL');
    await victim.exited;
    survivor.child.kill('SIGCONT');
    await Promise.all([...running, ...waiting].map((s) => s.done));

    // The stream generating on the dead backend ended with a clear error, not a hang; the one on
    // the survivor completed.
    const failed = running.filter((s) => s.error);
    assert.equal(failed.length, 1, `one running stream fails: ${running.map((s) => String(s.error))}`);
    assert.match(String(failed[0].error?.message), /backend http:\/\/127\.0\.0\.1:\d+ failed during the request/);
    assert.equal(running.find((s) => !s.error).finishReason, 'length');
    // No request that had not started failed: those sent to the dead backend ran on the survivor.
    for (const s of waiting) {
      assert.equal(s.error, null, String(s.error));
      assert.equal(s.finishReason, 'length');
    }
    const text = await scrape(cluster.gateway);
    const retries = ['connect', 'status', 'stream'].reduce(
      (sum, reason) => sum + value(text, 'edgeinfer_backend_retries_total', { reason }), 0);
    console.log(`kill: 1 of 2 running streams ended with an error; 4 of 4 requests not started completed `
      + `(${retries} retries)`);
    assert.ok(retries >= 2, `the requests sent to the dead backend were retried: ${retries}`);
    assert.equal(value(text, 'edgeinfer_backend_stream_errors_total', { backend: victim.url }), 1);

    // New requests all succeed, on the survivor.
    await allServedBy(cluster, 1);
    assert.equal(await requiredMetric(cluster.gateway, 'edgeinfer_backend_up', { backend: victim.url }), 0);
    await waitFor('the survivor to be up', async () =>
      (await metric(cluster.gateway, 'edgeinfer_backend_up', { backend: survivor.url })) === 1);
  });

  test('with no backend left, requests get a 503 at once', async () => {
    const [, survivor] = cluster.backends;
    survivor.child.kill('SIGKILL');
    await survivor.exited;
    await assert.rejects(
      cluster.client.completions.create({ model: 'stories260K', prompt: shortPrompt, max_tokens: 8 }),
      (error) => {
        assert.equal(error.status, 503);
        assert.match(error.message, /backend/);
        return true;
      });
    await waitFor('the gateway to report no backend', async () => (await fetch(`${cluster.gateway.url}/readyz`)).status === 503);
  });
});

describe('the internal API and the gateway\'s checks', () => {
  let backend;
  before(async () => {
    backend = await startServer(['--model', storiesGguf, '--threads', '1', '--kv-cache-memory', '16MiB',
      '--internal-token', TOKEN], { command: 'backend' });
  });
  after(async () => { await backend?.stop(); });

  test('the internal routes want the token; probes and metrics do not', async () => {
    for (const route of ['/internal/v1/info', '/internal/v1/load']) {
      const res = await fetch(`${backend.url}${route}`);
      assert.equal(res.status, 401);
      assert.equal((await res.json()).error.code, 'invalid_internal_token');
    }
    assert.equal((await fetch(`${backend.url}/readyz`)).status, 200);
    assert.equal((await fetch(`${backend.url}/metrics`)).status, 200);
    const info = await (await fetch(`${backend.url}/internal/v1/info`, { headers: { authorization: `Bearer ${TOKEN}` } })).json();
    assert.equal(info.model, 'stories260K');
    assert.equal(info.block_size, 16);
    assert.match(info.tokenizer_fingerprint, /^[0-9a-f]{64}$/);
  });

  test('the internal generate API streams NDJSON events and refuses bad bodies naming the field', async () => {
    const headers = { authorization: `Bearer ${TOKEN}`, 'content-type': 'application/json' };
    const res = await fetch(`${backend.url}/internal/v1/generate`, {
      method: 'POST', headers, body: JSON.stringify({ prompt: [1, 403, 407], max_tokens: 5, ignore_eos: true }),
    });
    assert.equal(res.status, 200);
    assert.equal(res.headers.get('content-type'), 'application/x-ndjson');
    const events = (await res.text()).trim().split('\n').map((line) => JSON.parse(line));
    assert.equal(events[0].type, 'admitted');
    assert.equal(events.at(-1).type, 'finished');
    assert.equal(events.at(-1).reason, 'length');
    assert.equal(events.at(-1).usage.completion_tokens, 5);
    const tokens = events.filter((e) => e.type === 'delta').flatMap((e) => e.tokens);
    assert.equal(tokens.length, 5);

    const bad = await fetch(`${backend.url}/internal/v1/generate`, {
      method: 'POST', headers, body: JSON.stringify({ prompt: [1, 'x'], max_tokens: 5 }),
    });
    assert.equal(bad.status, 400);
    assert.equal((await bad.json()).error.param, 'prompt[1]');
    // Longer than the model's context (2048): the engine refuses it.
    const tooLong = await fetch(`${backend.url}/internal/v1/generate`, {
      method: 'POST', headers, body: JSON.stringify({ prompt: Array(2100).fill(300), max_tokens: 4 }),
    });
    assert.equal(tooLong.status, 400);
    assert.equal((await tooLong.json()).error.code, 'context_length_exceeded');
  });

  test('the internal API holds every field to the public API\'s rules', async () => {
    const headers = { authorization: `Bearer ${TOKEN}`, 'content-type': 'application/json' };
    const generate = (fields) => fetch(`${backend.url}/internal/v1/generate`, {
      method: 'POST', headers, body: JSON.stringify({ prompt: [1, 403, 407], max_tokens: 4, ...fields }),
    });
    for (const [fields, param, code] of [
      [{ sampling: { temperature: 1e9 } }, 'sampling.temperature', null],
      [{ sampling: { top_p: 0 } }, 'sampling.top_p', null],
      [{ sampling: { repetition_penalty: -1 } }, 'sampling.repetition_penalty', null],
      [{ stop: ['a', 'b', 'c', 'd', 'e'] }, 'stop', null],
      [{ prompt: [1, 512] }, 'prompt[1]', null],  // stories260K has 512 tokens
      [{ stop_token_ids: [100000] }, 'stop_token_ids[0]', null],
      [{ max_tokens: 2046 }, 'max_tokens', 'context_length_exceeded'],  // 3 + 2046 > 2048
      [{ tenant: 'acme\nforged access line' }, 'tenant', null],
      [{ id: 'x y' }, 'id', null],
    ]) {
      const res = await generate(fields);
      const body = await res.json();
      assert.equal(res.status, 400, JSON.stringify(fields));
      assert.equal(body.error.param, param, JSON.stringify(body));
      assert.equal(body.error.code, code, JSON.stringify(body));
    }
    const fits = await generate({ max_tokens: 2045, stop: 'x' });
    assert.equal(fits.status, 200);
    await fits.body.cancel();
  });

  test('a caller can neither read another tenant\'s prefix cache nor outrank tenants by weight or priority', async () => {
    const headers = { authorization: `Bearer ${TOKEN}`, 'content-type': 'application/json' };
    // Five full KV blocks of 16 tokens, and one more token.
    const prompt = Array.from({ length: 81 }, (_, i) => 300 + (i % 50));
    const generate = async (fields) => {
      const res = await fetch(`${backend.url}/internal/v1/generate`, {
        method: 'POST', headers, body: JSON.stringify({ prompt, max_tokens: 1, ...fields }),
      });
      return { status: res.status, body: await res.text() };
    };
    // The load report is the engine's latest, published once per step: each request is waited
    // for there (its prefix-cache lookup counted) before the hits are compared.
    const cache = async () => (await load(backend)).prefix_cache;
    const served = async (fields) => {
      const queries = (await cache()).queries;
      const res = await generate(fields);
      if (res.status === 200) {
        await waitFor('its lookup in the load report', async () => (await cache()).queries >= queries + prompt.length);
      }
      return res;
    };
    // Nothing else runs meanwhile (a request re-admitted after preemption would look its own blocks up).
    await waitFor('the backend to be idle', async () => (await load(backend)).in_flight === 0);
    assert.equal((await served({ tenant: 'victim' })).status, 200);
    const before = (await cache()).hits;
    // Naming the victim's salt is refused; as itself, another tenant finds nothing of the victim's.
    const probe = await served({ tenant: 'mallory', cache_salt: 'victim' });
    assert.equal(probe.status, 400);
    assert.equal(JSON.parse(probe.body).error.param, 'cache_salt');
    assert.equal((await served({ tenant: 'mallory' })).status, 200);
    assert.equal((await cache()).hits, before, 'another tenant finds none of the victim\'s blocks');
    // The victim itself does hit its cache.
    assert.equal((await served({ tenant: 'victim' })).status, 200);
    const after = (await cache()).hits;
    assert.ok(after >= before + 80, `${after} hits after ${before}`);
    // Beyond what the tenant admin allows, weight and priority are refused.
    for (const [fields, param] of [[{ weight: 1.7e308 }, 'weight'], [{ weight: 0 }, 'weight'],
      [{ priority: 2147483647 }, 'priority']]) {
      const res = await generate(fields);
      assert.equal(res.status, 400, JSON.stringify(fields));
      assert.equal(JSON.parse(res.body).error.param, param);
    }
  });

  test('a gateway whose tokenizer differs from the backend\'s never uses it', async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'edgeinfer-split-'));
    try {
      const otherModel = path.join(dir, 'tiny-qwen2');
      const made = spawnSync(edgeinferBin, ['make-model', '--preset', 'tiny-qwen2', '--out', otherModel], { encoding: 'utf8' });
      assert.equal(made.status, 0, made.stderr);
      const gateway = await startServer(['--model', otherModel, '--internal-token', TOKEN, '--backend', backend.url,
        '--backend-poll-interval', '50ms'], { command: 'gateway', waitReady: false });
      try {
        await waitFor('the gateway to refuse the backend', async () => /is not used: its tokenizer/.test(gateway.log));
        const ready = await fetch(`${gateway.url}/readyz`);
        assert.equal(ready.status, 503);
        assert.equal((await ready.json()).status, 'connecting');
      } finally {
        await gateway.stop();
      }
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });

  test('bad --backend values are refused with a clear message', () => {
    for (const [args, message] of [
      [[], /at least one --backend/],
      [['--backend', 'https://a:1'], /https is not supported/],
      [['--backend', 'http://a:1', '--backend', 'http://a:1/'], /given twice/],
      [['--backend', 'http://a'], /expected http:\/\/HOST:PORT/],
    ]) {
      const run = spawnSync(edgeinferBin, ['gateway', '--model', storiesGguf, ...args], { encoding: 'utf8' });
      assert.equal(run.status, 2, run.stderr);
      assert.match(run.stderr, message);
    }
  });
});

describe('the internal token when none is given', () => {
  test('a backend makes one on its first start, logs it that once and wants it; a gateway needs it', async () => {
    const stateDir = makeStateDir();
    const args = ['--model', storiesGguf, '--threads', '1', '--kv-cache-memory', '16MiB', '--state-dir', stateDir];
    const noToken = { ...process.env, EDGE_INTERNAL_TOKEN: '' };
    let backend = await startServer(args, { command: 'backend', env: noToken });
    const token = backend.internalToken;
    try {
      assert.ok(token?.length >= 16, backend.log);
      const file = path.join(stateDir, 'internal_token');
      assert.equal(fs.readFileSync(file, 'utf8').trim(), token);
      assert.equal(fs.statSync(file).mode & 0o777, 0o600);
      // Without it, or with another token, every internal route answers 401.
      for (const authorization of [undefined, 'Bearer not-the-token-0123456789']) {
        const headers = authorization ? { authorization } : {};
        assert.equal((await fetch(`${backend.url}/internal/v1/info`, { headers })).status, 401);
        assert.equal((await fetch(`${backend.url}/internal/v1/load`, { headers })).status, 401);
        const generate = await fetch(`${backend.url}/internal/v1/generate`, {
          method: 'POST',
          headers: { ...headers, 'content-type': 'application/json' },
          body: JSON.stringify({ prompt: [1, 403, 407], max_tokens: 2 }),
        });
        assert.equal(generate.status, 401);
      }
      // A gateway that has no token does not start, and says where the backend keeps it.
      const run = spawnSync(edgeinferBin, ['gateway', '--model', storiesGguf, '--backend', backend.url],
        { encoding: 'utf8', env: noToken });
      assert.equal(run.status, 2, run.stderr);
      assert.match(run.stderr, /--internal-token \(or EDGE_INTERNAL_TOKEN\).*internal_token/);
      // Given it in the environment, the gateway serves through the backend.
      const gateway = await startServer(
        ['--model', storiesGguf, '--backend', backend.url, '--backend-poll-interval', '50ms'],
        { command: 'gateway', env: { EDGE_INTERNAL_TOKEN: token } });
      try {
        const client = new OpenAI({ baseURL: `${gateway.url}/v1`, apiKey: gateway.defaultKey, maxRetries: 0 });
        const done = await client.completions.create({ model: 'stories260K', prompt: shortPrompt, max_tokens: 4 });
        assert.equal(done.choices[0].finish_reason, 'length');
      } finally {
        await gateway.stop();
      }
    } finally {
      await backend.stop();
    }
    // Started again on the same folder: the same token, not shown again.
    backend = await startServer(args, { command: 'backend', env: noToken });
    try {
      assert.equal(backend.internalToken, undefined);
      assert.ok(!backend.log.includes(token), backend.log);
      assert.match(backend.log, /internal API guarded by the token in .*internal_token/);
      const info = await fetch(`${backend.url}/internal/v1/info`, { headers: { authorization: `Bearer ${token}` } });
      assert.equal(info.status, 200);
    } finally {
      await backend.stop();
    }
  });
});

// A proxy in front of `backend` that passes every event of a generation stream through `edit`
// (the backend's own usage figures are kept in proxy.reported); everything else passes as it is.
async function eventEditingProxy(backend, edit) {
  const target = new URL(backend.url);
  const proxy = { reported: [] };
  proxy.server = http.createServer((req, res) => {
    const upstream = http.request({ host: target.hostname, port: target.port, path: req.url, method: req.method,
      headers: req.headers }, (answer) => {
      res.writeHead(answer.statusCode, answer.headers);
      if (req.url !== '/internal/v1/generate' || answer.statusCode !== 200) {
        answer.pipe(res);
        return;
      }
      let pending = '';
      answer.on('data', (chunk) => {
        pending += chunk;
        for (let end; (end = pending.indexOf('\n')) >= 0; pending = pending.slice(end + 1)) {
          const event = JSON.parse(pending.slice(0, end));
          if (event.type === 'finished') proxy.reported.push(event.usage);
          res.write(`${JSON.stringify(edit(event))}\n`);
        }
      });
      answer.on('end', () => res.end());
    });
    upstream.on('error', () => res.destroy());
    res.on('close', () => upstream.destroy());
    req.pipe(upstream);
  });
  await new Promise((resolve) => proxy.server.listen(0, '127.0.0.1', resolve));
  proxy.url = `http://127.0.0.1:${proxy.server.address().port}`;
  proxy.close = () => new Promise((resolve) => { proxy.server.closeAllConnections(); proxy.server.close(resolve); });
  return proxy;
}

describe('usage a backend reports', () => {
  const ADMIN_TOKEN = 'split-admin-token-0123456789';
  let backend;
  let proxy;
  let gateway;
  let edit = (event) => event;
  const usageOf = (usage) => (event) => (event.type === 'finished' ? { ...event, usage } : event);
  before(async () => {
    backend = await startServer(['--model', storiesGguf, '--threads', '1', '--kv-cache-memory', '16MiB',
      '--internal-token', TOKEN], { command: 'backend' });
    proxy = await eventEditingProxy(backend, (event) => edit(event));
    gateway = await startServer(['--model', storiesGguf, '--internal-token', TOKEN, '--backend', proxy.url,
      '--backend-poll-interval', '50ms', '--admin-token', ADMIN_TOKEN], { command: 'gateway' });
  });
  after(async () => {
    await gateway?.stop();
    await proxy?.close();
    await backend?.stop();
  });

  test('is corrected to what the gateway sent, relayed and asked for before it is charged', async () => {
    const client = new OpenAI({ baseURL: `${gateway.url}/v1`, apiKey: gateway.defaultKey, maxRetries: 0 });
    const request = { model: 'stories260K', prompt: shortPrompt, max_tokens: 8, temperature: 0, ignore_eos: true };
    const charged = [];
    // Zero and negative figures (a tenant would get tokens for free, or a budget back) ...
    edit = usageOf({ prompt_tokens: -5, completion_tokens: 0, cached_tokens: -1 });
    const low = await client.completions.create(request);
    const own = proxy.reported.at(-1);
    assert.equal(own.completion_tokens, 8);
    assert.deepEqual([low.usage.prompt_tokens, low.usage.completion_tokens], [own.prompt_tokens, 8]);
    charged.push(low.usage);
    // ... and figures beyond the request: the completion at most max_tokens, cached at most the prompt.
    edit = usageOf({ prompt_tokens: 1e6, completion_tokens: 1e6, cached_tokens: 1e6 });
    const high = await client.completions.create(request);
    assert.deepEqual([high.usage.prompt_tokens, high.usage.completion_tokens], [own.prompt_tokens, 8]);
    assert.equal(high.usage.prompt_tokens_details.cached_tokens, own.prompt_tokens);
    charged.push(high.usage);
    // Figures within the bounds are charged as reported.
    edit = (event) => event;
    const fair = await client.completions.create(request);
    assert.equal(fair.usage.completion_tokens, 8);
    charged.push(fair.usage);

    assert.equal(await metric(gateway, 'edgeinfer_backend_usage_corrections_total', { backend: proxy.url }), 2);
    // Logged, but not once per request.
    assert.equal(gateway.log.match(/reported usage prompt/g)?.length, 1, gateway.log);
    assert.match(gateway.log, /reported usage prompt -5, completion 0, cached -1; charged \d+, 8, 0 instead/);
    // The ledger holds the corrected figures.
    const from = encodeURIComponent(new Date(Date.now() - 2 * 86400e3).toISOString().slice(0, 19) + 'Z');
    const sum = (field) => charged.reduce((total, usage) => total + usage[field], 0);
    await waitFor('the ledger to hold the three requests', async () => {
      const res = await fetch(`${gateway.url}/admin/v1/tenants/default/usage?from=${from}`,
        { headers: { authorization: `Bearer ${ADMIN_TOKEN}` } });
      const { total } = await res.json();
      return total.requests === 3 && total.prompt_tokens === sum('prompt_tokens')
        && total.completion_tokens === sum('completion_tokens');
    }, { timeoutMs: 10000 });
  });

  test('a stream that brings more tokens than were asked for has failed, and is charged max_tokens', async () => {
    edit = (event) => (event.type === 'delta' ? { ...event, tokens: [...event.tokens, ...event.tokens] } : event);
    try {
      const res = await fetch(`${gateway.url}/v1/completions`, {
        method: 'POST',
        headers: { authorization: `Bearer ${gateway.defaultKey}`, 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'stories260K', prompt: shortPrompt, max_tokens: 8, ignore_eos: true, stream: true }),
      });
      const events = (await res.text()).split('\n\n').filter((e) => e.startsWith('data: {'))
        .map((e) => JSON.parse(e.slice('data: '.length)));
      assert.match(events.at(-1).error?.message ?? '',
        /failed during the request: it sent more than the 8 tokens asked for/);
      assert.ok(events.every((e) => !e.choices?.[0]?.finish_reason), 'no chunk says the stream is complete');
    } finally {
      edit = (event) => event;
    }
    assert.equal(await metric(gateway, 'edgeinfer_tenant_tokens_total', { kind: 'completion', tenant: 'default' }), 8 * 3 + 8);
  });
});

// A streamed completion read as raw server-sent events, so that a test sees every event as the
// gateway wrote it: the content chunks, the chunk that says why it finished, an error object,
// [DONE], and when the stream ended.
function rawStream(url, key, body) {
  const record = { chunks: 0, finishReason: null, error: null, done: false, endedAt: null };
  record.ended = (async () => {
    const res = await fetch(`${url}/v1/completions`, {
      method: 'POST',
      headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
      body: JSON.stringify({ ...body, stream: true }),
    });
    assert.equal(res.status, 200);
    const decoder = new TextDecoder();
    let pending = '';
    for await (const bytes of res.body) {
      pending += decoder.decode(bytes, { stream: true });
      for (let end; (end = pending.indexOf('\n\n')) >= 0; pending = pending.slice(end + 2)) {
        const event = pending.slice(0, end);
        if (!event.startsWith('data: ')) continue;  // a heartbeat comment
        const data = event.slice('data: '.length);
        if (data === '[DONE]') {
          record.done = true;
          continue;
        }
        const chunk = JSON.parse(data);
        if (chunk.error) record.error = chunk.error;
        if (chunk.choices?.[0]?.text) record.chunks++;
        if (chunk.choices?.[0]?.finish_reason) record.finishReason = chunk.choices[0].finish_reason;
      }
    }
    record.endedAt = Date.now();
  })();
  return record;
}

describe('chaos: a backend killed with SIGKILL mid-stream', () => {
  const ADMIN_TOKEN = 'chaos-admin-token-0123456789';
  let cluster;
  before(async () => {
    cluster = await startCluster({ backendArgs: ['--kv-cache-memory', '64MiB'],
      gatewayArgs: ['--admin-token', ADMIN_TOKEN] });
  });
  after(async () => { await cluster?.stop(); });

  const admin = async (method, route, body) => {
    const res = await fetch(`${cluster.gateway.url}${route}`, {
      method,
      headers: { authorization: `Bearer ${ADMIN_TOKEN}`, 'content-type': 'application/json' },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    return { status: res.status, json: await res.json() };
  };

  test('its client gets an error event and is charged what it received; the next requests go to the other', async () => {
    const [victim, survivor] = cluster.backends;
    // One tenant per stream: each one's ledger is that stream's alone.
    const tenants = ['chaos-a', 'chaos-b'];
    const keys = {};
    for (const id of tenants) {
      assert.equal((await admin('POST', '/admin/v1/tenants', { id })).status, 201);
      const key = await admin('POST', `/admin/v1/tenants/${id}/keys`, {});
      assert.equal(key.status, 201);
      keys[id] = key.json.key;
    }
    const maxTokens = 2000;
    // Greedy: both streams are the same tokens, the one cut short a prefix of the other's.
    const request = { model: 'stories260K', prompt: shortPrompt, max_tokens: maxTokens, temperature: 0, ignore_eos: true };
    const streams = tenants.map((id) => rawStream(cluster.gateway.url, keys[id], request));
    await waitFor('both streams to produce text', () => streams.every((s) => s.chunks > 0 || s.endedAt));
    // Frozen, the backends produce nothing more; what the gateway had is written out.
    for (const b of cluster.backends) b.child.kill('SIGSTOP');
    try {
      const metrics = await scrape(cluster.gateway);
      const inFlight = cluster.backends.map((b) => value(metrics, 'edgeinfer_backend_in_flight', { backend: b.url }));
      assert.deepEqual(inFlight, [1, 1], 'one stream on each backend');
      let counts = streams.map((s) => s.chunks);
      for (let stable = 0; stable < 8; await sleep(25)) {
        const now = streams.map((s) => s.chunks);
        stable = now.every((n, i) => n === counts[i]) ? stable + 1 : 0;
        counts = now;
      }
      assert.ok(streams.every((s) => !s.endedAt && s.chunks < maxTokens), 'both streams are mid-way');
      const killedAt = Date.now();
      victim.child.kill('SIGKILL');
      await victim.exited;
      survivor.child.kill('SIGCONT');
      await Promise.race([Promise.all(streams.map((s) => s.ended)), sleep(60000)]);
      assert.ok(streams.every((s) => s.endedAt), 'both streams ended within 60 s');

      const failed = streams.filter((s) => s.error);
      assert.equal(failed.length, 1, 'the stream on the killed backend, and only it, failed');
      const [lost] = failed;
      const completed = streams.find((s) => !s.error);
      // Never a stream that looks complete: an error event, and no chunk that says it finished.
      assert.match(lost.error.message, /backend http:\/\/127\.0\.0\.1:\d+ failed during the request/);
      assert.equal(lost.finishReason, null);
      const noticedMs = lost.endedAt - killedAt;
      assert.ok(noticedMs < 5000, `the client heard of the kill in ${noticedMs} ms`);
      assert.equal(completed.finishReason, 'length');
      // A token whose text is held back (half a character, say) brings no content chunk of its
      // own: the full stream shows how many of those its tokens hold, a bound on any prefix.
      const silentTokens = maxTokens - completed.chunks;
      assert.ok(silentTokens >= 0 && silentTokens <= 8, `${completed.chunks} content chunks for ${maxTokens} tokens`);

      // The ledger charges each tenant what its client received.
      const from = encodeURIComponent(new Date(Date.now() - 2 * 86400e3).toISOString().slice(0, 19) + 'Z');
      const received = Object.fromEntries(tenants.map((id, i) => [id, streams[i].chunks]));
      let ledger = {};
      await waitFor('the ledger to hold both requests', async () => {
        for (const id of tenants) ledger[id] = (await admin('GET', `/admin/v1/tenants/${id}/usage?from=${from}`)).json.total;
        return tenants.every((id) => ledger[id].requests === 1);
      }, { timeoutMs: 10000 });
      const lostTenant = tenants[streams.indexOf(lost)];
      const completedTenant = tenants[streams.indexOf(completed)];
      assert.equal(ledger[completedTenant].completion_tokens, maxTokens);
      const charged = ledger[lostTenant].completion_tokens;
      assert.ok(charged >= received[lostTenant] && charged <= received[lostTenant] + silentTokens,
        `charged ${charged} completion tokens for ${received[lostTenant]} content chunks received`);
      assert.equal(ledger[lostTenant].prompt_tokens, ledger[completedTenant].prompt_tokens);
      console.log(`chaos: SIGKILL mid-stream: the client heard in ${noticedMs} ms; charged ${charged} completion `
        + `tokens for ${received[lostTenant]} content chunks received (bound: +${silentTokens}); the other stream `
        + `completed (${maxTokens} tokens)`);
    } finally {
      survivor.child.kill('SIGCONT');
    }

    // The killed backend is marked down, and every next request goes to the survivor.
    await waitFor('the gateway to mark the killed backend down', async () =>
      (await requiredMetric(cluster.gateway, 'edgeinfer_backend_up', { backend: victim.url })) === 0, { timeoutMs: 5000 });
    assert.equal(await metric(cluster.gateway, 'edgeinfer_backend_stream_errors_total', { backend: victim.url }), 1);
    await allServedBy(cluster, 1);
    // A retry reason's series appears with its first retry: none is 0.
    assert.equal(await metric(cluster.gateway, 'edgeinfer_backend_retries_total', { reason: 'connect' }), 0,
      'no request was even tried there');
    // Nothing is left running on the survivor, and its KV blocks are all free again.
    await waitFor('the survivor to be idle with its KV blocks free', async () => {
      const l = await load(survivor);
      return l.in_flight === 0 && l.running === 0 && l.kv_blocks_free === l.kv_blocks_total;
    }, { timeoutMs: 10000 });
  });
});

test('a tenant\'s KV tier caps reach its backend: capped at 0, its prompts are not kept in the host tier', async () => {
  const ADMIN_TOKEN = 'tier-admin-token-0123456789';
  // A backend whose KV memory holds a few blocks (other prompts push a prompt out of it) above a
  // host tier that keeps them for the tenants allowed to.
  const cluster = await startCluster({ backends: 1, backendArgs: ['--kv-cache-memory', '128KiB', '--kv-host-cache-memory', '1MiB'],
    gatewayArgs: ['--admin-token', ADMIN_TOKEN] });
  try {
    const admin = async (method, route, body) => {
      const res = await fetch(`${cluster.gateway.url}${route}`, {
        method, headers: { authorization: `Bearer ${ADMIN_TOKEN}`, 'content-type': 'application/json' }, body: JSON.stringify(body),
      });
      return { status: res.status, json: await res.json() };
    };
    const cachedAfterOthers = async (id, quotas) => {
      assert.equal((await admin('POST', '/admin/v1/tenants', { id, quotas })).status, 201);
      const client = new OpenAI({ baseURL: `${cluster.gateway.url}/v1`, maxRetries: 0,
        apiKey: (await admin('POST', `/admin/v1/tenants/${id}/keys`, {})).json.key });
      const ask = async (prompt) => (await client.completions.create({ model: 'stories260K', prompt, max_tokens: 2, temperature: 0 }))
        .usage.prompt_tokens_details.cached_tokens;
      const prompt = 'A big brown dog ran across the yard to catch the yellow frisbee that the boy had thrown over the fence';
      assert.equal(await ask(prompt), 0);
      for (let i = 1; i <= 6; i++) {
        await ask(`Story number ${i}: the little bird flew over the hills and the valleys to find a warm nest before winter`);
      }
      return ask(prompt);
    };
    assert.ok(await cachedAfterOthers('tier-kept', { kv_host_cache_bytes: 512 * 1024, kv_disk_cache_bytes: 0 }) > 0,
      'an evicted prompt comes back from the host tier');
    assert.equal(await cachedAfterOthers('tier-none', { kv_host_cache_bytes: 0 }), 0);
  } finally {
    await cluster.stop();
  }
});
