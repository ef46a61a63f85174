// The OpenAI API of `edgeinfer serve` on stories260K, driven by the official `openai` npm SDK:
// chat and completions, streaming and not, usage, the models API, stop, seeds, an aborted
// stream freeing its KV blocks, the SDK's error classes, and the SSE wire format.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import OpenAI from 'openai';
import { startServer, waitFor, fetch, sleep } from './lib/server.mjs';
import { metric, requiredMetric } from './lib/metrics.mjs';

const models = process.env.EDGE_TEST_MODELS ?? path.resolve('../shared/models');
const storiesGguf = path.join(models, 'stories260K', 'stories260K.gguf');
const modelId = 'stories260K';
// stories260K's greedy continuation of "Once upon a time" (60 tokens; its README's reference).
const referenceContinuation =
  ', there was a little girl named Lily. She loved to play outside in the park. One day, she saw a ' +
  'big, red ball. She wanted to play with it, but it was too high.\nLily';

let server;
let client;
before(async () => {
  server = await startServer(['--model', storiesGguf, '--threads', '2', '--kv-cache-memory', '16MiB']);
  client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: server.defaultKey, maxRetries: 0 });
});
after(async () => { await server?.stop(); });

test('models.list and models.retrieve name the served model', async () => {
  const list = await client.models.list();
  assert.equal(list.data.length, 1);
  const [model] = list.data;
  assert.equal(model.id, modelId);
  assert.equal(model.object, 'model');
  assert.equal(model.owned_by, 'edgeinfer');
  assert.ok(Number.isInteger(model.created) && model.created > 1.6e9);
  const one = await client.models.retrieve(modelId);
  assert.deepEqual(one, model);
});

test('models.retrieve of an unknown model is the SDK\'s NotFoundError (model_not_found)', async () => {
  await assert.rejects(client.models.retrieve('gpt-4o'), (error) => {
    assert.ok(error instanceof OpenAI.NotFoundError, String(error));
    assert.equal(error.status, 404);
    assert.equal(error.code, 'model_not_found');
    assert.equal(error.param, 'model');
    return true;
  });
});

test('completions: the greedy text is the model\'s reference, with usage', async () => {
  const completion = await client.completions.create({
    model: modelId, prompt: 'Once upon a time', max_tokens: 60, temperature: 0,
  });
  assert.equal(completion.object, 'text_completion');
  assert.equal(completion.model, modelId);
  assert.match(completion.id, /^cmpl-/);
  assert.equal(completion.choices.length, 1);
  assert.equal(completion.choices[0].text, referenceContinuation);
  assert.equal(completion.choices[0].finish_reason, 'length');
  assert.equal(completion.choices[0].index, 0);
  assert.equal(completion.usage.prompt_tokens, 5);  // <s> Once upon a time
  assert.equal(completion.usage.completion_tokens, 60);
  assert.equal(completion.usage.total_tokens, 65);
  assert.equal(typeof completion.usage.prompt_tokens_details.cached_tokens, 'number');
  assert.match(completion._request_id, /^req_[0-9a-f]{32}$/);  // the SDK reads x-request-id
});

test('completions, streamed: the same text in deltas, the finish, then the usage chunk', async () => {
  const stream = await client.completions.create({
    model: modelId, prompt: 'Once upon a time', max_tokens: 60, temperature: 0, stream: true,
    stream_options: { include_usage: true },
  });
  let text = '';
  const chunks = [];
  for await (const chunk of stream) chunks.push(chunk);
  const usageChunk = chunks.at(-1);
  assert.deepEqual(usageChunk.choices, []);
  assert.deepEqual(usageChunk.usage, {
    prompt_tokens: 5, completion_tokens: 60, total_tokens: 65,
    prompt_tokens_details: { cached_tokens: usageChunk.usage.prompt_tokens_details.cached_tokens },
  });
  const finish = chunks.at(-2);
  assert.equal(finish.choices[0].finish_reason, 'length');
  for (const chunk of chunks.slice(0, -1)) {
    assert.equal(chunk.object, 'text_completion');
    assert.equal(chunk.usage, null);  // present and null until the usage chunk, as OpenAI sends it
    text += chunk.choices[0].text;
  }
  assert.ok(chunks.length > 10, `only ${chunks.length} chunks: deltas are not sent as produced`);
  assert.equal(text, referenceContinuation);
});

