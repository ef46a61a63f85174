// Bad input to the OpenAI API, each a test: malformed JSON, wrong types, empty messages, n=2,
// prompts longer than the context, huge bodies, unknown models, slowloris clients, clients
// that vanish mid-request, a full engine queue, and the SSE heartbeat while a stream waits.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import path from 'node:path';
import { startServer, rawExchange, parseResponse, sleep, waitFor, fetch } from './lib/server.mjs';
import { metric, requiredMetric } from './lib/metrics.mjs';

const models = process.env.EDGE_TEST_MODELS ?? path.resolve('../shared/models');
const storiesGguf = path.join(models, 'stories260K', 'stories260K.gguf');
const modelId = 'stories260K';
const user = (content) => [{ role: 'user', content }];

let server;
before(async () => {
  server = await startServer(['--model', storiesGguf, '--threads', '2', '--kv-cache-memory', '16MiB',
                              '--max-body', '64KiB']);
});
after(async () => { await server?.stop(); });

async function post(route, body, { raw = false } = {}) {
  const res = await fetch(`${server.url}${route}`, {
    method: 'POST', headers: { 'content-type': 'application/json' }, body: raw ? body : JSON.stringify(body),
  });
  return { status: res.status, headers: res.headers, body: await res.json() };
}

function assertInvalid(reply, param, message) {
  assert.equal(reply.status, 400, JSON.stringify(reply.body));
  assert.equal(reply.body.error.type, 'invalid_request_error');
  assert.equal(reply.body.error.param, param);
  if (message) assert.match(reply.body.error.message, message);
  assert.match(reply.headers.get('x-request-id'), /^req_/);
}

test('malformed JSON is a 400 that says so', async () => {
  for (const body of ['{"model": "x", "messages": [', 'not json', '{"a":1} {"b":2}', '']) {
    assertInvalid(await post('/v1/chat/completions', body, { raw: true }), null, /not valid JSON/);
  }
  assertInvalid(await post('/v1/completions', '[1,2,3]', { raw: true }), null, /must be a JSON object/);
});

test('wrong types and out-of-range values name the field', async () => {
  const table = [
    ['/v1/chat/completions', { model: modelId, messages: 'hello' }, 'messages'],
    ['/v1/chat/completions', { model: modelId, messages: [{ role: 'user', content: 42 }] }, 'messages[0].content'],
    ['/v1/chat/completions', { model: modelId, messages: [{ role: 'king', content: 'x' }] }, 'messages[0].role'],
    ['/v1/chat/completions', { model: modelId, messages: user('x'), temperature: 'warm' }, 'temperature'],
    ['/v1/chat/completions', { model: modelId, messages: user('x'), top_p: 7 }, 'top_p'],
    ['/v1/chat/completions', { model: modelId, messages: user('x'), stop: [1] }, 'stop[0]'],
    ['/v1/chat/completions', { model: modelId, messages: user('x'), stream: 'yes' }, 'stream'],
    ['/v1/chat/completions', { model: modelId, messages: user('x'), max_completion_tokens: 0 }, 'max_completion_tokens'],
    ['/v1/chat/completions', { model: 7, messages: user('x') }, 'model'],
    ['/v1/completions', { model: modelId, prompt: { text: 'x' } }, 'prompt'],
    ['/v1/completions', { model: modelId, prompt: 'x', max_tokens: -5 }, 'max_tokens'],
    ['/v1/completions', { model: modelId, prompt: 'x', seed: 'lucky' }, 'seed'],
    ['/v1/completions', { model: modelId, prompt: 'x', presence_penalty: 9 }, 'presence_penalty'],
    ['/v1/completions', { model: modelId, prompt: [1, 100000] }, 'prompt[1]'],  // past the 512-token vocabulary
  ];
  for (const [route, body, param] of table) assertInvalid(await post(route, body), param);
});

test('empty messages, a missing prompt and an empty prompt are 400s', async () => {
  assertInvalid(await post('/v1/chat/completions', { model: modelId, messages: [] }), 'messages', /at least one/);
  assertInvalid(await post('/v1/chat/completions', { model: modelId }), 'messages', /required/);
  assertInvalid(await post('/v1/completions', { model: modelId }), 'prompt', /required/);
});

