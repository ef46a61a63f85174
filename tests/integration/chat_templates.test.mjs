// Chat templates through the servers, with the official `openai` SDK as the client: a model served
// with a Jinja template (--chat-template FILE, here on stories260K) renders an agent's
// conversation (tools, tool calls, tool results, chat_template_kwargs) into exactly the prompt
// `edgeinfer render-chat` prints for the same request, in `serve` and through `edgeinfer gateway
// --backend` (where the gateway renders with the template its backend loaded); a template that
// raises is a 400 naming its line; one that does not parse stops the server at start, naming its
// line and column.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { spawnSync } from 'node:child_process';
import OpenAI from 'openai';
import { Template } from '@huggingface/jinja';
import { startServer, edgeinferBin, sleep } from './lib/server.mjs';

const models = process.env.EDGE_TEST_MODELS ?? path.resolve('../shared/models');
const storiesGguf = path.join(models, 'stories260K', 'stories260K.gguf');
const TOKEN = 'internal-token-0123456789';

const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'edge-templates-'));
const agentTemplate = path.join(dir, 'agent.jinja');
// An agent's template in the style of the Hermes/Qwen ones: tools as JSON, tool calls, tool
// results, a thinking switch, and an error for roles it does not know.
fs.writeFileSync(agentTemplate, `{{- bos_token }}
{%- if tools %}
<tools>
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}
</tools>
{%- endif %}
{%- for message in messages %}
{%- if message.role not in ['system', 'user', 'assistant', 'tool'] %}
{{- raise_exception('unknown role ' ~ message.role) }}
{%- endif %}
<{{ message.role }}>
{%- if message.content %}{{ message.content | trim }}{% endif %}
{%- for call in message.tool_calls | default([]) %}
<call>{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments }}}</call>
{%- endfor %}
{%- if message.role == 'tool' %} (for {{ message.tool_call_id }}){% endif %}
{%- endfor %}
{%- if add_generation_prompt %}
<assistant>{% if enable_thinking is defined and not enable_thinking %}<no-think>{% endif %}
{%- endif %}
`);
const strictTemplate = path.join(dir, 'strict.jinja');
fs.writeFileSync(strictTemplate, `{%- for message in messages %}
{%- if message.role == 'tool' %}
{{- raise_exception('This model does not take tool results') }}
{%- endif %}
{{- message.content }}
{%- endfor %}
`);
const brokenTemplate = path.join(dir, 'broken.jinja');
fs.writeFileSync(brokenTemplate, 'fine\n{% for message in messages %}{{ message.content }}\n');

