// Tool calls and reasoning in chat answers, end to end with the official `openai` SDK.
//
// 1. A real model, stories260K, served with the tool-call and reasoning parsers forced on: it
//    writes neither, so its answers are content as before, the same streamed and whole, with
//    reasoning_content null and reasoning_tokens 0; the parsers chosen are logged; bad flags and
//    bad `tools` are refused.
// 2. The parsing itself. No model here can be made to write a given text, so a split gateway's
//    backend (a real `edgeinfer backend` on a synthetic model) sends its generation through a
//    proxy that replaces each delta's text with the next piece of a scripted model output; the
//    tokens, usage and timings stay the backend's, and the finish becomes "stop", as a model's
//    end of sequence would make it. The gateway, its parsers, SSE and the SDK are real: tool
//    calls and reasoning, whole and streamed (the stream assembled must equal the whole answer),
//    for the Hermes/Qwen syntax with <think> reasoning (also with n = 2 and logprobs: each choice
//    parsed on its own), Kimi K2's (ids kept), and Llama 3's JSON chosen from the vocabulary,
//    which also makes the gateway ask for special tokens' text.
import { test, before, after, describe } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import path from 'node:path';
import { spawnSync } from 'node:child_process';
import OpenAI from 'openai';
import { startServer, fetch, edgeinferBin, makeStateDir } from './lib/server.mjs';

const models = process.env.EDGE_TEST_MODELS ?? path.resolve('../shared/models');
const storiesGguf = path.join(models, 'stories260K', 'stories260K.gguf');
const TOKEN = 'internal-token-0123456789';

const weatherTools = [
  { type: 'function', function: { name: 'get_weather', description: 'Weather in a city',
    parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } },
  { type: 'function', function: { name: 'get_time', parameters: { type: 'object', properties: {} } } },
];
const question = [{ role: 'user', content: 'What is the weather in Paris?' }];

// A streamed chat read chunk by chunk and added up as OpenAI's clients do: content and
// reasoning appended, a call's id, type and name from its first delta, its arguments appended.
async function collect(stream) {
  const out = { chunks: [], content: '', reasoning: '', toolCalls: [], finish: null, usage: null };
  for await (const chunk of stream) {
    out.chunks.push(chunk);
    if (chunk.usage) out.usage = chunk.usage;
    const choice = chunk.choices[0];
    if (!choice) continue;
    if (choice.finish_reason) out.finish = choice.finish_reason;
    const delta = choice.delta ?? {};
    if (delta.content) out.content += delta.content;
    if (delta.reasoning_content) out.reasoning += delta.reasoning_content;
    for (const call of delta.tool_calls ?? []) {
      if (call.index === out.toolCalls.length) {
        out.toolCalls.push({ id: call.id, type: call.type, function: { ...call.function } });
      } else {
        out.toolCalls[call.index].function.arguments += call.function.arguments;
      }
    }
  }
  return out;
}

// The calls without their ids (made anew for each answer), which are checked apart.
const withoutIds = (calls) => (calls ?? []).map(({ id, ...rest }) => rest);
const OPENAI_ID = /^call_[A-Za-z0-9]{24}$/;

