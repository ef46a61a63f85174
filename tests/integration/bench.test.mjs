// `edgeinfer bench` end to end: against the real `edgeinfer serve` (its counts must match the
// server's usage and /metrics), against small fake servers written here (known delays for the
// latency maths; 429, 503, dropped connections, cut streams and timeouts, which must be
// counted as failures), and its HTML report rendered in headless Chromium.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { edgeinferBin, startServer, sleep } from './lib/server.mjs';
import { requiredMetric, scrape, seriesValue } from './lib/metrics.mjs';

let workDir;

before(() => {
  workDir = fs.mkdtempSync(path.join(os.tmpdir(), 'edge_bench_'));
});

after(() => {
  fs.rmSync(workDir, { recursive: true, force: true });
});

function runBench(args, { timeoutMs = 120000 } = {}) {
  return new Promise((resolve, reject) => {
    const child = spawn(edgeinferBin, ['bench', ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d) => { stdout += d; });
    child.stderr.on('data', (d) => { stderr += d; });
    const timer = setTimeout(() => { child.kill('SIGKILL'); reject(new Error(`bench hung:\n${stdout}\n${stderr}`)); }, timeoutMs);
    child.on('exit', (code) => { clearTimeout(timer); resolve({ code, stdout, stderr }); });
  });
}

function readJson(file) {
  return JSON.parse(fs.readFileSync(file, 'utf8'));
}

// `edgeinfer bench` against a fake server with no warm-up, writing NAME.json: the run and the one
// point it measured (undefined where it wrote none).
async function benchFake(fake, name, args) {
  const out = path.join(workDir, `${name}.json`);
  const run = await runBench(['--base-url', fake.url, '--model', 'fake', '--warmup-requests', '0', ...args,
    '--output-json', out]);
  return { run, point: fs.existsSync(out) ? readJson(out).points[0] : undefined };
}

// A fake OpenAI-compatible server on a free loopback port; `handler(req, res, body, n)` gets
// the parsed body and the request's number (0, 1, ...). It names no context (GET /v1/models is a
// 404, not counted), so the benchmark sends its requests as the dataset makes them.
async function fakeServer(handler) {
  const seen = [];
  const server = http.createServer((req, res) => {
    if (req.method === 'GET' && req.url === '/v1/models') {
      res.writeHead(404, { 'content-type': 'application/json' });
      res.end('{"error":{"message":"no models here"}}');
      return;
    }
    let raw = '';
    req.on('data', (d) => { raw += d; });
    req.on('end', () => {
      const body = raw ? JSON.parse(raw) : {};
      const n = seen.length;
      seen.push({ url: req.url, headers: req.headers, body });
      Promise.resolve(handler(req, res, body, n)).catch(() => res.destroy());
    });
  });
  await new Promise((r) => server.listen(0, '127.0.0.1', r));
  return {
    url: `http://127.0.0.1:${server.address().port}`,
    seen,
    close: () => new Promise((r) => { server.closeAllConnections(); server.close(r); }),
  };
}

const sse = (res, chunk) => res.write(`data: ${JSON.stringify(chunk)}\n\n`);

// Streams a completion the way OpenAI does: `tokens` text deltas `gapMs` apart after `ttftMs`,
// a finish chunk, a usage chunk when asked for, then [DONE].
async function streamCompletion(res, body, { ttftMs = 0, gapMs = 0, tokens = 10, usage = true, chat = false } = {}) {
  res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' });
  const base = { id: 'cmpl-fake', object: chat ? 'chat.completion.chunk' : 'text_completion', created: 0, model: 'fake' };
  if (chat) sse(res, { ...base, choices: [{ index: 0, delta: { role: 'assistant', content: '' }, finish_reason: null }] });
  await sleep(ttftMs);
  for (let i = 0; i < tokens; i++) {
    if (i > 0) await sleep(gapMs);
    const choice = chat ? { index: 0, delta: { content: ` w${i}` }, finish_reason: null } : { index: 0, text: ` w${i}`, finish_reason: null };
    sse(res, { ...base, choices: [choice] });
  }
  sse(res, { ...base, choices: [chat ? { index: 0, delta: {}, finish_reason: 'length' } : { index: 0, text: '', finish_reason: 'length' }] });
  if (usage && body.stream_options?.include_usage) {
    sse(res, { ...base, choices: [], usage: { prompt_tokens: 7, completion_tokens: tokens, total_tokens: 7 + tokens } });
  }
  res.end('data: [DONE]\n\n');
}

