// The model command-line tools on the real fixture: generate, tokenize, make-model.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { edgeinferBin, startServer } from './lib/server.mjs';

const models = process.env.EDGE_TEST_MODELS ?? path.resolve('../shared/models');
const stories = path.join(models, 'stories260K');
const referenceText =
  'Once upon a time, there was a little girl named Lily. She loved to play outside in the park. One day, she saw a ' +
  'big, red ball. She wanted to play with it, but it was too high.\nLily';

function run(args, options = {}) {
  return spawnSync(edgeinferBin, args, { encoding: 'utf8', timeout: 120000, ...options });
}

for (const file of ['stories260K.gguf', 'stories260K.bin']) {
  test(`generate on ${file} prints the prompt and the reference continuation, and nothing else`, () => {
    const r = run(['generate', '--model', path.join(stories, file), '--prompt', 'Once upon a time',
                   '--max-tokens', '60', '--temperature', '0']);
    assert.equal(r.status, 0, r.stderr);
    assert.equal(r.stdout, referenceText);
    assert.match(r.stderr, /prompt: 5 tokens, [\d.]+ tok\/s; generated: 60 tokens, [\d.]+ tok\/s/);
  });
}

test('generate with a seed is reproducible', () => {
  const args = ['generate', '--model', path.join(stories, 'stories260K.gguf'), '--prompt', 'The dog',
                '--max-tokens', '30', '--temperature', '1', '--seed', '7'];
  const a = run(args);
  const b = run(args);
  assert.equal(a.status, 0, a.stderr);
  assert.equal(a.stdout, b.stdout);
  assert.ok(a.stdout.startsWith('The dog') && a.stdout.length > 'The dog'.length);
});

test('generate reports a missing model clearly', () => {
  const r = run(['generate', '--model', '/nonexistent/model.gguf', '--prompt', 'x']);
  assert.equal(r.status, 1);
  assert.match(r.stderr, /\/nonexistent\/model\.gguf/);
  assert.equal(r.stdout, '');
});

test('tokenize encodes to the reference ids and decodes back', () => {
  const enc = run(['tokenize', '--model', path.join(stories, 'stories260K.gguf'), '--text', 'Once upon a time']);
  assert.equal(enc.status, 0, enc.stderr);
  assert.deepEqual(JSON.parse(enc.stdout), [1, 403, 407, 261, 378]);
  const viaStdin = run(['tokenize', '--tokenizer', path.join(stories, 'tok512.bin')], { input: 'Once upon a time' });
  assert.deepEqual(JSON.parse(viaStdin.stdout), [1, 403, 407, 261, 378]);
  const dec = run(['tokenize', '--model', path.join(stories, 'stories260K.gguf'), '--decode', '--no-special'],
                  { input: '[1, 403, 407, 261, 378]' });
  assert.equal(dec.status, 0, dec.stderr);
  assert.equal(dec.stdout, 'Once upon a time\n');
});

