// Hostile and careless clients against the real server, each a bounded test on loopback:
// clients that half-close or send a pipelined byte and vanish, disconnect storms, stalled
// bodies, slowloris, and the connection cap. Each checks that no request is lost without an
// error, that the server stops working for clients that left, and that other clients are still
// served with a latency within a stated factor of a baseline measured in the same test.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import http from 'node:http';
import net from 'node:net';
import path from 'node:path';
import { startServer, parseResponse, sleep, waitFor } from './lib/server.mjs';
import { metric, requiredMetric, requiredSeriesValue, scrape, seriesValue } from './lib/metrics.mjs';

const models = process.env.EDGE_TEST_MODELS ?? path.resolve('../shared/models');
const storiesGguf = path.join(models, 'stories260K', 'stories260K.gguf');
const modelArgs = ['--model', storiesGguf, '--threads', '2', '--kv-cache-memory', '16MiB'];

// Latency of the requests that are not the attack, against the baseline taken before it.
const latencyFactor = 5;
// A request that runs far longer than the tests need to act on it.
const longRequest = { prompt: 'Once upon a time', max_tokens: 2000, temperature: 0, ignore_eos: true };
const probeRequest = { prompt: 'Once upon a time', max_tokens: 200, temperature: 0, ignore_eos: true };

// A request on a connection of its own (no pool), so that tests count connections exactly.
function request(server, method, route, body, { headers = {} } = {}) {
  return new Promise((resolve, reject) => {
    const text = body === undefined ? undefined : (typeof body === 'string' ? body : JSON.stringify(body));
    const req = http.request({
      host: '127.0.0.1', port: server.port, path: route, method, agent: false,
      headers: {
        connection: 'close', authorization: `Bearer ${server.defaultKey}`,
        ...(text === undefined ? {} : { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) }),
        ...headers,
      },
    }, (res) => {
      const chunks = [];
      res.on('data', (d) => chunks.push(d));
      res.on('end', () => resolve({ status: res.statusCode, headers: res.headers, text: Buffer.concat(chunks).toString() }));
    });
    req.on('error', reject);
    req.end(text);
  });
}

async function timed(fn) {
  const start = performance.now();
  const result = await fn();
  return { ms: performance.now() - start, result };
}

// Median latency of `n` probe completions, each checked to be served in full.
async function probeLatency(server, n = 5) {
  const times = [];
  for (let i = 0; i < n; i++) {
    const { ms, result } = await timed(() => request(server, 'POST', '/v1/completions', probeRequest));
    assert.equal(result.status, 200, result.text);
    assert.equal(JSON.parse(result.text).usage.completion_tokens, probeRequest.max_tokens);
    times.push(ms);
  }
  return times.sort((a, b) => a - b)[Math.floor(n / 2)];
}

function residentBytes(server) {
  const status = fs.readFileSync(`/proc/${server.child.pid}/status`, 'utf8');
  return Number(status.match(/^VmRSS:\s+(\d+) kB/m)[1]) * 1024;
}

function postHead(server, route, length, { version = '1.1', extra = '' } = {}) {
  return `POST ${route} HTTP/${version}\r\nHost: x\r\nContent-Type: application/json\r\n` +
         `Authorization: Bearer ${server.defaultKey}\r\nContent-Length: ${length}\r\n${extra}\r\n`;
}

function postRequest(server, route, body, options) {
  const text = JSON.stringify(body);
  return postHead(server, route, Buffer.byteLength(text), options) + text;
}

// A raw connection: what it receives, whether and when it closed.
function openRaw(port) {
  return new Promise((resolve, reject) => {
    const socket = net.connect(port, '127.0.0.1');
    socket.received = '';
    socket.closedAt = null;
    socket.ended = new Promise((r) => socket.on('close', () => { socket.closedAt = Date.now(); r(); }));
    socket.on('error', () => {});
    socket.on('data', (d) => { socket.received += d; });
    socket.once('connect', () => resolve(socket));
    socket.once('error', reject);
  });
}