test('latency maths on a server with known delays: TTFT 200 ms, 50 ms between tokens', async () => {
  const fake = await fakeServer((req, res, body) => streamCompletion(res, body, { ttftMs: 200, gapMs: 50, tokens: 10 }));
  try {
    const out = path.join(workDir, 'latency.json');
    const csv = path.join(workDir, 'latency.csv');
    const run = await runBench(['--base-url', fake.url, '--model', 'fake', '--api-key', 'sk-test', '--concurrency', '2',
      '--num-requests', '6', '--warmup-requests', '0', '--goodput', 'ttft:5000', 'tpot:1000',
      '--output-json', out, '--output-csv', csv]);
    assert.equal(run.code, 0, run.stderr);
    const p = readJson(out).points[0];
    assert.equal(p.completed, 6);
    assert.equal(p.failed, 0);
    assert.equal(p.total_output_tokens, 60);
    assert.equal(p.total_input_tokens, 42);
    // Lower bounds are the server's own sleeps; upper bounds are generous (a loaded machine).
    assert.ok(p.ttft_ms.mean >= 195 && p.ttft_ms.mean < 1500, `TTFT ${p.ttft_ms.mean}`);
    assert.ok(p.tpot_ms.median >= 45 && p.tpot_ms.median < 200, `TPOT ${p.tpot_ms.median}`);
    assert.ok(p.itl_ms.median >= 45 && p.itl_ms.median < 200, `ITL ${p.itl_ms.median}`);
    assert.equal(p.itl_ms.count, 6 * 9);
    assert.ok(p.e2el_ms.mean >= 640 && p.e2el_ms.mean < 3000, `E2EL ${p.e2el_ms.mean}`);
    // 6 requests two at a time, each at least 650 ms: at least 3 rounds.
    assert.ok(p.duration_s >= 1.9, `duration ${p.duration_s}`);
    assert.ok(Math.abs(p.request_throughput - 6 / p.duration_s) < 1e-6);
    assert.ok(Math.abs(p.output_throughput - 60 / p.duration_s) < 1e-6);
    assert.equal(p.good_requests, 6);
    assert.deepEqual(p.token_check, { requests_with_usage: 6, usage_completion_tokens: 60, client_completion_tokens: 60, mismatched_requests: 0, more_deltas_requests: 0 });
    assert.deepEqual(p.prompt_cache, { requests_reporting: 0, prompt_tokens: 0, cached_tokens: 0, share: null }, 'no cached_tokens in its usage');
    assert.match(run.stdout, /Cached prompt tokens:\s+not reported by the server/);
    assert.equal(p.connections_opened, 2, 'two keep-alive connections carry the six requests');
    // What went over the wire: OpenAI's completions request with streamed usage asked for.
    const sent = fake.seen[0];
    assert.equal(sent.url, '/v1/completions');
    assert.equal(sent.headers.authorization, 'Bearer sk-test');
    assert.equal(sent.body.model, 'fake');
    assert.equal(sent.body.stream, true);
    assert.deepEqual(sent.body.stream_options, { include_usage: true });
    assert.equal(sent.body.max_tokens, 128);
    assert.match(run.stdout, /Serving Benchmark Result/);
    assert.match(run.stdout, /Median TPOT \(ms\):/);
    assert.match(fs.readFileSync(csv, 'utf8'), /^label,concurrency,request_rate,completed,failed/);
  } finally {
    await fake.close();
  }
});

test('chat endpoint: role delta is not a token, and a stream without usage falls back to counting deltas', async () => {
  const fake = await fakeServer((req, res, body) => streamCompletion(res, body, { tokens: 5, usage: false, chat: true }));
  try {
    const out = path.join(workDir, 'chat.json');
    const run = await runBench(['--base-url', `${fake.url}/v1`, '--model', 'fake', '--endpoint', 'chat',
      '--num-requests', '3', '--warmup-requests', '1', '--output-json', out]);
    assert.equal(run.code, 0, run.stderr);
    const p = readJson(out).points[0];
    assert.equal(p.completed, 3);
    assert.equal(p.total_output_tokens, 15);
    assert.equal(p.token_check.requests_with_usage, 0);
    assert.equal(fake.seen.length, 4, 'one warm-up request and three measured');
    assert.equal(fake.seen[0].url, '/v1/chat/completions');
    assert.equal(fake.seen[0].body.messages[0].role, 'user');
  } finally {
    await fake.close();
  }
});

