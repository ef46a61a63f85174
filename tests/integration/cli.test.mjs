// The model command-line tools on the real fixture: generate, tokenize, make-model.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { edgeinferBin } from './lib/server.mjs';

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
