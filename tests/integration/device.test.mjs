// --device on `generate` and `serve`: cuda needs a GPU and says clearly when there is none;
// auto runs on the GPU when there is one and otherwise falls back to the CPU with a log line.
// On a machine with a GPU the same tests check that the CUDA path prints the reference text.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import path from 'node:path';
import { edgeinferBin, startServer } from './lib/server.mjs';

const models = process.env.EDGE_TEST_MODELS ?? path.resolve('../shared/models');
const model = path.join(models, 'stories260K', 'stories260K.gguf');
const referenceText =
  'Once upon a time, there was a little girl named Lily. She loved to play outside in the park. One day, she saw a ' +
  'big, red ball. She wanted to play with it, but it was too high.\nLily';
const NO_GPU = /--device cuda: (no CUDA device|edgeinfer was built without CUDA)/;

function generate(device) {
  return spawnSync(edgeinferBin, ['generate', '--model', model, '--prompt', 'Once upon a time', '--max-tokens', '60',
                                  '--temperature', '0', '--device', device], { encoding: 'utf8', timeout: 120000 });
}

const cuda = generate('cuda');
const hasGpu = cuda.status === 0;

test('generate --device cuda: the reference text on a GPU, else a clear error and exit 1', () => {
  if (hasGpu) {
    assert.equal(cuda.stdout, referenceText);
    assert.match(cuda.stderr, /\(CUDA: /);
  } else {
    assert.equal(cuda.status, 1, cuda.stderr);
    assert.match(cuda.stderr, NO_GPU);
    assert.equal(cuda.stdout, '');
  }
});

test('generate --device auto falls back to the CPU with a log line when there is no GPU', () => {
  const r = generate('auto');
  assert.equal(r.status, 0, r.stderr);
  assert.equal(r.stdout, referenceText);
  if (hasGpu) {
    assert.match(r.stderr, /\(CUDA: /);
  } else {
    assert.match(r.stderr, /--device auto: (no CUDA device|edgeinfer was built without CUDA).*; running on the CPU/);
    assert.match(r.stderr, /\(\d+ threads, /);
  }
});

test('generate --device cpu never touches the GPU', () => {
  const r = generate('cpu');
  assert.equal(r.status, 0, r.stderr);
  assert.equal(r.stdout, referenceText);
  assert.doesNotMatch(r.stderr, /--device auto|CUDA: /);
});

test('generate rejects an unknown --device', () => {
  const r = generate('tpu');
  assert.equal(r.status, 2);
  assert.match(r.stderr, /device/);
});

test('serve --device auto is ready on the CPU without a GPU and logs why', { skip: hasGpu }, async () => {
  const server = await startServer(['--model', model, '--device', 'auto']);
  try {
    assert.match(server.log, /--device auto: .*; running on the CPU/);
    assert.match(server.log, /engine: \d+ compute threads/);
  } finally {
    await server.stop();
  }
});

test('serve --device cuda without a GPU fails to load with the reason', { skip: hasGpu }, async () => {
  const server = await startServer(['--model', model, '--device', 'cuda'], { waitReady: false });
  const { code } = await server.exited;
  assert.equal(code, 1);
  assert.match(server.log, NO_GPU);
});