test('429, 503, dropped connections and cut streams are counted as failures, not hidden', async () => {
  const kinds = ['429', '503', 'drop-before-response', 'drop-mid-stream', 'no-done', 'ok'];
  const fake = await fakeServer(async (req, res, body, n) => {
    switch (kinds[n % kinds.length]) {
      case '429':
        res.writeHead(429, { 'content-type': 'application/json', 'retry-after': '1' });
        res.end(JSON.stringify({ error: { message: 'Rate limit reached', type: 'requests', code: 'rate_limit_exceeded' } }));
        return;
      case '503':
        // Closing after it: the drop that follows then meets a new connection, which a client must
        // not send again (a reused one it may: see the next test).
        res.writeHead(503, { 'content-type': 'application/json', 'retry-after': '1', connection: 'close' });
        res.end(JSON.stringify({ error: { message: 'overloaded', type: 'server_error', code: 'overloaded' } }));
        return;
      case 'drop-before-response':
        req.socket.destroy();
        return;
      case 'drop-mid-stream':
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        sse(res, { choices: [{ index: 0, text: 'a' }] });
        await sleep(20);
        req.socket.destroy();
        return;
      case 'no-done':
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        sse(res, { choices: [{ index: 0, text: 'a' }] });
        res.end();
        return;
      default:
        await streamCompletion(res, body, { tokens: 4 });
    }
  });
  try {
    const { run, point: p } = await benchFake(fake, 'failures', ['--concurrency', '1', '--num-requests', '12']);
    assert.equal(run.code, 0, run.stderr);
    assert.equal(p.completed, 2);
    assert.equal(p.failed, 10);
    assert.deepEqual(p.failures, { http_429: 2, http_503: 2, connection: 4, incomplete_stream: 2 });
    assert.equal(p.total_output_tokens, 8, 'only completed requests count');
    assert.match(run.stdout, /Failed requests:\s+10 \(connection: 4, http_429: 2, http_503: 2, incomplete_stream: 2\)/);
    assert.match(run.stderr, /requests failed/);
  } finally {
    await fake.close();
  }
});

test('a kept-alive connection the server closes before answering is left for a new one, once', async () => {
  // Every connection answers its first request and closes on its second without a byte of
  // answer, as a server closing an idle connection just as the next request arrives.
  const answered = new WeakSet();
  const fake = await fakeServer(async (req, res, body) => {
    if (answered.has(req.socket)) {
      req.socket.destroy();
      return;
    }
    answered.add(req.socket);
    await streamCompletion(res, body, { tokens: 3 });
  });
  try {
    const { run, point: p } = await benchFake(fake, 'reused', ['--concurrency', '1', '--num-requests', '4']);
    assert.equal(run.code, 0, run.stderr);
    assert.equal(p.completed, 4);
    assert.equal(p.failed, 0);
    assert.equal(fake.seen.length, 7, 'requests 2, 3 and 4 were each sent twice: on the closed connection, then a new one');
  } finally {
    await fake.close();
  }
});

test('a request past --timeout fails as a timeout; a run where nothing completes exits 1', async () => {
  const fake = await fakeServer(() => { /* never answers */ });
  try {
    const { run, point } = await benchFake(fake, 'timeout', ['--concurrency', '2', '--num-requests', '2', '--timeout', '300ms']);
    assert.equal(run.code, 1);
    assert.match(run.stderr, /no request completed/);
    assert.deepEqual(point.failures, { timeout: 2 });
  } finally {
    await fake.close();
  }
});

test('open-loop Poisson arrivals at a seeded rate send the requested number', async () => {
  const fake = await fakeServer((req, res, body) => streamCompletion(res, body, { tokens: 2 }));
  try {
    const out = path.join(workDir, 'rate.json');
    const run = await runBench(['--base-url', fake.url, '--model', 'fake', '--request-rate', '50', '--num-requests', '20',
      '--warmup-requests', '0', '--seed', '3', '--dataset', 'conversation', '--input-len', '20', '--output-len', '8',
      '--output-json', out]);
    assert.equal(run.code, 0, run.stderr);
    const result = readJson(out);
    assert.equal(result.points[0].concurrency, null);
    assert.equal(result.points[0].request_rate, 50);
    assert.equal(result.points[0].completed, 20);
    // The seed fixes the prompts: a second run sends the same ones.
    const first = fake.seen.map((s) => s.body.prompt);
    fake.seen.length = 0;
    const again = await runBench(['--base-url', fake.url, '--model', 'fake', '--request-rate', '50', '--num-requests', '20',
      '--warmup-requests', '0', '--seed', '3', '--dataset', 'conversation', '--input-len', '20', '--output-len', '8']);
    assert.equal(again.code, 0, again.stderr);
    assert.deepEqual(fake.seen.map((s) => s.body.prompt).sort(), [...first].sort());
  } finally {
    await fake.close();
  }
});

test('bad options are clear errors', async () => {
  const noModel = await runBench(['--base-url', 'http://127.0.0.1:9']);
  assert.equal(noModel.code, 2);
  assert.match(noModel.stderr, /--model is required/);
  const badConcurrency = await runBench(['--model', 'm', '--concurrency', '1,zero']);
  assert.equal(badConcurrency.code, 2);
  assert.match(badConcurrency.stderr, /--concurrency: "zero"/);
  const badGoodput = await runBench(['--model', 'm', '--goodput', 'ttft:500', 'speed:3']);
  assert.equal(badGoodput.code, 2);
  assert.match(badGoodput.stderr, /unknown goodput objective "speed"/);
  const https = await runBench(['--model', 'm', '--base-url', 'https://example.test']);
  assert.equal(https.code, 2);
  assert.match(https.stderr, /https is not supported/);
  const missing = await runBench(['--compare', path.join(workDir, 'nope.json')]);
  assert.equal(missing.code, 1);
  assert.match(missing.stderr, /cannot read/);
});