test('chat: an assistant message with usage; streamed: role first, the same content, finish, usage', async () => {
  const request = { model: modelId, messages: [{ role: 'user', content: 'Once upon a time' }], max_tokens: 30, temperature: 0 };
  const whole = await client.chat.completions.create(request);
  assert.equal(whole.object, 'chat.completion');
  assert.match(whole.id, /^chatcmpl-/);
  const [choice] = whole.choices;
  assert.equal(choice.message.role, 'assistant');
  assert.equal(typeof choice.message.content, 'string');
  assert.ok(choice.message.content.length > 0);
  assert.ok(['stop', 'length'].includes(choice.finish_reason));
  assert.ok(whole.usage.prompt_tokens > 5, 'the chat template adds tokens around the message');
  assert.equal(whole.usage.total_tokens, whole.usage.prompt_tokens + whole.usage.completion_tokens);

  const stream = await client.chat.completions.create({ ...request, stream: true, stream_options: { include_usage: true } });
  const chunks = [];
  for await (const chunk of stream) chunks.push(chunk);
  assert.deepEqual(chunks[0].choices[0].delta, { role: 'assistant', content: '' });
  assert.equal(chunks[0].object, 'chat.completion.chunk');
  const content = chunks.slice(1, -2).map((c) => c.choices[0].delta.content).join('');
  assert.equal(content, choice.message.content);
  assert.deepEqual(chunks.at(-2).choices[0].delta, {});
  assert.equal(chunks.at(-2).choices[0].finish_reason, choice.finish_reason);
  assert.deepEqual(chunks.at(-1).choices, []);
  const { usage } = chunks.at(-1);
  assert.equal(usage.prompt_tokens, whole.usage.prompt_tokens);
  assert.equal(usage.completion_tokens, whole.usage.completion_tokens);
  assert.equal(usage.total_tokens, whole.usage.total_tokens);
  // The same prompt again: its full 16-token block comes from the prefix cache.
  assert.equal(usage.prompt_tokens_details.cached_tokens, 16 * Math.floor((whole.usage.prompt_tokens - 1) / 16));
});

test('chat content as an array of text parts is the same as the joined string', async () => {
  const base = { model: modelId, max_tokens: 12, temperature: 0 };
  const asString = await client.chat.completions.create({
    ...base, messages: [{ role: 'system', content: 'Tell a story.' }, { role: 'user', content: 'Once upon a time' }],
  });
  const asParts = await client.chat.completions.create({
    ...base,
    messages: [{ role: 'system', content: [{ type: 'text', text: 'Tell a story.' }] },
               { role: 'user', content: [{ type: 'text', text: 'Once upon' }, { type: 'text', text: ' a time' }] }],
  });
  assert.equal(asParts.choices[0].message.content, asString.choices[0].message.content);
  assert.equal(asParts.usage.prompt_tokens, asString.usage.prompt_tokens);
});

test('stop ends the text right before the stop string, with finish_reason stop', async () => {
  const completion = await client.completions.create({
    model: modelId, prompt: 'Once upon a time', max_tokens: 60, temperature: 0, stop: [' girl', 'zzz'],
  });
  assert.equal(completion.choices[0].text, ', there was a little');
  assert.equal(completion.choices[0].finish_reason, 'stop');
  const streamed = await client.completions.create({
    model: modelId, prompt: 'Once upon a time', max_tokens: 60, temperature: 0, stop: ' girl', stream: true,
  });
  let text = '';
  let reason = null;
  for await (const chunk of streamed) {
    text += chunk.choices[0].text;
    reason = chunk.choices[0].finish_reason ?? reason;
  }
  assert.equal(text, ', there was a little');
  assert.equal(reason, 'stop');
});

