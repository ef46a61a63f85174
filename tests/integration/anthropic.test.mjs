// Anthropic's Messages API (POST /v1/messages, /v1/messages/count_tokens), driven by the official
// @anthropic-ai/sdk, on the same engine path as chat completions:
//
// 1. count_tokens counts the prompt chat completions renders for the same conversation (system
//    prompt, tool use and results, tools), on the synthetic `tiny` model.
// 2. messages.create and messages.stream on stories260K: the stream adds up to the whole message
//    (text, stop_reason, usage), stop_sequences end it with stop_reason "stop_sequence" naming the
//    sequence, and the usage is what chat completions reports for the same prompt.
// 3. A tool-use loop (a forced call, its tool_result sent back, the answer) on models with a
//    tool-call syntax: `tiny` (Llama 3's JSON), stories260K and the tiny Qwen3-MoE and DeepSeek-V3
//    (MLA) models with Hermes's; the calls' inputs validate against input_schema.
// 4. 16 concurrent streamed forced-call requests give the calls and inputs of the same requests
//    not streamed (greedy decoding).
// 5. Keys in x-api-key or Authorization; errors in Anthropic's shape, before and during a stream.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import { spawnSync } from 'node:child_process';
import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import { startServer, fetch, makeStateDir, edgeinferBin, rawExchange, parseResponse } from './lib/server.mjs';

const models = process.env.EDGE_TEST_MODELS ?? path.resolve('../shared/models');
const storiesGguf = path.join(models, 'stories260K', 'stories260K.gguf');

function makeModel(preset, seed) {
  const dir = path.join(makeStateDir(), preset);
  const made = spawnSync(edgeinferBin, ['make-model', '--preset', preset, '--seed', String(seed), '--out', dir],
    { encoding: 'utf8' });
  assert.equal(made.status, 0, made.stderr);
  return dir;
}

// Each server with its model's name and its clients.
const servers = {};
let server;
let anthropic;
let openai;
before(async () => {
  const common = ['--threads', '1', '--kv-cache-memory', '16MiB'];
  const hermes = ['--tool-call-parser', 'hermes'];
  const started = await Promise.all([
    startServer(['--model', makeModel('tiny', 5), ...common]),
    startServer(['--model', storiesGguf, ...hermes, ...common]),
    startServer(['--model', makeModel('tiny-qwen3-moe', 5), ...hermes, ...common]),
    startServer(['--model', makeModel('deepseek-v3-tiny', 5), ...hermes, ...common]),
  ]);
  for (const [name, s] of Object.entries({ tiny: started[0], stories: started[1], moe: started[2], mla: started[3] })) {
    // The SDK appends /v1/messages to its base URL.
    s.anthropic = new Anthropic({ baseURL: s.url, apiKey: s.defaultKey, maxRetries: 0, timeout: 120000 });
    s.openai = new OpenAI({ baseURL: `${s.url}/v1`, apiKey: s.defaultKey, maxRetries: 0 });
    s.model = (await s.openai.models.list()).data[0].id;
    servers[name] = s;
  }
  server = servers.tiny;
  ({ anthropic, openai } = server);
});
after(async () => { await Promise.all(Object.values(servers).map((s) => s.stop())); });

const weatherSchema = { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] };