async function idleEngine(server) {
  const total = await requiredMetric(server, 'edgeinfer_kv_cache_blocks');
  await waitFor('an idle engine', async () => (await metric(server, 'edgeinfer_kv_cache_blocks_free')) === total);
  return total;
}

test('a client that half-closes after its request still gets its answer; over HTTP/1.0 it counts as gone', async () => {
  const server = await startServer(modelArgs);
  try {
    const socket = await openRaw(server.port);
    socket.end(postRequest(server, '/v1/completions', probeRequest));  // then shutdown(SHUT_WR)
    await socket.ended;
    // The end of the client's data is seen while the answer is computed: an interim 1xx, which
    // RFC 9110 lets a server send unasked, tells a half-close from a close. The answer follows.
    assert.match(socket.received, /^HTTP\/1\.1 100 Continue\r\n\r\nHTTP\/1\.1 200 OK\r\n/);
    const reply = parseResponse(socket.received.slice(socket.received.indexOf('\r\n\r\n') + 4));
    assert.equal(reply.status, 200);
    assert.equal(JSON.parse(reply.body).usage.completion_tokens, probeRequest.max_tokens);

    // Two pipelined requests, then the half-close: both answered, in order, and the connection
    // ends with them (not at --idle-timeout, 60 s).
    const start = Date.now();
    const pipelined = await openRaw(server.port);
    pipelined.end(postRequest(server, '/v1/completions', { ...probeRequest, max_tokens: 3 }) +
                  postRequest(server, '/v1/completions', { ...probeRequest, max_tokens: 4 }));
    await pipelined.ended;
    assert.ok(pipelined.closedAt - start < 15000, `closed after ${pipelined.closedAt - start} ms`);
    const answers = pipelined.received.split(/HTTP\/1\.1 100 Continue\r\n\r\n/).join('')
      .split(/(?=HTTP\/1\.1 )/).map(parseResponse);
    assert.deepEqual(answers.map((a) => a.status), [200, 200]);
    assert.deepEqual(answers.map((a) => JSON.parse(a.body).usage.completion_tokens), [3, 4]);

    const total = await idleEngine(server);
    const aborts = await requiredMetric(server, 'edgeinfer_request_success_total', { finished_reason: 'abort' });
    const generated = await requiredMetric(server, 'edgeinfer_generation_tokens_total');
    const old = await openRaw(server.port);
    old.end(postRequest(server, '/v1/completions', longRequest, { version: '1.0' }));
    await old.ended;
    assert.equal(old.received, '', 'nothing is answered to an HTTP/1.0 client that closed its side');
    await waitFor('the blocks to come back', async () => (await metric(server, 'edgeinfer_kv_cache_blocks_free')) === total);
    // Gone: aborted in the engine, or (when the close is read with the request, as on a loaded
    // machine) never submitted; either way far from the 2000 tokens it asked for.
    const abortedNow = (await metric(server, 'edgeinfer_request_success_total', { finished_reason: 'abort' })) - aborts;
    const generatedNow = (await metric(server, 'edgeinfer_generation_tokens_total')) - generated;
    assert.ok(abortedNow <= 1, `${abortedNow} aborts for one request`);
    assert.ok(generatedNow < longRequest.max_tokens / 10, `${generatedNow} tokens generated for a client that left`);
  } finally {
    await server.stop();
  }
});

