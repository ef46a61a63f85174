// Sampling completeness through the official `openai` SDK, against `edgeinfer serve` and against
// the split topology (`edgeinfer gateway --backend`), which must serve the same API: chat
// logprobs with top_logprobs and bytes, the same streamed as whole; n choices (seeded, each its
// own text, streamed by index, the prompt computed once); completions logprobs and echo with the
// prompt's own log probabilities; logit_bias forcing and banning tokens; stop with n and
// logprobs; the 400s of each bad value; quotas reserving n x max_tokens.
import { test, before, after, describe } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import { spawnSync } from 'node:child_process';
import OpenAI from 'openai';
import { startServer, edgeinferBin, waitFor, adminCall } from './lib/server.mjs';
import { requiredMetric } from './lib/metrics.mjs';

const models = process.env.EDGE_TEST_MODELS ?? path.resolve('../shared/models');
const storiesGguf = path.join(models, 'stories260K', 'stories260K.gguf');
const modelId = 'stories260K';
const TOKEN = 'internal-token-0123456789';
const ADMIN_TOKEN = 'test-admin-token-0123456789';

// Token ids as the model's tokenizer gives them (`edgeinfer tokenize`).
function tokenize(text, { bos = true } = {}) {
  const out = spawnSync(edgeinferBin, ['tokenize', '--model', storiesGguf, ...(bos ? [] : ['--no-bos']), '--text', text],
    { encoding: 'utf8' });
  assert.equal(out.status, 0, out.stderr);
  return JSON.parse(out.stdout);
}
function decode(ids) {
  const out = spawnSync(edgeinferBin, ['tokenize', '--model', storiesGguf, '--decode', '--text', JSON.stringify(ids)],
    { encoding: 'utf8' });
  assert.equal(out.status, 0, out.stderr);
  return out.stdout.replace(/\n$/, '');
}

// Per choice index: the text, the finish_reason and the logprobs entries a stream carried.
async function collect(stream) {
  const byIndex = new Map();
  const chunks = [];
  for await (const chunk of stream) {
    chunks.push(chunk);
    for (const c of chunk.choices) {
      const entry = byIndex.get(c.index) ?? { text: '', finish: null, content: [], tokens: [], offsets: [], roles: 0 };
      entry.text += c.delta?.content ?? c.text ?? '';
      if (c.delta?.role) entry.roles += 1;
      if (c.finish_reason) {
        assert.equal(entry.finish, null, `choice ${c.index} finished twice`);
        entry.finish = c.finish_reason;
      }
      if (c.logprobs?.content) entry.content.push(...c.logprobs.content);
      if (c.logprobs?.tokens) {
        entry.tokens.push(...c.logprobs.tokens);
        entry.offsets.push(...c.logprobs.text_offset);
        entry.token_logprobs = [...(entry.token_logprobs ?? []), ...c.logprobs.token_logprobs];
        entry.top_logprobs = [...(entry.top_logprobs ?? []), ...c.logprobs.top_logprobs];
      }
      byIndex.set(c.index, entry);
    }
  }
  return { byIndex, chunks };
}

const topologies = {
  serve: async () => {
    const server = await startServer(['--model', storiesGguf, '--threads', '2', '--kv-cache-memory', '16MiB',
      '--admin-token', ADMIN_TOKEN]);
    return { servers: [server], front: server, engine: server };
  },
  'gateway --backend': async () => {
    const backend = await startServer(['--model', storiesGguf, '--threads', '2', '--kv-cache-memory', '16MiB',
      '--internal-token', TOKEN], { command: 'backend' });
    const gateway = await startServer(['--model', storiesGguf, '--internal-token', TOKEN, '--backend', backend.url,
      '--admin-token', ADMIN_TOKEN], { command: 'gateway' });
    return { servers: [gateway, backend], front: gateway, engine: backend };
  },
};

