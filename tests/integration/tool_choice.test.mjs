// tool_choice "required" and a named function, enforced by grammar-constrained decoding in the
// model's own tool-call syntax, through the real server and the official `openai` SDK:
//
// 1. 500 generations with sampling on (temperature 1, a seed per request) over tools whose
//    parameters are the structured-outputs schema corpus (lib/schemas.mjs): on stories260K with
//    the Hermes syntax (--tool-call-parser hermes: markers spelled out of its SentencePiece
//    pieces), on the tiny synthetic model with Llama 3's JSON syntax (its vocabulary's
//    <|python_tag|> chooses it), and on a tiny synthetic model whose vocabulary has Kimi K2's
//    markers as special tokens (five reserved special tokens renamed: the grammar must name the
//    tokens). Every answer has finish_reason "tool_calls", calls only the offered tools (the named
//    one when named), makes one call (parallel_tool_calls false), and its arguments validate with
//    ajv. With parallel_tool_calls, answers of several calls, each of which validates.
// 2. Streamed and whole answers agree, and the SDK's stream helper assembles the same calls.
// 3. A named function is one call ended there; an answer max_tokens cuts short leaves no markup
//    in content; a model without a tool-call syntax answers in plain JSON calls (llama3_json's).
//    The 400s: an unsupported keyword in a tool's parameters (named with the tool), a JSON
//    response_format together with required; auto keeps today's behaviour (no constraint, so the
//    keyword is no error).
// 4. The split topology: the gateway builds the grammar, the backend compiles it.
// 5. The SDK as an agent: a tool-call loop over several turns (required, a named function, then
//    "none" for the text answer), streamed and whole compared at every turn, and runTools.
import { test, before, after, describe } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { spawnSync } from 'node:child_process';
import OpenAI from 'openai';
import { startServer, edgeinferBin, makeStateDir } from './lib/server.mjs';
import { requiredMetric } from './lib/metrics.mjs';
import { corpus, validators, ajv, inBatches } from './lib/schemas.mjs';

const models = process.env.EDGE_TEST_MODELS ?? path.resolve('../shared/models');
const storiesGguf = path.join(models, 'stories260K', 'stories260K.gguf');
const TOKEN = 'internal-token-0123456789';

// The corpus schemas that describe objects: a tool's arguments are one.
const objectSchemas = corpus.map((schema, which) => ({ schema, which })).filter(({ schema }) => schema.type !== 'array');
const toolOf = ({ schema, which }) => ({ type: 'function',
  function: { name: `tool_${which}`, description: `Tool ${which}`, parameters: schema } });
const whichOf = (name) => Number(name.slice('tool_'.length));

// A tiny synthetic model; `renames` maps special tokens of its vocabulary to other texts.
function makeTiny(seed, renames = {}) {
  const dir = path.join(makeStateDir(), `tiny-${seed}`);
  const made = spawnSync(edgeinferBin, ['make-model', '--preset', 'tiny', '--seed', String(seed), '--out', dir],
    { encoding: 'utf8' });
  assert.equal(made.status, 0, made.stderr);
  if (Object.keys(renames).length === 0) return dir;
  const tokenizerPath = path.join(dir, 'tokenizer.json');
  const tokenizer = JSON.parse(fs.readFileSync(tokenizerPath, 'utf8'));
  for (const token of tokenizer.added_tokens) token.content = renames[token.content] ?? token.content;
  fs.writeFileSync(tokenizerPath, JSON.stringify(tokenizer));
  const configPath = path.join(dir, 'tokenizer_config.json');
  const config = JSON.parse(fs.readFileSync(configPath, 'utf8'));
  for (const token of Object.values(config.added_tokens_decoder ?? {})) token.content = renames[token.content] ?? token.content;
  fs.writeFileSync(configPath, JSON.stringify(config));
  return dir;
}

const kimiMarkers = ['<|tool_calls_section_begin|>', '<|tool_call_begin|>', '<|tool_call_argument_begin|>',
  '<|tool_call_end|>', '<|tool_calls_section_end|>'];