// `clients` non-streamed requests for 2,000 tokens each, closed once the engine holds them all.
async function disconnectStorm(server, { clients, pipelined }) {
  const total = await idleEngine(server);
  const baseline = await probeLatency(server);
  const before = await scrape(server);
  const seen = (text, name, labels) => seriesValue(text, name, labels) - seriesValue(before, name, labels);

  const sockets = await Promise.all(Array.from({ length: clients }, () => openRaw(server.port)));
  for (const socket of sockets) socket.write(postRequest(server, '/v1/completions', longRequest));
  await waitFor('every request to reach the engine', async () => {
    const text = await scrape(server);
    return seriesValue(text, 'edgeinfer_num_requests_running') + seriesValue(text, 'edgeinfer_num_requests_waiting') >= clients;
  });
  if (pipelined) {
    // The first byte of a next request, while this one is being answered.
    for (const socket of sockets) socket.write('G');
    await sleep(100);
  }
  for (const socket of sockets) socket.destroy();
  const closedAt = performance.now();

  // Another client, right after the storm: served as fast as before it, within the factor.
  const after = await probeLatency(server, 3);
  await waitFor('the blocks to come back', async () => (await metric(server, 'edgeinfer_kv_cache_blocks_free')) === total,
                { timeoutMs: 20000 });
  const freedMs = performance.now() - closedAt;
  const text = await scrape(server);
  const generated = requiredSeriesValue(text, 'edgeinfer_generation_tokens_total') -
    requiredSeriesValue(before, 'edgeinfer_generation_tokens_total') - 3 * probeRequest.max_tokens;
  const asked = clients * longRequest.max_tokens;
  // Every request of the storm ends as cancelled (499), none is lost or answered.
  assert.equal(seen(text, 'edgeinfer_http_requests_total', { route: '/v1/completions', code: '499' }), clients);
  assert.equal(seen(text, 'edgeinfer_request_success_total', { finished_reason: 'abort' }), clients);
  assert.ok(sockets.every((s) => s.received === ''));
  assert.ok(generated < asked / 10, `${generated} tokens generated for ${asked} asked by clients that left`);
  assert.ok(after <= latencyFactor * baseline, `a probe took ${after.toFixed(1)} ms after the storm, ${baseline.toFixed(1)} ms before`);
  return { generated, asked, freedMs, baseline, after };
}

test('disconnect storms: 45 clients that leave, with and without a pipelined byte, stop the engine at once', async () => {
  const server = await startServer(modelArgs);
  try {
    for (const pipelined of [false, true]) {
      const figures = await disconnectStorm(server, { clients: 45, pipelined });
      console.log(`disconnect storm (pipelined byte: ${pipelined}): ${figures.generated} of ${figures.asked} tokens ` +
                  `generated, blocks free ${figures.freedMs.toFixed(0)} ms after the close; probe ` +
                  `${figures.after.toFixed(1)} ms after vs ${figures.baseline.toFixed(1)} ms before`);
    }
  } finally {
    await server.stop();
  }
});