for (const [name, start] of Object.entries(topologies)) {
  describe(name, () => {
    let setup;
    let client;
    before(async () => {
      setup = await start();
      client = new OpenAI({ baseURL: `${setup.front.url}/v1`, apiKey: setup.front.defaultKey, maxRetries: 0 });
    });
    after(async () => { await Promise.all(setup?.servers.map((s) => s.stop()) ?? []); });

    test('chat logprobs: one entry per token with bytes and top_logprobs, the same streamed as whole', async () => {
      const request = {
        model: modelId, messages: [{ role: 'user', content: 'Once upon a time' }], max_tokens: 24,
        temperature: 0, logprobs: true, top_logprobs: 3, ignore_eos: true,
      };
      const whole = await client.chat.completions.create(request);
      const [choice] = whole.choices;
      const entries = choice.logprobs.content;
      assert.equal(entries.length, whole.usage.completion_tokens);
      assert.equal(choice.logprobs.refusal, null);
      let bytes = [];
      for (const e of entries) {
        assert.equal(typeof e.token, 'string');
        assert.ok(e.logprob <= 0);
        assert.ok(Array.isArray(e.bytes));
        bytes = bytes.concat(e.bytes);
        assert.equal(e.top_logprobs.length, 3);
        // Greedy: the chosen token is the most likely one.
        assert.equal(e.top_logprobs[0].token, e.token);
        assert.ok(Math.abs(e.top_logprobs[0].logprob - e.logprob) < 1e-6);
        assert.ok(e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob);
        for (const t of e.top_logprobs) assert.deepEqual(Object.keys(t).sort(), ['bytes', 'logprob', 'token']);
      }
      // The tokens' bytes are the content, pieces of characters included.
      assert.equal(Buffer.from(bytes).toString('utf8'), choice.message.content);

      const { byIndex } = await collect(await client.chat.completions.create({ ...request, stream: true }));
      const streamed = byIndex.get(0);
      assert.equal(streamed.text, choice.message.content);
      assert.deepEqual(streamed.content, entries);

      // logprobs without top_logprobs: the chosen tokens' alone.
      const bare = await client.chat.completions.create({ ...request, top_logprobs: undefined });
      assert.deepEqual(bare.choices[0].logprobs.content.map((e) => e.top_logprobs), entries.map(() => []));
      const none = await client.chat.completions.create({ ...request, logprobs: undefined, top_logprobs: undefined });
      assert.equal(none.choices[0].logprobs, null);
    });

    test('n = 3: three seeded choices, each its own text, streamed by index, usage counting all, the prompt computed once', async () => {
      // A prompt of its own, so that no block of it is in the prefix cache.
      const content = `${name}: Tom and Sue went to the park with their dog`;
      const request = {
        model: modelId, messages: [{ role: 'user', content }], max_tokens: 16, temperature: 1.0, seed: 21, n: 3,
        ignore_eos: true,
      };
      const computedBefore = await requiredMetric(setup.engine, 'edgeinfer_iteration_tokens_sum');
      const whole = await client.chat.completions.create(request);
      assert.equal(whole.choices.length, 3);
      assert.deepEqual(whole.choices.map((c) => c.index), [0, 1, 2]);
      for (const c of whole.choices) assert.equal(c.finish_reason, 'length');
      assert.equal(whole.usage.completion_tokens, 3 * 16);
      assert.equal(new Set(whole.choices.map((c) => c.message.content)).size, 3, 'three seeds, three texts');
      // Every prompt token but the last once, then 16 tokens per choice (the last prompt token each).
      const expected = computedBefore + (whole.usage.prompt_tokens - 1) + 3 * 16;
      await waitFor('the engine to report its steps', async () =>
        (await requiredMetric(setup.engine, 'edgeinfer_iteration_tokens_sum')) >= expected);
      assert.equal(await requiredMetric(setup.engine, 'edgeinfer_iteration_tokens_sum'), expected);

      // The same seed again: the same three texts, and streamed, each chunk names its choice.
      const { byIndex } = await collect(await client.chat.completions.create({
        ...request, stream: true, stream_options: { include_usage: true },
      }));
      assert.equal(byIndex.size, 3);
      for (const c of whole.choices) {
        const streamed = byIndex.get(c.index);
        assert.equal(streamed.roles, 1);
        assert.equal(streamed.text, c.message.content);
        assert.equal(streamed.finish, 'length');
      }
      // Completions too, with logprobs per choice.
      const completions = await client.completions.create({
        model: modelId, prompt: content, max_tokens: 8, temperature: 1.0, seed: 5, n: 2, logprobs: 1, ignore_eos: true,
      });
      assert.equal(completions.choices.length, 2);
      for (const c of completions.choices) assert.equal(c.logprobs.tokens.length, 8);
    });

    test('n with stop strings and logprobs: each choice stops on its own, streamed as whole', async () => {
      const request = {
        model: modelId, prompt: 'Once upon a time', max_tokens: 40, temperature: 1.0, seed: 3, n: 3, stop: ['.'],
        logprobs: 2,
      };
      const whole = await client.completions.create(request);
      const { byIndex } = await collect(await client.completions.create({ ...request, stream: true }));
      for (const c of whole.choices) {
        assert.ok(!c.text.includes('.'));
        const streamed = byIndex.get(c.index);
        assert.equal(streamed.text, c.text);
        assert.equal(streamed.finish, c.finish_reason);
        assert.deepEqual(streamed.tokens, c.logprobs.tokens);
        assert.deepEqual(streamed.offsets, c.logprobs.text_offset);
      }
      assert.ok(whole.choices.some((c) => c.finish_reason === 'stop'));
    });

    test('completions echo with logprobs: the prompt, its own log probabilities (the first null), then the completion', async () => {
      const prompt = 'Once upon a time';
      const promptIds = tokenize(prompt);
      const request = { model: modelId, prompt, max_tokens: 10, temperature: 0, echo: true, logprobs: 2 };
      const whole = await client.completions.create(request);
      const [choice] = whole.choices;
      assert.ok(choice.text.startsWith(`${prompt}, there was a little`), choice.text);
      const lp = choice.logprobs;
      assert.equal(lp.tokens.length, promptIds.length + whole.usage.completion_tokens);
      assert.equal(lp.tokens[0], '<s>');
      assert.equal(lp.token_logprobs[0], null);
      assert.equal(lp.top_logprobs[0], null);
      for (let i = 1; i < lp.tokens.length; i++) {
        assert.ok(lp.token_logprobs[i] <= 0);
        const top = lp.top_logprobs[i];
        assert.ok(Object.keys(top).length >= 2 && Object.keys(top).length <= 3, JSON.stringify(top));
        assert.equal(top[lp.tokens[i]], lp.token_logprobs[i]);
        // Each token's text starts where the text before it ends.
        assert.equal(choice.text.slice(lp.text_offset[i], lp.text_offset[i] + lp.tokens[i].length), lp.tokens[i]);
      }
      // The prompt's own log probabilities do not depend on the prefix cache: the same again.
      const again = await client.completions.create(request);
      assert.deepEqual(again.choices[0].logprobs, lp);
      assert.equal(again.usage.prompt_tokens_details.cached_tokens, 0);

      const { byIndex } = await collect(await client.completions.create({ ...request, stream: true }));
      const streamed = byIndex.get(0);
      assert.equal(streamed.text, choice.text);
      assert.deepEqual(streamed.tokens, lp.tokens);
      assert.deepEqual(streamed.token_logprobs, lp.token_logprobs);
      assert.deepEqual(streamed.top_logprobs, lp.top_logprobs);
      assert.deepEqual(streamed.offsets, lp.text_offset);

      // echo alone: the prompt in front, no log probabilities; logprobs alone: the completion's only.
      const echoed = await client.completions.create({ ...request, logprobs: undefined });
      assert.equal(echoed.choices[0].text, choice.text);
      assert.equal(echoed.choices[0].logprobs, null);
      const plain = await client.completions.create({ ...request, echo: undefined });
      assert.equal(prompt + plain.choices[0].text, choice.text);
      assert.equal(plain.choices[0].logprobs.tokens.length, plain.usage.completion_tokens);
      assert.equal(plain.choices[0].logprobs.text_offset[0], 0);
      const { byIndex: echoStream } = await collect(await client.completions.create({
        ...request, logprobs: undefined, stream: true,
      }));
      assert.equal(echoStream.get(0).text, choice.text);
    });

    test('logit_bias: +100 forces a token, -100 bans one, on both APIs', async () => {
      // (A text's first token loses SentencePiece's leading space: compare without it.)
      const forced = 300;
      const repeated = (count) => decode(Array(count).fill(forced)).trimStart();
      const completion = await client.completions.create({
        model: modelId, prompt: 'Once upon a time', max_tokens: 6, temperature: 1.0, seed: 9, logit_bias: { [forced]: 100 },
      });
      assert.equal(completion.choices[0].text.trimStart(), repeated(6));
      const chat = await client.chat.completions.create({
        model: modelId, messages: [{ role: 'user', content: 'hi' }], max_tokens: 4, temperature: 0,
        logit_bias: { [forced]: 100 },
      });
      assert.equal(chat.choices[0].message.content.trimStart(), repeated(4));
      // The greedy continuation of "Once upon a time" starts with ","; banned, it cannot.
      const comma = tokenize('Once upon a time,').at(-1);
      const free = await client.completions.create({ model: modelId, prompt: 'Once upon a time', max_tokens: 3, temperature: 0 });
      assert.ok(free.choices[0].text.startsWith(','));
      const banned = await client.completions.create({
        model: modelId, prompt: 'Once upon a time', max_tokens: 3, temperature: 0, logit_bias: { [comma]: -100 },
        logprobs: 0,
      });
      assert.ok(!banned.choices[0].text.startsWith(','), banned.choices[0].text);
      assert.ok(!banned.choices[0].logprobs.tokens.includes(','));
    });

    test('bad values are 400s naming the field', async () => {
      const chat = (extra) => ({ model: modelId, messages: [{ role: 'user', content: 'hi' }], ...extra });
      const cases = [
        [client.chat.completions, chat({ top_logprobs: 2 }), 'top_logprobs', /requires 'logprobs'/],
        [client.chat.completions, chat({ logprobs: true, top_logprobs: 21 }), 'top_logprobs', /from 0 to 20/],
        [client.chat.completions, chat({ n: 0 }), 'n', /from 1 to 128/],
        [client.chat.completions, chat({ n: 129 }), 'n', /from 1 to 128/],
        [client.chat.completions, chat({ logit_bias: { 5: 101 } }), 'logit_bias.5', /from -100 to 100/],
        [client.chat.completions, chat({ logit_bias: { five: 1 } }), 'logit_bias.five', /not a token id/],
        [client.chat.completions, chat({ logit_bias: { 100000: 1 } }), 'logit_bias', /outside the vocabulary of 512/],
        [client.completions, { model: modelId, prompt: 'x', logprobs: 6 }, 'logprobs', /from 0 to 5/],
        [client.completions, { model: modelId, prompt: 'x', echo: 'yes' }, 'echo', /true or false/],
        [client.completions, { model: modelId, prompt: 'x', n: 2, best_of: 3 }, 'best_of', /must equal 'n'/],
      ];
      for (const [api, body, param, message] of cases) {
        await assert.rejects(api.create(body), (error) => {
          assert.ok(error instanceof OpenAI.BadRequestError, `${JSON.stringify(body)}: ${error}`);
          assert.equal(error.param, param, JSON.stringify(body));
          assert.match(error.message, message);
          return true;
        });
      }
    });

    test('quotas reserve prompt + n x max_tokens: the headers say so, and too many choices are refused', async () => {
      const tenant = `t-${name.replace(/\W+/g, '-')}`;
      await adminCall(setup.front, ADMIN_TOKEN, 'POST', '/admin/v1/tenants', { id: tenant, quotas: { tokens_per_minute: 1000 } });
      const key = (await adminCall(setup.front, ADMIN_TOKEN, 'POST', `/admin/v1/tenants/${tenant}/keys`, {})).key;
      const limited = new OpenAI({ baseURL: `${setup.front.url}/v1`, apiKey: key, maxRetries: 0 });
      const request = { model: modelId, prompt: 'Once upon a time', max_tokens: 100, n: 3, temperature: 0 };
      const { data, response } = await limited.completions.create(request).withResponse();
      // 5 prompt tokens + 3 x 100, taken from a full bucket of 1000.
      assert.equal(Number(response.headers.get('x-ratelimit-remaining-tokens')), 1000 - 5 - 300);
      assert.equal(data.choices.length, 3);
      await assert.rejects(limited.completions.create({ ...request, n: 10 }), (error) => {
        assert.equal(error.status, 429);
        assert.match(error.message, /10 choices × max_tokens 100/);
        return true;
      });
    });
  });
}