test('n outside 1..128 is a 400 naming n', async () => {
  assertInvalid(await post('/v1/chat/completions', { model: modelId, messages: user('x'), n: 0 }), 'n', /from 1 to 128/);
  assertInvalid(await post('/v1/completions', { model: modelId, prompt: 'x', n: 129 }), 'n', /from 1 to 128/);
});

test('a prompt longer than the context is 400 context_length_exceeded', async () => {
  const long = 'Once upon a time there was a dog. '.repeat(300);  // about 3,000 tokens; the context is 2,048
  const chat = await post('/v1/chat/completions', { model: modelId, messages: user(long) });
  assertInvalid(chat, 'messages', /maximum context length is 2048 tokens/);
  assert.equal(chat.body.error.code, 'context_length_exceeded');
  const completion = await post('/v1/completions', { model: modelId, prompt: long });
  assertInvalid(completion, 'prompt', /maximum context length/);
  assert.equal(completion.body.error.code, 'context_length_exceeded');
  // A short prompt with max_tokens past the context is refused too.
  const tooMany = await post('/v1/completions', { model: modelId, prompt: 'Hi', max_tokens: 5000 });
  assertInvalid(tooMany, 'max_tokens', /you requested 5\d\d\d tokens/);
  assert.equal(tooMany.body.error.code, 'context_length_exceeded');
});

test('--max-model-len lowers the context served', async () => {
  const small = await startServer(['--model', storiesGguf, '--threads', '1', '--kv-cache-memory', '4MiB',
                                   '--max-model-len', '32', '--log-format', 'json']);
  try {
    const res = await fetch(`${small.url}/v1/completions`, {
      method: 'POST', headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ prompt: 'Once upon a time there was a little dog named Max. He liked to run in the park. '.repeat(3) }),
    });
    assert.equal(res.status, 400);
    const { error } = await res.json();
    assert.equal(error.code, 'context_length_exceeded');
    assert.match(error.message, /maximum context length is 32 tokens/);
    assert.equal((await (await fetch(`${small.url}/v1/models`)).json()).data[0].max_model_len, 32);
    // Without max_tokens, a chat gets the rest of the context and stops there.
    const fits = await fetch(`${small.url}/v1/chat/completions`, {
      method: 'POST', headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ messages: user('Hi'), temperature: 0, ignore_eos: true }),
    });
    const answer = await fits.json();
    assert.equal(fits.status, 200, JSON.stringify(answer));
    assert.equal(answer.usage.total_tokens, 32);
    assert.equal(answer.choices[0].finish_reason, 'length');
    // With --log-format json the access line's fields are members of its object.
    const id = fits.headers.get('x-request-id');
    await waitFor('the access log line', async () => small.log.includes(id));
    const entry = small.log.split('\n').filter((l) => l.includes(id)).map((l) => JSON.parse(l))
      .find((e) => e.component === 'access');
    assert.equal(entry.msg, 'POST /v1/chat/completions');
    assert.equal(entry.status, 200);
    assert.equal(entry.request_id, id);
    assert.equal(entry.tenant, 'default');
    assert.equal(entry.prompt_tokens + entry.completion_tokens, 32);
    assert.equal(typeof entry.ttft_ms, 'number');
    assert.equal(typeof entry.duration_ms, 'number');
  } finally {
    await small.stop();
  }
});

test('a body over --max-body is a 413', async () => {
  const body = JSON.stringify({ model: modelId, messages: user('x'.repeat(100 * 1024)) });
  const head = `POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n` +
               `Content-Length: ${Buffer.byteLength(body)}\r\n\r\n`;
  const reply = parseResponse(await rawExchange(server.port, [head, body]));
  assert.equal(reply.status, 413);
  assert.equal(JSON.parse(reply.body).error.code, 'request_too_large');
});

test('an unknown model is a 404 model_not_found', async () => {
  const reply = await post('/v1/chat/completions', { model: 'gpt-4o', messages: user('x') });
  assert.equal(reply.status, 404);
  assert.equal(reply.body.error.code, 'model_not_found');
  assert.equal(reply.body.error.param, 'model');
  const res = await fetch(`${server.url}/v1/models/gpt-4o`);
  assert.equal(res.status, 404);
  assert.equal((await res.json()).error.code, 'model_not_found');
  // Percent-encoded ids are decoded: "org/name" ids arrive as %2F.
  assert.equal((await fetch(`${server.url}/v1/models/${encodeURIComponent(modelId)}`)).status, 200);
  assert.equal((await fetch(`${server.url}/v1/models/org%2Fname`)).status, 404);
});

