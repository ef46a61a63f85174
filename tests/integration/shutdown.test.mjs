// Graceful shutdown of `edgeinfer serve`: SIGTERM/SIGINT drain requests in flight, close idle
// connections, and exit 0; a request that never completes is cut off at --shutdown-timeout,
// and a generation still running then ends with an error saying so (a stream with its error
// event and [DONE]; through the split topology too), logged 503.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import { makeSlowModel, startServer, parseResponse, sleep } from './lib/server.mjs';

function connect(port) {
  return new Promise((resolve, reject) => {
    const socket = net.connect(port, '127.0.0.1');
    socket.received = '';
    socket.on('data', (d) => { socket.received += d; });
    socket.done = new Promise((r) => socket.on('close', r));
    socket.on('connect', () => resolve(socket));
    socket.on('error', () => {});
    setTimeout(() => reject(new Error('connect timeout')), 5000);
  });
}

test('SIGTERM with nothing in flight exits 0 promptly', async () => {
  const server = await startServer(['--shutdown-timeout', '20s']);
  assert.equal((await fetch(`${server.url}/healthz`)).status, 200);
  const idle = await connect(server.port);  // an idle keep-alive connection must not hold shutdown
  const started = Date.now();
  const { code, signal } = await server.stop('SIGTERM');
  assert.equal(signal, null);
  assert.equal(code, 0, server.log);
  assert.ok(Date.now() - started < 10000, 'shutdown waited for an idle connection');
  await idle.done;
  assert.match(server.log, /received SIGTERM/);
  assert.match(server.log, /shutdown complete/);
});

test('SIGINT exits 0 too', async () => {
  const server = await startServer();
  const { code } = await server.stop('SIGINT');
  assert.equal(code, 0, server.log);
  assert.match(server.log, /received SIGINT/);
});

test('a request in flight at SIGTERM is answered (readyz: draining) before exit', async () => {
  const server = await startServer(['--shutdown-timeout', '20s']);
  const socket = await connect(server.port);
  // Headers complete, body not yet: the request is in flight.
  socket.write('GET /readyz HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\nab');
  await sleep(200);
  server.child.kill('SIGTERM');
  await sleep(300);
  assert.equal(server.child.exitCode, null, 'server exited with a request in flight');
  // New connections are refused once draining.
  await assert.rejects(fetch(`${server.url}/healthz`));
  socket.write('cd');
  await socket.done;
  const reply = parseResponse(socket.received);
  assert.equal(reply.status, 503);
  assert.deepEqual(JSON.parse(reply.body), { status: 'draining' });
  assert.equal(reply.headers.connection, 'close');
  const { code } = await server.exited;
  assert.equal(code, 0, server.log);
});

test('a request that never completes is cut off at --shutdown-timeout', async () => {
  const server = await startServer(['--shutdown-timeout', '1s']);
  const socket = await connect(server.port);
  socket.write('POST /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{');
  await sleep(200);
  const started = Date.now();
  const { code } = await server.stop('SIGTERM');
  const waited = Date.now() - started;
  assert.equal(code, 0, server.log);
  assert.ok(waited >= 900, `exited after ${waited} ms, before the timeout`);
  assert.match(server.log, /shutdown timeout: 1 connections still open/);
  await socket.done;
});

test('--log-format json writes one JSON object per line', async () => {
  const server = await startServer(['--log-format', 'json']);
  await server.stop();
  const lines = server.log.trim().split('\n');
  assert.ok(lines.length >= 3);
  for (const line of lines) {
    const entry = JSON.parse(line);
    assert.ok(entry.ts && entry.level && entry.component && typeof entry.msg === 'string', line);
  }
  assert.ok(lines.some((l) => /listening on http:\/\/127\.0\.0\.1:\d+/.test(JSON.parse(l).msg)));
});

