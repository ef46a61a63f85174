// OpenAI's Responses API (POST /v1/responses, GET and DELETE /v1/responses/{id}), driven by the
// official `openai` SDK and the `@openai/agents` SDK, on the same engine path as chat completions:
//
// 1. responses.create and responses.stream give the same response (output, status, usage), and
//    its usage is what chat completions reports for the same conversation.
// 2. A function-calling loop on models with a tool-call syntax (`tiny`: Llama 3's JSON; stories260K
//    and the tiny Qwen3-MoE and DeepSeek-V3 (MLA) models with Hermes's): a forced call whose
//    arguments validate, its function_call_output sent back
//    with the conversation replayed, and the same with previous_response_id (the stored
//    conversation is the prompt's: the same prompt tokens).
// 3. text.format with a zod schema (responses.parse): the answer is the schema's.
// 4. 16 concurrent streamed forced-call requests make the calls of the same requests not streamed,
//    in Responses and in chat completions (Messages: anthropic.test.mjs).
// 5. Stored responses: per tenant (another tenant's id is a 404, and not a conversation it can
//    continue), deleted, store: false keeps nothing, the byte bound drops the oldest, and what
//    is stored survives a restart.
// 6. An agent of the @openai/agents SDK with one tool, run to its end.
// 7. The split topology (a gateway in front of a backend) serves Responses, stored on the gateway,
//    and Messages, forced calls included, as `serve` does.
// 8. A mixed run of a fresh tenant in all three APIs: its token counters (per API too) and its
//    ledger equal the sum of the usage the answers reported.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import { spawnSync } from 'node:child_process';
import OpenAI from 'openai';
import { z } from 'zod';
import { zodTextFormat } from 'openai/helpers/zod';
import { Agent, run, tool, setDefaultOpenAIClient, setOpenAIAPI, setTracingDisabled } from '@openai/agents';
import Anthropic from '@anthropic-ai/sdk';
import { startServer, fetch, makeStateDir, edgeinferBin, waitFor } from './lib/server.mjs';
import { metric } from './lib/metrics.mjs';

const models = process.env.EDGE_TEST_MODELS ?? path.resolve('../shared/models');
const storiesGguf = path.join(models, 'stories260K', 'stories260K.gguf');
const ADMIN = 'admin-token-0123456789';

function makeModel(preset, seed) {
  const dir = path.join(makeStateDir(), preset);
  const made = spawnSync(edgeinferBin, ['make-model', '--preset', preset, '--seed', String(seed), '--out', dir],
    { encoding: 'utf8' });
  assert.equal(made.status, 0, made.stderr);
  return dir;
}

const servers = {};
const common = ['--threads', '1', '--kv-cache-memory', '16MiB', '--admin-token', ADMIN];
function clientOf(s, key = s.defaultKey) {
  return new OpenAI({ baseURL: `${s.url}/v1`, apiKey: key, maxRetries: 0, timeout: 120000 });
}
before(async () => {
  const tinyDir = makeModel('tiny', 5);
  const hermes = ['--tool-call-parser', 'hermes'];
  const started = await Promise.all([
    startServer(['--model', tinyDir, ...common]),
    startServer(['--model', storiesGguf, ...hermes, ...common]),
    startServer(['--model', makeModel('tiny-qwen3-moe', 5), ...hermes, ...common]),
    startServer(['--model', makeModel('deepseek-v3-tiny', 5), ...hermes, ...common]),
  ]);
  const names = ['tiny', 'stories', 'moe', 'mla'];
  for (const [i, s] of started.entries()) {
    s.client = clientOf(s);
    s.model = (await s.client.models.list()).data[0].id;
    servers[names[i]] = s;
  }
  servers.tiny.modelDir = tinyDir;
});
after(async () => { await Promise.all(Object.values(servers).map((s) => s.stop())); });

// A second tenant and its key, through the admin API.
async function secondTenant(s, id) {
  const admin = (method, url, body) => fetch(`${s.url}${url}`, {
    method, headers: { authorization: `Bearer ${ADMIN}`, 'content-type': 'application/json' },
    body: body && JSON.stringify(body),
  });
  assert.equal((await admin('POST', '/admin/v1/tenants', { id })).status, 201);
  const key = await admin('POST', `/admin/v1/tenants/${id}/keys`, {});
  assert.equal(key.status, 201);
  return (await key.json()).key;
}

