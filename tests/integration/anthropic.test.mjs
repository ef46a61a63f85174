// Anthropic's Messages API as far as it is served: POST /v1/messages/count_tokens, driven by the
// official @anthropic-ai/sdk. The prompt it counts is the one chat completions renders for the
// same conversation (system prompt, tool use and results, tools), on the synthetic `tiny` model;
// keys in x-api-key or Authorization; errors in Anthropic's shape.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import { spawnSync } from 'node:child_process';
import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import { startServer, fetch, makeStateDir, edgeinferBin } from './lib/server.mjs';

let server;
let anthropic;
let openai;
before(async () => {
  const dir = path.join(makeStateDir(), 'tiny');
  const made = spawnSync(edgeinferBin, ['make-model', '--preset', 'tiny', '--seed', '5', '--out', dir], { encoding: 'utf8' });
  assert.equal(made.status, 0, made.stderr);
  server = await startServer(['--model', dir, '--threads', '1', '--kv-cache-memory', '16MiB']);
  // The SDK appends /v1/messages to its base URL.
  anthropic = new Anthropic({ baseURL: server.url, apiKey: server.defaultKey, maxRetries: 0 });
  openai = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: server.defaultKey, maxRetries: 0 });
});
after(async () => { await server?.stop(); });

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
  const malformed = await fetch(`${server.url}/v1/messages/count_tokens`, {
    method: 'POST', body: '{"messages": [', headers: { 'content-type': 'application/json', 'x-api-key': server.defaultKey },
  });
  assert.equal(malformed.status, 400);
  const error = await malformed.json();
  assert.equal(error.type, 'error');
  assert.equal(error.error.type, 'invalid_request_error');
});