test('against edgeinfer serve: counts and token totals match the usage and /metrics', async () => {
  const server = await startServer(['--threads', '2']);
  try {
    const before = await scrape(server);
    const out = path.join(workDir, 'serve.json');
    const run = await runBench(['--base-url', server.url, '--api-key', server.defaultKey, '--model', 'stories260K', '--concurrency', '1,4',
      '--num-requests', '8', '--warmup-requests', '2', '--input-len', '12', '--output-len', '10',
      '--output-json', out], { timeoutMs: 240000 });
    assert.equal(run.code, 0, `${run.stdout}\n${run.stderr}`);
    const after = await scrape(server);
    const result = readJson(out);
    assert.equal(result.points.length, 2);
    let output = 0;
    let input = 0;
    for (const p of result.points) {
      assert.equal(p.completed, 8);
      assert.equal(p.failed, 0);
      assert.equal(p.token_check.requests_with_usage, 8, 'every stream carried usage');
      assert.equal(p.total_output_tokens, 8 * 10, 'ignore_eos: each request generates max_tokens');
      assert.equal(p.token_check.usage_completion_tokens, p.total_output_tokens);
      // One delta per token unless the detokenizer held a partial character back.
      assert.ok(p.token_check.client_completion_tokens <= p.token_check.usage_completion_tokens);
      assert.ok(p.token_check.client_completion_tokens >= 0.9 * p.token_check.usage_completion_tokens);
      assert.equal(p.token_check.more_deltas_requests, 0);
      assert.equal(p.warmup.requests, 2);
      output += p.total_output_tokens + p.warmup.output_tokens;
      input += p.total_input_tokens + p.warmup.input_tokens;
    }
    const generated = seriesValue(after, 'edgeinfer_generation_tokens_total') - seriesValue(before, 'edgeinfer_generation_tokens_total');
    const prompted = seriesValue(after, 'edgeinfer_prompt_tokens_total') - seriesValue(before, 'edgeinfer_prompt_tokens_total');
    assert.equal(generated, output, 'the server generated exactly the tokens the benchmark counted');
    assert.equal(prompted, input, 'and read exactly the prompt tokens it reported');
  } finally {
    await server.stop();
  }
});

// The conversation dataset's long tail runs far past a small model's context: every request is
// cut to fit what the server says it serves (its context, and what its tokenizer makes of a
// word), and the run says how many were cut instead of failing them.
test('--dataset conversation fits the served context: long requests are cut, said so, and none fails', async () => {
  const server = await startServer(['--threads', '2', '--max-model-len', '256']);
  try {
    const out = path.join(workDir, 'conversation.json');
    const run = await runBench(['--base-url', server.url, '--api-key', server.defaultKey, '--model', 'stories260K',
      '--dataset', 'conversation', '--input-len', '120', '--output-len', '40', '--num-requests', '40', '--concurrency', '4',
      '--seed', '3', '--output-json', out], { timeoutMs: 240000 });
    assert.equal(run.code, 0, `${run.stdout}\n${run.stderr}`);
    assert.match(run.stderr, /with a context of 256 tokens \((\d+\.\d+) tokens a prompt word\)/);
    const cut = run.stderr.match(/(\d+) of 40 requests were cut to fit the context of 256 tokens/);
    assert.ok(cut && Number(cut[1]) > 0, run.stderr);
    const [point] = readJson(out).points;
    assert.equal(point.failed, 0, run.stderr);
    assert.equal(point.completed, 40);
  } finally {
    await server.stop();
  }
});

// The prompt tokens a run's points report as served from the prefix cache, and their share.
const cachedShare = (p) => p.prompt_cache.share;