// A response's output as the server wrote it: without the ids (random where the syntax has none)
// and the fields the SDK's helpers add (parsed_arguments, parsed).
const outputOf = (response) => response.output.map((item) => {
  if (item.type === 'function_call') return { type: item.type, status: item.status, name: item.name, arguments: item.arguments };
  if (item.type === 'message') {
    return { type: item.type, status: item.status, role: item.role, text: item.content.map((c) => c.text).join('') };
  }
  return { type: item.type, status: item.status, text: (item.content ?? []).map((c) => c.text).join('') };
});
const textOf = (response) => response.output.filter((i) => i.type === 'message')
  .flatMap((i) => i.content).map((c) => c.text).join('');

test('responses.create and responses.stream give the same response; its usage is chat completions\'', async () => {
  const { client, model } = servers.stories;
  const body = { model, input: 'Once upon a time', instructions: 'Tell a story.', max_output_tokens: 20, temperature: 0 };
  const whole = await client.responses.create(body);
  assert.match(whole.id, /^resp_/);
  assert.equal(whole.object, 'response');
  assert.equal(whole.status, 'incomplete');
  assert.deepEqual(whole.incomplete_details, { reason: 'max_output_tokens' });
  assert.equal(whole.instructions, 'Tell a story.');
  assert.equal(whole.max_output_tokens, 20);
  assert.equal(whole.output.length, 1);
  assert.equal(whole.output[0].type, 'message');
  assert.equal(whole.output[0].role, 'assistant');
  assert.ok(whole.output_text.length > 10, whole.output_text);
  assert.equal(whole.usage.output_tokens, 20);
  assert.equal(whole.usage.total_tokens, whole.usage.input_tokens + 20);

  const stream = client.responses.stream(body);
  const types = [];
  const sequence = [];
  for await (const event of stream) {
    types.push(event.type);
    sequence.push(event.sequence_number);
  }
  const streamed = await stream.finalResponse();
  assert.deepEqual(outputOf(streamed), outputOf(whole));
  assert.equal(streamed.status, whole.status);
  assert.equal(streamed.usage.input_tokens, whole.usage.input_tokens);
  assert.equal(streamed.usage.output_tokens, whole.usage.output_tokens);
  assert.deepEqual(sequence, sequence.map((_, i) => i));
  assert.deepEqual(types.slice(0, 4),
    ['response.created', 'response.in_progress', 'response.output_item.added', 'response.content_part.added']);
  assert.deepEqual(types.slice(-4),
    ['response.output_text.done', 'response.content_part.done', 'response.output_item.done', 'response.incomplete']);

  const chat = await servers.stories.client.chat.completions.create({ model, max_tokens: 20, temperature: 0,
    messages: [{ role: 'system', content: 'Tell a story.' }, { role: 'user', content: 'Once upon a time' }] });
  assert.equal(chat.choices[0].message.content, whole.output_text);
  assert.equal(chat.usage.prompt_tokens, whole.usage.input_tokens);
});

const weatherTool = {
  type: 'function', name: 'get_weather', description: 'The weather in a city', strict: true,
  parameters: { type: 'object', properties: { city: { type: 'string', maxLength: 12 }, days: { type: 'integer' } },
                required: ['city', 'days'], additionalProperties: false },
};
const timeTool = {
  type: 'function', name: 'get_time', description: 'The time in a time zone', strict: true,
  parameters: { type: 'object', properties: { zone: { type: 'string', maxLength: 12 } }, required: ['zone'],
                additionalProperties: false },
};

