// The engine behind `edgeinfer serve`, over real HTTP on loopback with stories260K: POST
// /v1/completions streamed and not, a client that goes away mid-stream (its KV blocks are
// freed: /metrics shows every block free again), a full queue (503 with retry-after), bad
// input, and the engine's metrics.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import { spawnSync } from 'node:child_process';
import { startServer, sleep, fetch } from './lib/server.mjs';
import { requiredSeriesValue as value, scrape } from './lib/metrics.mjs';

const models = process.env.EDGE_TEST_MODELS ?? path.resolve('../shared/models');
const model = path.join(models, 'stories260K', 'stories260K.gguf');
// The fixture's README: greedy continuation of "Once upon a time".
const referenceText = 'Once upon a time, there was a little girl named Lily. She loved to play outside in the park. '
  + 'One day, she saw a big, red ball. She wanted to play with it, but it was too high.\nLily';

// A small KV cache (52k tokens of stories260K in f32) starts faster than the default 1 GiB.
const small = ['--model', model, '--threads', '1', '--kv-cache-memory', '64MiB'];

let server;
before(async () => { server = await startServer(small); });
after(async () => { await server?.stop(); });

function complete(body, { url = server.url, signal, headers = {} } = {}) {
  return fetch(`${url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: typeof body === 'string' ? body : JSON.stringify(body),
    signal,
  });
}

// Reads an SSE response to its end: the JSON events, and whether [DONE] came last.
async function readEvents(res) {
  const text = await res.text();
  const blocks = text.split('\n\n').filter((b) => b.length > 0);
  const done = blocks.at(-1) === 'data: [DONE]';
  const events = blocks.filter((b) => b !== 'data: [DONE]').map((b) => {
    assert.ok(b.startsWith('data: '), `not an SSE data line: ${b}`);
    return JSON.parse(b.slice('data: '.length));
  });
  return { events, done };
}

test('a greedy completion continues the prompt as the reference implementation does', async () => {
  const res = await complete({ prompt: 'Once upon a time', max_tokens: 30, temperature: 0 });
  assert.equal(res.status, 200);
  const body = await res.json();
  assert.equal(body.object, 'text_completion');
  assert.equal(body.choices.length, 1);
  assert.equal(body.choices[0].finish_reason, 'length');
  assert.ok(referenceText.startsWith(`Once upon a time${body.choices[0].text}`), body.choices[0].text);
  assert.ok(body.choices[0].text.length > 40);
  assert.equal(body.usage.prompt_tokens, 5);
  assert.equal(body.usage.completion_tokens, 30);
  assert.equal(body.usage.total_tokens, 35);
});

test('a streamed completion sends the same text in SSE chunks, then [DONE]', async () => {
  const res = await complete({
    prompt: 'Once upon a time', max_tokens: 30, temperature: 0, stream: true, stream_options: { include_usage: true },
  });
  assert.equal(res.status, 200);
  assert.match(res.headers.get('content-type'), /^text\/event-stream/);
  const { events, done } = await readEvents(res);
  assert.ok(done, 'the stream ends with data: [DONE]');
  const text = events.flatMap((e) => e.choices).map((c) => c.text).join('');
  assert.ok(referenceText.startsWith(`Once upon a time${text}`), text);
  const last = events.at(-2).choices[0];
  assert.equal(last.finish_reason, 'length');
  const usage = events.at(-1);
  assert.deepEqual(usage.choices, []);
  assert.equal(usage.usage.completion_tokens, 30);
});

test('a repeated prompt is served from the prefix cache and reports cached tokens', async () => {
  const prompt = 'Tom and Sue went to the park. They saw a big dog and a little cat. The dog was brown and the cat '
    + 'was white. Tom wanted to play with the dog.';
  const first = await (await complete({ prompt, max_tokens: 8, temperature: 0 })).json();
  const second = await (await complete({ prompt, max_tokens: 8, temperature: 0 })).json();
  assert.equal(second.choices[0].text, first.choices[0].text);
  assert.ok(second.usage.prompt_tokens > 32);
  assert.equal(second.usage.prompt_tokens_details.cached_tokens,
    Math.floor((second.usage.prompt_tokens - 1) / 16) * 16);
  const text = await scrape(server);
  assert.ok(value(text, 'edgeinfer_prefix_cache_hits_total') > 0);
});

test('a client that closes a stream frees its KV blocks: blocks_free returns to blocks_total', async () => {
  const before = await scrape(server);
  const total = value(before, 'edgeinfer_kv_cache_blocks');
  assert.ok(total > 0);
  assert.equal(value(before, 'edgeinfer_kv_cache_blocks_free'), total);
  const abortsBefore = value(before, 'edgeinfer_request_success_total', { finished_reason: 'abort' });
  const generatedBefore = value(before, 'edgeinfer_generation_tokens_total');

  // Long enough that it would run for a while: 2000 tokens, EOS ignored.
  const controller = new AbortController();
  const res = await complete({ prompt: 'Once upon a time', max_tokens: 2000, temperature: 0, ignore_eos: true, stream: true },
    { signal: controller.signal });
  assert.equal(res.status, 200);
  const reader = res.body.getReader();
  const { value: firstChunk } = await reader.read();
  assert.match(new TextDecoder().decode(firstChunk), /^data: \{/);
  controller.abort();  // closes the connection

  let text;
  for (let i = 0; i < 600; ++i) {
    text = await scrape(server);
    if (value(text, 'edgeinfer_kv_cache_blocks_free') === total
        && value(text, 'edgeinfer_request_success_total', { finished_reason: 'abort' }) === abortsBefore + 1) break;
    await sleep(50);
  }
  assert.equal(value(text, 'edgeinfer_kv_cache_blocks_free'), total);
  assert.equal(value(text, 'edgeinfer_kv_cache_usage_ratio'), 0);
  assert.equal(value(text, 'edgeinfer_num_requests_running'), 0);
  // It ended as aborted, long before its 2000 tokens.
  assert.equal(value(text, 'edgeinfer_request_success_total', { finished_reason: 'abort' }), abortsBefore + 1);
  assert.ok(value(text, 'edgeinfer_generation_tokens_total') - generatedBefore < 2000);
});

test('the engine metrics are valid Prometheus text with vLLM\'s families', async () => {
  const text = await scrape(server);
  for (const family of ['num_requests_running', 'num_requests_waiting', 'kv_cache_usage_ratio',
    'kv_cache_blocks', 'kv_cache_blocks_free', 'kv_cache_capacity_tokens', 'prompt_tokens_total',
    'generation_tokens_total', 'num_preemptions_total', 'prefix_cache_queries_total', 'prefix_cache_hits_total',
    'request_success_total', 'time_to_first_token_seconds', 'inter_token_latency_seconds',
    'e2e_request_latency_seconds', 'request_queue_time_seconds', 'iteration_tokens', 'cache_config_info']) {
    assert.match(text, new RegExp(`^# TYPE edgeinfer_${family} `, 'm'), family);
  }
  assert.match(text, /^edgeinfer_cache_config_info\{active_weight_bytes_per_token="\d+",architecture="llama",attention="gqa",block_size="16",experts="0",experts_per_token="0",kv_dtype="f32",num_gpu_blocks="\d+",shared_experts="0",weight_dtype="f32"\} 1$/m);
  assert.ok(value(text, 'edgeinfer_time_to_first_token_seconds_count') >= 3);
  assert.ok(value(text, 'edgeinfer_request_success_total', { finished_reason: 'length' }) >= 3);
  const check = spawnSync('promtool', ['check', 'metrics'], { input: text, encoding: 'utf8' });
  const problems = `${check.stdout}${check.stderr}`.split('\n').filter((line) => line.trim() !== '');
  assert.deepEqual(problems, [], `promtool check metrics failed:\n${check.stdout}${check.stderr}`);
});