const tools = [
  {
    type: 'function',
    function: {
      name: 'get_weather',
      description: 'The weather in a city.',
      parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
    },
  },
];
const conversation = [
  { role: 'system', content: 'You are an agent.' },
  { role: 'user', content: 'Weather in Paris?' },
  { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city": "Paris"}' } }] },
  { role: 'tool', tool_call_id: 'call_1', content: '21 C, clear' },
];
const request = {
  model: 'stories260K',
  messages: conversation,
  tools,
  tool_choice: 'auto',
  parallel_tool_calls: false,
  chat_template_kwargs: { enable_thinking: false },
  max_tokens: 4,
  temperature: 0,
};

// The prompt render-chat prints for the request, and its token count (as the server encodes a
// Jinja template's text: special tokens parsed, no BOS added).
function renderedPrompt(args) {
  const rendered = spawnSync(edgeinferBin, ['render-chat', '--model', storiesGguf, ...args], {
    input: JSON.stringify(request),
    encoding: 'utf8',
  });
  assert.equal(rendered.status, 0, rendered.stderr);
  const tokens = spawnSync(edgeinferBin, ['tokenize', '--model', storiesGguf, '--no-bos'], {
    input: rendered.stdout,
    encoding: 'utf8',
  });
  assert.equal(tokens.status, 0, tokens.stderr);
  return { text: rendered.stdout, tokens: JSON.parse(tokens.stdout).length };
}

let serve;
let cluster;

before(async () => {
  serve = await startServer(['--model', storiesGguf, '--threads', '1', '--chat-template', agentTemplate]);
  const backend = await startServer(['--model', storiesGguf, '--threads', '1', '--internal-token', TOKEN,
    '--chat-template', agentTemplate], { command: 'backend' });
  const gateway = await startServer(['--model', storiesGguf, '--internal-token', TOKEN, '--backend-poll-interval',
    '100ms', '--backend', backend.url], { command: 'gateway' });
  cluster = { backend, gateway };
});

after(async () => {
  await Promise.all([serve, cluster?.gateway, cluster?.backend].filter(Boolean).map((s) => s.stop()));
  fs.rmSync(dir, { recursive: true, force: true });
});

test('render-chat prints the prompt the template renders for an agent conversation', () => {
  const { text } = renderedPrompt(['--chat-template', agentTemplate]);
  // As @huggingface/jinja renders the template (stories260K's BOS is <s>).
  const expected = new Template(fs.readFileSync(agentTemplate, 'utf8')).render({
    messages: conversation, tools, add_generation_prompt: true, bos_token: '<s>', eos_token: '</s>', enable_thinking: false,
  });
  assert.equal(text, expected);
  assert.ok(text.includes('<call>{"name": "get_weather", "arguments": {"city": "Paris"}}</call>'));
  assert.ok(text.endsWith('<assistant><no-think>'));
});

test('serve logs where its template comes from and serves the prompt render-chat prints', async () => {
  assert.match(serve.log, /chat template: Jinja template from --chat-template .*agent\.jinja/);
  const client = new OpenAI({ baseURL: `${serve.url}/v1`, apiKey: serve.defaultKey, maxRetries: 0 });
  const { tokens } = renderedPrompt(['--chat-template', agentTemplate]);
  const completion = await client.chat.completions.create(request);
  assert.equal(completion.usage.prompt_tokens, tokens);
  // Without the thinking switch and the generation prompt, a different (shorter) prompt.
  const plain = await client.chat.completions.create({ ...request, chat_template_kwargs: undefined });
  assert.equal(plain.usage.prompt_tokens < tokens, true);
});

test('the gateway renders with the template its backend loaded: the same prompt as serve', async () => {
  await sleep(300);
  assert.match(cluster.gateway.log, /chat template \(from the backends\): Jinja template from --chat-template/);
  const client = new OpenAI({ baseURL: `${cluster.gateway.url}/v1`, apiKey: cluster.gateway.defaultKey, maxRetries: 0 });
  const { tokens } = renderedPrompt(['--chat-template', agentTemplate]);
  const completion = await client.chat.completions.create(request);
  assert.equal(completion.usage.prompt_tokens, tokens);
  const streamed = await client.chat.completions.create({ ...request, stream: true, stream_options: { include_usage: true } });
  let usage = null;
  for await (const chunk of streamed) usage = chunk.usage ?? usage;
  assert.equal(usage.prompt_tokens, tokens);
});

test('request errors name the field, in serve and through the gateway', async () => {
  for (const server of [serve, cluster.gateway]) {
    const client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: server.defaultKey, maxRetries: 0 });
    const cases = [
      [{ ...request, tool_choice: { type: 'function', function: { name: 'nope' } } }, 'tool_choice.function.name'],
      [{ ...request, messages: [{ role: 'tool', content: 'x' }] }, 'messages[0].tool_call_id'],
      [{ ...request, tools: [{ type: 'function', function: { name: 'bad name' } }] }, 'tools[0].function.name'],
      [{ ...request, chat_template_kwargs: { messages: [] } }, 'chat_template_kwargs.messages'],
    ];
    for (const [body, param] of cases) {
      await assert.rejects(client.chat.completions.create(body), (e) => {
        assert.equal(e.status, 400);
        assert.equal(e.error?.param ?? e.param, param);
        return true;
      });
    }
  }
});

test('a template that raises is a 400 naming its line; the server goes on', async () => {
  const strict = await startServer(['--model', storiesGguf, '--threads', '1', '--chat-template', strictTemplate]);
  try {
    const client = new OpenAI({ baseURL: `${strict.url}/v1`, apiKey: strict.defaultKey, maxRetries: 0 });
    await assert.rejects(client.chat.completions.create(request), (e) => {
      assert.equal(e.status, 400);
      assert.match(e.message, /line 3: This model does not take tool results/);
      return true;
    });
    const ok = await client.chat.completions.create({ ...request, messages: [{ role: 'user', content: 'Hi' }] });
    assert.equal(ok.choices.length, 1);
  } finally {
    await strict.stop();
  }
});

test('a template that does not parse stops the server at start, naming its line and column', () => {
  const run = spawnSync(edgeinferBin, ['serve', '--model', storiesGguf, '--port', '0', '--state-dir', path.join(dir, 's'),
    '--chat-template', brokenTemplate], { encoding: 'utf8', timeout: 60000 });
  assert.notEqual(run.status, 0);
  assert.match(run.stderr, /broken\.jinja: line 2, column \d+: the template ends before 'endfor' or 'else'/);
});