// One conversation in both APIs' words.
const anthropicConversation = {
  system: 'You are brief.',
  tools: [{ name: 'get_weather', description: 'The weather in a city', input_schema: weatherSchema }],
  messages: [
    { role: 'user', content: 'Weather in Paris?' },
    { role: 'assistant', content: [
      { type: 'text', text: 'Looking.' },
      { type: 'tool_use', id: 'toolu_1', name: 'get_weather', input: { city: 'Paris' } }] },
    { role: 'user', content: [
      { type: 'tool_result', tool_use_id: 'toolu_1', content: '18 C' },
      { type: 'text', text: 'And tomorrow?' }] },
  ],
};
const openaiConversation = {
  tools: [{ type: 'function', function: { name: 'get_weather', description: 'The weather in a city', parameters: weatherSchema } }],
  messages: [
    { role: 'system', content: 'You are brief.' },
    { role: 'user', content: 'Weather in Paris?' },
    { role: 'assistant', content: 'Looking.',
      tool_calls: [{ id: 'toolu_1', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Paris"}' } }] },
    { role: 'tool', tool_call_id: 'toolu_1', content: '18 C' },
    { role: 'user', content: 'And tomorrow?' },
  ],
};

test('countTokens counts the prompt chat completions renders for the same conversation', async () => {
  const counted = await anthropic.messages.countTokens({ model: 'tiny', ...anthropicConversation });
  const chat = await openai.chat.completions.create({ model: 'tiny', max_tokens: 1, ...openaiConversation });
  assert.ok(counted.input_tokens > 20, JSON.stringify(counted));
  assert.equal(counted.input_tokens, chat.usage.prompt_tokens);
  // System text blocks are joined; the tool turns are rendered, not dropped.
  const split = await anthropic.messages.countTokens({
    model: 'tiny', ...anthropicConversation,
    system: [{ type: 'text', text: 'You are ' }, { type: 'text', text: 'brief.', cache_control: { type: 'ephemeral' } }],
  });
  assert.equal(split.input_tokens, counted.input_tokens);
  const firstTurn = await anthropic.messages.countTokens({
    model: 'tiny', ...anthropicConversation, messages: anthropicConversation.messages.slice(0, 1),
  });
  const chatFirstTurn = await openai.chat.completions.create({
    model: 'tiny', max_tokens: 1, ...openaiConversation, messages: openaiConversation.messages.slice(0, 2),
  });
  assert.equal(firstTurn.input_tokens, chatFirstTurn.usage.prompt_tokens);
  assert.ok(firstTurn.input_tokens < counted.input_tokens, `${firstTurn.input_tokens} vs ${counted.input_tokens}`);
});

test('the key may come as x-api-key (the SDK\'s) or as a Bearer token', async () => {
  const body = JSON.stringify({ messages: [{ role: 'user', content: 'hi' }] });
  const url = `${server.url}/v1/messages/count_tokens`;
  const headers = { 'content-type': 'application/json', 'anthropic-version': '2023-06-01' };
  const viaHeader = await fetch(url, { method: 'POST', body, headers: { ...headers, 'x-api-key': server.defaultKey } });
  assert.equal(viaHeader.status, 200, await viaHeader.clone().text());
  const viaBearer = await fetch(url, { method: 'POST', body, headers: { ...headers, authorization: `Bearer ${server.defaultKey}` } });
  assert.equal(viaBearer.status, 200);
  assert.deepEqual(await viaHeader.json(), await viaBearer.json());
});

test('errors are Anthropic\'s: the SDK\'s error classes, {"type":"error","error":{type,message}}', async () => {
  const wrongKey = new Anthropic({ baseURL: server.url, apiKey: 'ek-0000000000000000.nope', maxRetries: 0 });
  await assert.rejects(wrongKey.messages.countTokens({ model: 'tiny', messages: [{ role: 'user', content: 'x' }] }),
    (error) => {
      assert.ok(error instanceof Anthropic.AuthenticationError, String(error));
      assert.equal(error.error.type, 'error');
      assert.equal(error.error.error.type, 'authentication_error');
      return true;
    });
  await assert.rejects(anthropic.messages.countTokens({ model: 'claude-opus-4', messages: [{ role: 'user', content: 'x' }] }),
    (error) => {
      assert.ok(error instanceof Anthropic.NotFoundError, String(error));
      assert.equal(error.error.error.type, 'not_found_error');
      assert.match(error.error.error.message, /does not exist/);
      return true;
    });
  await assert.rejects(anthropic.messages.countTokens({
    model: 'tiny', messages: [{ role: 'user', content: [{ type: 'image', source: { type: 'base64', media_type: 'image/png', data: 'AA==' } }] }],
  }), (error) => {
    assert.ok(error instanceof Anthropic.BadRequestError, String(error));
    assert.equal(error.error.error.type, 'invalid_request_error');
    assert.match(error.error.error.message, /messages\[0\]\.content\[0\]\.type/);
    return true;
  });
  // The server's own refusals of a Messages request are in Anthropic's shape too.
  // (Answered from the Content-Length, before the body: only the headers are sent.)
  const huge = parseResponse(await rawExchange(server.port, [
    `POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nx-api-key: ${server.defaultKey}\r\n` +
    `Content-Length: ${5 << 20}\r\n\r\n`]));
  assert.equal(huge.status, 413);
  assert.deepEqual(JSON.parse(huge.body),
    { type: 'error', error: { type: 'request_too_large', message: 'Request body is larger than the limit of 4 MiB' } });
  const malformed = await fetch(`${server.url}/v1/messages/count_tokens`, {
    method: 'POST', body: '{"messages": [', headers: { 'content-type': 'application/json', 'x-api-key': server.defaultKey },
  });
  assert.equal(malformed.status, 400);
  const error = await malformed.json();
  assert.equal(error.type, 'error');
  assert.equal(error.error.type, 'invalid_request_error');
  // vLLM's and llama.cpp's output fields are served on the OpenAI routes only: here, a 400 naming
  // them, never ignored; on /v1/responses too.
  for (const [route, body] of [
    ['/v1/messages', { model: 'tiny', max_tokens: 8, messages: [{ role: 'user', content: 'x' }], guided_choice: ['a'] }],
    ['/v1/responses', { model: 'tiny', input: 'x', guided_json: { type: 'string' } }],
  ]) {
    const res = await fetch(`${server.url}${route}`, {
      method: 'POST', body: JSON.stringify(body),
      headers: { 'content-type': 'application/json', authorization: `Bearer ${server.defaultKey}` },
    });
    assert.equal(res.status, 400, route);
    assert.match(JSON.stringify(await res.json()), /served on \/v1\/chat\/completions/);
  }
});

// A streamed message as the SDK's users see it: its events, and the message the helper assembles.
async function streamed(client, body) {
  const stream = client.messages.stream(body);
  const names = [];
  stream.on('streamEvent', (event) => names.push(event.type));
  const message = await stream.finalMessage();
  return { names, message };
}
// A message's content, with the ids of its tool calls (random where the syntax has none) left out.
const contentOf = (message) => message.content.map(({ id, ...rest }) => rest);
// Its usage, the prompt's tokens whether read from the prefix cache or not (which depends on what
// ran before).
const usageOf = ({ usage }) => ({ prompt: usage.input_tokens + usage.cache_read_input_tokens, output: usage.output_tokens });

test('messages.create and messages.stream give the same message; its usage is chat completions\'', async () => {
  const { anthropic: client, openai: chatClient, model } = servers.stories;
  const body = { model, max_tokens: 24, temperature: 0, messages: [{ role: 'user', content: 'Once upon a time' }] };
  const whole = await client.messages.create(body);
  assert.match(whole.id, /^msg_/);
  assert.equal(whole.type, 'message');
  assert.equal(whole.role, 'assistant');
  assert.equal(whole.model, model);
  assert.equal(whole.stop_reason, 'max_tokens');
  assert.equal(whole.content.length, 1);
  assert.equal(whole.content[0].type, 'text');
  assert.ok(whole.content[0].text.length > 10, whole.content[0].text);
  assert.equal(whole.usage.output_tokens, 24);

  const { names, message } = await streamed(client, body);
  assert.deepEqual(contentOf(message), contentOf(whole));
  assert.equal(message.stop_reason, whole.stop_reason);
  assert.deepEqual(usageOf(message), usageOf(whole));
  assert.equal(names[0], 'message_start');
  // On the wire: named events, a ping after message_start (the SDK skips pings), no [DONE].
  const wire = await (await fetch(`${servers.stories.url}/v1/messages`, {
    method: 'POST', body: JSON.stringify({ ...body, stream: true }),
    headers: { 'content-type': 'application/json', 'x-api-key': servers.stories.defaultKey },
  })).text();
  const frames = wire.split('\n\n').filter((f) => f !== '');
  assert.match(frames[0], /^event: message_start\ndata: \{"type":"message_start",/);
  assert.equal(frames[1], 'event: ping\ndata: {"type":"ping"}');
  assert.equal(frames.at(-1), 'event: message_stop\ndata: {"type":"message_stop"}');
  assert.ok(!wire.includes('[DONE]'));
  assert.deepEqual(names.slice(-4), ['content_block_delta', 'content_block_stop', 'message_delta', 'message_stop']);

  const chat = await chatClient.chat.completions.create({ model, max_tokens: 24, temperature: 0,
    messages: [{ role: 'user', content: 'Once upon a time' }] });
  assert.equal(chat.choices[0].message.content, whole.content[0].text);
  assert.equal(whole.usage.input_tokens + whole.usage.cache_read_input_tokens, chat.usage.prompt_tokens);

  // A stop sequence from the middle of that text ends the answer right before it, and is named.
  const text = whole.content[0].text;
  const word = text.trim().split(/\s+/).find((w, i) => i > 0 && w.length >= 3 && text.indexOf(w) > 0);
  assert.ok(word, text);
  const stopped = { ...body, stop_sequences: ['@@never@@', word] };
  for (const message of [await client.messages.create(stopped), (await streamed(client, stopped)).message]) {
    assert.equal(message.stop_reason, 'stop_sequence');
    assert.equal(message.stop_sequence, word);
    assert.equal(message.content[0].text, text.slice(0, text.indexOf(word)));
  }
  // The beta path the SDK's beta client posts to (?beta=true) is the same route.
  const beta = await client.beta.messages.create(body);
  assert.deepEqual(contentOf(beta), contentOf(whole));
});

const weatherTool = {
  name: 'get_weather',
  description: 'The weather in a city',
  input_schema: { type: 'object', properties: { city: { type: 'string', maxLength: 12 }, days: { type: 'integer' } },
                  required: ['city', 'days'], additionalProperties: false },
};
const timeTool = {
  name: 'get_time',
  description: 'The time in a time zone',
  input_schema: { type: 'object', properties: { zone: { type: 'string', maxLength: 12 } }, required: ['zone'] },
};

function checkCall(block, tool, label) {
  assert.equal(block.type, 'tool_use', label);
  assert.equal(block.name, tool.name, label);
  assert.match(block.id, /^toolu_/, label);
  for (const key of tool.input_schema.required) assert.ok(key in block.input, `${label}: ${JSON.stringify(block.input)}`);
}

for (const name of ['tiny', 'stories', 'moe', 'mla']) {
  test(`a tool-use loop on ${name}: a forced call, its tool_result, the answer; streamed the same`, async () => {
    const { anthropic: client, model } = servers[name];
    const question = { role: 'user', content: 'What is the weather in Paris for two days?' };
    // Greedy decoding of random weights spends tokens on the whitespace JSON allows: room for it.
    const forced = { model, max_tokens: 200, temperature: 0, tools: [weatherTool, timeTool],
                     tool_choice: { type: 'tool', name: 'get_weather' }, messages: [question] };
    const call = await client.messages.create(forced);
    assert.equal(call.stop_reason, 'tool_use', JSON.stringify(call));
    const uses = call.content.filter((b) => b.type === 'tool_use');
    assert.equal(uses.length, 1, JSON.stringify(call.content));
    checkCall(uses[0], weatherTool, name);
    assert.equal(typeof uses[0].input.city, 'string');
    assert.ok(Number.isInteger(uses[0].input.days));
    const { message } = await streamed(client, forced);
    assert.deepEqual(contentOf(message), contentOf(call));
    assert.equal(message.stop_reason, 'tool_use');

    // The result goes back; tool_choice none asks for text.
    const answer = await client.messages.create({
      model, max_tokens: 8, temperature: 0, tools: [weatherTool, timeTool], tool_choice: { type: 'none' },
      messages: [question, { role: 'assistant', content: call.content },
                 { role: 'user', content: [{ type: 'tool_result', tool_use_id: uses[0].id, content: '18 C, sunny' }] }],
    });
    assert.ok(['end_turn', 'max_tokens'].includes(answer.stop_reason), answer.stop_reason);
    assert.ok(answer.content.every((b) => b.type === 'text'), JSON.stringify(answer.content));
    assert.ok(usageOf(answer).prompt > usageOf(call).prompt);
  });
}

test('16 concurrent streamed forced-call requests make the calls the same requests make not streamed', async () => {
  for (const name of ['tiny', 'stories']) {
    const { anthropic: client, model } = servers[name];
    // Half of them one call, half as many calls as fit.
    const bodies = Array.from({ length: 16 }, (_, k) => ({
      model, max_tokens: 200, temperature: 0, tools: [weatherTool, timeTool],
      tool_choice: { type: 'any', disable_parallel_tool_use: k % 2 === 0 },
      messages: [{ role: 'user', content: `Question ${k}: ${'weather time '.repeat(k % 5)}in city ${k}?` }],
    }));
    const [wholes, streams] = await Promise.all([
      Promise.all(bodies.map((body) => client.messages.create(body))),
      Promise.all(bodies.map((body) => streamed(client, body).then((s) => s.message))),
    ]);
    // A call cut short by max_tokens is {} in the whole message and what the SDK's partial JSON
    // parser makes of it in the stream's: the calls made whole are compared.
    const made = (m) => contentOf(m).slice(0, m.stop_reason === 'max_tokens' ? -1 : undefined);
    for (let k = 0; k < bodies.length; k++) {
      const label = `${name} request ${k}: ${JSON.stringify(streams[k])} ${JSON.stringify(wholes[k])}`;
      assert.equal(streams[k].stop_reason, wholes[k].stop_reason, label);
      assert.deepEqual(made(streams[k]), made(wholes[k]), label);
      assert.equal(streams[k].content.length, wholes[k].content.length, label);
      assert.deepEqual(usageOf(streams[k]), usageOf(wholes[k]), label);
      if (k % 2 === 0) {
        assert.equal(wholes[k].stop_reason, 'tool_use', label);
        assert.equal(wholes[k].content.length, 1, label);
        checkCall(wholes[k].content[0], wholes[k].content[0].name === weatherTool.name ? weatherTool : timeTool, label);
      }
    }
  }
});