const servers = {};
before(async () => {
  const kimiRenames = Object.fromEntries(kimiMarkers.map((m, i) => [`<|reserved_special_token_${i}|>`, m]));
  const [llamaDir, kimiDir] = [makeTiny(7), makeTiny(11, kimiRenames)];
  const common = ['--threads', '1', '--kv-cache-memory', '32MiB'];
  [servers.stories, servers.llama, servers.kimi] = await Promise.all([
    startServer(['--model', storiesGguf, '--tool-call-parser', 'hermes', ...common]),
    startServer(['--model', llamaDir, ...common]),
    startServer(['--model', kimiDir, ...common]),
  ]);
  for (const s of Object.values(servers)) {
    s.client = new OpenAI({ baseURL: `${s.url}/v1`, apiKey: s.defaultKey, maxRetries: 0, timeout: 120000 });
  }
});
after(async () => {
  await Promise.all(Object.values(servers).map((s) => s.stop()));
});

test('the syntaxes are the ones the vocabularies and flags choose', () => {
  assert.match(servers.stories.log, /tool calls hermes \(--tool-call-parser\)/);
  assert.match(servers.llama.log, /tool calls llama3_json \(auto: the vocabulary has <\|python_tag\|>\)/);
  assert.match(servers.kimi.log, /tool calls kimi_k2 \(auto: the vocabulary has <\|tool_calls_section_begin\|>\)/);
});

// Request i: the tool of a corpus schema and the next one, with tool_choice named (every third
// request) or required. One call per answer unless `parallel`: with parallel_tool_calls the
// grammar lets the model go on calling, and these models, whose weights know nothing of tools,
// often go on until max_tokens.
function toolRequest(i, parallel = false) {
  const first = objectSchemas[i % objectSchemas.length];
  const second = objectSchemas[(i + 1) % objectSchemas.length];
  const tools = [toolOf(first), toolOf(second)];
  const named = i % 3 === 0;
  return {
    named: named ? tools[0].function.name : null,
    parallel,
    offered: tools.map((t) => t.function.name),
    body: {
      messages: [{ role: 'user', content: 'Call a tool.' }],
      tools,
      tool_choice: named ? { type: 'function', function: { name: tools[0].function.name } } : 'required',
      parallel_tool_calls: parallel,
      temperature: 1,
      seed: 2000 + i,
      max_tokens: 400,
      // Stop strings every call holds: a forced call is the grammar's to end, so they cut nothing.
      ...(i % 5 === 4 ? { stop: ['"', '{', ':', '}'] } : {}),
    },
  };
}

// Why an answer to `request` is not what tool_choice promised, or null. With `cutShort`, an
// answer max_tokens ended is judged by the calls it completed (all but its last).
function toolAnswerFault(request, choice, { cutShort = false } = {}) {
  const message = choice.message;
  const show = JSON.stringify(message);
  const cut = cutShort && choice.finish_reason === 'length';
  if (choice.finish_reason !== 'tool_calls' && !cut) return `finish_reason ${choice.finish_reason}: ${show}`;
  if (message.content && !cut) return `content beside the calls: ${show}`;
  const calls = message.tool_calls ?? [];
  if (calls.length === 0) return `no tool calls: ${show}`;
  if (!request.parallel && calls.length !== 1) return `${calls.length} calls without parallel_tool_calls: ${show}`;
  // Cut inside a call's arguments, the answer has no content (held-back marker text) to show it.
  for (const call of cut && !message.content ? calls.slice(0, -1) : calls) {
    if (!request.offered.includes(call.function.name)) return `a call of ${call.function.name}: ${show}`;
    if (request.named && call.function.name !== request.named) return `named ${request.named}, called ${call.function.name}`;
    let value;
    try {
      value = JSON.parse(call.function.arguments);
    } catch (error) {
      return `arguments not JSON (${error.message}): ${call.function.arguments}`;
    }
    const validate = validators[whichOf(call.function.name)];
    if (!validate(value)) return `${call.function.name}: ${ajv.errorsText(validate.errors)}: ${call.function.arguments}`;
  }
  return null;
}

async function checkGenerations(server, count, first, label, parallel = false) {
  const results = await inBatches(count, 16, async (k) => {
    const request = toolRequest(first + k, parallel);
    const completion = await server.client.chat.completions.create(request.body);
    return { request, choice: completion.choices[0] };
  });
  const faults = results.map(({ request, choice }) => toolAnswerFault(request, choice, { cutShort: parallel }))
    .filter((f) => f !== null);
  assert.deepEqual(faults, [], `${label}: ${faults.length} of ${results.length} answers broke the promise`);
  return results;
}