describe('a real model with the parsers on', () => {
  let server;
  let client;
  before(async () => {
    server = await startServer(['--model', storiesGguf, '--threads', '1', '--tool-call-parser', 'hermes',
      '--reasoning-parser', 'think']);
    client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: server.defaultKey, maxRetries: 0 });
  });
  after(async () => { await server?.stop(); });

  test('logs the parsers chosen by the flags', () => {
    assert.match(server.log, /chat answers: tool calls hermes \(--tool-call-parser\), reasoning think \(--reasoning-parser\)/);
  });

  test('answers with content alone, the same streamed and whole', async () => {
    const request = { model: 'stories260K', messages: [{ role: 'user', content: 'Once upon a time' }], max_tokens: 24,
      temperature: 0, tools: weatherTools };
    const whole = await client.chat.completions.create(request);
    const message = whole.choices[0].message;
    assert.ok(message.content.length > 0);
    assert.equal(message.tool_calls, undefined);
    assert.equal(message.reasoning_content, null);
    assert.equal(whole.choices[0].finish_reason, 'length');
    assert.equal(whole.usage.completion_tokens_details.reasoning_tokens, 0);

    const streamed = await collect(await client.chat.completions.create({ ...request, stream: true,
      stream_options: { include_usage: true } }));
    assert.equal(streamed.content, message.content);
    assert.equal(streamed.reasoning, '');
    assert.deepEqual(streamed.toolCalls, []);
    assert.equal(streamed.finish, 'length');
    assert.deepEqual(streamed.usage.completion_tokens_details, { reasoning_tokens: 0 });
  });

  test('refuses tools that are not an array of functions, naming the field', async () => {
    for (const [tools, param] of [[{}, 'tools'], [[{ type: 'function' }], 'tools[0].function'],
      [[{ type: 'retrieval', function: { name: 'x' } }], 'tools[0].type'],
      [[{ type: 'function', function: { name: 'f', parameters: 'none' } }], 'tools[0].function.parameters']]) {
      const res = await fetch(`${server.url}/v1/chat/completions`, { method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ messages: question, max_tokens: 2, tools }) });
      assert.equal(res.status, 400);
      assert.equal((await res.json()).error.param, param);
    }
  });
});

test('the model\'s own vocabulary chooses no parser for stories260K; usage has no reasoning details', async () => {
  const server = await startServer(['--model', storiesGguf, '--threads', '1']);
  try {
    assert.match(server.log, /chat answers: tool calls none \(auto: no tool-call syntax in the vocabulary\), reasoning none/);
    const client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: server.defaultKey, maxRetries: 0 });
    const whole = await client.chat.completions.create({ model: 'stories260K', messages: question, max_tokens: 4,
      tools: weatherTools });
    assert.equal(whole.usage.completion_tokens_details, undefined);
    assert.equal('reasoning_content' in whole.choices[0].message, false);
  } finally {
    await server.stop();
  }
});

test('an unknown parser name is refused at start', () => {
  for (const flag of ['--tool-call-parser', '--reasoning-parser']) {
    const run = spawnSync(edgeinferBin, ['serve', '--model', storiesGguf, '--port', '0', '--state-dir', makeStateDir(),
      flag, 'qwen-magic'], { encoding: 'utf8', timeout: 30000 });
    assert.equal(run.status, 2, run.stderr);
    assert.match(run.stderr, new RegExp(`${flag}`));
  }
});

// A proxy in front of a backend that gives the i-th delta of each choice of a generation the i-th
// piece of `proxy.script` (nothing past its end) and finishes the choices and the generation with
// "stop"; it keeps each generate request's body in proxy.requests. Everything else passes as it is.
async function scriptingProxy(backend) {
  const target = new URL(backend.url);
  const proxy = { script: [], requests: [] };
  proxy.server = http.createServer((req, res) => {
    let body = '';
    req.on('data', (d) => { body += d; });
    req.on('end', () => {
      if (req.url === '/internal/v1/generate') proxy.requests.push(JSON.parse(body));
      const upstream = http.request({ host: target.hostname, port: target.port, path: req.url, method: req.method,
        headers: req.headers }, (answer) => {
        res.writeHead(answer.statusCode, answer.headers);
        if (req.url !== '/internal/v1/generate' || answer.statusCode !== 200) {
          answer.pipe(res);
          return;
        }
        const script = [...proxy.script];
        const next = new Map();  // choice index -> its next piece
        let pending = '';
        answer.on('data', (chunk) => {
          pending += chunk;
          for (let end; (end = pending.indexOf('\n')) >= 0; pending = pending.slice(end + 1)) {
            const event = JSON.parse(pending.slice(0, end));
            if (event.type === 'delta') {
              const index = event.index ?? 0;
              const piece = next.get(index) ?? 0;
              next.set(index, piece + 1);
              event.text = script[piece] ?? '';
              if (event.finish) event.finish = 'stop';
            }
            if (event.type === 'finished') event.reason = 'stop';
            res.write(`${JSON.stringify(event)}\n`);
          }
        });
        answer.on('end', () => res.end());
      });
      upstream.on('error', () => res.destroy());
      res.on('close', () => upstream.destroy());
      upstream.end(body);
    });
  });
  await new Promise((resolve) => proxy.server.listen(0, '127.0.0.1', resolve));
  proxy.url = `http://127.0.0.1:${proxy.server.address().port}`;
  proxy.close = () => new Promise((resolve) => { proxy.server.closeAllConnections(); proxy.server.close(resolve); });
  return proxy;
}

