// Graceful shutdown of `edgeinfer serve`: SIGTERM/SIGINT drain requests in flight, close idle
// connections, and exit 0; a request that never completes is cut off at --shutdown-timeout.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import { startServer, parseResponse, sleep } from './lib/server.mjs';

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
  assert.match(server.log, /shutdown timeout: closing 1 connections still open/);
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