test('500 generations with tool_choice required or named: every answer is calls whose arguments validate (ajv)', async () => {
  await checkGenerations(servers.stories, 200, 0, 'stories260K (hermes)');
  await checkGenerations(servers.llama, 150, 200, 'tiny (llama3_json)');
  const kimi = await checkGenerations(servers.kimi, 150, 350, 'tiny (kimi_k2, special-token markers)');
  // Kimi's ids number the calls from the conversation's earlier ones (none here).
  for (const { choice } of kimi) {
    choice.message.tool_calls.forEach((call, k) => assert.equal(call.id, `functions.${call.function.name}:${k}`));
  }
});

test('with parallel_tool_calls, every call made validates; answers that end are calls only', async () => {
  for (const [name, server] of Object.entries(servers)) {
    const results = await checkGenerations(server, 24, 600, `${name}, parallel`, true);
    // Some answers end with more than one call, and some before max_tokens.
    assert.ok(results.some(({ choice }) => choice.message.tool_calls.length > 1), name);
    if (name === 'kimi') {
      for (const { choice } of results) {
        choice.message.tool_calls.forEach((call, k) => assert.equal(call.id, `functions.${call.function.name}:${k}`));
      }
    }
  }
});

// A streamed answer added up as the SDK's users do.
async function collect(stream) {
  const out = { content: '', toolCalls: [], finish: null };
  for await (const chunk of stream) {
    const choice = chunk.choices[0];
    if (!choice) continue;
    if (choice.finish_reason) out.finish = choice.finish_reason;
    if (choice.delta?.content) out.content += choice.delta.content;
    for (const call of choice.delta?.tool_calls ?? []) {
      if (call.index === out.toolCalls.length) {
        out.toolCalls.push({ type: call.type, function: { name: call.function.name, arguments: call.function.arguments } });
      } else {
        out.toolCalls[call.index].function.arguments += call.function.arguments;
      }
    }
  }
  return out;
}
const withoutIds = (calls) => (calls ?? []).map(({ id, ...rest }) => rest);

test('streamed and whole answers are the same calls; the SDK stream helper assembles them too', async () => {
  for (const [name, server] of Object.entries(servers)) {
    for (let i = 0; i < 6; i++) {
      const request = toolRequest(900 + i);
      const whole = (await server.client.chat.completions.create(request.body)).choices[0];
      assert.equal(toolAnswerFault(request, whole), null, name);
      const streamed = await collect(await server.client.chat.completions.create({ ...request.body, stream: true }));
      assert.equal(streamed.finish, 'tool_calls', name);
      assert.equal(streamed.content, '', name);
      assert.deepEqual(streamed.toolCalls, withoutIds(whole.message.tool_calls), name);
      const helper = await server.client.chat.completions.stream(request.body).finalChatCompletion();
      assert.equal(helper.choices[0].finish_reason, 'tool_calls', name);
      assert.deepEqual(withoutIds(helper.choices[0].message.tool_calls), withoutIds(whole.message.tool_calls), name);
    }
  }
});

test('a named function is exactly one call, ended there, whatever parallel_tool_calls says', async () => {
  for (const [name, server] of Object.entries(servers)) {
    for (let i = 0; i < 6; i++) {
      const request = toolRequest(3 * (700 + i), /*parallel=*/true);  // named: every third request
      assert.ok(request.named);
      const choice = (await server.client.chat.completions.create(request.body)).choices[0];
      assert.equal(choice.finish_reason, 'tool_calls', `${name}: ${JSON.stringify(choice.message)}`);
      assert.equal(choice.message.tool_calls.length, 1, name);
      assert.equal(choice.message.tool_calls[0].function.name, request.named, name);
    }
  }
});

test('an answer cut short by max_tokens leaves no tool-call markup in content', async () => {
  for (const [name, server] of Object.entries(servers)) {
    for (const max_tokens of [1, 2, 3, 5, 8]) {
      const request = toolRequest(33, true);
      const body = { ...request.body, max_tokens };
      const whole = (await server.client.chat.completions.create(body)).choices[0];
      const streamed = await collect(await server.client.chat.completions.create({ ...body, stream: true }));
      for (const content of [whole.message.content ?? '', streamed.content]) {
        assert.equal(content, '', `${name}, max_tokens ${max_tokens}: ${JSON.stringify(whole.message)}`);
      }
    }
  }
});

