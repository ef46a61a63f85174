// Requests a hostile tenant would send to the agent API, through the real server on stories260K:
// grammars that fail to compile, a compile queue filled at once, constraints the request itself
// makes impossible (before generation and in the middle of it). After each, the server still
// answers /readyz with 200 and serves another tenant's ordinary request; behind a split gateway
// neither backend dies and the gateway retries nothing (the request's own fault is final).
import { test, before, after, describe } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import OpenAI from 'openai';
import { startServer, fetch } from './lib/server.mjs';
import { scrape, seriesValue } from './lib/metrics.mjs';

const models = process.env.EDGE_TEST_MODELS ?? path.resolve('../shared/models');
const storiesGguf = path.join(models, 'stories260K', 'stories260K.gguf');
const TOKEN = 'internal-token-0123456789';

// stories260K spells '{' only with its byte token <0x7B> (byte tokens start at id 3).
const OPEN_BRACE = 3 + 0x7b;

// A schema whose grammar compiles to nothing finite: the compile fails (the error path whose
// response a GCC 12 coroutine bug used to free twice).
const endless = { type: 'object', properties: { a: { $ref: '#' } }, required: ['a'], additionalProperties: false };

function schemaFormat(schema, name = 'x') {
  return { type: 'json_schema', json_schema: { name, schema } };
}

// Ready, and another request completes.
async function assertServes(server) {
  const ready = await fetch(`${server.url}/readyz`);
  assert.equal(ready.status, 200, await ready.text());
  const res = await fetch(`${server.url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ prompt: 'Once upon a time', max_tokens: 4 }),
  });
  assert.equal(res.status, 200, await res.text());
}

async function chat(server, body) {
  const res = await fetch(`${server.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ messages: [{ role: 'user', content: 'Write it.' }], max_tokens: 32, ...body }),
  });
  return { status: res.status, headers: res.headers, body: await res.json() };
}

// The hostile requests every topology must survive, each with the answer it must get.
const hostile = [
  {
    what: 'a response_format whose grammar does not compile',
    body: { response_format: schemaFormat(endless) },
    check: ({ status, body }) => {
      assert.equal(status, 400);
      assert.match(body.error.message, /no finite output/);
    },
  },
  {
    what: 'tool_choice required with a tool whose parameters do not compile',
    body: {
      tools: [{ type: 'function', function: { name: 'loop', parameters: endless } }],
      tool_choice: 'required',
    },
    check: ({ status }) => assert.equal(status, 400),
  },
  {
    what: 'n: 2 with json_object and a logit_bias that bans "{"',
    body: { n: 2, response_format: { type: 'json_object' }, logit_bias: { [OPEN_BRACE]: -100 } },
    check: ({ status, body }) => {
      assert.equal(status, 400, JSON.stringify(body));
      assert.equal(body.error.type, 'invalid_request_error');
      assert.equal(body.error.param, 'logit_bias');
    },
  },
];

describe('serve', () => {
  let server;
  before(async () => {
    server = await startServer(['--model', storiesGguf, '--threads', '1', '--kv-cache-memory', '32MiB']);
  });
  after(async () => { await server?.stop(); });

  for (const h of hostile) {
    test(`${h.what}: answered, and the server lives`, async () => {
      h.check(await chat(server, h.body));
      await assertServes(server);
      // Twice: the first one must not have left anything behind.
      h.check(await chat(server, h.body));
      await assertServes(server);
    });
  }

  test('70 distinct schemas at once: each answered or refused, and the server lives', async () => {
    const answers = await Promise.all(Array.from({ length: 70 }, (_, i) => chat(server, {
      max_tokens: 8,
      response_format: schemaFormat({
        type: 'object', properties: { [`field_${i}`]: { type: 'integer', minimum: i } },
        required: [`field_${i}`], additionalProperties: false,
      }, `s${i}`),
    })));
    for (const { status, body } of answers) {
      assert.ok([200, 429, 503].includes(status), `${status}: ${JSON.stringify(body)}`);
    }
    await assertServes(server);
  });

  test('a dead end the request makes in the middle of its output ends it with content_filter, not a 5xx', async () => {
    // Any string may come first (too many ways to search up front); then "q" must be written,
    // and every token that could write it is banned.
    const schema = {
      type: 'object', properties: { s: { type: 'string', maxLength: 8 }, e: { const: 'q' } },
      required: ['s', 'e'], additionalProperties: false,
    };
    const vocabulary = await qTokens(server);
    for (const stream of [false, true]) {
      const body = {
        response_format: schemaFormat(schema), max_tokens: 64, temperature: 1, seed: 3,
        logit_bias: Object.fromEntries(vocabulary.map((id) => [id, -100])),
      };
      if (!stream) {
        const { status, body: answer } = await chat(server, body);
        assert.equal(status, 200, JSON.stringify(answer));
        assert.equal(answer.choices[0].finish_reason, 'content_filter');
        assert.match(answer.choices[0].message.content, /"e"\s*:\s*"$/);
        continue;
      }
      const client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: server.defaultKey, maxRetries: 0 });
      const chunks = await client.chat.completions.create({ messages: [{ role: 'user', content: 'Write it.' }], stream: true,
        ...body });
      let text = '';
      let reason = null;
      for await (const chunk of chunks) {
        text += chunk.choices[0]?.delta?.content ?? '';
        reason = chunk.choices[0]?.finish_reason ?? reason;
      }
      assert.equal(reason, 'content_filter');
      assert.match(text, /"e"\s*:\s*"$/);
    }
    await assertServes(server);
  });
});