test('the same seed and temperature give the same text; other seeds differ', async () => {
  const ask = async (seed) => (await client.completions.create({
    model: modelId, prompt: 'The dog', max_tokens: 40, temperature: 1.0, seed,
  })).choices[0].text;
  const first = await ask(1234);
  assert.equal(await ask(1234), first);
  const chat = async (seed) => (await client.chat.completions.create({
    model: modelId, messages: [{ role: 'user', content: 'The dog' }], max_tokens: 40, temperature: 1.0, seed,
  })).choices[0].message.content;
  assert.equal(await chat(99), await chat(99));
  // 40 tokens drawn at temperature 1: three other seeds all matching would mean the seed is unused.
  const others = [await ask(1), await ask(2), await ask(3)];
  assert.ok(others.some((text) => text !== first), 'every seed gave the same text');
});

test('an aborted stream is cancelled in the engine and frees its KV blocks', async () => {
  const total = await metric(server, 'edgeinfer_kv_cache_blocks');
  assert.ok(total > 0);
  await waitFor('an idle engine', async () => (await metric(server, 'edgeinfer_kv_cache_blocks_free')) === total);
  const abortsBefore = await metric(server, 'edgeinfer_request_success_total', { finished_reason: 'abort' });

  const controller = new AbortController();
  // Far more tokens than arrive before the abort: only a cancellation ends it early.
  const stream = await client.completions.create(
    { model: modelId, prompt: 'Once upon a time', max_tokens: 2000, temperature: 0, stream: true, ignore_eos: true },
    { signal: controller.signal });
  let chunks = 0;
  try {
    for await (const chunk of stream) {
      assert.equal(chunk.object, 'text_completion');
      if (++chunks === 3) {
        // While it runs, the request holds blocks.
        assert.ok((await metric(server, 'edgeinfer_kv_cache_blocks_free')) < total, 'a running request holds no blocks');
        controller.abort();
      }
    }
  } catch (error) {
    // The SDK ends the iteration quietly on abort, or throws its abort error.
    if (!(error instanceof OpenAI.APIUserAbortError || error.name === 'AbortError')) throw error;
  }
  assert.ok(chunks >= 3 && chunks < 100, `${chunks} chunks arrived`);

  await waitFor('the blocks to come back', async () => (await metric(server, 'edgeinfer_kv_cache_blocks_free')) === total);
  assert.equal(await requiredMetric(server, 'edgeinfer_num_requests_running'), 0);
  assert.equal(await metric(server, 'edgeinfer_request_success_total', { finished_reason: 'abort' }), abortsBefore + 1);
  assert.equal(await requiredMetric(server, 'edgeinfer_active_streams'), 0);
  // The server serves on.
  const after = await client.completions.create({ model: modelId, prompt: 'Once upon a time', max_tokens: 5, temperature: 0 });
  assert.equal(after.choices[0].text, ', there was a little');
});

test('400s are the SDK\'s BadRequestError with the field named', async () => {
  const cases = [
    [{ model: modelId, messages: [{ role: 'user', content: 'hi' }], n: 0 }, 'n'],
    [{ model: modelId, messages: [] }, 'messages'],
    [{ model: modelId, messages: [{ role: 'user', content: 'hi' }], temperature: 3 }, 'temperature'],
    [{ model: modelId, messages: [{ role: 'user', content: 'hi' }], max_tokens: 'ten' }, 'max_tokens'],
    [{ model: modelId, messages: [{ role: 'user', content: [{ type: 'image_url', image_url: { url: 'x' } }] }] },
     'messages[0].content[0].type'],
  ];
  for (const [body, param] of cases) {
    await assert.rejects(client.chat.completions.create(body), (error) => {
      assert.ok(error instanceof OpenAI.BadRequestError, `${JSON.stringify(body)}: ${error}`);
      assert.equal(error.status, 400);
      assert.equal(error.type, 'invalid_request_error');
      assert.equal(error.param, param);
      return true;
    });
  }
});

test('an unknown model in a completion request is the SDK\'s NotFoundError', async () => {
  await assert.rejects(client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] }),
    (error) => error instanceof OpenAI.NotFoundError && error.code === 'model_not_found');
});