for (const name of ['tiny', 'stories', 'moe', 'mla']) {
  test(`a function-calling loop on ${name}: replayed, and continued by previous_response_id`, async () => {
    const { client, model } = servers[name];
    const question = { role: 'user', content: 'What is the weather in Paris for two days?' };
    // Greedy decoding of random weights spends tokens on the whitespace JSON allows: room for it.
    const first = await client.responses.create({
      model, input: [question], tools: [weatherTool, timeTool], tool_choice: { type: 'function', name: 'get_weather' },
      max_output_tokens: 200, temperature: 0,
    });
    assert.equal(first.status, 'completed', JSON.stringify(first));
    const calls = first.output.filter((i) => i.type === 'function_call');
    assert.equal(calls.length, 1, JSON.stringify(first.output));
    assert.equal(calls[0].name, 'get_weather');
    assert.match(calls[0].call_id, /^call_/);
    const args = JSON.parse(calls[0].arguments);
    assert.equal(typeof args.city, 'string');
    assert.ok(Number.isInteger(args.days));

    const result = { type: 'function_call_output', call_id: calls[0].call_id, output: '18 C, sunny' };
    const rest = { model, tools: [weatherTool, timeTool], tool_choice: 'none', max_output_tokens: 8, temperature: 0 };
    // Stateless: the whole conversation replayed, the call as the SDK hands it back.
    const replayed = await client.responses.create({ ...rest, input: [question, ...first.output, result] });
    // Stateful: only the result, after the stored response.
    const continued = await client.responses.create({ ...rest, input: [result], previous_response_id: first.id });
    assert.equal(continued.previous_response_id, first.id);
    assert.ok(replayed.usage.input_tokens > first.usage.input_tokens);
    assert.equal(continued.usage.input_tokens, replayed.usage.input_tokens);
    assert.deepEqual(outputOf(continued), outputOf(replayed));
    assert.ok(continued.output.every((i) => i.type === 'message'), JSON.stringify(continued.output));
  });
}

test('text.format with a zod schema: the answer is the schema\'s (responses.parse)', async () => {
  const { client, model } = servers.tiny;
  const schema = z.object({ ok: z.boolean(), color: z.enum(['red', 'green', 'blue']) });
  const parsed = await client.responses.parse({
    model, input: 'Pick a color.', text: { format: zodTextFormat(schema, 'pick') }, max_output_tokens: 200, temperature: 0,
  });
  assert.equal(parsed.status, 'completed', JSON.stringify(parsed));
  assert.deepEqual(schema.parse(parsed.output_parsed), parsed.output_parsed);
  assert.equal(parsed.text.format.type, 'json_schema');
});

test('16 concurrent streamed forced-call requests make the calls the same requests make not streamed', async () => {
  for (const name of ['tiny', 'stories']) {
    const { client, model } = servers[name];
    const bodies = Array.from({ length: 16 }, (_, k) => ({
      model, max_output_tokens: 200, temperature: 0, tools: [weatherTool, timeTool], tool_choice: 'required',
      parallel_tool_calls: k % 2 === 1, store: false,
      input: `Question ${k}: ${'weather time '.repeat(k % 5)}in city ${k}?`,
    }));
    const [wholes, streams] = await Promise.all([
      Promise.all(bodies.map((body) => client.responses.create(body))),
      Promise.all(bodies.map(async (body) => client.responses.stream(body).finalResponse())),
    ]);
    for (let k = 0; k < bodies.length; k++) {
      const label = `${name} request ${k}: ${JSON.stringify(streams[k].output)} ${JSON.stringify(wholes[k].output)}`;
      assert.equal(streams[k].status, wholes[k].status, label);
      assert.deepEqual(outputOf(streams[k]), outputOf(wholes[k]), label);
      assert.equal(streams[k].usage.output_tokens, wholes[k].usage.output_tokens, label);
      assert.ok(wholes[k].output.some((i) => i.type === 'function_call'), label);
      if (k % 2 === 0) {
        assert.equal(wholes[k].status, 'completed', label);
        assert.equal(wholes[k].output.length, 1, label);
      }
    }
  }
});