test('a sweep draws fresh prompts per point; --reuse-prompts finds them cached, and every report says so', async () => {
  const server = await startServer(['--threads', '2']);
  try {
    const hitsNow = () => requiredMetric(server, 'edgeinfer_prefix_cache_hits_total');
    const sweep = async (name, extra) => {
      const files = { json: path.join(workDir, `${name}.json`), csv: path.join(workDir, `${name}.csv`), html: path.join(workDir, `${name}.html`) };
      const hitsBefore = await hitsNow();
      const run = await runBench(['--base-url', server.url, '--api-key', server.defaultKey, '--model', 'stories260K',
        '--concurrency', '1,2', '--num-requests', '8', '--input-len', '48', '--output-len', '4',
        '--output-json', files.json, '--output-csv', files.csv, '--html', files.html, ...extra], { timeoutMs: 240000 });
      assert.equal(run.code, 0, `${run.stdout}\n${run.stderr}`);
      return { run, files, result: readJson(files.json), hits: (await hitsNow()) - hitsBefore };
    };

    // Default: each point draws its own prompts (and its own warm-up prompts), so nothing is cached.
    const fresh = await sweep('fresh', ['--seed', '3', '--warmup-requests', '2']);
    assert.equal(fresh.result.prompts, 'per_point');
    assert.equal(fresh.result.points.length, 2);
    for (const p of fresh.result.points) {
      assert.equal(p.completed, 8);
      assert.equal(p.prompt_cache.requests_reporting, 8, 'every stream reported cached_tokens');
      assert.equal(p.prompt_cache.prompt_tokens, p.total_input_tokens);
      assert.ok(cachedShare(p) < 0.02, `point c=${p.concurrency} cold: ${JSON.stringify(p.prompt_cache)}`);
    }
    assert.equal(fresh.hits, 0, 'the server found no prompt token in its cache');

    // --reuse-prompts (another seed, so the first point starts cold): the second point sends the
    // first point's prompts and finds nearly all of them cached. No warm-ups, so the server's
    // hit counter is exactly what the measured requests reported.
    const reused = await sweep('reused', ['--seed', '4', '--warmup-requests', '0', '--reuse-prompts']);
    assert.equal(reused.result.prompts, 'reused');
    const [first, second] = reused.result.points;
    assert.ok(cachedShare(first) < 0.02, JSON.stringify(first.prompt_cache));
    assert.ok(cachedShare(second) > 0.8, JSON.stringify(second.prompt_cache));
    assert.equal(second.prompt_cache.prompt_tokens, first.prompt_cache.prompt_tokens, 'the same prompts');
    assert.equal(first.prompt_cache.cached_tokens + second.prompt_cache.cached_tokens, reused.hits,
      'the cached tokens reported are the server\'s prefix cache hits');

    // Text: the point's block and the sweep's summary.
    assert.match(fresh.run.stdout, /Prompts:\s+drawn for this point/);
    assert.match(fresh.run.stdout, /Cached prompt tokens:\s+0 of \d+ \(0\.0%\)/);
    assert.doesNotMatch(fresh.run.stdout, /warm cache/);
    assert.match(reused.run.stdout, /Prompts:\s+the first point's, at every point/);
    const cachedLine = new RegExp(`Cached prompt tokens:\\s+${second.prompt_cache.cached_tokens} of ${second.prompt_cache.prompt_tokens} \\(\\d+\\.\\d%\\)`);
    assert.match(reused.run.stdout, cachedLine);
    assert.match(reused.run.stdout, /TTFT and throughput at\s+this point measure a\s+warm cache/);
    assert.match(reused.run.stdout, /c=2 .* \d+\.\d% \*\n/);
    // CSV: the cached tokens and share of each point.
    const [header, ...rows] = fs.readFileSync(reused.files.csv, 'utf8').trim().split('\n');
    const columns = header.split(',');
    const cell = (row, name) => row.split(',')[columns.indexOf(name)];
    assert.equal(rows.length, 2);
    assert.equal(Number(cell(rows[1], 'cached_prompt_tokens')), second.prompt_cache.cached_tokens);
    assert.ok(Math.abs(Number(cell(rows[1], 'cached_prompt_share')) - cachedShare(second)) < 1e-3);
    assert.equal(Number(cell(rows[0], 'cached_prompt_tokens')), first.prompt_cache.cached_tokens);
    // HTML: the warm point's row and chart points are marked, with the note; nothing in the fresh run.
    const html = fs.readFileSync(reused.files.html, 'utf8');
    assert.equal((html.match(/<tr class="warm">/g) ?? []).length, 1);
    assert.match(html, /<tr class="warm"><td>2<\/td>/);
    assert.match(html, /class="warm-note"/);
    assert.ok((html.match(/<circle class="warm"/g) ?? []).length >= 6, 'a ring on the warm point of each chart line');
    const freshHtml = fs.readFileSync(fresh.files.html, 'utf8');
    assert.doesNotMatch(freshHtml, /<tr class="warm"|class="warm-note"|<circle class="warm"/);
    assert.match(freshHtml, /prompts drawn per point/);

    // A comparison of both runs marks the warm value and shows the share as a metric.
    const compare = await runBench(['--compare', fresh.files.json, reused.files.json, '--compare-metric', 'cached_prompt_share,ttft_median_ms']);
    assert.equal(compare.code, 0, compare.stderr);
    assert.match(compare.stdout, /Prompt tokens from the prefix cache \(%\)/);
    assert.match(compare.stdout, /\| 2 \| 0\.00 \| \d+\.\d+ \* \|/);
    assert.match(compare.stdout, /Values marked \* come from points where over 5%/);
    // Files joined by '+' are runs of one configuration: their median and range.
    const runs = await runBench(['--compare', `${fresh.files.json}+${reused.files.json}`, '--compare-metric', 'cached_prompt_share']);
    assert.equal(runs.code, 0, runs.stderr);
    assert.match(runs.stdout, /Prompt tokens from the prefix cache \(%\), median \(range\) of 2 runs/);
    assert.match(runs.stdout, /\| 2 \| \d+\.\d+ \(0\.00–\d+\.\d+\) \* \|\n/);
  } finally {
    await server.stop();
  }
});

test('each point of a sweep sends prompts of its own; --reuse-prompts sends the first point\'s again', async () => {
  const fake = await fakeServer((req, res, body) => streamCompletion(res, body, { tokens: 2 }));
  try {
    const sweep = async (extra) => {
      fake.seen.length = 0;
      const run = await runBench(['--base-url', fake.url, '--model', 'fake', '--concurrency', '1,2,3', '--num-requests', '4',
        '--warmup-requests', '1', '--seed', '9', '--input-len', '12', ...extra]);
      assert.equal(run.code, 0, run.stderr);
      // Per point: one warm-up, then four measured requests. Requests of one point run
      // concurrently and reach the server in any order, so each point is compared as a set.
      return [0, 1, 2].map((i) => fake.seen.slice(5 * i, 5 * i + 5).map((s) => s.body.prompt).sort());
    };
    const fresh = await sweep([]);
    const all = fresh.flat();
    assert.equal(new Set(all).size, all.length, 'no prompt is sent twice, warm-ups included');
    const again = await sweep([]);
    assert.deepEqual(again, fresh, 'the seed fixes every point\'s prompts');
    const reused = await sweep(['--reuse-prompts']);
    assert.deepEqual(reused[0], fresh[0], 'the first point is the same either way');
    assert.deepEqual(reused[1], reused[0]);
    assert.deepEqual(reused[2], reused[0]);
  } finally {
    await fake.close();
  }
});

test('--dataset shared-prefix: every prompt starts with the shared words, and the cache serves them', async () => {
  const fake = await fakeServer((req, res, body) => streamCompletion(res, body, { tokens: 2 }));
  try {
    const run = await runBench(['--base-url', fake.url, '--model', 'fake', '--dataset', 'shared-prefix',
      '--shared-prefix-len', '20', '--shared-prefixes', '2', '--input-len', '5', '--num-requests', '6',
      '--warmup-requests', '0']);
    assert.equal(run.code, 0, run.stderr);
    const words = fake.seen.map((s) => s.body.prompt.split(' '));
    for (const w of words) assert.equal(w.length, 25);
    const prefix = (w) => w.slice(0, 20).join(' ');
    assert.equal(prefix(words[0]), prefix(words[2]));
    assert.equal(prefix(words[1]), prefix(words[3]));
    assert.notEqual(prefix(words[0]), prefix(words[1]));
    assert.notEqual(words[0].slice(20).join(' '), words[2].slice(20).join(' '), 'each request has its own question');
    assert.match(run.stderr + run.stdout, /shared-prefix \(2 prefixes of 20 words/);
    const misplaced = await runBench(['--model', 'm', '--shared-prefix-len', '8']);
    assert.equal(misplaced.code, 2);
    assert.match(misplaced.stderr, /--shared-prefix-len applies to --dataset shared-prefix only/);
  } finally {
    await fake.close();
  }

  const server = await startServer(['--threads', '2']);
  try {
    const out = path.join(workDir, 'shared.json');
    const run = await runBench(['--base-url', server.url, '--api-key', server.defaultKey, '--model', 'stories260K',
      '--dataset', 'shared-prefix', '--shared-prefix-len', '64', '--input-len', '8', '--output-len', '4',
      '--num-requests', '6', '--warmup-requests', '1', '--output-json', out], { timeoutMs: 240000 });
    assert.equal(run.code, 0, `${run.stdout}\n${run.stderr}`);
    const p = readJson(out).points[0];
    assert.ok(cachedShare(p) > 0.5, `the warm-up cached the prefix: ${JSON.stringify(p.prompt_cache)}`);
    assert.doesNotMatch(run.stderr, /came from the server's prefix cache/, 'expected of this workload: no warning');
  } finally {
    await server.stop();
  }
});

test('--dataset agent: sessions send their turns in order, each resending the conversation with the real answers', async () => {
  // Each answer names its request, so the next turn must carry exactly that text back.
  const fake = await fakeServer(async (req, res, body, n) => {
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    const base = { id: `c${n}`, object: 'chat.completion.chunk', created: 0, model: 'fake' };
    await sleep(5);
    sse(res, { ...base, choices: [{ index: 0, delta: { content: `answer` }, finish_reason: null }] });
    sse(res, { ...base, choices: [{ index: 0, delta: { content: ` ${n}` }, finish_reason: null }] });
    sse(res, { ...base, choices: [{ index: 0, delta: {}, finish_reason: 'length' }] });
    const prompt = body.messages.length * 10;
    sse(res, { ...base, choices: [], usage: { prompt_tokens: prompt, completion_tokens: 2, total_tokens: prompt + 2, prompt_tokens_details: { cached_tokens: prompt - 10 } } });
    res.end('data: [DONE]\n\n');
  });
  try {
    const html = path.join(workDir, 'agent.html');
    const { run, point } = await benchFake(fake, 'agent', ['--endpoint', 'chat', '--dataset', 'agent', '--sessions', '3',
      '--turns', '3', '--system-prompt-len', '20', '--turn-len-min', '5', '--turn-len-max', '9', '--output-len', '2',
      '--concurrency', '2', '--seed', '4', '--html', html]);
    assert.equal(run.code, 0, `${run.stdout}\n${run.stderr}`);
    assert.equal(fake.seen.length, 9, 'sessions x turns requests');
    assert.equal(point.completed, 9);
    const bySession = new Map();
    fake.seen.forEach((s, n) => {
      const key = s.headers['x-session-affinity'];
      assert.match(key, /^agent-4-\d$/);
      if (!bySession.has(key)) bySession.set(key, []);
      bySession.get(key).push({ n, messages: s.body.messages });
    });
    assert.equal(bySession.size, 3);
    for (const turns of bySession.values()) {
      assert.equal(turns.length, 3);
      assert.equal(turns[0].messages.length, 2);
      assert.equal(turns[0].messages[0].role, 'system');
      assert.equal(turns[0].messages[0].content.split(' ').length, 20);
      for (let t = 1; t < 3; t++) {
        const before = turns[t - 1];
        const now = turns[t].messages;
        assert.deepEqual(now.slice(0, before.messages.length), before.messages, 'the conversation so far, unchanged');
        assert.deepEqual(now[before.messages.length], { role: 'assistant', content: `answer ${before.n}` }, 'the answer it got');
        assert.equal(now[now.length - 1].role, 'user');
        const words = now[now.length - 1].content.split(' ').length;
        assert.ok(words >= 5 && words <= 9, `a new message of ${words} words`);
      }
    }
    // Per turn: the cache's hit ratio (the fake reports all but 10 prompt tokens cached).
    assert.deepEqual(point.turns.map((t) => [t.turn, t.completed, t.prompt_tokens, t.cached_tokens]),
      [[1, 3, 60, 30], [2, 3, 120, 90], [3, 3, 180, 150]]);
    assert.equal(point.sessions_cut, 0);
    assert.match(run.stdout, /Agent sessions by turn/);
    assert.match(run.stdout, /\n {3}3 {8}3 {11}150\/180 {3}83\.3 /);
    assert.doesNotMatch(run.stderr, /came from the server's prefix cache/, 'expected of this workload: no warning');
    const report = fs.readFileSync(html, 'utf8');
    assert.match(report, /id="chart-turn-hit-ratio"/);
    assert.match(report, /agent sessions by turn/);

    // Without affinity no request names a session; the conversations are the same.
    const seenBefore = fake.seen.length;
    const plain = await benchFake(fake, 'agent-plain', ['--endpoint', 'chat', '--dataset', 'agent', '--sessions', '2',
      '--turns', '2', '--system-prompt-len', '20', '--turn-len-min', '5', '--turn-len-max', '9', '--no-session-affinity']);
    assert.equal(plain.run.code, 0, plain.run.stderr);
    assert.equal(fake.seen.length - seenBefore, 4);
    for (const s of fake.seen.slice(seenBefore)) assert.equal(s.headers['x-session-affinity'], undefined);
    assert.match(plain.run.stderr + plain.run.stdout, /session affinity off/);
  } finally {
    await fake.close();
  }

  const misplaced = await runBench(['--model', 'm', '--sessions', '4']);
  assert.equal(misplaced.code, 2);
  assert.match(misplaced.stderr, /--sessions applies to --dataset agent only/);
  const counted = await runBench(['--model', 'm', '--dataset', 'agent', '--num-requests', '4']);
  assert.equal(counted.code, 2);
  assert.match(counted.stderr, /--num-requests does not apply to --dataset agent/);
  const inverted = await runBench(['--model', 'm', '--dataset', 'agent', '--turn-len-min', '50', '--turn-len-max', '40']);
  assert.equal(inverted.code, 2);
  assert.match(inverted.stderr, /--turn-len-max \(40\) is below --turn-len-min \(50\)/);
});

test('--dataset agent against edgeinfer serve: each turn finds the previous turn\'s prompt in the cache', async () => {
  const server = await startServer(['--threads', '2']);
  try {
    // Chat (the model's template around every message) and completions (the contents joined):
    // in both, turn t's prompt must be a token prefix of turn t + 1's, so the cache serves it.
    for (const [endpoint, seed] of [['chat', '1'], ['completions', '2']]) {
      const out = path.join(workDir, `agent-${endpoint}.json`);
      const run = await runBench(['--base-url', server.url, '--api-key', server.defaultKey, '--model', 'stories260K',
        '--endpoint', endpoint, '--dataset', 'agent', '--sessions', '2', '--turns', '3', '--system-prompt-len', '40',
        '--turn-len-min', '8', '--turn-len-max', '16', '--output-len', '4', '--concurrency', '2', '--seed', seed,
        '--warmup-requests', '0', '--output-json', out], { timeoutMs: 240000 });
      assert.equal(run.code, 0, `${run.stdout}\n${run.stderr}`);
      const p = readJson(out).points[0];
      assert.equal(p.completed, 6);
      assert.equal(p.turns.length, 3);
      assert.ok(p.turns[0].cached_tokens < 32, `${endpoint}: the first turns are new: ${JSON.stringify(p.turns[0])}`);
      for (let t = 1; t < 3; t++) {
        // Every full block (16 tokens) of each session's previous prompt, at least.
        const floor = p.turns[t - 1].prompt_tokens - 2 * 16;
        assert.ok(p.turns[t].cached_tokens >= floor,
          `${endpoint}, turn ${t + 1}: ${p.turns[t].cached_tokens} cached, previous prompts ${p.turns[t - 1].prompt_tokens}`);
      }
    }
  } finally {
    await server.stop();
  }
});

test('--compare lays results side by side and the HTML report renders in headless Chromium', async () => {
  const fast = await fakeServer((req, res, body) => streamCompletion(res, body, { ttftMs: 5, gapMs: 2, tokens: 6 }));
  const slow = await fakeServer((req, res, body) => streamCompletion(res, body, { ttftMs: 30, gapMs: 10, tokens: 6 }));
  const files = [];
  try {
    for (const [label, fake] of [['fast', fast], ['slow', slow]]) {
      const file = path.join(workDir, `${label}.json`);
      const run = await runBench(['--base-url', fake.url, '--model', 'fake', '--label', label, '--concurrency', '1,2,4',
        '--num-requests', '8', '--warmup-requests', '0', '--output-json', file,
        '--html', path.join(workDir, `${label}.html`)]);
      assert.equal(run.code, 0, run.stderr);
      files.push(file);
    }
  } finally {
    await fast.close();
    await slow.close();
  }
  const html = path.join(workDir, 'compare.html');
  const compare = await runBench(['--compare', ...files, '--compare-metric', 'output_throughput,ttft_median_ms', '--html', html]);
  assert.equal(compare.code, 0, compare.stderr);
  assert.match(compare.stdout, /\| concurrency \| fast \| slow \| fast vs slow \|/);
  const rows = compare.stdout.split('\n').filter((l) => /^\| (1|2|4) \|/.test(l));
  assert.equal(rows.length, 6, compare.stdout);
  assert.match(rows[0], /\| [+-]\d+\.\d% \|$/);

  const { chromium } = await import('playwright-core');
  const browser = await chromium.launch({ executablePath: '/usr/bin/chromium', args: ['--no-sandbox'] });
  try {
    const page = await browser.newPage({ viewport: { width: 1300, height: 1000 } });
    // Offline: the page may load nothing but itself.
    const fetched = [];
    page.on('request', (r) => { if (!r.url().startsWith('file://')) fetched.push(r.url()); });
    await page.goto(`file://${html}`);
    assert.deepEqual(fetched, []);
    const charts = await page.$$('svg.chart');
    assert.equal(charts.length, 6);
    const shape = await page.$$eval('svg.chart', (svgs) => svgs.map((s) => ({
      id: s.id,
      lines: [...s.querySelectorAll('polyline.series')].map((p) => p.getAttribute('points').trim().split(/\s+/).length),
      dots: s.querySelectorAll('circle').length,
    })));
    for (const c of shape) {
      assert.ok(c.lines.length >= 2, `${c.id}: a line per configuration`);
      for (const n of c.lines) assert.equal(n, 3, `${c.id}: a point per concurrency`);
      assert.ok(c.dots >= 6, c.id);
    }
    // The charts are drawn: the series colours appear in the screenshot of each chart.
    for (const chart of charts) {
      const png = await chart.screenshot();
      const counts = await page.evaluate(async (b64) => {
        const img = new Image();
        img.src = `data:image/png;base64,${b64}`;
        await img.decode();
        const canvas = document.createElement('canvas');
        canvas.width = img.width;
        canvas.height = img.height;
        const ctx = canvas.getContext('2d');
        ctx.drawImage(img, 0, 0);
        const { data } = ctx.getImageData(0, 0, img.width, img.height);
        const near = (i, r, g, b) => Math.abs(data[i] - r) < 40 && Math.abs(data[i + 1] - g) < 40 && Math.abs(data[i + 2] - b) < 40;
        let blue = 0; let red = 0; let ink = 0;
        for (let i = 0; i < data.length; i += 4) {
          if (near(i, 0x1f, 0x77, 0xb4)) blue++;
          if (near(i, 0xd6, 0x27, 0x28)) red++;
          if (data[i] < 200 || data[i + 1] < 200 || data[i + 2] < 200) ink++;
        }
        return { blue, red, ink, total: data.length / 4 };
      }, png.toString('base64'));
      assert.ok(counts.blue > 100, `first series drawn: ${JSON.stringify(counts)}`);
      assert.ok(counts.red > 100, `second series drawn: ${JSON.stringify(counts)}`);
      assert.ok(counts.ink > 0.01 * counts.total && counts.ink < 0.5 * counts.total, JSON.stringify(counts));
    }
    await page.screenshot({ path: path.join(workDir, 'report.png'), fullPage: true });
  } finally {
    await browser.close();
  }
});