test('48 stalled bodies: the budget for bodies being received bounds memory, others are served, stalls end in 408', async () => {
  const budget = 8 * 1024 * 1024;
  // Far longer than the checks below take on a loaded machine: they need the stalls still held.
  const bodyTimeoutMs = 8000;
  const server = await startServer([...modelArgs, '--max-buffered-body-bytes', '8MiB', '--body-timeout', `${bodyTimeoutMs}ms`]);
  try {
    const baseline = await probeLatency(server);
    const rssBefore = residentBytes(server);
    const declared = 4 * 1024 * 1024;
    const sent = 2 * 1024 * 1024;
    const stalled = await Promise.all(Array.from({ length: 48 }, () => openRaw(server.port)));
    for (const socket of stalled) {
      socket.write(postHead(server, '/v1/completions', declared));
      socket.write(Buffer.alloc(sent, 0x20));  // half the body, then nothing
    }
    // Those past the budget are refused at once; the rest hold their half bodies.
    await waitFor('the refusals', async () => {
      const held = await metric(server, 'edgeinfer_http_buffered_body_bytes');
      const refused = stalled.filter((s) => s.received.includes('\r\n\r\n')).length;
      return refused + Math.floor(held / sent) === stalled.length && held > 0;
    });
    const held = await metric(server, 'edgeinfer_http_buffered_body_bytes');
    const rssGrowth = residentBytes(server) - rssBefore;
    const refused = stalled.filter((s) => s.received !== '');
    assert.ok(held <= budget, `${held} bytes buffered, over the budget`);
    assert.ok(refused.length >= stalled.length - budget / sent, `${refused.length} refused`);
    for (const socket of refused) {
      const reply = parseResponse(socket.received);
      assert.equal(reply.status, 503);
      assert.equal(reply.headers['retry-after'], '1');
      assert.equal(JSON.parse(reply.body).error.code, 'overloaded');
    }
    // Less than the half bodies themselves (96 MiB), which is what they held without a budget.
    // (A plain build grows by about 10 MiB; a sanitizer build keeps freed memory in quarantine.)
    assert.ok(rssGrowth < stalled.length * sent, `resident memory grew by ${rssGrowth} bytes`);
    assert.equal(await metric(server, 'edgeinfer_http_overload_rejections_total', { limit: 'max_buffered_body_bytes' }),
                 refused.length);

    // A body larger than the room the stalls leave waits for room; small requests are still
    // served, at their usual speed. (Bodies that pass the budget at the same moment are refused
    // together, so the stalls that stay may leave more than one body's worth free.)
    const free = budget - held;
    const crowdedBody = JSON.stringify(probeRequest) + ' '.repeat(free + 256 * 1024);
    assert.ok(Buffer.byteLength(crowdedBody) < 4 * 1024 * 1024, `the stalls left ${free} bytes of the budget free`);
    const crowded = await request(server, 'POST', '/v1/completions', crowdedBody);
    const during = await probeLatency(server, 3);
    const timedOut = stalled.filter((s) => !refused.includes(s) && s.closedAt).length;
    assert.equal(timedOut, 0, `${timedOut} stalled bodies reached --body-timeout before the checks ended`);
    assert.equal(crowded.status, 503);
    assert.equal(JSON.parse(crowded.text).error.code, 'overloaded');
    assert.ok(during <= latencyFactor * baseline, `a probe took ${during.toFixed(1)} ms during the stall, ${baseline.toFixed(1)} ms before`);

    // The stalled bodies end at --body-timeout with a 408 each; then the large body is served.
    await Promise.all(stalled.map((s) => s.ended));
    for (const socket of stalled.filter((s) => !refused.includes(s))) {
      assert.equal(parseResponse(socket.received).status, 408);
    }
    await waitFor('the budget to empty', async () => (await metric(server, 'edgeinfer_http_buffered_body_bytes')) === 0);
    const served = await request(server, 'POST', '/v1/completions', crowdedBody);
    assert.equal(served.status, 200, served.text);
    console.log(`stalled bodies: ${stalled.length - refused.length} held ${held} bytes (budget ${budget}, ${free} free), ` +
                `${refused.length} refused with 503, resident memory +${(rssGrowth / 1048576).toFixed(1)} MiB; probe ` +
                `${during.toFixed(1)} ms during vs ${baseline.toFixed(1)} ms before`);
  } finally {
    await server.stop();
  }
});