test('a prompt longer than the context is a 400 context_length_exceeded', async () => {
  // stories260K's context is 2048 tokens; this prompt is over 3000.
  const res = await complete({ prompt: 'the cat sat. '.repeat(1000), max_tokens: 4 });
  assert.equal(res.status, 400);
  const body = await res.json();
  assert.equal(body.error.code, 'context_length_exceeded');
  assert.equal(body.error.param, 'prompt');
  assert.match(body.error.message, /context length is 2048 tokens/);
});

test('an unknown model is a 404 model_not_found', async () => {
  const res = await complete({ model: 'gpt-4', prompt: 'Hi' });
  assert.equal(res.status, 404);
  assert.equal((await res.json()).error.code, 'model_not_found');
});

test('beyond --max-queued-requests, requests get 503 with retry-after while the others complete', async () => {
  // One request runs at a time and one may wait: of 12 sent at once, most are refused.
  const busy = await startServer([...small, '--max-num-seqs', '1', '--max-queued-requests', '1']);
  try {
    const responses = await Promise.all(Array.from({ length: 12 }, () => complete(
      { prompt: 'Once upon a time', max_tokens: 1000, temperature: 0, ignore_eos: true }, { url: busy.url })));
    const bodies = await Promise.all(responses.map((r) => r.json()));
    const refused = responses.filter((r) => r.status === 503);
    const served = responses.filter((r) => r.status === 200);
    assert.equal(refused.length + served.length, 12);
    assert.ok(refused.length >= 1, 'some requests are refused');
    assert.ok(served.length >= 1, 'some requests are served');
    for (const r of refused) assert.equal(r.headers.get('retry-after'), '1');
    for (let i = 0; i < responses.length; ++i) {
      if (responses[i].status === 503) {
        assert.equal(bodies[i].error.code, 'overloaded');
        assert.match(bodies[i].error.message, /overloaded/);
      } else {
        assert.equal(bodies[i].usage.completion_tokens, 1000);
      }
    }
    // The queue empties again: a later request is served.
    const later = await complete({ prompt: 'Once upon a time', max_tokens: 4 }, { url: busy.url });
    assert.equal(later.status, 200);
    await later.json();
  } finally {
    await busy.stop();
  }
});
