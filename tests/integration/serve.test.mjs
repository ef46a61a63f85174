// `edgeinfer serve` over real HTTP on loopback: health, readiness, metrics, errors, shutdown.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import net from 'node:net';
import { startServer, rawExchange, parseResponse, sleep, edgeinferBin, makeStateDir } from './lib/server.mjs';
import { requiredSeriesValue, scrape, seriesValue } from './lib/metrics.mjs';

let server;
before(async () => { server = await startServer(['--threads', '2']); });
after(async () => { await server?.stop(); });

test('GET /healthz answers 200 with JSON and a request id', async () => {
  const res = await fetch(`${server.url}/healthz`);
  assert.equal(res.status, 200);
  assert.match(res.headers.get('content-type'), /application\/json/);
  assert.match(res.headers.get('x-request-id'), /^req_[0-9a-f]{32}$/);
  assert.deepEqual(await res.json(), { status: 'ok' });
});

test('a client request id is echoed back', async () => {
  const res = await fetch(`${server.url}/healthz`, { headers: { 'x-request-id': 'trace-123' } });
  assert.equal(res.headers.get('x-request-id'), 'trace-123');
});

test('GET /readyz answers 200 while serving', async () => {
  const res = await fetch(`${server.url}/readyz`);
  assert.equal(res.status, 200);
  assert.deepEqual(await res.json(), { status: 'ready' });
});