describe('requests the constraint cannot serve', () => {
  const patterned = [{ type: 'function', function: { name: 'ok', parameters: { type: 'object', properties: {} } } },
    { type: 'function', function: { name: 'lookup',
      parameters: { type: 'object', properties: { code: { type: 'string', pattern: '^[A-Z]+$' } } } } }];

  test('an unsupported keyword in a tool\'s parameters is a 400 naming it and the tool; auto is not constrained', async () => {
    const { client } = servers.stories;
    await assert.rejects(client.chat.completions.create({ messages: [{ role: 'user', content: 'x' }], max_tokens: 5,
      tools: patterned, tool_choice: 'required' }), (error) => {
      assert.equal(error.status, 400, String(error));
      assert.equal(error.param, 'tools[1].function.parameters.properties.code.pattern');
      assert.match(error.message, /tool 'lookup'/);
      assert.match(error.message, /pattern/);
      return true;
    });
    // Named: only the chosen tool's schema is compiled.
    const named = await client.chat.completions.create({ messages: [{ role: 'user', content: 'x' }], max_tokens: 60,
      tools: patterned, tool_choice: { type: 'function', function: { name: 'ok' } }, parallel_tool_calls: false,
      temperature: 0 });
    assert.equal(named.choices[0].finish_reason, 'tool_calls');
    assert.deepEqual(withoutIds(named.choices[0].message.tool_calls),
      [{ type: 'function', function: { name: 'ok', arguments: '{}' } }]);
    const auto = await client.chat.completions.create({ messages: [{ role: 'user', content: 'x' }], max_tokens: 5,
      tools: patterned, temperature: 0 });
    assert.equal(auto.choices[0].finish_reason, 'length');
  });

  test('a JSON response_format together with required or a named function is a 400', async () => {
    for (const tool_choice of ['required', { type: 'function', function: { name: 'ok' } }]) {
      await assert.rejects(servers.stories.client.chat.completions.create({ messages: [{ role: 'user', content: 'x' }],
        max_tokens: 5, tools: patterned.slice(0, 1), tool_choice, response_format: { type: 'json_object' } }),
      (error) => error.status === 400 && error.param === 'response_format');
    }
  });

  test('a model without a tool-call syntax answers required and a named function with schema-valid tool_calls', async () => {
    const plain = await startServer(['--model', storiesGguf, '--threads', '1']);
    try {
      assert.match(plain.log, /tool calls none/);
      const client = new OpenAI({ baseURL: `${plain.url}/v1`, apiKey: plain.defaultKey, maxRetries: 0 });
      for (let i = 0; i < 12; i++) {
        const request = toolRequest(1200 + i);
        const whole = (await client.chat.completions.create(request.body)).choices[0];
        assert.equal(toolAnswerFault(request, whole), null);
        const streamed = await collect(await client.chat.completions.create({ ...request.body, stream: true }));
        assert.equal(streamed.finish, 'tool_calls');
        assert.equal(streamed.content, '');
        assert.deepEqual(streamed.toolCalls, withoutIds(whole.message.tool_calls));
      }
    } finally {
      await plain.stop();
    }
  });
});

test('split topology: the gateway sends the tool-call grammar and the backend compiles it', async () => {
  const kimiRenames = Object.fromEntries(kimiMarkers.map((m, i) => [`<|reserved_special_token_${i}|>`, m]));
  const dir = makeTiny(13, kimiRenames);
  const backend = await startServer(['--model', dir, '--threads', '1', '--internal-token', TOKEN, '--http-threads', '1'],
    { command: 'backend' });
  const gateway = await startServer(['--model', dir, '--internal-token', TOKEN, '--backend', backend.url,
    '--backend-poll-interval', '100ms'], { command: 'gateway' });
  try {
    const client = new OpenAI({ baseURL: `${gateway.url}/v1`, apiKey: gateway.defaultKey, maxRetries: 0 });
    for (let i = 0; i < 12; i++) {
      const request = toolRequest(700 + i);
      const choice = (await client.chat.completions.create(request.body)).choices[0];
      assert.equal(toolAnswerFault(request, choice), null);
    }
    assert.ok((await requiredMetric(backend, 'edgeinfer_grammar_cache_misses_total')) >= 1);
  } finally {
    await Promise.all([gateway.stop(), backend.stop()]);
  }
});