// Reads a streamed response until `seen` returns true for what arrived so far; returns the
// reader (to read the rest) and the text.
async function readUntil(res, seen) {
  const reader = res.body.getReader();
  const decoder = new TextDecoder();
  let text = '';
  while (!seen(text)) {
    const { value, done } = await reader.read();
    if (done) break;
    text += decoder.decode(value, { stream: true });
  }
  return { reader, text, decoder };
}

async function readRest({ reader, text, decoder }) {
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return text;
    text += decoder.decode(value, { stream: true });
  }
}

const sseData = (text) => text.split('\n\n').filter((e) => e.startsWith('data: ')).map((e) => e.slice(6));

// The access log's lines (JSON log format) for `path`.
const accessLines = (log, path) => log.trim().split('\n').flatMap((line) => {
  try { return [JSON.parse(line)]; } catch { return []; }
}).filter((e) => e.component === 'access' && e.msg === `POST ${path}`);

let slowModel;
const slow = () => (slowModel ??= makeSlowModel());
const slowArgs = () => ['--model', slow(), '--max-model-len', '1024', '--kv-cache-memory', '64MiB', '--log-format', 'json'];
const chat = (extra) => JSON.stringify({
  messages: [{ role: 'user', content: 'Tell me a story' }], max_tokens: 400, ignore_eos: true, temperature: 0, ...extra,
});

test('generations still running at --shutdown-timeout end with an error saying so, logged 503', async () => {
  const server = await startServer([...slowArgs(), '--shutdown-timeout', '1s']);
  const post = (body) => fetch(`${server.url}/v1/chat/completions`, {
    method: 'POST', headers: { 'content-type': 'application/json', authorization: `Bearer ${server.defaultKey}` }, body,
  });
  const streamed = await post(chat({ stream: true }));
  assert.equal(streamed.status, 200);
  const plain = post(chat({}));
  // The stream has produced content: both requests are generating.
  const part = await readUntil(streamed, (t) => /"content":"[^"]/.test(t));
  server.child.kill('SIGTERM');
  const text = await readRest(part);

  const data = sseData(text);
  assert.equal(data.at(-1), '[DONE]', text);
  const error = JSON.parse(data.at(-2)).error;
  assert.equal(error?.code, 'shutting_down', text);
  assert.match(error.message, /shutdown deadline/);
  assert.ok(data.slice(0, -2).every((d) => JSON.parse(d).choices), 'content chunks, then the error event');

  const answer = await plain;
  assert.equal(answer.status, 503);
  assert.equal((await answer.json()).error.code, 'shutting_down');
  assert.ok(answer.headers.get('retry-after'));

  const { code } = await server.exited;
  assert.equal(code, 0, server.log);
  assert.match(server.log, /shutdown timeout: 2 connections still open/);
  const statuses = accessLines(server.log, '/v1/chat/completions').map((e) => Number(e.status));
  assert.deepEqual(statuses, [503, 503], server.log);
});

test('through the split topology, a backend cut at its shutdown deadline ends the client\'s stream with an error', async () => {
  const token = 'internal-token-0123456789';
  const backend = await startServer([...slowArgs(), '--internal-token', token, '--shutdown-timeout', '1s'],
    { command: 'backend' });
  const gateway = await startServer(['--model', slow(), '--internal-token', token, '--backend', backend.url],
    { command: 'gateway' });
  try {
    const res = await fetch(`${gateway.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: `Bearer ${gateway.defaultKey}` },
      body: chat({ stream: true }),
    });
    assert.equal(res.status, 200);
    const part = await readUntil(res, (t) => /"content":"[^"]/.test(t));
    backend.child.kill('SIGTERM');
    const text = await readRest(part);
    const data = sseData(text);
    assert.equal(data.at(-1), '[DONE]', text);
    assert.equal(JSON.parse(data.at(-2)).error?.code, 'shutting_down', text);
    const { code } = await backend.exited;
    assert.equal(code, 0, backend.log);
    const statuses = accessLines(backend.log, '/internal/v1/generate').map((e) => Number(e.status));
    assert.deepEqual(statuses, [503], backend.log);
  } finally {
    await gateway.stop();
    await backend.stop();
  }
});