test('slowloris: trickled headers and bodies are cut at their deadlines with 408, others are served', async () => {
  const headerTimeoutMs = 2000;
  const bodyTimeoutMs = 3000;
  const server = await startServer([...modelArgs, '--header-timeout', `${headerTimeoutMs}ms`,
                                    '--body-timeout', `${bodyTimeoutMs}ms`]);
  try {
    const baseline = await probeLatency(server);
    const openBefore = await requiredMetric(server, 'edgeinfer_http_open_connections');
    const body = JSON.stringify(probeRequest);
    const start = Date.now();
    const headerTricklers = await Promise.all(Array.from({ length: 40 }, () => openRaw(server.port)));
    const bodyTricklers = await Promise.all(Array.from({ length: 40 }, () => openRaw(server.port)));
    const head = postHead(server, '/v1/completions', Buffer.byteLength(body));
    for (const s of bodyTricklers) s.write(head);
    // A byte every 100 ms each: far inside --idle-timeout (60 s) between bytes.
    let trickling = true;
    const trickle = (async () => {
      for (let i = 0; trickling; i++) {
        for (const s of headerTricklers) if (!s.closedAt && i < head.length - 2) s.write(head[i]);
        for (const s of bodyTricklers) if (!s.closedAt && i < body.length - 1) s.write(body[i]);
        await sleep(100);
      }
    })();
    await sleep(300);  // every trickler is under way
    const during = await probeLatency(server);
    await Promise.all([...headerTricklers, ...bodyTricklers].map((s) => s.ended));
    trickling = false;
    await trickle;
    for (const [group, timeoutMs] of [[headerTricklers, headerTimeoutMs], [bodyTricklers, bodyTimeoutMs]]) {
      for (const s of group) {
        assert.equal(parseResponse(s.received).status, 408);
        assert.ok(s.closedAt - start < 2 * timeoutMs + 1000, `held ${s.closedAt - start} ms (deadline ${timeoutMs} ms)`);
      }
    }
    assert.ok(during <= latencyFactor * baseline, `a probe took ${during.toFixed(1)} ms during the trickle, ${baseline.toFixed(1)} ms before`);
    await waitFor('the connections to close', async () =>
      (await metric(server, 'edgeinfer_http_open_connections')) <= openBefore);
    const slowest = Math.max(...[...headerTricklers, ...bodyTricklers].map((s) => s.closedAt - start));
    console.log(`slowloris: 80 trickling connections all cut with 408 within ${slowest} ms; probe ` +
                `${during.toFixed(1)} ms during vs ${baseline.toFixed(1)} ms before`);
  } finally {
    await server.stop();
  }
});

test('the connection cap: past --max-connections a connection gets 503 overloaded and is closed; then it recovers', async () => {
  const cap = 20;
  const server = await startServer([...modelArgs, '--max-connections', String(cap)]);
  try {
    const baseline = await probeLatency(server);
    // The probes' connections close as they end: wait for them to be gone, and for the one that
    // asked (it closes just after its answer).
    await waitFor('no connection open', async () => (await requiredMetric(server, 'edgeinfer_http_open_connections')) <= 1);
    await sleep(200);
    const idle = await Promise.all(Array.from({ length: cap }, () => openRaw(server.port)));
    await sleep(100);
    const refusedSockets = await Promise.all(Array.from({ length: 5 }, () => openRaw(server.port)));
    await Promise.all(refusedSockets.map((s) => s.ended));
    for (const s of refusedSockets) {
      const reply = parseResponse(s.received);
      assert.equal(reply.status, 503);
      assert.equal(reply.headers['retry-after'], '1');
      assert.equal(JSON.parse(reply.body).error.code, 'overloaded');
    }
    const refusedRequest = await request(server, 'POST', '/v1/completions', probeRequest);
    assert.equal(refusedRequest.status, 503);
    // The connections held are not disturbed by the refusals.
    assert.ok(idle.every((s) => !s.closedAt && s.received === ''));

    for (const s of idle) s.destroy();
    await waitFor('room again', async () => {
      try {
        return (await request(server, 'GET', '/healthz')).status === 200;
      } catch {
        return false;
      }
    });
    const after = await probeLatency(server, 3);
    assert.ok(after <= latencyFactor * baseline, `a probe took ${after.toFixed(1)} ms after the cap, ${baseline.toFixed(1)} ms before`);
    // Refused: the five raw connections, the request, and any check for room made too early.
    assert.ok(await metric(server, 'edgeinfer_http_overload_rejections_total', { limit: 'max_connections' }) >=
              refusedSockets.length + 1);
    assert.ok(server.log.includes(`${cap} connections open, the limit (--max-connections): refusing new ones`));
  } finally {
    await server.stop();
  }
});