test('16 concurrent streamed forced-call chat completions make the calls of the same not streamed', async () => {
  const chatTool = (t) => ({ type: 'function', function: { name: t.name, description: t.description, parameters: t.parameters } });
  for (const name of ['tiny', 'stories']) {
    const { client, model } = servers[name];
    const bodies = Array.from({ length: 16 }, (_, k) => ({
      model, max_tokens: 200, temperature: 0.8, seed: 100 + k, tools: [chatTool(weatherTool), chatTool(timeTool)],
      tool_choice: 'required', parallel_tool_calls: k % 2 === 1,
      messages: [{ role: 'user', content: `Question ${k}: ${'weather time '.repeat(k % 5)}in city ${k}?` }],
    }));
    const assemble = async (body) => {
      const out = { calls: [], finish: null, completion: null };
      const stream = await client.chat.completions.create({ ...body, stream: true, stream_options: { include_usage: true } });
      for await (const chunk of stream) {
        if (chunk.usage) out.completion = chunk.usage.completion_tokens;
        const choice = chunk.choices[0];
        if (!choice) continue;
        if (choice.finish_reason) out.finish = choice.finish_reason;
        for (const call of choice.delta?.tool_calls ?? []) {
          if (call.index === out.calls.length) out.calls.push({ name: call.function.name, arguments: '' });
          out.calls[call.index].arguments += call.function.arguments ?? '';
        }
      }
      return out;
    };
    const [wholes, streams] = await Promise.all([
      Promise.all(bodies.map((body) => client.chat.completions.create(body))),
      Promise.all(bodies.map(assemble)),
    ]);
    for (let k = 0; k < bodies.length; k++) {
      const whole = wholes[k].choices[0];
      const calls = (whole.message.tool_calls ?? []).map((c) => ({ name: c.function.name, arguments: c.function.arguments }));
      const label = `${name} request ${k}: ${JSON.stringify(streams[k])} ${JSON.stringify(whole)}`;
      assert.deepEqual(streams[k].calls, calls, label);
      assert.equal(streams[k].finish, whole.finish_reason, label);
      assert.equal(streams[k].completion, wholes[k].usage.completion_tokens, label);
      assert.ok(calls.length >= 1, label);
    }
  }
});