describe('answers of many log probabilities, not streamed', () => {
  let server;
  before(async () => {
    server = await startServer(['--model', storiesGguf, '--threads', '2', '--kv-cache-memory', '96MiB']);
  });
  after(async () => { await server?.stop(); });

  const residentKiB = () => Number(fs.readFileSync(`/proc/${server.child.pid}/status`, 'utf8').match(/VmRSS:\s+(\d+)/)[1]);
  const body = (n, max_tokens) => ({ n, logprobs: true, top_logprobs: 20, max_tokens, ignore_eos: true });

  test('past the limit a 400 names it; at the limit the answer comes whole and its memory does not stay', async () => {
    const refused = await chat(server, body(128, 1000));
    assert.equal(refused.status, 400);
    assert.equal(refused.body.error.param, 'n');
    assert.match(refused.body.error.message, /stream the answer/);
    const before = residentKiB();
    // 128 x 190 x 21 = 510,720 log probabilities: just under the limit (about 33 MB of JSON).
    const { status, body: answer } = await chat(server, body(128, 190));
    assert.equal(status, 200);
    assert.equal(answer.choices.length, 128);
    assert.equal(answer.choices[127].logprobs.content.length, 190);
    assert.equal(answer.choices[127].logprobs.content[0].top_logprobs.length, 20);
    // Built whole as a tree, such an answer took about 400 MB and kept it; written entry by entry
    // it peaks near 200 MB, and what is left is the KV cache the 24,320 tokens touched (96 MiB).
    const grown = (residentKiB() - before) / 1024;
    assert.ok(grown < 250, `resident memory grew by ${grown.toFixed(0)} MiB`);
    await assertServes(server);
  });
});

// The ids of every token of stories260K's vocabulary whose text holds a "q", found by asking the
// server to echo each candidate id (completions with a prompt of token ids).
async function qTokens(server) {
  const ids = [];
  for (let id = 3; id < 512; id += 64) {
    const batch = Array.from({ length: Math.min(64, 512 - id) }, (_, k) => id + k);
    const res = await fetch(`${server.url}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ prompt: batch, max_tokens: 1, echo: true, logprobs: 0 }),
    });
    const answer = await res.json();
    assert.equal(res.status, 200, JSON.stringify(answer));
    const tokens = answer.choices[0].logprobs.tokens.slice(0, batch.length);
    tokens.forEach((text, k) => { if (text.includes('q') || text === '<0x71>') ids.push(batch[k]); });
  }
  ids.push(3 + 0x71);  // the byte token of 'q'
  return [...new Set(ids)];
}

// A split gateway in front of two backends started with `backendArgs`, for one describe block.
function splitTopology(backendArgs = []) {
  const servers = { backends: [], gateway: null };
  before(async () => {
    for (let i = 0; i < 2; i++) {
      servers.backends.push(await startServer(['--model', storiesGguf, '--threads', '1', '--internal-token', TOKEN,
        '--http-threads', '1', ...backendArgs], { command: 'backend' }));
    }
    servers.gateway = await startServer(['--model', storiesGguf, '--internal-token', TOKEN,
      '--backend-poll-interval', '100ms', ...servers.backends.flatMap((b) => ['--backend', b.url])], { command: 'gateway' });
  });
  after(async () => {
    await Promise.all([servers.gateway, ...servers.backends].filter(Boolean).map((s) => s.stop()));
  });
  return servers;
}

describe('a split gateway in front of two backends', () => {
  const servers = splitTopology();

  test('every hostile request is answered once, no backend dies and none is retried', async () => {
    const { gateway, backends } = servers;
    for (const h of hostile) {
      for (let i = 0; i < 4; i++) h.check(await chat(gateway, h.body));
    }
    for (const b of backends) {
      assert.equal(b.child.exitCode, null, b.log);
      const ready = await globalThis.fetch(`${b.url}/readyz`);
      assert.equal(ready.status, 200);
    }
    await assertServes(gateway);
    const metrics = await scrape(gateway);
    assert.equal(seriesValue(metrics, 'edgeinfer_backend_retries_total', {}), 0);
  });
});

describe('a split gateway in front of two backends with a tight compile budget', () => {
  const servers = splitTopology(['--grammar-compile-budget', '0.0001']);

  test('the tenant past its compile budget gets 429 with retry-after, final: no retry, no backend marked', async () => {
    const { gateway, backends } = servers;
    // Each backend compiles one schema for the tenant and is then out of budget for it: of six
    // distinct schemas at most two compile, and the others are the tenant's 429, not a 503.
    const answers = [];
    for (let i = 0; i < 6; i++) {
      const schema = { type: 'object', properties: { [`k${i}`]: { type: 'integer' } }, required: [`k${i}`] };
      answers.push(await chat(gateway, {
        max_tokens: 4, response_format: { type: 'json_schema', json_schema: { name: 'v', schema } },
      }));
    }
    const refused = answers.filter((a) => a.status !== 200);
    assert.ok(answers.length - refused.length <= 2, JSON.stringify(answers.map((a) => a.status)));
    assert.ok(refused.length >= 4);
    for (const a of refused) {
      assert.equal(a.status, 429, JSON.stringify(a.body));
      assert.equal(a.body.error.type, 'grammar_compile_seconds');
      assert.equal(a.body.error.code, 'rate_limit_exceeded');
      assert.ok(Number(a.headers.get('retry-after')) >= 1);
    }
    const metrics = await scrape(gateway);
    assert.equal(seriesValue(metrics, 'edgeinfer_backend_retries_total', {}), 0);
    for (const b of backends) assert.equal((await globalThis.fetch(`${b.url}/readyz`)).status, 200);
    await assertServes(gateway);
  });
});