test('SSE on the wire: headers, data frames, [DONE] last, and x-request-id', async () => {
  const res = await fetch(`${server.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'x-request-id': 'wire-test-1' },
    body: JSON.stringify({ model: modelId, messages: [{ role: 'user', content: 'Hi' }], max_tokens: 8, stream: true }),
  });
  assert.equal(res.status, 200);
  assert.equal(res.headers.get('content-type'), 'text/event-stream');
  assert.equal(res.headers.get('cache-control'), 'no-cache');
  assert.equal(res.headers.get('x-accel-buffering'), 'no');
  assert.equal(res.headers.get('x-request-id'), 'wire-test-1');
  const body = await res.text();
  assert.ok(body.endsWith('data: [DONE]\n\n'), body.slice(-100));
  const frames = body.split('\n\n').filter((f) => f !== '');
  for (const frame of frames) assert.match(frame, /^data: /);
  const events = frames.slice(0, -1).map((f) => JSON.parse(f.slice(6)));
  assert.ok(events.every((e) => e.id === 'chatcmpl-wire-test-1'));
  assert.ok(!events.some((e) => 'usage' in e), 'no usage member unless stream_options.include_usage');
});

test('usage is counted per tenant and every request gets an access log line', async () => {
  // The tenant's series appear with its first request: 0 until then.
  const tokens = (kind) => metric(server, 'edgeinfer_tenant_tokens_total', { kind, tenant: 'default' });
  // The earlier tests' requests settle a moment after their last byte too: start from counters
  // that have stopped moving, with the engine idle.
  const total = await metric(server, 'edgeinfer_kv_cache_blocks');
  await waitFor('an idle engine', async () => (await metric(server, 'edgeinfer_kv_cache_blocks_free')) === total);
  let promptBefore;
  let completionBefore;
  await waitFor('the tenant token counters to stop moving', async () => {
    const first = [await tokens('prompt'), await tokens('completion')];
    await sleep(300);
    [promptBefore, completionBefore] = [await tokens('prompt'), await tokens('completion')];
    return first[0] === promptBefore && first[1] === completionBefore;
  });
  const completion = await client.completions.create({ model: modelId, prompt: 'Once upon a time', max_tokens: 7, temperature: 0 });
  // The tenant's tokens are counted when the request settles, which may follow the response's
  // last byte by a moment: wait for the counters to move, then check they moved by the usage.
  await waitFor('the tenant token counters', async () =>
    (await tokens('completion')) > completionBefore && (await tokens('prompt')) > promptBefore);
  assert.equal(await tokens('prompt'), promptBefore + completion.usage.prompt_tokens);
  assert.equal(await tokens('completion'), completionBefore + completion.usage.completion_tokens);
  const id = completion._request_id;
  await waitFor('the access log line', async () => server.log.includes(`request_id=${id}`));
  const line = server.log.split('\n').find((l) => l.includes(`request_id=${id}`));
  assert.match(line, /access: POST \/v1\/completions status=200 request_id=/);
  assert.match(line, / tenant=default /);
  assert.match(line, / prompt_tokens=5 completion_tokens=7 /);
  assert.match(line, / ttft_ms=\d+(\.\d)?/);
});

// vLLM's and llama.cpp's endpoints beside the OpenAI API: /health and /version for probes and
// scripts (no key), /tokenize and /detokenize (the key: they show how the model reads text).
test('/health and /version answer without a key; /tokenize and /detokenize need one', async () => {
  const health = await fetch(`${server.url}/health`);
  assert.equal(health.status, 200);
  assert.deepEqual(await health.json(), { status: 'ok' });
  const version = await (await fetch(`${server.url}/version`)).json();
  assert.match(version.version, /^\d+\.\d+\.\d+/);
  assert.equal(typeof version.commit, 'string');
  for (const route of ['/tokenize', '/detokenize']) {
    const res = await fetch(`${server.url}${route}`, { method: 'POST', body: '{"prompt":"x","tokens":[1]}' });
    assert.equal(res.status, 401, route);
  }
});

test('/tokenize gives the tokens the generating routes run; /detokenize reads them back', async () => {
  const post = async (route, body) => {
    const res = await fetch(`${server.url}${route}`, {
      method: 'POST', headers: { authorization: `Bearer ${server.defaultKey}`, 'content-type': 'application/json' },
      body: JSON.stringify(body),
    });
    return { status: res.status, json: await res.json() };
  };
  const prompt = 'Once upon a time';
  const tokenized = await post('/tokenize', { model: modelId, prompt });
  assert.equal(tokenized.status, 200, JSON.stringify(tokenized.json));
  const completion = await client.completions.create({ model: modelId, prompt, max_tokens: 1 });
  assert.equal(tokenized.json.count, completion.usage.prompt_tokens);
  assert.equal(tokenized.json.tokens.length, tokenized.json.count);
  assert.equal(tokenized.json.max_model_len, (await client.models.retrieve(modelId)).max_model_len);
  assert.equal(tokenized.json.token_strs, null);
  // Without special tokens: the BOS the server adds is gone; with strings, each token's text.
  const plain = await post('/tokenize', { prompt, add_special_tokens: false, return_token_strs: true });
  assert.deepEqual(plain.json.tokens, tokenized.json.tokens.slice(1));
  assert.equal(plain.json.token_strs.length, plain.json.count);
  assert.equal(plain.json.token_strs.join('').replaceAll('\u2581', ' ').trim(), prompt);
  // llama.cpp's spelling: content.
  assert.deepEqual((await post('/tokenize', { content: prompt })).json.tokens, tokenized.json.tokens);
  // Messages: the chat template's prompt, as /v1/chat/completions counts it.
  const messages = [{ role: 'user', content: 'Hello there' }];
  const chatTokens = await post('/tokenize', { messages });
  const chat = await client.chat.completions.create({ model: modelId, messages, max_tokens: 1 });
  assert.equal(chatTokens.json.count, chat.usage.prompt_tokens);

  const back = await post('/detokenize', { model: modelId, tokens: plain.json.tokens });
  assert.equal(back.status, 200);
  assert.equal(back.json.prompt.trim(), prompt);
  assert.equal(back.json.content, back.json.prompt);

  for (const [route, body, status, param] of [
    ['/tokenize', { prompt, add_special_tokens: 'no' }, 400, 'add_special_tokens'],
    ['/tokenize', { content: prompt, prompt }, 400, 'content'],
    ['/tokenize', { model: 'gpt-4o', prompt }, 404, 'model'],
    ['/tokenize', { prompt: [1, 1e9] }, 400, 'prompt'],
    ['/detokenize', { tokens: [1, -1] }, 400, 'tokens'],
    ['/detokenize', { tokens: [1, 10 ** 9] }, 400, 'tokens'],
    ['/detokenize', { tokens: 'hello' }, 400, 'tokens'],
    ['/detokenize', { model: 'gpt-4o', tokens: [1] }, 404, 'model'],
  ]) {
    const res = await post(route, body);
    assert.equal(res.status, status, `${route} ${JSON.stringify(body)}: ${JSON.stringify(res.json)}`);
    assert.ok(res.json.error.param.startsWith(param), `${route} ${JSON.stringify(body)}: ${res.json.error.param}`);
  }
  const notJson = await fetch(`${server.url}/detokenize`, {
    method: 'POST', headers: { authorization: `Bearer ${server.defaultKey}` }, body: '{"tokens": [1,',
  });
  assert.equal(notJson.status, 400);
});

// OpenAI's list of prompts: one choice per prompt (n each, prompt p's choices from p x n), each
// the answer that prompt gets alone; usage the sum; every failure names its prompt.
test('a list of prompts in /v1/completions answers each prompt as it would be answered alone', async () => {
  const prompts = ['Once upon a time', 'The dog', 'Lily saw a big'];
  const alone = [];
  for (const prompt of prompts) {
    alone.push(await client.completions.create({ model: modelId, prompt, max_tokens: 12, temperature: 0 }));
  }
  const batch = await client.completions.create({ model: modelId, prompt: prompts, max_tokens: 12, temperature: 0 });
  assert.deepEqual(batch.choices.map((c) => c.index), [0, 1, 2]);
  assert.deepEqual(batch.choices.map((c) => c.text), alone.map((a) => a.choices[0].text));
  assert.equal(batch.usage.prompt_tokens, alone.reduce((sum, a) => sum + a.usage.prompt_tokens, 0));
  assert.equal(batch.usage.completion_tokens, alone.reduce((sum, a) => sum + a.usage.completion_tokens, 0));

  // n choices per prompt, streamed; token-id prompts too.
  const ids = (await fetch(`${server.url}/tokenize`, {
    method: 'POST', headers: { authorization: `Bearer ${server.defaultKey}` },
    body: JSON.stringify({ prompt: prompts[1] }),  // with BOS, as the text prompt is run
  }).then((res) => res.json())).tokens;
  const stream = await client.completions.create({
    model: modelId, prompt: [prompts[0], ids], n: 2, max_tokens: 12, temperature: 0, stream: true,
    stream_options: { include_usage: true },
  });
  const texts = ['', '', '', ''];
  const finished = [];
  let usage;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      texts[c.index] += c.text;
      if (c.finish_reason) finished.push(c.index);
    }
  }
  assert.deepEqual(finished.sort(), [0, 1, 2, 3]);
  assert.deepEqual(texts, [alone[0].choices[0].text, alone[0].choices[0].text, alone[1].choices[0].text,
    alone[1].choices[0].text]);
  assert.equal(usage.completion_tokens, 2 * (alone[0].usage.completion_tokens + alone[1].usage.completion_tokens));

  // Echo: each choice opens with its own prompt; with logprobs, with its prompt's tokens.
  const echoed = await client.completions.create({
    model: modelId, prompt: prompts.slice(0, 2), max_tokens: 3, temperature: 0, echo: true, logprobs: 1,
  });
  for (const [p, choice] of echoed.choices.entries()) {
    assert.ok(choice.text.startsWith(prompts[p]), choice.text);
    // The prompt's tokens (BOS first) open its choice's log probabilities.
    const logprobText = choice.logprobs.tokens.join('').replaceAll('\u2581', ' ').replace(/^<s>\s*/, '');
    assert.ok(logprobText.startsWith(prompts[p]), logprobText);
  }

  // Each failure names the prompt at fault.
  const refusals = [
    [{ prompt: ['Once', [1, 10 ** 9]] }, 'prompt[1][1]'],
    [{ prompt: [[1, 2], []] }, 'prompt[1]'],
    [{ prompt: ['Once', 7] }, 'prompt[1]'],
    [{ prompt: Array(64).fill('Once'), n: 3 }, 'n'],
    [{ prompt: ['Once', 'word '.repeat(5000)], max_tokens: 4 }, 'prompt'],
  ];
  for (const [body, param] of refusals) {
    const res = await fetch(`${server.url}/v1/completions`, {
      method: 'POST', headers: { authorization: `Bearer ${server.defaultKey}`, 'content-type': 'application/json' },
      body: JSON.stringify({ model: modelId, max_tokens: 4, ...body }),
    });
    const json = await res.json();
    assert.equal(res.status, 400, JSON.stringify(json));
    assert.equal(json.error.param, param, JSON.stringify(json.error));
  }
});

test('an aborted batch stream cancels every prompt\'s request and frees their KV blocks', async () => {
  const total = await metric(server, 'edgeinfer_kv_cache_blocks');
  await waitFor('an idle engine', async () => (await metric(server, 'edgeinfer_kv_cache_blocks_free')) === total);
  const controller = new AbortController();
  const stream = await client.completions.create(
    { model: modelId, prompt: ['Once upon a time', 'The dog', 'A cat'], max_tokens: 2000, temperature: 0, stream: true,
      ignore_eos: true },
    { signal: controller.signal });
  let chunks = 0;
  try {
    for await (const chunk of stream) {
      assert.ok(chunk.choices.every((c) => c.index >= 0 && c.index < 3));
      if (++chunks === 6) controller.abort();
    }
  } catch (error) {
    if (!(error instanceof OpenAI.APIUserAbortError || error.name === 'AbortError')) throw error;
  }
  await waitFor('the blocks to come back', async () => (await metric(server, 'edgeinfer_kv_cache_blocks_free')) === total);
  assert.equal(await requiredMetric(server, 'edgeinfer_num_requests_running'), 0);
});