test('GET /metrics is valid Prometheus text and counts requests', async () => {
  await fetch(`${server.url}/healthz`);
  const res = await fetch(`${server.url}/metrics`);
  assert.equal(res.status, 200);
  assert.equal(res.headers.get('content-type'), 'text/plain; version=0.0.4; charset=utf-8');
  const text = await res.text();
  assert.match(text, /^edgeinfer_http_requests_total\{code="200",route="\/healthz"\} [1-9]/m);
  assert.match(text, /^edgeinfer_build_info\{/m);
  assert.match(text, /^process_resident_memory_bytes \d/m);
  const check = spawnSync('promtool', ['check', 'metrics'], { input: text, encoding: 'utf8' });
  const problems = `${check.stdout}${check.stderr}`.split('\n').filter((line) => line.trim() !== '');
  assert.deepEqual(problems, [], `promtool check metrics failed:\n${check.stdout}${check.stderr}`);
});

test('an unknown route is a 404 with an OpenAI-shaped JSON error', async () => {
  const res = await fetch(`${server.url}/no/such/route?x=1`);
  assert.equal(res.status, 404);
  const body = await res.json();
  assert.equal(body.error.type, 'invalid_request_error');
  assert.equal(body.error.code, 'unknown_url');
  assert.equal(body.error.param, null);
  assert.match(body.error.message, /GET \/no\/such\/route/);
});

test('a known route with the wrong method is a 405 naming the allowed method', async () => {
  const res = await fetch(`${server.url}/healthz`, { method: 'DELETE' });
  assert.equal(res.status, 405);
  assert.equal(res.headers.get('allow'), 'GET');
  assert.equal((await res.json()).error.code, 'method_not_allowed');
});

test('malformed HTTP is a 400 JSON error and the server keeps serving', async () => {
  const reply = parseResponse(await rawExchange(server.port, ['THIS IS NOT HTTP\r\n\r\n']));
  assert.equal(reply.status, 400);
  assert.equal(JSON.parse(reply.body).error.code, 'malformed_request');
  assert.equal((await fetch(`${server.url}/healthz`)).status, 200);
});

test('a body over the limit is a 413 before it is read', async () => {
  const head = 'POST /healthz HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n' +
               `Content-Length: ${5 * 1024 * 1024}\r\n\r\n`;
  const reply = parseResponse(await rawExchange(server.port, [head, 'x'.repeat(64 * 1024)]));
  assert.equal(reply.status, 413);
  const error = JSON.parse(reply.body).error;
  assert.equal(error.code, 'request_too_large');
  assert.match(error.message, /4 MiB/);
});

test('headers over 16 KiB are a 431', async () => {
  const head = `GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: ${'a'.repeat(20 * 1024)}\r\n\r\n`;
  const reply = parseResponse(await rawExchange(server.port, [head]));
  assert.equal(reply.status, 431);
  assert.equal(JSON.parse(reply.body).error.code, 'headers_too_large');
});

test('a client that disconnects mid-request costs nothing', async () => {
  const unmatched = { code: '400', route: 'unmatched' };
  const before = await scrape(server);
  const openBefore = requiredSeriesValue(before, 'edgeinfer_http_open_connections');
  const badBefore = seriesValue(before, 'edgeinfer_http_requests_total', unmatched);
  for (let i = 0; i < 20; ++i) {
    const socket = net.connect(server.port, '127.0.0.1');
    await new Promise((r) => socket.on('connect', r));
    socket.write('POST /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"par');
    socket.destroy();
  }
  await sleep(300);
  assert.equal((await fetch(`${server.url}/healthz`)).status, 200);
  const after = await scrape(server);
  // Nobody is left to answer, so nothing is answered, and every dropped connection is closed.
  assert.equal(seriesValue(after, 'edgeinfer_http_requests_total', unmatched), badBefore);
  assert.ok(requiredSeriesValue(after, 'edgeinfer_http_open_connections') <= openBefore + 1);
});

test('keep-alive carries several requests on one connection', async () => {
  const request = 'GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n';
  const text = await rawExchange(server.port, [request, request, 'GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n'],
                                 { delayMs: 50 });
  assert.equal(text.match(/HTTP\/1\.1 200 OK/g).length, 3);
});

test('--version prints the version', () => {
  const r = spawnSync(edgeinferBin, ['--version'], { encoding: 'utf8' });
  assert.equal(r.status, 0);
  assert.match(r.stdout, /^edgeinfer \d+\.\d+\.\d+ \(commit [0-9a-f]+|unknown/);
});

test('--help lists serve, and serve --help lists options with their variables', () => {
  const top = spawnSync(edgeinferBin, ['--help'], { encoding: 'utf8' });
  assert.equal(top.status, 0);
  assert.match(top.stdout, /serve/);
  const serve = spawnSync(edgeinferBin, ['serve', '--help'], { encoding: 'utf8' });
  assert.equal(serve.status, 0);
  assert.match(serve.stdout, /--port INT/);
  assert.match(serve.stdout, /EDGE_MAX_BODY/);
});

test('a bad setting exits 2 with a message naming it', () => {
  const r = spawnSync(edgeinferBin, ['serve', '--port', '0'], {
    encoding: 'utf8', env: { ...process.env, EDGE_MAX_BODY: 'lots' },
  });
  assert.equal(r.status, 2);
  assert.match(r.stderr, /invalid value "lots" for max-body \(environment variable EDGE_MAX_BODY\)/);
});

test('settings that contradict each other exit 2 naming both', () => {
  for (const command of ['serve', 'backend', 'gateway']) {
    const r = spawnSync(edgeinferBin, [command, '--port', '0', '--max-body', '8MiB', '--max-buffered-body-bytes', '4MiB'],
      { encoding: 'utf8' });
    assert.equal(r.status, 2, `${command}: ${r.stderr}`);
    assert.match(r.stderr, /--max-buffered-body-bytes \(4 MiB\) is below --max-body \(8 MiB\)/);
  }
});

test('a GPU memory share that leaves the CUDA runtime nothing is refused', () => {
  const r = spawnSync(edgeinferBin, ['serve', '--port', '0', '--gpu-memory-utilization', '1.0'], { encoding: 'utf8' });
  assert.equal(r.status, 2, r.stderr);
  assert.match(r.stderr, /gpu-memory-utilization/);
});

test('a port already in use exits 1 with a clear error', async () => {
  const r = spawnSync(edgeinferBin, ['serve', '--host', '127.0.0.1', '--port', String(server.port),
    '--state-dir', makeStateDir()], {
    encoding: 'utf8', timeout: 20000,
  });
  assert.equal(r.status, 1);
  assert.match(r.stderr, /cannot listen on 127\.0\.0\.1:\d+ \(bind\): Address already in use/);
});