test('error bodies are valid UTF-8 even when they repeat request bytes that are not', async () => {
  const strict = new TextDecoder('utf-8', { fatal: true });
  const request = Buffer.concat([Buffer.from('GET /v1/caf'), Buffer.from([0xC3, 0xFF, 0xFE]),
                                 Buffer.from(' HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n')]);
  const bytes = await new Promise((resolve, reject) => {
    const socket = net.connect(server.port, '127.0.0.1', () => socket.end(request));
    const chunks = [];
    socket.on('data', (d) => chunks.push(d));
    socket.on('close', () => resolve(Buffer.concat(chunks)));
    socket.on('error', reject);
  });
  const text = strict.decode(bytes);
  const reply = parseResponse(text);
  assert.equal(reply.status, 404);
  assert.match(JSON.parse(reply.body).error.message, /Invalid URL \(GET \/v1\/caf\uFFFD\uFFFD\uFFFD\)/);
});

// Opens a raw connection and sends `request`; resolves once `until` matches what came back.
function openRaw(port, request, until) {
  return new Promise((resolve, reject) => {
    const socket = net.connect(port, '127.0.0.1');
    socket.received = '';
    socket.ended = new Promise((r) => socket.on('close', r));
    socket.on('error', () => {});
    socket.on('data', (d) => {
      socket.received += d;
      if (until && until.test(socket.received)) {
        until = null;
        resolve(socket);
      }
    });
    socket.on('connect', () => {
      socket.write(request);
      if (!until) resolve(socket);
    });
    setTimeout(() => reject(new Error(`no match for ${until} in:\n${socket.received}`)), 30000);
  });
}

function postRequest(route, body, key = server.defaultKey) {
  const text = JSON.stringify(body);
  return `POST ${route} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nAuthorization: Bearer ${key}\r\n` +
         `Content-Length: ${Buffer.byteLength(text)}\r\n\r\n${text}`;
}

// A request that runs far longer than the test needs to act on it.
const longRequest = { model: modelId, prompt: 'Once upon a time', max_tokens: 2000, temperature: 0, ignore_eos: true };

test('a client vanishing mid-stream: its request is cancelled, its blocks freed, the server serves on', async () => {
  const total = await requiredMetric(server, 'edgeinfer_kv_cache_blocks');
  await waitFor('an idle engine', async () => (await metric(server, 'edgeinfer_kv_cache_blocks_free')) === total);
  const aborts = await metric(server, 'edgeinfer_request_success_total', { finished_reason: 'abort' });

  const socket = await openRaw(server.port, postRequest('/v1/completions', { ...longRequest, stream: true }),
                               /"text":"[^"]+"[\s\S]*"text":"[^"]+"/);
  assert.equal(await metric(server, 'edgeinfer_active_streams'), 1);
  socket.destroy();

  await waitFor('the blocks to come back', async () =>
    (await metric(server, 'edgeinfer_kv_cache_blocks_free')) === total);
  assert.equal(await metric(server, 'edgeinfer_request_success_total', { finished_reason: 'abort' }), aborts + 1);
  await waitFor('the stream to close', async () => (await metric(server, 'edgeinfer_active_streams')) === 0);
  const after = await post('/v1/completions', { model: modelId, prompt: 'Once upon a time', max_tokens: 5, temperature: 0 });
  assert.equal(after.status, 200);
  assert.equal(after.body.usage.completion_tokens, 5);
});

test('a client vanishing while waiting for a whole (non-streamed) answer cancels it too', async () => {
  const total = await requiredMetric(server, 'edgeinfer_kv_cache_blocks');
  await waitFor('an idle engine', async () => (await metric(server, 'edgeinfer_kv_cache_blocks_free')) === total);
  const aborts = await metric(server, 'edgeinfer_request_success_total', { finished_reason: 'abort' });
  const socket = await openRaw(server.port, postRequest('/v1/completions', longRequest), null);
  await waitFor('the request to run', async () => (await metric(server, 'edgeinfer_num_requests_running')) === 1);
  socket.destroy();
  await waitFor('the blocks to come back', async () =>
    (await metric(server, 'edgeinfer_kv_cache_blocks_free')) === total);
  assert.equal(await metric(server, 'edgeinfer_request_success_total', { finished_reason: 'abort' }), aborts + 1);
  assert.equal(socket.received, '', 'nothing was answered');
  // 499, as proxies log a client that closed its request.
  await waitFor('the access log line', async () => /access: POST \/v1\/completions status=499 /.test(server.log));
});