test('make-model writes synthetic models that load and generate, in both formats', () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'edge-cli-'));
  try {
    for (const [format, out] of [['safetensors', path.join(dir, 'tiny-hf')], ['gguf', path.join(dir, 'tiny.gguf')]]) {
      const made = run(['make-model', '--preset', 'tiny', '--format', format, '--seed', '3', '--out', out]);
      assert.equal(made.status, 0, made.stderr);
      const gen = run(['generate', '--model', out, '--prompt', 'hello world', '--max-tokens', '8',
                       '--temperature', '0', '--ignore-eos']);
      assert.equal(gen.status, 0, gen.stderr);
      assert.ok(gen.stdout.startsWith('hello world'));
      assert.match(gen.stderr, /generated: 8 tokens/);
    }
    const again = run(['make-model', '--preset', 'tiny', '--format', 'gguf', '--seed', '3',
                       '--out', path.join(dir, 'again.gguf')]);
    assert.equal(again.status, 0, again.stderr);
    assert.deepEqual(fs.readFileSync(path.join(dir, 'again.gguf')), fs.readFileSync(path.join(dir, 'tiny.gguf')));
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

// Command-line mistakes are told as configuration mistakes are: what is wrong, the likely
// intent, where to look, exit code 2 (CLI11's own codes were 106 to 109, with no suggestion).
test('command-line mistakes: what is wrong, "did you mean", exit code 2', () => {
  const cases = [
    [['serve', '--prot', '9000'], 'edgeinfer serve: unknown option "--prot"; did you mean "--port"?'],
    [['serv'], 'edgeinfer: unknown command "serv"; did you mean "serve"?'],
    [['admin', 'tenant', 'list'], 'edgeinfer admin: unknown command "tenant"; did you mean "tenants"?'],
    [['admin', 'keys', 'creat', 'acme'], 'edgeinfer admin keys: unknown command "creat"; did you mean "create"?'],
    [['tokenize', '--modle', 'x'], 'edgeinfer tokenize: unknown option "--modle"; did you mean "--model"?'],
    [['--versoin'], 'edgeinfer: unknown option "--versoin"; did you mean "--version"?'],
    [['serve', 'a.gguf', 'b.gguf'], 'edgeinfer serve: unexpected argument "b.gguf"'],
    [[], 'edgeinfer: a command is required: serve, backend, gateway,'],
    [['admin', 'keys'], 'edgeinfer admin keys: a command is required: create, list, revoke'],
    [['serve', '--port', 'abc'], 'invalid value "abc" for port (flag --port): expected an integer from 0 to 65535'],
    [['help', 'sevre'], 'edgeinfer: unknown command "sevre"; did you mean "serve"?'],
  ];
  for (const [args, expected] of cases) {
    const r = run(args);
    assert.equal(r.status, 2, `edgeinfer ${args.join(' ')}: exit ${r.status}\n${r.stderr}`);
    assert.ok(r.stderr.includes(expected), `edgeinfer ${args.join(' ')}:\n${r.stderr}`);
    assert.equal(r.stdout, '');
  }
  // A word far from every command gets no guess.
  const far = run(['frobnicate']);
  assert.equal(far.status, 2);
  assert.match(far.stderr, /^edgeinfer: unknown command "frobnicate"\nRun "edgeinfer --help" for its commands and options\.\n$/);
});

test('edgeinfer help [COMMAND...] prints what COMMAND --help prints, exit code 0', () => {
  for (const words of [[], ['serve'], ['admin', 'keys']]) {
    const viaHelp = run(['help', ...words]);
    const viaFlag = run([...words, '--help']);
    assert.equal(viaHelp.status, 0, viaHelp.stderr);
    assert.equal(viaFlag.status, 0, viaFlag.stderr);
    assert.equal(viaHelp.stdout, viaFlag.stdout);
    assert.ok(viaHelp.stdout.length > 100);
  }
  assert.match(run(['help', 'admin', 'keys']).stdout, /create/);
});

// vLLM's and llama.cpp's spellings: `serve MODEL` (vllm serve MODEL), -m MODEL and -c N
// (llama-server's model and context size) are --model and --max-model-len.
test('serve MODEL, -m MODEL and -c N are --model and --max-model-len', async () => {
  const gguf = path.join(stories, 'stories260K.gguf');
  for (const args of [[gguf, '-c', '64'], ['-m', gguf, '-c', '64'], ['--model', gguf, '--max-model-len', '64']]) {
    const server = await startServer(args.concat(['--threads', '1', '--kv-cache-memory', '32MiB']));
    try {
      const res = await fetch(`${server.url}/v1/models`, { headers: { authorization: `Bearer ${server.defaultKey}` } });
      const models = await res.json();
      assert.equal(res.status, 200, JSON.stringify(models));
      assert.deepEqual(models.data.map((m) => [m.id, m.max_model_len]), [['stories260K', 64]], args.join(' '));
      assert.match(server.log, /chosen by --model/);
    } finally {
      await server.stop();
    }
  }
  // Two models, one by each spelling: the command line cannot say which one it means.
  const both = run(['serve', gguf, '--model', gguf, '--port', '0']);
  assert.equal(both.status, 2, both.stderr);
});