describe('the openai SDK as an agent', () => {
  const weatherSchema = { type: 'object', properties: { city: { type: 'string', enum: ['Paris', 'Oslo', 'Lima'] },
    days: { type: 'integer', minimum: 1, maximum: 3 } }, required: ['city'], additionalProperties: false };
  const timeSchema = { type: 'object', properties: { zone: { type: 'string', enum: ['UTC', 'CET'] } },
    required: ['zone'], additionalProperties: false };
  const agentTools = [
    { type: 'function', function: { name: 'get_weather', description: 'Weather in a city', parameters: weatherSchema } },
    { type: 'function', function: { name: 'get_time', description: 'Time in a zone', parameters: timeSchema } },
  ];
  const validate = { get_weather: ajv.compile(weatherSchema), get_time: ajv.compile(timeSchema) };
  const runTool = (name, args) => (name === 'get_weather' ? { city: args.city, sky: 'clear', celsius: 21 }
    : { zone: args.zone, time: '12:00' });

  // The turns of the conversation: calls while the agent needs them, then the text answer.
  // (One call per turn: with parallel_tool_calls these models may go on calling to max_tokens.)
  const turns = [
    { tool_choice: 'required', parallel_tool_calls: false },
    { tool_choice: { type: 'function', function: { name: 'get_time' } }, parallel_tool_calls: false },
    { tool_choice: 'required', parallel_tool_calls: false },
    { tool_choice: 'none' },
  ];

  test('a loop over several turns: tool calls, tool results, a text answer; streamed and whole agree each turn', async () => {
    for (const name of ['llama', 'kimi']) {
      const { client } = servers[name];
      const messages = [{ role: 'system', content: 'You are a helpful agent.' },
        { role: 'user', content: 'What is the weather in Paris, and the time?' }];
      for (const [t, turn] of turns.entries()) {
        const body = { messages, tools: agentTools, temperature: 1, seed: 77 + t, max_tokens: 120, ...turn };
        const whole = (await client.chat.completions.create(body)).choices[0];
        const stream = client.chat.completions.stream(body);
        const streamed = (await stream.finalChatCompletion()).choices[0];
        assert.equal(streamed.finish_reason, whole.finish_reason, `${name} turn ${t}`);
        assert.equal(streamed.message.content ?? '', whole.message.content ?? '', `${name} turn ${t}`);
        assert.deepEqual(withoutIds(streamed.message.tool_calls), withoutIds(whole.message.tool_calls), `${name} turn ${t}`);
        if (turn.tool_choice === 'none') {
          assert.equal(whole.message.tool_calls, undefined);
          assert.ok(whole.message.content.length > 0);
          break;
        }
        assert.equal(whole.finish_reason, 'tool_calls', `${name} turn ${t}: ${JSON.stringify(whole.message)}`);
        assert.equal(whole.message.tool_calls.length, 1);
        if (typeof turn.tool_choice === 'object') {
          assert.ok(whole.message.tool_calls.every((c) => c.function.name === 'get_time'));
        }
        // The assistant's calls go back into the history, each answered by a tool message.
        messages.push({ role: 'assistant', content: null, tool_calls: whole.message.tool_calls });
        for (const call of whole.message.tool_calls) {
          const args = JSON.parse(call.function.arguments);
          assert.ok(validate[call.function.name](args), call.function.arguments);
          messages.push({ role: 'tool', tool_call_id: call.id, content: JSON.stringify(runTool(call.function.name, args)) });
        }
        if (name === 'kimi') {
          // Kimi's ids count on through the conversation.
          const earlier = messages.slice(0, -whole.message.tool_calls.length - 1)
            .reduce((n, m) => n + (m.tool_calls?.length ?? 0), 0);
          whole.message.tool_calls.forEach((c, k) => assert.equal(c.id, `functions.${c.function.name}:${earlier + k}`));
        }
      }
    }
  });

  test('runTools runs the loop, streamed and not: each call\'s arguments reach the tool valid', async () => {
    for (const stream of [false, true]) {
      const called = [];
      const runner = servers.llama.client.chat.completions.runTools({
        messages: [{ role: 'user', content: 'Weather in Oslo?' }],
        tools: agentTools.map((t) => ({ type: 'function', function: { ...t.function,
          function: (args) => {
            called.push({ name: t.function.name, args });
            assert.ok(validate[t.function.name](args), JSON.stringify(args));
            return runTool(t.function.name, args);
          },
          parse: JSON.parse } })),
        tool_choice: 'required',
        parallel_tool_calls: false,
        temperature: 1,
        seed: 5,
        max_tokens: 120,
        stream,
      }, { maxChatCompletions: 3 });
      await runner.done();
      const completions = runner.allChatCompletions();
      assert.equal(completions.length, 3);
      for (const completion of completions) assert.equal(completion.choices[0].finish_reason, 'tool_calls');
      const toolMessages = runner.messages.filter((m) => m.role === 'tool');
      assert.equal(toolMessages.length, called.length);
      assert.equal(called.length, 3, `stream ${stream}`);
    }
  });
});