describe('scripted model output through a split gateway', () => {
  let model;
  let backend;
  let proxy;
  const gateways = {};
  const clients = {};

  before(async () => {
    model = path.join(makeStateDir(), 'tiny');
    const made = spawnSync(edgeinferBin, ['make-model', '--preset', 'tiny', '--out', model], { encoding: 'utf8' });
    assert.equal(made.status, 0, made.stderr);
    backend = await startServer(['--model', model, '--threads', '1', '--internal-token', TOKEN, '--http-threads', '1'],
      { command: 'backend' });
    proxy = await scriptingProxy(backend);
    const flags = {
      qwen: ['--tool-call-parser', 'hermes', '--reasoning-parser', 'think'],
      kimi: ['--tool-call-parser', 'kimi_k2', '--reasoning-parser', 'kimi_k2'],
      llama: [],  // the vocabulary's: <|python_tag|>
    };
    for (const [name, extra] of Object.entries(flags)) {
      gateways[name] = await startServer(['--model', model, '--internal-token', TOKEN, '--backend', proxy.url,
        '--backend-poll-interval', '50ms', ...extra], { command: 'gateway' });
      clients[name] = new OpenAI({ baseURL: `${gateways[name].url}/v1`, apiKey: gateways[name].defaultKey, maxRetries: 0 });
    }
  });
  after(async () => {
    await Promise.all(Object.values(gateways).map((g) => g.stop()));
    await proxy?.close();
    await backend?.stop();
  });

  // One chat whose answer is `script`, one piece per generated token.
  function ask(name, script, extra = {}) {
    proxy.script = script;
    return clients[name].chat.completions.create({ model: 'tiny', messages: question, max_tokens: script.length,
      temperature: 0, ignore_eos: true, tools: weatherTools, ...extra });
  }

  const qwenAnswer = ['<think>', '\nThe user', ' wants Paris.\n', '</th', 'ink>\n\n', 'Checking', ' now.', '\n<tool_',
    'call>\n{"name": "get_weather", ', '"arguments": {"city": "Par', 'is"}}\n</tool_call>'];

  test('Qwen3: reasoning, content and a tool call, whole', async () => {
    const whole = await ask('qwen', qwenAnswer);
    const choice = whole.choices[0];
    assert.equal(choice.finish_reason, 'tool_calls');
    assert.equal(choice.message.reasoning_content, 'The user wants Paris.');
    assert.equal(choice.message.content, 'Checking now.');
    assert.equal(choice.message.tool_calls.length, 1);
    const [call] = choice.message.tool_calls;
    assert.match(call.id, OPENAI_ID);
    assert.deepEqual(withoutIds(choice.message.tool_calls),
      [{ type: 'function', function: { name: 'get_weather', arguments: '{"city": "Paris"}' } }]);
    assert.deepEqual(JSON.parse(call.function.arguments), { city: 'Paris' });
    assert.equal(whole.usage.completion_tokens, qwenAnswer.length);
    // "<think>" up to the piece that ends "</think>": five tokens.
    assert.equal(whole.usage.completion_tokens_details.reasoning_tokens, 5);
  });

  test('Qwen3: streamed, the deltas are OpenAI\'s and add up to the whole answer', async () => {
    const whole = (await ask('qwen', qwenAnswer)).choices[0].message;
    const streamed = await collect(await ask('qwen', qwenAnswer, { stream: true, stream_options: { include_usage: true } }));
    assert.equal(streamed.finish, 'tool_calls');
    assert.equal(streamed.reasoning, whole.reasoning_content);
    assert.equal(streamed.content, whole.content);
    assert.deepEqual(withoutIds(streamed.toolCalls), withoutIds(whole.tool_calls));
    assert.match(streamed.toolCalls[0].id, OPENAI_ID);
    assert.equal(streamed.usage.completion_tokens_details.reasoning_tokens, 5);
    // A call's first delta names it with empty arguments; the next ones carry only arguments.
    const callDeltas = streamed.chunks.flatMap((c) => c.choices[0]?.delta?.tool_calls ?? []);
    assert.deepEqual(callDeltas[0], { index: 0, id: streamed.toolCalls[0].id, type: 'function',
      function: { name: 'get_weather', arguments: '' } });
    assert.ok(callDeltas.length > 2, 'the arguments arrive in pieces');
    for (const later of callDeltas.slice(1)) assert.deepEqual(Object.keys(later).sort(), ['function', 'index']);
    // No tag ever reaches the client.
    for (const chunk of streamed.chunks) {
      const delta = chunk.choices[0]?.delta ?? {};
      assert.doesNotMatch(`${delta.content ?? ''}${delta.reasoning_content ?? ''}`, /<\/?think>|<\/?tool_call>|<th|<tool_/);
    }
    // The SDK's own stream helper assembles the same calls.
    proxy.script = qwenAnswer;
    const helper = clients.qwen.chat.completions.stream({ model: 'tiny', messages: question,
      max_tokens: qwenAnswer.length, temperature: 0, ignore_eos: true, tools: weatherTools });
    const final = await helper.finalChatCompletion();
    assert.deepEqual(withoutIds(final.choices[0].message.tool_calls), withoutIds(whole.tool_calls));
    assert.equal(final.choices[0].finish_reason, 'tool_calls');
  });

  test('without tools, or with tool_choice "none", calls are not parsed: the text is content', async () => {
    for (const extra of [{ tools: undefined }, { tool_choice: 'none' }]) {
      const choice = (await ask('qwen', qwenAnswer, extra)).choices[0];
      assert.equal(choice.finish_reason, 'stop');
      assert.equal(choice.message.tool_calls, undefined);
      assert.equal(choice.message.reasoning_content, 'The user wants Paris.');
      assert.equal(choice.message.content,
        'Checking now.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>');
    }
  });

  test('two calls; parallel_tool_calls false keeps the first; an unknown tool is content', async () => {
    const two = ['<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>\n',
      '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'];
    let message = (await ask('qwen', two)).choices[0].message;
    assert.equal(message.content, null);
    assert.deepEqual(message.tool_calls.map((c) => c.function.name), ['get_weather', 'get_time']);
    assert.notEqual(message.tool_calls[0].id, message.tool_calls[1].id);
    message = (await ask('qwen', two, { parallel_tool_calls: false })).choices[0].message;
    assert.deepEqual(message.tool_calls.map((c) => c.function.name), ['get_weather']);
    const unknown = ['<tool_call>\n{"name": "launch", "arguments": {}}\n</tool_call>'];
    const answer = (await ask('qwen', unknown)).choices[0];
    assert.equal(answer.finish_reason, 'stop');
    assert.equal(answer.message.content, unknown[0]);
    assert.equal(answer.message.tool_calls, undefined);
  });

  test('n = 2 with logprobs: each choice parsed on its own, its chunks adding up to its whole answer', async () => {
    const extra = { n: 2, logprobs: true, top_logprobs: 1 };
    const whole = await ask('qwen', qwenAnswer, extra);
    assert.equal(whole.choices.length, 2);
    for (const [i, choice] of whole.choices.entries()) {
      assert.equal(choice.index, i);
      assert.equal(choice.finish_reason, 'tool_calls');
      assert.equal(choice.message.reasoning_content, 'The user wants Paris.');
      assert.equal(choice.message.content, 'Checking now.');
      assert.deepEqual(withoutIds(choice.message.tool_calls),
        [{ type: 'function', function: { name: 'get_weather', arguments: '{"city": "Paris"}' } }]);
      // One entry per generated token, those of the markers included.
      assert.equal(choice.logprobs.content.length, qwenAnswer.length);
    }
    assert.notEqual(whole.choices[0].message.tool_calls[0].id, whole.choices[1].message.tool_calls[0].id);
    assert.equal(whole.usage.completion_tokens, 2 * qwenAnswer.length);
    assert.equal(whole.usage.completion_tokens_details.reasoning_tokens, 2 * 5);

    const stream = await ask('qwen', qwenAnswer, { ...extra, stream: true, stream_options: { include_usage: true } });
    const choices = new Map();
    let usage = null;
    for await (const chunk of stream) {
      if (chunk.usage) usage = chunk.usage;
      for (const choice of chunk.choices) {
        if (!choices.has(choice.index)) {
          choices.set(choice.index, { content: '', reasoning: '', toolCalls: [], finish: null, logprobs: [], pieces: [] });
        }
        const out = choices.get(choice.index);
        const delta = choice.delta ?? {};
        if (choice.finish_reason) out.finish = choice.finish_reason;
        if (delta.content) out.content += delta.content;
        if (delta.reasoning_content) out.reasoning += delta.reasoning_content;
        for (const call of delta.tool_calls ?? []) {
          if (call.index === out.toolCalls.length) {
            out.toolCalls.push({ type: call.type, function: { ...call.function } });
          } else {
            out.toolCalls[call.index].function.arguments += call.function.arguments;
          }
        }
        out.logprobs.push(...(choice.logprobs?.content ?? []));
        if (!delta.role) out.pieces.push(choice.logprobs?.content?.length ?? 0);
      }
    }
    assert.deepEqual([...choices.keys()].sort(), [0, 1]);
    for (const [i, out] of choices) {
      const expected = whole.choices[i];
      assert.equal(out.finish, 'tool_calls');
      assert.equal(out.reasoning, expected.message.reasoning_content);
      assert.equal(out.content, expected.message.content);
      assert.deepEqual(out.toolCalls, withoutIds(expected.message.tool_calls));
      // The log probabilities of a choice's chunks, concatenated, are its whole answer's; the
      // "<think>" the parser held back travels with the first reasoning chunk.
      assert.deepEqual(out.logprobs, expected.logprobs.content);
      assert.equal(out.pieces[0], 2);
    }
    assert.equal(usage.completion_tokens_details.reasoning_tokens, 2 * 5);
  });

  test('Kimi K2: thinking ended by the call section, and the call\'s own id, streamed and whole', async () => {
    const script = ['<think>', 'Paris weather.', '<|tool_calls_section_begin|>', '<|tool_call_begin|>',
      'functions.get_weather:0', '<|tool_call_argument_begin|>', '{"city": ', '"Paris"}', '<|tool_call_end|>',
      '<|tool_calls_section_end|>'];
    const whole = (await ask('kimi', script)).choices[0];
    assert.equal(whole.finish_reason, 'tool_calls');
    assert.equal(whole.message.reasoning_content, 'Paris weather.');
    assert.equal(whole.message.content, null);
    assert.deepEqual(whole.message.tool_calls, [{ id: 'functions.get_weather:0', type: 'function',
      function: { name: 'get_weather', arguments: '{"city": "Paris"}' } }]);
    const streamed = await collect(await ask('kimi', script, { stream: true }));
    assert.deepEqual(streamed.toolCalls, whole.message.tool_calls);
    assert.equal(streamed.reasoning, 'Paris weather.');
  });

  test('Llama 3: chosen from the vocabulary, asks for special tokens\' text only when parsing calls', async () => {
    assert.match(gateways.llama.log,
      /chat answers: tool calls llama3_json \(auto: the vocabulary has <\|python_tag\|>\), reasoning none/);
    const script = ['<|python_tag|>', '{"name": "get_time", ', '"parameters": {}}'];
    const whole = (await ask('llama', script)).choices[0];
    assert.equal(proxy.requests.at(-1).skip_special_tokens, false);
    assert.equal(whole.finish_reason, 'tool_calls');
    assert.deepEqual(withoutIds(whole.message.tool_calls), [{ type: 'function', function: { name: 'get_time', arguments: '{}' } }]);
    const plain = (await ask('llama', ['The time', ' is noon.'], { tools: undefined })).choices[0];
    assert.equal(proxy.requests.at(-1).skip_special_tokens, undefined);
    assert.equal(plain.message.content, 'The time is noon.');
    assert.equal(plain.finish_reason, 'stop');
  });
});