test('slowloris: a request trickled in slower than --idle-timeout is cut off with 408', async () => {
  const slow = await startServer(['--model', storiesGguf, '--threads', '1', '--kv-cache-memory', '4MiB',
                                  '--idle-timeout', '1s']);
  try {
    const body = JSON.stringify({ model: modelId, prompt: 'Once upon a time', max_tokens: 4 });
    const head = `POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n` +
                 `Content-Length: ${body.length}\r\n\r\n`;
    // Headers at once, then the body a byte every 200 ms: the whole body would take seconds.
    const bodyTrickle = await openRaw(slow.port, head, null);
    for (let i = 0; i < body.length && !bodyTrickle.destroyed && bodyTrickle.writable; ++i) {
      bodyTrickle.write(body[i]);
      if (bodyTrickle.received) break;
      await sleep(200);
    }
    await bodyTrickle.ended;
    const reply = parseResponse(bodyTrickle.received);
    assert.equal(reply.status, 408);
    assert.equal(JSON.parse(reply.body).error.code, 'timeout');

    // Headers trickled: never complete, closed as well.
    const headerTrickle = await openRaw(slow.port, 'POST /v1/comp', null);
    for (const piece of ['letions HTTP/1.1\r\n', 'Host: x\r\n', 'X-Slow: 1\r\n', 'X-Slow: 2\r\n', 'X-Slow: 3\r\n',
                         'X-Slow: 4\r\n', 'X-Slow: 5\r\n', 'X-Slow: 6\r\n', 'X-Slow: 7\r\n', 'X-Slow: 8\r\n']) {
      if (headerTrickle.received || !headerTrickle.writable) break;
      headerTrickle.write(piece);
      await sleep(200);
    }
    await headerTrickle.ended;
    assert.equal(parseResponse(headerTrickle.received).status, 408);
    // The server serves on.
    assert.equal((await fetch(`${slow.url}/healthz`)).status, 200);
  } finally {
    await slow.stop();
  }
});

test('a full engine queue is a 503 with retry-after; a waiting stream gets : ping heartbeats', async () => {
  const busy = await startServer(['--model', storiesGguf, '--threads', '1', '--kv-cache-memory', '16MiB',
                                  '--max-num-seqs', '1', '--max-queued-requests', '1', '--sse-heartbeat', '10ms']);
  try {
    // The one running request, then one waiting behind it.
    const running = await openRaw(busy.port, postRequest('/v1/completions', { ...longRequest, stream: true }, busy.defaultKey),
                                  /"text":"[^"]+"/);
    const waiting = await openRaw(busy.port, postRequest('/v1/chat/completions',
                                                         { model: modelId, messages: user('Hi'), max_tokens: 3, stream: true },
                                                         busy.defaultKey),
                                  /: ping\n\n[\s\S]*: ping\n\n/);
    // The waiting stream has its role chunk and heartbeats, and no content yet.
    assert.match(waiting.received, /"delta":\{"role":"assistant","content":""\}/);
    assert.doesNotMatch(waiting.received, /"delta":\{"content"/);

    const refused = await fetch(`${busy.url}/v1/completions`, {
      method: 'POST', headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: modelId, prompt: 'Hi', max_tokens: 2 }),
    });
    assert.equal(refused.status, 503);
    assert.equal(refused.headers.get('retry-after'), '1');
    const { error } = await refused.json();
    assert.equal(error.code, 'overloaded');
    assert.match(error.message, /overloaded/);

    // Once the running request goes, the waiting one is served to its end.
    running.destroy();
    await waitFor('the waiting stream to end', async () => waiting.received.includes('data: [DONE]'));
    assert.match(waiting.received, /"finish_reason":"(length|stop)"/);
    waiting.destroy();
  } finally {
    await busy.stop();
  }
});