test('stored responses belong to their tenant; deleted, or never stored, they are gone', async () => {
  const s = servers.tiny;
  const { client, model } = s;
  const other = clientOf(s, await secondTenant(s, 'other-tenant'));
  const stored = await client.responses.create({ model, input: 'Hello', max_output_tokens: 4 });
  assert.equal(stored.store, true);
  const got = await client.responses.retrieve(stored.id);
  assert.deepEqual(got.output, stored.output);
  assert.deepEqual(got.usage, stored.usage);

  // Another tenant can neither read it nor continue it.
  await assert.rejects(other.responses.retrieve(stored.id), (e) => e instanceof OpenAI.NotFoundError);
  await assert.rejects(other.responses.create({ model, input: 'Hi', previous_response_id: stored.id, max_output_tokens: 2 }),
    (e) => {
      assert.ok(e instanceof OpenAI.BadRequestError, String(e));
      assert.equal(e.code, 'previous_response_not_found');
      assert.equal(e.param, 'previous_response_id');
      return true;
    });
  await assert.rejects(other.responses.delete(stored.id), (e) => e instanceof OpenAI.NotFoundError);
  assert.deepEqual((await client.responses.retrieve(stored.id)).output, stored.output);

  // Continued by an input of no message, after empty instructions: the stored conversation alone.
  const continued = await client.responses.create({ model, previous_response_id: stored.id, instructions: '',
    input: [{ type: 'reasoning', id: 'rs_x', summary: [] }], max_output_tokens: 2 });
  assert.ok(continued.usage.input_tokens > stored.usage.input_tokens, JSON.stringify(continued.usage));

  await client.responses.delete(stored.id);
  await assert.rejects(client.responses.retrieve(stored.id), (e) => e instanceof OpenAI.NotFoundError);
  const unstored = await client.responses.create({ model, input: 'Hello', max_output_tokens: 4, store: false });
  assert.equal(unstored.store, false);
  await assert.rejects(client.responses.retrieve(unstored.id), (e) => e instanceof OpenAI.NotFoundError);

  // Bad requests name their field.
  await assert.rejects(client.responses.create({ model, input: [{ type: 'input_image', image_url: 'x' }] }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === 'input[0].type');
  await assert.rejects(client.responses.create({ model, input: 'x', tools: [{ type: 'web_search' }] }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === 'tools[0].type');
});

test('the byte bound drops a tenant\'s oldest responses, and what is stored survives a restart', async () => {
  const stateDir = makeStateDir();
  const args = ['--model', servers.tiny.modelDir, '--state-dir', stateDir, '--stored-responses-size', '16KiB', ...common];
  let s = await startServer(args);
  const key = s.defaultKey;
  let client = clientOf(s, key);
  const ids = [];
  // Each stored response holds its conversation: about 3 KB apiece.
  for (let i = 0; i < 10; i++) {
    const r = await client.responses.create({ model: 'tiny', input: `${i} ${'many words '.repeat(200)}`, max_output_tokens: 2 });
    ids.push(r.id);
  }
  const kept = [];
  for (const id of ids) {
    kept.push(await client.responses.retrieve(id).then(() => true, (e) => {
      assert.ok(e instanceof OpenAI.NotFoundError, String(e));
      return false;
    }));
  }
  // The newest are kept, the oldest went: what is kept is a suffix, and not everything.
  assert.equal(kept.at(-1), true);
  assert.equal(kept[0], false);
  const firstKept = kept.indexOf(true);
  assert.ok(kept.slice(firstKept).every(Boolean), JSON.stringify(kept));

  await s.stop();
  s = await startServer(args);
  client = clientOf(s, key);
  try {
    const after = await client.responses.retrieve(ids.at(-1));
    assert.equal(after.id, ids.at(-1));
  } finally {
    await s.stop();
  }
});

test('an @openai/agents agent with one tool runs to its end', async () => {
  const { model } = servers.tiny;
  setDefaultOpenAIClient(servers.tiny.client);
  setOpenAIAPI('responses');
  setTracingDisabled(true);
  const asked = [];
  const weather = tool({
    name: 'get_weather',
    description: 'The weather in a city',
    parameters: z.object({ city: z.string().max(12) }),
    execute: async ({ city }) => {
      asked.push(city);
      return `sunny in ${city}`;
    },
  });
  const agent = new Agent({
    name: 'forecaster', instructions: 'Answer with the weather tool.', model, tools: [weather],
    modelSettings: { toolChoice: 'required', parallelToolCalls: false, temperature: 0, maxTokens: 200 },
    toolUseBehavior: 'stop_on_first_tool',
  });
  const result = await run(agent, 'What is the weather in Paris?', { maxTurns: 2 });
  assert.equal(asked.length, 1);
  assert.equal(result.finalOutput, `sunny in ${asked[0]}`);
  const call = result.newItems.find((item) => item.type === 'tool_call_item');
  assert.ok(call, JSON.stringify(result.newItems.map((i) => i.type)));
});

test('a tenant\'s counters and ledger add up the usage all three APIs reported', async () => {
  const s = servers.stories;
  const key = await secondTenant(s, 'mixed');
  const openai = clientOf(s, key);
  const anthropic = new Anthropic({ baseURL: s.url, apiKey: key, maxRetries: 0 });
  const model = s.model;
  // Per API: [prompt, completion] tokens as each answer reported them.
  const reported = { chat_completions: [0, 0], completions: [0, 0], messages: [0, 0], responses: [0, 0] };
  const add = (api, prompt, completion) => {
    reported[api][0] += prompt;
    reported[api][1] += completion;
  };
  const chat = await openai.chat.completions.create({ model, max_tokens: 5, messages: [{ role: 'user', content: 'Hi there' }] });
  add('chat_completions', chat.usage.prompt_tokens, chat.usage.completion_tokens);
  const stream = await openai.chat.completions.create({
    model, max_tokens: 6, stream: true, stream_options: { include_usage: true }, messages: [{ role: 'user', content: 'Once' }],
  });
  for await (const chunk of stream) if (chunk.usage) add('chat_completions', chunk.usage.prompt_tokens, chunk.usage.completion_tokens);
  const completion = await openai.completions.create({ model, prompt: 'Once upon a time', max_tokens: 7 });
  add('completions', completion.usage.prompt_tokens, completion.usage.completion_tokens);
  const message = await anthropic.messages.create({ model, max_tokens: 8, messages: [{ role: 'user', content: 'Hello' }] });
  add('messages', message.usage.input_tokens + message.usage.cache_read_input_tokens, message.usage.output_tokens);
  const streamed = await anthropic.messages.stream({ model, max_tokens: 9, messages: [{ role: 'user', content: 'Bye' }] }).finalMessage();
  add('messages', streamed.usage.input_tokens + streamed.usage.cache_read_input_tokens, streamed.usage.output_tokens);
  await anthropic.messages.countTokens({ model, messages: [{ role: 'user', content: 'Hello' }] });
  const response = await openai.responses.create({ model, input: 'Tell me', max_output_tokens: 10 });
  add('responses', response.usage.input_tokens, response.usage.output_tokens);
  const responseStream = await openai.responses.stream({ model, input: 'More', max_output_tokens: 11 }).finalResponse();
  add('responses', responseStream.usage.input_tokens, responseStream.usage.output_tokens);

  const tokens = (kind, api) => metric(s, 'edgeinfer_tenant_tokens_total', { tenant: 'mixed', kind, ...(api ? { api } : {}) });
  const total = (i) => Object.values(reported).reduce((sum, pair) => sum + pair[i], 0);
  // A request is counted when it settles, a moment after its last byte.
  await waitFor('the counters to settle', async () => (await tokens('completion')) === total(1) && (await tokens('prompt')) === total(0));
  for (const [api, [prompt, completionTokens]] of Object.entries(reported)) {
    assert.equal(await tokens('prompt', api), prompt, api);
    assert.equal(await tokens('completion', api), completionTokens, api);
  }
  // A count of tokens reserves none: it is no request of the ledger.
  assert.equal(await tokens('prompt', 'count_tokens'), 0);

  // The ledger (flushed at least every second) has the same sums.
  const from = new Date(Date.now() - 2 * 86400e3).toISOString().slice(0, 19) + 'Z';
  let ledger;
  await waitFor('the ledger', async () => {
    const res = await fetch(`${s.url}/admin/v1/tenants/mixed/usage?from=${encodeURIComponent(from)}`,
      { headers: { authorization: `Bearer ${ADMIN}` } });
    ledger = (await res.json()).total;
    return ledger.completion_tokens === total(1);
  });
  assert.equal(ledger.prompt_tokens, total(0));
  assert.equal(ledger.requests, 7);
});

test('the split topology serves Responses and Messages as serve does', async () => {
  const TOKEN = 'internal-token-0123456789';
  const backend = await startServer(['--model', storiesGguf, '--threads', '1', '--internal-token', TOKEN],
    { command: 'backend' });
  const gateway = await startServer(['--model', storiesGguf, '--internal-token', TOKEN, '--backend', backend.url,
    '--tool-call-parser', 'hermes', '--backend-poll-interval', '100ms'], { command: 'gateway' });
  try {
    const split = clientOf(gateway);
    const direct = servers.stories.client;
    const model = servers.stories.model;
    const body = { model, input: 'What is the weather in Paris?', tools: [weatherTool], tool_choice: 'required',
                   parallel_tool_calls: false, max_output_tokens: 200, temperature: 0 };
    const [viaGateway, viaServe] = [await split.responses.create(body), await direct.responses.create(body)];
    assert.deepEqual(outputOf(viaGateway), outputOf(viaServe));
    assert.equal(viaGateway.status, 'completed');
    const streamed = await split.responses.stream(body).finalResponse();
    assert.deepEqual(outputOf(streamed), outputOf(viaGateway));
    assert.equal((await split.responses.retrieve(viaGateway.id)).id, viaGateway.id);
    const result = { type: 'function_call_output', call_id: viaGateway.output[0].call_id, output: 'sunny' };
    const next = await split.responses.create({ model, input: [result], previous_response_id: viaGateway.id,
                                                max_output_tokens: 4, temperature: 0 });
    assert.ok(next.usage.input_tokens > viaGateway.usage.input_tokens);

    const anthropic = new Anthropic({ baseURL: gateway.url, apiKey: gateway.defaultKey, maxRetries: 0 });
    const direct2 = new Anthropic({ baseURL: servers.stories.url, apiKey: servers.stories.defaultKey, maxRetries: 0 });
    const messagesBody = { model, max_tokens: 200, temperature: 0, messages: [{ role: 'user', content: 'Weather?' }],
      tools: [{ name: 'get_weather', input_schema: weatherTool.parameters }], tool_choice: { type: 'any', disable_parallel_tool_use: true } };
    const [m1, m2] = [await anthropic.messages.create(messagesBody), await direct2.messages.create(messagesBody)];
    const blocks = (m) => m.content.map(({ id, ...rest }) => rest);
    assert.deepEqual(blocks(m1), blocks(m2));
    assert.equal(m1.stop_reason, 'tool_use');
  } finally {
    await gateway.stop();
    await backend.stop();
  }
});
